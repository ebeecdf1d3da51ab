"""What a checkpoint of lbopt.torch's states costs: optimizer.state_dict() (the checkpoint form), torch.save of it
to a file and its size, and load_state_dict of what torch.load gives back, for a GPT-2-small-shaped stack of
matrices (12 layers of 768x2304, 768x768, 768x3072 and 3072x768, and a 50257x768 embedding: 124M params) against
torch.optim.AdamW's, whose state_dict holds its live tensors.

    LBOPT_LIBRARY=build/liblbopt.so.0 python3 bench/bench_checkpoint.py [--layers 12] [--kinds 4bit,8bit,fp32]
"""
import argparse
import io
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "bindings" / "python"))

import torch  # noqa: E402

import lbopt  # noqa: E402
import lbopt.torch as LT  # noqa: E402


def params(layers):
    shapes = [(50257, 768)] + [s for _ in range(layers) for s in ((768, 2304), (768, 768), (768, 3072), (3072, 768))]
    return [torch.nn.Parameter(torch.randn(s) * 0.02) for s in shapes]


def best_seconds(fn, reps=3):
    best, out = float("inf"), None
    for _ in range(reps):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def row(name, make, layers):
    ps = params(layers)
    opt = make(ps)
    for p in ps:
        p.grad = torch.randn_like(p)
    opt.step()
    t_sd, sd = best_seconds(opt.state_dict)
    buf = io.BytesIO()

    def save():
        buf.seek(0)
        buf.truncate()
        torch.save(opt.state_dict(), buf)

    t_save, _ = best_seconds(save)
    size = buf.tell()
    t_load, _ = best_seconds(lambda: opt.load_state_dict(torch.load(io.BytesIO(buf.getvalue()), weights_only=True)))
    n = sum(p.numel() for p in ps)
    print(f"| {name} | {t_sd * 1e3:.1f} | {t_save * 1e3:.0f} | {size / n:.3f} | {t_load * 1e3:.0f} |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--kinds", default="4bit,8bit,fp32")
    args = ap.parse_args()
    print(f"lbopt {lbopt.version()}, CPU kernels {lbopt.build_info()['cpu_kernels']}, {torch.get_num_threads()} "
          f"torch threads, torch {torch.__version__}")
    print("| optimizer | state_dict() (ms) | state_dict + torch.save (ms) | bytes / param saved | torch.load + "
          "load_state_dict (ms) |")
    print("|---|---|---|---|---|")
    row("torch.optim.AdamW", lambda ps: torch.optim.AdamW(ps), args.layers)
    for kind in args.kinds.split(","):
        row(f"lbopt {kind}", lambda ps, k=kind: LT.LowBitAdamW(ps, state_kind=k), args.layers)


if __name__ == "__main__":
    main()

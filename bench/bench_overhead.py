"""Per-call overhead of lbopt.torch's step on many tensors: the median step() of torch.optim.AdamW(fused=True)
and of lbopt's AdamW4bit over the same N tensors (fp32 params, 4-bit states everywhere: min_quant_size 0), what
lbopt.torch's planning of a steady step alone costs (Python, no library call, caches warm), and what
lbopt_adamw_step_validate alone costs for the same slots (the check a step() with several calls makes of every
call but the first).

    LBOPT_LIBRARY=build/liblbopt.so.0 python3 bench/bench_overhead.py [--tensors 2000] [--numel 16,4096]
"""
import argparse
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "bindings" / "python"))

import torch  # noqa: E402

import lbopt  # noqa: E402
import lbopt.torch as LT  # noqa: E402
from timing import median_seconds  # noqa: E402


def median_ms(fn):
    return median_seconds(fn, reps=15, warm=3) * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tensors", type=int, default=2000)
    ap.add_argument("--numel", default="16,4096")
    args = ap.parse_args()
    print(f"CPU kernels {lbopt.build_info()['cpu_kernels']}, {lbopt.get_num_threads()} lbopt threads, "
          f"{torch.get_num_threads()} torch threads, torch {torch.__version__}")
    print("| tensors x numel | torch fused (ms) | lbopt AdamW4bit (ms) | lbopt / torch | planning alone (ms) | "
          "validate alone (ms) |")
    print("|---|---|---|---|---|---|")
    for numel in (int(x) for x in args.numel.split(",")):
        row = []
        for make in (lambda ps: torch.optim.AdamW(ps, fused=True), lambda ps: LT.AdamW4bit(ps, min_quant_size=0)):
            torch.manual_seed(0)
            ps = [torch.nn.Parameter(torch.randn(numel)) for _ in range(args.tensors)]
            for p in ps:
                p.grad = torch.randn(numel)
            opt = make(ps)
            row.append(median_ms(opt.step))
        row.append(median_ms(lambda: opt._plan({})))  # the last optimizer is lbopt's, its states made above
        calls = opt._plan({})
        row.append(median_ms(lambda: [c.validate() for c in calls]))
        print(f"| {args.tensors} x {numel} | {row[0]:.2f} | {row[1]:.2f} | {row[1] / row[0]:.2f} | {row[2]:.2f} | "
              f"{row[3]:.2f} |")


if __name__ == "__main__":
    main()

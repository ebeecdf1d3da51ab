"""CPU offload end to end: the training step of a GPT-2-shaped model (pre-norm transformer, tied embeddings; GPT-2
medium by default: 24 layers, width 1024, 355M params) with lbopt's AdamW4bit on the device, offloaded with
lbopt.offload.CPUOffload (host step after backward, and in backward), torch's fused AdamW on the device, and
torchao's CPUOffloadOptimizer around torch's fused AdamW; median step time (forward, backward, step), peak
device memory, and bytes of optimizer state per param. --host-scaling instead times the host step alone
(AdamW4bit over the model's params on the CPU) with 1, 2, 4 ... threads, up to the machine's cores.

    LBOPT_LIBRARY=build-rel/liblbopt.so.0 PYTHONPATH=bindings/python python3 bench/bench_offload.py --device cuda
    python3 bench/bench_offload.py --device cpu --layers 2 --width 128 --seq 64 --batch 2     # a smoke run
    python3 bench/bench_offload.py --host-scaling
"""
import argparse
import math
import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "bindings" / "python"))

import torch  # noqa: E402
from torch import nn  # noqa: E402

import lbopt  # noqa: E402
import lbopt.torch as LT  # noqa: E402
from lbopt.offload import CPUOffload  # noqa: E402
from timing import median_seconds  # noqa: E402

VOCAB = 50257


class GPT(nn.Module):
    def __init__(self, layers, width, seq):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, width)
        self.pos = nn.Embedding(seq, width)
        layer = nn.TransformerEncoderLayer(width, max(1, width // 64), 4 * width, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)

    def forward(self, idx):
        n = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(n, device=idx.device))
        mask = nn.Transformer.generate_square_subsequent_mask(n, device=idx.device)
        x = self.norm(self.blocks(x, mask=mask, is_causal=True))
        return x @ self.tok.weight.t()


def state_bytes(opt):
    inner = getattr(opt, "optimizer", opt)
    seen, total = set(), 0
    for st in inner.state.values():
        for v in st.values():
            if torch.is_tensor(v) and v.data_ptr() not in seen:
                seen.add(v.data_ptr())
                total += v.numel() * v.element_size()
    return total


def optimizers(device):
    out = {
        "lbopt AdamW4bit on the device": lambda ps: LT.AdamW4bit(ps, lr=1e-4),
        "lbopt AdamW4bit, CPUOffload": lambda ps: CPUOffload(ps, LT.AdamW4bit, lr=1e-4),
        "lbopt AdamW4bit, CPUOffload(step_in_backward)": lambda ps: CPUOffload(ps, LT.AdamW4bit, lr=1e-4,
                                                                                step_in_backward=True),
        "torch AdamW(fused) on the device": lambda ps: torch.optim.AdamW(ps, lr=1e-4, fused=True),
    }
    if device == "cuda":
        try:
            import torchao.optim as ao

            out["torchao CPUOffloadOptimizer(torch AdamW fused)"] = lambda ps: ao.CPUOffloadOptimizer(
                ps, torch.optim.AdamW, lr=1e-4, fused=True)
        except Exception as e:  # reported, not skipped silently
            print(f"torchao CPUOffloadOptimizer: not run ({type(e).__name__}: {e})")
    return out


def train_step(model, opt, idx, device):
    with torch.autocast(device, dtype=torch.bfloat16):
        logits = model(idx)
    loss = nn.functional.cross_entropy(logits.float().flatten(0, 1), idx.flatten())
    loss.backward()
    opt.step()
    opt.zero_grad()


def time_steps(model, opt, idx, device, steps):
    """The median training step (synchronized on a GPU), from a reset of the peak memory statistics."""
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()

    def step():
        train_step(model, opt, idx, device)
        if device == "cuda":
            torch.cuda.synchronize()

    return median_seconds(step, reps=steps, warm=2)


def end_to_end(args):
    device = args.device
    print(f"{torch.cuda.get_device_name() if device == 'cuda' else 'CPU'}; host: {os.cpu_count()} cores, "
          f"lbopt {lbopt.get_num_threads()} threads, cpu_kernels {lbopt.build_info()['cpu_kernels']}; "
          f"{args.layers} layers, width {args.width}, sequence {args.seq}, batch {args.batch}, bf16 autocast")
    print("| optimizer | step (ms) | vs lbopt on the device | peak device memory (GiB) | state bytes / param |")
    print("|---|---|---|---|---|")
    first = None
    for name, make in optimizers(device).items():
        torch.manual_seed(0)
        model = GPT(args.layers, args.width, args.seq).to(device)
        n_params = sum(p.numel() for p in model.parameters())
        idx = torch.randint(0, VOCAB, (args.batch, args.seq), device=device)
        try:
            opt = make(model.parameters())
        except Exception as e:
            print(f"| {name} | not run: {type(e).__name__}: {e} | | | |")
            continue
        ms = time_steps(model, opt, idx, device, args.steps) * 1e3
        first = first or ms
        peak = torch.cuda.max_memory_allocated() / 2 ** 30 if device == "cuda" else math.nan
        print(f"| {name} | {ms:.1f} | {ms / first:.2f}x | {peak:.2f} | {state_bytes(opt) / n_params:.3f} |")
        del opt, model
        if device == "cuda":
            torch.cuda.empty_cache()


def host_scaling(args):
    torch.manual_seed(0)
    params = [p.detach().clone() for p in GPT(args.layers, args.width, args.seq).parameters()]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    opt = LT.AdamW4bit(params, lr=1e-4)
    n = sum(p.numel() for p in params)
    print(f"host step of AdamW4bit over {n / 1e6:.0f}M params, cpu_kernels {lbopt.build_info()['cpu_kernels']}, "
          f"{os.cpu_count()} cores")
    print("| threads | host step (ms) | speed-up |")
    print("|---|---|---|")
    threads, one = 1, None
    while threads <= os.cpu_count():
        lbopt.set_num_threads(threads)
        ms = median_seconds(opt.step, reps=args.steps, warm=1) * 1e3
        one = one or ms
        print(f"| {threads} | {ms:.1f} | {one / ms:.2f}x |")
        threads *= 2
    lbopt.set_num_threads(0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--host-scaling", action="store_true")
    args = ap.parse_args()
    host_scaling(args) if args.host_scaling else end_to_end(args)


if __name__ == "__main__":
    main()

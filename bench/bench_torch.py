#!/usr/bin/env python3
"""Optimizer step time, lbopt vs peers, same run, with a constant lr and with a cosine lr changed on every step;
optimizer state bytes per parameter; and the per-step Python overhead on a model of many small parameters.

usage: LBOPT_LIBRARY=build-release/liblbopt.so.0 PYTHONPATH=bindings/python \
       python3 bench/bench_torch.py [--params 100e6] [--steps 10] [--small 300]
       [--device cpu|cuda]
Peers: torch.optim.AdamW(fused=True), torchao AdamW4bit, and on CPU DeepSpeed's DeepSpeedCPUAdam where
`import deepspeed` works (it JIT-builds its C++ op on first use). Prints markdown tables (for docs/benchmarks.md).
"""
import argparse
import math
import statistics
import time

import torch

import lbopt
import lbopt.torch as lt


DEVICE = "cpu"


def sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def make_params(total, width=4096):
    rows = max(1, int(total) // width)
    torch.manual_seed(0)
    ps = [torch.nn.Parameter(torch.randn(rows // 4, width, device=DEVICE) * 0.02) for _ in range(4)]
    for p in ps:
        p.grad = torch.randn_like(p) * 1e-3
    return ps


def cosine(step, total, peak=1e-3):
    return peak * 0.5 * (1 + math.cos(math.pi * step / total))


def timed_step(opt, lr):
    """Seconds of one optimizer step after setting the lr (a float, or a tensor lr with fill_)."""
    for g in opt.param_groups:
        if torch.is_tensor(g["lr"]):
            g["lr"].fill_(lr)
        else:
            g["lr"] = lr
    sync()
    t0 = time.perf_counter()
    opt.step()
    sync()
    return time.perf_counter() - t0


def time_steps(opt, steps, schedule):
    """Median seconds of one optimizer step; the lr is set before each step."""
    times = []
    for s in range(steps + 2):  # two warm-up steps (torch.compile, thread pool, first-touch of states)
        t = timed_step(opt, cosine(s, steps) if schedule == "cosine" else 1e-3)
        if s >= 2:
            times.append(t)
    return statistics.median(times)


def candidates():
    out = {
        "lbopt AdamW4bit": lambda ps: lt.AdamW4bit(ps, lr=1e-3),
        "lbopt AdamW8bit": lambda ps: lt.AdamW8bit(ps, lr=1e-3),
        "lbopt AdamW (fp32 states)": lambda ps: lt.AdamW(ps, lr=1e-3),
        "torch AdamW(fused=True)": lambda ps: torch.optim.AdamW(ps, lr=1e-3, fused=True),
    }
    try:
        import torchao.optim as ao

        out["torchao AdamW4bit, float lr"] = lambda ps: ao.AdamW4bit(ps, lr=1e-3)
        out["torchao AdamW4bit, tensor lr"] = lambda ps: ao.AdamW4bit(ps, lr=torch.tensor(1e-3, device=DEVICE))
    except ImportError:
        pass
    if DEVICE == "cpu":
        try:
            from deepspeed.ops.adam import DeepSpeedCPUAdam

            out["DeepSpeed DeepSpeedCPUAdam"] = lambda ps: DeepSpeedCPUAdam(ps, lr=1e-3, adamw_mode=True,
                                                                             fp32_optimizer_states=True)
        except ImportError:
            pass
    return out


def state_bytes(opt):
    """Bytes of optimizer state tensors (a torchao subclass tensor counts its codes and scales)."""
    total = 0
    for st in opt.state.values():
        for v in st.values():
            if hasattr(v, "codes") and hasattr(v, "scale"):
                total += v.codes.nbytes + v.scale.nbytes
            elif torch.is_tensor(v):
                total += v.nbytes
    return total


def round_robin(makers, args):
    """Every candidate holds its own params and states at once and they step in turn, a step each: a shared VM's
    slow phases then fall on all of them alike. Per candidate and schedule, the median step time."""
    opts = {}
    for name, make in makers.items():
        ps = make_params(args.params)
        opts[name] = (make(ps), ps)
    rows = {name: {} for name in opts}
    for schedule in ("constant", "cosine"):
        times = {name: [] for name in opts}
        for s in range(args.steps + 2):  # two warm-up steps each
            lr = cosine(s, args.steps) if schedule == "cosine" else 1e-3
            for name, (opt, _) in opts.items():
                t = timed_step(opt, lr)
                if s >= 2:
                    times[name].append(t)
        for name in opts:
            rows[name][schedule] = statistics.median(times[name])
    for name in opts:  # state bytes once the states exist
        opt, ps = opts[name]
        rows[name]["bytes"] = state_bytes(opt) / sum(p.numel() for p in ps)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", type=float, default=100e6)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--small", type=int, default=300)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    global DEVICE
    DEVICE = args.device
    print(f"torch {torch.__version__}, lbopt {lbopt.version()}, device {DEVICE}, threads: torch "
          f"{torch.get_num_threads()}, lbopt {lbopt.get_num_threads()}; {lbopt.build_info()['cpu_kernels']} CPU "
          "kernels\n")

    print(f"## Step time on {DEVICE}, {args.params / 1e6:.0f}M fp32 params, median of {args.steps} steps per "
          "schedule, the candidates stepping in turn\n")
    print("| optimizer | constant lr (ms) | cosine lr (ms) | cosine / constant | speed vs torch fused | "
          "state bytes / param |")
    print("|---|---|---|---|---|---|")
    rows = round_robin({n: m for n, m in candidates().items() if not n.startswith("torchao")}, args)
    # torchao's compiled step is tens of times slower: timed on its own (the VM's noise cannot change that ratio)
    for name, make in candidates().items():
        if name.startswith("torchao"):
            res = rows[name] = {}
            for schedule in ("constant", "cosine"):
                ps = make_params(args.params)
                opt = make(ps)
                res[schedule] = time_steps(opt, max(2, args.steps // 4), schedule)
                res["bytes"] = state_bytes(opt) / sum(p.numel() for p in ps)
                del opt, ps
    ref = rows["torch AdamW(fused=True)"]["constant"]
    for name, r in rows.items():
        print(f"| {name} | {r['constant'] * 1e3:.1f} | {r['cosine'] * 1e3:.1f} | {r['cosine'] / r['constant']:.3f} "
              f"| {ref / r['constant']:.2f}x | {r['bytes']:.2f} |", flush=True)

    print(f"\n## Per-step overhead, {args.small} params of 64 elements, median of 50 steps\n")
    print("| optimizer | us per step |")
    print("|---|---|")
    for name, make in (("lbopt AdamW4bit", lambda ps: lt.AdamW4bit(ps, lr=1e-3)),
                       ("lbopt AdamW (fp32 states)", lambda ps: lt.AdamW(ps, lr=1e-3)),
                       ("torch AdamW(fused=True)", lambda ps: torch.optim.AdamW(ps, lr=1e-3, fused=True)),
                       ("torch AdamW(foreach=True)", lambda ps: torch.optim.AdamW(ps, lr=1e-3, foreach=True))):
        ps = [torch.nn.Parameter(torch.randn(64, device=DEVICE)) for _ in range(args.small)]
        for p in ps:
            p.grad = torch.randn_like(p)
        opt = make(ps)
        print(f"| {name} | {time_steps(opt, 50, 'cosine') * 1e6:.0f} |")


if __name__ == "__main__":
    main()

"""A long run leaks nothing: 10,000 steps of a small model through lbopt.torch, with a new lr and new grad tensors
every step (what a scheduler and zero_grad(set_to_none=True) do), whose resident memory grows by less than 1 KiB
per step on average between steps 1,000 and 10,000. A reference kept per step by the binding (a plan, a ctypes
array, a DLTensor) or memory the library does not free would show as steady growth."""
import gc
import math
import os

import pytest
import torch

import lbopt.torch as lbt

STEPS, FIRST = 10_000, 1_000


def _rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")




@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc")
def test_ten_thousand_steps_grow_resident_memory_by_less_than_a_kib_per_step(one_torch_thread):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 64), torch.nn.GELU(),
                                torch.nn.Linear(64, 1))
    weights = [p for p in model.parameters() if p.dim() > 1]
    biases = [p for p in model.parameters() if p.dim() == 1]
    # two optimizers, quantized and fp32 states, and a scalar step per optimizer
    opts = [lbt.AdamW4bit(weights, lr=1e-3, min_quant_size=0), lbt.Lion(biases, lr=1e-4)]
    x = torch.randn(32, 16)
    y = x[:, :2].sum(1, keepdim=True).sin()
    rss = {}
    for t in range(1, STEPS + 1):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        lr = 0.5 * (1 + math.cos(math.pi * t / STEPS))
        for opt, base in zip(opts, (1e-3, 1e-4)):
            opt.param_groups[0]["lr"] = base * lr
            opt.step()
            opt.zero_grad(set_to_none=True)
        if t in (FIRST, STEPS):
            gc.collect()
            rss[t] = _rss_bytes()
    assert math.isfinite(loss.item())
    per_step = (rss[STEPS] - rss[FIRST]) / (STEPS - FIRST)
    assert per_step < 1024, f"resident memory grew {per_step:.0f} bytes per step between steps {FIRST} and {STEPS}"

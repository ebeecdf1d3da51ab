#!/usr/bin/env python3
"""Round-to-nearest against stochastic rounding of 4-bit state codes, simulated in torch on the regression task of
bench/accuracy.py (a 32-256-1 MLP fitting sin of a sum of inputs, full batch): SGD with momentum, Lion and
AdEMAMix, every state kept as lbopt's 4-bit codes would keep it (lbopt's signed and unsigned 4-bit maps, 128-element
blocks scaled by their absmax), the codes chosen by round-to-nearest (what the library does) or stochastically
between the two map values around each scaled value, with probabilities that make the expected value exact: on
every state, or on the states of the signed map only (momenta; the second moments, which divide, keep
round-to-nearest). A second table takes AdEMAMix's three states one at a time (the others kept in fp32), with
the library's default rounding (stochastic for m1 and m2, nearest for nu), and its second moment nu kept on the
signed map's non-negative values instead of the unsigned (linear) map.

    LBOPT_LIBRARY=build-test/liblbopt.so.0 PYTHONPATH=bindings/python python3 tools/code_rounding_sim.py \\
        [--steps 150] [--seeds 3]

Prints the mean of the last 10 training losses over the seeds, and its difference from the fp32-state run's mean.
The optimizers' hyper-parameters are bench/accuracy.py's. A simulation of the formats, not the library's kernels:
its round-to-nearest column is to be compared with bench/accuracy.py's 4-bit rows.
"""
import argparse
import statistics

import torch

import lbopt._abi as abi
import lbopt._import as imports

BLOCK = 128


def quantize(x, values, mode, gen, second):
    """x as the values its 4-bit codes decode to: blocks of BLOCK scaled by their absmax, each scaled value rounded
    to the nearest map value (rn) or to one of the two around it with the probabilities of an unbiased rounding
    (sr); a second moment's positive value never becomes 0 (the library's guard: the smallest positive code)."""
    flat = x.reshape(-1)
    n = flat.numel()
    blocks = torch.cat([flat, flat.new_zeros((-n) % BLOCK)]).view(-1, BLOCK)
    scale = blocks.abs().amax(1, keepdim=True).clamp_min(1e-12)
    y = (blocks / scale).clamp(values[0], values[-1]).contiguous()
    hi = torch.searchsorted(values, y).clamp(1, len(values) - 1)
    lo_v, hi_v = values[hi - 1], values[hi]
    if mode == "rn":
        q = torch.where(y - lo_v <= hi_v - y, lo_v, hi_v)
    else:
        q = torch.where(torch.rand(y.shape, generator=gen) < (y - lo_v) / (hi_v - lo_v), hi_v, lo_v)
    if second:
        q = torch.where((q == 0) & (y > 0), values[values > 0].min(), q)
    return (q * scale).reshape(-1)[:n].view_as(x)


def run(optimizer, mode, seed, steps, maps, quantized=(0, 1, 2)):
    """quantized: the states (by index: m1, m2, nu for AdEMAMix) kept as codes; the others stay fp32."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.GELU(), torch.nn.Linear(256, 1))
    x = torch.randn(512, 32)
    y = x[:, :4].sum(1, keepdim=True).sin()
    gen = torch.Generator().manual_seed(1000 + seed)
    params = list(model.parameters())
    states = [[torch.zeros_like(p) for _ in range(3)] for p in params]

    def keep(t, second, state=0):  # sr-signed: stochastic rounding on the signed maps' states, nearest on the others
        if mode == "fp32" or state not in quantized:
            return t
        rounding = "sr" if mode == "sr" or (mode == "sr-signed" and not second) else "rn"
        return quantize(t, maps[second], rounding, gen, second)

    losses = []
    for t in range(1, steps + 1):
        loss = torch.nn.functional.mse_loss(model(x), y)
        model.zero_grad()
        loss.backward()
        losses.append(loss.item())
        with torch.no_grad():
            for p, (m, m2, nu) in zip(params, states):
                g = p.grad
                if optimizer == "sgd":  # lr 0.05, momentum 0.9: torch.optim.SGD's buffer
                    new = 0.9 * m + g if t > 1 else g.clone()
                    p -= 0.05 * new
                    m.copy_(keep(new, False))
                elif optimizer == "lion":  # lr 1e-3, weight decay 0.01, betas (0.9, 0.99)
                    p.mul_(1 - 1e-3 * 0.01)
                    p -= 1e-3 * (0.9 * m + 0.1 * g).sign()
                    m.copy_(keep(0.99 * m + 0.01 * g, False))
                else:  # AdEMAMix: lr 2e-3, betas (0.9, 0.999, 0.9999), alpha 5, eps 1e-8, weight decay 0.01
                    m1n, m2n, nun = 0.9 * m + 0.1 * g, 0.9999 * m2 + 1e-4 * g, 0.999 * nu + 1e-3 * g * g
                    denom = nun.sqrt() / (1 - 0.999 ** t) ** 0.5 + 1e-8
                    p -= 2e-3 * ((m1n / (1 - 0.9 ** t) + 5 * m2n) / denom + 0.01 * p)
                    m.copy_(keep(m1n, False, 0))
                    m2.copy_(keep(m2n, False, 1))
                    nu.copy_(keep(nun, True, 2))
    return statistics.mean(losses[-10:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    maps = {second: imports.codebook(abi.STATE_4BIT, int(second)).to(torch.float32).sort().values
            for second in (False, True)}
    modes = ("rn", "sr-signed", "sr")
    print("| optimizer | fp32 states | 4-bit, round-to-nearest | 4-bit, stochastic on signed states | 4-bit, "
          "stochastic on all |\n|---|---|---|---|---|")
    for optimizer in ("sgd", "lion", "ademamix"):
        means = {m: statistics.mean(run(optimizer, m, s, args.steps, maps) for s in range(args.seeds))
                 for m in ("fp32",) + modes}
        cells = [f"{means['fp32']:.4g}"] + [f"{means[m]:.4g} ({100 * (means[m] / means['fp32'] - 1):+.1f}%)"
                                            for m in modes]
        print(f"| {optimizer} | " + " | ".join(cells) + " |")
    ademamix_states(args, maps)


def ademamix_states(args, maps):
    """AdEMAMix's states quantized one at a time, and nu on the signed map's non-negative values."""
    def mean(quantized, state_maps=maps):
        return statistics.mean(run("ademamix", "sr-signed", s, args.steps, state_maps, quantized)
                               for s in range(args.seeds))

    fp32 = statistics.mean(run("ademamix", "fp32", s, args.steps, maps) for s in range(args.seeds))
    signed = maps[False]
    rows = [("m1 only (stochastic)", (0,), maps), ("m2 only (stochastic)", (1,), maps), ("nu only", (2,), maps),
            ("m1 and m2, nu fp32", (0, 1), maps), ("all three", (0, 1, 2), maps),
            ("all three, nu on the signed map", (0, 1, 2), {False: signed, True: signed[signed >= 0]})]
    print(f"\n| AdEMAMix, 4-bit states | mean (fp32 states: {fp32:.4g}) |\n|---|---|")
    for label, quantized, state_maps in rows:
        m = mean(quantized, state_maps)
        print(f"| {label} | {m:.4g} ({100 * (m / fp32 - 1):+.1f}%) |")


if __name__ == "__main__":
    main()

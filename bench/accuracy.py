#!/usr/bin/env python3
"""How low-bit states train against fp32 states, for every optimizer and state kind: each variant against the
fp32-state run of the same optimizer, same seeds, same data, same lr schedule; with torchao's and bitsandbytes'
low-bit optimizers where they exist, so that a gap shows as the format's or lbopt's.

usage: LBOPT_LIBRARY=build-release/liblbopt.so.0 PYTHONPATH=bindings/python \\
       python3 bench/accuracy.py [--tasks charlm,regression] [--optimizers adamw,sgd,lion,ademamix,muon]
       [--seeds 3] [--charlm-steps 1000] [--regression-steps 150] [--jobs 2] [--device cpu] [--json PATH]
       [--no-peers] [--variants 'fp32,4-bit,4-bit (nearest),...'] [--skip 'adamw:torchao 8-bit,...']

Tasks:
- charlm: the demo's character-level transformer (python -m lbopt.demo: 0.83M params, the Debian fortunes corpus)
  trained --charlm-steps steps with a linear warm-up and cosine decay; the metric is the validation loss at the
  end (16 fixed batches).
- regression: a 32-256-1 MLP fitting sin of a sum of inputs (512 samples, full batch) for --regression-steps
  steps at a constant lr, every tensor quantized (min_quant_size=0); the metric is the mean training loss of the
  last 10 steps.
Each (task, optimizer, variant, seed) runs in a worker process with one torch thread. Prints one table per task:
per variant the mean over seeds, the spread (max - min), and the mean's difference from the same optimizer's
fp32 mean in percent (negative: lower loss than fp32). A peer that fails is a row saying why.
"""
import argparse
import json
import math
import multiprocessing
import os
import statistics
import sys
import time
import types

# optimizer -> (lbopt class stem, charlm lr, regression lr, keyword arguments)
OPTIMIZERS = {
    "adamw": ("AdamW", 3e-3, 1e-2, dict(weight_decay=0.01)),
    "sgd": ("SGD", 0.03, 0.05, dict(momentum=0.9)),
    "lion": ("Lion", 3e-4, 1e-3, dict(weight_decay=0.01)),
    "ademamix": ("AdEMAMix", 3e-3, 2e-3, dict(weight_decay=0.01)),
    "muon": ("Muon", 0.02, 0.02, dict(weight_decay=0.01)),
}
# Muon steps the hidden layers' matrices (lbopt.torch.muon_param_groups; the regression's head is module 2); the
# other params go to AdamW with fp32 states at AdamW's lr, whatever the variant, so that the variants differ in
# Muon's momentum alone
MUON_REST = {"charlm": ("embed", "lm_head", "head", "output"), "regression": ("2.",)}
KINDS = {"fp32": "", "8-bit": "8bit", "FP8": "Fp8", "4-bit": "4bit"}
# a quantized kind with one setting other than the library's default: its first-moment codes rounded one way
# (state_stochastic_round): "4-bit (nearest)", "8-bit (stochastic)"; AdEMAMix's nu on lbopt 0.3's linear 4-bit map
# (the param group's nu_linear_map): "4-bit (linear nu)"
SETTINGS = {"nearest": dict(state_stochastic_round=False), "stochastic": dict(state_stochastic_round=True),
            "linear nu": dict(group=dict(nu_linear_map=True))}
# optimizer -> [(variant, package, class)]: the peers' low-bit versions of it
PEERS = {
    "adamw": [("torchao 4-bit", "torchao.optim", "AdamW4bit"), ("torchao 8-bit", "torchao.optim", "AdamW8bit"),
              ("torchao FP8", "torchao.optim", "AdamWFp8"), ("bitsandbytes 8-bit", "bitsandbytes.optim", "AdamW8bit")],
    "lion": [("bitsandbytes 8-bit", "bitsandbytes.optim", "Lion8bit")],
    "ademamix": [("bitsandbytes 8-bit", "bitsandbytes.optim", "AdEMAMix8bit")],
}
CHARLM = dict(d_model=128, layers=4, heads=4, context=64, batch=32, max_chars=2_000_000, val_batches=16)


def make_optimizer(torch, optimizer, variant, model, lr, task):
    """The optimizers of a run, as a list: one, or Muon and the AdamW of the params it does not step."""
    stem, _, _, kwargs = OPTIMIZERS[optimizer]
    kind, _, setting = variant.rstrip(")").partition(" (")
    params = list(model.parameters())
    if kind in KINDS:
        import lbopt.torch as lt

        extra = dict(min_quant_size=0) if task == "regression" else {}
        extra.update(SETTINGS[setting] if setting else {})
        group = extra.pop("group", {})
        rest = []
        if optimizer == "muon":
            params, rest = lt.muon_param_groups(model, adamw_names=MUON_REST[task])
            _, adamw_charlm, adamw_regression, adamw_kwargs = OPTIMIZERS["adamw"]
            rest = [lt.AdamW(rest, lr=adamw_charlm if task == "charlm" else adamw_regression, **adamw_kwargs)]
        return [getattr(lt, stem + KINDS[kind])([dict(params=params, **group)], lr=lr, **kwargs, **extra), *rest]
    package, cls = next((p, c) for v, p, c in PEERS[optimizer] if v == variant)
    module = __import__(package, fromlist=[cls])
    if package.startswith("torchao"):
        return [getattr(module, cls)(params, lr=torch.tensor(lr), **kwargs)]  # a tensor lr: no recompile per lr
    return [getattr(module, cls)(params, lr=lr, **kwargs)]


def charlm(torch, make, steps, seed, device):
    from lbopt import demo

    args = types.SimpleNamespace(**CHARLM)
    torch.manual_seed(seed)
    text = demo.load_corpus(None)
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([index[c] for c in text[: args.max_chars]], dtype=torch.long)
    split = int(0.9 * len(data))
    train_data, val_data = data[:split], data[split:]
    model = demo.build_model(torch, len(chars), args).to(device)
    opts = make(model)
    scheds = [torch.optim.lr_scheduler.LambdaLR(o, lambda step: demo.lr_factor(step, steps)) for o in opts]
    gen, val_gen = torch.Generator().manual_seed(seed + 1), torch.Generator().manual_seed(12345)
    val = [demo.sample_batch(torch, val_data, val_gen, args, device) for _ in range(args.val_batches)]
    for _ in range(steps):
        x, y = demo.sample_batch(torch, train_data, gen, args, device)
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        for o in opts:
            o.zero_grad(set_to_none=True)
        loss.backward()
        for o, s in zip(opts, scheds):
            o.step()
            s.step()
    model.eval()
    with torch.no_grad():
        return statistics.mean(torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten()).item()
                               for x, y in val)


def regression(torch, make, steps, seed, device):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.GELU(), torch.nn.Linear(256, 1)).to(device)
    x = torch.randn(512, 32, device=device)
    y = x[:, :4].sum(1, keepdim=True).sin()
    opts = make(model)
    losses = []
    for _ in range(steps):
        loss = torch.nn.functional.mse_loss(model(x), y)
        for o in opts:
            o.zero_grad(set_to_none=True)
        loss.backward()
        for o in opts:
            o.step()
        losses.append(loss.item())
    return statistics.mean(losses[-10:])


def run(job):
    """One (task, optimizer, variant, seed): (job, metric or None, error or None, seconds)."""
    task, optimizer, variant, seed, steps, device = job
    t0 = time.perf_counter()
    try:
        import torch

        torch.set_num_threads(1)
        import lbopt

        lbopt.set_num_threads(1)
        _, lr_charlm, lr_regression, _ = OPTIMIZERS[optimizer]
        lr = lr_charlm if task == "charlm" else lr_regression
        make = lambda model: make_optimizer(torch, optimizer, variant, model, lr, task)  # noqa: E731
        metric = (charlm if task == "charlm" else regression)(torch, make, steps, seed, device)
        if not math.isfinite(metric):
            return job, None, f"diverged ({metric})", time.perf_counter() - t0
        return job, metric, None, time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001 -- a peer that fails is a row saying why
        msg = " ".join(str(e).split())[:200]
        return job, None, f"{type(e).__name__}: {msg}", time.perf_counter() - t0


def variants(optimizer, peers):
    roundings = [s for s in SETTINGS if "state_stochastic_round" in SETTINGS[s]]
    return ([*KINDS, *(f"{k} ({r})" for k in KINDS if k != "fp32" for r in roundings)]
            + (["4-bit (linear nu)"] if optimizer == "ademamix" else [])
            + ([v for v, _, _ in PEERS.get(optimizer, [])] if peers else []))


def table(task, optimizers, results, peers):
    """Markdown rows: per optimizer and variant the mean, the spread and the difference from fp32's mean."""
    lines = [f"| optimizer | variant | mean | spread (max - min) | vs fp32 mean |", "|---|---|---|---|---|"]
    for optimizer in optimizers:
        ref = results.get((task, optimizer, "fp32"), {}).get("values")
        ref_mean = statistics.mean(ref) if ref else None
        for variant in variants(optimizer, peers):
            if (task, optimizer, variant) not in results:
                continue  # not asked for
            r = results[(task, optimizer, variant)]
            vals = r["values"]
            if not vals:
                lines.append(f"| {OPTIMIZERS[optimizer][0]} | {variant} | - | {r.get('error', 'not run')} | - |")
                continue
            mean = statistics.mean(vals)
            diff = f"{100 * (mean / ref_mean - 1):+.2f}%" if ref_mean else "-"
            note = f" ({len(vals)} of {r['runs']} runs)" if len(vals) < r["runs"] else ""
            lines.append(f"| {OPTIMIZERS[optimizer][0]} | {variant} | {mean:#.4g}{note} | {max(vals) - min(vals):.3g} "
                         f"| {diff} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", default="charlm,regression")
    ap.add_argument("--optimizers", default=",".join(OPTIMIZERS))
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--charlm-steps", type=int, default=1000)
    ap.add_argument("--regression-steps", type=int, default=150)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes, one torch thread each")
    ap.add_argument("--no-peers", action="store_true", help="lbopt's kinds only")
    ap.add_argument("--variants", help="the variants to run (default: all), e.g. fp32,4-bit")
    ap.add_argument("--skip", default="", help="(optimizer:variant,...) runs left out, e.g. adamw:torchao 8-bit")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args()
    tasks, optimizers = args.tasks.split(","), args.optimizers.split(",")
    steps = {"charlm": args.charlm_steps, "regression": args.regression_steps}
    skip = {tuple(x.split(":", 1)) for x in args.skip.split(",") if x}
    wanted = set(args.variants.split(",")) if args.variants else {v for o in optimizers for v in variants(o, True)}
    jobs = [(task, o, v, seed, steps[task], args.device) for task in tasks for o in optimizers
            for v in variants(o, not args.no_peers) if (o, v) not in skip and v in wanted for seed in range(args.seeds)]
    results = {}
    t0 = time.perf_counter()
    ctx = multiprocessing.get_context("spawn")  # fresh interpreters: no torch state shared between runs
    with ctx.Pool(args.jobs, maxtasksperchild=1) as pool:
        for (task, o, v, seed, _, _), metric, error, secs in pool.imap_unordered(run, jobs):
            r = results.setdefault((task, o, v), {"values": [], "runs": 0})
            r["runs"] += 1
            if metric is None:
                r["error"] = error
            else:
                r["values"].append(metric)
            print(f"  {task} {o} {v} seed {seed}: {metric if metric is not None else error} ({secs:.0f} s)",
                  file=sys.stderr, flush=True)
    import lbopt
    import torch

    print(f"lbopt {lbopt.version()} ({lbopt.build_info()['cpu_kernels']} CPU kernels), torch {torch.__version__}, "
          f"device {args.device}, {args.seeds} seeds, {time.perf_counter() - t0:.0f} s\n")
    for task in tasks:
        what = (f"char-LM, {args.charlm_steps} steps, validation loss" if task == "charlm" else
                f"regression MLP, {args.regression_steps} steps, training loss")
        print(f"## {what}\n\n{table(task, optimizers, results, not args.no_peers)}\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": [{"task": t, "optimizer": o, "variant": v, **r}
                                                       for (t, o, v), r in results.items()]}, f, indent=1)


if __name__ == "__main__":
    main()

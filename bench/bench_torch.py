#!/usr/bin/env python3
"""Optimizer step time, lbopt vs peers, same run, with a constant lr and with a cosine lr changed on every step;
optimizer state bytes per parameter; and the per-step Python overhead on a model of many small parameters.

usage: LBOPT_LIBRARY=build-release/liblbopt.so.0 PYTHONPATH=bindings/python \
       python3 bench/bench_torch.py [--params 100e6] [--steps 10] [--small 300]
       [--device cpu|cuda] [--threads N] [--json PATH]
       python3 bench/bench_torch.py --model gpt2-small|llama-1b|flat-1e9 [--device cpu|cuda] [--steps 10]
       [--peer-steps 3] [--warmup 2] [--threads N] [--json PATH]
Peers: torch.optim.AdamW(fused=True), torchao AdamW4bit, and on CPU DeepSpeed's DeepSpeedCPUAdam where
`import deepspeed` works (it JIT-builds its C++ op on first use). Prints markdown tables (for docs/benchmarks.md).

--model: a model's parameter tensors (built here with its shapes, random values and random grads, no download):
GPT-2 small (148 tensors, 124,439,808 fp32 params), Llama 3.2 1B (146 tensors, 1,235,814,400) or four 250M
matrices (flat-1e9). Rows: torch AdamW(fused=True), lbopt AdamW (fp32 states), AdamW4bit, AdamWFp8, AdamW8bit, and
the peers: on the CPU bitsandbytes AdamW8bit and torchao AdamW4bit (slow: timed for only --peer-steps steps), on a
GPU torchao AdamW4bit, AdamW8bit and AdamWFp8 and bitsandbytes AdamW8bit and PagedAdamW8bit. On the CPU the rows
step in turn, round-robin; on a GPU one row at a time. Warm-up steps are not timed; a missing or failing peer is a
row saying why.
--threads N: torch.set_num_threads(N), lbopt.set_num_threads(N) (the C ABI's lbopt_set_num_threads), and
OMP_NUM_THREADS / LBOPT_NUM_THREADS set before torch and lbopt load.
"""
import argparse
import json
import math
import os
import platform
import statistics
import sys
import time


def _early_threads(argv):
    """--threads, read before torch loads: OpenMP (torch, inductor's C++ kernels, bitsandbytes) sizes its pool
    from OMP_NUM_THREADS once, at load."""
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--threads", type=int)
    n = ap.parse_known_args(argv)[0].threads
    if n:
        os.environ["OMP_NUM_THREADS"] = str(n)
        os.environ["LBOPT_NUM_THREADS"] = str(n)
    return n


_early_threads(sys.argv[1:])

import torch  # noqa: E402

import lbopt  # noqa: E402
import lbopt.torch as lt  # noqa: E402


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


def _state_tensors(v):
    """The plain tensors holding one state value: a tensor subclass (torchao's OptimState4bit) by its inner
    tensors (codes, scale, qmap), a plain tensor itself; python numbers and strings hold none."""
    if not torch.is_tensor(v):
        return []
    if type(v) is not torch.Tensor and type(v) is not torch.nn.Parameter and hasattr(v, "__tensor_flatten__"):
        names, _ = v.__tensor_flatten__()
        return [t for n in names for t in _state_tensors(getattr(v, n))]
    return [v]


def state_bytes(opt):
    """Bytes of optimizer state tensors, measured from opt.state (a torchao subclass tensor counts its codes,
    scales and qmap); a tensor shared by several params' states (bitsandbytes' qmaps) counts once."""
    seen = set()
    total = 0
    for st in opt.state.values():
        for v in st.values():
            for t in _state_tensors(v):
                key = (t.untyped_storage().data_ptr(), t.storage_offset(), t.nbytes)
                if key not in seen:
                    seen.add(key)
                    total += t.nbytes
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


# ---- --model: a model's parameter set -------------------------------------------------------------------------


def gpt2_small_shapes(n_layer=12, d=768, vocab=50257, n_ctx=1024):
    """(name, shape) of GPT-2 small's parameters, as Hugging Face's GPT2Model names them (Conv1D weights are
    in x out); lm_head is tied to wte and holds no tensor of its own."""
    shapes = [("wte.weight", (vocab, d)), ("wpe.weight", (n_ctx, d))]
    for i in range(n_layer):
        h = f"h.{i}."
        shapes += [(h + "ln_1.weight", (d,)), (h + "ln_1.bias", (d,)),
                   (h + "attn.c_attn.weight", (d, 3 * d)), (h + "attn.c_attn.bias", (3 * d,)),
                   (h + "attn.c_proj.weight", (d, d)), (h + "attn.c_proj.bias", (d,)),
                   (h + "ln_2.weight", (d,)), (h + "ln_2.bias", (d,)),
                   (h + "mlp.c_fc.weight", (d, 4 * d)), (h + "mlp.c_fc.bias", (4 * d,)),
                   (h + "mlp.c_proj.weight", (4 * d, d)), (h + "mlp.c_proj.bias", (d,))]
    shapes += [("ln_f.weight", (d,)), ("ln_f.bias", (d,))]
    return shapes


def llama_1b_shapes(n_layer=16, d=2048, ffn=8192, kv=512, vocab=128256):
    """(name, shape) of Llama 3.2 1B's parameters, as Hugging Face's LlamaModel names them (Linear weights are
    out x in; 8 key-value heads of 64); lm_head is tied to embed_tokens."""
    shapes = [("embed_tokens.weight", (vocab, d))]
    for i in range(n_layer):
        h = f"layers.{i}."
        shapes += [(h + "self_attn.q_proj.weight", (d, d)), (h + "self_attn.k_proj.weight", (kv, d)),
                   (h + "self_attn.v_proj.weight", (kv, d)), (h + "self_attn.o_proj.weight", (d, d)),
                   (h + "mlp.gate_proj.weight", (ffn, d)), (h + "mlp.up_proj.weight", (ffn, d)),
                   (h + "mlp.down_proj.weight", (d, ffn)),
                   (h + "input_layernorm.weight", (d,)), (h + "post_attention_layernorm.weight", (d,))]
    return shapes + [("norm.weight", (d,))]


def flat_1e9_shapes():
    """Four 250M-element matrices: 1e9 params in tensors large enough that per-tensor costs vanish."""
    return [(f"w{i}.weight", (62_500, 4_000)) for i in range(4)]


# name -> (shapes, params, tensors): the counts check the shapes against the models' published sizes
MODELS = {"gpt2-small": (gpt2_small_shapes, 124_439_808, 148),
          "llama-1b": (llama_1b_shapes, 1_235_814_400, 146),
          "flat-1e9": (flat_1e9_shapes, 1_000_000_000, 4)}


def model_tensors(model):
    """A model's params (fp32, N(0, 0.02); norm weights 1, biases 0) and random grads (N(0, 1e-3)), made on
    DEVICE, checked against the model's published size."""
    make_shapes, n_expected, t_expected = MODELS[model]
    shapes = make_shapes()
    n = sum(math.prod(shape) for _, shape in shapes)
    if len(shapes) != t_expected or n != n_expected:
        raise AssertionError(f"{model}: {len(shapes)} tensors, {n} params; expected {t_expected}, {n_expected}")
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    values, grads = [], []
    for name, shape in shapes:
        if "norm" in name or ".ln_" in name or name.startswith("ln_f"):
            v = torch.ones(shape, device=DEVICE) if name.endswith("weight") else torch.zeros(shape, device=DEVICE)
        elif name.endswith("bias"):
            v = torch.zeros(shape, device=DEVICE)
        else:
            v = torch.randn(shape, generator=gen, device=DEVICE) * 0.02
        values.append(v)
        grads.append(torch.randn(shape, generator=gen, device=DEVICE) * 1e-3)
    return values, grads


def model_rows():
    """(name, maker, slow) per row; a maker raises ImportError where its package is missing. slow: timed for
    --peer-steps steps only (the peers' CPU steps take seconds; on a GPU none is slow)."""
    kw = dict(lr=1e-3, weight_decay=1e-2)
    on_cpu = DEVICE == "cpu"

    def bnb(cls):
        def make(ps):
            import bitsandbytes as bnb

            return getattr(bnb.optim, cls)(ps, **kw)
        return make

    def torchao(cls):
        def make(ps):
            import torchao.optim as ao

            return getattr(ao, cls)(ps, **kw)
        return make

    rows = [("torch AdamW(fused=True) fp32", lambda ps: torch.optim.AdamW(ps, fused=True, **kw), False),
            ("lbopt AdamW (fp32 states)", lambda ps: lt.AdamW(ps, **kw), False),
            ("lbopt AdamW4bit", lambda ps: lt.AdamW4bit(ps, **kw), False),
            ("lbopt AdamWFp8", lambda ps: lt.AdamWFp8(ps, **kw), False),
            ("lbopt AdamW8bit", lambda ps: lt.AdamW8bit(ps, **kw), False)]
    if on_cpu:
        return rows + [("bitsandbytes AdamW8bit (CPU)", bnb("AdamW8bit"), True),
                       ("torchao AdamW4bit", torchao("AdamW4bit"), True)]
    return rows + [(f"torchao {c}", torchao(c), False) for c in ("AdamW4bit", "AdamW8bit", "AdamWFp8")] + \
        [(f"bitsandbytes {c}", bnb(c), False) for c in ("AdamW8bit", "PagedAdamW8bit")]


def _why(e):
    msg = " ".join(str(e).split())
    return f"{type(e).__name__}: {msg[:300]}" if msg else type(e).__name__


def package_versions():
    out = {"torch": torch.__version__, "lbopt": lbopt.version()}
    for mod in ("torchao", "bitsandbytes"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception as e:  # noqa: BLE001 -- a peer that fails to import is reported, not fatal
            out[mod] = f"not importable ({_why(e)})"
    return out


def cpu_description():
    """The CPU's name and instruction sets as the libraries see them: lbopt's dispatched kernel target
    (lbopt_build_info's cpu_kernels), torch's CPU capability, and the AVX-512 / AMX flags of /proc/cpuinfo."""
    name, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, val = line.partition(":")
                if key.strip() == "model name":
                    name = val.strip()
                elif key.strip() == "flags":
                    flags = set(val.split())
                    break
    except OSError:
        pass
    try:
        torch_isa = torch.backends.cpu.get_cpu_capability()
    except Exception:  # noqa: BLE001
        torch_isa = "unknown"
    wide = sorted(f for f in flags if f.startswith(("avx512", "amx")) or f in ("avx2", "fma", "avx_vnni"))
    return {"cpu": name, "cores": os.cpu_count(), "lbopt_cpu_kernels": lbopt.build_info()["cpu_kernels"],
            "torch_cpu_capability": torch_isa, "flags": wide}


def _build(name, make, slow, values, grads, args, res):
    """A row's optimizer over its own copy of the params (the grads are shared: no optimizer writes them), and
    the steps it runs; None where it is skipped or fails to build (res["status"] says why)."""
    steps = args.peer_steps if slow else args.steps
    if steps <= 0:
        res["status"] = "skipped (--peer-steps 0)"
        return None
    ps = [torch.nn.Parameter(v.clone()) for v in values]
    for p, g in zip(ps, grads):
        p.grad = g
    try:
        return make(ps), ps, args.warmup + steps
    except ImportError as e:
        res["status"] = f"missing: {_why(e)}"
    except Exception as e:  # noqa: BLE001
        res["status"] = f"failed to build: {_why(e)}"
    return None


def _rounds(live, rows, args, n_params):
    """Round r steps each live row still running, in turn; the rows' median step times and state bytes."""
    for r in range(max((n for _, _, n in live.values()), default=0)):
        for name in list(live):
            opt, ps, n = live[name]
            if r >= n:
                continue
            try:
                t = timed_step(opt, 1e-3)
            except Exception as e:  # noqa: BLE001
                rows[name]["status"] = f"failed in step {r + 1}: {_why(e)}"
                del live[name], opt, ps
                continue
            if r >= args.warmup:
                rows[name]["times_ms"].append(t * 1e3)
            elif args.verbose:
                print(f"  warm-up step {r + 1} of {name}: {t * 1e3:.0f} ms", file=sys.stderr, flush=True)
    for name, (opt, ps, _) in live.items():  # state bytes once the states exist
        res = rows[name]
        res["steps_timed"] = len(res["times_ms"])
        res["median_ms"] = statistics.median(res["times_ms"]) if res["times_ms"] else None
        res["state_bytes"] = state_bytes(opt)
        res["state_bytes_per_param"] = res["state_bytes"] / n_params


def run_model(args):
    """The rows over a model's tensors. On the CPU one round-robin run: every row holds its own params and
    states at once and the rows step in turn, so that a shared VM's slow phases fall on all of them alike. On a
    GPU one row at a time (a 1B-param set held by ten rows at once would not fit). Rows time --warmup + --steps
    steps (slow peers --warmup + --peer-steps); the warm-up steps (torchao's compile, first touch of the states)
    are not timed. A row that fails to build or to step is reported with the reason."""
    values, grads = model_tensors(args.model)
    n_params = sum(v.numel() for v in values)
    specs = model_rows()
    rows = {name: {"status": "ok", "steps_timed": 0, "times_ms": []} for name, _, _ in specs}
    batches = [specs] if DEVICE == "cpu" else [[spec] for spec in specs]
    t_run = time.perf_counter()
    for batch in batches:
        live = {}
        for name, make, slow in batch:
            built = _build(name, make, slow, values, grads, args, rows[name])
            if built:
                live[name] = built
        _rounds(live, rows, args, n_params)
        del live
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
        if args.verbose:
            print(f"  {', '.join(n for n, _, _ in batch)} done, {time.perf_counter() - t_run:.0f} s",
                  file=sys.stderr, flush=True)
    ref = rows["torch AdamW(fused=True) fp32"].get("median_ms")
    for res in rows.values():
        res["speed_vs_torch_fused"] = ref / res["median_ms"] if ref and res.get("median_ms") else None
    return rows, n_params, time.perf_counter() - t_run


def main_model(args):
    versions, cpu = package_versions(), cpu_description()
    threads = {"torch": torch.get_num_threads(), "lbopt": lbopt.get_num_threads(),
               "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
               "LBOPT_NUM_THREADS": os.environ.get("LBOPT_NUM_THREADS")}
    print(", ".join(f"{k} {v}" for k, v in versions.items()))
    print(f"CPU: {cpu['cpu']}, {cpu['cores']} cores; lbopt CPU kernels {cpu['lbopt_cpu_kernels']}, torch CPU "
          f"capability {cpu['torch_cpu_capability']}; flags: {' '.join(cpu['flags']) or 'none listed'}")
    print(f"threads: torch {threads['torch']}, lbopt {threads['lbopt']}\n", flush=True)
    rows, n_params, wall = run_model(args)
    where = "the CPU, one round-robin run" if DEVICE == "cpu" else f"{torch.cuda.get_device_name()}, a row at a time"
    print(f"## Optimizer step time on {where}: {args.model} ({n_params:,} fp32 params, {MODELS[args.model][2]} "
          f"tensors), median step time after {args.warmup} warm-up steps\n")
    print("| optimizer | steps timed | median step (ms) | speed vs torch fused | state bytes / param |")
    print("|---|---|---|---|---|")
    for name, r in rows.items():
        if r.get("median_ms") is None:
            print(f"| {name} | - | {r['status']} | - | - |")
            continue
        ratio = f"{r['speed_vs_torch_fused']:.2f}x" if r["speed_vs_torch_fused"] else "-"
        print(f"| {name} | {r['steps_timed']} | {r['median_ms']:.1f} | {ratio} | {r['state_bytes_per_param']:.3f} |")
    print(f"\nspeed vs torch fused: torch AdamW(fused=True)'s median step time / the row's (higher is faster); "
          f"state bytes / param: the optimizer's state tensors over {n_params:,} params. Run took {wall:.0f} s.")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "device": DEVICE, "params": n_params, "tensors": MODELS[args.model][2],
                       "steps": args.steps, "peer_steps": args.peer_steps, "warmup": args.warmup,
                       "versions": versions, "cpu": cpu, "threads": threads, "wall_s": wall, "rows": rows},
                      f, indent=1)
        print(f"wrote {args.json}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", type=float, default=100e6)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--small", type=int, default=300)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--model", choices=sorted(MODELS), help="step a model's parameter set instead of --params")
    ap.add_argument("--peer-steps", type=int, default=3,
                    help="--model: timed steps of the slow peers (bitsandbytes, torchao); 0 skips them")
    ap.add_argument("--warmup", type=int, default=2, help="--model: untimed warm-up steps per optimizer")
    ap.add_argument("--threads", type=int, help="threads of torch, OpenMP and lbopt's pool (default: theirs)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    ap.add_argument("--verbose", action="store_true", help="--model: progress on stderr")
    args = ap.parse_args()
    global DEVICE
    DEVICE = args.device
    if args.threads:
        torch.set_num_threads(args.threads)
        lbopt.set_num_threads(args.threads)
    if args.model:
        return main_model(args)
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

    overhead = {}
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
        overhead[name] = time_steps(opt, 50, "cosine") * 1e6
        print(f"| {name} | {overhead[name]:.0f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"params": args.params, "steps": args.steps, "device": DEVICE,
                       "versions": {"torch": torch.__version__, "lbopt": lbopt.version()},
                       "threads": {"torch": torch.get_num_threads(), "lbopt": lbopt.get_num_threads()},
                       "step_s": rows, "overhead_us": overhead}, f, indent=1)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()

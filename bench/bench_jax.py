"""A jitted lbopt.jax step against lbopt.functional's step on the same 50M params (a pytree of 10 leaves of 5M),
per state kind: median seconds of 7 steps after 2 warm-ups, and the copies in the compiled step (XLA `copy`
instructions; with the params and state donated there should be none, so no state is copied per step).

    LBOPT_LIBRARY=build/liblbopt.so.0 python3 bench/bench_jax.py [--numel 50000000] [--kinds 4bit,8bit]
"""
import argparse
import pathlib
import re
import resource
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "bindings" / "python"))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import lbopt  # noqa: E402
import lbopt.functional as F  # noqa: E402
import lbopt.jax as LJ  # noqa: E402
from timing import median_seconds  # noqa: E402


def median_time(fn):
    return median_seconds(fn, reps=7, warm=2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--numel", type=int, default=50_000_000)
    ap.add_argument("--kinds", default="4bit,8bit,fp8,fp32")
    args = ap.parse_args()
    leaves = 10
    n = args.numel // leaves
    rng = np.random.default_rng(0)
    print(f"CPU kernels {lbopt.build_info()['cpu_kernels']}, {lbopt.get_num_threads()} threads, jax {jax.__version__}, "
          f"{leaves} leaves of {n}")
    print("| kind | lbopt.functional (s) | jitted lbopt.jax, donated (s) | ratio | copies in the compiled step |")
    print("|---|---|---|---|---|")
    for kind in args.kinds.split(","):
        ps = [rng.standard_normal(n, dtype=np.float32) for _ in range(leaves)]
        gs = [rng.standard_normal(n, dtype=np.float32) * 1e-2 for _ in range(leaves)]
        sts = [{"m": F.zeros_state(kind, n), "v": F.zeros_state(kind, n)} for _ in range(leaves)]
        steps = [0]

        def functional():
            steps[0] += 1
            F.adamw_step(ps, gs, sts, 1e-3, [steps[0]] * leaves, kind=kind)

        t_f = median_time(functional)
        init, apply = LJ.adamw_apply(1e-3, state_kind=kind, min_quant_size=0)
        params = {f"w{i}": jnp.asarray(p) for i, p in enumerate(ps)}
        grads = {f"w{i}": jnp.asarray(g) for i, g in enumerate(gs)}
        state = init(params)
        step = jax.jit(apply, donate_argnums=(0, 2))
        hlo = step.lower(params, grads, state).compile().as_text()
        copies = len(re.findall(r"= \S+ copy\(", hlo))
        box = [params, state]

        def jitted():
            box[0], box[1] = step(box[0], grads, box[1])
            jax.block_until_ready(box[0])

        t_j = median_time(jitted)
        box.clear()  # free this kind's arrays before the next
        print(f"| {kind} | {t_f:.3f} | {t_j:.3f} | {t_j / t_f:.2f} | {copies} |")
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()

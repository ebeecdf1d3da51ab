#!/usr/bin/env python3
"""How many state codes two builds of liblbopt give differently for the same values: the count behind the
"codes moved" figure of docs/benchmarks.md ("CPU loop choices") when an encode's rounding changes.

    tools/code_diff.py --lib before=old-build/liblbopt.so.0 --lib after=build-rel/liblbopt.so.0 --kind 8bit

The values: 4M float32 Gaussians times 10^U(-6, 0) (absolute values for the second moment), quantized through
lbopt.functional.quantize in blocks of the kind. Each library runs in a process of its own (LBOPT_LIBRARY is read
at import).
"""
import argparse
import os
import pathlib
import subprocess
import sys
import tempfile

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]


def codes(kind, out):
    """Child process: quantize the values with the library in LBOPT_LIBRARY, save m's and v's codes in out."""
    sys.path.insert(0, str(ROOT / "bindings" / "python"))
    import lbopt.functional as F

    rng = np.random.default_rng(0)
    x = (rng.standard_normal(1 << 22) * 10.0 ** rng.uniform(-6, 0, 1 << 22)).astype(np.float32)
    saved = {}
    for moment in ("m", "v"):
        values = np.abs(x) if moment == "v" else x
        st = F.zeros_state(kind, values.size)
        F.quantize(kind, moment, values, st)
        saved[moment] = st["codes"]
    np.savez(out, **saved)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", action="append", default=[], help="NAME=PATH of a liblbopt.so.0, twice")
    ap.add_argument("--kind", default="8bit", choices=["4bit", "8bit", "fp8"])
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return codes(a.kind, a.child)
    if len(a.lib) != 2:
        sys.exit("code_diff: give --lib twice")
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        for i, spec in enumerate(a.lib):
            name, path = spec.split("=", 1)
            out = os.path.join(scratch, f"{i}.npz")
            env = dict(os.environ, LBOPT_LIBRARY=os.path.abspath(path))
            subprocess.run([sys.executable, __file__, "--kind", a.kind, "--child", out], env=env, check=True)
            results.append((name, np.load(out)))
    (a_name, a_codes), (b_name, b_codes) = results
    for moment in ("m", "v"):
        differ = int(np.count_nonzero(a_codes[moment] != b_codes[moment]))
        print(f"{a.kind} {moment}: {differ} of {a_codes[moment].size} code bytes differ ({a_name} against {b_name})")


if __name__ == "__main__":
    main()

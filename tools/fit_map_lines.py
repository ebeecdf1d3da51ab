#!/usr/bin/env python3
"""Whether the 8-bit dynamic maps could be decoded by arithmetic: one multiply-add per code from a float line per
exponent group, value = RN(w B + A), with B and A read from 8-entry tables (one permute each on AVX2).

    python3 tools/fit_map_lines.py

Group g of the signed map holds the codes 127 + u, u in [2^g, 2^(g+1)), taken at w = 2 u + 1; of the unsigned map
the codes c with c + 1 in [2^(g+1), 2^(g+2)), at w = c + 1. For each float B within --ulps of the group's
least-squares slope, the A that round every point to its table value form an interval (exact rational
arithmetic); the group fits if some float A in it does. Prints each group's fit, or that none was found.
docs/benchmarks.md ("CPU loop choices", measured and not taken) records the answer: only the groups of one or two
codes fit.
"""
import argparse
import os
import re
import struct
from fractions import Fraction

import numpy as np

CODEBOOKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "kernels", "codebooks.h")


def table(name):
    text = open(CODEBOOKS).read()
    body = re.search(r"#define LBOPT_%s \\\n(.*?)\nLBOPT_TABLE" % name, text, re.S).group(1)
    tokens = [t.strip().rstrip("f") for t in body.replace("\\", "").split(",") if t.strip()]
    return [float.fromhex(t) if "x" in t else float(t) for t in tokens]


def f32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


def bits(x):
    return struct.unpack("I", struct.pack("f", x))[0]


def from_bits(b):
    return struct.unpack("f", struct.pack("I", b))[0]


def step(x, k):
    """The float k ulps from x (x > 0), or x itself for x = 0."""
    return from_bits(bits(x) + k) if x > 0 else (-from_bits(bits(-x) + k) if x < 0 else x)


def rounds_to(q, v):
    """Whether round-to-nearest-even of the exact q is the positive float v."""
    low = (Fraction(v) + Fraction(from_bits(bits(v) - 1))) / 2
    high = (Fraction(v) + Fraction(from_bits(bits(v) + 1))) / 2
    even = bits(v) % 2 == 0
    return (low < q < high) or (even and q in (low, high))


def fit(points, ulps):
    """A float pair (B, A) with RN(w B + A) = v for every (w, v), or None."""
    if len(points) == 1:
        return 0.0, points[0][1]
    w = np.array([p[0] for p in points], float)
    v = np.array([p[1] for p in points], float)
    b0 = f32(np.polyfit(w, v, 1)[0])
    for k in range(ulps + 1):
        for b in {step(b0, k), step(b0, -k)}:
            lo = max((Fraction(x) + Fraction(from_bits(bits(x) - 1))) / 2 - Fraction(wi) * Fraction(b)
                     for wi, x in points)
            hi = min((Fraction(x) + Fraction(from_bits(bits(x) + 1))) / 2 - Fraction(wi) * Fraction(b)
                     for wi, x in points)
            if lo > hi:
                continue
            a0 = f32(float((lo + hi) / 2))
            for d in range(-2, 3):
                a = step(a0, d)
                if all(rounds_to(Fraction(wi) * Fraction(b) + Fraction(a), x) for wi, x in points):
                    return b, a
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ulps", type=int, default=4000, help="how far from the least-squares slope B is searched")
    a = ap.parse_args()
    signed, unsigned = table("SIGNED8_VALUES"), table("UNSIGNED8_VALUES")
    for name, groups in (
        ("signed", [[(2 * u + 1, signed[127 + u]) for u in range(2 ** g, 2 ** (g + 1))] for g in range(7)]),
        ("unsigned", [[(c + 1, unsigned[c]) for c in range(2 ** (g + 1) - 1, 2 ** (g + 2) - 1)] for g in range(7)]),
    ):
        for g, points in enumerate(groups):
            found = fit(points, a.ulps)
            print(f"{name} group {g} ({len(points)} codes):", f"B={found[0]!r} A={found[1]!r}" if found else "no fit")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""GB/s of the CPU step against size, per state kind, next to the copy rooflines of the same run.

usage: python3 bench/plot_step.py cpu_step.csv out.png   (the CSV of `bench_step --csv`)
A row of panels per param dtype, a column per thread count; lines per state kind; the dashed lines are the rooflines measured with
each kind's footprint (memcpy and in-place x += y; the best of the two, averaged over the kinds, per size).
"""
import csv
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    src, out = sys.argv[1], sys.argv[2]
    rows = [r for r in csv.DictReader(open(src)) if r.get("optimizer", "adamw") == "adamw"]  # AdamW's curves
    params = sorted({r["param"] for r in rows}, key=lambda p: p != "fp32")
    thread_counts = sorted({int(r["threads"]) for r in rows})
    fig, axes = plt.subplots(len(params), len(thread_counts), figsize=(5.5 * len(thread_counts), 3.8 * len(params)),
                             squeeze=False, sharey=True)
    panels = [(p, t) for p in params for t in thread_counts]
    for ax, (param, threads) in zip(axes.flat, panels):
        sel = [r for r in rows if r["param"] == param and int(r["threads"]) == threads]
        by_kind = defaultdict(list)
        roof = defaultdict(list)
        for r in sel:
            n = int(r["numel"])
            by_kind[r["kind"]].append((n, float(r["gbs"])))
            roof[n].append(max(float(r["memcpy_gbs"]), float(r["inplace_gbs"])))
        for kind, pts in by_kind.items():
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{kind} states")
        sizes = sorted(roof)
        ax.plot(sizes, [sum(roof[n]) / len(roof[n]) for n in sizes], "k--", label="copy roofline")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("elements")
        ax.set_title(f"{param} params and grads, {threads} thread{'s' if threads > 1 else ''}")
        ax.grid(alpha=0.3)
    for row in axes:
        row[0].set_ylabel("GB/s (bytes per step of docs/formats.md)")
    axes[0][-1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(out)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""A/B timing of two or more builds of liblbopt with bench_step: the protocol behind docs/benchmarks.md's
before/after figures.

    tools/ab_step.py --lib before=old-build/liblbopt.so.0 --lib after=build-release/liblbopt.so.0 \\
        --rounds 4 --pin 1 -- --sizes 64K,16M --threads 1 --kinds 4bit --params fp32 --optimizers adamw

Each round runs bench_step once per library, in turn, pinned with taskset, so that a slow stretch of a shared
host hits every library alike. A row's figure per library is its least ns/elem over the rounds (bench_step itself
keeps the best of its --reps). Build each side as its own release build (a git worktree per commit); bench_step
finds the library through LD_LIBRARY_PATH, so any build's bench_step will do.
"""
import argparse
import os
import subprocess
import sys
import tempfile


def library_dir(path, scratch):
    """A folder in which the library is liblbopt.so.0, the name bench_step loads."""
    path = os.path.abspath(path)
    if os.path.isdir(path):
        path = os.path.join(path, "liblbopt.so.0")
    if not os.path.isfile(path):
        sys.exit(f"ab_step: no library at {path}")
    if os.path.basename(path) == "liblbopt.so.0":
        return os.path.dirname(path)
    folder = tempfile.mkdtemp(dir=scratch)
    os.symlink(path, os.path.join(folder, "liblbopt.so.0"))
    return folder


def rows(output):
    """(optimizer, state, param, numel, threads) -> ns/elem, from bench_step's table."""
    found = {}
    for line in output.splitlines():
        f = line.split()
        if len(f) > 5 and f[3].isdigit() and f[4].isdigit():
            found[tuple(f[:5])] = float(f[5])
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", action="append", required=True, metavar="NAME=PATH",
                    help="a library (file or build folder) and its column name; one alone gives its best over the rounds")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--pin", default="1", help="taskset CPU list (default 1; 0,1 for two threads)")
    ap.add_argument("--bench", default="build-release/bench/bench_step")
    ap.add_argument("bench_args", nargs=argparse.REMAINDER, help="-- then bench_step's arguments")
    a = ap.parse_args()
    libs = [spec.split("=", 1) if "=" in spec else (spec, spec) for spec in a.lib]
    bench_args = a.bench_args[1:] if a.bench_args[:1] == ["--"] else a.bench_args
    best = {}
    with tempfile.TemporaryDirectory() as scratch:
        dirs = [library_dir(path, scratch) for _, path in libs]
        for r in range(a.rounds):
            for (name, _), folder in zip(libs, dirs):
                env = dict(os.environ, LD_LIBRARY_PATH=folder)
                run = subprocess.run(["taskset", "-c", a.pin, a.bench] + bench_args, env=env,
                                     capture_output=True, text=True)
                if run.returncode != 0:
                    sys.exit(f"ab_step: bench_step failed with {name}:\n{run.stderr}")
                for key, ns in rows(run.stdout).items():
                    slot = best.setdefault(key, {})
                    slot[name] = min(ns, slot.get(name, float("inf")))
            print(f"round {r + 1} of {a.rounds} done", file=sys.stderr)
    names = [name for name, _ in libs]
    print("%-36s" % "optimizer state param numel threads" + "".join("%12s" % n for n in names) +
          "".join("%12s" % f"{n}/{names[0]}" for n in names[1:]))
    for key in sorted(best, key=lambda k: (int(k[4]), int(k[3]), k[1], k[0], k[2])):
        figures = best[key]
        if any(n not in figures for n in names):
            continue
        print("%-36s" % " ".join(key) + "".join("%12.3f" % figures[n] for n in names) +
              "".join("%12.3f" % (figures[n] / figures[names[0]]) for n in names[1:]))


if __name__ == "__main__":
    main()

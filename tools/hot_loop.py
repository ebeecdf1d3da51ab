#!/usr/bin/env python3
"""The instruction mix of a kernel's update loop, from the disassembly: the instruction counts behind
docs/benchmarks.md's "What bounds the CPU step" and "CPU loop choices".

    tools/hot_loop.py build-release/liblbopt.so.0 \\
        'N_AVX3::step_loop<lbopt::AdEMAMix, lbopt::Kind4Bit, lbopt::cpu::N_AVX3::Shape<0, 3, true' --need prefetcht0 vpackusdw

The first function whose demangled name contains the pattern is disassembled (objdump); of its loops (a backward
jump and its target) the smallest that holds an instruction starting with each --need prefix and no call is
printed: its length and its mnemonics by count. A shaped loop runs two vectors a round, so on AVX-512 that is
32 elements. --need picks the loop: the 4-bit update loop with the previous block's encode holds prefetcht0 and
vpackusdw, the 8-bit one prefetcht0 and vpgatherdd.
"""
import argparse
import collections
import re
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("library")
    ap.add_argument("pattern", help="a substring of the function's demangled name")
    ap.add_argument("--need", nargs="+", default=["prefetcht0"], help="mnemonic prefixes the loop must hold")
    ap.add_argument("--list", action="store_true", help="print the loop's instructions too")
    a = ap.parse_args()
    symbols = subprocess.run(["nm", a.library], capture_output=True, text=True, check=True).stdout.split("\n")
    symbols = [line.split() for line in symbols if len(line.split()) == 3 and line.split()[1] in "tT"]
    names = subprocess.run(["c++filt"], input="\n".join(s[2] for s in symbols), capture_output=True, text=True,
                           check=True).stdout.split("\n")
    hits = [s[2] for s, name in zip(symbols, names) if a.pattern in name]
    if not hits:
        sys.exit(f"hot_loop: no function matches {a.pattern!r}")
    dump = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "--disassemble=" + hits[0], a.library],
                          capture_output=True, text=True, check=True).stdout
    code = [(int(m.group(1), 16), m.group(2).strip())
            for m in (re.match(r"\s+([0-9a-f]+):\s+(.*)", line) for line in dump.split("\n")) if m]
    index = {address: i for i, (address, _) in enumerate(code)}
    best = None
    for i, (address, text) in enumerate(code):
        jump = re.match(r"j\w+\s+([0-9a-f]+)", text)
        if not jump or int(jump.group(1), 16) > address or int(jump.group(1), 16) not in index:
            continue
        body = [t for _, t in code[index[int(jump.group(1), 16)]:i + 1]]
        if any(t.startswith("call") for t in body):
            continue
        if all(any(t.startswith(need) for t in body) for need in a.need) and (best is None or len(body) < len(best)):
            best = body
    if best is None:
        sys.exit("hot_loop: no loop holds " + " ".join(a.need))
    mix = collections.Counter(t.split()[0] for t in best)
    print(f"{len(best)} instructions:", " ".join(f"{op}:{n}" for op, n in mix.most_common()))
    if a.list:
        print("\n".join("    " + t for t in best))


if __name__ == "__main__":
    main()

#!/usr/bin/env bash
# The step's software prefetch is in the library: GCC deleted every prefetch loop of kernels/cpu/step_loops-inl.h
# unnoticed once (see StepLoop::prefetch there). Each x86 target's 4-bit AdamW kernel for fp32
# params (the shaped loops, Shape<0, 2, ...>) must hold prefetch instructions. x86-64 with objdump only; exit 77
# elsewhere.
# usage: prefetch_emitted.sh LIBRARY TARGET...      e.g. ... build/liblbopt.so.0 AVX2 AVX3
set -euo pipefail
lib=$1
shift
[ "$(uname -m)" = x86_64 ] && command -v objdump >/dev/null || { echo "not x86-64 or no objdump: skipped"; exit 77; }
for target in "$@"; do
  n=$(objdump -d -C --no-show-raw-insn "$lib" | awk -v t="N_${target}::step_loop<lbopt::AdamW, lbopt::Kind4Bit, lbopt::cpu::N_${target}::Shape<0, 2," '
    /^[0-9a-f]+ <.*>:$/ { inside = index($0, t) > 0 }
    inside && /\tprefetch/ { n++ }
    END { print n + 0 }')
  echo "$target: $n prefetch instructions in the 4-bit AdamW kernels"
  [ "$n" -gt 0 ] || { echo "no prefetch in $target's step: the compiler dropped it"; exit 1; }
done

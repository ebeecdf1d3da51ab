#!/usr/bin/env bash
# No Arm machine is at hand, so the Arm SIMD kernels are at least compiled: kernels/cpu/step_simd.cpp and
# step_simd_optimizer.cpp for each optimizer (as meson.build compiles them) for an aarch64 -march with warnings as
# errors, then the objects must hold the step kernels of every optimizer and state kind for each Highway target
# named. Exit 77 (skip) without clang or the Debian aarch64 cross headers.
# usage: cross_compile_simd.sh SOURCE_ROOT MARCH TARGET...      e.g. ... armv8.2-a+sve SVE SVE_256
set -euo pipefail
root=$1 march=$2
shift 2
sysroot=/usr/aarch64-linux-gnu/include
command -v clang++ >/dev/null && [ -d "$sysroot/c++" ] || { echo "clang++ or $sysroot missing: skipped"; exit 77; }
cxxdir=$(ls -d "$sysroot"/c++/* | sort -V | tail -1)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/inc" && ln -s /usr/include/hwy "$work/inc/hwy"  # only Highway from the host's headers
compile() {
  clang++ --target=aarch64-linux-gnu -march="$march" -std=c++17 -O2 -Wall -Wextra -Wpedantic -Werror \
    -I"$root" -I"$root/abi" -isystem "$work/inc" -isystem "$cxxdir" -isystem "$cxxdir/aarch64-linux-gnu" \
    -isystem "$sysroot" "$@"
}
compile -c "$root/kernels/cpu/step_simd.cpp" -o "$work/simd.o"
# one unit per optimizer of kernels/optimizers.h's Optimizers list
optimizers=$(sed -n 's/^using Optimizers = TypeList<\(.*\)>;/\1/p' "$root/kernels/optimizers.h" | tr -d ' ' | tr ',' ' ')
for opt in $optimizers; do
  compile -DLBOPT_SIMD_OPTIMIZER="$opt" -c "$root/kernels/cpu/step_simd_optimizer.cpp" -o "$work/step_$opt.o"
done
for target in "$@"; do
  # the general step kernel of each optimizer and kind (step_loop<Opt, Kind, Shape<-1, -1>>, its defaulted
  # arguments spelled out or not), kilobytes of code each; targets without FMA have none
  n=$(nm -C "$work"/step_*.o |
    grep -cE "N_${target}::step_loop<lbopt::[A-Za-z]*, lbopt::Kind[A-Za-z0-9]*, [a-z:_A-Z0-9]*Shape<-1, -1(, false(, -1)?)?> ?>\([^)]*\)$" || true)
  echo "$march: $n step kernels for $target"
  want=$(($(wc -w <<<"$optimizers") * 4))
  [ "$n" -eq "$want" ] || { echo "missing SIMD step kernels for $target ($want: the optimizers x 4 kinds)"; exit 1; }
done

#!/usr/bin/env bash
# Builds the libFuzzer harness tests/fuzz/fuzz_abi.cpp with clang (ASan + UBSan, the library's sources compiled
# into the fuzzer so that libFuzzer sees their coverage) and runs it for FUZZ_SECONDS (default 60) over a copy of
# the seed corpus tests/fuzz/corpus, so the repository's corpus is never changed. Exits non-zero on a crash,
# leak, timeout or contract violation; the reproducer lands in $FUZZ_BUILD_DIR/artifacts/.
#
#   tools/fuzz.sh                         build, then fuzz for 60 s
#   FUZZ_SECONDS=600 tools/fuzz.sh        longer
#   tools/fuzz.sh path/to/crash-...       build, then run the given inputs once (reproduce; verbose)
#
# Environment: FUZZ_SECONDS, FUZZ_BUILD_DIR (default build-fuzz), CXX (default clang++), FUZZ_ARGS (extra
# libFuzzer flags, e.g. "-jobs=4 -workers=4").
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
seconds=${FUZZ_SECONDS:-60}
dir=${FUZZ_BUILD_DIR:-build-fuzz}
cxx=${CXX:-clang++}
# Meson exports CXX=c++ in some shells; libFuzzer needs clang whatever the default compiler is.
case "$("$cxx" --version 2>/dev/null | head -1)" in *clang*) ;; *) cxx=clang++ ;; esac

apt_install() {
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "fuzz.sh: installing $*"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null
}

# clang, and libFuzzer's runtime (libclang-rt-<major>-dev on Debian 12; part of the clang package elsewhere)
if ! command -v "$cxx" >/dev/null 2>&1; then apt_install clang; fi
"$cxx" --version | head -1
mkdir -p "$dir"
probe="$dir/probe_fuzzer"
probe_src='#include <stdint.h>
#include <stddef.h>
extern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }'
if ! echo "$probe_src" | "$cxx" -x c++ -fsanitize=fuzzer,address,undefined -o "$probe" - 2>/dev/null; then
  major=$("$cxx" --version | sed -n 's/.*clang version \([0-9]*\).*/\1/p' | head -1)
  apt_install "libclang-rt-${major}-dev" || apt_install "libclang-common-${major}-dev"
  echo "$probe_src" | "$cxx" -x c++ -fsanitize=fuzzer,address,undefined -o "$probe" - ||
    { echo "fuzz.sh: $cxx cannot link -fsanitize=fuzzer" >&2; exit 1; }
fi
rm -f "$probe"
# the library's own dependencies
pkg-config --exists libhwy 2>/dev/null || apt_install libhwy-dev pkg-config
echo '#include <dlpack/dlpack.h>' | "$cxx" -x c++ -fsyntax-only - 2>/dev/null || apt_install libdlpack-dev

# Build: every library source with fuzzer coverage + ASan + UBSan (UB aborts), the harness on top.
# shellcheck disable=SC2054
san=(-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer)
read -ra hwy_cflags <<<"$(pkg-config --cflags libhwy)"
read -ra hwy_libs <<<"$(pkg-config --libs libhwy)"
common=(-std=c++17 -O1 -g "${san[@]}" -Iabi -I. "${hwy_cflags[@]}" -DLBOPT_BUILDING -DLBOPT_WITH_CUDA=0
        '-DLBOPT_CUDA_ARCHS=""' -fno-math-errno)
lib_sources=(src/api.cpp src/backend_cpu.cpp src/build_info.cpp src/error.cpp src/registry.cpp src/thread_pool.cpp
             src/validate.cpp kernels/cpu/adamw_portable.cpp kernels/cpu/adamw_simd.cpp)
mkdir -p "$dir/obj"
newest_header=$(find abi src kernels -name '*.h' -newer "$dir/obj/.stamp" 2>/dev/null | head -1 || true)
[ -e "$dir/obj/.stamp" ] || newest_header=all
flags_sig="$cxx ${common[*]}"
[ "$(cat "$dir/obj/.flags" 2>/dev/null)" = "$flags_sig" ] || newest_header=all
pids=()
objs=()
for src in "${lib_sources[@]}" tests/fuzz/fuzz_abi.cpp; do
  obj="$dir/obj/$(echo "$src" | tr / _).o"
  objs+=("$obj")
  if [ "$src" = tests/fuzz/fuzz_abi.cpp ]; then cov=-fsanitize=fuzzer; else cov=-fsanitize=fuzzer-no-link; fi
  if [ -n "$newest_header" ] || [ ! -e "$obj" ] || [ "$src" -nt "$obj" ]; then
    "$cxx" "${common[@]}" "$cov" -c "$src" -o "$obj" &
    pids+=($!)
  fi
done
for p in "${pids[@]}"; do wait "$p" || { echo "fuzz.sh: compile failed" >&2; exit 1; }; done
echo "$flags_sig" >"$dir/obj/.flags"
touch "$dir/obj/.stamp"
"$cxx" "${san[@]}" -fsanitize=fuzzer -o "$dir/fuzz_abi" "${objs[@]}" "${hwy_libs[@]}" -lpthread
echo "fuzz.sh: built $dir/fuzz_abi"

export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

# Reproduce mode: run the given inputs once.
if [ $# -gt 0 ]; then
  LBOPT_FUZZ_VERBOSE=1 "$dir/fuzz_abi" "$@"
  exit $?
fi

# Fuzz over a fresh copy of the seeds.
corpus="$dir/corpus"
rm -rf "$corpus" "$dir/artifacts"
mkdir -p "$corpus" "$dir/artifacts"
cp tests/fuzz/corpus/* "$corpus"/
log="$dir/fuzz.log"
seeds=$(find "$corpus" -type f | wc -l)
echo "fuzz.sh: fuzzing for ${seeds:+$seeds seeds, }${seconds} s (log: $log)"
set +e
# shellcheck disable=SC2086
"$dir/fuzz_abi" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=4096 -print_final_stats=1 \
  -artifact_prefix="$root/$dir/artifacts/" ${FUZZ_ARGS:-} "$corpus" >"$log" 2>&1
rc=$?
set -e
tail -n 30 "$log"
execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
eps=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
echo "fuzz.sh: executions: ${execs:-?} (${eps:-?}/s), corpus: $(find "$corpus" -type f | wc -l) files (seeds: $seeds)"
artifacts=$(ls "$dir/artifacts")
if [ "$rc" -ne 0 ] || [ -n "$artifacts" ]; then
  echo "fuzz.sh: FAILED (libFuzzer exit $rc); reproducers:" >&2
  for a in $artifacts; do echo "  $dir/artifacts/$a: $(od -An -tx1 -v "$dir/artifacts/$a" | tr -d ' \n' | head -c 2000)" >&2; done
  echo "  rerun one with: tools/fuzz.sh $dir/artifacts/<file>" >&2
  exit 1
fi
echo "fuzz.sh: no crash"

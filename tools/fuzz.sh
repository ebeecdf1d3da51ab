#!/usr/bin/env bash
# Builds the libFuzzer harness tests/fuzz/fuzz_abi.cpp through Meson (a build of its own, configured with
# -Dfuzz=true and clang: the library's sources compiled into the fuzzer with coverage, ASan and UBSan; see
# tests/fuzz/meson.build) and runs it for FUZZ_SECONDS (default 60) over a copy of the repository's corpus
# tests/fuzz/corpus. Exits non-zero on a crash, leak, timeout or contract violation; the reproducer lands in
# $FUZZ_BUILD_DIR/artifacts/.
#
#   tools/fuzz.sh                         build, then fuzz for 60 s (the test command's run)
#   FUZZ_SECONDS=600 tools/fuzz.sh        longer
#   FUZZ_MERGE=1 FUZZ_SECONDS=3600 tools/fuzz.sh
#                                         a campaign: after a run without a crash, the inputs it found that reach
#                                         code the repository's corpus does not are merged into tests/fuzz/corpus
#                                         (libFuzzer's -set_cover_merge), so that the next run starts there;
#                                         the last line is the campaign's row for docs/reliability.md
#   tools/fuzz.sh --coverage              build with llvm's source-based coverage ($FUZZ_BUILD_DIR-cov), run the
#                                         repository's corpus once, print llvm-cov's report of src/ and kernels/
#   tools/fuzz.sh path/to/crash-...       build, then run the given inputs once (reproduce; verbose)
#
# Environment: FUZZ_SECONDS, FUZZ_MERGE, FUZZ_BUILD_DIR (default build-fuzz), CXX (default clang++; CC follows
# it), FUZZ_ARGS (extra libFuzzer flags, e.g. "-jobs=4 -workers=4").
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
seconds=${FUZZ_SECONDS:-60}
dir=${FUZZ_BUILD_DIR:-build-fuzz}
coverage=0
if [ "${1:-}" = --coverage ]; then
  coverage=1
  dir=$dir-cov
  shift
fi
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
# the C compiler of the same toolchain (clang++-14 -> clang-14), for the project's C sources
cc=${cxx/clang++/clang}
command -v "$cc" >/dev/null 2>&1 || cc=clang
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
probe_src='#include <stdint.h>
#include <stddef.h>
extern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }'
if ! echo "$probe_src" | "$cxx" -x c++ -fsanitize=fuzzer,address,undefined -o "$tmp/probe" - 2>/dev/null; then
  major=$("$cxx" --version | sed -n 's/.*clang version \([0-9]*\).*/\1/p' | head -1)
  apt_install "libclang-rt-${major}-dev" || apt_install "libclang-common-${major}-dev"
  echo "$probe_src" | "$cxx" -x c++ -fsanitize=fuzzer,address,undefined -o "$tmp/probe" - ||
    { echo "fuzz.sh: $cxx cannot link -fsanitize=fuzzer" >&2; exit 1; }
fi
# the build's own tools and the library's dependencies
command -v meson >/dev/null 2>&1 && command -v ninja >/dev/null 2>&1 || apt_install meson ninja-build
pkg-config --exists libhwy 2>/dev/null || apt_install libhwy-dev pkg-config
echo '#include <dlpack/dlpack.h>' | "$cxx" -x c++ -fsyntax-only - 2>/dev/null || apt_install libdlpack-dev

# Configure (once; Meson reconfigures by itself when a meson.build changes) and build the fuzzer target only.
# -O1 -g as libFuzzer recommends; no test suites (they need doctest), no CUDA, no JAX handler.
if [ ! -f "$dir/meson-private/coredata.dat" ]; then
  rm -rf "$dir/obj" "$dir/fuzz_abi"  # left by the former hand-written build of this script
  mkdir -p "$dir"
  if ! CC="$cc" CXX="$cxx" meson setup "$dir" -Dfuzz=true -Dfuzz_coverage=$([ $coverage = 1 ] && echo true ||
      echo false) -Dtests=false -Dcuda=disabled -Djax=disabled -Dlibtorch=disabled -Dbuildtype=custom -Doptimization=1 -Ddebug=true \
      >"$tmp/setup.log" 2>&1; then
    cat "$tmp/setup.log" >&2
    echo "fuzz.sh: meson setup $dir failed" >&2
    exit 1
  fi
else
  meson configure "$dir" -Dfuzz=true >/dev/null
fi
ninja -C "$dir" tests/fuzz/fuzz_abi || {
  grep -i 'fuzz' "$dir/meson-logs/meson-log.txt" | grep -i 'warning' >&2 || true
  echo "fuzz.sh: building $dir/tests/fuzz/fuzz_abi failed (a build directory configured with another compiler" \
    "than clang has no fuzzer target: remove $dir)" >&2
  exit 1
}
fuzzer="$dir/tests/fuzz/fuzz_abi"
case "$dir" in /*) abs_dir=$dir ;; *) abs_dir=$root/$dir ;; esac
echo "fuzz.sh: built $fuzzer"

export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

# Coverage mode: the repository's corpus once (-runs=0 runs each input and no mutation), then llvm-cov's report.
if [ $coverage = 1 ]; then
  major=$("$cxx" --version | sed -n 's/.*clang version \([0-9]*\).*/\1/p' | head -1)
  profdata=$(command -v "llvm-profdata-$major" || command -v llvm-profdata)
  llvm_cov=$(command -v "llvm-cov-$major" || command -v llvm-cov)
  rm -f "$dir"/corpus-*.profraw
  LLVM_PROFILE_FILE="$abs_dir/corpus-%p.profraw" "$fuzzer" -runs=0 tests/fuzz/corpus >"$dir/coverage.log" 2>&1
  "$profdata" merge -sparse "$dir"/corpus-*.profraw -o "$dir/corpus.profdata"
  "$llvm_cov" report "$fuzzer" -instr-profile="$dir/corpus.profdata" -ignore-filename-regex='(^|/)(tests|abi)/'
  exit 0
fi

# Reproduce mode: run the given inputs once.
if [ $# -gt 0 ]; then
  LBOPT_FUZZ_VERBOSE=1 "$fuzzer" "$@"
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
"$fuzzer" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=4096 -print_final_stats=1 \
  -artifact_prefix="$abs_dir/artifacts/" ${FUZZ_ARGS:-} "$corpus" >"$log" 2>&1
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
if [ -n "${FUZZ_MERGE:-}" ]; then
  before=$(find tests/fuzz/corpus -type f | wc -l)
  # a greedy set cover of the edges (not of libFuzzer's finer features), so the corpus stays a few hundred files
  "$fuzzer" -set_cover_merge=1 -use_counters=0 -timeout=10 -rss_limit_mb=2048 -max_len=4096 tests/fuzz/corpus \
    "$corpus" >"$dir/merge.log" 2>&1 ||
    { tail -n 20 "$dir/merge.log" >&2; echo "fuzz.sh: merge failed" >&2; exit 1; }
  after=$(find tests/fuzz/corpus -type f | wc -l)
  echo "fuzz.sh: merged $((after - before)) inputs into tests/fuzz/corpus ($after files)"
  echo "| $(date -u +%F) | ${seconds} s | ${execs:-?} | ${eps:-?} | $after | none |"
fi

#!/usr/bin/env bash
# The test command: sets up a fresh machine, builds lbopt with warnings as errors, runs every suite and prints
# one closing line "N passed, N failed" summed over all of them.
set -uo pipefail
cd "$(dirname "$0")/.."
tools/install_deps.sh || exit 1
# Python test dependencies first: the build looks for jax (the lbopt.jax FFI handler is built where it imports)
python3 -m pip install -q -r tools/requirements-test.txt || exit 1
dir=build-test
if [ -d "$dir" ]; then meson setup --reconfigure "$dir" -Dwerror=true >/dev/null || exit 1
else meson setup "$dir" -Dwerror=true --buildtype=debugoptimized >/dev/null || exit 1; fi
ninja -C "$dir" || exit 1
meson test -C "$dir" --print-errorlogs
status=$?
# The CPU suites again under AddressSanitizer + UndefinedBehaviorSanitizer (a CPU-only build of their own)
asan=build-asan
if [ ! -d "$asan" ]; then
  meson setup "$asan" -Db_sanitize=address,undefined -Db_lundef=false -Dcuda=disabled -Dlibtorch=disabled >/dev/null || exit 1
fi
ninja -C "$asan" tests/unit_tests tests/cpu_tests || exit 1
meson test -C "$asan" --setup asan --no-rebuild --print-errorlogs --suite unit --suite cpu || status=1
# Python: the package from bindings/python against the library just built
LBOPT_LIBRARY="$PWD/$dir/liblbopt.so.0" python3 -m pytest -q -p no:cacheprovider --junitxml="$dir/pytest.xml" \
  tests/python || status=1
# Rust: the crate against the library just built (no registry dependencies: builds offline)
(cd bindings/rust && LBOPT_LIB_DIR="$OLDPWD/$dir" CARGO_TARGET_DIR="$OLDPWD/$dir/cargo" cargo test --offline 2>&1) |
  tee "$dir/cargo.log" || status=1
# Fuzzing: the ABI under libFuzzer + ASan + UBSan for ${FUZZ_SECONDS:-60} s (one test case: no crash, no broken contract)
fuzz_fail=0
FUZZ_SECONDS=${FUZZ_SECONDS:-60} bash tools/fuzz.sh || { fuzz_fail=1; status=1; }
echo "<testsuite name=\"fuzz\" tests=\"1\" failures=\"$fuzz_fail\" skipped=\"0\"/>" > "$dir/fuzz.xml"
python3 tools/summarize_tests.py "$dir/meson-logs/testlog.json" "$asan/meson-logs/testlog-asan.json" \
  "$dir/pytest.xml" "$dir/cargo.log" "$dir/fuzz.xml" || exit 1
exit $status

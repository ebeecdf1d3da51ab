#!/usr/bin/env bash
# The test command: sets up a fresh machine, builds lbopt with warnings as errors, runs every suite and prints
# one closing line "N passed, N failed" summed over all of them.
set -uo pipefail
cd "$(dirname "$0")/.."
tools/install_deps.sh || exit 1
dir=build-test
if [ -d "$dir" ]; then meson setup --reconfigure "$dir" -Dwerror=true >/dev/null || exit 1
else meson setup "$dir" -Dwerror=true --buildtype=debugoptimized >/dev/null || exit 1; fi
ninja -C "$dir" || exit 1
meson test -C "$dir" --print-errorlogs
status=$?
python3 tools/summarize_tests.py "$dir/meson-logs/testlog.json" || exit 1
exit $status

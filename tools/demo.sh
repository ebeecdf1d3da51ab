#!/usr/bin/env bash
# The main job: sets up a fresh machine, builds lbopt and runs the C training example (4-bit, 8-bit, FP8 and
# fp32 states with a warm-up + cosine lr that changes every call).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install_deps.sh
[ -d build-release ] || meson setup build-release --buildtype=release >/dev/null
ninja -C build-release examples/train_c >/dev/null
./build-release/examples/train_c

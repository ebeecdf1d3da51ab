#!/usr/bin/env bash
# The GPU check, one script for a lent machine (fits in 8 minutes on one H200): release build with CUDA, the GPU
# tests, then the benchmark table of the step against a device-to-device copy. Writes to ${OUT:-results/gpu}.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-results/gpu}
mkdir -p "$out"
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  date -u
  tools/install_deps.sh >/dev/null 2>&1 || python3 -m pip install -q meson ninja
  meson setup build-gpu --buildtype=release -Dcuda=enabled -Dwerror=false >/dev/null 2>&1 ||
    meson setup --reconfigure build-gpu --buildtype=release -Dcuda=enabled >/dev/null
  ninja -C build-gpu tests/gpu_tests tests/cpu_tests bench/bench_gpu >/dev/null
  timeout 300 ./build-gpu/tests/gpu_tests
  echo "gpu tests exit: $?"
  timeout 240 ./build-gpu/bench/bench_gpu 1e9
} 2>&1 | tee "$out/gpu_run.txt"

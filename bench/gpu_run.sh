#!/usr/bin/env bash
# The GPU check, one script for a lent machine (fits in 8 minutes on one H200): release build with CUDA, the GPU
# tests, the step-vs-copy table, then lbopt vs torch (and torchao where installed) in PyTorch on the GPU with a
# constant and a per-step cosine lr. Output goes to ${OUT:-results/gpu}/gpu_run.txt.
#
# The device image has nvcc, meson, ninja and torch but no apt: carry the DLPack and doctest headers. Here:
#   echo /.gpu-deps/ >> .git/info/exclude; mkdir -p .gpu-deps/include
#   cp -r /usr/include/dlpack /usr/include/doctest .gpu-deps/include/
# then run (device tool): command "bash bench/gpu_run.sh", carry [".gpu-deps"], timeout_s 560.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-results/gpu}
mkdir -p "$out"
export CPATH="$PWD/.gpu-deps/include${CPATH:+:$CPATH}"
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  date -u
  [ -d build-gpu ] || meson setup build-gpu --buildtype=release -Dcuda=enabled >/dev/null
  ninja -C build-gpu tests/gpu_tests tests/cpu_tests bench/bench_gpu >/dev/null || exit 1
  timeout 240 ./build-gpu/tests/gpu_tests
  echo "gpu tests exit: $?"
  timeout 120 ./build-gpu/bench/bench_gpu 1e9
  LBOPT_LIBRARY="$PWD/build-gpu/liblbopt.so.0" PYTHONPATH=bindings/python \
    timeout 150 python3 bench/bench_torch.py --device cuda --params 1e9 --steps 10
} 2>&1 | tee "$out/gpu_run.txt"

#!/usr/bin/env bash
# The GPU check, one script for a lent machine, in sections (all four by default, in this order; name some to run
# only those: bash bench/gpu_run.sh kernels peers):
#   kernels     the GPU suite (every optimizer, kind and dtype against the CPU bit for bit, CUDA graphs, AMP,
#               conversions, 64-bit indexing), the step-vs-copy table of every optimizer with the 4-bit and 8-bit
#               AdamW kernels' Nsight Compute counters (and those of each other build in .gpu-carry/NAME/), part of
#               the suite again under compute-sanitizer (70-90 s on one H200)
#   torch_cuda  lbopt.torch on the GPU against the CPU (tests/python/test_cuda.py), lbopt vs torch on 1e9 params
#   peers       lbopt vs torch fused, torchao (4-bit, 8-bit, FP8) and bitsandbytes (8-bit, paged) AdamW on three
#               parameter sets: four 250M matrices, GPT-2 small, Llama 3.2 1B (bench/bench_torch.py --model)
#   offload     CPU offload end to end (bench/bench_offload.py) and the host step's thread scaling
# Output goes to ${OUT:-results/gpu}/gpu_run.txt. The sections' timeouts add up to about 20 minutes (kernels
# 11 with one A/B build, torch_cuda 4, peers 7.5, offload 4), each section far shorter when it passes: more than
# one call's 10 minutes, so run "kernels peers" first and the rest in a second call if the device time allows.
#
# The device image has nvcc, torch and pytest but neither Highway nor the DLPack and doctest headers, and nothing
# can be installed there, so the binaries are built here and carried:
#   echo /.gpu-carry/ >> .git/info/exclude
#   meson setup build-gpu --buildtype=release -Dcuda=enabled -Dgpu_archs=90 && ninja -C build-gpu
#   bash bench/gpu_run.sh --pack            # copies the library, libhwy, gpu_tests and bench_gpu to .gpu-carry,
#                                           # and the peers' wheels, unpacked, to .gpu-carry/peers
# then run (device tool): command "bash bench/gpu_run.sh kernels peers", carry [".gpu-carry"], timeout_s 480.
# For an A/B, copy another build's liblbopt.so.0 to .gpu-carry/NAME/ after --pack: its step-vs-copy table and
# counters follow.
# Kernels behind build options (gpu_wide_step: the step shaped for bandwidth, vector loads and stores and 4-bit
# states encoded in x; gpu_encode_in_x: the 4-bit encode in x alone; gpu_encode8_buckets: the 8-bit encode by
# buckets of the float's bits; gpu_fp8_cvt: the FP8 encode by the conversion instruction) are checked by packing the
# build that has them on (-Dgpu_wide_step=true -Dgpu_encode8_buckets=true -Dgpu_fp8_cvt=true), so that the GPU
# suite runs against them, with the default build's library in .gpu-carry/default/ for the A/B; an option becomes
# the default once that suite passes.
set -uo pipefail
cd "$(dirname "$0")/.."
bin=.gpu-carry
if [ "${1:-}" = --pack ]; then
  build=${2:-build-gpu}
  rm -rf "$bin" && mkdir -p "$bin" || exit 1
  cp -L "$build/liblbopt.so.0" "$build/tests/gpu_tests" "$build/bench/bench_gpu" "$bin/" || exit 1
  cp -L "$(ldd "$build/liblbopt.so.0" | awk '/libhwy/ {print $3}')" "$bin/" || exit 1
  # The GPU peers, for the device's python (3.12, torch 2.11 for CUDA 13.0), which has neither: torchao's
  # optimizers are Python over torch.compile (its C++ extensions are dropped), and bitsandbytes keeps only its
  # library for CUDA 13.0 (and the CPU's, which it loads first).
  wheels=$(mktemp -d)
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 -d "$wheels" \
    torchao==0.18.0 bitsandbytes==0.50.2 || exit 1
  for w in "$wheels"/*.whl; do unzip -q -o "$w" -d "$bin/peers" || exit 1; done
  rm -rf "$wheels" "$bin"/peers/torchao/_C*.so
  find "$bin/peers/bitsandbytes" -name 'libbitsandbytes_*.so' ! -name '*_cuda130.so' ! -name '*_cpu.so' -delete
  du -sh "$bin" "$bin/peers"
  exit 0
fi
out=${OUT:-results/gpu}
mkdir -p "$out"
export LD_LIBRARY_PATH="$PWD/$bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
py=(env LBOPT_LIBRARY="$PWD/$bin/liblbopt.so.0" PYTHONPATH="bindings/python:$PWD/$bin/peers" PYTHONUNBUFFERED=1 python3)
# Per kernel of the first launches (AdamW 4-bit then 8-bit, fp32 params, 1e8 elements): time, instructions, warps
# resident and DRAM throughput, for the library first on LD_LIBRARY_PATH.
counters() {
  timeout 60 ncu --clock-control none -k regex:step_kernel --launch-count 6 --csv --metrics \
    gpu__time_duration.sum,smsp__inst_executed.sum,sm__warps_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed \
    "$bin/bench_gpu" 1e8 1e8 1 | grep -E 'step_kernel'
}
kernels() {
  echo "## GPU suite"
  timeout 200 "$bin/gpu_tests"
  echo "gpu tests exit: $?"
  echo "## step vs copy"
  timeout 150 "$bin/bench_gpu" 1e9 1e7 10
  counters
  for other in "$bin"/*/; do  # A/B: other builds of the library, each copied by hand to $bin/NAME/liblbopt.so.0
    [ -f "$other/liblbopt.so.0" ] || continue
    echo "## step vs copy, $other"
    LD_LIBRARY_PATH="$PWD/$other:$LD_LIBRARY_PATH" timeout 90 "$bin/bench_gpu" 1e9 1e8 10
    LD_LIBRARY_PATH="$PWD/$other:$LD_LIBRARY_PATH" counters
  done
  echo "## compute-sanitizer memcheck (small cases)"
  timeout 100 compute-sanitizer --tool memcheck --error-exitcode 3 "$bin/gpu_tests" \
    -tc='*captured*,*AMP*,*quantize*,invalid*'
  echo "memcheck exit: $?"
}
torch_cuda() {
  echo "## lbopt.torch on cuda"
  timeout 150 "${py[@]}" -m pytest -q -p no:cacheprovider tests/python/test_cuda.py
  echo "pytest exit: $?"
  echo "## torch on cuda"
  timeout 100 "${py[@]}" bench/bench_torch.py --device cuda --params 1e9 --steps 10
}
# torchao's rows compile a step per tensor shape on their warm-up step (not timed)
peers() {
  for model in flat-1e9 gpt2-small llama-1b; do
    echo "## peers on cuda, $model"
    timeout 150 "${py[@]}" bench/bench_torch.py --device cuda --model "$model" --steps 10 --warmup 2 --verbose
  done
}
offload() {
  echo "## CPU offload: GPT-2 medium end to end, then the host step's thread scaling"
  timeout 150 "${py[@]}" bench/bench_offload.py --device cuda --steps 5
  timeout 90 "${py[@]}" bench/bench_offload.py --host-scaling --steps 3
}
sections=("$@")
[ ${#sections[@]} -gt 0 ] || sections=(kernels torch_cuda peers offload)
{
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
  date -u
  for section in "${sections[@]}"; do
    case $section in
      kernels | torch_cuda | peers | offload) "$section" ;;
      *) echo "unknown section $section (kernels, torch_cuda, peers, offload)" ;;
    esac
  done
} 2>&1 | tee "$out/gpu_run.txt"

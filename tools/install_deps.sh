#!/usr/bin/env bash
# Installs what building and testing lbopt needs on a Debian/Ubuntu machine, skipping what is already there.
set -euo pipefail
packages=(meson ninja-build pkg-config g++ cmake doctest-dev libdlpack-dev libhwy-dev binutils python3 fortunes
          abigail-tools valgrind clang patchelf)
# Arm cross headers for compiling the Arm SIMD kernels (tests/cpu/cross_compile_simd.sh); that test skips
# without them, so a distribution that names them differently still builds and tests
optional=(libc6-dev-arm64-cross libstdc++-12-dev-arm64-cross)
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
updated=0
install() {  # install the packages among "$@" that are not there yet
  local missing=() p
  for p in "$@"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
  done
  ((${#missing[@]})) || return 0
  echo "installing: ${missing[*]}"
  if ((!updated)); then $sudo apt-get update -qq; updated=1; fi
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
}
install "${packages[@]}"
install "${optional[@]}" || echo "optional packages not installed: ${optional[*]} (the Arm cross-compile tests skip)"

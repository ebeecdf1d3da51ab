#!/usr/bin/env bash
# Installs what building and testing lbopt needs on a Debian/Ubuntu machine, skipping what is already there.
set -euo pipefail
packages=(meson ninja-build pkg-config g++ cmake doctest-dev libdlpack-dev libhwy-dev binutils python3 fortunes
          abigail-tools valgrind)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "installing: ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

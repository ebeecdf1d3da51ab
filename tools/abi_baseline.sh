#!/usr/bin/env bash
# Writes abi/lbopt.abi, the description of the ABI that tests/abi/abi_check.sh compares every build with, from a
# built library (default build-test/liblbopt.so.0). Run it when a release adds to the ABI. It records no build
# machine's paths: nvcc's temporary file names become their .cu sources'.
set -euo pipefail
cd "$(dirname "$0")/.."
lib=${1:-build-test/liblbopt.so.0}
abidw --no-corpus-path --no-comp-dir-path --headers-dir abi --drop-private-types "$lib" |
  sed -E "s|path='[^']*tmpxft_[0-9a-f]+_[0-9a-f]+-[0-9]+_([A-Za-z0-9_]+)\.compute_[0-9]+\.cudafe1\.cpp'|path='\1.cu'|" > abi/lbopt.abi

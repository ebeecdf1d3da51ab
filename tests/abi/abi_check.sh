#!/usr/bin/env bash
# ABI stability within the major: compare the built library with the description checked in (abi/lbopt.abi,
# made by tools/abi_baseline.sh).
# abidiff's exit status is a bit set: 4 = compatible change (e.g. added symbols), 8 = incompatible change.
abidiff=$1; reference=$2; library=$3; headers=$4
"$abidiff" --headers-dir2 "$headers" --drop-private-types "$reference" "$library"
status=$?
if (( status & 8 )); then echo "incompatible ABI change within the major"; exit 1; fi
if (( status & 3 )); then echo "abidiff failed ($status)"; exit 1; fi
echo "no incompatible ABI change (abidiff status $status)"

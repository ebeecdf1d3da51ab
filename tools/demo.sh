#!/usr/bin/env bash
# The main job: sets up a fresh machine (apt: build tools, DLPack, the fortunes corpus; pip: torch, tqdm,
# matplotlib, and lbopt itself from this checkout), then trains a character-level transformer with torch AdamW,
# lbopt 8-bit and lbopt 4-bit states (and torchao 4-bit when installed), a warm-up + cosine lr changing every
# step. Extra arguments go to `python -m lbopt.demo` (see --help).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install_deps.sh
python3 -m pip install -q torch tqdm matplotlib
python3 -m pip install -q .
python3 -m lbopt.demo "$@"

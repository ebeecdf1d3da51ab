"""tools/sass_count.py, the static SASS proxy of the CUDA step's cost, measures a loop in every probe: a row per
optimizer, state kind and param dtype, each with a loop found (a loop of a few instructions would be the probe's
set-up, not step_block). Needs nvcc and a cuobjdump (triton's wheel bundles one)."""
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc")
def test_every_probe_has_its_loop_counted():
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "sass_count.py")], capture_output=True, text=True,
                         check=True).stdout
    rows = [line.split("|")[1:-1] for line in out.splitlines()
            if re.match(r"\| (AdamW|SGD|Lion|AdEMAMix|Muon) \|", line)]
    cells = {(r[0].strip(), r[1].strip(), r[2].strip()): r for r in rows}
    assert len(rows) == len(cells) == 5 * 4 * 2
    for (opt, kind, dtype), r in cells.items():
        loop, per_element, regs = int(r[3]), float(r[4]), int(r[7])
        assert loop > 100 and per_element > 10 and regs > 0, (opt, kind, dtype)
        if dtype == "bf16":  # the same path plus conversions and the stochastic-rounding store
            assert loop > int(cells[(opt, kind, "fp32")][3])

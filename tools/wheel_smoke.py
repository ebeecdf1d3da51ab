#!/usr/bin/env python3
"""The smoke test of an installed lbopt wheel, run by the Python that has it (tools/build_wheel.sh runs it in a
fresh virtual environment, tests/python/test_wheel.py with the wheel on PYTHONPATH), from any directory outside
the source tree: every state kind steps, get_include() holds lbopt.h, and a C program built with the flags of the
package's pkg-config file (its header, its library) walks the operator registry. Prints one line: the version, the operator count and the
build (CPU kernels, CUDA architectures)."""
import os
import subprocess
import sys
import tempfile

import numpy as np

import lbopt
import lbopt.functional as F

WALK_C = r"""
#include <stdio.h>
#include <lbopt.h>
int main(void) {
  size_t n = lbopt_op_count();
  for (size_t i = 0; i < n; ++i) {
    const lbopt_op_info* op = lbopt_op_schema(i);
    if (!op || !op->name || !op->name[0]) return 1;
  }
  printf("%s %zu\n", lbopt_version_string(), n);
  return 0;
}
"""


def main():
    for kind in F.KINDS:
        p, g = np.ones(1000, np.float32), np.ones(1000, np.float32)
        F.adamw_step([p], [g], [{"m": F.zeros_state(kind, 1000), "v": F.zeros_state(kind, 1000)}], lr=0.1,
                     steps=[1], kind=kind)
        assert abs(p[0] - 0.899) < 1e-3, (kind, p[0])  # decay, then a unit Adam step of size lr
    assert os.path.isfile(os.path.join(lbopt.get_include(), "lbopt.h")), lbopt.get_include()
    pc_dir = lbopt.get_pkgconfig_dir()
    assert pc_dir, "the package has no pkg-config file"
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "lbopt"], check=True, capture_output=True, text=True,
                           env={**os.environ, "PKG_CONFIG_PATH": pc_dir}).stdout.split()
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "walk.c"), "w") as f:
            f.write(WALK_C)
        exe = os.path.join(tmp, "walk")
        subprocess.run(["cc", "-std=c99", "-o", exe, os.path.join(tmp, "walk.c"), *flags], check=True)
        version, ops = subprocess.run([exe], check=True, capture_output=True, text=True).stdout.split()
    assert version == lbopt.version() and int(ops) > 10, (version, ops)
    info = lbopt.build_info()
    print(f"wheel_smoke: lbopt {version} from {os.path.dirname(lbopt.__file__)}: every kind steps; {ops} operators "
          f"walked from C; CPU kernels {info['cpu_kernels']}, CUDA archs {info['cuda_archs'] or 'none'}")


if __name__ == "__main__":
    sys.exit(main())

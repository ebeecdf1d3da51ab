"""pytest setup: the lbopt package from bindings/python (or an installed wheel when LBOPT_TEST_INSTALLED=1), the
library from $LBOPT_LIBRARY (tools/test.sh points it at the build)."""
import os
import pathlib
import sys

if os.environ.get("LBOPT_TEST_INSTALLED") != "1":
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bindings" / "python"))

import pytest  # noqa: E402


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch intra-op thread for a module's tests, restored afterwards: the tiny models of these tests gain
    nothing from threads, run the same matmuls in any process, and do not spin OpenMP on a busy machine."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)

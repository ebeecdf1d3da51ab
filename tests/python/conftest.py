"""pytest setup: the lbopt package from bindings/python (or an installed wheel when LBOPT_TEST_INSTALLED=1), the
library from $LBOPT_LIBRARY (tools/test.sh points it at the build)."""
import os
import pathlib
import sys

if os.environ.get("LBOPT_TEST_INSTALLED") != "1":
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bindings" / "python"))

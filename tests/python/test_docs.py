"""The Python snippets of docs/frameworks.md run as written: every ```python block in order, in one namespace."""
import pathlib
import re

import pytest

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "frameworks.md"


def test_frameworks_md_snippets_run():
    pytest.importorskip("optax")
    pytest.importorskip("lbopt.jax", reason="lbopt was built without the JAX FFI handler")
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert len(blocks) >= 4
    namespace = {}
    for i, code in enumerate(blocks):
        exec(compile(code, f"{DOC.name}[python block {i}]", "exec"), namespace)  # noqa: S102

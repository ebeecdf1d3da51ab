"""The shape of the lbopt package: its modules import one another without cycles."""
import ast
import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest

import lbopt

PACKAGE = pathlib.Path(lbopt.__file__).resolve().parent  # the lbopt conftest chose


def _modules():
    return sorted(p.stem for p in PACKAGE.glob("*.py"))


def _imports(module, modules):
    """The package modules that `module` imports anywhere in its source (inside functions too): `__init__` stands
    for the package itself."""
    tree = ast.parse((PACKAGE / f"{module}.py").read_text(encoding="utf-8"))
    out = set()

    def target(names, submodule=None):
        if submodule is not None:
            out.add(submodule)
            return
        for name in names:  # `from lbopt import x`: a submodule, or a name of the package
            out.add(name if name in modules else "__init__")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "lbopt":
                    out.add(parts[1] if len(parts) > 1 else "__init__")
        elif isinstance(node, ast.ImportFrom):
            if node.level > 1:
                raise AssertionError(f"lbopt/{module}.py: relative import above the package (line {node.lineno})")
            if node.level == 1:
                path = node.module
            elif node.module and node.module.split(".")[0] == "lbopt":
                path = node.module.partition(".")[2] or None
            else:
                continue
            names = [a.name for a in node.names]
            target(names, None if path is None else path.split(".")[0])
    out.discard(module)
    return out


def _cycle(graph):
    """A cycle of the graph as a list of modules (first repeated last), or None."""
    state = {}  # module -> "open" while on the DFS path, "done" after

    def visit(m, path):
        state[m] = "open"
        for n in sorted(graph[m]):
            if state.get(n) == "open":
                return path[path.index(n):] + [n]
            if n not in state:
                found = visit(n, path + [n])
                if found:
                    return found
        state[m] = "done"
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m, [m])
            if found:
                return found
    return None


def _reach(graph, start):
    seen, todo = set(), [start]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(graph[m])
    return seen


def test_modules_import_without_cycles():
    """No module of the package imports, directly or through others, one that imports it back (a lazy import in a
    function counts: it only hides the cycle). Each module then imports alone in a fresh interpreter, loading
    no package module its imports do not reach (so the walk above sees every import), and lbopt.functional,
    the NumPy path, loads no torch."""
    modules = _modules()
    graph = {m: _imports(m, modules) for m in modules}
    for m, deps in graph.items():
        assert deps <= set(modules), f"lbopt/{m}.py imports {deps - set(modules)}, which the package lacks"
    assert {"_abi", "_dlpack"} <= graph["functional"] and "torch" in graph["demo"]  # the walk sees the imports
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(PACKAGE.parent)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH")
                                                                  else []))
    code = ("import importlib, sys\n"
            "importlib.import_module(sys.argv[1])\n"
            "print(' '.join(sorted(m for m in sys.modules if m == 'lbopt' or m.startswith('lbopt.'))))\n"
            "print('torch' in sys.modules)\n")
    for m in modules:
        if m == "jax" and importlib.util.find_spec("jax") is None:
            continue  # lbopt.jax needs jax; its imports are still in the graph above
        name = "lbopt" if m == "__init__" else f"lbopt.{m}"
        r = subprocess.run([sys.executable, "-c", code, name], env=env, capture_output=True, text=True)
        assert r.returncode == 0, f"import {name} alone failed:\n{r.stderr}"
        loaded_line, torch_line = r.stdout.splitlines()
        loaded = {"__init__" if x == "lbopt" else x.removeprefix("lbopt.") for x in loaded_line.split()}
        assert loaded <= _reach(graph, m) | {"__init__"}, f"import {name} loads {loaded}"
        if m in ("functional", "_dlpack", "_abi", "__init__"):
            assert torch_line == "False", f"import {name} loads torch"

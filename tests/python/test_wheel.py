"""`pip wheel .` builds one wheel that carries liblbopt and the package, and the installed wheel works without
LBOPT_LIBRARY."""
import importlib.util
import os
import pathlib
import subprocess
import sys
import zipfile

import test_version

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_wheel_carries_the_library_and_works(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path / "dist")], check=True, cwd=tmp_path)
    wheel, = (tmp_path / "dist").glob("lbopt-*.whl")
    assert wheel.name.startswith(f"lbopt-{test_version.meson_version()}-")  # the version is Meson's
    names = zipfile.ZipFile(wheel).namelist()
    assert "lbopt/liblbopt.so" in names and "lbopt/torch.py" in names and "lbopt/demo.py" in names
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
                   check=True)
    env = {k: v for k, v in os.environ.items() if k != "LBOPT_LIBRARY"}
    env["PYTHONPATH"] = str(site)
    # from the installed package: every kind steps, and C code builds against its header and pkg-config file
    assert "lbopt/include/lbopt.h" in names and "lbopt/pkgconfig/lbopt.pc" in names
    smoke = subprocess.run([sys.executable, str(ROOT / "tools" / "wheel_smoke.py")], check=True, capture_output=True,
                           text=True, env=env, cwd=tmp_path).stdout
    assert f"lbopt {test_version.meson_version()} from {site}" in smoke
    if importlib.util.find_spec("jax") is None:
        return
    # built where jax is importable: the FFI handler travels in the wheel and finds liblbopt beside it
    assert "lbopt/liblbopt_jax.so" in names and "lbopt/jax.py" in names and "lbopt/torch_ops.py" in names
    subprocess.run([sys.executable, "-c", "import lbopt.jax, lbopt.torch_ops, jax.numpy as jnp;"
                    "init, apply = lbopt.jax.adamw_apply(1e-2, min_quant_size=0);"
                    "p = {'w': jnp.ones(300)}; p2, _ = apply(p, {'w': jnp.ones(300)}, init(p));"
                    "assert float(p2['w'][0]) < 1"], check=True, env=env, cwd=tmp_path)

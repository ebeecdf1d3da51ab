"""One version everywhere: Meson's project version (meson.build) is the source; the library's version call (and so
lbopt.__version__), the Rust crate, the pkg-config file of the build, the changelog's newest section and the wheel
(test_wheel.py) carry the same."""
import os
import pathlib
import re

import pytest

import lbopt

ROOT = pathlib.Path(__file__).resolve().parents[2]


def meson_version():
    project = re.search(r"project\((.*?)\)\n", (ROOT / "meson.build").read_text(), re.S).group(1)
    return re.search(r"version:\s*'([^']+)'", project).group(1)


def test_the_library_and_the_package_carry_meson_s_version():
    assert lbopt.version() == meson_version()
    assert lbopt.__version__ == meson_version()


def test_the_rust_crate_carries_meson_s_version():
    cargo = (ROOT / "bindings" / "rust" / "Cargo.toml").read_text()
    package = cargo.split("[package]", 1)[1].split("\n[", 1)[0]
    assert re.search(r'^version\s*=\s*"([^"]+)"', package, re.M).group(1) == meson_version()


def test_the_changelog_s_newest_section_is_this_version():
    newest = re.search(r"^## (\S+)", (ROOT / "CHANGELOG.md").read_text(), re.M).group(1)
    assert newest == meson_version()


def test_the_build_s_pkg_config_file_carries_meson_s_version():
    library = os.environ.get("LBOPT_LIBRARY")
    pc = pathlib.Path(library).parent / "meson-private" / "lbopt.pc" if library else None
    if pc is None or not pc.is_file():
        pytest.skip("no build directory beside the library (an installed wheel)")
    assert re.search(r"^Version:\s*(\S+)", pc.read_text(), re.M).group(1) == meson_version()

"""Each optimizer's hyper-parameters are written once, in its descriptor (kernels/optim/<name>.h: kParams with
their ranges and defaults, kFlagNames): the library's validation, config defaults, registry schemas and
lbopt_optimizer_fields derive from it, and the bindings read lbopt_optimizer_fields. These tests fail when a
field is restated in the library's sources or when what the library reports disagrees with what it does."""
import math
import pathlib
import re

import pytest

import lbopt.functional as F
from lbopt import _abi

ROOT = pathlib.Path(__file__).resolve().parents[2]
OPTIMIZERS = ["adamw", "sgd", "lion", "ademamix"]


def _descriptor_names():
    names = set()
    for header in (ROOT / "kernels" / "optim").glob("*.h"):
        text = header.read_text()
        for block in re.findall(r"kParams\[\] = \{(.*?)\};", text, re.S):
            names |= set(re.findall(r'\{"(\w+)"', block))
        for block in re.findall(r"kFlagNames\[\] = \{(.*?)\};", text, re.S):
            names |= set(re.findall(r'"(\w+)"', block))
    return names


def test_descriptors_are_found():
    assert {"beta1", "beta3", "momentum", "dampening", "t_beta3", "amsgrad", "nesterov"} <= _descriptor_names()


def test_the_library_sources_name_no_field_outside_the_config_field_table():
    """A quoted field name in src/ other than in the one table of lbopt_optimizer_config's fields means a list of
    some optimizer's fields written again (a schema, a check, a default)."""
    pattern = re.compile(r'"(%s)"' % "|".join(sorted(_descriptor_names())))
    found = []
    for path in sorted((ROOT / "src").glob("*.[ch]*")):
        if path.name == "config_fields.h":
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line):
                found.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not found, "optimizer fields restated outside their descriptors:\n" + "\n".join(found)


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_reported_fields_are_the_config_defaults_and_the_schema_attributes(optimizer):
    fields = F.optimizer_fields(optimizer)
    cfg = F.config(optimizer)
    for name, f in fields.items():
        if f["type"] == "double":
            assert getattr(cfg, name) == f["default"], name
            assert f["min"] <= f["default"] and (f["default"] < f["max"] or f["max_inclusive"]), name
    ops = (_abi.lib.lbopt_op_schema(i).contents for i in range(_abi.lib.lbopt_op_count()))
    op = next(o for o in ops if o.name.decode() == f"lbopt.{optimizer}_step.4bit")
    attrs = [op.attrs[k].name.decode() for k in range(op.n_attrs)]
    assert attrs[2:2 + len(fields)] == list(fields)  # after lr and step, in the descriptor's order
    for k in range(2, 2 + len(fields)):
        a = op.attrs[k]
        if fields[a.name.decode()]["type"] == "double":
            assert a.default_double == fields[a.name.decode()]["default"]


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_config_takes_the_reported_fields_and_refuses_others_by_name(optimizer):
    fields = F.optimizer_fields(optimizer)
    for name, f in fields.items():
        if f["type"] == "double":
            F.config(optimizer, **{name: f["min"]})
            bad = f["max"] if not (f["max_inclusive"] or math.isinf(f["max"])) else -1.0
            with pytest.raises(_abi.LbOptError, match=rf"config\.{name} = "):
                F.config(optimizer, **{name: bad})
    others = {"beta3", "momentum", "amsgrad"} - set(fields)
    for name in others:
        with pytest.raises(TypeError, match=rf"{optimizer} has no option\(s\) {name} \(it reads"):
            F.config(optimizer, **{name: 0.5 if name != "amsgrad" else True})

"""Checkpoints saved by released versions (tests/data/checkpoints/<version>/, written by golden_cases.py) load into
this one and continue bit-identically: every optimizer and state kind from a plain state dict, and every kind
from a distributed checkpoint saved under FSDP2 on 2 ranks."""
import json

import pytest
import torch

import golden_cases as golden

VERSIONS = sorted(p.name for p in golden.DATA.iterdir() if p.is_dir())
PLAIN = [(v, key) for v in VERSIONS for key in json.loads((golden.DATA / v / "expected.json").read_text())["plain"]]


def test_every_released_format_is_here():
    assert "0.3.0" in VERSIONS
    assert len(PLAIN) >= len(golden.OPTIMIZERS) * len(golden.KINDS) * len(VERSIONS)


def _saved(version):
    return torch.load(golden.DATA / version / "plain.pt", weights_only=True)


def _expected(version):
    return json.loads((golden.DATA / version / "expected.json").read_text())


@pytest.mark.parametrize("version,key", PLAIN)
def test_plain_checkpoint_continues_bit_identically(version, key):
    saved = _saved(version)
    entry = saved["entries"][key]
    model = golden.Net()
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(entry["params"][n])
    name, kind = key.split("-")
    opt = golden.OPTIMIZERS[name](model.parameters(), kind)
    opt.load_state_dict(entry["optim"])
    steps = range(golden.SAVED_AT + 1, golden.SAVED_AT + golden.MORE + 1)
    assert golden.run(model, opt, saved["grads"], steps) == _expected(version)["plain"][key]


@pytest.mark.skipif(not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
                    reason="torch.distributed with gloo is not available")
@pytest.mark.parametrize("version", VERSIONS)
def test_sharded_checkpoint_continues_bit_identically_on_its_mesh(version, tmp_path):
    import hashlib

    import distributed_cases as cases

    path = golden.DATA / version / "sharded"
    kinds = sorted(p.name for p in path.iterdir())
    assert len(kinds) == len(golden.KINDS)
    got = cases.run(cases.dcp_load, 2, tmp_path, kinds, str(path), golden.SHARDED_AT, golden.SHARDED_MORE)
    want = _expected(version)["sharded"]
    for rank in got:
        for kind in kinds:
            assert rank[kind]["steps"] == {golden.SHARDED_AT}
            assert rank[kind]["losses"] == want[kind]["losses"], kind
            digests = {n: hashlib.sha256(p.contiguous().numpy().tobytes()).hexdigest()
                       for n, p in rank[kind]["params"].items()}
            assert digests == want[kind]["params"], kind

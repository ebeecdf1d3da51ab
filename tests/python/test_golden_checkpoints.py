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
    assert golden.resume(saved["entries"][key], key, saved["grads"]) == _expected(version)["plain"][key]


@pytest.fixture
def pinned_blas(monkeypatch):
    """The sharded runs train a model, whose matmuls torch hands to MKL, and MKL picks its code path, and so the
    bits of a product, by the CPU. Their expected losses and params were recorded with its AVX2 path (the one it
    takes on AMD CPUs), so the ranks, spawned processes, pin that path with MKL's conditional numerical
    reproducibility: an Intel AVX-512 host then computes the same bits (without it, its own path differs in the
    last bits of the grads, and the continued params with them)."""
    monkeypatch.setenv("MKL_CBWR", "AVX2,STRICT")


@pytest.mark.skipif(not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
                    reason="torch.distributed with gloo is not available")
@pytest.mark.parametrize("version", VERSIONS)
def test_sharded_checkpoint_continues_bit_identically_on_its_mesh(version, tmp_path, pinned_blas):
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


@pytest.mark.skipif(not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
                    reason="torch.distributed with gloo is not available")
@pytest.mark.parametrize("version", VERSIONS)
def test_sharded_checkpoint_loads_into_a_plain_model(version, tmp_path, pinned_blas):
    """Saved under FSDP2 on 2 ranks, loaded in one process without FSDP: fp32 states continue exactly, quantized
    ones are re-blocked where the shards cut the rows (the loss within 0.5% at every step)."""
    import distributed_cases as cases

    (got,) = cases.run(cases.dcp_load_plain, 1, tmp_path, list(golden.KINDS), str(golden.DATA / version / "sharded"),
                       golden.SHARDED_AT, golden.SHARDED_MORE)
    want = _expected(version)["sharded"]
    for kind in golden.KINDS:
        assert got[kind]["steps"] == {golden.SHARDED_AT}
        if kind == "fp32":
            assert got[kind]["losses"] == want[kind]["losses"]
        rel = ((torch.tensor(got[kind]["losses"]) / torch.tensor(want[kind]["losses"])) - 1).abs().max().item()
        assert rel <= 0.005, f"{kind}: {rel:.4%}"

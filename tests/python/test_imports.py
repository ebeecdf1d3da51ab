"""Optimizer checkpoints of torch.optim.AdamW, torchao (AdamW4bit, AdamW8bit, AdamWFp8) and bitsandbytes
(AdamW8bit, Adam8bit, their 32-bit variants), produced here by the real libraries, loaded with load_state_dict:
codes copied where the formats coincide, decoded and encoded otherwise; a state dict that fits another model is
refused, naming the param, with the optimizer unchanged."""
import copy
import io

import pytest
import torch
from torch import nn

import lbopt.torch as LT

torchao_optim = pytest.importorskip("torchao.optim")
try:
    import bitsandbytes as bnb
except Exception:  # noqa: BLE001 - a missing or broken install is the same here: those cases skip
    bnb = None

LR = 1e-2
SHAPES = [(64, 80), (4096,), (300,)]  # two quantized by everyone, one small (fp32 states everywhere)


def params():
    torch.manual_seed(0)
    return [nn.Parameter(torch.randn(s)) for s in SHAPES]


def grads(step):
    g = torch.Generator().manual_seed(100 + step)
    return [torch.randn(s, generator=g) for s in SHAPES]


def run(opt, ps, steps, start=0):
    for i in range(start, start + steps):
        for p, g in zip(ps, grads(i)):
            p.grad = g.clone()
        opt.step()


def peer_after(cls, steps=3, **kwargs):
    ps = params()
    opt = cls(ps, lr=LR, **kwargs)
    run(opt, ps, steps)
    return ps, opt


def from_file(sd):
    """sd through torch.save and torch.load, as a checkpoint (torchao's states cannot be deep-copied)."""
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


def lbopt_from(ps, sd, kind, **kwargs):
    mine = [nn.Parameter(p.detach().clone()) for p in ps]
    opt = LT.LowBitAdamW(mine, lr=LR, state_kind=kind, **kwargs)
    opt.load_state_dict(from_file(sd))
    return mine, opt


def decoded(opt, p):
    ids = [id(q) for g in opt.param_groups for q in g["params"]]
    return LT.to_torch_adamw_state_dict(opt)["state"][ids.index(id(p))]


TORCHAO = [("AdamW4bit", "4bit"), ("AdamW8bit", "8bit"), ("AdamWFp8", "fp8")]


@pytest.mark.parametrize("peer,kind", TORCHAO)
def test_torchao_states_are_copied_code_for_code_and_training_continues(peer, kind):
    ps, topt = peer_after(getattr(torchao_optim, peer))
    sd = topt.state_dict()
    mine, opt = lbopt_from(ps, sd, kind)
    for i, p in enumerate(mine[:2]):
        st, theirs = opt.state[p], sd["state"][i]
        assert st["state_kind"] == kind and st["step"] == 3
        for name in ("exp_avg", "exp_avg_sq"):
            codes = theirs[name].codes.reshape(-1)
            assert torch.equal(st[name + "_codes"], codes.view(torch.uint8) if kind == "fp8" else codes)
            assert torch.equal(st[name + "_scales"], theirs[name].scale)
    assert opt.state[mine[2]]["state_kind"] == "fp32"
    # one more step of each from the same states: torchao's own parity tolerance
    run(topt, ps, 1, start=3)
    run(opt, mine, 1, start=3)
    for p, q in zip(ps, mine):
        torch.testing.assert_close(q.detach(), p.detach(), rtol=1e-5, atol=1e-5)


def test_torchao_8bit_into_4bit_states_is_decoded_and_encoded():
    ps, topt = peer_after(torchao_optim.AdamW8bit)
    sd = topt.state_dict()
    mine, opt = lbopt_from(ps, sd, "4bit")
    theirs = sd["state"][0]["exp_avg"].dequantize().reshape(64, 80)
    ours = decoded(opt, mine[0])["exp_avg"]
    err = (ours - theirs).abs().max() / theirs.abs().max()
    assert opt.state[mine[0]]["state_kind"] == "4bit" and 0 < err < 0.15  # within 4-bit quantization


@pytest.mark.parametrize("kind", ["4bit", "8bit", "fp8", "fp32"])
def test_torch_adamw_state_dict_loads_into_every_kind(kind):
    ps, topt = peer_after(torch.optim.AdamW, amsgrad=True)
    sd = topt.state_dict()
    mine, opt = lbopt_from(ps, sd, kind, amsgrad=True)
    for i, p in enumerate(mine):
        ours, theirs = decoded(opt, p), sd["state"][i]
        assert float(ours["step"]) == 3
        for name in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
            tol = 0 if opt.state[p]["state_kind"] == "fp32" else 0.15 * theirs[name].abs().max().item()
            assert (ours[name] - theirs[name]).abs().max().item() <= tol, name


needs_bnb = pytest.mark.skipif(bnb is None, reason="bitsandbytes is not installed")


@needs_bnb
@pytest.mark.parametrize("peer", ["AdamW8bit", "Adam8bit"])
def test_bitsandbytes_8bit_codes_are_copied(peer):
    ps, bopt = peer_after(getattr(bnb.optim, peer))
    sd = bopt.state_dict()
    mine, opt = lbopt_from(ps, sd, "8bit", adam=peer.startswith("Adam8"))
    for i, p in enumerate(mine[:2]):
        entry = sd["state"][i]
        saved = entry.get("__bnb_optimizer_quant_state__", entry)
        st = opt.state[p]
        assert st["state_kind"] == "8bit" and st["step"] == 3
        for name, idx in (("exp_avg", "1"), ("exp_avg_sq", "2")):
            assert torch.equal(st[name + "_codes"], saved["state" + idx].reshape(-1))
            assert torch.equal(st[name + "_scales"], saved["absmax" + idx])
        # and they decode to what bitsandbytes itself decodes
        theirs = bnb.functional.dequantize_blockwise(saved["state1"], absmax=saved["absmax1"], code=saved["qmap1"],
                                                     blocksize=256)
        assert torch.equal(decoded(opt, p)["exp_avg"], theirs.reshape(p.shape))


@needs_bnb
@pytest.mark.parametrize("kind", ["fp32", "4bit"])
def test_bitsandbytes_32bit_states_load(kind):
    ps, bopt = peer_after(bnb.optim.AdamW32bit)
    sd = bopt.state_dict()
    mine, opt = lbopt_from(ps, sd, kind)
    saved = sd["state"][0].get("__bnb_optimizer_quant_state__", sd["state"][0])
    ours = decoded(opt, mine[0])
    tol = 0 if kind == "fp32" else 0.15 * saved["state1"].abs().max().item()
    assert (ours["exp_avg"] - saved["state1"]).abs().max().item() <= tol
    run(opt, mine, 2, start=3)  # and it trains on
    assert all(torch.isfinite(p).all() for p in mine)


def test_hand_built_flat_bitsandbytes_layout_loads():
    """bitsandbytes before 0.45 kept state1/absmax1/qmap1 flat in the entry; built here by hand from the 8-bit
    maps (which bitsandbytes' and lbopt's share)."""
    from lbopt import _abi, _import

    p = nn.Parameter(torch.randn(5120))
    codes = torch.randint(0, 256, (2, 5120), dtype=torch.uint8)
    absmax = torch.rand(2, 20) + 0.1
    entry = {"step": 4, "state1": codes[0].clone(), "absmax1": absmax[0].clone(),
             "qmap1": _import.codebook(_abi.STATE_8BIT, _abi.MOMENT_FIRST), "state2": codes[1].clone(),
             "absmax2": absmax[1].clone(), "qmap2": _import.codebook(_abi.STATE_8BIT, _abi.MOMENT_SECOND)}
    opt = LT.AdamW8bit([p])
    opt.load_state_dict({"state": {0: entry}, "param_groups": [{"params": [0], "lr": 1e-3}]})
    st = opt.state[p]
    assert st["step"] == 4 and torch.equal(st["exp_avg_codes"], codes[0]) and torch.equal(st["exp_avg_sq_scales"],
                                                                                            absmax[1])


def test_state_dict_of_another_model_is_refused_naming_the_param():
    ps, topt = peer_after(torchao_optim.AdamW8bit)
    sd = topt.state_dict()
    other = [nn.Parameter(torch.randn(64, 81)), nn.Parameter(torch.randn(4096)), nn.Parameter(torch.randn(300))]
    opt = LT.AdamW8bit([("w", other[0]), ("v", other[1]), ("b", other[2])], lr=LR)
    run_grads = [torch.randn(p.shape) for p in other]
    for p, g in zip(other, run_grads):
        p.grad = g
    opt.step()
    before = copy.deepcopy(opt.state_dict())
    with pytest.raises(ValueError, match=r"exp_avg of param 'w' has 5120 codes, the param 5184 elements"):
        opt.load_state_dict(sd)
    after = opt.state_dict()
    assert after["param_groups"] == before["param_groups"]
    for pid, st in before["state"].items():
        for k, v in st.items():
            assert torch.equal(after["state"][pid][k], v) if torch.is_tensor(v) else after["state"][pid][k] == v


def test_entry_with_nothing_readable_is_refused():
    p = nn.Parameter(torch.randn(5000))
    opt = LT.AdamW4bit([p])
    with pytest.raises(ValueError, match=r"exp_avg of a param of shape \(5000,\) is a str"):
        opt.load_state_dict({"state": {0: {"step": 1, "exp_avg": "junk"}}, "param_groups": [{"params": [0]}]})
    assert not opt.state

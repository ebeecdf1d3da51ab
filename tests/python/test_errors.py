"""Refused inputs: the right exception (LbOptTypeError / LbOptValueError carrying the C library's message, or the
Python layer's own TypeError / ValueError), a message naming the offending argument, and params and every state
tensor left exactly as they were."""
import math

import numpy as np
import pytest
import torch

import lbopt
import lbopt.functional as F
import lbopt.torch as LT
from lbopt import _abi

# ---- helpers -------------------------------------------------------------------------------------------------


def primed(kind="4bit", extra=(), amsgrad=False, **kwargs):
    """Two params (5200 and 300 elements) in one group and one library call (min_quant_size=0), stepped once so
    that their states are not zero, with fresh grads for the next step. `extra` params join the group without a
    grad (so without state)."""
    torch.manual_seed(0)
    a = torch.nn.Parameter(torch.randn(40, 130))
    b = torch.nn.Parameter(torch.randn(300))
    params = [a, b, *extra]
    opt = LT.LowBitAdamW(params, lr=1e-2, state_kind=kind, min_quant_size=0, amsgrad=amsgrad, **kwargs)
    a.grad, b.grad = torch.randn(40, 130), torch.randn(300)
    opt.step()
    a.grad, b.grad = torch.randn(40, 130), torch.randn(300)
    return opt, params


def force_grad(p, g):
    """Give p a grad torch's setter would refuse (other dtype or shape)."""
    if p.grad is None:
        p.grad = torch.zeros_like(p)
    p.grad.data = g
    assert p.grad.dtype == g.dtype and p.grad.shape == g.shape


class Snapshot:
    def __init__(self, opt, params):
        self.params = [p.detach().clone() for p in params]
        self.states = [{k: (v.clone() if torch.is_tensor(v) else v) for k, v in opt.state[p].items()} for p in params]

    def check(self, opt, params):
        for p, p0, s0 in zip(params, self.params, self.states):
            if p.device.type == "meta":
                continue
            assert p.dtype == p0.dtype and torch.equal(p.detach(), p0)
            st = opt.state[p]
            if not s0:
                # never stepped: a refused step may at most have created the fresh (all-zero, step 0) state
                assert not st or (st["step"] == 0 and all(not v.any() for v in st.values() if torch.is_tensor(v)))
                continue
            assert st.keys() == s0.keys()
            for k, v in s0.items():
                if torch.is_tensor(v):
                    assert st[k].dtype == v.dtype and torch.equal(st[k], v), k
                else:
                    assert st[k] == v, k


def refused(opt, params, exc, match, status=None):
    """opt.step() raises exc matching `match` and changes nothing."""
    snap = Snapshot(opt, params)
    with pytest.raises(exc, match=match) as e:
        opt.step()
    if status is not None:
        assert isinstance(e.value, lbopt.LbOptError) and e.value.status == status
    snap.check(opt, params)
    return e.value


# ---- dtypes --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float64, torch.int32])
def test_param_of_unsupported_dtype(dtype):
    bad = torch.nn.Parameter(torch.arange(50).to(dtype), requires_grad=dtype.is_floating_point)
    opt, params = primed(extra=[bad])
    force_grad(bad, torch.ones(50, dtype=dtype))
    name = {torch.float64: "float64", torch.int32: "int32"}[dtype]
    e = refused(opt, params, lbopt.LbOptTypeError, rf"slots\[2\]\.param: dtype {name} is not supported", _abi.ERR_DTYPE)
    assert isinstance(e, TypeError)


@pytest.mark.parametrize("dtype,name", [(torch.int32, "int32"), (torch.int64, "int64"), (torch.uint8, "uint8"),
                                        (torch.float64, "float64"), (torch.bool, "bool8")])
def test_grad_of_unsupported_dtype(dtype, name):
    opt, params = primed()
    force_grad(params[1], torch.ones(300, dtype=dtype))
    e = refused(opt, params, lbopt.LbOptTypeError,
                rf"slots\[1\]\.grad: dtype {name} is not supported here \(expected float32, bfloat16 or float16\)",
                _abi.ERR_DTYPE)
    assert isinstance(e, TypeError)


def test_numpy_float64_param_and_int_grad():
    p, g = np.ones(300), np.ones(300, np.float32)
    st = {"m": F.zeros_state("8bit", 300), "v": F.zeros_state("8bit", 300)}
    with pytest.raises(lbopt.LbOptTypeError, match=r"slots\[0\]\.param: dtype float64"):
        F.adamw_step([p], [g], [st], 1e-3, [1], kind="8bit")
    p = np.ones(300, np.float32)
    with pytest.raises(lbopt.LbOptTypeError, match=r"slots\[0\]\.grad: dtype int64"):
        F.adamw_step([p], [np.ones(300, np.int64)], [st], 1e-3, [1], kind="8bit")
    assert np.array_equal(p, np.ones(300, np.float32))
    assert not st["m"]["codes"].any() and not st["v"]["scales"].any()


# ---- strides, layouts, devices, aliasing ---------------------------------------------------------------------


def test_gapped_param_is_refused_for_its_strides():
    bad = torch.nn.Parameter(torch.randn(30, 40)[:, ::2])  # every other column: no dense layout
    opt, params = primed(extra=[bad])
    (bad * torch.randn(30, 20)).sum().backward()
    e = refused(opt, params, lbopt.LbOptValueError,
                r"slots\[2\]\.param: strides\[1\] = 2, a dense layout needs 1", _abi.ERR_STRIDE)
    assert isinstance(e, ValueError)


def test_sparse_grad_is_refused():
    emb = torch.nn.Embedding(50, 8, sparse=True)
    opt, params = primed(extra=[emb.weight])
    emb(torch.tensor([1, 4, 4])).sum().backward()
    assert emb.weight.grad.layout == torch.sparse_coo
    refused(opt, params, TypeError, r"torch\.sparse_coo gradients are not supported")


def test_meta_param_is_refused():
    bad = torch.nn.Parameter(torch.empty(64, device="meta"))
    opt, params = primed(extra=[bad])
    bad.grad = torch.zeros_like(bad)
    refused(opt, params, ValueError, r"tensors on meta are not supported")


def test_grad_aliasing_its_param_is_refused():
    opt, params = primed("fp32")
    params[1].grad = params[1].detach()
    refused(opt, params, lbopt.LbOptValueError, r"slots\[1\]\.grad overlaps slots\[1\]\.param", _abi.ERR_OVERLAP)


# ---- shapes --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("which,shape", [(1, (299,)), (1, (301,)), (0, (130, 40)), (0, (5200,)), (0, (1, 40, 130))])
def test_grad_of_wrong_shape(which, shape):
    opt, params = primed()
    force_grad(params[which], torch.ones(shape))
    refused(opt, params, lbopt.LbOptValueError, rf"slots\[{which}\]\.grad: shape differs from the param's",
            _abi.ERR_SHAPE)


def test_step_recovers_after_a_refused_step():
    """A refused step leaves nothing stale behind: with valid grads again, the next step equals a run that never
    saw the bad grad."""
    opt, params = primed()
    ref_opt, ref_params = primed()
    good = [p.grad.clone() for p in params]
    force_grad(params[0], torch.ones(5200))
    with pytest.raises(ValueError):
        opt.step()
    params[0].grad = good[0]
    opt.step()
    ref_opt.step()
    for p, q in zip(params, ref_params):
        assert torch.equal(p, q)
        for k, v in ref_opt.state[q].items():
            assert (torch.equal(opt.state[p][k], v) if torch.is_tensor(v) else opt.state[p][k] == v), k


def test_param_reshaped_in_place_still_steps():
    torch.manual_seed(1)
    init, g1, g2 = torch.randn(40, 130), torch.randn(40, 130), torch.randn(130, 40)
    p, q = torch.nn.Parameter(init.clone()), torch.nn.Parameter(init.clone())
    opt, ref = LT.AdamW4bit([p], min_quant_size=0), LT.AdamW4bit([q], min_quant_size=0)
    p.grad, q.grad = g1.clone(), g1.clone()
    opt.step()
    ref.step()
    p.data = p.data.view(130, 40)  # same storage and data_ptr, new shape (the state is flat: still valid)
    p.grad, q.grad = g2.clone(), g2.reshape(40, 130).clone()
    opt.step()
    ref.step()
    assert torch.equal(p.detach().flatten(), q.detach().flatten())


# ---- hyper-parameters ----------------------------------------------------------------------------------------

BAD_HYPER = [
    ("lr", -1.0, r"lr = -1 must be finite and >= 0"),
    ("lr", math.nan, r"lr = nan must be finite and >= 0"),
    ("lr", math.inf, r"lr = inf must be finite and >= 0"),
    ("betas", (1.0, 0.999), r"config\.beta1 = 1 is outside \[0, 1\)"),
    ("betas", (0.9, -0.1), r"config\.beta2 = -0.1 is outside \[0, 1\)"),
    ("eps", -1e-8, r"config\.eps = -1e-08 must be finite and >= 0"),
    ("eps", math.nan, r"config\.eps = nan must be finite and >= 0"),
    ("weight_decay", -0.1, r"config\.weight_decay = -0.1 must be finite and >= 0"),
]
IDS = [f"{k}={v}" for k, v, _ in BAD_HYPER]


@pytest.mark.parametrize("cls", [LT.AdamW4bit, LT.AdamW, LT.Adam8bit])
@pytest.mark.parametrize("key,value,match", BAD_HYPER, ids=IDS)
def test_bad_hyperparameter_at_construction(cls, key, value, match):
    p = torch.nn.Parameter(torch.randn(10))
    p0 = p.detach().clone()
    with pytest.raises(lbopt.LbOptValueError, match=match) as e:
        cls([p], **{key: value})
    assert isinstance(e.value, ValueError) and e.value.status == _abi.ERR_INVALID_VALUE
    # a param group's own value is checked as well
    with pytest.raises(lbopt.LbOptValueError, match=match):
        cls([{"params": [p], key: value}])
    assert torch.equal(p, p0)


def test_tensor_lr_is_checked_at_construction():
    with pytest.raises(lbopt.LbOptValueError, match=r"lr = -0.5 must be finite and >= 0"):
        LT.AdamW4bit([torch.nn.Parameter(torch.randn(10))], lr=torch.tensor(-0.5))


@pytest.mark.parametrize("key,value,match", BAD_HYPER, ids=IDS)
def test_bad_hyperparameter_set_before_step(key, value, match):
    opt, params = primed()
    good = opt.param_groups[0][key]
    opt.param_groups[0][key] = value
    refused(opt, params, lbopt.LbOptValueError, match, _abi.ERR_INVALID_VALUE)
    opt.param_groups[0][key] = good
    ref_opt, ref_params = primed()
    opt.step()
    ref_opt.step()
    for p, q in zip(params, ref_params):
        assert torch.equal(p, q)


def test_bad_tensor_lr_set_before_step():
    opt, params = primed()
    opt.param_groups[0]["lr"] = torch.tensor(-1e-3)
    refused(opt, params, lbopt.LbOptValueError, r"lr = -0.001 must be finite and >= 0", _abi.ERR_INVALID_VALUE)


def test_add_param_group_with_bad_hyperparameter_raises():
    opt, params = primed()
    with pytest.raises(lbopt.LbOptValueError, match=r"config\.eps = -1 must be finite and >= 0"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.randn(10))], "eps": -1.0})


def test_refused_param_group_is_not_added():
    opt, params = primed()
    n_groups = len(opt.param_groups)
    extra = torch.nn.Parameter(torch.randn(10))
    with pytest.raises(ValueError):
        opt.add_param_group({"params": [extra], "lr": -1.0})
    assert len(opt.param_groups) == n_groups
    extra.grad = torch.randn(10)
    opt.step()  # steps the valid group; must not raise


# ---- kinds ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["int4", "FP8", "float32", "4-bit"])
def test_unknown_state_kind_string(bad):
    p = torch.nn.Parameter(torch.randn(10))
    with pytest.raises(ValueError, match=rf"unknown state kind {bad!r} \(one of 4bit, 8bit, fp8, fp32\)"):
        LT.LowBitAdamW([p], state_kind=bad)


def test_unknown_state_kind_number_is_refused_at_construction():
    p = torch.nn.Parameter(torch.randn(100))
    with pytest.raises(lbopt.LbOptValueError, match=r"kind = 7 is not an lbopt_state_kind"):
        LT.LowBitAdamW([p], state_kind=7, min_quant_size=0)


# ---- functional API ------------------------------------------------------------------------------------------


def test_functional_refusals_leave_arrays_untouched():
    rng = np.random.default_rng(0)
    p = rng.standard_normal(500).astype(np.float32)
    g = rng.standard_normal(500).astype(np.float32)
    st = {"m": F.zeros_state("4bit", 500), "v": F.zeros_state("4bit", 500)}
    F.adamw_step([p], [g], [st], 1e-2, [1], kind="4bit")
    p0 = p.copy()
    st0 = {m: {k: v.copy() for k, v in s.items()} for m, s in st.items()}

    def unchanged():
        assert np.array_equal(p, p0)
        for m in st:
            for k in st[m]:
                assert np.array_equal(st[m][k], st0[m][k]), (m, k)

    with pytest.raises(ValueError, match="must have the same length"):
        F.adamw_step([p], [g, g], [st], 1e-2, [2], kind="4bit")
    unchanged()
    with pytest.raises(lbopt.LbOptValueError, match=r"slots\[0\]\.step = 0 must be >= 1"):
        F.adamw_step([p], [g], [st], 1e-2, [0], kind="4bit")
    unchanged()
    with pytest.raises(lbopt.LbOptValueError, match=r"slots\[0\]\.v\.scales: has 2 elements, the state of 500 "
                                                    r"elements needs 4"):
        F.adamw_step([p], [g], [{"m": st["m"], "v": {"codes": st["v"]["codes"], "scales": st["v"]["scales"][:2]}}],
                     1e-2, [2], kind="4bit")
    unchanged()
    with pytest.raises(lbopt.LbOptTypeError, match=r"slots\[0\]\.m\.codes: dtype must be uint8"):
        F.adamw_step([p], [g], [{"m": F.zeros_state("fp32", 500), "v": st["v"]}], 1e-2, [2], kind="4bit")
    unchanged()
    with pytest.raises(lbopt.LbOptValueError, match=r"slots\[0\]\.grad: shape differs"):
        F.adamw_step([p], [g[:499]], [st], 1e-2, [2], kind="4bit")
    unchanged()
    with pytest.raises(lbopt.LbOptValueError, match=r"lr = -1 must be finite"):
        F.adamw_step([p], [g], [st], -1.0, [2], kind="4bit")
    unchanged()
    with pytest.raises(lbopt.LbOptValueError, match=r"overlaps"):
        F.adamw_step([p], [g], [{"m": st["m"], "v": st["m"]}], 1e-2, [2], kind="4bit")
    unchanged()

"""lbopt.torch under ordinary training code: dtype switches mid-run, channels_last and other dense layouts, layout
changes and checkpoints across layouts, copied and pickled optimizers, atomic steps, torch-like argument checks
and torch.compile. Each test compares with a reference computed another way (a fresh optimizer, the same memory
stepped flat, torch.optim.AdamW) so that a stale view or a wrong element order fails it."""
import copy
import pickle
import warnings

import pytest
import torch
from torch import nn

import lbopt
import lbopt.torch as LT

KINDS = ["4bit", "8bit", "fp8", "fp32"]


def fresh_twin(opt, params, kind, **kwargs):
    """A new optimizer over clones of params, loaded with opt's state: it has never cached anything."""
    twins = [nn.Parameter(p.detach().clone()) for p in params]
    other = LT.LowBitAdamW(twins, lr=opt.param_groups[0]["lr"], state_kind=kind, **kwargs)
    other.load_state_dict(copy.deepcopy(opt.state_dict()))
    return other, twins


def same_step(opt, params, other, twins, grads):
    for p, q, g in zip(params, twins, grads):
        p.grad, q.grad = g.clone().to(p.dtype), g.clone().to(q.dtype)
    opt.step()
    other.step()
    for p, q in zip(params, twins):
        assert p.dtype == q.dtype and torch.equal(p.detach(), q.detach())


# ---- 1. a param's dtype changes between steps ---------------------------------------------------------------


def test_issue_repro_half_then_bfloat16():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10))
    opt = LT.AdamW4bit(model.parameters())
    model(torch.randn(8, 128)).sum().backward()
    opt.step()
    opt.zero_grad()
    model.half()
    model.bfloat16()
    model(torch.randn(8, 128, dtype=torch.bfloat16)).float().sum().backward()
    opt.step()
    assert all(p.dtype == torch.bfloat16 and torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.parametrize("kind", KINDS)
def test_dtype_switches_step_like_a_fresh_optimizer(kind):
    """float32 -> float16 -> bfloat16 -> float32, a step after each switch: every step equals that of an optimizer
    built after the switch with the same states (so no view of the old storage or dtype survives)."""
    torch.manual_seed(1)
    params = [nn.Parameter(torch.randn(64, 80)), nn.Parameter(torch.randn(300))]
    opt = LT.LowBitAdamW(params, lr=1e-2, state_kind=kind, min_quant_size=0)
    for p in params:
        p.grad = torch.randn_like(p)
    opt.step()
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.bfloat16):
        for p in params:
            p.data = p.data.to(dtype)  # what Module.half() / .bfloat16() / .float() do
        other, twins = fresh_twin(opt, params, kind, min_quant_size=0)
        same_step(opt, params, other, twins, [torch.randn(p.shape) for p in params])


def test_new_dtype_at_the_same_address_is_seen():
    """The allocator may hand the new data the old address (a stale view would then corrupt the heap): forced here
    by viewing the same memory as bfloat16, so shape, strides and data_ptr all stay and only the dtype tells."""
    torch.manual_seed(13)
    p = nn.Parameter(torch.randn(6000))
    opt = LT.AdamW4bit([p], lr=1e-2)
    p.grad = torch.randn(6000)
    opt.step()
    ptr = p.data_ptr()
    p.data = p.data.view(torch.bfloat16)[:6000].copy_(torch.randn(6000))
    assert p.data_ptr() == ptr and p.shape == (6000,) and p.stride() == (1,)
    other, twins = fresh_twin(opt, [p], "4bit")
    same_step(opt, [p], other, twins, [torch.randn(6000)])


# ---- 2. dense layouts other than row-major ------------------------------------------------------------------


def nhwc_flat(t):
    """A channels_last 4-d tensor's elements in memory order."""
    return t.detach().permute(0, 2, 3, 1).reshape(-1)


@pytest.mark.parametrize("kind", KINDS)
def test_channels_last_conv_steps_in_memory_order(kind):
    """Checked bit for bit: a channels_last conv weight steps exactly like a flat param holding
    its memory, states included."""
    torch.manual_seed(2)
    conv = nn.Conv2d(16, 32, 3).to(memory_format=torch.channels_last)
    opt = LT.LowBitAdamW(conv.parameters(), lr=1e-2, state_kind=kind)
    flat = nn.Parameter(nhwc_flat(conv.weight).clone())
    ref = LT.LowBitAdamW([flat], lr=1e-2, state_kind=kind)
    for _ in range(3):
        conv(torch.randn(2, 16, 12, 12).to(memory_format=torch.channels_last)).sum().backward()
        assert conv.weight.grad.stride() == conv.weight.stride()
        flat.grad = nhwc_flat(conv.weight.grad).clone()
        opt.step()
        ref.step()
        opt.zero_grad()
        assert torch.equal(nhwc_flat(conv.weight), flat.detach())
    st, rst = opt.state[conv.weight], ref.state[flat]
    assert st["dim_order"] == (0, 2, 3, 1)
    for k, v in rst.items():
        if torch.is_tensor(v):
            assert torch.equal(st[k], v), k


def test_channels_last_fp32_states_match_torch_adamw_logically():
    """fp32 states have no blocks: a channels_last param and a row-major copy of it, given the same gradients, end
    up logically identical, and both match torch.optim.AdamW within rounding. (Gradients are set directly: conv's
    own backward sums in another order for channels_last.)"""
    torch.manual_seed(3)
    w = torch.randn(16, 8, 3, 3)
    a = nn.Parameter(w.clone().to(memory_format=torch.channels_last))
    b, c = nn.Parameter(w.clone()), nn.Parameter(w.clone())
    oa, ob = LT.AdamW([a], lr=1e-2), LT.AdamW([b], lr=1e-2)
    oc = torch.optim.AdamW([c], lr=1e-2, weight_decay=1e-2)
    for _ in range(4):
        g = torch.randn(16, 8, 3, 3)
        a.grad, b.grad, c.grad = g.contiguous(memory_format=torch.channels_last), g.clone(), g.clone()
        for o in (oa, ob, oc):
            o.step()
    assert a.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(a.detach(), b.detach())
    torch.testing.assert_close(a.detach(), c.detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("grad_of", ["contiguous", "expanded", "transposed-view"])
def test_grad_laid_out_unlike_its_param_is_brought_to_the_param_layout(grad_of):
    torch.manual_seed(4)
    w = nn.Parameter(torch.randn(32, 16, 3, 3).to(memory_format=torch.channels_last))
    same = nn.Parameter(w.detach().clone())  # channels_last too (clone preserves the layout)
    opt, ref = LT.AdamW4bit([w], lr=1e-2), LT.AdamW4bit([same], lr=1e-2)
    g = torch.randn(32, 16, 3, 3)
    if grad_of == "expanded":
        g = torch.randn(1, 16, 1, 1).expand(32, 16, 3, 3)
    elif grad_of == "transposed-view":
        g = torch.randn(3, 3, 16, 32).permute(3, 2, 1, 0)
    w.grad = g
    same.grad = g.contiguous(memory_format=torch.channels_last)
    assert w.grad.stride() != w.stride()
    opt.step()
    ref.step()
    assert torch.equal(w.detach(), same.detach())
    assert w.grad is g  # the user's grad is left as it was


def test_transposed_param_steps_in_memory_order():
    torch.manual_seed(5)
    w = nn.Parameter(torch.randn(30, 200).t())  # [200, 30], strides (1, 200)
    flat = nn.Parameter(w.detach().t().reshape(-1).clone())
    opt, ref = LT.AdamW8bit([w], lr=1e-2), LT.AdamW8bit([flat], lr=1e-2)
    for _ in range(2):
        (w * torch.randn(200, 30)).sum().backward()
        flat.grad = w.grad.t().reshape(-1).clone()
        opt.step()
        ref.step()
        opt.zero_grad()
    assert torch.equal(w.detach().t().reshape(-1), flat.detach())


def test_gapped_and_overlapping_params_are_refused_cleanly():
    base = torch.randn(40, 40)
    gapped = nn.Parameter(base[:, ::2])
    gapped.grad = torch.randn(40, 20)
    opt = LT.AdamW4bit([gapped])
    with pytest.raises(lbopt.LbOptValueError, match=r"slots\[0\]\.param: strides\[1\] = 2, a dense layout needs 1"):
        opt.step()
    assert not opt.state  # a single call refused by the library creates no state either
    expanded = nn.Parameter(torch.randn(1, 50).expand(40, 50))
    expanded.grad = torch.randn(40, 50)
    with pytest.raises(lbopt.LbOptValueError, match=r"slots\[0\]\.param: strides\[0\] = 0"):
        LT.AdamW4bit([expanded]).step()


@pytest.mark.parametrize("kind", KINDS)
def test_layout_change_mid_training_relayouts_the_states(kind):
    """A param switched to channels_last after some steps: its states are re-laid out to the new memory order
    (decoded in the old order, encoded in the new one), so the run equals one that moved the moments into a
    channels_last param by hand through torch.optim.AdamW's format at the switch; with fp32 states it also equals
    the run that never switched."""
    torch.manual_seed(6)
    w = torch.randn(32, 16, 3, 3)
    a, b = nn.Parameter(w.clone()), nn.Parameter(w.clone())
    oa = LT.LowBitAdamW([a], lr=1e-2, state_kind=kind)
    ob = LT.LowBitAdamW([b], lr=1e-2, state_kind=kind)
    grads = [torch.randn(32, 16, 3, 3) for _ in range(6)]
    for g in grads[:3]:
        a.grad, b.grad = g.clone(), g.clone()
        oa.step()
        ob.step()
    a.data = a.data.contiguous(memory_format=torch.channels_last)  # what Module.to(memory_format=...) does
    c = nn.Parameter(b.detach().clone().contiguous(memory_format=torch.channels_last))
    oc = LT.LowBitAdamW([c], lr=1e-2, state_kind=kind)
    LT.load_torch_adamw_state_dict(oc, LT.to_torch_adamw_state_dict(ob))
    for g in grads[3:]:
        a.grad = g.contiguous(memory_format=torch.channels_last)
        c.grad = g.contiguous(memory_format=torch.channels_last)
        b.grad = g.clone()
        for o in (oa, ob, oc):
            o.step()
    assert oa.state[a]["dim_order"] == oc.state[c]["dim_order"] == (0, 2, 3, 1)
    assert torch.equal(a.detach(), c.detach())
    for k, v in oc.state[c].items():
        if torch.is_tensor(v):
            assert torch.equal(oa.state[a][k], v), k
    if kind == "fp32":
        assert torch.equal(a.detach(), b.detach())


def test_checkpoint_from_a_channels_last_model_loads_into_a_row_major_one():
    torch.manual_seed(7)
    w = torch.randn(16, 8, 3, 3)
    a = nn.Parameter(w.clone().to(memory_format=torch.channels_last))
    oa = LT.AdamW([a], lr=1e-2)
    for _ in range(2):
        a.grad = torch.randn(16, 8, 3, 3).contiguous(memory_format=torch.channels_last)
        oa.step()
    b = nn.Parameter(a.detach().contiguous())
    ob = LT.AdamW([b], lr=1e-2)
    ob.load_state_dict(copy.deepcopy(oa.state_dict()))  # as from a file: torch's load_state_dict shares tensors
    assert "dim_order" not in ob.state[b]  # a checkpoint is row-major whatever the layout it was saved from
    g = torch.randn(16, 8, 3, 3)
    a.grad, b.grad = g.contiguous(memory_format=torch.channels_last), g
    oa.step()
    ob.step()
    assert "dim_order" not in ob.state[b]
    assert torch.equal(a.detach(), b.detach())


def test_torch_adamw_conversion_keeps_channels_last_moments_in_place():
    torch.manual_seed(8)
    conv = nn.Conv2d(8, 16, 3).to(memory_format=torch.channels_last)
    ref = copy.deepcopy(conv)
    opt = LT.AdamW(conv.parameters(), lr=1e-2)
    topt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    for m, o in ((conv, opt), (ref, topt)):
        m(torch.ones(1, 8, 5, 5)).sum().backward()
        o.step()
    ours = LT.to_torch_adamw_state_dict(opt)["state"][0]
    theirs = topt.state_dict()["state"][0]
    torch.testing.assert_close(ours["exp_avg"], theirs["exp_avg"], rtol=0, atol=0)
    back = LT.AdamW(copy.deepcopy(conv).parameters(), lr=1e-2)
    LT.load_torch_adamw_state_dict(back, topt.state_dict())
    assert torch.equal(back.state[back.param_groups[0]["params"][0]]["exp_avg_codes"],
                       opt.state[conv.weight]["exp_avg_codes"])


# ---- 3. copied and pickled optimizers -------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_copied_optimizer_steps_like_the_original_and_independently(how):
    torch.manual_seed(9)
    model = nn.Sequential(nn.Linear(64, 96), nn.Linear(96, 8))
    opt = LT.AdamW4bit(model.parameters(), lr=1e-2, keep_fp32=[model[1].weight], bf16_stochastic_round=True)
    model(torch.randn(4, 64)).sum().backward()
    opt.step()
    twin = copy.deepcopy(opt) if how == "deepcopy" else pickle.loads(pickle.dumps(opt))
    assert type(twin) is LT.AdamW4bit and twin.bf16_stochastic_round
    before = [p.detach().clone() for p in model.parameters()]
    grads = [torch.randn(p.shape) for p in model.parameters()]
    twin_params = [p for g in twin.param_groups for p in g["params"]]
    for p, q, g in zip(model.parameters(), twin_params, grads):
        assert p is not q and torch.equal(p, q)
        q.grad = g.clone()
    twin.step()  # does not touch the original's params or states
    for p, b in zip(model.parameters(), before):
        assert torch.equal(p.detach(), b)
    for p, g in zip(model.parameters(), grads):
        p.grad = g.clone()
    opt.step()
    for p, q in zip(model.parameters(), twin_params):
        assert torch.equal(p.detach(), q.detach())
        assert opt.state[p]["state_kind"] == twin.state[q]["state_kind"]
    assert twin.state[twin_params[2]]["state_kind"] == "fp32"  # keep_fp32 survived the copy


def test_deepcopy_before_any_step_keeps_keep_fp32():
    a, b = nn.Parameter(torch.randn(5000)), nn.Parameter(torch.randn(5000))
    twin = copy.deepcopy(LT.AdamW4bit([a, b], keep_fp32=[b]))
    qa, qb = twin.param_groups[0]["params"]
    qa.grad, qb.grad = torch.randn(5000), torch.randn(5000)
    twin.step()
    assert twin.state[qa]["state_kind"] == "4bit" and twin.state[qb]["state_kind"] == "fp32"


# ---- 4. atomic steps ------------------------------------------------------------------------------------------


def snapshot(opt, params):
    return [(p.detach().clone(), copy.deepcopy(dict(opt.state.get(p, {})))) for p in params]


def assert_unchanged(opt, params, snap):
    for p, (p0, s0) in zip(params, snap):
        assert torch.equal(p.detach(), p0)
        st = opt.state.get(p, {})
        assert st.keys() == s0.keys()  # no fresh (step 0) state for a param never stepped
        for k, v in s0.items():
            assert torch.equal(st[k], v) if torch.is_tensor(v) else st[k] == v


def test_refused_param_in_the_group_of_a_good_one_leaves_everything_untouched():
    """A small param (fp32 states, one call) and a complex one (refused) in one group."""
    small, big = nn.Parameter(torch.randn(100)), nn.Parameter(torch.randn(5000))
    bad = nn.Parameter(torch.randn(50, dtype=torch.complex64))
    opt = LT.AdamW4bit([small, big, bad])
    for p in (small, big, bad):
        p.grad = torch.ones_like(p)
    snap = snapshot(opt, [small, big, bad])
    with pytest.raises(lbopt.LbOptTypeError, match=r"slots\[\d\]\.param: dtype complex64 is not supported"):
        opt.step()
    assert_unchanged(opt, [small, big, bad], snap)
    assert not opt.state  # the states a refused step would have created are gone
    bad.grad = None
    opt.step()  # the rest steps once the bad param is out of the way
    assert opt.state[small]["step"] == opt.state[big]["step"] == 1


def test_refused_second_group_leaves_the_first_untouched():
    torch.manual_seed(10)
    a, b = nn.Parameter(torch.randn(5000)), nn.Parameter(torch.randn(300))
    opt = LT.AdamW4bit([{"params": [a]}, {"params": [b], "lr": 1e-3}], min_quant_size=0)
    a.grad, b.grad = torch.randn(5000), torch.randn(300)
    opt.step()
    a.grad, b.grad = torch.randn(5000), torch.randn(300)
    opt.param_groups[1]["lr"] = -1.0
    snap = snapshot(opt, [a, b])
    with pytest.raises(lbopt.LbOptValueError, match=r"lr = -1 must be finite and >= 0"):
        opt.step()
    assert_unchanged(opt, [a, b], snap)


def test_python_level_refusal_creates_no_state():
    emb = nn.Embedding(50, 8, sparse=True)
    dense = nn.Parameter(torch.randn(100))
    opt = LT.AdamW4bit([dense, emb.weight])
    dense.grad = torch.randn(100)
    emb(torch.tensor([1, 2])).sum().backward()
    with pytest.raises(TypeError, match="sparse"):
        opt.step()
    assert not opt.state


# ---- 5. argument checks as torch.optim's ---------------------------------------------------------------------


def test_string_lr_is_a_type_error_like_torch():
    p = nn.Parameter(torch.randn(10))
    with pytest.raises(TypeError):
        torch.optim.AdamW([p], lr="0.001")
    with pytest.raises(TypeError, match=r"lr must be a real number or a 1-element tensor, not str '0\.001'"):
        LT.AdamW4bit([p], lr="0.001")
    opt = LT.AdamW4bit([p])
    opt.param_groups[0]["lr"] = "0.001"
    p.grad = torch.ones(10)
    before = p.detach().clone()
    with pytest.raises(TypeError, match="lr must be a real number"):
        opt.step()
    assert torch.equal(p.detach(), before) and not opt.state
    for key, value in (("eps", "1e-8"), ("weight_decay", "0.1"), ("betas", ("0.9", 0.999))):
        with pytest.raises(TypeError, match=key.split("s")[0] if key == "betas" else key):
            LT.AdamW4bit([p], **{key: value})


@pytest.mark.parametrize("step", [-5, 2.5, float("nan"), "3", True, torch.tensor([1.0, 2.0])])
def test_loaded_state_with_a_bad_step_is_refused_at_load(step):
    p = nn.Parameter(torch.randn(5000))
    opt = LT.AdamW4bit([p])
    p.grad = torch.randn(5000)
    opt.step()
    sd = copy.deepcopy(opt.state_dict())
    sd["state"][0]["step"] = step
    snap = snapshot(opt, [p])
    with pytest.raises(ValueError, match=r"saved step .* is not a whole number in \[0, 2\^53\]"):
        opt.load_state_dict(sd)
    assert_unchanged(opt, [p], snap)


def test_loaded_step_as_a_torch_style_tensor_is_accepted():
    p = nn.Parameter(torch.randn(5000))
    opt = LT.AdamW4bit([p])
    p.grad = torch.randn(5000)
    opt.step()
    sd = copy.deepcopy(opt.state_dict())
    sd["state"][0]["step"] = torch.tensor(1.0)  # torch.optim.AdamW's form
    opt.load_state_dict(sd)
    assert opt.state[p]["step"] == 1 and type(opt.state[p]["step"]) is int


def test_loaded_group_with_a_bad_hyperparameter_is_refused_at_load():
    p = nn.Parameter(torch.randn(100))
    opt = LT.AdamW4bit([p])
    sd = copy.deepcopy(opt.state_dict())
    sd["param_groups"][0]["betas"] = (1.5, 0.999)
    with pytest.raises(lbopt.LbOptValueError, match=r"config\.beta1 = 1\.5"):
        opt.load_state_dict(sd)
    assert opt.param_groups[0]["betas"] == (0.9, 0.999)


def test_eps_zero_is_accepted_and_matches_torch():
    """torch accepts eps = 0; so does lbopt, with torch's results (0/0 = NaN where a gradient was always 0)."""
    torch.manual_seed(11)
    p = nn.Parameter(torch.randn(4096))
    q = nn.Parameter(p.detach().clone())
    ours = LT.AdamW([p], lr=1e-2, eps=0.0)
    theirs = torch.optim.AdamW([q], lr=1e-2, eps=0.0, fused=True)
    for _ in range(3):
        g = torch.randn(4096)
        g[:64] = 0
        p.grad, q.grad = g.clone(), g.clone()
        ours.step()
        theirs.step()
    assert torch.isnan(p[:64]).all() and torch.isnan(q[:64]).all()
    assert torch.equal(p.detach()[64:], q.detach()[64:])


def test_torch_only_keywords():
    p = nn.Parameter(torch.randn(10))
    LT.AdamW4bit([p], foreach=True, fused=True)  # accepted: lbopt always fuses
    for kw in ("capturable", "differentiable"):
        with pytest.raises(ValueError, match="not supported"):
            LT.AdamW4bit([p], **{kw: True})


def test_amsgrad_turned_on_after_the_first_step():
    p = nn.Parameter(torch.randn(5000))
    opt = LT.AdamW4bit([p])
    p.grad = torch.randn(5000)
    opt.step()
    opt.param_groups[0]["amsgrad"] = True
    opt.step()
    assert opt.state[p]["max_exp_avg_sq_codes"].any() and opt.state[p]["step"] == 2


# ---- 6. torch.compile -----------------------------------------------------------------------------------------


def test_compiled_function_calling_step_does_not_recompile_and_equals_eager():
    import torch._dynamo.utils

    torch.manual_seed(12)
    models = [nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8)) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    opts = [LT.AdamW4bit(m.parameters(), lr=1e-2, min_quant_size=0) for m in models]
    scheds = [torch.optim.lr_scheduler.CosineAnnealingLR(o, 10) for o in opts]

    def step_fn(opt):
        opt.step()
        opt.zero_grad()

    compiled = torch.compile(step_fn)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(8):  # the lr changes on every step
            x = torch.randn(4, 32)
            for m, o, s, f in zip(models, opts, scheds, (step_fn, compiled)):
                m(x).square().mean().backward()
                f(o)
                s.step()
    assert not [w for w in caught if "recompil" in str(w.message).lower()]
    assert not torch._dynamo.utils.counters["recompiles"]
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        assert torch.equal(a, b)


# ---- 7. the same rules outside lbopt.torch ---------------------------------------------------------------------


def test_refused_torch_adamw_import_leaves_the_optimizer_unchanged():
    torch.manual_seed(14)
    p = nn.Parameter(torch.randn(64, 80))
    opt = LT.AdamW4bit([p], lr=1e-2)
    p.grad = torch.randn(64, 80)
    opt.step()
    q = nn.Parameter(p.detach().clone())
    topt = torch.optim.AdamW([q], lr=5e-3)
    q.grad = torch.randn(64, 80)
    topt.step()
    bad = copy.deepcopy(topt.state_dict())
    bad["state"][0]["exp_avg"] = bad["state"][0]["exp_avg"][:10]
    snap = snapshot(opt, [p])
    with pytest.raises(ValueError, match="exp_avg of a param of shape"):
        LT.load_torch_adamw_state_dict(opt, bad)
    assert_unchanged(opt, [p], snap)
    assert opt.param_groups[0]["lr"] == 1e-2


def test_numpy_fortran_order_arrays_step_in_memory_order():
    import numpy as np

    import lbopt.functional as F

    rng = np.random.default_rng(15)
    p = np.asfortranarray(rng.standard_normal((60, 40), dtype=np.float32))
    g = np.asfortranarray(rng.standard_normal((60, 40), dtype=np.float32))
    flat_p, flat_g = p.T.reshape(-1).copy(), g.T.reshape(-1).copy()  # the same elements in memory order
    st = {"m": F.zeros_state("4bit", p.size), "v": F.zeros_state("4bit", p.size)}
    ref = {"m": F.zeros_state("4bit", p.size), "v": F.zeros_state("4bit", p.size)}
    F.adamw_step([p], [g], [st], 1e-2, [1])
    F.adamw_step([flat_p], [flat_g], [ref], 1e-2, [1])
    assert np.array_equal(p.T.reshape(-1), flat_p)
    assert np.array_equal(st["m"]["codes"], ref["m"]["codes"])
    with pytest.raises(lbopt.LbOptValueError, match=r"slots\[0\]\.grad: strides\[0\] = 40, its param's is 1"):
        F.adamw_step([p], [np.ascontiguousarray(g)], [st], 1e-2, [2])


def test_steps_where_some_params_have_no_grad_match_torch():
    """The per-group call kept between steps (lbopt.torch's _Call) is rebuilt when the set of params stepped
    changes: params without a grad in some steps, in changing patterns, step exactly as torch.optim.AdamW.
    The reference is torch's fused step, which takes square roots with the CPU's instruction: its single-tensor
    step calls torch.sqrt, which on an AMD EPYC host (torch 2.15 with MKL) was 1 ulp off the correctly rounded root
    for some inputs (sqrt(0.00024300827f) gave 0.015588723f for 0.015588722f)."""
    torch.manual_seed(21)
    ps = [torch.nn.Parameter(torch.randn(64)) for _ in range(4)]
    qs = [torch.nn.Parameter(p.detach().clone()) for p in ps]
    mine, theirs = LT.AdamW(ps, lr=1e-2), torch.optim.AdamW(qs, lr=1e-2, fused=True)
    for t in range(9):
        for i, (p, q) in enumerate(zip(ps, qs)):
            g = None if (t + i) % 3 == 0 else torch.randn(64)
            p.grad, q.grad = g, (None if g is None else g.clone())
        mine.step()
        theirs.step()
        assert all(torch.equal(p, q) for p, q in zip(ps, qs)), t

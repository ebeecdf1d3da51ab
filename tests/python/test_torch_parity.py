"""Parity of the lbopt.torch optimizers with torch.optim, and their torch integration (schedulers, param groups,
state kinds, GradScaler, non-finite gradients, bfloat16 params).

Reference points measured with torch 2.15 on CPU:

* lbopt's fp32 states reproduce torch.optim.AdamW(fused=True) (plain, amsgrad, maximize, with any lr schedule)
  bit for bit, params and moments, as long as every tensor's element count is a multiple of torch's CPU vector
  width: torch's fused CPU kernel steps the last
  `numel % vec_size` elements of a tensor in a scalar loop whose exp_avg_sq rounds differently (1 ulp) from its
  vectorized body, while lbopt rounds every element like that body. The bit-identity tests therefore use an MLP
  with 16 outputs; test_torch_fused_tail_is_the_only_difference pins the 10-output case down.
* Independent 100-step trajectories of torch's own fused=True and fused=False AdamW differ by up to 4e-3 of
  max|p| on this MLP for some data seeds (ReLU units near their kink amplify the first ulp of difference), so the
  1e-6 comparisons with fused=False (and with fused=True on the 10-output MLP) feed both optimizers the same
  gradients every step: what is compared is the optimizers' arithmetic, not the chaos of training.
"""
import ctypes
import math

import pytest
import torch

import lbopt
from lbopt import _abi
import lbopt.torch as lbt

STEPS = 100
LR = 1e-3
WD = 0.01
REL_TOL = 1e-6

_g = torch.Generator().manual_seed(1)
X = torch.randn(256, 64, generator=_g)
Y = torch.randint(0, 10, (256,), generator=_g)


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest.py


# ---- helpers -------------------------------------------------------------------------------------------------

def mlp(out=16, seed=0, dtype=torch.float32):
    """Linear(64,128)-ReLU-Linear(128,out), the same init for the same seed, global RNG untouched."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        m = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, out))
    return m.to(dtype)


def loss_of(model, sign=1.0):
    x = X.to(next(model.parameters()).dtype)
    return sign * torch.nn.functional.cross_entropy(model(x).float(), Y)


def cosine(t, steps=STEPS, base=LR):
    return base * 0.5 * (1.0 + math.cos(math.pi * t / steps))


def set_lr(opt, value):
    for group in opt.param_groups:
        if torch.is_tensor(group["lr"]):
            group["lr"].fill_(value)
        else:
            group["lr"] = value


def lr_value(opt, i=0):
    lr = opt.param_groups[i]["lr"]
    return float(lr.item() if torch.is_tensor(lr) else lr)


def train(model, opt, steps=STEPS, lr_fn=None, sched=None, sign=1.0):
    """steps of full-batch training; returns (losses, lr used by each step)."""
    losses, lrs = [], []
    for t in range(steps):
        if lr_fn is not None:
            set_lr(opt, lr_fn(t))
        opt.zero_grad()
        loss = loss_of(model, sign)
        loss.backward()
        lrs.append(lr_value(opt))
        opt.step()
        if sched is not None:
            sched.step()
        losses.append(loss.item())
    return losses, lrs


def params(model):
    return [p.detach().clone() for p in model.parameters()]


def rel_diff(a, b):
    """max over params of max|a - b| / max|b|."""
    return max(((x.double() - y.double()).abs().max() / y.double().abs().max()).item() for x, y in zip(a, b))


def assert_bit_identical(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        assert x.dtype == y.dtype and x.shape == y.shape
        assert torch.equal(x, y), f"param {i}: {(x != y).sum().item()} of {x.numel()} elements differ, " \
                                  f"max |diff| {(x.double() - y.double()).abs().max().item():.3e}"


def snapshot(opt):
    """Every param, every state tensor and every step count of opt, cloned."""
    out = []
    for group in opt.param_groups:
        for p in group["params"]:
            st = opt.state.get(p, {})
            out.append((p.detach().clone(),
                        {k: (v.clone() if torch.is_tensor(v) else v) for k, v in st.items()}))
    return out


def assert_same_snapshot(a, b):
    assert len(a) == len(b)
    for (pa, sa), (pb, sb) in zip(a, b):
        assert torch.equal(pa, pb)
        assert sa.keys() == sb.keys()
        for k in sa:
            if torch.is_tensor(sa[k]):
                assert torch.equal(sa[k], sb[k]), k
            else:
                assert sa[k] == sb[k], k


def assert_states_match_torch(lb_opt, lb_model, t_opt, t_model, names=("exp_avg", "exp_avg_sq")):
    for pa, pb in zip(lb_model.parameters(), t_model.parameters()):
        sa, sb = lb_opt.state[pa], t_opt.state[pb]
        assert sa["state_kind"] == "fp32"
        assert sa["step"] == int(sb["step"].item())
        for name in names:
            assert torch.equal(sa[name + "_codes"].view_as(pb), sb[name]), name


def teacher_forced(lb_opt_fn, torch_opt_fn, out, steps=STEPS, lr_fn=None, sign=1.0):
    """lbopt trains an MLP; a torch optimizer steps a copy of its params with the same gradients every step.
    Returns (lbopt params, torch params, initial params)."""
    model = mlp(out)
    shadow = [p.detach().clone().requires_grad_(True) for p in model.parameters()]
    init = params(model)
    oa, ob = lb_opt_fn(model.parameters()), torch_opt_fn(shadow)
    for t in range(steps):
        if lr_fn is not None:
            set_lr(oa, lr_fn(t))
            set_lr(ob, lr_fn(t))
        oa.zero_grad()
        loss_of(model, sign).backward()
        for s, p in zip(shadow, model.parameters()):
            s.grad = p.grad.clone()
        oa.step()
        ob.step()
    return params(model), [s.detach() for s in shadow], init


LR_FNS = {"constant": None, "cosine": cosine}


# ---- 1. AdamW with fp32 states against torch.optim.AdamW ------------------------------------------------------

@pytest.mark.parametrize("schedule", ["constant", "cosine"])
def test_adamw_fp32_bit_identical_to_torch_fused(schedule):
    """Independent 100-step trajectories: lbopt.torch.AdamW == torch.optim.AdamW(fused=True), params, moments and
    step counts, bit for bit (16 outputs: every numel a multiple of 16)."""
    lr_fn = LR_FNS[schedule]
    ma, mb = mlp(16), mlp(16)
    init = params(ma)
    oa = lbt.AdamW(ma.parameters(), lr=LR, weight_decay=WD)
    ob = torch.optim.AdamW(mb.parameters(), lr=LR, weight_decay=WD, fused=True)
    la, lra = train(ma, oa, lr_fn=lr_fn)
    lb, lrb = train(mb, ob, lr_fn=lr_fn)
    assert lra == lrb
    assert la == lb
    assert la[-1] < la[0] - 0.5  # it trained
    assert rel_diff(params(ma), init) > 1e-2
    assert rel_diff(params(ma), params(mb)) <= REL_TOL
    assert_bit_identical(params(ma), params(mb))
    assert_states_match_torch(oa, ma, ob, mb)


@pytest.mark.parametrize("schedule", ["constant", "cosine"])
@pytest.mark.parametrize("fused", [False, True], ids=["unfused", "fused"])
def test_adamw_fp32_matches_torch_within_1e6(fused, schedule):
    """Linear(64,128)-ReLU-Linear(128,10), 100 steps, same gradients fed to both: within 1e-6 of max|p|."""
    a, b, init = teacher_forced(lambda p: lbt.AdamW(p, lr=LR, weight_decay=WD),
                                lambda p: torch.optim.AdamW(p, lr=LR, weight_decay=WD, fused=fused, foreach=False),
                                out=10, lr_fn=LR_FNS[schedule])
    assert rel_diff(a, init) > 1e-2
    assert rel_diff(a, b) <= REL_TOL


def test_torch_fused_tail_is_the_only_difference():
    """On a 10-element tensor lbopt equals torch's fused step on the same values padded to 64 elements (its
    vectorized body), and lbopt is position-invariant: the 10 elements stepped alone or inside the padded tensor
    give the same bits. torch's fused step of the unpadded tensor may differ by an ulp in its scalar tail."""
    g = torch.Generator().manual_seed(5)
    n, pad = 10, 64
    p0 = torch.randn(pad, generator=g)
    m0 = torch.randn(pad, generator=g) * 1e-3
    v0 = torch.rand(pad, generator=g) * 1e-7
    g0 = torch.randn(pad, generator=g) * 1e-3
    step = 26

    def torch_fused(k):
        p = p0[:k].clone().requires_grad_(True)
        p.grad = g0[:k].clone()
        o = torch.optim.AdamW([p], lr=LR, weight_decay=WD, fused=True)
        o.state[p] = {"step": torch.tensor(float(step)), "exp_avg": m0[:k].clone(), "exp_avg_sq": v0[:k].clone()}
        o.step()
        return p.detach()[:n], o.state[p]["exp_avg"][:n], o.state[p]["exp_avg_sq"][:n]

    def lbopt_fp32(k):
        p = p0[:k].clone().requires_grad_(True)
        p.grad = g0[:k].clone()
        o = lbt.AdamW([p], lr=LR, weight_decay=WD)
        o.state[p] = {"step": step, "state_kind": "fp32", "exp_avg_codes": m0[:k].clone(),
                      "exp_avg_sq_codes": v0[:k].clone()}
        o.step()
        assert o.state[p]["step"] == step + 1
        return p.detach()[:n], o.state[p]["exp_avg_codes"][:n], o.state[p]["exp_avg_sq_codes"][:n]

    lb_alone, lb_padded, torch_padded = lbopt_fp32(n), lbopt_fp32(pad), torch_fused(pad)
    assert_bit_identical(lb_alone, lb_padded)
    assert_bit_identical(lb_alone, torch_padded)
    torch_alone = torch_fused(n)
    for x, y in zip(lb_alone, torch_alone):  # whatever torch's tail does, it stays within an ulp or two
        assert torch.allclose(x, y, rtol=3e-7, atol=0)


# ---- 2. Adam (coupled decay), amsgrad, maximize ----------------------------------------------------------------

VARIANTS = {
    # name: (lbopt kwargs, torch class, torch kwargs, sign of the objective, moments to compare)
    "adam": (dict(adam=True), torch.optim.Adam, {}, 1.0, ("exp_avg", "exp_avg_sq")),
    "amsgrad": (dict(amsgrad=True), torch.optim.AdamW, dict(amsgrad=True), 1.0,
                ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")),
    "maximize": (dict(maximize=True), torch.optim.AdamW, dict(maximize=True), -1.0, ("exp_avg", "exp_avg_sq")),
    "adam_amsgrad_maximize": (dict(adam=True, amsgrad=True, maximize=True), torch.optim.Adam,
                              dict(amsgrad=True, maximize=True), -1.0, ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")),
}


def _variant_opts(name):
    lb_kw, tcls, t_kw, sign, moments = VARIANTS[name]

    def lb(p):
        return lbt.LowBitAdamW(p, lr=LR, weight_decay=WD, state_kind="fp32", **lb_kw)

    def tf(p, fused=True):
        return tcls(p, lr=LR, weight_decay=WD, fused=fused, foreach=False, **t_kw)

    return lb, tf, sign, moments


@pytest.mark.parametrize("variant", [
    "adam", "amsgrad", "maximize", "adam_amsgrad_maximize"])
def test_adam_variants_bit_identical_to_torch_fused(variant):
    lb, tf, sign, moments = _variant_opts(variant)
    ma, mb = mlp(16), mlp(16)
    init = params(ma)
    oa, ob = lb(ma.parameters()), tf(mb.parameters())
    la, _ = train(ma, oa, lr_fn=cosine, sign=sign)
    lb_, _ = train(mb, ob, lr_fn=cosine, sign=sign)
    assert rel_diff(params(ma), init) > 1e-2
    assert_states_match_torch(oa, ma, ob, mb, moments)
    assert_bit_identical(params(ma), params(mb))
    assert la == lb_


@pytest.mark.parametrize("fused", [False, True], ids=["unfused", "fused"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_adam_variants_match_torch_within_1e6(variant, fused):
    lb, tf, sign, _ = _variant_opts(variant)
    a, b, init = teacher_forced(lb, lambda p: tf(p, fused=fused), out=10, lr_fn=cosine, sign=sign)
    assert rel_diff(a, init) > 1e-2
    assert rel_diff(a, b) <= REL_TOL


def _adam_one_step():
    g = torch.Generator().manual_seed(9)
    p0, g0 = torch.randn(4096, generator=g), torch.randn(4096, generator=g) * 1e-3
    pa, pb = p0.clone().requires_grad_(True), p0.clone().requires_grad_(True)
    pa.grad, pb.grad = g0.clone(), g0.clone()
    oa = lbt.LowBitAdamW([pa], lr=LR, weight_decay=WD, state_kind="fp32", adam=True)
    ob = torch.optim.Adam([pb], lr=LR, weight_decay=WD, fused=True)
    oa.step()
    ob.step()
    return pa.detach(), pb.detach(), oa.state[pa]["exp_avg_codes"], ob.state[pb]["exp_avg"]


def test_adam_coupled_decay_one_step_within_an_ulp():
    p_lb, p_t, m_lb, m_t = _adam_one_step()
    assert rel_diff([p_lb], [p_t]) <= REL_TOL
    assert rel_diff([m_lb], [m_t]) <= REL_TOL


def test_adam_coupled_decay_one_step_bit_identical():
    """The minimal reproducer of the coupled-decay rounding: one step from zero states, m compared bit for bit."""
    p_lb, p_t, m_lb, m_t = _adam_one_step()
    assert torch.equal(m_lb, m_t), f"{(m_lb != m_t).sum().item()} of 4096 elements of exp_avg differ"
    assert torch.equal(p_lb, p_t)


def test_adam_coupled_decay_is_not_adamw():
    """The adam flag reaches the library: coupled and decoupled decay give different trajectories."""
    ma, mb = mlp(16), mlp(16)
    train(ma, lbt.LowBitAdamW(ma.parameters(), lr=LR, weight_decay=0.1, state_kind="fp32", adam=True), steps=5)
    train(mb, lbt.LowBitAdamW(mb.parameters(), lr=LR, weight_decay=0.1, state_kind="fp32"), steps=5)
    assert rel_diff(params(ma), params(mb)) > 1e-6


# ---- 3. lr schedulers --------------------------------------------------------------------------------------------

def _warmup_cosine(warmup, total):
    """transformers.get_cosine_schedule_with_warmup's lambda."""
    def f(step):
        if step < warmup:
            return step / max(1, warmup)
        progress = (step - warmup) / max(1, total - warmup)
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))
    return f


SCHEDULES = {
    "cosine_annealing": (LR, lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=STEPS), None),
    "cosine_annealing_tensor_lr": (torch.tensor(LR),
                                   lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=STEPS), None),
    "one_cycle": (LR, lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=LR, total_steps=STEPS), None),
    "warmup_cosine": (LR, lambda o: torch.optim.lr_scheduler.LambdaLR(o, _warmup_cosine(10, STEPS)), None),
    "tensor_lr_fill": (torch.tensor(LR), None, cosine),
    "float_lr_by_hand": (LR, None, lambda t: LR * (0.25 + 0.75 * ((t * 7919) % 101) / 100)),  # jumps
}


@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_schedules_match_torch_fused(schedule):
    lr0, make_sched, lr_fn = SCHEDULES[schedule]
    ma, mb = mlp(16), mlp(16)
    oa = lbt.AdamW(ma.parameters(), lr=lr0.clone() if torch.is_tensor(lr0) else lr0, weight_decay=WD)
    ob = torch.optim.AdamW(mb.parameters(), lr=lr0.clone() if torch.is_tensor(lr0) else lr0, weight_decay=WD,
                           fused=True)
    sa = make_sched(oa) if make_sched else None
    sb = make_sched(ob) if make_sched else None
    betas_a, betas_b = [], []
    oa.register_step_pre_hook(lambda o, *_: betas_a.append(o.param_groups[0]["betas"]))
    ob.register_step_pre_hook(lambda o, *_: betas_b.append(o.param_groups[0]["betas"]))
    la, lra = train(ma, oa, lr_fn=lr_fn, sched=sa)
    lb, lrb = train(mb, ob, lr_fn=lr_fn, sched=sb)
    assert torch.is_tensor(oa.param_groups[0]["lr"]) == torch.is_tensor(lr0)
    assert lra == lrb  # the same lr sequence, read from opt.param_groups[0]['lr']
    assert len(set(lra)) > STEPS // 2  # and it really is a schedule
    assert betas_a == betas_b
    if schedule == "one_cycle":
        assert len(set(b[0] for b in betas_a)) > STEPS // 2  # OneCycleLR cycles beta1 too, and lbopt follows
    assert la == lb
    assert_bit_identical(params(ma), params(mb))
    assert_states_match_torch(oa, ma, ob, mb)


def test_4bit_schedule_is_used_on_every_step():
    """AdamW4bit with all tensors quantized: a cosine schedule changes the trajectory, and equals a run fed the
    same lr values by hand (as floats, and as a tensor lr updated with fill_) bit for bit."""
    steps = 40

    def run(lr0=LR, sched=False, lr_fn=None):
        m = mlp(16)
        o = lbt.AdamW4bit(m.parameters(), lr=lr0, min_quant_size=0)
        s = torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=steps) if sched else None
        losses, lrs = train(m, o, steps=steps, lr_fn=lr_fn, sched=s)
        assert all(o.state[p]["state_kind"] == "4bit" for p in m.parameters())
        return params(m), snapshot(o), lrs

    sched_p, sched_s, lrs = run(sched=True)
    const_p, _, const_lrs = run()
    assert set(const_lrs) == {LR} and len(set(lrs)) == steps
    assert rel_diff(sched_p, const_p) > 1e-4
    by_hand_p, by_hand_s, by_hand_lrs = run(lr_fn=lambda t: lrs[t])
    assert by_hand_lrs == lrs
    assert_bit_identical(by_hand_p, sched_p)
    assert_same_snapshot(by_hand_s, sched_s)
    # a float64 tensor holds the double lr exactly (a float32 one would round it, in torch as in lbopt)
    tensor_p, tensor_s, _ = run(lr0=torch.tensor(LR, dtype=torch.float64), lr_fn=lambda t: lrs[t])
    assert_bit_identical(tensor_p, sched_p)
    assert_same_snapshot(tensor_s, sched_s)


# ---- 4. one C call per param group (and device and state kind) ---------------------------------------------------

@pytest.fixture
def c_calls(monkeypatch):
    """Records every lbopt_step call: kind, slot count, lr, grad_scale and found_inf values."""
    calls = []
    real = _abi.lib.lbopt_step

    def read_scalar(ptr):
        if not ptr:
            return None
        return ctypes.c_float.from_address(ptr.contents.data).value

    def wrapper(cfg, lr, slots, n, opts):
        o = opts._obj if opts is not None else None
        arr = getattr(slots, "_obj", slots)  # an array of slots, or byref(one slot)
        arr = [arr] if isinstance(arr, _abi.Slot) else arr
        calls.append({"kind": cfg._obj.state_kind, "n": n, "lr": lr,
                      "params": [arr[i].param.contents.data for i in range(n)],
                      "grad_scale": read_scalar(o.grad_scale) if o else None,
                      "found_inf": read_scalar(o.found_inf) if o else None})
        return real(cfg, lr, slots, n, opts)

    monkeypatch.setattr(_abi.lib, "lbopt_step", wrapper)
    return calls


def test_one_call_per_param_group(c_calls):
    m = mlp(16)
    w1, b1, w2, b2 = m.parameters()
    opt = lbt.AdamW4bit([{"params": [w1, b1]}, {"params": [w2, b2], "lr": 5e-4}], lr=LR, min_quant_size=0)
    assert not c_calls  # construction validates each group with lbopt_optimizer_config_validate, stepping nothing
    c_calls.clear()
    train(m, opt, steps=3)
    assert len(c_calls) == 6  # 2 per step
    for step in range(3):
        first, second = c_calls[2 * step: 2 * step + 2]
        assert (first["kind"], first["n"], first["lr"]) == (_abi.STATE_4BIT, 2, LR)
        assert (second["kind"], second["n"], second["lr"]) == (_abi.STATE_4BIT, 2, 5e-4)
        assert first["params"] == [w1.data_ptr(), b1.data_ptr()]
        assert second["params"] == [w2.data_ptr(), b2.data_ptr()]


def test_mixed_state_kinds_make_one_call_per_kind(c_calls):
    """With the default min_quant_size (4096) one group holds the 8192-element weight (4-bit) and three smaller
    tensors (fp32 states): the code makes one call per state kind, 2 per step, in the order of each kind's first
    param (4-bit for w1, then fp32 for b1, w2, b2)."""
    m = mlp(16)
    w1, b1, w2, b2 = m.parameters()
    opt = lbt.AdamW4bit(m.parameters(), lr=LR)
    c_calls.clear()
    train(m, opt, steps=2)
    assert [(c["kind"], c["n"]) for c in c_calls] == [(_abi.STATE_4BIT, 1), (_abi.STATE_FP32, 3)] * 2
    assert c_calls[0]["params"] == [w1.data_ptr()]
    assert c_calls[1]["params"] == [b1.data_ptr(), w2.data_ptr(), b2.data_ptr()]


def test_params_without_grad_are_left_out(c_calls):
    m = mlp(16)
    w1, b1, w2, b2 = m.parameters()
    opt = lbt.AdamW4bit(m.parameters(), lr=LR, min_quant_size=0)
    c_calls.clear()
    opt.zero_grad()
    loss_of(m).backward()
    b1.grad = None
    before = b1.detach().clone()
    opt.step()
    assert [(c["kind"], c["n"]) for c in c_calls] == [(_abi.STATE_4BIT, 3)]
    assert b1 not in opt.state or not opt.state[b1]
    assert torch.equal(b1.detach(), before)


def test_grouping_does_not_change_results(c_calls):
    """One group of four tensors, or four groups of one, step bit-identically (README: results do not depend on
    the grouping of tensors into calls)."""
    ma, mb = mlp(16), mlp(16)
    oa = lbt.AdamW4bit(ma.parameters(), lr=LR, min_quant_size=0)
    ob = lbt.AdamW4bit([{"params": [p]} for p in mb.parameters()], lr=LR, min_quant_size=0)
    c_calls.clear()
    train(ma, oa, steps=10, lr_fn=lambda t: cosine(t, 10))
    assert len(c_calls) == 10
    c_calls.clear()
    train(mb, ob, steps=10, lr_fn=lambda t: cosine(t, 10))
    assert len(c_calls) == 40
    assert_same_snapshot(snapshot(oa), snapshot(ob))


def test_thread_count_does_not_change_results():
    """README: bit-identical whatever the thread count (8192-element 4-bit tensor: 64 blocks to share out)."""
    out = []
    prev = lbopt.get_num_threads()
    try:
        for threads in (1, 2, 3):
            lbopt.set_num_threads(threads)
            assert lbopt.get_num_threads() == threads
            m = mlp(16)
            o = lbt.AdamW4bit(m.parameters(), lr=LR, min_quant_size=0)
            train(m, o, steps=5)
            out.append(snapshot(o))
    finally:
        lbopt.set_num_threads(prev)
    assert_same_snapshot(out[0], out[1])
    assert_same_snapshot(out[0], out[2])


# ---- 5. min_quant_size, keep_fp32, fp32_state -----------------------------------------------------------------

def _named(shapes):
    g = torch.Generator().manual_seed(3)
    return [(name, torch.nn.Parameter(torch.randn(*shape, generator=g))) for name, shape in shapes]


SHAPES = [("small", (4095,)), ("exact", (64, 64)), ("odd", (4097,)), ("tiny", (3, 100))]


def _step_once(opt, named):
    for _, p in named:
        p.grad = torch.full_like(p, 0.5)
    opt.step()


def _check_state(st, numel, kind, amsgrad=False):
    block = {"4bit": 128, "8bit": 256, "fp8": 256}
    moments = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq") if amsgrad else ("exp_avg", "exp_avg_sq")
    assert st["state_kind"] == kind
    assert st["step"] == 1
    expected_keys = {"step", "state_kind"} | {m + "_codes" for m in moments}
    if kind != "fp32":
        expected_keys |= {m + "_scales" for m in moments}
    assert set(st) == expected_keys
    for mo in moments:
        codes = st[mo + "_codes"]
        if kind == "fp32":
            assert codes.dtype == torch.float32 and codes.shape == (numel,)
        else:
            assert codes.dtype == torch.uint8
            assert codes.shape == ((numel + 1) // 2 if kind == "4bit" else numel,)
            scales = st[mo + "_scales"]
            assert scales.dtype == torch.float32 and scales.shape == (-(-numel // block[kind]),)
            assert (scales > 0).all()


@pytest.mark.parametrize("kind", ["4bit", "8bit", "fp8"])
def test_min_quant_size_decides_the_state_kind(kind):
    named = _named(SHAPES)
    opt = lbt.LowBitAdamW([p for _, p in named], state_kind=kind)  # default min_quant_size 4096
    _step_once(opt, named)
    for name, p in named:
        _check_state(opt.state[p], p.numel(), kind if p.numel() >= 4096 else "fp32")
    named = _named(SHAPES)
    opt = lbt.LowBitAdamW([p for _, p in named], state_kind=kind, min_quant_size=0, amsgrad=True)
    _step_once(opt, named)
    for name, p in named:
        _check_state(opt.state[p], p.numel(), kind, amsgrad=True)
    named = _named(SHAPES)
    opt = lbt.LowBitAdamW([p for _, p in named], state_kind=kind, min_quant_size=4098)
    _step_once(opt, named)
    assert [opt.state[p]["state_kind"] for _, p in named] == ["fp32"] * 4


def test_keep_fp32_by_tensor_by_name_and_by_group():
    # by tensor
    named = _named(SHAPES)
    opt = lbt.AdamW4bit([p for _, p in named], min_quant_size=0, keep_fp32=[named[2][1]])
    _step_once(opt, named)
    assert [opt.state[p]["state_kind"] for _, p in named] == ["4bit", "4bit", "fp32", "4bit"]
    _check_state(opt.state[named[2][1]], 4097, "fp32")
    # by name, with named parameters (torch >= 2.6 keeps them in group['param_names'])
    named = _named(SHAPES)
    opt = lbt.AdamW4bit(named, min_quant_size=0, keep_fp32=["exact", "tiny"])
    assert opt.param_groups[0]["param_names"] == [n for n, _ in named]
    _step_once(opt, named)
    assert [opt.state[p]["state_kind"] for _, p in named] == ["4bit", "fp32", "4bit", "fp32"]
    # a name is only matched against named parameters
    named = _named(SHAPES)
    opt = lbt.AdamW4bit([p for _, p in named], min_quant_size=0, keep_fp32=["exact"])
    _step_once(opt, named)
    assert [opt.state[p]["state_kind"] for _, p in named] == ["4bit"] * 4
    # by group
    named = _named(SHAPES)
    opt = lbt.AdamW4bit([{"params": [p for _, p in named[:2]], "fp32_state": True},
                         {"params": [p for _, p in named[2:]]}], min_quant_size=0)
    _step_once(opt, named)
    assert [opt.state[p]["state_kind"] for _, p in named] == ["fp32", "fp32", "4bit", "4bit"]
    # named params in groups
    named = _named(SHAPES)
    opt = lbt.AdamW4bit([{"params": named[:2], "fp32_state": True}, {"params": named[2:]}], min_quant_size=0,
                        keep_fp32=["tiny"])
    _step_once(opt, named)
    assert [opt.state[p]["state_kind"] for _, p in named] == ["fp32", "fp32", "4bit", "fp32"]


def test_fp32_kept_param_steps_like_adamw_fp32():
    """A param kept in fp32 by AdamW4bit steps bit-identically to lbopt.torch.AdamW; a quantized one does not."""
    ma, mb = mlp(16), mlp(16)
    wa = list(ma.parameters())[0]
    oa = lbt.AdamW4bit(ma.parameters(), lr=LR, keep_fp32=[wa])  # everything fp32: w1 kept, the rest small
    ob = lbt.AdamW(mb.parameters(), lr=LR)
    train(ma, oa, steps=10)
    train(mb, ob, steps=10)
    assert all(oa.state[p]["state_kind"] == "fp32" for p in ma.parameters())
    assert_same_snapshot(snapshot(oa), snapshot(ob))
    mc = mlp(16)
    oc = lbt.AdamW4bit(mc.parameters(), lr=LR)
    train(mc, oc, steps=10)
    assert oc.state[list(mc.parameters())[0]]["state_kind"] == "4bit"
    assert not torch.equal(params(mc)[0], params(mb)[0])


# ---- 6. torch.amp.GradScaler ---------------------------------------------------------------------------------------

def test_declares_amp_support():
    assert lbt.LowBitAdamW._step_supports_amp_scaling is True
    assert lbt.AdamW4bit._step_supports_amp_scaling is True


@pytest.mark.parametrize("unscale_first", [False, True], ids=["scaled", "unscale_"])
def test_grad_scaler_step_equals_unscaled_step(c_calls, unscale_first):
    scale = 2.0 ** 12
    ma, mb = mlp(16), mlp(16)
    oa = lbt.AdamW4bit(ma.parameters(), lr=LR, min_quant_size=0)
    ob = lbt.AdamW4bit(mb.parameters(), lr=LR, min_quant_size=0)
    scaler = torch.amp.GradScaler("cpu", init_scale=scale, growth_interval=1000)
    c_calls.clear()
    for t in range(10):
        oa.zero_grad()
        ob.zero_grad()
        scaler.scale(loss_of(ma)).backward()
        loss_of(mb).backward()
        if t == 0:  # the scaled grads are exactly scale times the plain ones
            for pa, pb in zip(ma.parameters(), mb.parameters()):
                assert torch.equal(pa.grad, pb.grad * scale)
        if unscale_first:
            scaler.unscale_(oa)
        scaler.step(oa)
        scaler.update()
        ob.step()
    assert scaler.get_scale() == scale
    assert len(c_calls) == 20
    for c in c_calls[0::2]:  # the scaler's calls
        assert c["found_inf"] == 0.0
        assert c["grad_scale"] == (None if unscale_first else scale)
    for c in c_calls[1::2]:
        assert c["found_inf"] is None and c["grad_scale"] is None
    assert not hasattr(oa, "grad_scale") and not hasattr(oa, "found_inf")
    assert_same_snapshot(snapshot(oa), snapshot(ob))
    assert all(oa.state[p]["step"] == 10 for p in ma.parameters())


def test_grad_scaler_inf_step_writes_nothing(c_calls):
    scale = 2.0 ** 12
    m = mlp(16)
    opt = lbt.AdamW4bit(m.parameters(), lr=LR, min_quant_size=0)
    scaler = torch.amp.GradScaler("cpu", init_scale=scale, growth_interval=1000)

    def scaled_backward():
        opt.zero_grad()
        scaler.scale(loss_of(m)).backward()

    for _ in range(3):
        scaled_backward()
        scaler.step(opt)
        scaler.update()
    before = snapshot(opt)
    assert all(s["step"] == 3 for _, s in before)
    scaled_backward()
    list(m.parameters())[2].grad[3, 5] = float("inf")
    c_calls.clear()
    scaler.step(opt)
    assert len(c_calls) == 1 and c_calls[0]["found_inf"] != 0.0 and c_calls[0]["grad_scale"] == scale
    assert_same_snapshot(snapshot(opt), before)  # params, every state tensor and step counts untouched
    scaler.update()
    assert scaler.get_scale() == scale / 2  # the scaler saw the overflow
    scaled_backward()
    scaler.step(opt)
    scaler.update()
    after = snapshot(opt)
    assert all(s["step"] == 4 for _, s in after)
    assert all(not torch.equal(pa, pb) for (pa, _), (pb, _) in zip(after, before))


# ---- 7. skip_nonfinite ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("min_quant_size", [0, 4096], ids=["4bit", "mixed"])
def test_skip_nonfinite_leaves_that_param_untouched(bad, min_quant_size):
    ma, mb = mlp(16), mlp(16)
    oa = lbt.AdamW4bit(ma.parameters(), lr=LR, min_quant_size=min_quant_size, skip_nonfinite=True)
    ob = lbt.AdamW4bit(mb.parameters(), lr=LR, min_quant_size=min_quant_size, skip_nonfinite=True)
    train(ma, oa, steps=3)
    train(mb, ob, steps=3)
    for victim in (0, 2):  # the 4-bit w1 (8192) and w2 (2048: fp32 states when min_quant_size=4096)
        oa.zero_grad()
        ob.zero_grad()
        loss_of(ma).backward()
        loss_of(mb).backward()
        pa, pb = list(ma.parameters())[victim], list(mb.parameters())[victim]
        pa.grad[1, 7] = bad
        pb.grad = None  # the reference: that param simply does not step
        before = snapshot(oa)
        oa.step()
        ob.step()
        after = snapshot(oa)
        for i, ((p0, s0), (p1, s1)) in enumerate(zip(before, after)):
            if i == victim:
                assert torch.equal(p0, p1)
                assert_same_snapshot([(p0, s0)], [(p1, s1)])
            else:
                assert s1["step"] == s0["step"] + 1
                assert not torch.equal(p0, p1)
        assert_same_snapshot(after, snapshot(ob))
    assert [oa.state[p]["step"] for p in ma.parameters()] == [4, 5, 4, 5]


# ---- 8. bfloat16 params -------------------------------------------------------------------------------------------

def _bf16_run(grad_dtype, sr, seed=0, steps=50, kind_cls=lbt.AdamW4bit):
    m = mlp(16, dtype=torch.bfloat16)
    for p in m.parameters():
        p.grad_dtype = grad_dtype  # torch >= 2.9: fp32 grads for bf16 params
    opt = kind_cls(m.parameters(), lr=3e-3, min_quant_size=0, bf16_stochastic_round=sr, seed=seed)
    losses, _ = train(m, opt, steps=steps)
    for p in m.parameters():
        assert p.dtype == torch.bfloat16 and p.grad.dtype == grad_dtype
    return losses, params(m)


@pytest.mark.skipif(not hasattr(torch.Tensor, "grad_dtype"), reason="fp32 grads of bf16 params need Tensor.grad_dtype")
@pytest.mark.parametrize("sr", [False, True], ids=["nearest", "stochastic"])
@pytest.mark.parametrize("grad_dtype", [torch.float32, torch.bfloat16], ids=["fp32_grads", "bf16_grads"])
def test_bf16_params_train(grad_dtype, sr):
    losses, _ = _bf16_run(grad_dtype, sr)
    assert all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0] - 0.5, (losses[0], losses[-1])
    assert sum(losses[-5:]) < sum(losses[:5])


@pytest.mark.skipif(not hasattr(torch.Tensor, "grad_dtype"), reason="fp32 grads of bf16 params need Tensor.grad_dtype")
def test_bf16_stochastic_round_reproducible():
    _, a = _bf16_run(torch.float32, True, seed=7, steps=10)
    _, b = _bf16_run(torch.float32, True, seed=7, steps=10)
    _, c = _bf16_run(torch.float32, True, seed=8, steps=10)
    _, d = _bf16_run(torch.float32, False, seed=7, steps=10)
    _, e = _bf16_run(torch.float32, False, seed=8, steps=10)
    assert_bit_identical(a, b)
    assert any(not torch.equal(x, y) for x, y in zip(a, c))
    assert any(not torch.equal(x, y) for x, y in zip(a, d))
    assert_bit_identical(d, e)  # the seed only matters to stochastic rounding


@pytest.mark.parametrize("sr", [False, True], ids=["nearest", "stochastic"])
def test_bf16_stochastic_round_keeps_small_updates(sr):
    """An Adam update of a quarter bf16 ulp: nearest rounding loses it every step, stochastic rounding keeps it in
    expectation (4096 params at 1.0, constant grad, 100 steps of lr 1e-3: mean 0.9)."""
    p = torch.nn.Parameter(torch.ones(4096, dtype=torch.bfloat16))
    opt = lbt.AdamW4bit([p], lr=1e-3, weight_decay=0.0, bf16_stochastic_round=sr, seed=3)
    for _ in range(100):
        p.grad = torch.ones_like(p)
        opt.step()
    if sr:
        assert abs(p.float().mean().item() - 0.9) < 2e-3
        assert len(p.unique()) > 1
    else:
        assert torch.equal(p.detach(), torch.ones_like(p))


# ---- 9. changes to opt.state reach the library ------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["fp32", "4bit"])
def test_cleared_state_steps_like_a_fresh_optimizer(kind):
    """opt.state.clear() (resetting an optimizer, as torch.optim allows) must give the step of a fresh optimizer."""
    ma, mb = mlp(16), mlp(16)
    oa = lbt.LowBitAdamW(ma.parameters(), lr=LR, state_kind=kind, min_quant_size=0)
    train(ma, oa, steps=3)
    with torch.no_grad():
        for pa, pb in zip(ma.parameters(), mb.parameters()):
            pb.copy_(pa)
    oa.state.clear()
    ob = lbt.LowBitAdamW(mb.parameters(), lr=LR, state_kind=kind, min_quant_size=0)
    train(ma, oa, steps=1)
    train(mb, ob, steps=1)
    assert_same_snapshot(snapshot(oa), snapshot(ob))


@pytest.mark.parametrize("kind", ["fp32", "4bit"])
def test_replaced_state_tensors_are_the_ones_stepped(kind):
    """State tensors swapped for copies (moved, cloned, loaded by hand) are the ones the next step updates."""
    ma, mb = mlp(16), mlp(16)
    oa = lbt.LowBitAdamW(ma.parameters(), lr=LR, state_kind=kind, min_quant_size=0)
    ob = lbt.LowBitAdamW(mb.parameters(), lr=LR, state_kind=kind, min_quant_size=0)
    train(ma, oa, steps=3)
    train(mb, ob, steps=3)
    for st in oa.state.values():
        for k in [k for k in st if torch.is_tensor(st[k])]:
            st[k] = st[k].clone()
    train(ma, oa, steps=2)
    train(mb, ob, steps=2)
    assert_same_snapshot(snapshot(oa), snapshot(ob))

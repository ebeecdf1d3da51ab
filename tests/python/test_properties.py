"""Property-based tests of the Python layer (Hypothesis): random shapes, dtypes, layouts, groups, hyper-parameters
and state dicts into lbopt.torch and lbopt.functional. The properties:

* a call either succeeds or raises ValueError or TypeError (the documented errors) and changes nothing: params,
  grads and states byte for byte as they were; never a crash;
* fp32 states of AdamW and Adam step as torch.optim's fused AdamW does (bit for bit where every tensor's size is a
  multiple of 16, as test_torch_parity explains; within 1e-6 of the largest param elsewhere);
* a damaged state dict either loads or is refused with ValueError or TypeError and changes nothing.

The examples are derandomized, so that every run tries the same ones (a failure prints the example that failed).
"""
import math

import numpy as np
import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

import lbopt.functional as F  # noqa: E402
import lbopt.torch as lbt  # noqa: E402

SETTINGS = settings(max_examples=80, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
OPTIMIZERS = ["adamw", "sgd", "lion", "ademamix"]
KINDS = ["4bit", "8bit", "fp8", "fp32"]
CLASSES = {"adamw": "AdamW", "sgd": "SGD", "lion": "Lion", "ademamix": "AdEMAMix"}
KIND_SUFFIX = {"4bit": "4bit", "8bit": "8bit", "fp8": "Fp8", "fp32": ""}
ERRORS = (ValueError, TypeError)


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest.py


# Numbers a caller may pass: ordinary ones, and the edges and non-numbers that must be refused or handled.
EDGES = [0.0, -0.0, 1.0, -1.0, 1e-12, 1e300, -1e-3, float("nan"), float("inf"), float("-inf"), 0.999999, 2.0]
reals = st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=64), st.sampled_from(EDGES))
small_reals = st.one_of(st.floats(0.0, 0.2), st.sampled_from(EDGES))
betas = st.one_of(st.floats(0.0, 0.9999), st.sampled_from(EDGES))
shapes = st.lists(st.integers(0, 40), min_size=0, max_size=3).map(tuple)


def _option_values(optimizer):
    """Hyper-parameters of an optimizer, each present or not, valid or not."""
    common = {"weight_decay": small_reals}
    per = {
        "adamw": {"betas": st.tuples(betas, betas), "eps": small_reals, "amsgrad": st.booleans()},
        "sgd": {"momentum": betas, "dampening": betas, "nesterov": st.booleans()},
        "lion": {"betas": st.tuples(betas, betas)},
        "ademamix": {"betas": st.tuples(betas, betas, betas), "alpha": reals, "eps": small_reals},
    }[optimizer]
    return st.fixed_dictionaries({}, optional={**common, **per})


def _snapshot(tensors):
    return [t.detach().clone() for t in tensors]


def _same(before, after):
    """Tensors equal byte for byte (NaNs and signed zeros alike)."""
    def raw(t):
        return t.detach().reshape(-1).view(torch.uint8) if t.numel() else t
    return all(a.dtype == b.dtype and a.shape == b.shape and torch.equal(raw(a), raw(b)) for a, b in zip(before, after))


def _state_tensors(opt):
    return [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]


def _states_by_param(opt, params):
    return [{k: v.detach().clone() for k, v in opt.state[p].items() if torch.is_tensor(v)} if p in opt.state else {}
            for p in params]


@st.composite
def torch_cases(draw):
    optimizer = draw(st.sampled_from(OPTIMIZERS))
    kind = draw(st.sampled_from(KINDS))
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16, torch.float16]))
    params = []
    for shape in draw(st.lists(shapes, min_size=1, max_size=3)):
        t = torch.randn(shape, generator=torch.Generator().manual_seed(draw(st.integers(0, 99))), dtype=torch.float32)
        if t.dim() >= 2 and draw(st.booleans()):
            t = t.transpose(0, 1).contiguous().transpose(0, 1)  # another memory order
        params.append(torch.nn.Parameter(t.to(dtype)))
    grads = []
    for p in params:
        g = draw(st.sampled_from(["normal", "none", "nan", "zero"]))
        grads.append(None if g == "none" else
                     torch.full_like(p, float("nan")) if g == "nan" and p.numel() else
                     torch.zeros_like(p) if g == "zero" else torch.randn_like(p))
    options = draw(_option_values(optimizer))
    lr = draw(st.one_of(st.floats(0, 0.1), reals))
    steps = draw(st.integers(1, 3))
    min_quant = draw(st.sampled_from([0, 64, 4096]))
    # what a scheduler or user code sets in the param group after the optimizer was made, checked at the step
    later = draw(st.fixed_dictionaries({}, optional={"lr": reals, "weight_decay": small_reals}))
    return optimizer, kind, params, grads, options, lr, steps, min_quant, later


@SETTINGS
@given(torch_cases())
def test_lbopt_torch_steps_or_refuses_and_changes_nothing(case):
    optimizer, kind, params, grads, options, lr, steps, min_quant, later = case
    cls = getattr(lbt, CLASSES[optimizer] + KIND_SUFFIX[kind])
    try:
        opt = cls(params, lr=lr, min_quant_size=min_quant, **options)
    except ERRORS:
        return
    for p, g in zip(params, grads):
        p.grad = g
    for t in range(steps):
        if t == 1:
            opt.param_groups[0].update(later)
        params_before, states_before = _snapshot(params), _states_by_param(opt, params)
        try:
            opt.step()
        except ERRORS:
            assert _same(params_before, params), "a refused step changed a param"
            for p, saved in zip(params, states_before):
                now = [opt.state[p][k] for k in saved]
                assert _same(list(saved.values()), now), "a refused step changed a state"
            return


@st.composite
def functional_cases(draw):
    optimizer = draw(st.sampled_from(OPTIMIZERS))
    kind = draw(st.sampled_from(KINDS))
    n = draw(st.integers(0, 700))
    p = np.random.default_rng(draw(st.integers(0, 99))).standard_normal(n).astype(np.float32)
    grad_form = draw(st.sampled_from(["ok", "short", "float64", "nan"]))
    g = {"ok": np.ones_like(p), "short": np.ones(max(n - 1, 0), np.float32), "float64": np.ones(n),
         "nan": np.full_like(p, np.nan)}[grad_form]
    options = draw(_option_values(optimizer))
    options.pop("betas", None)  # functional takes beta1, beta2, beta3
    for i, b in enumerate(draw(st.lists(betas, max_size=3))):
        options[f"beta{i + 1}"] = b
    state_kind = draw(st.sampled_from(KINDS))  # the states' own kind: another one than the step's must be refused
    names = F.state_names(optimizer, **{k: v for k, v in options.items() if k in ("amsgrad",)}) \
        if optimizer != "sgd" else (("momentum_buffer", "m"),)
    state_numel = n + draw(st.sampled_from([0, 0, 0, 1, -1])) if n else n
    states = {name: F.zeros_state(state_kind, max(state_numel, 0)) for name, _ in names}
    lr = draw(st.one_of(st.floats(0, 0.1), reals))
    step = draw(st.one_of(st.integers(1, 5), st.sampled_from([0, -1, 2 ** 40, 2 ** 63 - 1])))
    return optimizer, kind, p, g, states, options, lr, step


@SETTINGS
@given(functional_cases())
def test_lbopt_functional_steps_or_refuses_and_changes_nothing(case):
    optimizer, kind, p, g, states, options, lr, step = case
    arrays = [p, g] + [a for s in states.values() for a in s.values() if a is not None]
    before = [a.copy() for a in arrays]
    try:
        F.step(optimizer, [p], [g], [states], lr=lr, steps=[step], kind=kind, **options)
    except ERRORS:
        for a, b in zip(before, arrays):
            assert a.tobytes() == b.tobytes(), "a refused step changed an array"
        return
    assert g.tobytes() == before[1].tobytes(), "a step changed the gradient"


@st.composite
def adam_cases(draw):
    shapes_ = draw(st.lists(st.one_of(st.tuples(st.integers(1, 8).map(lambda k: 16 * k)),
                                      st.tuples(st.integers(1, 40), st.integers(1, 40))), min_size=1, max_size=3))
    options = {"betas": (draw(st.floats(0.0, 0.99)), draw(st.floats(0.0, 0.9999))),
               "eps": draw(st.floats(1e-10, 1e-3)), "weight_decay": draw(st.floats(0.0, 0.1)),
               "amsgrad": draw(st.booleans()), "maximize": draw(st.booleans())}
    lrs = draw(st.lists(st.floats(1e-5, 1e-1), min_size=1, max_size=4))
    adam = draw(st.booleans())
    return shapes_, options, lrs, adam, draw(st.integers(0, 999))


@settings(SETTINGS, max_examples=40)
@given(adam_cases())
def test_fp32_adamw_and_adam_step_as_torch_fused(case):
    shapes_, options, lrs, adam, seed = case
    gen = torch.Generator().manual_seed(seed)
    ours = [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in shapes_]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    ref_cls = torch.optim.Adam if adam else torch.optim.AdamW
    opt = lbt.LowBitAdamW(ours, lr=lrs[0], state_kind="fp32", adam=adam, **options)
    ref = ref_cls(theirs, lr=lrs[0], fused=True, **options)
    for lr in lrs:
        grads = [torch.randn(p.shape, generator=gen) for p in ours]
        for o, params in ((opt, ours), (ref, theirs)):
            o.param_groups[0]["lr"] = lr
            for p, g in zip(params, grads):
                p.grad = g.clone()
            o.step()
    for a, b in zip(ours, theirs):
        if a.numel() % 16 == 0:
            assert torch.equal(a, b), f"shape {tuple(a.shape)}: not torch's fused step bit for bit"
        else:
            scale = max(b.abs().max().item(), 1e-30)
            assert (a - b).abs().max().item() <= 1e-6 * scale


# Damage to one saved state: which key, and what it becomes.
DAMAGE = st.sampled_from(["dtype", "shape", "nan", "negative", "huge", "list", "drop", "rename", "step"])


@settings(SETTINGS, max_examples=60)
@given(st.sampled_from(KINDS), st.sampled_from(["adamw", "lion"]), DAMAGE, st.integers(0, 5), st.integers(0, 99))
def test_damaged_state_dicts_load_or_are_refused_and_change_nothing(kind, optimizer, damage, which, seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 40), torch.nn.Tanh(), torch.nn.Linear(40, 3))
    cls = getattr(lbt, CLASSES[optimizer] + KIND_SUFFIX[kind])
    opt = cls(model.parameters(), lr=1e-2, min_quant_size=0)
    for _ in range(2):
        model(torch.randn(4, 8)).square().sum().backward()
        opt.step()
    sd = opt.state_dict()
    entry = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in sd["state"][which % 4].items()}
    keys = sorted(k for k in entry if k.endswith(("_codes", "_scales")))
    key = keys[seed % len(keys)]
    value = entry[key]
    if damage == "dtype":
        entry[key] = value.to(torch.float64 if value.dtype == torch.uint8 else torch.int32)
    elif damage == "shape":
        entry[key] = value.reshape(-1)[:-1] if value.numel() > 1 else value.reshape(-1).repeat(2)
    elif damage in ("nan", "negative", "huge"):
        fill = {"nan": float("nan"), "negative": -1.0, "huge": 3e38}[damage]
        if value.is_floating_point():
            value.view(-1)[seed % value.numel()] = fill
        else:
            value.view(-1)[seed % value.numel()] = 255
    elif damage == "list":
        entry[key] = value.tolist()
    elif damage == "drop":
        del entry[key]
    elif damage == "rename":
        entry[key + "_old"] = entry.pop(key)
    else:
        entry["step"] = [-1, 2 ** 60, float("nan"), "2", None][seed % 5]
    sd["state"][which % 4] = entry
    before = _state_tensors(opt)
    before = _snapshot(before)
    try:
        opt.load_state_dict(sd)
    except ERRORS:
        assert _same(before, _state_tensors(opt)), "a refused load changed a state"
        return
    # what loaded is what the state dict held: saved again, the entry comes back as it was given (but for a NaN
    # past a row's last block in a scales table, lbopt 0.3's filler, which comes back 0)
    again = opt.state_dict()["state"][which % 4]
    assert again.keys() == entry.keys()
    for k, v in entry.items():
        if k.endswith("_scales"):
            v = torch.nan_to_num(v, nan=0.0)
        assert _same([v], [again[k]]) if torch.is_tensor(v) else v == again[k], f"{k} loaded as another value"
    model(torch.randn(4, 8)).square().sum().backward()
    opt.step()


# ---- lbopt.jax -------------------------------------------------------------------------------------------------

JAX_ARGS = {
    "adamw": {"b1": betas, "b2": betas, "eps": small_reals, "weight_decay": small_reals},
    "adam": {"b1": betas, "b2": betas, "eps": small_reals},
    "sgd": {"momentum": st.one_of(st.none(), betas), "nesterov": st.booleans()},
    "lion": {"b1": betas, "b2": betas, "weight_decay": small_reals},
    "ademamix": {"b1": betas, "b2": betas, "b3": betas, "alpha": reals, "eps": small_reals},
}


@settings(SETTINGS, max_examples=25)
@given(st.sampled_from(sorted(JAX_ARGS)), st.sampled_from(KINDS), st.data())
def test_lbopt_jax_steps_as_optax_or_refuses(name, kind, data):
    """Random hyper-parameters into lbopt.jax's optax transformations: refused with ValueError or TypeError when
    made (or at init), else a step whose updates have the params' structure and dtypes, and, with fp32 states,
    equal optax's own transformation's (within 1e-5 of the largest, and the params' rounding)."""
    jax = pytest.importorskip("jax")
    optax = pytest.importorskip("optax")
    jnp = jax.numpy
    lj = pytest.importorskip("lbopt.jax", reason="lbopt was built without the JAX FFI handler")
    options = data.draw(st.fixed_dictionaries({}, optional=JAX_ARGS[name]))
    lr = data.draw(st.one_of(st.floats(0, 0.1), reals))
    grad = data.draw(st.sampled_from(["normal", "nan"]))
    rng = np.random.default_rng(data.draw(st.integers(0, 99)))
    params = {"w": jnp.asarray(rng.standard_normal((8, 12)), jnp.float32),
              "b": jnp.asarray(rng.standard_normal(12), jnp.float32)}
    grads = jax.tree_util.tree_map(lambda p: jnp.full_like(p, jnp.nan) if grad == "nan" else p * 0.5 + 0.1, params)
    try:
        tx = getattr(lj, name)(lr, **options, state_kind=kind, min_quant_size=0)
        state = tx.init(params)
    except ERRORS:
        return
    updates, _ = tx.update(grads, state, params)
    assert jax.tree_util.tree_structure(updates) == jax.tree_util.tree_structure(params)
    assert all(u.dtype == p.dtype and u.shape == p.shape
               for u, p in zip(jax.tree_util.tree_leaves(updates), jax.tree_util.tree_leaves(params)))
    if kind != "fp32" or grad == "nan" or not math.isfinite(lr):
        return
    twin = {"ademamix": lambda: pytest.importorskip("optax.contrib").ademamix}.get(name, lambda: getattr(optax, name))()
    try:
        ref_tx = twin(lr, **options)
        ref, _ = ref_tx.update(grads, ref_tx.init(params), params)
    except Exception:  # optax takes what lbopt refuses (it checks nothing): no reference
        return
    # lbopt.jax steps the params in place and returns the difference, which float32 rounds to the params' ulps
    for a, b, p in zip(*map(jax.tree_util.tree_leaves, (updates, ref, params))):
        a, b, p = np.asarray(a), np.asarray(b), np.asarray(p)
        if np.isfinite(b).all():
            tol = 1e-5 * np.abs(b).max() + 4 * np.finfo(np.float32).eps * np.abs(p).max()
            assert np.abs(a - b).max() <= tol, f"{name}: not optax's update"

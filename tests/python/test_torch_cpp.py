"""lbopt::torch's C++ optimizers (bindings/cpp/lbopt/torch.hpp) against lbopt.torch's, bit for bit: the same init,
grads and changing lr sequence stepped by a Python class and by its C++ namesake (torch_optim_host replay, built
next to the library where libtorch is found; LBOPT_TORCH_OPTIM_HOST names another build of it) give equal params
and states (codes, scales, step counts), for every class, with defaults and with their settings and flags on. Muon's
classes run their Newton-Schulz iteration, lr adjustment and weight decay in torch on both sides (2-D params only)."""
import os
import pathlib
import subprocess

import pytest
import torch
import torch.jit._pickle

import lbopt.torch as lt
from lbopt.functional import KINDS

FAMILIES = {
    "AdamW": ["AdamW4bit", "AdamW8bit", "AdamWFp8", "AdamW"],
    "Adam": ["Adam4bit", "Adam8bit", "AdamFp8"],
    "SGD": ["SGD4bit", "SGD8bit", "SGDFp8", "SGD"],
    "Lion": ["Lion4bit", "Lion8bit", "LionFp8", "Lion"],
    "AdEMAMix": ["AdEMAMix4bit", "AdEMAMix8bit", "AdEMAMixFp8", "AdEMAMix"],
}
CLASSES = [(family, name) for family, names in FAMILIES.items() for name in names]
MUON = ["Muon4bit", "Muon8bit", "MuonFp8", "Muon"]
# Matrices only, one of them tall (the iteration runs on its transpose); large enough for the first 4-bit block.
MUON_SHAPES = [(64, 72), (129, 3)]

# Each family's settings turned away from their defaults (lbopt.torch's keyword arguments).
SETTINGS = {
    "AdamW": dict(betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1, amsgrad=True),
    "Adam": dict(betas=(0.85, 0.995), weight_decay=0.05, amsgrad=True),
    "SGD": dict(momentum=0.9, nesterov=True, weight_decay=0.01),
    "Lion": dict(betas=(0.95, 0.98), weight_decay=0.1),
    "AdEMAMix": dict(betas=(0.8, 0.99, 0.999), alpha=3.0, t_alpha=4, t_beta3=4, weight_decay=0.05),
}
MUON_SETTINGS = dict(weight_decay=0.05, momentum=0.9, nesterov=False, ns_steps=4, eps=1e-5,
                     adjust_lr_fn="match_rms_adamw", ns_coefficients=(3.0, -4.0, 1.5))
# The flags every optimizer reads, and the seed that keys their stochastic rounding.
FLAGS = dict(maximize=True, bf16_stochastic_round=True, state_stochastic_round=False, seed=12345)
MUON_FLAGS = {k: v for k, v in FLAGS.items() if k != "bf16_stochastic_round"}  # torch rounds Muon's params
LRS = [1e-2, 2e-2, 5e-3, 1.5e-2, 8e-3, 1.2e-2, 3e-3]
# torch::pickle_save writes typed dicts and lists with these, which torch.load's weights_only refuses by default
_PICKLE_BUILDERS = [torch.jit._pickle.restore_type_tag, torch.jit._pickle.build_tensorlist,
                    torch.jit._pickle.build_intlist]


def _host():
    path = os.environ.get("LBOPT_TORCH_OPTIM_HOST")
    if not path:
        library = os.environ.get("LBOPT_LIBRARY")
        if not library:
            pytest.skip("LBOPT_LIBRARY is not set: torch_optim_host is found next to the library")
        path = pathlib.Path(library).parent / "tests" / "torch_optim_host"
    if not pathlib.Path(path).is_file():
        pytest.skip(f"{path} is not built (a build with libtorch and tests makes it)")
    return path


def cpp_options(kwargs):
    """lbopt.torch's keyword arguments as the library's option names, which lbopt::torch::Options take."""
    out = {}
    for key, value in kwargs.items():
        if key == "betas":
            out.update({f"beta{i + 1}": float(b) for i, b in enumerate(value)})
        elif key == "ns_coefficients":
            out.update({f"ns_{c}": float(x) for c, x in zip("abc", value)})
        elif isinstance(value, str):  # Muon's adjust_lr_fn
            out[key] = value
        elif key == "state_stochastic_round":
            out["state_stochastic_round" if value else "state_nearest_round"] = 1.0
        elif key in ("seed", "min_quant_size"):
            out[key] = int(value)
        else:
            out[key] = float(value)
    return out


def make_run(shapes, dtype=torch.float32, steps=6, seed=0, holes=(), nonfinite=()):
    """Initial params and per-step grads: None at (step, param) in holes, a NaN at those in nonfinite."""
    g = torch.Generator().manual_seed(seed)
    params = [torch.randn(s, generator=g).to(dtype) for s in shapes]
    grads = []
    for k in range(steps):
        row = []
        for i, p in enumerate(params):
            grad = torch.randn(p.shape, generator=g).to(dtype)
            if (k, i) in nonfinite:
                grad.view(-1)[7] = float("nan")
            row.append(None if (k, i) in holes else grad)
        grads.append(row)
    return params, grads


def run_python(name, params, grads, lrs, kwargs, groups):
    params = [p.clone() for p in params]
    arg = params if groups is None else [{"params": [params[i] for i in g["params"]], **g["options"]} for g in groups]
    opt = getattr(lt, name)(arg, lr=lrs[0], **kwargs)
    for row, lr in zip(grads, lrs):
        for p, grad in zip(params, row):
            p.grad = None if grad is None else grad.clone()
        for group in opt.param_groups:
            group["lr"] = lr
        opt.step()
    return params, [opt.state.get(p) for p in params]


def run_cpp(tmp_path, name, params, grads, lrs, kwargs, groups):
    run = {"class": name, "params": params, "grads": grads, "lrs": lrs, "options": cpp_options(kwargs)}
    if groups is not None:
        run["groups"] = [{"params": g["params"], "options": cpp_options(g["options"])} for g in groups]
    src, dst = tmp_path / "run.pt", tmp_path / "out.pt"
    torch.save(run, src)
    done = subprocess.run([str(_host()), "replay", str(src), str(dst)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    with torch.serialization.safe_globals(_PICKLE_BUILDERS):
        out = torch.load(dst)
    return out["params"], out["states"]


def assert_same(python, cpp):
    (py_params, py_states), (cpp_params, cpp_states) = python, cpp
    assert len(py_params) == len(cpp_params)
    for i, (a, b) in enumerate(zip(py_params, cpp_params)):
        assert a.dtype == b.dtype and torch.equal(a, b), f"param {i} differs"
    for i, (a, b) in enumerate(zip(py_states, cpp_states)):
        assert (a is None) == (b is None), f"param {i}: a state on one side only"
        if a is None:
            continue
        assert a["step"] == b["step"] and KINDS[a["state_kind"]] == b["state_kind"], f"param {i}: step or kind"
        assert list(a.get("dim_order", ())) == list(b.get("dim_order", ())), f"param {i}: memory order"
        keys = {k for k in a if k.endswith(("_codes", "_scales"))}
        assert keys == set(b) - {"step", "state_kind", "dim_order"}, f"param {i}: states {sorted(keys)} vs {sorted(b)}"
        for k in keys:
            assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), f"param {i}: {k} differs"


def check(tmp_path, name, params, grads, kwargs, lrs=LRS, groups=None):
    lrs = lrs[:len(grads)]
    python = run_python(name, params, grads, lrs, kwargs, groups)
    assert_same(python, run_cpp(tmp_path, name, params, grads, lrs, kwargs, groups))
    return python


def scaled(family, lrs=LRS):
    return [lr * 0.1 for lr in lrs] if family == "Lion" else lrs  # Lion steps by lr * sign


@pytest.fixture(autouse=True)
def _needs_host():
    _host()


@pytest.mark.parametrize("family,name", CLASSES, ids=[n for _, n in CLASSES])
def test_defaults(tmp_path, family, name):
    params, grads = make_run([(257,), (3, 129)])
    py_params, _ = check(tmp_path, name, params, grads, dict(min_quant_size=0), lrs=scaled(family))
    assert not torch.equal(py_params[0], params[0])


@pytest.mark.parametrize("family,name", CLASSES, ids=[n for _, n in CLASSES])
def test_settings_and_flags_bf16(tmp_path, family, name):
    params, grads = make_run([(257,), (3, 129)], dtype=torch.bfloat16, steps=7, seed=1)
    check(tmp_path, name, params, grads, dict(SETTINGS[family], **FLAGS, min_quant_size=0), lrs=scaled(family))


@pytest.mark.parametrize("name", ["AdamW4bit", "SGD8bit", "LionFp8", "AdEMAMix4bit", "AdamW"])
def test_skipped_and_missing_grads_count_no_step(tmp_path, name):
    """skip_nonfinite leaves a param with a NaN grad and its states untouched and holds its step count back, as a
    param without a grad; a param skipped on its first step keeps zero states."""
    family = next(f for f, names in FAMILIES.items() if name in names)
    params, grads = make_run([(257,), (3, 129), (129,)], seed=2, holes={(1, 0), (2, 2)},
                             nonfinite={(0, 1), (3, 0)})
    kwargs = dict(SETTINGS[family], skip_nonfinite=True, min_quant_size=0)
    _, states = check(tmp_path, name, params, grads, kwargs, lrs=scaled(family))
    assert [s["step"] for s in states] == [4, 5, 5]


@pytest.mark.parametrize("name", ["AdamW4bit", "Lion8bit", "AdEMAMixFp8"])
def test_small_params_keep_fp32_states(tmp_path, name):
    """With the default min_quant_size a group's large param gets the class's states, its small ones fp32: two
    library calls in one group."""
    family = next(f for f, names in FAMILIES.items() if name in names)
    params, grads = make_run([(40, 103), (257,)], seed=3)
    _, states = check(tmp_path, name, params, grads, {}, lrs=scaled(family))
    assert states[1]["state_kind"] == "fp32" and states[0]["state_kind"] != "fp32"


@pytest.mark.parametrize("name", ["AdamW8bit", "SGD4bit", "AdEMAMix4bit"])
def test_param_groups(tmp_path, name):
    """Groups with their own settings, the others from the optimizer's."""
    family = next(f for f, names in FAMILIES.items() if name in names)
    params, grads = make_run([(257,), (3, 129), (64,)], seed=4)
    own = dict(weight_decay=0.2, momentum=0.5) if family == "SGD" else dict(weight_decay=0.2)
    groups = [{"params": [0, 2], "options": {}}, {"params": [1], "options": own}]
    check(tmp_path, name, params, grads, dict(SETTINGS[family], min_quant_size=0), groups=groups)


@pytest.mark.parametrize("name", ["AdamW4bit", "SGDFp8", "AdEMAMix8bit"])
def test_params_in_other_memory_orders(tmp_path, name):
    """A transposed and a channels_last param: the states follow each param's memory order (dim_order), and the
    row-major grads are copied into the params' layouts first."""
    family = next(f for f, names in FAMILIES.items() if name in names)
    params, grads = make_run([(129, 3), (2, 3, 5, 7)], seed=5)
    params = [params[0].t(), params[1].to(memory_format=torch.channels_last)]
    grads = [[g[0].t().contiguous(), g[1]] for g in grads]
    _, states = check(tmp_path, name, params, grads, dict(SETTINGS[family], min_quant_size=0))
    assert states[0]["dim_order"] == (1, 0) and states[1]["dim_order"] == (0, 2, 3, 1)


@pytest.mark.parametrize("name", MUON)
def test_muon_defaults(tmp_path, name):
    params, grads = make_run(MUON_SHAPES, seed=6)
    py_params, _ = check(tmp_path, name, params, grads, dict(min_quant_size=0))
    assert not any(torch.equal(a, b) for a, b in zip(py_params, params))


@pytest.mark.parametrize("name", MUON)
def test_muon_settings_and_flags_bf16(tmp_path, name):
    params, grads = make_run(MUON_SHAPES, dtype=torch.bfloat16, steps=7, seed=7)
    check(tmp_path, name, params, grads, dict(MUON_SETTINGS, **MUON_FLAGS, min_quant_size=0))


@pytest.mark.parametrize("name", ["Muon4bit", "MuonFp8"])
def test_muon_param_groups_and_memory_order(tmp_path, name):
    """Groups with their own torch settings and library fields, and a transposed param: its direction and states
    follow its memory order, its row-major grads are copied into it."""
    params, grads = make_run([(64, 72), (129, 3), (40, 130)], seed=8)
    params[1] = params[1].t().contiguous().t()
    own = dict(weight_decay=0.2, momentum=0.8, adjust_lr_fn="spectral_unclamped")
    groups = [{"params": [0, 2], "options": {}}, {"params": [1], "options": own}]
    _, states = check(tmp_path, name, params, grads, dict(min_quant_size=0), groups=groups)
    assert states[1]["dim_order"] == (1, 0)

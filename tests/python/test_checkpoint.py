"""Checkpoints of lbopt.torch optimizers: plain-tensor state_dicts, torch.save / torch.load(weights_only=True),
bit-identical resumption (in this process and in a fresh one), dtype preservation, refusal of foreign states,
and conversion to and from torch.optim.AdamW state_dicts."""
import io
import os
import pathlib
import subprocess
import sys

import pytest
import torch

import lbopt.functional as F
import lbopt.torch as LT

# ---- a small deterministic training setup (also imported by the fresh-process script below) --------------------

LR = 1e-2
MIN_QUANT = 1000  # both weights (4832 and 1057 elements: partial blocks, an odd count) quantized, biases fp32

CLASSES = {"4bit": LT.AdamW4bit, "8bit": LT.AdamW8bit, "fp8": LT.AdamWFp8, "fp32": LT.AdamW}

# name -> (state kind, param dtype, optimizer keyword arguments)
CONFIGS = {
    "4bit": ("4bit", torch.float32, {}),
    "8bit": ("8bit", torch.float32, {}),
    "fp8": ("fp8", torch.float32, {}),
    "fp32": ("fp32", torch.float32, {}),
    "4bit-amsgrad": ("4bit", torch.float32, {"amsgrad": True}),
    "fp32-amsgrad": ("fp32", torch.float32, {"amsgrad": True}),
    "4bit-bf16-sr": ("4bit", torch.bfloat16, {"bf16_stochastic_round": True, "seed": 7}),
    "8bit-bf16-sr-amsgrad": ("8bit", torch.bfloat16, {"bf16_stochastic_round": True, "seed": 3, "amsgrad": True}),
}


def make_model(dtype=torch.float32):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 151), torch.nn.Tanh(), torch.nn.Linear(151, 7))
    return model.to(dtype)


def build(config):
    kind, dtype, kwargs = CONFIGS[config]
    model = make_model(dtype)
    opt = CLASSES[kind](model.parameters(), lr=LR, min_quant_size=MIN_QUANT, **kwargs)
    return model, opt


def make_aligned_model():
    """Every param a multiple of 16 elements: torch's fused CPU AdamW steps the last numel % (SIMD width)
    elements of a tensor in a scalar loop that rounds exp_avg_sq differently from its vector loop, which lbopt
    matches."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 160), torch.nn.Tanh(), torch.nn.Linear(160, 16))


def batch(i, dtype, out=7):
    g = torch.Generator().manual_seed(1000 + i)
    return torch.randn(16, 32, generator=g).to(dtype), torch.randn(16, out, generator=g).to(dtype)


def train(model, opt, start, stop):
    dtype = next(model.parameters()).dtype
    for i in range(start, stop):
        x, y = batch(i, dtype, model[-1].out_features)
        opt.zero_grad(set_to_none=True)
        (model(x) - y).square().mean().backward()
        opt.step()


# ---- helpers -------------------------------------------------------------------------------------------------


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest.py


def roundtrip(obj, **load_kwargs):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True, **load_kwargs)


def assert_same_states(opt_a, params_a, opt_b, params_b):
    for pa, pb in zip(params_a, params_b):
        assert torch.equal(pa, pb)
        sa, sb = opt_a.state[pa], opt_b.state[pb]
        assert sa.keys() == sb.keys()
        for k in sa:
            if torch.is_tensor(sa[k]):
                assert sa[k].dtype == sb[k].dtype, k
                assert torch.equal(sa[k], sb[k]), k
            else:
                assert sa[k] == sb[k], k


def expected_kind(config, p):
    return CONFIGS[config][0] if p.numel() >= MIN_QUANT else "fp32"


def clone_state(opt):
    return {id(p): {k: (v.clone() if torch.is_tensor(v) else v) for k, v in st.items()} for p, st in opt.state.items()}


# ---- state_dict contents -------------------------------------------------------------------------------------


@pytest.mark.parametrize("config", list(CONFIGS))
def test_state_dict_holds_plain_tensors_and_ints_in_the_checkpoint_form(config):
    """Only tensors and ints (what flattened optimizer state dicts take), each state in the checkpoint form
    whatever the sharding: codes one per element shaped like the param, scales one row per row of it."""
    model, opt = build(config)
    train(model, opt, 0, 3)
    sd = opt.state_dict()
    params = list(model.parameters())
    assert sorted(sd["state"]) == list(range(len(params)))
    amsgrad = CONFIGS[config][2].get("amsgrad", False)
    for pid, p in enumerate(params):
        st = sd["state"][pid]
        kind = expected_kind(config, p)
        assert st["state_kind"] == F.KINDS[kind] and type(st["state_kind"]) is int
        assert st["step"] == 3 and type(st["step"]) is int
        moments = ["exp_avg", "exp_avg_sq"] + (["max_exp_avg_sq"] if amsgrad else [])
        want = {"step", "state_kind"} | {m + "_codes" for m in moments}
        if kind != "fp32":
            want |= {m + "_scales" for m in moments}
        assert set(st) == want
        block, row = F.state_layout(kind, 0)["block_size"], p.numel() // p.shape[0]
        for m in moments:
            codes = st[m + "_codes"]
            assert type(codes) is torch.Tensor and codes.device.type == "cpu"
            assert codes.dtype == (torch.float32 if kind == "fp32" else torch.uint8)
            assert codes.shape == p.shape
            if kind != "fp32":
                scales = st[m + "_scales"]
                assert type(scales) is torch.Tensor
                assert scales.dtype == torch.float32  # float32 even for bf16 params
                assert scales.shape == (p.shape[0], 1 + (row - 1 + block - 1) // block + 1)
    for group in sd["param_groups"]:
        for k, v in group.items():
            assert isinstance(v, (int, float, bool, tuple, list)), (k, type(v))


@pytest.mark.parametrize("config", ["4bit", "fp8-bf16", "fp32-amsgrad"])
def test_torch_save_load_weights_only(config):
    if config == "fp8-bf16":
        model = make_model(torch.bfloat16)
        opt = LT.AdamWFp8(model.parameters(), lr=LR, min_quant_size=MIN_QUANT)
    else:
        model, opt = build(config)
    train(model, opt, 0, 2)
    sd = opt.state_dict()
    for kwargs in ({}, {"map_location": "cpu"}, {"map_location": torch.device("cpu")}):
        loaded = roundtrip(sd, **kwargs)
        assert loaded["param_groups"] == sd["param_groups"]
        for pid, st in sd["state"].items():
            assert loaded["state"][pid].keys() == st.keys()
            for k, v in st.items():
                if torch.is_tensor(v):
                    assert loaded["state"][pid][k].dtype == v.dtype and torch.equal(loaded["state"][pid][k], v)
                else:
                    assert loaded["state"][pid][k] == v


# ---- resumption ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("config", list(CONFIGS))
def test_resume_is_bit_identical(config):
    ref_model, ref_opt = build(config)
    train(ref_model, ref_opt, 0, 20)

    model, opt = build(config)
    train(model, opt, 0, 10)
    ck = roundtrip({"model": model.state_dict(), "opt": opt.state_dict()}, map_location="cpu")
    del model, opt

    model2, opt2 = build(config)
    model2.load_state_dict(ck["model"])
    opt2.load_state_dict(ck["opt"])
    params2 = list(model2.parameters())
    for p in params2:
        assert opt2.state[p]["step"] == 10
    train(model2, opt2, 10, 20)
    assert_same_states(ref_opt, list(ref_model.parameters()), opt2, params2)
    for p in params2:
        assert opt2.state[p]["step"] == 20


def test_resume_in_fresh_process(tmp_path):
    """Save after 10 steps here, continue 10 steps in a new interpreter, compare with 20 uninterrupted steps."""
    configs = ["4bit", "8bit", "fp8", "fp32", "4bit-amsgrad", "4bit-bf16-sr"]
    saved, refs = {}, {}
    for config in configs:
        model, opt = build(config)
        train(model, opt, 0, 10)
        saved[config] = {"model": model.state_dict(), "opt": opt.state_dict()}
        ref_model, ref_opt = build(config)
        train(ref_model, ref_opt, 0, 20)
        refs[config] = (ref_model, ref_opt)
    ck_path, out_path = tmp_path / "ck.pt", tmp_path / "out.pt"
    torch.save(saved, ck_path)

    script = tmp_path / "resume.py"
    script.write_text(
        "import sys, torch\n"
        "torch.set_num_threads(1)\n"
        "import test_checkpoint as T\n"
        "saved = torch.load(sys.argv[1], weights_only=True, map_location='cpu')\n"
        "out = {}\n"
        "for config, ck in saved.items():\n"
        "    model, opt = T.build(config)\n"
        "    model.load_state_dict(ck['model'])\n"
        "    opt.load_state_dict(ck['opt'])\n"
        "    T.train(model, opt, 10, 20)\n"
        "    ps = list(model.parameters())\n"
        "    out[config] = {'params': [p.detach().clone() for p in ps],\n"
        "                   'states': [dict(opt.state[p]) for p in ps]}\n"
        "torch.save(out, sys.argv[2])\n")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    import lbopt

    paths = [str(pathlib.Path(lbopt.__file__).resolve().parents[1]), str(pathlib.Path(__file__).resolve().parent)]
    env["PYTHONPATH"] = os.pathsep.join(paths + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    r = subprocess.run([sys.executable, str(script), str(ck_path), str(out_path)], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-4000:]
    out = torch.load(out_path, weights_only=True)
    for config in configs:
        ref_model, ref_opt = refs[config]
        for p, q, st in zip(ref_model.parameters(), out[config]["params"], out[config]["states"]):
            assert q.dtype == p.dtype and torch.equal(p.detach(), q), config
            ref_st = ref_opt.state[p]
            assert ref_st.keys() == st.keys(), config
            for k, v in ref_st.items():
                if torch.is_tensor(v):
                    assert st[k].dtype == v.dtype and torch.equal(v, st[k]), (config, k)
                else:
                    assert st[k] == v, (config, k)


@pytest.mark.parametrize("kind", ["4bit", "fp8", "fp32"])
def test_load_keeps_float32_states_for_bf16_params(kind):
    model = make_model(torch.bfloat16)
    opt = CLASSES[kind](model.parameters(), lr=LR, min_quant_size=MIN_QUANT)
    train(model, opt, 0, 2)
    sd = roundtrip(opt.state_dict(), map_location="cpu")
    model2 = make_model(torch.bfloat16)
    opt2 = CLASSES[kind](model2.parameters(), lr=LR, min_quant_size=MIN_QUANT)
    opt2.load_state_dict(sd)
    for p, q in zip(model.parameters(), model2.parameters()):
        assert q.dtype == torch.bfloat16
        for k, v in opt.state[p].items():
            got = opt2.state[q][k]
            if torch.is_tensor(v):
                assert got.dtype == v.dtype, k  # scales and fp32 codes stay float32, uint8 codes stay uint8
                if k.endswith("_scales") or opt2.state[q]["state_kind"] == "fp32":
                    assert got.dtype == torch.float32, k
                assert torch.equal(got, v), k
            else:
                assert got == v, k


# ---- foreign states ------------------------------------------------------------------------------------------


def _two_optimizers():
    m8 = make_model()
    o8 = LT.AdamW8bit(m8.parameters(), lr=3e-3, min_quant_size=MIN_QUANT)
    train(m8, o8, 0, 2)
    m4 = make_model()
    o4 = LT.AdamW4bit(m4.parameters(), lr=LR, min_quant_size=MIN_QUANT)
    train(m4, o4, 0, 3)
    return m8, o8, m4, o4


def test_load_of_another_kind_raises_value_error():
    _, o8, _, o4 = _two_optimizers()
    with pytest.raises(ValueError, match=r"saved state kind '8bit' does not match this optimizer's '4bit'"):
        o4.load_state_dict(o8.state_dict())


def test_refused_load_leaves_optimizer_unchanged():
    m8, o8, m4, o4 = _two_optimizers()
    before_state = clone_state(o4)
    before_groups = [{k: v for k, v in g.items() if k != "params"} for g in o4.param_groups]
    with pytest.raises(ValueError):
        o4.load_state_dict(o8.state_dict())
    assert [{k: v for k, v in g.items() if k != "params"} for g in o4.param_groups] == before_groups
    for p in m4.parameters():
        st, ref = o4.state[p], before_state[id(p)]
        assert st.keys() == ref.keys()
        for k, v in ref.items():
            assert (torch.equal(st[k], v) if torch.is_tensor(v) else st[k] == v), k
    train(m4, o4, 3, 4)  # and it still steps


def assert_refused_unchanged(model, opt, state_dict, error, message):
    """opt.load_state_dict(state_dict) raises error (its message matching) and leaves every state as it was."""
    before = clone_state(opt)
    with pytest.raises(error, match=message):
        opt.load_state_dict(state_dict)
    for p in model.parameters():
        assert all(torch.equal(v, opt.state[p][k]) if torch.is_tensor(v) else v == opt.state[p][k]
                   for k, v in before[id(p)].items())


def _in_memory_form(opt, sd):
    """sd with each param's state as the optimizer holds it (the flat form lbopt 0.3 saved)."""
    return {"state": {i: dict(opt.state[p]) for i, p in enumerate(opt.param_groups[0]["params"])},
            "param_groups": sd["param_groups"]}


@pytest.mark.parametrize("kind", ["4bit", "fp32"])
@pytest.mark.parametrize("form", ["checkpoint", "in-memory"])
def test_state_saved_after_amsgrad_turned_on_loads_and_resumes(kind, form):
    """A state dict saved once amsgrad was turned on but before the next step holds no max_exp_avg_sq: the step
    would start it at zero, and so does a load into an optimizer built with amsgrad."""
    model, opt = build(kind)
    train(model, opt, 0, 5)
    for group in opt.param_groups:
        group["amsgrad"] = True
    sd = opt.state_dict()
    ck = roundtrip({"model": model.state_dict(), "opt": sd if form == "checkpoint" else _in_memory_form(opt, sd)})
    train(model, opt, 5, 10)

    model2, opt2 = build(kind + "-amsgrad")
    model2.load_state_dict(ck["model"])
    opt2.load_state_dict(ck["opt"])
    train(model2, opt2, 5, 10)
    assert_same_states(opt, list(model.parameters()), opt2, list(model2.parameters()))


def test_load_of_a_state_missing_its_first_moment_raises():
    model, opt = build("4bit")
    train(model, opt, 0, 1)
    sd = opt.state_dict()
    for st in sd["state"].values():
        for k in ("exp_avg_codes", "exp_avg_scales"):
            st.pop(k, None)
    _, opt2 = build("4bit")
    with pytest.raises(ValueError, match=r"checkpoint's exp_avg of .* is missing"):
        opt2.load_state_dict(sd)
    with pytest.raises(ValueError, match="saved state 'exp_avg_codes' does not fit"):
        opt2.load_state_dict(_in_memory_form(opt, opt.state_dict()) | {"state": {
            i: {k: v for k, v in st.items() if k not in ("exp_avg_codes", "exp_avg_scales")}
            for i, st in _in_memory_form(opt, opt.state_dict())["state"].items()}})


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0])
@pytest.mark.parametrize("form", ["checkpoint", "in-memory"])
def test_load_refuses_damaged_scales_and_changes_nothing(bad, form):
    """A scale that no step writes (NaN, infinite, negative) is refused at load, naming the param and the key; the
    optimizer keeps its states."""
    model, opt = build("4bit")
    train(model, opt, 0, 2)
    sd = opt.state_dict() if form == "checkpoint" else _in_memory_form(opt, opt.state_dict())
    damaged = {i: {k: (v.clone() if torch.is_tensor(v) else v) for k, v in st.items()} for i, st in sd["state"].items()}
    scales = damaged[0]["exp_avg_sq_scales"]  # the checkpoint form: per row its offset, then its blocks' scales
    scales[(0, 1) if form == "checkpoint" else 0] = bad
    model2, opt2 = build("4bit")
    train(model2, opt2, 0, 1)
    assert_refused_unchanged(model2, opt2, {**sd, "state": damaged}, ValueError,
                             r"saved exp_avg_sq_scales of a param of shape \(151, 32\) holds a scale")


def test_load_of_states_sized_for_other_params_raises():
    m_other = torch.nn.Sequential(torch.nn.Linear(32, 150), torch.nn.Tanh(), torch.nn.Linear(150, 7))
    o_other = LT.AdamW4bit(m_other.parameters(), lr=LR, min_quant_size=MIN_QUANT)
    train(m_other, o_other, 0, 1)
    _, opt = build("4bit")
    with pytest.raises(ValueError, match=r"does not fit a param of shape \(151, 32\)"):
        opt.load_state_dict(o_other.state_dict())


# ---- conversion to / from torch.optim.AdamW ------------------------------------------------------------------


def _block_absmax(x, block):
    flat = x.detach().flatten().abs()
    pad = torch.zeros(-(-flat.numel() // block) * block)
    pad[:flat.numel()] = flat
    return pad.view(-1, block).amax(1).repeat_interleave(block)[:flat.numel()].view(x.shape)


@pytest.mark.parametrize("amsgrad,impl,shapes", [(False, "fused", "aligned"), (True, "fused", "aligned"),
                                                  (False, "fused", "odd"), (False, "default", "odd")])
def test_fp32_to_torch_adamw_continues_identically(amsgrad, impl, shapes):
    """The converted state continues in torch.optim.AdamW as in lbopt: bit for bit with torch's fused AdamW where
    its vector loop does every element (aligned sizes), within 1e-6 otherwise (its scalar tail loop and its
    default for-loop implementation round differently)."""
    new_model = make_aligned_model if shapes == "aligned" else make_model
    model = new_model()
    opt = LT.AdamW(model.parameters(), lr=LR, amsgrad=amsgrad)
    train(model, opt, 0, 10)
    tsd = LT.to_torch_adamw_state_dict(opt)
    for pid, p in enumerate(model.parameters()):
        st = tsd["state"][pid]
        assert st["step"].dtype == torch.float32 and float(st["step"]) == 10.0
        names = ["exp_avg", "exp_avg_sq"] + (["max_exp_avg_sq"] if amsgrad else [])
        assert set(st) == {"step", *names}
        for name in names:
            assert st[name].shape == p.shape and st[name].dtype == torch.float32
            assert torch.equal(st[name].flatten(), opt.state[p][name + "_codes"])
    tmodel = new_model()
    tmodel.load_state_dict(model.state_dict())
    topt = torch.optim.AdamW(tmodel.parameters(), lr=LR, amsgrad=amsgrad, fused=(impl == "fused") or None)
    topt.load_state_dict(roundtrip(tsd))
    if impl == "fused":
        for g in topt.param_groups:  # the loaded groups replace the constructor's, and lbopt's carry no 'fused'
            g["fused"] = True
    train(model, opt, 10, 20)
    train(tmodel, topt, 10, 20)
    vectorized = torch.backends.cpu.get_cpu_capability() not in ("DEFAULT", "NO AVX")
    for p, q in zip(model.parameters(), tmodel.parameters()):
        if impl == "fused" and shapes == "aligned" and vectorized:
            assert torch.equal(p, q)
        else:
            torch.testing.assert_close(p, q, rtol=0, atol=1e-6)
        assert float(topt.state[q]["step"]) == 20.0


@pytest.mark.parametrize("config", ["4bit", "8bit-bf16-sr-amsgrad"])
def test_quantized_to_torch_adamw_dequantizes_and_trains(config):
    model, opt = build(config)
    train(model, opt, 0, 5)
    tsd = LT.to_torch_adamw_state_dict(opt)
    for pid, p in enumerate(model.parameters()):
        st = opt.state[p]
        for name in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
            if name + "_codes" not in st:
                assert name not in tsd["state"][pid]
                continue
            got = tsd["state"][pid][name]
            assert got.shape == p.shape and got.dtype == torch.float32
            want = torch.empty(p.numel())
            F.dequantize(st["state_kind"], "m" if name == "exp_avg" else "v",
                         {"codes": st[name + "_codes"], "scales": st.get(name + "_scales")}, want)
            assert torch.equal(got.flatten(), want)
    tmodel = make_model(CONFIGS[config][1])
    tmodel.load_state_dict(model.state_dict())
    topt = torch.optim.AdamW(tmodel.parameters(), lr=LR)
    topt.load_state_dict(tsd)
    before = [p.detach().clone() for p in tmodel.parameters()]
    train(tmodel, topt, 5, 8)
    for p, b in zip(tmodel.parameters(), before):
        assert torch.isfinite(p).all() and not torch.equal(p, b)
        assert float(topt.state[p]["step"]) == 8.0


def _torch_adamw(amsgrad):
    model = make_model()
    topt = torch.optim.AdamW(model.parameters(), lr=LR, amsgrad=amsgrad)
    train(model, topt, 0, 6)
    return model, topt


def _check_quantized_from_torch(tmodel, topt, model, opt, amsgrad):
    for tp, p in zip(tmodel.parameters(), model.parameters()):
        src, st = topt.state[tp], opt.state[p]
        assert st["step"] == 6 and type(st["step"]) is int
        kind = "4bit" if p.numel() >= MIN_QUANT else "fp32"
        assert st["state_kind"] == kind
        names = ["exp_avg", "exp_avg_sq"] + (["max_exp_avg_sq"] if amsgrad else [])
        assert {k for k in st if k.endswith("_codes")} == {n + "_codes" for n in names}
        for name in names:
            moment = "m" if name == "exp_avg" else "v"
            got = torch.empty(p.shape)
            F.dequantize(kind, moment, {"codes": st[name + "_codes"], "scales": st.get(name + "_scales")}, got)
            orig = src[name].float()
            if kind == "fp32":
                assert torch.equal(got, orig)
                continue
            absmax = _block_absmax(orig, 128)
            bound = (0.125 if moment == "m" else 1.0 / 16) * absmax * (1 + 1e-6) + 1e-30
            assert ((got - orig).abs() <= bound).all(), name


def test_load_torch_adamw_state_dict_quantizes_and_carries_steps():
    """A torch.optim.AdamW state_dict whose groups carry lbopt's 'fp32_state' key (see the test below for a plain
    one)."""
    model, topt = _torch_adamw(amsgrad=True)
    tsd = topt.state_dict()
    for g in tsd["param_groups"]:
        g.setdefault("fp32_state", False)
    model4 = make_model()
    model4.load_state_dict(model.state_dict())
    opt = LT.AdamW4bit(model4.parameters(), lr=LR, amsgrad=True, min_quant_size=MIN_QUANT)
    LT.load_torch_adamw_state_dict(opt, tsd)
    _check_quantized_from_torch(model, topt, model4, opt, amsgrad=True)
    train(model4, opt, 6, 9)
    for p in model4.parameters():
        assert opt.state[p]["step"] == 9 and torch.isfinite(p).all()


@pytest.mark.parametrize("amsgrad", [False, True])
def test_load_plain_torch_adamw_state_dict(amsgrad):
    model, topt = _torch_adamw(amsgrad)
    model4 = make_model()
    model4.load_state_dict(model.state_dict())
    opt = LT.AdamW4bit(model4.parameters(), lr=LR, amsgrad=amsgrad, min_quant_size=MIN_QUANT)
    LT.load_torch_adamw_state_dict(opt, topt.state_dict())
    _check_quantized_from_torch(model, topt, model4, opt, amsgrad)
    train(model4, opt, 6, 9)
    for p in model4.parameters():
        assert opt.state[p]["step"] == 9


def _damage_step_2_53(st):
    st["step"] = torch.tensor(2.0 ** 54)  # a float32 step, as torch.optim saves one


# name -> (the kind of the optimizer and state, what damages param 0's saved entry, the error, its message)
DAMAGES = {
    "codes of another dtype": ("4bit", lambda st: st.__setitem__("exp_avg_codes", st["exp_avg_codes"].to(torch.int32)),
                               ValueError, r"exp_avg_codes of a param of shape \(151, 32\) .*int32"),
    "fp32 states of another dtype": ("fp32", lambda st: st.__setitem__("exp_avg_codes", st["exp_avg_codes"].double()),
                                     ValueError, r"exp_avg_codes of a param of shape \(151, 32\) .*float64"),
    "4-bit codes above 15": ("4bit", lambda st: st["exp_avg_codes"].view(-1)[7].fill_(16),
                             ValueError, r"exp_avg_codes of a param of shape \(151, 32\) holds a code above 15"),
    "FP8 codes that are NaN": ("fp8", lambda st: st["exp_avg_codes"].view(-1)[3].fill_(0x7F),
                               ValueError, r"exp_avg_codes of a param of shape \(151, 32\) holds a NaN"),
    "codes that hold no data": ("4bit", lambda st: st.__setitem__("exp_avg_codes", st["exp_avg_codes"].to("meta")),
                                ValueError, r"exp_avg_codes of a param of shape \(151, 32\) .*meta"),
    "codes that are no tensor": ("4bit", lambda st: st.__setitem__("exp_avg_codes", [1, 2, 3]),
                                 TypeError, r"exp_avg_codes of a param of shape \(151, 32\) is a list"),
    "an unknown key": ("4bit", lambda st: st.__setitem__("exp_avg_codez", torch.zeros(3)),
                       ValueError, r"unknown key 'exp_avg_codez' .* a param of shape \(151, 32\)"),
    "a step beyond 2^53": ("4bit", _damage_step_2_53, ValueError, r"saved step .* of a param of shape \(151, 32\)"),
}


@pytest.mark.parametrize("damage", DAMAGES)
@pytest.mark.parametrize("form", ["checkpoint", "in-memory"])
def test_load_refuses_damaged_entries_naming_param_and_key_and_changes_nothing(damage, form):
    """A state dict is input like any other: a saved entry that no state_dict() writes is refused at load with an
    error naming the param and the key, and the optimizer keeps its states."""
    kind, damage_fn, error, message = DAMAGES[damage]
    if form == "in-memory" and damage in ("4-bit codes above 15",):
        pytest.skip("the in-memory form packs two 4-bit codes a byte: every byte is valid")
    model, opt = build(kind)
    train(model, opt, 0, 2)
    sd = opt.state_dict() if form == "checkpoint" else _in_memory_form(opt, opt.state_dict())
    damaged = {i: {k: (v.clone() if torch.is_tensor(v) else v) for k, v in st.items()} for i, st in sd["state"].items()}
    damage_fn(damaged[0])
    model2, opt2 = build(kind)
    train(model2, opt2, 0, 1)
    assert_refused_unchanged(model2, opt2, {**sd, "state": damaged}, error, message)


@pytest.mark.parametrize("damage", ["a state for a param no group lists", "an entry that is no dict"])
def test_load_refuses_state_dicts_whose_state_is_not_per_listed_param(damage):
    model, opt = build("4bit")
    train(model, opt, 0, 2)
    sd = opt.state_dict()
    state = dict(sd["state"])
    if damage == "an entry that is no dict":
        state[1] = 5
        error, message = TypeError, r"saved state of a param of shape \(151,\) is a int, not a dict"
    else:
        state[9] = state[0]
        error, message = ValueError, r"state for param id 9, which no param group of the state dict lists"
    model2, opt2 = build("4bit")
    train(model2, opt2, 0, 1)
    assert_refused_unchanged(model2, opt2, {**sd, "state": state}, error, message)

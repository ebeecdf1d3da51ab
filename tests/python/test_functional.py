"""lbopt.functional: the NumPy path equals the torch optimizers bit for bit; quantize / dequantize; layouts and
kind names; DLPack producers (legacy capsules, read-only arrays)."""
import ctypes

import numpy as np
import pytest
import torch

import lbopt
import lbopt.functional as F
import lbopt.torch as LT
from lbopt import _abi

KINDS = ["4bit", "8bit", "fp8", "fp32"]
CLASSES = {"4bit": LT.AdamW4bit, "8bit": LT.AdamW8bit, "fp8": LT.AdamWFp8, "fp32": LT.AdamW}
SIZES = [1000, 333, 4103, 1]  # partial blocks, odd counts (two 4-bit codes per byte), a single element
HYPER = dict(betas=(0.9, 0.99), eps=1e-7, weight_decay=0.05)


def _grads(step, rng_seed=0):
    rng = np.random.default_rng(rng_seed * 1000 + step)
    return [rng.standard_normal(n).astype(np.float32) * np.float32(10.0 ** rng.uniform(-3, 1)) for n in SIZES]


# ---- the NumPy path equals the torch path --------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["plain", "amsgrad-maximize"])
@pytest.mark.parametrize("kind", KINDS)
def test_numpy_adamw_step_equals_torch_optimizer(kind, variant):
    flags = dict(amsgrad=True, maximize=True) if variant == "amsgrad-maximize" else {}
    rng = np.random.default_rng(42)
    init = [rng.standard_normal(n).astype(np.float32) for n in SIZES]
    lrs = [1e-2, 3e-3, 5e-3, 1e-3]  # a schedule: the lr is a per-call argument

    np_params = [x.copy() for x in init]
    moments = ["m", "v"] + (["vmax"] if flags else [])
    np_states = [{m: F.zeros_state(kind, n) for m in moments} for n in SIZES]

    t_params = [torch.nn.Parameter(torch.from_numpy(x.copy())) for x in init]
    opt = CLASSES[kind](t_params, lr=lrs[0], min_quant_size=0, **HYPER, **flags)

    for step, lr in enumerate(lrs, start=1):
        grads = _grads(step)
        skipped = F.adamw_step(np_params, grads, np_states, lr, [step] * len(SIZES), kind=kind, **HYPER, **flags)
        assert skipped == [False] * len(SIZES)
        for p, g in zip(t_params, grads):
            p.grad = torch.from_numpy(g.copy())
        for group in opt.param_groups:
            group["lr"] = lr
        opt.step()

    names = {"m": "exp_avg", "v": "exp_avg_sq", "vmax": "max_exp_avg_sq"}
    for x, p, st in zip(np_params, t_params, np_states):
        assert np.array_equal(x, p.detach().numpy())
        ts = opt.state[p]
        assert ts["state_kind"] == kind and ts["step"] == len(lrs)
        for m in moments:
            assert np.array_equal(st[m]["codes"], ts[names[m] + "_codes"].numpy()), m
            if kind != "fp32":
                assert np.array_equal(st[m]["scales"], ts[names[m] + "_scales"].numpy()), m
            else:
                assert st[m]["scales"] is None and names[m] + "_scales" not in ts
    assert not np.array_equal(np_params[0], init[0])


def test_numpy_adamw_step_on_torch_tensors_via_dlpack():
    """The functional API borrows any DLPack array: torch tensors work like NumPy arrays."""
    n = 700
    x = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    g = _grads(1)[0][:n].copy()
    p_np, st_np = x.copy(), {"m": F.zeros_state("8bit", n), "v": F.zeros_state("8bit", n)}
    p_t = torch.from_numpy(x.copy())
    st_t = {"m": F.zeros_state("8bit", n, zeros=lambda k, dt: torch.zeros(k, dtype=getattr(torch, dt))),
            "v": F.zeros_state("8bit", n, zeros=lambda k, dt: torch.zeros(k, dtype=getattr(torch, dt)))}
    F.adamw_step([p_np], [g], [st_np], 1e-2, [1], kind="8bit")
    F.adamw_step([p_t], [torch.from_numpy(g)], [st_t], 1e-2, [1], kind="8bit")
    assert np.array_equal(p_np, p_t.numpy())
    for m in "mv":
        assert np.array_equal(st_np[m]["codes"], st_t[m]["codes"].numpy())
        assert np.array_equal(st_np[m]["scales"], st_t[m]["scales"].numpy())


# ---- quantize / dequantize -----------------------------------------------------------------------------------


def _block_absmax(x, block):
    pad = np.zeros(-(-x.size // block) * block, np.float32)
    pad[:x.size] = np.abs(x)
    return np.repeat(pad.reshape(-1, block).max(1), block)[:x.size]


@pytest.mark.parametrize("moment", ["m", "v", "v_signed"])
@pytest.mark.parametrize("kind", KINDS)
def test_quantize_dequantize_round_trip(kind, moment):
    n = 4103
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(n) * np.exp(rng.uniform(-8, 0, n))).astype(np.float32)
    second = moment != "m"
    if second:
        x = x * x
    st = F.zeros_state(kind, n)
    F.quantize(kind, moment, x, st)
    out = np.full(n, np.nan, np.float32)
    F.dequantize(kind, moment, st, out)
    assert np.isfinite(out).all()
    err = np.abs(out - x)
    if kind == "fp32":
        assert np.array_equal(st["codes"], x) and np.array_equal(out, x)
        return
    block = F.state_layout(kind, n)["block_size"]
    absmax = _block_absmax(x, block)
    assert np.array_equal(st["scales"], _block_absmax(x, block)[::block] / (448 if kind == "fp8" else 1))
    if second:  # a positive second moment never decodes to 0 (docs/formats.md, "The zero-point guard")
        assert (out[x > 0] > 0).all()
    if kind == "fp8":  # e4m3: 3 mantissa bits; subnormal steps of 2**-9 * scale, the least positive v code
        bound = np.abs(x) / 16 + absmax / 448 * 2.0 ** -9
    else:
        # (v_signed: the signed 4-bit map's non-negative values, the unsigned map on 8 bits)
        bound = {("4bit", "m"): 0.125, ("4bit", "v"): 1 / 16, ("4bit", "v_signed"): 0.1125, ("8bit", "m"): 0.01,
                 ("8bit", "v"): 0.005, ("8bit", "v_signed"): 0.005}[(kind, moment)] * absmax
    assert (err <= bound * (1 + 1e-6)).all()
    if second or kind == "fp8":
        # the maps of v and fp8 hold the block's absmax exactly: quantizing the decoded values again is exact
        st2 = F.zeros_state(kind, n)
        F.quantize(kind, moment, out, st2)
        assert np.array_equal(st2["codes"], st["codes"]) and np.array_equal(st2["scales"], st["scales"])


def test_quantize_rejects_bad_moment_and_sizes():
    x = np.ones(300, np.float32)
    with pytest.raises(ValueError, match="moment must be 'm', 'v' or 'v_signed'"):
        F.quantize("4bit", "w", x, F.zeros_state("4bit", 300))
    with pytest.raises(lbopt.LbOptValueError, match=r"dst\.codes: has 50 elements"):
        F.quantize("4bit", "m", x, F.zeros_state("4bit", 100))
    with pytest.raises(lbopt.LbOptTypeError, match=r"src: dtype float64"):
        F.quantize("8bit", "m", np.ones(300), F.zeros_state("8bit", 300))


# ---- layouts and kinds ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind,numel,want", [
    ("4bit", 1000, dict(codes_numel=500, codes_bytes=500, codes_dtype="uint8", scales_numel=8, block_size=128)),
    ("4bit", 1001, dict(codes_numel=501, codes_bytes=501, codes_dtype="uint8", scales_numel=8, block_size=128)),
    ("4bit", 128, dict(codes_numel=64, codes_bytes=64, codes_dtype="uint8", scales_numel=1, block_size=128)),
    ("4bit", 0, dict(codes_numel=0, codes_bytes=0, codes_dtype="uint8", scales_numel=0, block_size=128)),
    ("8bit", 1000, dict(codes_numel=1000, codes_bytes=1000, codes_dtype="uint8", scales_numel=4, block_size=256)),
    ("8bit", 257, dict(codes_numel=257, codes_bytes=257, codes_dtype="uint8", scales_numel=2, block_size=256)),
    ("fp8", 1000, dict(codes_numel=1000, codes_bytes=1000, codes_dtype="uint8", scales_numel=4, block_size=256)),
    ("fp32", 1000, dict(codes_numel=1000, codes_bytes=4000, codes_dtype="float32", scales_numel=0, block_size=0)),
])
def test_state_layout(kind, numel, want):
    assert F.state_layout(kind, numel) == want
    assert F.state_layout(F.kind_id(kind), numel) == want
    st = F.zeros_state(kind, numel)
    assert st["codes"].dtype == np.dtype(want["codes_dtype"]) and st["codes"].shape == (want["codes_numel"],)
    assert st["codes"].nbytes == want["codes_bytes"]
    if kind == "fp32":
        assert st["scales"] is None
    else:
        assert st["scales"].dtype == np.float32 and st["scales"].shape == (want["scales_numel"],)


def test_kind_names():
    assert list(F.KINDS) == KINDS
    assert [F.kind_id(k) for k in KINDS] == [_abi.STATE_4BIT, _abi.STATE_8BIT, _abi.STATE_FP8, _abi.STATE_FP32]
    assert F.kind_id(2) == 2
    for kind in KINDS:
        assert LT.LowBitAdamW([torch.nn.Parameter(torch.zeros(4))], state_kind=kind).state_kind == F.kind_id(kind)
        assert CLASSES[kind]([torch.nn.Parameter(torch.zeros(4))]).state_kind == F.kind_id(kind)


@pytest.mark.parametrize("bad", ["int4", "4BIT", "fp16", ""])
def test_unknown_kind_names_are_refused(bad):
    msg = rf"unknown state kind {bad!r} \(one of 4bit, 8bit, fp8, fp32\)"
    x = np.zeros(8, np.float32)
    with pytest.raises(ValueError, match=msg):
        F.kind_id(bad)
    with pytest.raises(ValueError, match=msg):
        F.state_layout(bad, 8)
    with pytest.raises(ValueError, match=msg):
        F.zeros_state(bad, 8)
    with pytest.raises(ValueError, match=msg):
        F.quantize(bad, "m", x, {"codes": np.zeros(8, np.float32), "scales": None})
    with pytest.raises(ValueError, match=msg):
        F.adamw_step([x], [x.copy()], [{"m": None, "v": None}], 1e-3, [1], kind=bad)
    with pytest.raises(ValueError, match=msg):
        LT.LowBitAdamW([torch.nn.Parameter(torch.zeros(4))], state_kind=bad)


@pytest.mark.parametrize("bad", [-1, 4, 99])
def test_unknown_kind_numbers_are_refused_by_the_library(bad):
    with pytest.raises(lbopt.LbOptValueError, match=rf"kind = {bad} is not an lbopt_state_kind") as e:
        F.state_layout(bad, 8)
    assert e.value.status == _abi.ERR_INVALID_VALUE
    p, g = np.ones(8, np.float32), np.ones(8, np.float32)
    st = {"codes": np.zeros(8, np.float32), "scales": None}
    with pytest.raises(lbopt.LbOptValueError, match=r"config\.state_kind"):
        F.adamw_step([p], [g], [{"m": st, "v": dict(st)}], 1e-3, [1], kind=bad)
    assert np.array_equal(p, np.ones(8, np.float32))


# ---- DLPack producers ----------------------------------------------------------------------------------------


class LegacyOnly:
    """Exports only a legacy (unversioned) 'dltensor' capsule: __dlpack__ refuses max_version."""

    def __init__(self, t):
        self.t = t
        self.calls = 0

    def __dlpack__(self, stream=None):
        self.calls += 1
        return torch.utils.dlpack.to_dlpack(self.t)

    def __dlpack_device__(self):
        return self.t.__dlpack_device__()


def test_legacy_dltensor_capsule_producer():
    n = 1000
    x = np.random.default_rng(3).standard_normal(n).astype(np.float32)
    g = _grads(1)[0][:n].copy()
    ref_p, ref_st = x.copy(), {"m": F.zeros_state("4bit", n), "v": F.zeros_state("4bit", n)}
    F.adamw_step([ref_p], [g], [ref_st], 1e-2, [1], kind="4bit")

    tz = lambda k, dt: torch.zeros(k, dtype=getattr(torch, dt))  # noqa: E731
    p_t = torch.from_numpy(x.copy())
    st_t = {"m": F.zeros_state("4bit", n, zeros=tz), "v": F.zeros_state("4bit", n, zeros=tz)}
    wrapped_p, wrapped_g = LegacyOnly(p_t), LegacyOnly(torch.from_numpy(g.copy()))
    wrapped_st = {m: {k: LegacyOnly(v) for k, v in s.items()} for m, s in st_t.items()}
    F.adamw_step([wrapped_p], [wrapped_g], [wrapped_st], 1e-2, [1], kind="4bit")
    assert wrapped_p.calls >= 1 and wrapped_g.calls == 1 and wrapped_st["m"]["codes"].calls == 1
    assert np.array_equal(p_t.numpy(), ref_p)
    for m in "mv":
        assert np.array_equal(st_t[m]["codes"].numpy(), ref_st[m]["codes"])
        assert np.array_equal(st_t[m]["scales"].numpy(), ref_st[m]["scales"])

    # quantize / dequantize through legacy capsules
    out = LegacyOnly(torch.zeros(n))
    F.dequantize("4bit", "m", wrapped_st["m"], out)
    ref_out = np.zeros(n, np.float32)
    F.dequantize("4bit", "m", ref_st["m"], ref_out)
    assert np.array_equal(out.t.numpy(), ref_out)


def test_non_dlpack_object_is_refused():
    p = np.ones(8, np.float32)
    with pytest.raises(TypeError, match="list does not export DLPack"):
        F.adamw_step([p], [[0.0] * 8], [{"m": F.zeros_state("fp32", 8), "v": F.zeros_state("fp32", 8)}], 1e-3, [1],
                     kind="fp32")
    assert np.array_equal(p, np.ones(8, np.float32))


def _primed(kind, n=600):
    """A param and its states after one step, so that the states are not all zero."""
    p = np.random.default_rng(5).standard_normal(n).astype(np.float32)
    st = {"m": F.zeros_state(kind, n), "v": F.zeros_state(kind, n)}
    F.adamw_step([p], [_grads(1)[0][:n].copy()], [st], 1e-2, [1], kind=kind)
    return p, st


def _copy_states(st):
    return {m: {k: (None if v is None else v.copy()) for k, v in s.items()} for m, s in st.items()}


def _assert_states_equal(a, b):
    for m in a:
        for k in a[m]:
            assert (a[m][k] is None and b[m][k] is None) or np.array_equal(a[m][k], b[m][k]), (m, k)


@pytest.mark.parametrize("kind", ["4bit", "fp32"])
def test_read_only_param_is_refused_and_untouched(kind):
    p, st = _primed(kind)
    p.flags.writeable = False
    p0, st0 = p.copy(), _copy_states(st)
    g = _grads(2)[0][:p.size].copy()
    with pytest.raises(ValueError, match="ndarray exported read-only cannot be updated in place"):
        F.adamw_step([p], [g], [st], 1e-2, [2], kind=kind)
    assert np.array_equal(p, p0)
    _assert_states_equal(st, st0)


def test_read_only_state_is_refused_and_untouched():
    p, st = _primed("8bit")
    st["v"]["scales"].flags.writeable = False
    p0, st0 = p.copy(), _copy_states(st)
    with pytest.raises(ValueError, match="read-only"):
        F.adamw_step([p], [_grads(2)[0][:p.size].copy()], [st], 1e-2, [2], kind="8bit")
    assert np.array_equal(p, p0)
    _assert_states_equal(st, st0)


def test_read_only_grad_is_accepted():
    p, st = _primed("4bit")
    p2, st2 = p.copy(), _copy_states(st)
    g = _grads(2)[0][:p.size].copy()
    g_ro = g.copy()
    g_ro.flags.writeable = False
    F.adamw_step([p], [g], [st], 1e-2, [2], kind="4bit")
    F.adamw_step([p2], [g_ro], [st2], 1e-2, [2], kind="4bit")
    assert np.array_equal(p, p2)
    _assert_states_equal(st, st2)
    # quantize reads its source only: a read-only source works too
    src = np.linspace(-1, 1, 256, dtype=np.float32)
    src.flags.writeable = False
    q = F.zeros_state("fp8", 256)
    F.quantize("fp8", "m", src, q)
    assert q["scales"][0] == np.float32(1.0) / np.float32(448)


# A conforming DLPack producer may release the shape/strides it exported as soon as its capsule is destroyed
# (NumPy and PyTorch free them then). This one overwrites its shape in the capsule destructor, so using a view
# after its capsule is gone shows up deterministically instead of as a silent use-after-free.

_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_capsule_new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, _DESTRUCTOR)(
    ("PyCapsule_New", ctypes.pythonapi))
_KEEP = []  # destructor callbacks and exported structs, kept for the life of the process


class ReleasingProducer:
    def __init__(self, arr):
        self.arr = arr
        self.live = 0

    def __dlpack__(self, stream=None):
        shape = (ctypes.c_int64 * 1)(self.arr.size)
        managed = _abi.DLManagedTensor()
        d = managed.dl_tensor
        d.data = self.arr.ctypes.data
        d.device = _abi.DLDevice(_abi.kDLCPU, 0)
        d.ndim = 1
        d.dtype = _abi.DLDataType(_abi.kDLFloat, 32, 1)
        d.shape = shape

        def destroy(_capsule, shape=shape):
            shape[0] = -12345  # what a freed and reused shape array may hold
            self.live -= 1

        cb = _DESTRUCTOR(destroy)
        _KEEP.append((cb, shape, managed))
        self.live += 1
        return _capsule_new(ctypes.addressof(managed), b"dltensor", cb)

    def __dlpack_device__(self):
        return (_abi.kDLCPU, 0)


def test_releasing_producer_works_for_adamw_step():
    """adamw_step keeps every capsule alive during the call (see the quantize/dequantize test below)."""
    n = 600
    x = np.random.default_rng(9).standard_normal(n).astype(np.float32)
    g = _grads(1)[0][:n].copy()
    ref, ref_st = x.copy(), {"m": F.zeros_state("4bit", n), "v": F.zeros_state("4bit", n)}
    F.adamw_step([ref], [g], [ref_st], 1e-2, [1], kind="4bit")
    p, st = x.copy(), {"m": F.zeros_state("4bit", n), "v": F.zeros_state("4bit", n)}
    F.adamw_step([ReleasingProducer(p)], [ReleasingProducer(g)], [st], 1e-2, [1], kind="4bit")
    assert np.array_equal(p, ref)
    _assert_states_equal(st, ref_st)


@pytest.mark.parametrize("which", ["quantize", "dequantize"])
def test_quantize_keeps_capsules_alive(which):
    n = 256
    x = np.linspace(-1, 1, n, dtype=np.float32)
    ref = F.zeros_state("8bit", n)
    F.quantize("8bit", "m", x, ref)
    if which == "quantize":
        st = F.zeros_state("8bit", n)
        F.quantize("8bit", "m", ReleasingProducer(x), st)
        assert np.array_equal(st["codes"], ref["codes"]) and np.array_equal(st["scales"], ref["scales"])
    else:
        out, ref_out = np.zeros(n, np.float32), np.zeros(n, np.float32)
        F.dequantize("8bit", "m", ref, ref_out)
        F.dequantize("8bit", "m", ref, ReleasingProducer(out))
        assert np.array_equal(out, ref_out)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("optimizer,cls,options", [("sgd", "SGD", {"momentum": 0.9, "nesterov": True}),
                                                   ("lion", "Lion", {"weight_decay": 0.1}),
                                                   ("ademamix", "AdEMAMix", {"t_alpha": 5.0})])
def test_generic_step_on_numpy_equals_the_torch_class(kind, optimizer, cls, options):
    """lbopt.functional.step on NumPy arrays and lbopt.torch's class of the same optimizer and kind make the
    same library call: identical params after 3 steps; a state missing from states[i] is named."""
    rng = np.random.default_rng(4)
    x, grads = rng.standard_normal(5000).astype(np.float32), rng.standard_normal((3, 5000)).astype(np.float32)
    p = x.copy()
    states = [{name: F.zeros_state(kind, p.size) for name, _ in F.state_names(optimizer, **options)}]
    q = torch.nn.Parameter(torch.from_numpy(x.copy()))
    torch_cls = getattr(LT, cls + {"4bit": "4bit", "8bit": "8bit", "fp8": "Fp8", "fp32": ""}[kind])
    opt = torch_cls([q], lr=1e-2, min_quant_size=0, **options)
    for t in range(3):
        F.step(optimizer, [p], [grads[t]], states, 1e-2, [t + 1], kind=kind, **options)
        q.grad = torch.from_numpy(grads[t].copy())
        opt.step()
    assert np.array_equal(p, q.detach().numpy())
    with pytest.raises(ValueError, match=F.state_names(optimizer, **options)[0][0]):
        F.step(optimizer, [p], [grads[0]], [{}], 1e-2, [4], kind=kind, **options)


def test_cpu_kernels_env_restricts_the_dispatch():
    """LBOPT_CPU_KERNELS=AVX2 (read once per process) runs the AVX2 kernels on a larger machine, with the same
    results; an ISA the CPU lacks, or an unknown name, leaves the dispatch as it is."""
    import os
    import subprocess
    import sys
    code = ("import numpy as np, lbopt, lbopt.functional as F\n"
            "p = np.linspace(-1, 1, 4096, dtype=np.float32); g = np.cos(p * 7)\n"
            "st = {'m': F.zeros_state('4bit', p.size), 'v': F.zeros_state('4bit', p.size)}\n"
            "F.adamw_step([p], [g], [st], 1e-2, [1], kind='4bit')\n"
            "print(lbopt.build_info()['cpu_kernels'], p.tobytes().hex()[:64], st['m']['codes'].tobytes().hex())")
    import pathlib
    package = str(pathlib.Path(lbopt.__file__).resolve().parents[1])  # this lbopt, as conftest chose it
    runs = {}
    for value in (None, "AVX2", "NOT_AN_ISA"):
        env = {k: v for k, v in os.environ.items() if k != "LBOPT_CPU_KERNELS"}
        env["PYTHONPATH"] = os.pathsep.join([package] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        if value:
            env["LBOPT_CPU_KERNELS"] = value
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        runs[value] = out.stdout.split()
    if runs[None][0] not in ("AVX2", "AVX3", "AVX3_DL", "AVX3_ZEN4", "AVX3_SPR"):
        pytest.skip(f"no AVX2 here (kernels {runs[None][0]})")
    assert runs["AVX2"][0] == "AVX2" and runs["NOT_AN_ISA"][0] == runs[None][0]
    assert runs["AVX2"][1:] == runs[None][1:]  # bit-identical params and codes

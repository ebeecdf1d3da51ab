"""The registry's operators in PyTorch's dispatcher (lbopt.torch_ops): generated schemas, torch.library.opcheck on
every op, results equal to the typed step, and a torch.compile'd step whose lr changes on every call compiled
once."""
import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch

import lbopt.functional as F
import lbopt.torch_ops as T
from lbopt import _abi

N = 4096 + 37
KINDS = ["4bit", "8bit", "fp8", "fp32"]


def states(kind, n=N, amsgrad=False):
    lay = F.state_layout(kind, n)
    dtype = torch.float32 if kind == "fp32" else torch.uint8
    out = []
    for _ in range(3 if amsgrad else 2):
        out.append(torch.zeros(lay["codes_numel"], dtype=dtype))
        out.append(torch.zeros(lay["scales_numel"]) if kind != "fp32" else None)
    return out + ([None, None] if not amsgrad else [])


def step_args(kind, capturable, seed=0, amsgrad=False):
    g = torch.Generator().manual_seed(seed)
    p, grad = torch.randn(N, generator=g), torch.randn(N, generator=g)
    args = [p, grad, *states(kind, amsgrad=amsgrad)]
    if capturable:
        args += [torch.tensor(1e-2, dtype=torch.float64), torch.tensor(1, dtype=torch.int64)]
    return args + [torch.zeros(1, dtype=torch.uint8)]


def test_every_registry_operator_is_a_torch_op_with_its_schema():
    names = {T.torch_name(_abi.lib.lbopt_op_schema(i).contents.name.decode()) for i in range(_abi.lib.lbopt_op_count())}
    assert names == set(T.OPS) and len(names) == _abi.lib.lbopt_op_count() == 44
    s = str(torch.ops.lbopt.adamw_step_capturable_4bit.default._schema)
    assert s.startswith("lbopt::adamw_step_capturable_4bit(Tensor(a!) param, Tensor grad, Tensor(b!) m_codes, "
                        "Tensor(c!)? m_scales,")
    assert "Tensor lr, Tensor step, Tensor(h!)? skipped, float beta1=0.9" in s and s.endswith("int seed=0) -> ()")
    assert "float lr, int step, float beta1" in str(torch.ops.lbopt.adamw_step_4bit.default._schema)
    assert 'str moment="m"' in str(torch.ops.lbopt.quantize.default._schema)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("capturable", [False, True], ids=["by-value", "tensor-lr"])
def test_opcheck_steps(kind, capturable):
    op = T.OPS[f"adamw_step{'_capturable' if capturable else ''}_{kind}"]
    kwargs = {"weight_decay": 0.1, "amsgrad": True}
    if not capturable:
        kwargs.update(lr=1e-2, step=1)
    torch.library.opcheck(op, tuple(step_args(kind, capturable, amsgrad=True)), kwargs)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("optimizer,n_states,kwargs", [("sgd", 1, {"momentum": 0.9, "nesterov": True}),
                                                       ("lion", 1, {"weight_decay": 0.1}),
                                                       ("ademamix", 3, {"t_alpha": 10.0, "t_beta3": 10.0})])
def test_opcheck_steps_of_every_optimizer(kind, optimizer, n_states, kwargs):
    """The generated ops of SGD, Lion and AdEMAMix pass opcheck and step as lbopt.functional.step does."""
    g = torch.Generator().manual_seed(11)
    p, grad = torch.randn(N, generator=g), torch.randn(N, generator=g)
    st = states(kind, amsgrad=True)[:2 * n_states]
    lr, step = torch.tensor(1e-2, dtype=torch.float64), torch.tensor(2, dtype=torch.int64)
    op = T.OPS[f"{optimizer}_step_capturable_{kind}"]
    torch.library.opcheck(op, (p.clone(), grad, *[t.clone() if t is not None else None for t in st], lr, step,
                               torch.zeros(1, dtype=torch.uint8)), kwargs)
    op(p, grad, *st, lr, step, torch.zeros(1, dtype=torch.uint8), **kwargs)
    q = p.detach().clone()  # p now holds the op's result; redo it through the functional step
    ref_p = torch.randn(N, generator=torch.Generator().manual_seed(11))
    fresh = states(kind, amsgrad=True)[:2 * n_states]
    ref_st = [{"codes": c, "scales": s} for c, s in zip(fresh[0::2], fresh[1::2])]
    names = [name for name, _ in F.state_names(optimizer, **kwargs)]
    F.step(optimizer, [ref_p], [grad], [dict(zip(names, ref_st))], 1e-2, [2], kind=kind, **kwargs)
    assert torch.equal(q, ref_p)


@pytest.mark.parametrize("kind", KINDS)
def test_opcheck_conversions(kind):
    lay = F.state_layout(kind, N)
    codes = torch.zeros(lay["codes_numel"], dtype=torch.float32 if kind == "fp32" else torch.uint8)
    scales = torch.zeros(lay["scales_numel"]) if kind != "fp32" else None
    src = torch.randn(N).abs()
    torch.library.opcheck(T.OPS["quantize"], (src, codes, scales), {"kind": kind, "moment": "v"})
    torch.library.opcheck(T.OPS["dequantize"], (codes, scales, torch.empty(N)), {"kind": kind, "moment": "v"})
    torch.library.opcheck(T.OPS["state_init"], (codes, scales), {"kind": kind, "numel": N})
    torch.library.opcheck(T.OPS["state_layout"], (torch.zeros(4, dtype=torch.int64),), {"kind": kind, "numel": N})


@pytest.mark.parametrize("kind", KINDS)
def test_tensor_lr_op_equals_the_functional_step(kind):
    args = step_args(kind, True, seed=3)
    p, g = args[0].numpy().copy(), args[1].numpy().copy()
    st = {"m": F.zeros_state(kind, N), "v": F.zeros_state(kind, N)}
    for s in range(1, 4):
        lr = 1e-2 / s
        args[8].fill_(lr)
        args[9].fill_(s)
        T.OPS[f"adamw_step_capturable_{kind}"](*args)
        F.adamw_step([p], [g], [st], lr, [s], kind=kind)
    assert torch.equal(args[0], torch.from_numpy(p))
    assert torch.equal(args[2], torch.from_numpy(st["m"]["codes"]))


def test_compiled_step_with_a_new_lr_every_call_compiles_once():
    import torch._dynamo

    compiles = []

    def counting_backend(gm, example_inputs):
        compiles.append(gm)
        return gm.forward

    torch._dynamo.reset()
    args = step_args("4bit", True, seed=5)
    eager = [a.clone() if a is not None else None for a in args]

    def step(p, g, mc, ms, vc, vs, lr, s):
        torch.ops.lbopt.adamw_step_capturable_4bit(p, g, mc, ms, vc, vs, None, None, lr, s, None)

    compiled = torch.compile(step, backend=counting_backend, fullgraph=True)
    for i in range(50):
        lr = 1e-3 * (1 + torch.cos(torch.tensor(i / 50 * 3.14159)).item())  # a cosine schedule
        for a in (args, eager):
            a[8].fill_(lr)
            a[9].fill_(i + 1)
        compiled(*args[:6], args[8], args[9])
        step(*eager[:6], eager[8], eager[9])
    assert len(compiles) == 1
    for a, b in zip(args, eager):
        assert a is None or torch.equal(a, b)


def test_bad_inputs_name_the_argument_and_write_nothing():
    args = step_args("4bit", True, seed=6)
    before = [a.clone() if a is not None else None for a in args]
    bad = list(args)
    bad[1] = bad[1].double()
    # TypeError and ValueError: lbopt.LbOptTypeError / LbOptValueError from Python's registration, torch's own
    # from the libtorch plugin's
    with pytest.raises(TypeError, match=r"slots\[0\]\.grad: dtype float64"):
        T.OPS["adamw_step_capturable_4bit"](*bad)
    bad = list(args)
    bad[2] = bad[2][:-1]
    with pytest.raises(ValueError, match=r"slots\[0\]\.m\.codes: has 2066 elements"):
        T.OPS["adamw_step_capturable_4bit"](*bad)
    bad = list(args)
    bad[8] = torch.tensor([1e-3, 2e-3])
    with pytest.raises(ValueError, match=r"lr: has 2 elements, expected 1"):
        T.OPS["adamw_step_capturable_4bit"](*bad)
    for a, b in zip(args, before):
        assert a is None or torch.equal(a, b)


def test_a_tensor_of_a_backend_without_a_kernel_is_refused_by_the_dispatcher():
    """Only CPU and CUDA kernels (and the fake one) are registered: a sparse (or XPU, MPS, ...) tensor is refused by
    the dispatcher, naming the op and the backend, before anything runs."""
    args = step_args("4bit", True, seed=7)
    before = args[0].clone()
    bad = list(args)
    bad[1] = torch.sparse_coo_tensor(torch.zeros(1, 0, dtype=torch.long), torch.zeros(0), (N,))
    with pytest.raises(NotImplementedError, match=r"lbopt::adamw_step_capturable_4bit.*'SparseCPU' backend"):
        T.OPS["adamw_step_capturable_4bit"](*bad)
    assert torch.equal(args[0], before)


def test_jax_refuses_a_grad_of_another_dtype_naming_it():
    jnp = pytest.importorskip("jax.numpy")
    LJ = pytest.importorskip("lbopt.jax")
    lay = F.state_layout("4bit", 5000)
    codes, scales = jnp.zeros(lay["codes_numel"], jnp.uint8), jnp.zeros(lay["scales_numel"], jnp.float32)
    args = [jnp.zeros(5000), jnp.zeros(5000, jnp.int32), codes, scales, codes, scales, None, None,
            jnp.float32(1e-3), jnp.float32(1), None]
    with pytest.raises(Exception, match=r"slots\[0\]\.grad: dtype int32 is not supported"):
        LJ.invoke("lbopt.adamw_step_capturable.4bit", args)[0].block_until_ready()


# ---- the libtorch plugin -------------------------------------------------------------------------------------

PLUGIN_CHECK = """
import hashlib, json, torch
import lbopt.torch_ops as T
from lbopt import _abi
ops = {name: str(op.default._schema) for name, op in T.OPS.items()}
g = torch.Generator().manual_seed(3)
p, grad = torch.randn(4133, generator=g), torch.randn(4133, generator=g)
lay = __import__("lbopt.functional").functional.state_layout("4bit", 4133)
st = [torch.zeros(lay["codes_numel"], dtype=torch.uint8), torch.zeros(lay["scales_numel"])] * 2
st = [t.clone() for t in st]
for step in (1, 2):
    T.OPS["adamw_step_4bit"](p, grad, *st, None, None, None, lr=1e-2, step=step, weight_decay=0.1)
digest = [hashlib.sha256(t.numpy().tobytes()).hexdigest() for t in [p, *st]]
print(json.dumps({"plugin": T.PLUGIN, "schemas": ops, "digest": digest}))
"""


def python_env(**extra):
    """This process's environment, the lbopt package it imports first on the path, and extra variables."""
    env = {**os.environ, **extra}
    package = str(pathlib.Path(F.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([package] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def run_registration(**extra):
    out = subprocess.run([sys.executable, "-c", PLUGIN_CHECK], env=python_env(**extra), capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout)


def test_the_plugin_and_the_python_registration_are_the_same_ops():
    """Where the libtorch plugin is built, lbopt.torch_ops registers the ops through it (the rest of this file then
    tests the plugin's ops); its schemas and results equal the Python registration's."""
    if T.PLUGIN is None:
        pytest.skip("lbopt was built without the libtorch plugin")
    plugin, python = run_registration(), run_registration(LBOPT_TORCH_PLUGIN="none")
    assert plugin["plugin"] == T.PLUGIN and python["plugin"] is None
    assert plugin["schemas"] == python["schemas"] and len(plugin["schemas"]) == _abi.lib.lbopt_op_count()
    assert plugin["digest"] == python["digest"]


def test_a_plugin_that_cannot_load_falls_back_to_python_with_a_warning(tmp_path):
    broken = tmp_path / "liblbopt_torch.so"
    broken.write_bytes(b"not a shared library")
    script = "import lbopt.torch_ops as T; print(T.PLUGIN, len(T.OPS))"
    out = subprocess.run([sys.executable, "-W", "always", "-c", script],
                         env=python_env(LBOPT_TORCH_PLUGIN=str(broken)), capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["None", str(_abi.lib.lbopt_op_count())]
    assert "did not load" in out.stderr and "registering the ops from Python" in out.stderr

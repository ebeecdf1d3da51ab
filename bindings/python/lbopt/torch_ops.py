"""Every operator of lbopt's registry as a torch custom op in the `lbopt` namespace, generated at import by
walking lbopt_op_count / lbopt_op_schema: nothing here is written per operator.

    import lbopt.torch_ops
    torch.ops.lbopt.adamw_step_capturable_4bit(p, g, m_codes, m_scales, v_codes, v_scales, None, None, lr, step,
                                               None, weight_decay=0.01)

Names: the registry's with the "lbopt." prefix dropped and dots as underscores (lbopt.adamw_step.4bit ->
torch.ops.lbopt.adamw_step_4bit). Schemas: tensors in the registry's order, those the operator writes annotated
as mutated (`Tensor(a!)`), optional ones as `Tensor?`; then the attributes as typed keyword arguments with the
registry's defaults (double -> float, int64 -> int, bool -> bool, string -> str). Every op returns nothing: it
writes its outputs in place. CPU and CUDA kernels call lbopt_op_invoke on DLPack views of the tensors (so they
validate exactly like the C entry points); fake kernels do nothing, so FakeTensor tracing and torch.compile see
the ops as opaque mutations. The tensor-lr steps (adamw_, sgd_, lion_ and ademamix_step_capturable_*) take lr
and step as scalar tensors: a compiled program that calls them keeps one form whatever the schedule.

Where lbopt was built with the libtorch plugin (liblbopt_torch.so next to the C library, or at
$LBOPT_TORCH_PLUGIN), the ops are that plugin's instead, registered in C++ with the same schemas, CPU and CUDA
kernels and Meta kernels for tracing, so TorchScript and C++ code see them too; refusals raise TypeError, ValueError
or RuntimeError with the library's message. Either registration, never both: LBOPT_TORCH_PLUGIN=none keeps the
Python one, and a plugin that cannot load (built against another torch) falls back to it with a warning.
"""
import ctypes
import os
import pathlib
import warnings

import torch

from . import _abi
from ._torch_views import tensor_view

_TYPES = {_abi.ATTR_DOUBLE: "float", _abi.ATTR_INT64: "int", _abi.ATTR_BOOL: "bool", _abi.ATTR_STRING: "str"}


def torch_name(registry_name):
    return registry_name.removeprefix("lbopt.").replace(".", "_")


def _default(a):
    if a.type == _abi.ATTR_DOUBLE:
        return repr(float(a.default_double))
    if a.type == _abi.ATTR_INT64:
        return str(int(a.default_int))
    if a.type == _abi.ATTR_BOOL:
        return "True" if a.default_int else "False"
    return repr((a.default_string or b"").decode())


def schema(op):
    """The torch schema of registry operator op (an lbopt_op_info)."""
    args, alias = [], iter("abcdefghijklmnopqrstuvwxyz")
    for k in range(op.n_tensors):
        t = op.tensors[k]
        kind = f"Tensor({next(alias)}!)" if t.role in (_abi.ROLE_OUT, _abi.ROLE_INOUT) else "Tensor"
        args.append(f"{kind}{'?' if t.optional else ''} {t.name.decode()}")
    for k in range(op.n_attrs):
        a = op.attrs[k]
        default = "" if a.required else "=" + _default(a)
        args.append(f"{_TYPES[a.type]} {a.name.decode()}{default}")
    return f"{torch_name(op.name.decode())}({', '.join(args)}) -> ()"


def _kernel(op_ptr):
    op = op_ptr.contents
    n_tensors = op.n_tensors
    attrs = [(op.attrs[k].name, op.attrs[k].type) for k in range(op.n_attrs)]

    def kernel(*args, **kwargs):
        tensors = args[:n_tensors]
        views = [None if t is None else tensor_view(t) for t in tensors]
        ptrs = (ctypes.POINTER(_abi.DLTensor) * n_tensors)(*[v.ptr if v is not None else None for v in views])
        # the attributes given, positionally or by name; the registry fills in the defaults of the others
        values = dict(zip((name for name, _ in attrs), args[n_tensors:]))
        values.update((k.encode(), v) for k, v in kwargs.items())
        present = [(n, k) for n, k in attrs if n in values]  # the dispatcher has refused any other name
        given = (_abi.Attr * len(present))()
        keep = []
        for slot, (name, kind) in zip(given, present):
            value = values[name]
            slot.name, slot.type = name, kind
            if kind == _abi.ATTR_DOUBLE:
                slot.f = value
            elif kind == _abi.ATTR_STRING:
                keep.append(value.encode())
                slot.s = keep[-1]
            else:
                slot.i = int(value)
        device = next((t.device for t in tensors if t is not None), None)
        stream = (torch.cuda.current_stream(device).cuda_stream
                  if device is not None and device.type == "cuda" else None)
        _abi.check(_abi.lib.lbopt_op_invoke(op_ptr, ptrs, n_tensors, given, len(present), stream))

    return kernel


def _fake(*args, **kwargs):
    return None


def _register():
    lib = torch.library.Library("lbopt", "DEF")
    ops = {}
    for i in range(_abi.lib.lbopt_op_count()):
        op_ptr = _abi.lib.lbopt_op_schema(i)
        name = torch_name(op_ptr.contents.name.decode())
        lib.define(schema(op_ptr.contents))
        kernel = _kernel(op_ptr)
        for key in ("CPU", "CUDA"):
            lib.impl(name, kernel, key)
        torch.library.register_fake(f"lbopt::{name}", _fake, lib=lib)
        ops[name] = getattr(torch.ops.lbopt, name)
    return lib, ops


def _plugin_path():
    """The libtorch plugin to load: $LBOPT_TORCH_PLUGIN ('none': no plugin), else the one next to the C library."""
    env = os.environ.get("LBOPT_TORCH_PLUGIN")
    if env:
        return None if env == "none" else env
    path = pathlib.Path(getattr(_abi.lib, "_name", "")).resolve().parent / "liblbopt_torch.so"
    return str(path) if path.exists() else None


def _plugin_ops(path):
    """The plugin's ops, or None where it cannot load here (warned: the Python registration takes its place)."""
    try:
        torch.ops.load_library(path)
    except OSError as e:
        warnings.warn(f"lbopt.torch_ops: the libtorch plugin {path} did not load ({e}); registering the ops from "
                      f"Python instead", RuntimeWarning, stacklevel=3)
        return None
    names = (torch_name(_abi.lib.lbopt_op_schema(i).contents.name.decode()) for i in range(_abi.lib.lbopt_op_count()))
    return {name: getattr(torch.ops.lbopt, name) for name in names}


PLUGIN = _plugin_path()
OPS = _plugin_ops(PLUGIN) if PLUGIN else None
if OPS is None:
    PLUGIN = None
    _LIBRARY, OPS = _register()  # the Library must live as long as the ops

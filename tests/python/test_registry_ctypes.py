"""The docs/plugins.md Python example: walk the operator registry with plain ctypes (no lbopt package) and run
the 4-bit step through lbopt_op_invoke on NumPy buffers."""
import ctypes
import os

import numpy as np

from lbopt import _abi  # only for the library path and the DLTensor layout


class TensorArg(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("role", ctypes.c_int32), ("dtypes", ctypes.c_uint32),
                ("optional", ctypes.c_int32), ("shape", ctypes.c_char_p)]


class AttrArg(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("type", ctypes.c_int32), ("required", ctypes.c_int32),
                ("default_double", ctypes.c_double), ("default_int", ctypes.c_int64),
                ("default_string", ctypes.c_char_p)]


class OpInfo(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("name", ctypes.c_char_p), ("version", ctypes.c_int32),
                ("doc", ctypes.c_char_p), ("n_tensors", ctypes.c_size_t), ("tensors", ctypes.POINTER(TensorArg)),
                ("n_attrs", ctypes.c_size_t), ("attrs", ctypes.POINTER(AttrArg))]


class Attr(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("type", ctypes.c_int32), ("f", ctypes.c_double), ("i", ctypes.c_int64),
                ("s", ctypes.c_char_p)]


def view(a):
    shape = (ctypes.c_int64 * 1)(a.size)
    code, bits = {"float32": (2, 32), "uint8": (1, 8), "int64": (0, 64)}[a.dtype.name]
    t = _abi.DLTensor(a.ctypes.data, _abi.DLDevice(1, 0), 1, _abi.DLDataType(code, bits, 1), shape, None, 0)
    return t, shape


def test_registry_walk_and_invoke_with_plain_ctypes():
    lib = ctypes.CDLL(os.environ.get("LBOPT_LIBRARY") or _abi.lib._name)
    lib.lbopt_op_count.restype = ctypes.c_size_t
    lib.lbopt_op_schema.restype = ctypes.POINTER(OpInfo)
    lib.lbopt_op_schema.argtypes = [ctypes.c_size_t]
    lib.lbopt_op_invoke.argtypes = [ctypes.POINTER(OpInfo), ctypes.POINTER(ctypes.POINTER(_abi.DLTensor)),
                                    ctypes.c_size_t, ctypes.POINTER(Attr), ctypes.c_size_t, ctypes.c_void_p]
    lib.lbopt_last_error.restype = ctypes.c_char_p
    ops = {lib.lbopt_op_schema(i).contents.name.decode(): lib.lbopt_op_schema(i) for i in range(lib.lbopt_op_count())}
    step = ops["lbopt.adamw_step.4bit"]
    names = [step.contents.tensors[k].name.decode() for k in range(step.contents.n_tensors)]
    assert names[:3] == ["param", "grad", "m_codes"]

    n = 1000
    p = np.linspace(-1, 1, n, dtype=np.float32)
    g = np.full(n, 0.5, dtype=np.float32)
    mc, vc = np.zeros((n + 1) // 2, np.uint8), np.zeros((n + 1) // 2, np.uint8)
    ms, vs = np.zeros(8, np.float32), np.zeros(8, np.float32)
    views = [view(a) for a in (p, g, mc, ms, vc, vs)]
    ptrs = (ctypes.POINTER(_abi.DLTensor) * 9)(*[ctypes.pointer(t) for t, _ in views], None, None, None)
    p0 = p.copy()
    for s in range(1, 4):
        attrs = (Attr * 2)(Attr(b"lr", 0, 1e-2 / s, 0, None), Attr(b"step", 1, 0.0, s, None))
        assert lib.lbopt_op_invoke(step, ptrs, 9, attrs, 2, None) == 0, lib.lbopt_last_error()
    assert np.all(p < p0)  # a positive gradient moves every weight down
    bad = (Attr * 1)(Attr(b"lr", 0, 1e-2, 0, None))
    assert lib.lbopt_op_invoke(step, ptrs, 9, bad, 1, None) == 3  # LBOPT_ERR_INVALID_VALUE
    assert b"'step'" in lib.lbopt_last_error()

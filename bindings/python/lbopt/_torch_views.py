"""DLTensor views of torch tensors, built from their metadata (no DLPack capsule): what lbopt.torch, lbopt.torch_ops
and the readers of other libraries' states hand to the C library. Kept apart from lbopt._dlpack, which serves the
NumPy path (lbopt.functional) and must not import torch.
"""
import torch

from . import _abi
from ._dlpack import View


def dl_dtype(dt):
    """DLPack (code, bits, lanes) of a torch dtype; the library judges whether it is supported."""
    bits = dt.itemsize * 8
    if dt == torch.bfloat16:
        return (_abi.kDLBfloat, bits, 1)
    if dt.is_complex:
        return (5, bits, 1)
    if dt.is_floating_point:
        return (_abi.kDLFloat, bits, 1)
    if dt == torch.bool:
        return (6, bits, 1)
    return (_abi.kDLInt if dt.is_signed else _abi.kDLUInt, bits, 1)


def dl_device(t):
    """DLPack (device type, id) of a tensor's device."""
    if t.device.type == "cpu":
        return (_abi.kDLCPU, 0)
    if t.device.type == "cuda":
        return (_abi.kDLCUDA, t.device.index)
    raise ValueError(f"lbopt: tensors on {t.device} are not supported (cpu or cuda)")


def tensor_view(t):
    """A DLTensor view of a strided tensor. The view holds the tensor's storage too, so the memory it points to
    stays allocated even if the tensor's data is later swapped."""
    if t.layout != torch.strided:
        raise TypeError(f"lbopt: {t.layout} tensors are not supported; gradients and params must be dense")
    device = dl_device(t)
    return View.from_parts(t.data_ptr(), t.shape, t.stride(), dl_dtype(t.dtype), device, (t, t.untyped_storage()))

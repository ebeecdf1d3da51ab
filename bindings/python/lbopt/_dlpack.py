"""Borrowed DLTensor views of any object that exports DLPack (NumPy, PyTorch, CuPy, ...), for lbopt.functional.

A view keeps its producer alive (the capsule, which is never consumed or renamed, or the tensor itself), so the
memory it points to stays valid for as long as the view is used. lbopt._torch_views builds Views of torch
tensors from their metadata instead of a capsule.
"""
import ctypes

from . import _abi

_pythonapi = ctypes.pythonapi
_pythonapi.PyCapsule_GetName.restype = ctypes.c_char_p
_pythonapi.PyCapsule_GetName.argtypes = [ctypes.py_object]
_pythonapi.PyCapsule_GetPointer.restype = ctypes.c_void_p
_pythonapi.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


class View:
    """A DLTensor the library can read, plus what keeps its memory and metadata alive."""

    __slots__ = ("dl", "ptr", "shape", "strides", "owner")

    def __init__(self):
        self.dl = _abi.DLTensor()
        self.ptr = ctypes.pointer(self.dl)
        self.shape = self.strides = self.owner = None

    @classmethod
    def from_parts(cls, data_ptr, shape, strides, dtype, device, owner):
        """A view built without a capsule (the fast path for framework tensors whose metadata is known)."""
        v = cls()
        v.set(data_ptr, shape, strides, dtype, device, owner)
        return v

    def set(self, data_ptr, shape, strides, dtype, device, owner):
        ndim = len(shape)
        self.shape = (ctypes.c_int64 * ndim)(*shape)
        self.strides = (ctypes.c_int64 * ndim)(*strides) if strides is not None else None
        d = self.dl
        d.data = data_ptr
        d.device = _abi.DLDevice(*device)
        d.ndim = ndim
        d.dtype = _abi.DLDataType(*dtype)
        d.shape = self.shape
        d.strides = self.strides
        d.byte_offset = 0
        self.owner = owner

    @property
    def numel(self):
        n = 1
        for i in range(self.dl.ndim):
            n *= self.dl.shape[i]
        return n


def borrow(obj, writable=False):
    """A View of obj through its __dlpack__ export. writable=True refuses read-only exports."""
    if isinstance(obj, View):
        return obj
    if not hasattr(obj, "__dlpack__"):
        raise TypeError(f"lbopt: {type(obj).__name__} does not export DLPack (__dlpack__)")
    try:
        capsule = obj.__dlpack__(max_version=(1, 0))
    except TypeError:  # a producer older than the versioned protocol
        capsule = obj.__dlpack__()
    name = _pythonapi.PyCapsule_GetName(capsule)
    ptr = _pythonapi.PyCapsule_GetPointer(capsule, name)
    if name == b"dltensor_versioned":
        managed = _abi.DLManagedTensorVersioned.from_address(ptr)
        if writable and managed.flags & _abi.DLPACK_FLAG_BITMASK_READ_ONLY:
            raise ValueError(f"lbopt: a {type(obj).__name__} exported read-only cannot be updated in place")
    elif name == b"dltensor":
        managed = _abi.DLManagedTensor.from_address(ptr)
    else:
        raise TypeError(f"lbopt: unexpected DLPack capsule name {name!r}")
    v = View()
    ctypes.memmove(ctypes.addressof(v.dl), ctypes.addressof(managed.dl_tensor), ctypes.sizeof(_abi.DLTensor))
    v.owner = (capsule, obj)  # the capsule owns shape/strides; obj the memory
    return v

"""lbopt: low-bit (4-bit, 8-bit, FP8) AdamW / Adam optimizer states behind a C ABI.

`lbopt.functional` steps any in-place DLPack arrays (NumPy, PyTorch); `lbopt.torch` holds drop-in
`torch.optim.Optimizer`s (AdamW4bit, AdamW8bit, AdamWFp8, Adam4bit, Adam8bit, AdamFp8, AdamW).
"""
import json

from ._abi import LbOptError, LbOptTypeError, LbOptValueError, lib

__all__ = ["LbOptError", "LbOptTypeError", "LbOptValueError", "build_info", "set_num_threads", "get_num_threads",
           "version"]


def version():
    """The loaded C library's version string."""
    return lib.lbopt_version_string().decode()


def build_info():
    """The C library's build description (dict): CPU kernels, threads, CUDA."""
    return json.loads(lib.lbopt_build_info().decode())


def set_num_threads(n):
    """Threads of the library's CPU pool; 0 restores the default (LBOPT_NUM_THREADS, else the process's cores)."""
    from ._abi import check

    check(lib.lbopt_set_num_threads(int(n)))


def get_num_threads():
    return lib.lbopt_get_num_threads()


__version__ = version()

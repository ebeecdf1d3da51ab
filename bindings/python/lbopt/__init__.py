"""lbopt: low-bit optimizer states (4-bit, 8-bit, FP8, or fp32) for AdamW, Adam, SGD with momentum, Lion,
AdEMAMix and Muon, stepped in place by the lbopt C library (CPU, and CUDA where it was built with it) behind a C
ABI.

  lbopt.torch       drop-in torch.optim optimizers: AdamW4bit, AdamW8bit, AdamWFp8, AdamW (fp32 states);
                    Adam4bit, Adam8bit, AdamFp8; SGD4bit ... SGD; Lion4bit ... Lion; AdEMAMix4bit ... AdEMAMix;
                    Muon4bit ... Muon (with muon_param_groups); and LowBitAdamW, LowBitSGD, LowBitLion,
                    LowBitAdEMAMix, LowBitMuon, which take the kind as state_kind
  lbopt.offload     CPUOffload: any lbopt.torch optimizer with its states in host memory, params on the GPU
  lbopt.functional  one fused step of any optimizer over in-place DLPack arrays (NumPy, PyTorch, ...), states
                    made, quantized and decoded; needs neither torch nor jax
  lbopt.torch_ops   every operator of the library's registry as a torch custom op (torch.ops.lbopt.*)
  lbopt.jax         the registry's operators through an XLA FFI custom call, and optax transformations
  lbopt.demo        a character-level language model trained with fp32, 8-bit and 4-bit states

This module: the loaded library's version() and build_info(), the threads of its CPU pool
(set_num_threads, get_num_threads), the errors it raises (LbOptError, LbOptTypeError, LbOptValueError), and where
an installed wheel keeps the C header and pkg-config file (get_include, get_pkgconfig_dir) for C and C++ code.
"""
import json
import pathlib

from ._abi import LbOptError, LbOptTypeError, LbOptValueError, lib

__all__ = ["LbOptError", "LbOptTypeError", "LbOptValueError", "build_info", "set_num_threads", "get_num_threads",
           "version", "get_include", "get_pkgconfig_dir"]

_HERE = pathlib.Path(__file__).resolve().parent


def get_include():
    """The directory of lbopt.h: the package's own in a wheel, the source tree's abi/ in a checkout."""
    own = _HERE / "include"
    return str(own if own.is_dir() else _HERE.parents[1] / "abi")


def get_pkgconfig_dir():
    """The directory of the wheel's lbopt.pc (for PKG_CONFIG_PATH); None in a checkout, whose build writes its
    own (meson-private/lbopt.pc)."""
    own = _HERE / "pkgconfig"
    return str(own) if own.is_dir() else None


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

"""ctypes declarations of the lbopt C ABI (abi/lbopt.h) and the library loader.

The library is found, in order, at $LBOPT_LIBRARY, next to this package (a wheel built by meson-python), or
through the system loader (liblbopt.so.<ABI major>). Its ABI major must equal ABI_MAJOR.
"""
import ctypes
import os
import pathlib

ABI_MAJOR = 0  # the LBOPT_VERSION_MAJOR these declarations were written for

# ---- DLPack --------------------------------------------------------------------------------------------------
kDLCPU, kDLCUDA, kDLCUDAHost = 1, 2, 3
kDLInt, kDLUInt, kDLFloat, kDLBfloat = 0, 1, 2, 4


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [
        ("version", DLPackVersion),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", DLTensor),
    ]


DLPACK_FLAG_BITMASK_READ_ONLY = 1

# ---- lbopt ---------------------------------------------------------------------------------------------------
STATE_4BIT, STATE_8BIT, STATE_FP8, STATE_FP32 = 0, 1, 2, 3
MOMENT_FIRST, MOMENT_SECOND, MOMENT_SECOND_SIGNED = 0, 1, 2

FLAG_ADAM_COUPLED_DECAY = 0x1
FLAG_AMSGRAD = 0x2
FLAG_MAXIMIZE = 0x4
FLAG_BF16_STOCHASTIC_ROUND = 0x8
FLAG_SKIP_NONFINITE = 0x10
FLAG_NESTEROV = 0x20
FLAG_STATE_STOCHASTIC_ROUND = 0x40
FLAG_STATE_NEAREST_ROUND = 0x80
FLAG_NU_LINEAR_MAP = 0x100

STEP_DEVICES_KNOWN = 0x1  # lbopt_step_options.flags

OPTIMIZER_ADAMW, OPTIMIZER_SGD, OPTIMIZER_LION, OPTIMIZER_ADEMAMIX, OPTIMIZER_MUON = 0, 1, 2, 3, 4
MAX_STATES = 3

OK = 0
(ERR_NULL_POINTER, ERR_STRUCT_SIZE, ERR_INVALID_VALUE, ERR_DTYPE, ERR_DEVICE, ERR_SHAPE, ERR_STRIDE, ERR_ALIGNMENT,
 ERR_BUFFER_SIZE, ERR_OVERLAP, ERR_NONFINITE, ERR_UNSUPPORTED, ERR_CUDA, ERR_OUT_OF_MEMORY, ERR_INTERNAL) = range(1, 16)


class Layout(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("codes_dtype", DLDataType),
        ("codes_numel", ctypes.c_int64),
        ("codes_bytes", ctypes.c_int64),
        ("scales_numel", ctypes.c_int64),
        ("block_size", ctypes.c_int64),
    ]


class State(ctypes.Structure):
    _fields_ = [("codes", ctypes.POINTER(DLTensor)), ("scales", ctypes.POINTER(DLTensor))]


class AdamWConfig(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("state_kind", ctypes.c_int),
        ("beta1", ctypes.c_double),
        ("beta2", ctypes.c_double),
        ("eps", ctypes.c_double),
        ("weight_decay", ctypes.c_double),
        ("flags", ctypes.c_uint32),
        ("seed", ctypes.c_uint64),
    ]


class AdamWSlot(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("param", ctypes.POINTER(DLTensor)),
        ("grad", ctypes.POINTER(DLTensor)),
        ("m", State),
        ("v", State),
        ("vmax", State),
        ("step", ctypes.c_int64),
    ]


class OptimizerConfig(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("optimizer", ctypes.c_int),
        ("state_kind", ctypes.c_int),
        ("flags", ctypes.c_uint32),
        ("seed", ctypes.c_uint64),
        ("beta1", ctypes.c_double),
        ("beta2", ctypes.c_double),
        ("beta3", ctypes.c_double),
        ("eps", ctypes.c_double),
        ("weight_decay", ctypes.c_double),
        ("momentum", ctypes.c_double),
        ("dampening", ctypes.c_double),
        ("alpha", ctypes.c_double),
        ("t_alpha", ctypes.c_double),
        ("t_beta3", ctypes.c_double),
    ]


class StateInfo(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("moment", ctypes.c_int32)]


class FieldInfo(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("type", ctypes.c_int32), ("flag", ctypes.c_uint32),
                ("default_value", ctypes.c_double), ("min", ctypes.c_double), ("max", ctypes.c_double),
                ("max_inclusive", ctypes.c_int32), ("reserved", ctypes.c_int32)]


class Slot(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("param", ctypes.POINTER(DLTensor)),
        ("grad", ctypes.POINTER(DLTensor)),
        ("states", State * MAX_STATES),
        ("step", ctypes.c_int64),
    ]


class StepOptions(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("grad_scale", ctypes.POINTER(DLTensor)),
        ("found_inf", ctypes.POINTER(DLTensor)),
        ("skipped", ctypes.POINTER(DLTensor)),
        ("stream", ctypes.c_void_p),
        ("flags", ctypes.c_uint32),
    ]


# ---- the operator registry ---------------------------------------------------------------------------------
ROLE_IN, ROLE_OUT, ROLE_INOUT = 0, 1, 2
ATTR_DOUBLE, ATTR_INT64, ATTR_BOOL, ATTR_STRING = 0, 1, 2, 3


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


class LbOptError(RuntimeError):
    """A failed lbopt call: .status is the lbopt_status, the text is lbopt_last_error()."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


class LbOptValueError(LbOptError, ValueError):
    """Bad values, shapes, devices, sizes or overlapping buffers."""


class LbOptTypeError(LbOptError, TypeError):
    """Unsupported or mismatched dtypes, or a struct of the wrong size."""


_TYPE_ERRORS = {ERR_DTYPE, ERR_STRUCT_SIZE}
_VALUE_ERRORS = {ERR_NULL_POINTER, ERR_INVALID_VALUE, ERR_DEVICE, ERR_SHAPE, ERR_STRIDE, ERR_ALIGNMENT,
                 ERR_BUFFER_SIZE, ERR_OVERLAP, ERR_NONFINITE}


def _candidates():
    env = os.environ.get("LBOPT_LIBRARY")
    if env:
        yield env
        return
    here = pathlib.Path(__file__).resolve().parent
    for name in (f"liblbopt.so.{ABI_MAJOR}", "liblbopt.so", "liblbopt.dylib", "lbopt.dll"):
        if (here / name).exists():
            yield str(here / name)
    yield f"liblbopt.so.{ABI_MAJOR}"


def _load():
    errors = []
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
            break
        except OSError as e:
            errors.append(f"{path}: {e}")
    else:
        raise ImportError("lbopt: cannot load the C library (set LBOPT_LIBRARY to liblbopt.so): " + "; ".join(errors))
    lib.lbopt_version.restype = ctypes.c_uint32
    major = lib.lbopt_version() >> 16
    if major != ABI_MAJOR:
        raise ImportError(f"lbopt: {getattr(lib, '_name', path)} has ABI major {major}, these bindings need {ABI_MAJOR}")
    st = ctypes.c_int
    P = ctypes.POINTER
    sigs = {
        "lbopt_status_string": (ctypes.c_char_p, [st]),
        "lbopt_last_error": (ctypes.c_char_p, []),
        "lbopt_version_string": (ctypes.c_char_p, []),
        "lbopt_build_info": (ctypes.c_char_p, []),
        "lbopt_state_layout": (st, [ctypes.c_int, ctypes.c_int64, P(Layout), ctypes.c_size_t]),
        "lbopt_state_init": (st, [ctypes.c_int, ctypes.c_int64, State, ctypes.c_void_p]),
        "lbopt_quantize": (st, [ctypes.c_int, ctypes.c_int, P(DLTensor), State, ctypes.c_void_p]),
        "lbopt_dequantize": (st, [ctypes.c_int, ctypes.c_int, State, P(DLTensor), ctypes.c_void_p]),
        "lbopt_adamw_config_init": (st, [P(AdamWConfig), ctypes.c_size_t]),
        "lbopt_step_options_init": (st, [P(StepOptions), ctypes.c_size_t]),
        "lbopt_adamw_step": (st, [P(AdamWConfig), ctypes.c_double, P(AdamWSlot), ctypes.c_size_t, P(StepOptions)]),
        "lbopt_adamw_config_validate": (st, [P(AdamWConfig), ctypes.c_double]),
        "lbopt_adamw_step_validate": (st, [P(AdamWConfig), ctypes.c_double, P(AdamWSlot), ctypes.c_size_t,
                                           P(StepOptions)]),
        "lbopt_state_kind_name": (ctypes.c_char_p, [ctypes.c_int]),
        "lbopt_optimizer_name": (ctypes.c_char_p, [ctypes.c_int]),
        "lbopt_optimizer_config_init": (st, [P(OptimizerConfig), ctypes.c_size_t, ctypes.c_int]),
        "lbopt_optimizer_config_validate": (st, [P(OptimizerConfig), ctypes.c_double]),
        "lbopt_optimizer_states": (st, [P(OptimizerConfig), P(StateInfo), P(ctypes.c_size_t)]),
        "lbopt_optimizer_fields": (st, [ctypes.c_int, P(P(FieldInfo)), P(ctypes.c_size_t)]),
        "lbopt_optimizer_config_set": (st, [P(OptimizerConfig), ctypes.c_char_p, ctypes.c_double]),
        "lbopt_step": (st, [P(OptimizerConfig), ctypes.c_double, P(Slot), ctypes.c_size_t, P(StepOptions)]),
        "lbopt_step_validate": (st, [P(OptimizerConfig), ctypes.c_double, P(Slot), ctypes.c_size_t,
                                     P(StepOptions)]),
        "lbopt_op_count": (ctypes.c_size_t, []),
        "lbopt_op_schema": (P(OpInfo), [ctypes.c_size_t]),
        "lbopt_op_invoke": (st, [P(OpInfo), P(P(DLTensor)), ctypes.c_size_t, P(Attr), ctypes.c_size_t,
                                 ctypes.c_void_p]),
        "lbopt_set_num_threads": (st, [ctypes.c_int]),
        "lbopt_get_num_threads": (ctypes.c_int, []),
    }
    for name, (restype, argtypes) in sigs.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    return lib


lib = _load()


def check(status):
    """Raise the exception matching an lbopt_status, with the library's message."""
    if status == OK:
        return
    message = lib.lbopt_last_error().decode() or lib.lbopt_status_string(status).decode()
    if status in _TYPE_ERRORS:
        raise LbOptTypeError(status, message)
    if status in _VALUE_ERRORS:
        raise LbOptValueError(status, message)
    raise LbOptError(status, message)


def layout(kind, numel):
    out = Layout()
    check(lib.lbopt_state_layout(kind, numel, ctypes.byref(out), ctypes.sizeof(out)))
    return out


def adamw_config(kind, betas, eps, weight_decay, flags, seed):
    cfg = AdamWConfig()
    check(lib.lbopt_adamw_config_init(ctypes.byref(cfg), ctypes.sizeof(cfg)))
    cfg.state_kind = kind
    cfg.beta1, cfg.beta2 = float(betas[0]), float(betas[1])
    cfg.eps, cfg.weight_decay = float(eps), float(weight_decay)
    cfg.flags, cfg.seed = flags, seed
    return cfg


def _names(fn):
    """The names the library gives values 0, 1, ... of one of its enums (until it gives none)."""
    out, i = {}, 0
    while (name := fn(i)) is not None:
        out[name.decode()] = i
        i += 1
    return out


KINDS = _names(lib.lbopt_state_kind_name)          # '4bit' -> LBOPT_STATE_4BIT, ...
OPTIMIZERS = _names(lib.lbopt_optimizer_name)      # 'adamw' -> LBOPT_OPTIMIZER_ADAMW, ...


def optimizer_config(optimizer, kind, flags=0, seed=0, **fields):
    """An lbopt_optimizer_config: the optimizer's defaults, then kind, flags, seed and the given fields."""
    cfg = OptimizerConfig()
    check(lib.lbopt_optimizer_config_init(ctypes.byref(cfg), ctypes.sizeof(cfg), optimizer))
    cfg.state_kind, cfg.flags, cfg.seed = kind, flags, seed
    for name, value in fields.items():
        setattr(cfg, name, float(value))
    return cfg


def state_rounding_flags(stochastic):
    """The flag of state_stochastic_round=stochastic: True, False, or None for the library's default (stochastic
    first-moment codes for SGD, Lion and AdEMAMix on 4-bit and FP8 states); ValueError for any other value."""
    if stochastic is None:
        return 0
    if stochastic is not True and stochastic is not False:
        raise ValueError(f"lbopt: state_stochastic_round must be None, True or False, not {stochastic!r}")
    return FLAG_STATE_STOCHASTIC_ROUND if stochastic else FLAG_STATE_NEAREST_ROUND


def optimizer_states(cfg):
    """The states a step of cfg uses, in slot order: ((name, moment), ...)."""
    infos = (StateInfo * MAX_STATES)()
    n = ctypes.c_size_t()
    check(lib.lbopt_optimizer_states(ctypes.byref(cfg), infos, ctypes.byref(n)))
    return tuple((infos[i].name.decode(), infos[i].moment) for i in range(n.value))


def optimizer_fields(optimizer):
    """The fields and flags an optimizer reads beyond the common ones, as the library lists them
    (lbopt_optimizer_fields): {name: FieldInfo}, fields first, in its registry operators' order."""
    fields = ctypes.POINTER(FieldInfo)()
    n = ctypes.c_size_t()
    check(lib.lbopt_optimizer_fields(optimizer, ctypes.byref(fields), ctypes.byref(n)))
    return {fields[i].name.decode(): fields[i] for i in range(n.value)}

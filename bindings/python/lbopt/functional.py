"""A framework-agnostic lbopt step on any in-place DLPack arrays (NumPy, PyTorch, ...).

Arrays are borrowed, never copied: params and states are updated in place. NumPy example::

    import numpy as np, lbopt.functional as F
    p = np.random.randn(1000).astype(np.float32); g = np.ones_like(p)
    m, v = F.zeros_state("4bit", p.size), F.zeros_state("4bit", p.size)
    F.adamw_step([p], [g], [{"m": m, "v": v}], lr=1e-3, steps=[1], kind="4bit")

Any optimizer through step(): its states are named as the library names them (state_names)::

    buf = F.zeros_state("8bit", p.size)
    F.step("sgd", [p], [g], [{"momentum_buffer": buf}], lr=1e-2, steps=[1], kind="8bit", momentum=0.9)
"""
import ctypes

from . import _abi
from ._dlpack import borrow

KINDS = _abi.KINDS  # the library's names of its state kinds


def kind_id(kind):
    """The lbopt_state_kind of '4bit' / '8bit' / 'fp8' / 'fp32' (or an int already)."""
    if isinstance(kind, int):
        return kind
    try:
        return KINDS[kind]
    except KeyError:
        raise ValueError(f"lbopt: unknown state kind {kind!r} (one of {', '.join(KINDS)})") from None


def state_layout(kind, numel):
    """Sizes of one state: {'codes_numel', 'codes_bytes', 'codes_dtype' ('uint8' or 'float32'), 'scales_numel',
    'block_size'}."""
    lay = _abi.layout(kind_id(kind), numel)
    return {
        "codes_numel": lay.codes_numel,
        "codes_bytes": lay.codes_bytes,
        "codes_dtype": "float32" if lay.codes_dtype.code == _abi.kDLFloat else "uint8",
        "scales_numel": lay.scales_numel,
        "block_size": lay.block_size,
    }


def zeros_state(kind, numel, zeros=None):
    """A fresh (all-zero) state {'codes', 'scales'} from zeros(n, dtype_name) (default: numpy.zeros)."""
    if zeros is None:
        import numpy

        def zeros(n, dtype):
            return numpy.zeros(n, dtype=dtype)

    lay = state_layout(kind, numel)
    scales = zeros(lay["scales_numel"], "float32") if kind_id(kind) != _abi.STATE_FP32 else None
    return {"codes": zeros(lay["codes_numel"], lay["codes_dtype"]), "scales": scales}


def _state(st, views):
    """An lbopt_state of a {'codes', 'scales'} dict (or None); views collects what must stay alive."""
    if st is None:
        return _abi.State()
    codes = borrow(st["codes"], writable=True)
    scales = borrow(st["scales"], writable=True) if st.get("scales") is not None else None
    views += [codes, scales]
    return _abi.State(codes.ptr, scales.ptr if scales else None)


# the flags every optimizer reads; its own fields and flags are the library's (lbopt_optimizer_fields)
_COMMON_FLAGS = {"maximize": _abi.FLAG_MAXIMIZE, "bf16_stochastic_round": _abi.FLAG_BF16_STOCHASTIC_ROUND,
                 "skip_nonfinite": _abi.FLAG_SKIP_NONFINITE}


def config(optimizer, kind="4bit", *, seed=0, **options):
    """The lbopt_optimizer_config of optimizer ('adamw', 'sgd', 'lion', 'ademamix') with state kind `kind`:
    the library's defaults, overridden by the given fields and flags (bools) of those the optimizer reads
    (optimizer_fields), the common flags maximize, bf16_stochastic_round and skip_nonfinite, and
    state_stochastic_round (True, False, or None: the library's default, stochastic first-moment codes for SGD,
    Lion and AdEMAMix on 4-bit and FP8 states)."""
    try:
        opt = _abi.OPTIMIZERS[optimizer]
    except KeyError:
        raise ValueError(f"lbopt: unknown optimizer {optimizer!r} (one of {', '.join(_abi.OPTIMIZERS)})") from None
    own = _abi.optimizer_fields(opt)
    flag_bits = {**_COMMON_FLAGS, **{n: f.flag for n, f in own.items() if f.type == _abi.ATTR_BOOL}}
    fields = {n for n, f in own.items() if f.type == _abi.ATTR_DOUBLE}
    unknown = set(options) - fields - set(flag_bits) - {"state_stochastic_round"}
    if unknown:
        raise TypeError(f"lbopt: {optimizer} has no option(s) {', '.join(sorted(unknown))} (it reads "
                        f"{', '.join([*own, *_COMMON_FLAGS, 'state_stochastic_round'])})")
    flags = _abi.state_rounding_flags(options.pop("state_stochastic_round", None))
    for name, bit in flag_bits.items():
        if options.pop(name, False):
            flags |= bit
    cfg = _abi.optimizer_config(opt, kind_id(kind), flags, seed, **options)
    _abi.check(_abi.lib.lbopt_optimizer_config_validate(ctypes.byref(cfg), 0.0))
    return cfg


def optimizer_fields(optimizer):
    """The hyper-parameters and flags an optimizer reads beyond the common flags, as the library describes them:
    {name: {'type': 'double' or 'flag', 'default', 'min', 'max', 'max_inclusive'}}, in its operators' order."""
    out = {}
    for name, f in _abi.optimizer_fields(_abi.OPTIMIZERS[optimizer]).items():
        out[name] = ({"type": "flag"} if f.type == _abi.ATTR_BOOL else
                     {"type": "double", "default": f.default_value, "min": f.min, "max": f.max,
                      "max_inclusive": bool(f.max_inclusive)})
    return out


_MOMENT_NAMES = {_abi.MOMENT_FIRST: "m", _abi.MOMENT_SECOND: "v", _abi.MOMENT_SECOND_SIGNED: "v_signed"}


def state_names(optimizer, **options):
    """The names of the states a step of this optimizer and options uses, in order, with their moments, the
    codebooks quantize and dequantize take: 'm' (the signed maps), 'v' (the non-negative ones) or 'v_signed' (a
    non-negative state on the signed 4-bit map; 'v' on the other kinds): e.g. ('m1', 'm'), ('m2', 'm'),
    ('nu', 'v_signed') for AdEMAMix."""
    return tuple((name, _MOMENT_NAMES[moment]) for name, moment in _abi.optimizer_states(config(optimizer, **options)))


def step(optimizer, params, grads, states, lr, steps, *, kind="4bit", seed=0, **options):
    """One fused step of any optimizer over many tensors, in place. states[i] maps each name of
    state_names(optimizer, **options) to a state {'codes', 'scales'}; the other arguments as adamw_step's.
    Returns a list of bools: True where a tensor was skipped for a non-finite gradient (with skip_nonfinite)."""
    cfg = config(optimizer, kind, seed=seed, **options)
    names = [name for name, _ in _abi.optimizer_states(cfg)]
    for i, st in enumerate(states):
        missing = [name for name in names if name not in st]
        if missing:
            raise ValueError(f"lbopt: states[{i}] has no {', '.join(missing)} (this {optimizer} step uses "
                             f"{', '.join(names) or 'no states'})")
    return _run(_abi.lib.lbopt_step, cfg, _abi.Slot, params, grads,
                [[st[name] for name in names] for st in states], lr, steps)


def _run(entry_point, cfg, slot_type, params, grads, states, lr, steps):
    """Call entry_point (lbopt_step or lbopt_adamw_step) on slots of slot_type; states[i]: the slot's states in
    order (None where absent)."""
    n = len(params)
    if not (len(grads) == len(states) == len(steps) == n):
        raise ValueError("lbopt: params, grads, states and steps must have the same length")
    views = []
    slots = (slot_type * n)()
    for i in range(n):
        p, g = borrow(params[i], writable=True), borrow(grads[i])
        views += [p, g]
        s = slots[i]
        s.struct_size = ctypes.sizeof(slot_type)
        s.param, s.grad = p.ptr, g.ptr
        refs = [_state(st, views) for st in states[i]]
        if slot_type is _abi.Slot:
            for k, ref in enumerate(refs):
                s.states[k] = ref
        else:
            s.m, s.v, s.vmax = refs
        s.step = int(steps[i])
    skipped = (ctypes.c_uint8 * n)()
    shape = (ctypes.c_int64 * 1)(n)
    skipped_dl = _abi.DLTensor(ctypes.cast(skipped, ctypes.c_void_p), _abi.DLDevice(_abi.kDLCPU, 0), 1,
                               _abi.DLDataType(_abi.kDLUInt, 8, 1), shape, None, 0)
    opts = _abi.StepOptions()
    _abi.check(_abi.lib.lbopt_step_options_init(ctypes.byref(opts), ctypes.sizeof(opts)))
    if n and views[0].dl.device.device_type == _abi.kDLCPU:  # the skip flags are read back on the host
        opts.skipped = ctypes.pointer(skipped_dl)
    _abi.check(entry_point(ctypes.byref(cfg), float(lr), slots, n, ctypes.byref(opts)))
    return [bool(skipped[i]) for i in range(n)]


def adamw_step(params, grads, states, lr, steps, *, kind="4bit", betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
               adam=False, amsgrad=False, maximize=False, bf16_stochastic_round=False, seed=0,
               skip_nonfinite=False, state_stochastic_round=None):
    """One fused AdamW (or Adam with adam=True) step over many tensors, in place.

    states[i] is {'m': state, 'v': state} (and 'vmax' with amsgrad), each state {'codes', 'scales'};
    steps[i] is the step count this call makes for params[i] (1 on the first call). Returns a list of bools:
    True where a tensor was skipped for a non-finite gradient (with skip_nonfinite)."""
    flags = ((_abi.FLAG_ADAM_COUPLED_DECAY if adam else 0) | (_abi.FLAG_AMSGRAD if amsgrad else 0)
             | (_abi.FLAG_MAXIMIZE if maximize else 0) | (_abi.FLAG_BF16_STOCHASTIC_ROUND if bf16_stochastic_round
                                                          else 0) | (_abi.FLAG_SKIP_NONFINITE if skip_nonfinite else 0)
             | _abi.state_rounding_flags(state_stochastic_round))
    cfg = _abi.adamw_config(kind_id(kind), betas, eps, weight_decay, flags, seed)
    return _run(_abi.lib.lbopt_adamw_step, cfg, _abi.AdamWSlot, params, grads,
                [(st["m"], st["v"], st.get("vmax") if amsgrad else None) for st in states], lr, steps)


def quantize(kind, moment, src, state):
    """Quantize a float32 array into state {'codes', 'scales'}; moment as state_names gives it: 'm' (first), 'v'
    (second) or 'v_signed'."""
    views = [borrow(src)]  # kept alive across the call: the capsule owns the shape the library reads
    st = _state(state, views)
    _abi.check(_abi.lib.lbopt_quantize(kind_id(kind), _moment(moment), views[0].ptr, st, None))


def dequantize(kind, moment, state, dst):
    """Decode state {'codes', 'scales'} into a float32 array dst."""
    views = [borrow(dst, writable=True)]
    st = _state(state, views)
    _abi.check(_abi.lib.lbopt_dequantize(kind_id(kind), _moment(moment), st, views[0].ptr, None))


def _moment(moment):
    for value, name in _MOMENT_NAMES.items():
        if moment in (name, value):
            return value
    if moment == "vmax":
        return _abi.MOMENT_SECOND
    raise ValueError(f"lbopt: moment must be 'm', 'v' or 'v_signed', not {moment!r}")

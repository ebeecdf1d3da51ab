"""Drop-in torch.optim optimizers (AdamW, Adam, SGD, Lion, AdEMAMix) with 4-bit, 8-bit, FP8 or fp32 states,
stepped by the lbopt C library.

Every step() reads each group's lr as a host double (a Python float, or a tensor updated with fill_) and passes
it by value, so any torch.optim.lr_scheduler works unchanged and a schedule that changes the lr every step costs
nothing. All tensors of a param group (per device and state kind) go to the library in one call.

state_dict() holds each param's states in one checkpoint form for plain and FSDP2 (DTensor) params
(lbopt._checkpoint); load_state_dict() also reads states saved by torch.optim, torchao and bitsandbytes
(lbopt._import). The classes with a fixed state kind (AdamW4bit ... AdEMAMix) are written by
tools/gen_torch_classes.py.

    from lbopt.torch import AdamW4bit
    opt = AdamW4bit(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-3, total_steps=1000)
"""
import collections
import collections.abc
import contextlib
import ctypes
import itertools
import math
import numbers
import operator
import re
from typing import NamedTuple

import torch

from . import _abi, _checkpoint, _import
from ._dlpack import View
from ._torch_views import dl_device, dl_dtype, tensor_view
from .functional import KINDS, kind_id

# the classes with a state kind join __all__ where they are generated, below
__all__ = ["LowBitAdamW", "LowBitSGD", "LowBitLion", "LowBitAdEMAMix", "LowBitMuon", "muon_param_groups",
           "to_torch_adamw_state_dict", "load_torch_adamw_state_dict"]

_KIND_NAMES = {v: k for k, v in KINDS.items()}
_MOMENTS = (("exp_avg", _abi.MOMENT_FIRST), ("exp_avg_sq", _abi.MOMENT_SECOND), ("max_exp_avg_sq", _abi.MOMENT_SECOND))


def _local(t, p, name):
    """The tensor lbopt steps for t (param p, or its grad): t itself, or the local shard of a DTensor (FSDP2's
    fully_shard, tensor parallel). Shard and Replicate placements are served: each rank steps its shard (a
    replicated param steps identically everywhere). A Partial placement holds unreduced values, which no
    elementwise step can serve."""
    if type(t) in _PLAIN or not _checkpoint.is_dtensor(t):  # the first test is the common case, and cheap
        return t
    for placement in t.placements:
        if not (placement.is_shard() or placement.is_replicate()):
            what = _what(p, name) if t is p else "the grad of " + _what(p, name)
            raise ValueError(f"lbopt: {what} is a DTensor with a {type(placement).__name__} placement "
                             f"({placement}); lbopt steps Shard and Replicate placements (reduce it first)")
    return t._local_tensor


_PLAIN = (torch.nn.Parameter, torch.Tensor)


def _run_closure(closure):
    """A step's closure run with grad enabled, as torch.optim runs it: its loss, or None without one."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


def _what(p, name):
    return f"param {name!r}" if name else f"a param of shape {tuple(p.shape)}"


_PARAM_META = operator.attrgetter("dtype", "shape", "device")
_GRAD_META = operator.attrgetter("dtype", "shape", "device", "layout")
_DATA_PTR = torch.Tensor.data_ptr
_STRIDE = torch.Tensor.stride


def _param_key(p):
    """What a param's slot was built from: its data pointer, dtype, shape, device and strides."""
    return (p.data_ptr(), _PARAM_META(p), p.stride())


def _grad_key(g):
    """What a grad's view was built from, beside its data pointer."""
    return (_GRAD_META(g), g.stride())


# ---- memory order ----------------------------------------------------------------------------------------------
# The library steps a tensor in memory order and its states follow that order. A state laid out in another order
# than row-major records it as "dim_order" (outermost dim first, as torch.Tensor.dim_order; absent means
# row-major), so a param whose layout changes later (model.to(memory_format=torch.channels_last)) or a checkpoint
# loaded into a model of another layout gets its states re-laid out instead of silently pairing moments with the
# wrong elements.

def _dim_order(t):
    return tuple(sorted(range(t.dim()), key=lambda d: (-t.stride(d), d)))


def _state_order(state, p):
    return state.get("dim_order", tuple(range(p.dim())))


def _set_order(state, order):
    if order == tuple(range(len(order))):
        state.pop("dim_order", None)
    else:
        state["dim_order"] = order


def _strides_in_order(shape, order):
    strides, s = [0] * len(shape), 1
    for d in reversed(order):
        strides[d] = s
        s *= shape[d]
    return strides


def _same_layout(strides, other, shape):
    """Whether two stride tuples of one shape put every element at the same memory position (a dim of extent 1
    may carry any stride)."""
    return all(a == b for a, b, n in zip(strides, other, shape) if n != 1)


def _follows(t, order):
    """Whether t lies in memory in dim order `order`."""
    return _same_layout(t.stride(), _strides_in_order(t.shape, order), t.shape)


def _empty_in_order(shape, order, device):
    """A float32 tensor of `shape` laid out in dim order `order`."""
    base = torch.empty([shape[d] for d in order], dtype=torch.float32, device=device)
    return base.permute([order.index(d) for d in range(len(shape))])


def _check_dim_order(order, p):
    if not (isinstance(order, (tuple, list)) and sorted(order) == list(range(p.dim()))
            and all(isinstance(d, int) for d in order)):
        raise ValueError(f"lbopt: saved dim_order {order!r} is not a permutation of the dims of a param of shape "
                         f"{tuple(p.shape)}")
    return tuple(order)


class _CallKey(NamedTuple):
    """What the params stepped by one call of a param group share."""
    device: torch.device
    kind: int  # the lbopt_state_kind of their states


class _ParamSlot:
    """The lbopt_slot of one param, with the views it points to: built once and reused while the param's data,
    dtype, shape, strides and device, the states its step uses and their tensors stay the same; the grad is set
    on every step. p is the tensor stepped: `param` itself or its local shard; `param` and `param_name` are what
    an error names; state is the state dict the slot was last planned with."""

    def __init__(self, p, state, names, param, param_name):
        self.param, self.param_name = param, param_name
        self.param_key = _param_key(p)
        self.names = names
        self.call_key = _CallKey(p.device, KINDS[state["state_kind"]])
        self.state = state
        self.state_keys = tuple(k for name, _ in names for k in (name + "_codes", name + "_scales") if k in state)
        self.state_tensors = tuple(state[k] for k in self.state_keys)
        self.views = [tensor_view(p)]
        self.slot = _abi.Slot()
        self.slot.struct_size = ctypes.sizeof(_abi.Slot)
        self.slot.param = self.views[0].ptr
        for k, (name, _) in enumerate(names):
            self.slot.states[k] = _state_of(state, name, self.views)
        self.grad = View()
        self.grad_key = None
        self.grad_copied = False  # whether the last grad was copied into the param's layout

    def fresh(self, p, state):
        """Whether the slot still serves param p with the tensors of state."""
        return (_param_key(p) == self.param_key
                and all(map(operator.is_, map(state.get, self.state_keys), self.state_tensors)))

    def set_grad(self, g, p):
        """Point the slot at g; a grad laid out unlike its param is first copied into the param's layout (as
        torch's fused step does). Returns the tensor the slot now points to, which must live until the call."""
        key = _grad_key(g)
        if key == self.grad_key and not self.grad_copied:  # the common case: only the data moved
            self.grad.dl.data = g.data_ptr()
            return g
        if g.layout != torch.strided:
            raise TypeError(f"lbopt: {g.layout} gradients are not supported; lbopt steps dense tensors")
        stride, param_stride = key[1], self.param_key[2]
        self.grad_copied = (stride != param_stride and g.shape == p.shape and g.device == p.device
                            and not _same_layout(stride, param_stride, p.shape))
        if self.grad_copied:
            g = torch.empty_like(p, dtype=g.dtype).copy_(g)
        self.grad.set(g.data_ptr(), g.shape, g.stride(), dl_dtype(g.dtype), dl_device(g), None)
        self.grad_key = key
        self.slot.grad = self.grad.ptr
        return g

    def adopt(self, slot, grad_dl):
        """Use elements of a call's arrays, which hold copies of the slot and the grad's DLTensor, from now on."""
        self.slot, self.grad.dl, self.grad.ptr = slot, grad_dl, ctypes.pointer(grad_dl)
        slot.grad = self.grad.ptr


def _local_grad(grad, t, p, name):
    """The grad lbopt steps for the local shard t of a DTensor param p."""
    g = _local(grad, p, name)
    if g.shape != t.shape and all(a >= b for a, b in zip(g.shape, t.shape)):
        g = g[tuple(slice(0, n) for n in t.shape)]  # FSDP2 pads the grad of an uneven (empty) shard
    return g


class _Batch(NamedTuple):
    """What one call of a step steps, in order: lists rather than an object per param, which would cost more
    than the rest of planning a small tensor's step."""
    param_slots: list  # _ParamSlot
    states: list  # the state dict each step counts in


class _Call:
    """One lbopt_step of a step(): the slots of one param group, device and state kind. Kept from step to step
    while the group steps the same slots in the same order: its slot and grad arrays are built once, and each
    param's slot and grad DLTensor are then their elements, so a step only writes the grad pointers and step
    counts, all at once through the columns of those arrays when nothing else changed (restep)."""

    def __init__(self, key, batch):
        self.key = key
        self.batch = batch
        n = self.n = len(batch.param_slots)
        self.slots = (_abi.Slot * n)()
        self.grads = (_abi.DLTensor * n)()
        for i, ps in enumerate(batch.param_slots):
            self.slots[i], self.grads[i] = ps.slot, ps.grad.dl
            ps.adopt(self.slots[i], self.grads[i])
        self.steps = _column(self.slots, _abi.Slot.step)
        self.grad_data = _column(self.grads, _abi.DLTensor.data)
        keys = {ps.state_keys for ps in batch.param_slots}
        self.state_keys = keys.pop() if len(keys) == 1 else None  # None: the slots' states differ in their keys
        self.state_tensors = [t for ps in batch.param_slots for t in ps.state_tensors]
        self.skipped = torch.zeros(n, dtype=torch.uint8, device=key.device)  # every entry is written by each call
        self.skipped_view = tensor_view(self.skipped)

    def restep(self, grad_data):
        """Point the slots at this step's grads (their data pointers; all else as last step) if the states are the
        tensors the slots point to: False, with nothing written, where they are not."""
        if self.state_keys is None:
            return False
        try:
            if not all(map(operator.is_, _tensors_of(self.batch.states, self.state_keys), self.state_tensors)):
                return False
        except KeyError:
            return False
        self.grad_data.copy_(torch.tensor(grad_data, dtype=torch.int64))
        self.steps.copy_(torch.tensor(list(map(_STEP, self.batch.states)), dtype=torch.int64)).add_(1)
        return True

    def prepare(self, cfg, lr, held, grad_scale, found_inf, read_skipped):
        """This step's config, lr and AMP scalars; held: the grads the slots point to, kept until the call."""
        self.cfg, self.lr, self.held, self.read_skipped = cfg, lr, held, read_skipped
        self.opts = _abi.StepOptions()
        self.opts.struct_size = ctypes.sizeof(self.opts)
        self.opts.skipped = self.skipped_view.ptr
        self.opts.flags = _abi.STEP_DEVICES_KNOWN  # torch knows each tensor's device: no runtime query per pointer
        self.keep = []
        device = self.key.device
        for field, t in (("grad_scale", grad_scale), ("found_inf", found_inf)):
            if t is not None:
                v = tensor_view(t.to(device=device, dtype=torch.float32))
                self.keep.append(v)
                setattr(self.opts, field, v.ptr)
        if device.type == "cuda":
            self.opts.stream = torch.cuda.current_stream(device).cuda_stream
        return self

    def _check(self, entry_point):
        """Call lbopt_step or lbopt_step_validate; a refused slot's message names its param."""
        try:
            _abi.check(entry_point(ctypes.byref(self.cfg), self.lr, self.slots, self.n, ctypes.byref(self.opts)))
        except _abi.LbOptError as e:
            slot = re.match(r"slots\[(\d+)\]", str(e))
            if slot is None:
                raise
            ps = self.batch.param_slots[int(slot.group(1))]
            raise type(e)(e.status, f"lbopt: {_what(ps.param, ps.param_name)}: {e}") from None

    def validate(self):
        self._check(_abi.lib.lbopt_step_validate)

    def run(self):
        """The step (which validates the call before it writes), then the step counts of the slots stepped."""
        self._check(_abi.lib.lbopt_step)
        self.held = None
        # Only a skip can hold a step count back; reading the flags from a GPU would synchronize.
        if not self.read_skipped:
            for state in self.batch.states:
                state["step"] += 1
            return
        for state, skipped in zip(self.batch.states, self.skipped.tolist()):
            if not skipped:
                state["step"] += 1


def _column(array, field):
    """An int64 tensor over one 8-byte field of every struct of a ctypes array: writing it writes the structs."""
    words = torch.frombuffer(array, dtype=torch.int64)
    return words.view(len(array), ctypes.sizeof(array._type_) // 8)[:, field.offset // 8]


_STEP = operator.itemgetter("step")
_GRAD = operator.attrgetter("grad")
_NONES = itertools.repeat(None)


def _tensors_of(states, keys):
    """The values under keys of every state dict, in order (a KeyError where one lacks a key)."""
    if not keys:
        return iter(())
    values = map(operator.itemgetter(*keys), states)
    return itertools.chain.from_iterable(values) if len(keys) > 1 else values


class _StateSnapshot:
    """Which state dict an optimizer's state maps each param to, compared by identity (no hashing of tensors)."""

    def __init__(self, state):
        self.params, self.dicts = tuple(state.keys()), tuple(state.values())

    def holds(self, state):
        return (len(state) == len(self.params) and all(map(operator.is_, state.keys(), self.params))
                and all(map(operator.is_, state.values(), self.dicts)))


class _GroupPlan:
    """The calls that stepped a param group last time and what they were planned from. While the group holds the
    same params, the same of them have grads, and every param, grad (but its data) and state tensor is as it was,
    a step reuses the calls and only writes the grad pointers and step counts (restep): the common case, checked
    a field at a time across all params rather than a param at a time."""

    def __init__(self, group, names, calls):
        self.group = group  # held, so that id(group) names it while the plan lives
        self.params = list(group["params"])
        self.names = names  # the states the group's step uses
        self.calls = calls
        slots = [ps for call in calls for ps in call.batch.param_slots]
        self.stepped = [ps.param for ps in slots]  # in the calls' order
        self.stepped_names = [ps.param_name for ps in slots]
        stepped = set(map(id, self.stepped))
        self.idle = [p for p in self.params if id(p) not in stepped]  # params without a grad
        self.sharded = any(type(p) not in _PLAIN for p in self.stepped)
        self.reusable = not any(ps.grad_copied for ps in slots)
        self.param_keys = [ps.param_key for ps in slots]
        self.grad_keys = [ps.grad_key for ps in slots]

    def restep(self, group, names, held):
        """Reuse the plan for this step if it holds (then held gets the grads stepped); False where it does not,
        with nothing written that planning the step afresh would not write too."""
        params = group["params"]
        if not (self.reusable and names == self.names and len(params) == len(self.params)
                and all(map(operator.is_, params, self.params))):
            return False
        tensors, grads = self.stepped, list(map(_GRAD, self.stepped))
        if any(map(operator.is_, grads, _NONES)) or not all(map(operator.is_, map(_GRAD, self.idle), _NONES)):
            return False
        if self.sharded:
            tensors = [_local(p, p, name) for p, name in zip(self.stepped, self.stepped_names)]
            grads = [g if t is p else _local_grad(g, t, p, name)
                     for p, t, g, name in zip(self.stepped, tensors, grads, self.stepped_names)]
        if (list(zip(map(_DATA_PTR, tensors), map(_PARAM_META, tensors), map(_STRIDE, tensors))) != self.param_keys
                or list(zip(map(_GRAD_META, grads), map(_STRIDE, grads))) != self.grad_keys):
            return False
        data, start = list(map(_DATA_PTR, grads)), 0
        for call in self.calls:
            if not call.restep(data[start:start + call.n]):
                return False
            start += call.n
        held.extend(grads)
        return True


class _LowBit(torch.optim.Optimizer):
    """What every lbopt optimizer shares; a subclass names its lbopt_optimizer, builds its config from a param
    group and declares its own attributes. The states of a param are those the library lists for its group's
    config (lbopt_optimizer_states), each stored as <name>_codes and <name>_scales."""

    _step_supports_amp_scaling = True
    _optimizer = None  # the library's name of the optimizer
    # Attributes beyond torch.optim.Optimizer's, carried through copy.deepcopy and pickle.
    _OWN_ATTRS = ("state_kind", "min_quant_size", "bf16_stochastic_round", "state_stochastic_round", "skip_nonfinite",
                  "seed", "_keep_names")
    state_stochastic_round = None  # None: the library's default for the optimizer (also for copies made before it)

    def __init__(self, params, defaults, *, state_kind, min_quant_size, keep_fp32, bf16_stochastic_round,
                 skip_nonfinite, seed, state_stochastic_round=None, capturable=False, differentiable=False):
        if capturable or differentiable:
            raise ValueError("lbopt: capturable=True and differentiable=True are not supported (the lr is a host "
                             "value of every step; the step is not differentiable)")
        super().__init__(params, {**defaults, "fp32_state": False})
        self.state_kind = kind_id(state_kind)
        _abi.layout(self.state_kind, 0)  # the library refuses an unknown kind
        self.min_quant_size = min_quant_size
        self.bf16_stochastic_round = bf16_stochastic_round
        _abi.state_rounding_flags(state_stochastic_round)  # refuses anything but None, True and False
        self.state_stochastic_round = state_stochastic_round
        self.skip_nonfinite = skip_nonfinite
        self.seed = seed
        keep = list(keep_fp32)
        self._keep_ids = {id(k) for k in keep if torch.is_tensor(k)}
        self._keep_names = {k for k in keep if isinstance(k, str)}
        self._slots = {}  # id(param) -> _ParamSlot (the slot's views hold the param)
        self._plans = {}  # id(group) -> _GroupPlan
        self._planned_states = None  # the _StateSnapshot the plans hold, once a step has run
        for group in self.param_groups:
            self._check_unique(group)
            self._validate_group(group)

    def _fields(self, group):
        """(fields of lbopt_optimizer_config, flags) of a param group, beyond kind, seed and the common flags."""
        raise NotImplementedError

    def _saved_group(self, group):
        """A param group of a state dict being loaded, completed with the defaults (torch.optim.AdamW's groups lack
        lbopt's settings)."""
        return {**self.defaults, **group}

    def _config(self, group, kind):
        fields, flags = self._fields(group)
        flags |= ((_abi.FLAG_MAXIMIZE if group["maximize"] else 0)
                  | _abi.state_rounding_flags(self.state_stochastic_round)
                  | (_abi.FLAG_BF16_STOCHASTIC_ROUND if self.bf16_stochastic_round else 0)
                  | (_abi.FLAG_SKIP_NONFINITE if self.skip_nonfinite else 0))
        return _abi.optimizer_config(_abi.OPTIMIZERS[self._optimizer], kind, flags, self.seed, **fields)

    def _states(self, group):
        """((name, moment), ...) of the states a step of this group uses."""
        return _abi.optimizer_states(self._config(group, _abi.STATE_FP32))

    def _state_names(self, group):
        """The names of every state this group's optimizer keeps with some setting (amsgrad, momentum on or off)."""
        on = {**group, **{k: v for k, v in _STATE_SETTINGS_ON.items() if k in group}}
        return {n for n, _ in self._states(group)} | {n for n, _ in self._states(on)}

    def _added_states(self, group):
        """The names of the group's states that a setting adds (amsgrad, momentum): a step starts them at zero when
        the setting was turned on since, and a load accepts a saved state without them alike."""
        base = {**group, **{k: v for k, v in _STATE_SETTINGS_OFF.items() if k in group}}
        return {n for n, _ in self._states(group)} - {n for n, _ in self._states(base)}

    # ---- copies: copy.deepcopy and pickle keep what torch.optim.Optimizer's __getstate__ drops -----------------

    def __getstate__(self):
        out = super().__getstate__()
        out.update({k: getattr(self, k) for k in self._OWN_ATTRS})
        out["_keep_positions"] = [i for i, (p, _, _) in enumerate(self._params()) if id(p) in self._keep_ids]
        return out

    def __setstate__(self, state):
        positions = state.pop("_keep_positions", [])
        super().__setstate__(state)
        params = [p for p, _, _ in self._params()]
        self._keep_ids = {id(params[i]) for i in positions}
        self._slots = {}
        self._plans = {}
        self._planned_states = None

    # ---- configuration ---------------------------------------------------------------------------------------

    def _kind_for(self, p, group, name=None):
        if (group["fp32_state"] or id(p) in self._keep_ids or name in self._keep_names
                or p.numel() < self.min_quant_size):
            return _abi.STATE_FP32
        return self.state_kind

    def _validate_group(self, group):
        """The library's own checks of the hyper-parameters and lr: errors surface when a group is made or loaded,
        with the library's message."""
        cfg = self._config(group, _abi.STATE_FP32)
        _abi.check(_abi.lib.lbopt_optimizer_config_validate(ctypes.byref(cfg), _lr(group)))

    @staticmethod
    def _check_unique(group):
        seen = set()
        names = group.get("param_names") or [None] * len(group["params"])
        for p, name in zip(group["params"], names):
            if id(p) in seen:  # torch.optim warns and steps it twice; one call cannot write a param twice
                raise ValueError(f"lbopt: duplicate param: {_what(p, name)} appears twice in a param group")
            seen.add(id(p))

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        if hasattr(self, "_slots"):  # groups given to __init__ are validated there, once all attributes exist
            try:
                self._check_unique(self.param_groups[-1])
                self._validate_group(self.param_groups[-1])
            except Exception:
                self.param_groups.pop()
                raise

    # ---- state -----------------------------------------------------------------------------------------------

    def _init_state(self, p, group, name):
        """Fresh states of p: the kind decided on the (global) param, the tensors sized for what this process
        steps (a DTensor's local shard)."""
        kind = self._kind_for(p, group, name)
        t = _local(p, p, name)
        state = {"step": 0, "state_kind": _KIND_NAMES[kind]}
        _set_order(state, _dim_order(t))
        for moment, _ in self._states(group):
            state.update(_zero_state(kind, t, moment))
        return state

    def _params(self):
        """(param, group, name or None) for every param, in state_dict order."""
        for group in self.param_groups:
            names = group.get("param_names") or [None] * len(group["params"])
            yield from ((p, group, n) for p, n in zip(group["params"], names))

    def _slot(self, p, t, state, names, param_name):
        """The param's slot and the state dict it steps: the cached slot while it is fresh; else a new one, over a
        new state dict where the states had to be re-laid out for a new memory order or gain a state the group
        now needs (amsgrad or momentum turned on later: it starts at zero), which the caller commits once the step
        is validated; the old tensors are never written. t is the tensor stepped for p: p, or its local shard;
        param_name is p's name or None."""
        cached = self._slots.get(id(p))
        if cached is not None and cached.names == names and cached.fresh(t, state):
            cached.state = state
            return cached, state
        order = _dim_order(t)
        if not _follows(t, _state_order(state, t)) and _follows(t, order):
            state = _relayout(state, t, order, names)
        for name, _ in names:
            if name + "_codes" not in state:
                state = {**state, **_zero_state(KINDS[state["state_kind"]], t, name)}
        cached = self._slots[id(p)] = _ParamSlot(t, state, names, p, param_name)
        return cached, state

    # ---- the step --------------------------------------------------------------------------------------------

    @torch.no_grad()
    def step(self, closure=None):
        loss = _run_closure(closure)
        if torch.compiler.is_compiling():
            self._apply_opaque()
        else:
            self._apply_eager()
        return loss

    def _apply_eager(self):
        """Plan every call of this step without changing the optimizer, validate all calls but the first, run the
        first (the library validates a call before it writes), commit the states the plan created or replaced,
        then run the others: a refused step writes nothing and creates no state, and no call is validated twice."""
        pending = {}  # param -> its new state dict
        calls = self._plan(pending)
        self._planned_states = None  # until this step has run
        self._run(calls, pending)
        self._planned_states = _StateSnapshot(self.state)

    def _run(self, calls, pending):
        """Validate every call but the first, run the first (the library validates a call before it writes), commit
        the states the plan created or replaced (pending), then run the others."""
        for call in calls[1:]:
            call.validate()
        if calls:
            calls[0].run()
        self.state.update(pending)
        for call in calls[1:]:
            call.run()

    # Under torch.compile the library call is opaque: dynamo would otherwise trace into the ctypes internals and
    # hit its recompile limit; a compiled function calling step() gets one graph break here and runs it eagerly.
    # Eager steps skip the wrapper, which costs about a microsecond per param (bench/bench_overhead.py).
    _apply_opaque = torch.compiler.disable(_apply_eager)

    def _plan(self, pending):
        grad_scale = getattr(self, "grad_scale", None)  # set by torch.amp.GradScaler around step()
        found_inf = getattr(self, "found_inf", None)
        read_skipped = self.skip_nonfinite or found_inf is not None
        calls = []
        # Each plan holds the state dict of every param it steps: valid while self.state maps the same params to
        # the same dicts as when the last step ran.
        states_kept = self._planned_states is not None and self._planned_states.holds(self.state)
        for group in self.param_groups:
            lr = _lr(group)
            names = self._states(group)
            held = []  # the tensors the slots' grads point to
            plan = self._plans.get(id(group)) if states_kept else None
            if plan is None or not plan.restep(group, names, held):
                held.clear()
                plan = self._plans[id(group)] = self._plan_group(group, names, pending, held)
            calls.extend(call.prepare(self._config(group, call.key.kind), lr, held, grad_scale, found_inf,
                                      read_skipped) for call in plan.calls)
        return calls

    def _plan_group(self, group, names, pending, held):
        """The calls of a group's step, planned from scratch: each param's slot from its state (created or
        re-laid out where needed: new state dicts go to pending), grouped by device and state kind."""
        state_of = self.state.get
        by_call = {}  # _CallKey -> _Batch
        for p, name in zip(group["params"], group.get("param_names") or [None] * len(group["params"])):
            grad = p.grad
            if grad is None:
                continue
            t = _local(p, p, name)
            old = state_of(p)
            ps, state = self._slot(p, t, old or self._init_state(p, group, name), names, name)
            if state is not old:
                pending[p] = state
            held.append(ps.set_grad(grad if t is p else _local_grad(grad, t, p, name), t))
            ps.slot.step = state["step"] + 1
            batch = by_call.get(ps.call_key)
            if batch is None:
                batch = by_call[ps.call_key] = _Batch([], [])
            batch.param_slots.append(ps)
            batch.states.append(state)
        return _GroupPlan(group, names, [_Call(key, batch) for key, batch in by_call.items()])

    # ---- checkpoints -----------------------------------------------------------------------------------------

    def load_state_dict(self, state_dict):
        """Loads states saved by state_dict() of this or an earlier lbopt (plain tensors, or DTensors as
        torch.distributed.checkpoint loads them; map_location and weights_only=True work), or by torch.optim,
        torchao or bitsandbytes. Everything is checked before anything changes: groups of other sizes,
        hyper-parameters the library refuses, a state of another kind, size or dtype than this optimizer would
        create for its param, codes or scales that no step writes, unknown keys, states of params that no group
        lists, or a step count that is not a whole number in [0, 2^53] are refused with ValueError or TypeError
        (docs/reliability.md lists the cases).
        The state tensors keep their dtypes (torch's default would cast float32 scales to the param dtype) and
        move to their param's device. Load-state-dict hooks see the whole state dict before and the whole
        state after, as torch.optim's do."""
        state_dict = state_dict.copy()
        for hook in self._optimizer_load_state_dict_pre_hooks.values():
            result = hook(self, state_dict)
            if result is not None:
                state_dict = result
        groups = [self._saved_group(g) for g in state_dict["param_groups"]]
        if len(groups) != len(self.param_groups) or any(
                len(g["params"]) != len(own["params"]) for g, own in zip(groups, self.param_groups)):
            raise ValueError(f"lbopt: the state dict has groups of {[len(g['params']) for g in groups]} params, "
                             f"this optimizer {[len(g['params']) for g in self.param_groups]}")
        saved = state_dict["state"]
        listed = {pid for g in groups for pid in g["params"]}
        for pid in saved:
            if pid not in listed:
                raise ValueError(f"lbopt: the state dict holds a state for param id {pid!r}, which no param group of "
                                 f"the state dict lists")
        loaded = {}
        for saved_group, group in zip(groups, self.param_groups):
            merged = {**group, **saved_group}
            self._validate_group(merged)
            names = group.get("param_names") or [None] * len(group["params"])
            for pid, p, name in zip(saved_group["params"], group["params"], names):
                if pid in saved:
                    loaded[p] = self._loaded_state(p, merged, name, saved[pid])
        with _hooks_held(self, "_optimizer_load_state_dict_pre_hooks", "_optimizer_load_state_dict_post_hooks"):
            super().load_state_dict({"state": {}, "param_groups": groups})
        for p, st in loaded.items():
            self.state[p] = st
        self._slots = {}
        self._plans = {}
        self._planned_states = None
        for hook in self._optimizer_load_state_dict_post_hooks.values():
            hook(self)

    def _loaded_state(self, p, group, name, entry):
        """The state of p from its saved entry, in any format load_state_dict reads, its block scales checked."""
        if not isinstance(entry, collections.abc.Mapping):
            raise TypeError(f"lbopt: the saved state of {_what(p, name)} is a {type(entry).__name__}, not a dict")
        if _import.is_foreign(entry, [n for n, _ in self._states(group)]):
            st = self._convert_foreign(p, group, name, entry)
        else:
            entry = _normalized(entry, _what(p, name))
            _check_entry(entry, p, _what(p, name), self._state_names(group))
            if _checkpoint.is_checkpoint(entry, p):
                st = self._convert_checkpoint(p, group, name, entry)
            else:
                st = {k: (v.to(p.device).contiguous() if torch.is_tensor(v) else v) for k, v in entry.items()}
                self._check_loaded(p, group, name, st)
        _check_state(st, _what(p, name))
        return st

    def state_dict(self):
        """torch.optim.Optimizer's state_dict, each param's states in their checkpoint form (lbopt._checkpoint):
        one layout whether the param is plain or a DTensor (FSDP2), which torch.distributed.checkpoint saves per
        rank and reshards at load, and which holds only tensors and ints (flattened optimizer state dicts, as
        torchtitan saves them, accept nothing else). State-dict hooks run as torch.optim's do, the post-hooks
        on this final form."""
        for hook in self._optimizer_state_dict_pre_hooks.values():
            hook(self)
        with _hooks_held(self, "_optimizer_state_dict_pre_hooks", "_optimizer_state_dict_post_hooks"):
            sd = super().state_dict()
        for pid, (p, group, name) in enumerate(self._params()):
            if pid in sd["state"]:
                sd["state"][pid] = self._checkpoint_entry(p, group, name, sd["state"][pid])
        for hook in self._optimizer_state_dict_post_hooks.values():
            result = hook(self, sd)
            if result is not None:
                sd = result
        return sd

    def _checkpoint_entry(self, p, group, name, state):
        """The checkpoint form of p's state. It is row-major whatever p's layout (a key for the memory order would
        make the entries of differently laid out models differ, which distributed checkpoints refuse): states
        kept in another order are re-laid out, exactly for fp32 states, re-blocked for quantized ones."""
        t = _local(p, p, name)
        names = self._states(group)
        if _state_order(state, t) != tuple(range(t.dim())):
            state = _relayout(state, t, tuple(range(t.dim())), names)
        out = _checkpoint.to_checkpoint(state, p, t, _what(p, name), [n for n, _ in names])
        out["state_kind"] = KINDS[state["state_kind"]]
        return out

    def _convert_checkpoint(self, p, group, name, entry):
        """The state of p from its checkpoint form (row-major: the first step re-lays it out if p is not),
        re-blocked where the checkpoint was cut differently."""
        what = _what(p, name)
        t = _local(p, p, name)
        st = self._init_state(p, group, name)
        if entry.get("state_kind") != st["state_kind"]:
            raise ValueError(f"lbopt: saved state kind {entry.get('state_kind')!r} does not match this optimizer's "
                             f"{st['state_kind']!r} for {what}")
        st["step"] = _step_count(entry.get("step"), what)
        _set_order(st, tuple(range(t.dim())))
        for moment in _checkpoint.from_checkpoint(entry, p, t, st, what, self._states(group), _import.codebook,
                                                  self._added_states(group)):
            _encode(st, moment.name, moment.moment, moment.values, what)
        return st

    def _convert_foreign(self, p, group, name, entry):
        """The lbopt state of p from another optimizer's saved entry (see lbopt._import), in this optimizer's kind
        for p. When every moment is already in that kind's format its codes are copied as they are (in the
        row-major order the other libraries keep; the first step re-lays them out if p is not row-major);
        otherwise every moment is decoded and encoded in p's memory order."""
        what = _what(p, name)
        t = _local(p, p, name)
        st = self._init_state(p, group, name)
        kind = KINDS[st["state_kind"]]
        needed = self._states(group)
        sources, step = _import.moments(entry, what, [n for n, _ in needed])
        if step is None and self._optimizer in ("sgd", "muon"):
            step = 1  # torch.optim.SGD and Muon count no steps; a saved buffer means at least one was made
        st["step"] = _step_count(step, what)
        for moment_name, _ in needed:
            if moment_name not in sources:
                raise ValueError(f"lbopt: the saved state of {what} has no {moment_name}")
        if all(_import.copyable(sources[n], kind, m, t.numel()) for n, m in needed):
            _set_order(st, tuple(range(t.dim())))
            for moment_name, _ in needed:
                source = sources[moment_name]
                st[moment_name + "_codes"] = source.codes.reshape(-1).to(t.device, torch.uint8, copy=True)
                st[moment_name + "_scales"] = source.scales.reshape(-1).to(t.device, torch.float32, copy=True)
            return st
        for moment_name, moment in needed:
            values = _import.decode(sources[moment_name], t.numel(), what, moment_name).to(t.device)
            _encode(st, moment_name, moment, _empty_in_order(t.shape, _state_order(st, t), t.device).copy_(
                values.view(t.shape)), what)
        return st

    def _check_loaded(self, p, group, name, st):
        want = self._init_state(p, group, name)
        what = _what(p, name)
        if st.get("state_kind") != want["state_kind"]:
            raise ValueError(f"lbopt: saved state kind {st.get('state_kind')!r} does not match this optimizer's "
                             f"{want['state_kind']!r} for {what}")
        for moment in self._added_states(group):
            if not any(k in st for k in (moment + "_codes", moment + "_scales")):
                st.update(_zero_state(KINDS[want["state_kind"]], _local(p, p, name), moment))
        for k, v in want.items():
            if torch.is_tensor(v) and (k not in st or st[k].shape != v.shape or st[k].dtype != v.dtype):
                raise ValueError(f"lbopt: saved state {k!r} does not fit {what} with {want['state_kind']} states")
        st["step"] = _step_count(st.get("step"), what)
        t = _local(p, p, name)
        _set_order(st, _check_dim_order(_state_order(st, t), t))


@contextlib.contextmanager
def _hooks_held(opt, *attrs):
    """torch.optim.Optimizer's hooks of the given kinds held back while the base class handles a partial state
    dict; lbopt runs them itself on the whole one."""
    held = {a: getattr(opt, a) for a in attrs}
    for a in attrs:
        setattr(opt, a, collections.OrderedDict())
    try:
        yield
    finally:
        for a, hooks in held.items():
            setattr(opt, a, hooks)


def _normalized(entry, what):
    """A saved lbopt entry with its kind as a name, as lbopt keeps it in memory: checkpoints hold the kind as its
    lbopt_state_kind value (lbopt 0.3 saved the name). A "dim_order" that is an empty dict is what unflattening
    a checkpoint gives for a state kept in another memory order (torch.distributed.checkpoint rebuilds the keys
    of the in-memory state), and the checkpoint form is row-major."""
    out = dict(entry)
    kind = out.get("state_kind")
    if isinstance(kind, int) and not isinstance(kind, bool):
        if kind not in _KIND_NAMES:
            raise ValueError(f"lbopt: saved state kind {kind} of {what} is not one of {sorted(_KIND_NAMES)}")
        out["state_kind"] = _KIND_NAMES[kind]
    if out.get("dim_order") == {}:
        del out["dim_order"]
    return out


def _real(x, name):
    """A hyper-parameter as a float: a real number or a 1-element tensor, as torch.optim accepts."""
    if torch.is_tensor(x):
        if x.numel() != 1:
            raise ValueError(f"lbopt: {name} must be a number or a 1-element tensor, not a tensor of shape "
                             f"{tuple(x.shape)}")
        return float(x.item())
    if isinstance(x, numbers.Real):
        return float(x)
    raise TypeError(f"lbopt: {name} must be a real number or a 1-element tensor, not {type(x).__name__} {x!r}")


def _lr(group):
    return _real(group["lr"], "lr")


def _check_state(state, what):
    """Refuses block scales and codes that no step writes, whatever format they were loaded from
    (_checkpoint.check_scales; an FP8 NaN code would poison its block's absmax)."""
    fp8 = KINDS.get(state.get("state_kind")) == _abi.STATE_FP8
    for key, value in state.items():
        if key.endswith("_scales") and torch.is_tensor(value):
            _checkpoint.check_scales(value, key, what)
        if fp8 and key.endswith("_codes") and torch.is_tensor(value) and bool(((value & 0x7F) == 0x7F).any()):
            raise ValueError(f"lbopt: saved {key} of {what} holds a NaN, which no FP8 state has")


def _check_entry(entry, p, what, names):
    """Refuses a saved lbopt entry (either form, its kind a name) that no state_dict() writes: an unknown key, or
    states that are no tensors, hold no data, are of another dtype than the entry's kind keeps, or hold codes no
    encode gives (a 4-bit code above 15 in the checkpoint form, one code a byte). The kind itself and the shapes
    are checked where the entry is read, the scales and FP8 codes on the state it gives (_check_state)."""
    allowed = {"step", "state_kind", "dim_order"} | {n + s for n in names for s in ("_codes", "_scales")}
    for key in entry:
        if key not in allowed:
            raise ValueError(f"lbopt: unknown key {key!r} in the saved state of {what} (expected {sorted(allowed)})")
    kind = KINDS.get(entry.get("state_kind"))
    unpacked = _checkpoint.is_checkpoint(entry, p) if kind == _abi.STATE_4BIT else False
    for key, value in entry.items():
        if not key.endswith(("_codes", "_scales")):
            continue
        if not torch.is_tensor(value):
            raise TypeError(f"lbopt: saved {key} of {what} is a {type(value).__name__}, not a tensor")
        local = _checkpoint.local_tensor(value)
        if local.is_meta:
            raise ValueError(f"lbopt: saved {key} of {what} is a meta tensor: it holds no data")
        if kind is None:
            continue
        want = torch.float32 if key.endswith("_scales") or kind == _abi.STATE_FP32 else torch.uint8
        if local.dtype != want:
            raise ValueError(f"lbopt: saved {key} of {what} is {local.dtype}, a {entry['state_kind']} state keeps "
                             f"{want}")
        if key.endswith("_codes") and unpacked and local.numel() and int(local.max()) > 15:
            raise ValueError(f"lbopt: saved {key} of {what} holds a code above 15, which no 4-bit state has")


def _step_count(step, what):
    """A saved step count (an int, or a float or 1-element tensor as torch.optim.AdamW saves it) as an int."""
    value = step.item() if torch.is_tensor(step) and step.numel() == 1 else step
    ok = (isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
          and 0 <= value <= 2 ** 53 and value == int(value))
    if not ok:
        raise ValueError(f"lbopt: saved step {step!r} of {what} is not a whole number in [0, 2^53]")
    return int(value)


def _encode(state, moment_name, moment, values, what):
    """Quantize float32 values (any dense layout, read in memory order) into one moment of state; a refusal
    (NaN, Inf, a negative second moment) names the param."""
    try:
        _abi.check(_abi.lib.lbopt_quantize(KINDS[state["state_kind"]], moment, tensor_view(values).ptr,
                                           _state_of(state, moment_name, []), None))
    except _abi.LbOptError as e:
        raise type(e)(e.status, f"lbopt: {moment_name} of {what}: {e}") from None


# The settings that add a state when turned on, as a group with them off has them (see _added_states).
_STATE_SETTINGS_OFF = {"amsgrad": False, "momentum": 0.0, "nesterov": False}
_STATE_SETTINGS_ON = {"amsgrad": True, "momentum": 0.9, "nesterov": False}


def _zero_state(kind, p, moment):
    """The fresh (all-zero) tensors of one moment of p's state: {name_codes, name_scales}."""
    lay = _abi.layout(kind, p.numel())
    codes_dtype = torch.float32 if kind == _abi.STATE_FP32 else torch.uint8
    out = {moment + "_codes": torch.zeros(lay.codes_numel, dtype=codes_dtype, device=p.device)}
    if kind != _abi.STATE_FP32:
        out[moment + "_scales"] = torch.zeros(lay.scales_numel, dtype=torch.float32, device=p.device)
    return out


def _relayout(state, p, order, names):
    """p's state re-laid out from the dim order it was made in to `order` (p's now), as a new dict of new tensors:
    each moment decoded in the old order, copied into the new one and encoded. Exact for fp32 states; quantized
    ones are re-blocked."""
    kind = KINDS[state["state_kind"]]
    out = dict(state)
    for name, moment in names:
        if name + "_codes" in state:
            old = _empty_in_order(p.shape, _state_order(state, p), p.device)
            _abi.check(_abi.lib.lbopt_dequantize(kind, moment, _state_of(state, name, []), tensor_view(old).ptr, None))
            out.update(_zero_state(kind, p, name))
            _encode(out, name, moment, _empty_in_order(p.shape, order, p.device).copy_(old), _what(p, None))
    _set_order(out, order)
    return out


_COMMON_DOC = """
    Common args:
        params: iterable of tensors, dicts (param groups) or (name, tensor) pairs.
        lr: float or tensor; read as a host double on every step().
        maximize: ascend instead of descend.
        state_kind: '4bit', '8bit', 'fp8' or 'fp32'.
        min_quant_size: tensors with fewer elements keep fp32 states (default 4096, as torchao and bitsandbytes).
        keep_fp32: params (tensors, or names when named parameters are given) whose states stay fp32; a param
            group may also set fp32_state=True.
        bf16_stochastic_round: round bfloat16 params stochastically (reproducible: keyed by seed, step, element).
        state_stochastic_round: round the codes of the quantized first-moment states (exp_avg, momentum_buffer,
            m1, m2) stochastically, unbiased, so that a slowly moving average drifts as its fp32 value would
            (reproducible: keyed by seed, step, state, element); False: to nearest. None (default): stochastic
            for SGD, Lion and AdEMAMix with 4-bit and FP8 states, to nearest otherwise (docs/optimizers.md,
            "Which state kind to train with").
        skip_nonfinite: leave a tensor whose gradient has NaN/Inf untouched (its step count does not advance).
        foreach, fused: accepted for torch.optim compatibility; lbopt always runs one fused call per group.
    Works with torch.amp.GradScaler: the scaler's scale and found_inf reach the library, which skips the whole
    step on overflow without writing anything. A step() is atomic: everything it would pass to the library is
    validated before the first param or state is written.
"""


def _init_common(self, params, defaults, maximize=False, state_kind="4bit", min_quant_size=4096, keep_fp32=(),
                 bf16_stochastic_round=False, skip_nonfinite=False, seed=0, foreach=None, fused=None,
                 capturable=False, differentiable=False, state_stochastic_round=None):
    _LowBit.__init__(self, params, {**defaults, "maximize": maximize}, state_kind=state_kind,
                     min_quant_size=min_quant_size, keep_fp32=keep_fp32,
                     bf16_stochastic_round=bf16_stochastic_round, skip_nonfinite=skip_nonfinite, seed=seed,
                     state_stochastic_round=state_stochastic_round, capturable=capturable,
                     differentiable=differentiable)


def _betas(group, n):
    betas = group["betas"]
    if not isinstance(betas, (tuple, list)) or len(betas) != n:
        raise ValueError(f"lbopt: betas must be a tuple of {n}, not {betas!r}")
    return {f"beta{i + 1}": _real(b, f"betas[{i}]") for i, b in enumerate(betas)}


class LowBitAdamW(_LowBit):
    """AdamW (or Adam with adam=True, AMSGrad with amsgrad=True), as torch.optim.AdamW; states exp_avg,
    exp_avg_sq (and max_exp_avg_sq)."""
    __doc__ += _COMMON_DOC
    _optimizer = "adamw"
    _OWN_ATTRS = _LowBit._OWN_ATTRS + ("adam",)

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, *,
                 adam=False, **common):
        self.adam = adam
        _init_common(self, params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad),
                     **common)

    def _fields(self, group):
        flags = ((_abi.FLAG_ADAM_COUPLED_DECAY if self.adam else 0)
                 | (_abi.FLAG_AMSGRAD if group["amsgrad"] else 0))
        return dict(_betas(group, 2), eps=_real(group["eps"], "eps"),
                    weight_decay=_real(group["weight_decay"], "weight_decay")), flags


class LowBitSGD(_LowBit):
    """SGD with momentum, dampening, Nesterov and (coupled) weight decay, as torch.optim.SGD, with the momentum
    buffer (state momentum_buffer) in low bit; momentum=0 (torch's default) keeps no state."""
    __doc__ += _COMMON_DOC
    _optimizer = "sgd"

    def __init__(self, params, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, **common):
        _init_common(self, params, dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                                        nesterov=nesterov), **common)

    def _fields(self, group):
        return (dict(momentum=_real(group["momentum"], "momentum"), dampening=_real(group["dampening"], "dampening"),
                     weight_decay=_real(group["weight_decay"], "weight_decay")),
                _abi.FLAG_NESTEROV if group["nesterov"] else 0)


class LowBitLion(_LowBit):
    """Lion (Chen et al. 2023) with bitsandbytes' update: p *= 1 - lr * wd; p -= lr * sign(beta1 m + (1 - beta1)
    g); m = beta2 m + (1 - beta2) g. State exp_avg. Defaults as bitsandbytes' Lion."""
    __doc__ += _COMMON_DOC
    _optimizer = "lion"

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0, **common):
        _init_common(self, params, dict(lr=lr, betas=betas, weight_decay=weight_decay), **common)

    def _fields(self, group):
        return dict(_betas(group, 2), weight_decay=_real(group["weight_decay"], "weight_decay")), 0


class LowBitAdEMAMix(_LowBit):
    """AdEMAMix (Pagliardini et al. 2024) as bitsandbytes' AdEMAMix: betas (beta1, beta2, beta3), alpha and the
    optional warm-ups t_alpha and t_beta3 (None: none). States m1, m2, nu. With 4-bit states nu is kept on the
    signed map's non-negative codes; a group's "nu_linear_map" (False unless set, True in the groups of state dicts
    saved by lbopt 0.3) keeps it on the unsigned linear map, as lbopt 0.3 did."""
    __doc__ += _COMMON_DOC
    _optimizer = "ademamix"

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999, 0.9999), alpha=5.0, t_alpha=None, t_beta3=None,
                 eps=1e-8, weight_decay=1e-2, **common):
        _init_common(self, params, dict(lr=lr, betas=betas, alpha=alpha, t_alpha=t_alpha, t_beta3=t_beta3,
                                        eps=eps, weight_decay=weight_decay, nu_linear_map=False), **common)

    def _fields(self, group):
        warm = {k: 0.0 if group[k] is None else _real(group[k], k) for k in ("t_alpha", "t_beta3")}
        return (dict(_betas(group, 3), alpha=_real(group["alpha"], "alpha"), eps=_real(group["eps"], "eps"),
                     weight_decay=_real(group["weight_decay"], "weight_decay"), **warm),
                _abi.FLAG_NU_LINEAR_MAP if group.get("nu_linear_map") else 0)

    def _saved_group(self, group):
        # an lbopt group (it has fp32_state) saved without the setting is lbopt 0.3's, whose nu is on the linear map
        if "fp32_state" in group and "nu_linear_map" not in group:
            group = {**group, "nu_linear_map": True}
        return super()._saved_group(group)


_MUON_ADJUST_LR = (None, "original", "match_rms_adamw", "spectral_unclamped")


class LowBitMuon(_LowBit):
    """Muon (Jordan et al. 2024) as torch.optim.Muon: the same arguments, defaults, errors and operation order, and
    with fp32 states the same params bit for bit. lbopt moves the momentum (one library call per param group and
    state kind) and writes each param's update direction in bfloat16, the dtype the Newton-Schulz iteration runs
    in; the iteration, the lr adjustment and the decoupled weight decay run in torch on the param's device. The
    directions live while a step runs (2 bytes per param). A refused step writes nothing. 2-D params only; pair it
    with an lbopt AdamW for the others (muon_param_groups). DTensor (sharded) params are refused: the iteration
    needs the whole matrix. State: momentum_buffer."""
    __doc__ += _COMMON_DOC
    _optimizer = "muon"
    _step_supports_amp_scaling = False  # GradScaler unscales the grads: the direction is not the param's update

    def __init__(self, params, lr=1e-3, weight_decay=0.1, momentum=0.95, nesterov=True,
                 ns_coefficients=(3.4445, -4.7750, 2.0315), eps=1e-7, ns_steps=5, adjust_lr_fn=None, **common):
        if isinstance(lr, torch.Tensor) and lr.numel() != 1:
            raise ValueError("Tensor lr must be 1-element")
        if not 0.0 <= lr:
            raise ValueError(f"Learning rate should be >= 0 but is: {lr}")
        if not 0.0 <= momentum:
            raise ValueError(f"momentum should be >= 0 but is: {momentum}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"weight decay should be >= 0 but is: {weight_decay}")
        if adjust_lr_fn not in _MUON_ADJUST_LR:
            raise ValueError(f"Adjust learning rate function {adjust_lr_fn} is not supported")
        for flag in ("bf16_stochastic_round", "skip_nonfinite"):
            if common.get(flag):
                raise ValueError(f"lbopt: {flag}=True is not supported by Muon (torch updates the params)")
        _init_common(self, params, dict(lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
                                        ns_coefficients=ns_coefficients, eps=eps, ns_steps=ns_steps,
                                        adjust_lr_fn=adjust_lr_fn), **common)
        for group in self.param_groups:
            for p in group["params"]:
                if p.ndim != 2:
                    raise ValueError(f"Muon only supports 2D parameters whereas we found a parameter with size: "
                                     f"{p.size()}")

    def _fields(self, group):
        return (dict(momentum=_real(group["momentum"], "momentum")),
                _abi.FLAG_NESTEROV if group["nesterov"] else 0)

    @torch.no_grad()
    def step(self, closure=None):
        """The library's momentum step, one call per param group, device and state kind, all validated before the
        first runs; then torch.optim.Muon's orthogonalization and update of each param from its direction."""
        loss = _run_closure(closure)
        calls, pending, updates = [], {}, []
        for group in self.param_groups:
            calls.extend(self._plan_muon(group, pending, updates))
        self._run(calls, pending)
        for p, direction, group in updates:
            lr = _lr(group)
            update = _newton_schulz(direction, group["ns_coefficients"], group["ns_steps"], group["eps"])
            p.mul_(1 - lr * group["weight_decay"])
            p.add_(update, alpha=-_muon_lr(lr, group["adjust_lr_fn"], p.shape))
        return loss

    def _plan_muon(self, group, pending, updates):
        """The calls of a group's momentum step, each param's direction (and its group) appended to updates."""
        names = self._states(group)
        by_call, held = {}, []
        for p, name in zip(group["params"], group.get("param_names") or [None] * len(group["params"])):
            if p.grad is None:
                continue
            if torch.is_complex(p):
                raise RuntimeError("Muon does not support complex parameters")
            if p.grad.is_sparse:
                raise RuntimeError("Muon does not support sparse gradients")
            if p.grad.ndim != 2:
                raise ValueError("Param gradient must be a 2D matrix")
            if _checkpoint.is_dtensor(p):
                raise ValueError(f"lbopt: Muon: {_what(p, name)} is a DTensor; the Newton-Schulz iteration needs "
                                 f"the whole matrix, which lbopt does not gather (use torch.optim.Muon for it)")
            direction = torch.empty_like(p, dtype=torch.bfloat16)
            state = self.state.get(p) or self._init_state(p, group, name)
            if state is not self.state.get(p):
                pending[p] = state
            ps = _ParamSlot(direction, state, names, p, name)
            held.append(ps.set_grad(p.grad, direction))
            ps.slot.step = state["step"] + 1
            batch = by_call.setdefault(ps.call_key, _Batch([], []))
            batch.param_slots.append(ps)
            batch.states.append(state)
            updates.append((p, direction, group))
        return [_Call(key, batch).prepare(self._config(group, key.kind), _lr(group), held, None, None, False)
                for key, batch in by_call.items()]


def _newton_schulz(x, coefficients, steps, eps):
    """torch.optim.Muon's orthogonalization of a bfloat16 matrix x, in its operations: x / max(|x|_F, eps), then
    steps of the quintic x <- a x + (b A + c A A) x with A = x x^T, on x or, for a tall matrix, its transpose."""
    if steps >= 100:
        raise ValueError("Number of steps must be less than 100 for computational efficiency")
    if len(coefficients) != 3:
        raise ValueError("Coefficients must be a tuple of exactly 3 values")
    a, b, c = coefficients
    tall = x.size(0) > x.size(1)
    if tall:
        x = x.T
    x = x.div(x.norm().clamp(min=eps))
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


def _muon_lr(lr, adjust_lr_fn, shape):
    """torch.optim.Muon's lr for a matrix of shape (A, B): scaled by sqrt(max(1, A / B)) ("original", the
    default), 0.2 sqrt(max(A, B)) ("match_rms_adamw") or sqrt(A / B) ("spectral_unclamped")."""
    rows, cols = shape[:2]
    if adjust_lr_fn in (None, "original"):
        return lr * math.sqrt(max(1, rows / cols))
    if adjust_lr_fn == "match_rms_adamw":
        return lr * 0.2 * math.sqrt(max(rows, cols))
    return lr * math.sqrt(rows / cols)


def muon_param_groups(model, adamw_names=("embed", "lm_head", "head", "output")):
    """The params of model split as the Muon authors recommend: (muon, adamw), Muon for the 2-D weights of hidden
    layers, AdamW for the rest (embeddings, the output head, biases, norms' gains). A 2-D param goes to AdamW when
    it belongs to an nn.Embedding or its qualified name contains one of adamw_names."""
    muon, adamw = [], []
    embeddings = {id(p) for m in model.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters()}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        to_adamw = p.ndim != 2 or id(p) in embeddings or any(part in name for part in adamw_names)
        (adamw if to_adamw else muon).append(p)
    return muon, adamw


# BEGIN GENERATED CLASSES: written by tools/gen_torch_classes.py from its table; edit that, then rerun it


class AdamW4bit(LowBitAdamW):
    """AdamW with 4-bit states (block 128), 1.06 bytes/param."""
    __doc__ += "\n" + LowBitAdamW.__doc__

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, *, adam=False,
                 **common):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad, adam=adam,
                         **{**common, "state_kind": "4bit"})


class AdamW8bit(LowBitAdamW):
    """AdamW with 8-bit dynamic-map states (block 256)."""
    __doc__ += "\n" + LowBitAdamW.__doc__

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, *, adam=False,
                 **common):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad, adam=adam,
                         **{**common, "state_kind": "8bit"})


class AdamWFp8(LowBitAdamW):
    """AdamW with float8 e4m3 states (block 256)."""
    __doc__ += "\n" + LowBitAdamW.__doc__

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, *, adam=False,
                 **common):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad, adam=adam,
                         **{**common, "state_kind": "fp8"})


class AdamW(LowBitAdamW):
    """AdamW with full-precision (fp32) states, fused in lbopt."""
    __doc__ += "\n" + LowBitAdamW.__doc__

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, *, adam=False,
                 **common):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad, adam=adam,
                         **{**common, "state_kind": "fp32"})


class Adam4bit(LowBitAdamW):
    """Adam (L2 decay coupled into the gradient), 4-bit states."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=False, **common):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                         **{**common, "adam": True, "state_kind": "4bit"})


class Adam8bit(LowBitAdamW):
    """Adam (L2 decay coupled into the gradient), 8-bit states."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=False, **common):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                         **{**common, "adam": True, "state_kind": "8bit"})


class AdamFp8(LowBitAdamW):
    """Adam (L2 decay coupled into the gradient), float8 states."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=False, **common):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                         **{**common, "adam": True, "state_kind": "fp8"})


class SGD4bit(LowBitSGD):
    """SGD with 4-bit states (block 128)."""
    __doc__ += "\n" + LowBitSGD.__doc__

    def __init__(self, params, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, **common):
        super().__init__(params, lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                         nesterov=nesterov, **{**common, "state_kind": "4bit"})


class SGD8bit(LowBitSGD):
    """SGD with 8-bit dynamic-map states (block 256)."""
    __doc__ += "\n" + LowBitSGD.__doc__

    def __init__(self, params, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, **common):
        super().__init__(params, lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                         nesterov=nesterov, **{**common, "state_kind": "8bit"})


class SGDFp8(LowBitSGD):
    """SGD with float8 e4m3 states (block 256)."""
    __doc__ += "\n" + LowBitSGD.__doc__

    def __init__(self, params, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, **common):
        super().__init__(params, lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                         nesterov=nesterov, **{**common, "state_kind": "fp8"})


class SGD(LowBitSGD):
    """SGD with full-precision (fp32) states."""
    __doc__ += "\n" + LowBitSGD.__doc__

    def __init__(self, params, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, **common):
        super().__init__(params, lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                         nesterov=nesterov, **{**common, "state_kind": "fp32"})


class Lion4bit(LowBitLion):
    """Lion with 4-bit states (block 128)."""
    __doc__ += "\n" + LowBitLion.__doc__

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0, **common):
        super().__init__(params, lr=lr, betas=betas, weight_decay=weight_decay, **{**common, "state_kind": "4bit"})


class Lion8bit(LowBitLion):
    """Lion with 8-bit dynamic-map states (block 256)."""
    __doc__ += "\n" + LowBitLion.__doc__

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0, **common):
        super().__init__(params, lr=lr, betas=betas, weight_decay=weight_decay, **{**common, "state_kind": "8bit"})


class LionFp8(LowBitLion):
    """Lion with float8 e4m3 states (block 256)."""
    __doc__ += "\n" + LowBitLion.__doc__

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0, **common):
        super().__init__(params, lr=lr, betas=betas, weight_decay=weight_decay, **{**common, "state_kind": "fp8"})


class Lion(LowBitLion):
    """Lion with full-precision (fp32) states."""
    __doc__ += "\n" + LowBitLion.__doc__

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0, **common):
        super().__init__(params, lr=lr, betas=betas, weight_decay=weight_decay, **{**common, "state_kind": "fp32"})


class AdEMAMix4bit(LowBitAdEMAMix):
    """AdEMAMix with 4-bit states (block 128)."""
    __doc__ += "\n" + LowBitAdEMAMix.__doc__

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999, 0.9999), alpha=5.0, t_alpha=None, t_beta3=None, eps=1e-8,
                 weight_decay=1e-2, **common):
        super().__init__(params, lr=lr, betas=betas, alpha=alpha, t_alpha=t_alpha, t_beta3=t_beta3, eps=eps,
                         weight_decay=weight_decay, **{**common, "state_kind": "4bit"})


class AdEMAMix8bit(LowBitAdEMAMix):
    """AdEMAMix with 8-bit dynamic-map states (block 256)."""
    __doc__ += "\n" + LowBitAdEMAMix.__doc__

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999, 0.9999), alpha=5.0, t_alpha=None, t_beta3=None, eps=1e-8,
                 weight_decay=1e-2, **common):
        super().__init__(params, lr=lr, betas=betas, alpha=alpha, t_alpha=t_alpha, t_beta3=t_beta3, eps=eps,
                         weight_decay=weight_decay, **{**common, "state_kind": "8bit"})


class AdEMAMixFp8(LowBitAdEMAMix):
    """AdEMAMix with float8 e4m3 states (block 256)."""
    __doc__ += "\n" + LowBitAdEMAMix.__doc__

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999, 0.9999), alpha=5.0, t_alpha=None, t_beta3=None, eps=1e-8,
                 weight_decay=1e-2, **common):
        super().__init__(params, lr=lr, betas=betas, alpha=alpha, t_alpha=t_alpha, t_beta3=t_beta3, eps=eps,
                         weight_decay=weight_decay, **{**common, "state_kind": "fp8"})


class AdEMAMix(LowBitAdEMAMix):
    """AdEMAMix with full-precision (fp32) states."""
    __doc__ += "\n" + LowBitAdEMAMix.__doc__

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999, 0.9999), alpha=5.0, t_alpha=None, t_beta3=None, eps=1e-8,
                 weight_decay=1e-2, **common):
        super().__init__(params, lr=lr, betas=betas, alpha=alpha, t_alpha=t_alpha, t_beta3=t_beta3, eps=eps,
                         weight_decay=weight_decay, **{**common, "state_kind": "fp32"})


class Muon4bit(LowBitMuon):
    """Muon with a 4-bit momentum (block 128), 0.53 bytes/param."""
    __doc__ += "\n" + LowBitMuon.__doc__

    def __init__(self, params, lr=1e-3, weight_decay=0.1, momentum=0.95, nesterov=True,
                 ns_coefficients=(3.4445, -4.7750, 2.0315), eps=1e-7, ns_steps=5, adjust_lr_fn=None, **common):
        super().__init__(params, lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
                         ns_coefficients=ns_coefficients, eps=eps, ns_steps=ns_steps, adjust_lr_fn=adjust_lr_fn,
                         **{**common, "state_kind": "4bit"})


class Muon8bit(LowBitMuon):
    """Muon with an 8-bit dynamic-map momentum (block 256)."""
    __doc__ += "\n" + LowBitMuon.__doc__

    def __init__(self, params, lr=1e-3, weight_decay=0.1, momentum=0.95, nesterov=True,
                 ns_coefficients=(3.4445, -4.7750, 2.0315), eps=1e-7, ns_steps=5, adjust_lr_fn=None, **common):
        super().__init__(params, lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
                         ns_coefficients=ns_coefficients, eps=eps, ns_steps=ns_steps, adjust_lr_fn=adjust_lr_fn,
                         **{**common, "state_kind": "8bit"})


class MuonFp8(LowBitMuon):
    """Muon with a float8 e4m3 momentum (block 256)."""
    __doc__ += "\n" + LowBitMuon.__doc__

    def __init__(self, params, lr=1e-3, weight_decay=0.1, momentum=0.95, nesterov=True,
                 ns_coefficients=(3.4445, -4.7750, 2.0315), eps=1e-7, ns_steps=5, adjust_lr_fn=None, **common):
        super().__init__(params, lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
                         ns_coefficients=ns_coefficients, eps=eps, ns_steps=ns_steps, adjust_lr_fn=adjust_lr_fn,
                         **{**common, "state_kind": "fp8"})


class Muon(LowBitMuon):
    """Muon with a full-precision (fp32) momentum."""
    __doc__ += "\n" + LowBitMuon.__doc__

    def __init__(self, params, lr=1e-3, weight_decay=0.1, momentum=0.95, nesterov=True,
                 ns_coefficients=(3.4445, -4.7750, 2.0315), eps=1e-7, ns_steps=5, adjust_lr_fn=None, **common):
        super().__init__(params, lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
                         ns_coefficients=ns_coefficients, eps=eps, ns_steps=ns_steps, adjust_lr_fn=adjust_lr_fn,
                         **{**common, "state_kind": "fp32"})


__all__ += ["AdamW4bit", "AdamW8bit", "AdamWFp8", "AdamW", "Adam4bit", "Adam8bit", "AdamFp8", "SGD4bit", "SGD8bit",
            "SGDFp8", "SGD", "Lion4bit", "Lion8bit", "LionFp8", "Lion", "AdEMAMix4bit", "AdEMAMix8bit", "AdEMAMixFp8",
            "AdEMAMix", "Muon4bit", "Muon8bit", "MuonFp8", "Muon"]
# END GENERATED CLASSES


# ---- conversion to and from torch.optim.AdamW state_dicts -----------------------------------------------------

def to_torch_adamw_state_dict(optimizer):
    """optimizer.state_dict() in torch.optim.AdamW's format: dequantized float32 exp_avg / exp_avg_sq (and
    max_exp_avg_sq) shaped like their params, step as a float32 tensor."""
    sd = optimizer.state_dict()
    params = [p for g in optimizer.param_groups for p in g["params"]]
    ids = [i for g in sd["param_groups"] for i in g["params"]]
    out = {}
    for pid, p in zip(ids, params):
        st = optimizer.state.get(p)
        if not st:
            continue
        kind = KINDS[st["state_kind"]]
        t = _local(p, p, None)
        entry = {"step": torch.tensor(float(st["step"]))}
        for name, moment in _MOMENTS:
            if name + "_codes" in st:
                dst = _empty_in_order(t.shape, _state_order(st, t), t.device)
                _abi.check(_abi.lib.lbopt_dequantize(kind, moment, _state_of(st, name, []), tensor_view(dst).ptr, None))
                entry[name] = dst
        out[pid] = entry
    return {"state": out, "param_groups": sd["param_groups"]}


def load_torch_adamw_state_dict(optimizer, torch_state_dict):
    """Loads a torch.optim.AdamW (or Adam) state_dict, quantizing its moments into this optimizer's states:
    optimizer.load_state_dict does it (it reads torchao's and bitsandbytes' states too)."""
    optimizer.load_state_dict(torch_state_dict)


def _state_of(st, name, keep):
    codes = tensor_view(st[name + "_codes"])
    scales = tensor_view(st[name + "_scales"]) if name + "_scales" in st else None
    keep += [codes, scales]
    return _abi.State(codes.ptr, scales.ptr if scales else None)

"""Drop-in torch.optim optimizers with 4-bit, 8-bit, FP8 or fp32 states, stepped by the lbopt C library.

Every step() reads each group's lr as a host double (a Python float, or a tensor updated with fill_) and passes
it by value, so any torch.optim.lr_scheduler works unchanged and a schedule that changes the lr every step costs
nothing. All tensors of a param group (per device and state kind) go to the library in one call.

    from lbopt.torch import AdamW4bit
    opt = AdamW4bit(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-3, total_steps=1000)
"""
import ctypes
import torch

from . import _abi
from ._dlpack import View
from .functional import KINDS, kind_id

__all__ = ["AdamW4bit", "AdamW8bit", "AdamWFp8", "Adam4bit", "Adam8bit", "AdamFp8", "AdamW", "LowBitAdamW",
           "to_torch_adamw_state_dict", "load_torch_adamw_state_dict"]

_KIND_NAMES = {v: k for k, v in KINDS.items()}
_MOMENTS = (("exp_avg", _abi.MOMENT_FIRST), ("exp_avg_sq", _abi.MOMENT_SECOND), ("max_exp_avg_sq", _abi.MOMENT_SECOND))


def _dl_dtype(dt):
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


def _dl_device(t):
    if t.device.type == "cpu":
        return (_abi.kDLCPU, 0)
    if t.device.type == "cuda":
        return (_abi.kDLCUDA, t.device.index)
    raise ValueError(f"lbopt: tensors on {t.device} are not supported (cpu or cuda)")


def _view(t):
    """A DLTensor view of a dense tensor, built from its metadata (no DLPack capsule)."""
    if t.layout != torch.strided:
        raise TypeError(f"lbopt: {t.layout} tensors are not supported; gradients and params must be dense")
    return View.from_parts(t.data_ptr(), t.shape, t.stride(), _dl_dtype(t.dtype), _dl_device(t), t)


def _grad_key(g):
    return (g.dtype, g.shape, g.stride(), g.device)


class _ParamSlot:
    """The lbopt_adamw_slot of one param, with the views it points to: built once, rebuilt when the param's
    storage moves or a state tensor is replaced, refreshed for the grad on every step."""

    def __init__(self, p, state):
        self.param_key = (p.data_ptr(), p.shape, p.stride())
        self.state_keys = [k for k in state if torch.is_tensor(state[k])]
        self.state_tensors = [state[k] for k in self.state_keys]
        self.views = [_view(p)]
        self.slot = _abi.AdamWSlot()
        self.slot.struct_size = ctypes.sizeof(_abi.AdamWSlot)
        self.slot.param = self.views[0].ptr
        for field, (name, _) in zip(("m", "v", "vmax"), _MOMENTS):
            if name + "_codes" in state:
                setattr(self.slot, field, _state_of(state, name, self.views))
        self.grad = View()
        self.grad_key = None

    def fresh(self, p, state):
        return self.param_key == (p.data_ptr(), p.shape, p.stride()) and all(
            state.get(k) is t for k, t in zip(self.state_keys, self.state_tensors))


    def set_grad(self, g):
        if g.layout != torch.strided:
            raise TypeError(f"lbopt: {g.layout} gradients are not supported; lbopt steps dense tensors")
        key = _grad_key(g)
        if key != self.grad_key:
            self.grad.set(g.data_ptr(), g.shape, g.stride(), _dl_dtype(g.dtype), _dl_device(g), None)
            self.grad_key = key
            self.slot.grad = self.grad.ptr
        else:
            self.grad.dl.data = g.data_ptr()


class LowBitAdamW(torch.optim.Optimizer):
    """AdamW (or Adam with adam=True) with optimizer states of one lbopt state kind.

    Args:
        params: iterable of tensors, dicts (param groups) or (name, tensor) pairs.
        lr: float or tensor; read as a host double on every step().
        state_kind: '4bit', '8bit', 'fp8' or 'fp32'.
        min_quant_size: tensors with fewer elements keep fp32 states (default 4096, as torchao and bitsandbytes).
        keep_fp32: params (tensors, or names when named parameters are given) whose states stay fp32; a param
            group may also set fp32_state=True.
        bf16_stochastic_round: round bfloat16 params stochastically (reproducible: keyed by seed, step, element).
        skip_nonfinite: leave a tensor whose gradient has NaN/Inf untouched (its step count does not advance).
    Works with torch.amp.GradScaler: the scaler's scale and found_inf reach the library, which skips the whole
    step on overflow without writing anything.
    """

    _step_supports_amp_scaling = True

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, *,
                 maximize=False, state_kind="4bit", adam=False, min_quant_size=4096, keep_fp32=(),
                 bf16_stochastic_round=False, skip_nonfinite=False, seed=0):
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                        maximize=maximize, fp32_state=False)
        super().__init__(params, defaults)
        self.state_kind = kind_id(state_kind)
        _abi.layout(self.state_kind, 0)  # the library refuses an unknown kind
        self.adam = adam
        self.min_quant_size = min_quant_size
        self.bf16_stochastic_round = bf16_stochastic_round
        self.skip_nonfinite = skip_nonfinite
        self.seed = seed
        keep = list(keep_fp32)
        self._keep_ids = {id(k) for k in keep if torch.is_tensor(k)}
        self._keep_names = {k for k in keep if isinstance(k, str)}
        self._slots = {}  # id(param) -> _ParamSlot (the slot's views hold the param)
        for group in self.param_groups:
            self._validate_group(group)

    # ---- configuration ---------------------------------------------------------------------------------------

    def _kind_for(self, p, group, name=None):
        if (group["fp32_state"] or id(p) in self._keep_ids or name in self._keep_names
                or p.numel() < self.min_quant_size):
            return _abi.STATE_FP32
        return self.state_kind

    def _config(self, group, kind):
        flags = ((_abi.FLAG_ADAM_COUPLED_DECAY if self.adam else 0) | (_abi.FLAG_AMSGRAD if group["amsgrad"] else 0)
                 | (_abi.FLAG_MAXIMIZE if group["maximize"] else 0)
                 | (_abi.FLAG_BF16_STOCHASTIC_ROUND if self.bf16_stochastic_round else 0)
                 | (_abi.FLAG_SKIP_NONFINITE if self.skip_nonfinite else 0))
        return _abi.adamw_config(kind, group["betas"], group["eps"], group["weight_decay"], flags, self.seed)

    def _validate_group(self, group):
        """The library's own checks of the hyper-parameters and lr, on an empty tensor: errors surface at
        construction with the library's message."""
        empty = torch.empty(0)
        slot = _abi.AdamWSlot()
        slot.struct_size = ctypes.sizeof(_abi.AdamWSlot)
        views = [_view(empty) for _ in range(4)]
        slot.param, slot.grad = views[0].ptr, views[1].ptr
        slot.m, slot.v = _abi.State(views[2].ptr, None), _abi.State(views[3].ptr, None)
        slot.step = 1
        cfg = self._config(group, _abi.STATE_FP32)
        cfg.flags &= ~_abi.FLAG_AMSGRAD
        _abi.check(_abi.lib.lbopt_adamw_step(ctypes.byref(cfg), _lr(group), ctypes.byref(slot), 1, None))

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        if hasattr(self, "_slots"):  # groups given to __init__ are validated there, once all attributes exist
            try:
                self._validate_group(self.param_groups[-1])
            except Exception:
                self.param_groups.pop()
                raise

    # ---- state -----------------------------------------------------------------------------------------------

    def _init_state(self, p, group, name):
        kind = self._kind_for(p, group, name)
        lay = _abi.layout(kind, p.numel())
        codes_dtype = torch.float32 if kind == _abi.STATE_FP32 else torch.uint8
        state = {"step": 0, "state_kind": _KIND_NAMES[kind]}
        names = _MOMENTS if group["amsgrad"] else _MOMENTS[:2]
        for moment, _ in names:
            state[moment + "_codes"] = torch.zeros(lay.codes_numel, dtype=codes_dtype, device=p.device)
            if kind != _abi.STATE_FP32:
                state[moment + "_scales"] = torch.zeros(lay.scales_numel, dtype=torch.float32, device=p.device)
        return state

    def _params(self):
        """(param, group, name or None) for every param, in state_dict order."""
        for group in self.param_groups:
            names = group.get("param_names") or [None] * len(group["params"])
            yield from ((p, group, n) for p, n in zip(group["params"], names))

    def _slot(self, p, state):
        cached = self._slots.get(id(p))
        if cached is None or not cached.fresh(p, state):
            cached = self._slots[id(p)] = _ParamSlot(p, state)
        return cached

    # ---- the step --------------------------------------------------------------------------------------------

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        grad_scale = getattr(self, "grad_scale", None)  # set by torch.amp.GradScaler around step()
        found_inf = getattr(self, "found_inf", None)
        for group in self.param_groups:
            calls = {}  # (device, kind) -> [(param, state, slot)]
            names = group.get("param_names") or [None] * len(group["params"])
            for p, name in zip(group["params"], names):
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state.update(self._init_state(p, group, name))
                ps = self._slot(p, state)
                ps.set_grad(p.grad)
                ps.slot.step = state["step"] + 1
                calls.setdefault((p.device, KINDS[state["state_kind"]]), []).append((p, state, ps))
            lr = _lr(group)
            for (device, kind), entries in calls.items():
                self._call(group, kind, device, lr, entries, grad_scale, found_inf)
        return loss

    def _call(self, group, kind, device, lr, entries, grad_scale, found_inf):
        n = len(entries)
        slots = (_abi.AdamWSlot * n)()
        for i, (_, _, ps) in enumerate(entries):
            slots[i] = ps.slot
        skipped = torch.zeros(n, dtype=torch.uint8, device=device)
        opts = _abi.StepOptions()
        opts.struct_size = ctypes.sizeof(opts)
        keep = [_view(skipped)]
        opts.skipped = keep[0].ptr
        for field, t in (("grad_scale", grad_scale), ("found_inf", found_inf)):
            if t is not None:
                v = _view(t.to(device=device, dtype=torch.float32))
                keep.append(v)
                setattr(opts, field, v.ptr)
        if device.type == "cuda":
            opts.stream = torch.cuda.current_stream(device).cuda_stream
        cfg = self._config(group, kind)
        _abi.check(_abi.lib.lbopt_adamw_step(ctypes.byref(cfg), lr, slots, n, ctypes.byref(opts)))
        # Only a skip can hold a step count back; reading the flags from a GPU would synchronize.
        flags = skipped.tolist() if (self.skip_nonfinite or found_inf is not None) else [0] * n
        for (_, state, _), s in zip(entries, flags):
            if not s:
                state["step"] += 1

    # ---- checkpoints -----------------------------------------------------------------------------------------

    def load_state_dict(self, state_dict):
        """Loads states saved by state_dict() (plain tensors; map_location and weights_only=True work). Everything
        is checked before anything changes: a state of another kind or size than this optimizer would create for
        its param is refused with ValueError. The state tensors keep their dtypes (torch's default would cast
        float32 scales to the param dtype) and move to their param's device."""
        groups = [{**self.defaults, **g} for g in state_dict["param_groups"]]  # e.g. torch.optim.AdamW's groups
        saved = state_dict["state"]
        loaded = {}
        for saved_group, group in zip(groups, self.param_groups):
            names = group.get("param_names") or [None] * len(group["params"])
            for pid, p, name in zip(saved_group["params"], group["params"], names):
                if pid in saved:
                    st = {k: (v.to(p.device) if torch.is_tensor(v) else v) for k, v in saved[pid].items()}
                    self._check_loaded(p, {**group, **saved_group}, name, st)
                    loaded[p] = st
        super().load_state_dict({"state": {}, "param_groups": groups})
        for p, st in loaded.items():
            self.state[p] = st
        self._slots = {}

    def _check_loaded(self, p, group, name, st):
        want = self._init_state(p, group, name)
        if st.get("state_kind") != want["state_kind"]:
            raise ValueError(f"lbopt: saved state kind {st.get('state_kind')!r} does not match this optimizer's "
                             f"{want['state_kind']!r} for a param of shape {tuple(p.shape)}")
        for k, v in want.items():
            if torch.is_tensor(v) and (k not in st or st[k].shape != v.shape or st[k].dtype != v.dtype):
                raise ValueError(f"lbopt: saved state {k!r} does not fit a param of shape {tuple(p.shape)} "
                                 f"with {want['state_kind']} states")


def _lr(group):
    lr = group["lr"]
    return float(lr.item() if torch.is_tensor(lr) else lr)


def _kind_class(name, kind, adam, doc):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0 if adam else 1e-2,
                 amsgrad=False, **kwargs):
        LowBitAdamW.__init__(self, params, lr, betas, eps, weight_decay, amsgrad, state_kind=kind, adam=adam,
                             **kwargs)

    return type(name, (LowBitAdamW,), {"__init__": __init__, "__doc__": doc})


AdamW4bit = _kind_class("AdamW4bit", "4bit", False, "AdamW with 4-bit states (block 128), 1.06 bytes/param.")
AdamW8bit = _kind_class("AdamW8bit", "8bit", False, "AdamW with 8-bit dynamic-map states (block 256).")
AdamWFp8 = _kind_class("AdamWFp8", "fp8", False, "AdamW with float8 e4m3 states (block 256).")
Adam4bit = _kind_class("Adam4bit", "4bit", True, "Adam (L2 decay coupled into the gradient), 4-bit states.")
Adam8bit = _kind_class("Adam8bit", "8bit", True, "Adam (L2 decay coupled into the gradient), 8-bit states.")
AdamFp8 = _kind_class("AdamFp8", "fp8", True, "Adam (L2 decay coupled into the gradient), float8 states.")
AdamW = _kind_class("AdamW", "fp32", False, "AdamW with full-precision (fp32) states, fused in lbopt.")


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
        entry = {"step": torch.tensor(float(st["step"]))}
        for name, moment in _MOMENTS:
            if name + "_codes" in st:
                dst = torch.empty(p.shape, dtype=torch.float32, device=p.device)
                _abi.check(_abi.lib.lbopt_dequantize(kind, moment, _state_of(st, name, []), _view(dst).ptr, None))
                entry[name] = dst
        out[pid] = entry
    return {"state": out, "param_groups": sd["param_groups"]}


def load_torch_adamw_state_dict(optimizer, torch_state_dict):
    """Loads a torch.optim.AdamW (or Adam) state_dict, quantizing its moments into this optimizer's states."""
    optimizer.load_state_dict({"state": {}, "param_groups": torch_state_dict["param_groups"]})
    ids = [i for g in torch_state_dict["param_groups"] for i in g["params"]]
    for pid, (p, group, name) in zip(ids, optimizer._params()):
        src = torch_state_dict["state"].get(pid)
        if not src:
            continue
        st = optimizer._init_state(p, group, name)
        st["step"] = int(float(src["step"]))
        for name, moment in _MOMENTS:
            if name + "_codes" in st:
                values = src[name].detach().to(device=p.device, dtype=torch.float32).contiguous()
                _abi.check(_abi.lib.lbopt_quantize(KINDS[st["state_kind"]], moment, _view(values).ptr,
                                                   _state_of(st, name, []), None))
        optimizer.state[p] = st
    optimizer._slots = {}


def _state_of(st, name, keep):
    codes = _view(st[name + "_codes"])
    scales = _view(st[name + "_scales"]) if name + "_scales" in st else None
    keep += [codes, scales]
    return _abi.State(codes.ptr, scales.ptr if scales else None)

"""CPU offload: any lbopt.torch optimizer with its states (and, optionally, an fp32 master copy of 16-bit params)
in host memory, while params and grads stay on their device.

    from lbopt.offload import CPUOffload
    from lbopt.torch import AdamW4bit
    opt = CPUOffload(model.parameters(), AdamW4bit, lr=1e-3)     # any other argument goes to AdamW4bit

Each param has a host copy (pinned where the param is on a GPU) that the wrapped optimizer steps with lbopt's CPU
kernels. As backward produces each grad (a post-accumulate-grad hook), the grad is copied to a host buffer on a
side stream, overlapped with the rest of backward. step() waits for those copies, copies again any grad changed
since (gradient clipping, GradScaler.unscale_, another backward of an accumulation), steps every host param, and
copies the params back on a side stream that the caller's stream then waits for, so the next forward reads them
updated. See docs/offload.md.

The param groups are the device params', as any torch.optim optimizer's: lr schedulers, GradScaler (which passes
grad_scale and found_inf on to the host step), zero_grad and clip_grad_norm_ act on them as usual. state_dict()
and load_state_dict() are the wrapped optimizer's: a checkpoint moves between an offloaded optimizer and the same
optimizer on the device, either way.
"""
import collections.abc
import concurrent.futures
import weakref

import torch

from ._checkpoint import is_dtensor
from .torch import _run_closure

__all__ = ["CPUOffload"]

_HYPER_SKIP = ("params",)  # group entries that are not hyper-parameters


class _HostCopies:
    """Transfers for params already on the CPU: plain copies, finished when they return (the stand-in that lets the
    offload path run, and be tested, without a GPU)."""

    pin = False

    def to_host(self, src, dst, reuse=None):
        dst.copy_(src)

    def wait_to_host(self, handle):
        pass

    def begin_to_device(self):
        pass

    def to_device(self, src, dst):
        dst.copy_(src)

    def end_to_device(self):
        pass


class _CudaCopies:
    """Transfers between one GPU and pinned host memory on two side streams: grads go out as backward makes them,
    params come back after the host step, and the caller's stream waits for them before its next kernel."""

    pin = True

    def __init__(self, device):
        self.device = device
        self.out = torch.cuda.Stream(device)
        self.back = torch.cuda.Stream(device)

    def to_host(self, src, dst, reuse=None):
        """Start the copy; its handle, an event (reuse: the param's event of an earlier copy, recorded again)."""
        self.out.wait_stream(torch.cuda.current_stream(self.device))  # src is made on the caller's stream
        with torch.cuda.stream(self.out):
            dst.copy_(src, non_blocking=True)
            src.record_stream(self.out)
            done = reuse or torch.cuda.Event()
            done.record(self.out)
        return done

    def wait_to_host(self, handle):
        handle.synchronize()

    def begin_to_device(self):
        self.back.wait_stream(torch.cuda.current_stream(self.device))  # kernels still reading the params

    def to_device(self, src, dst):
        with torch.cuda.stream(self.back):
            dst.copy_(src, non_blocking=True)

    def end_to_device(self):
        torch.cuda.current_stream(self.device).wait_stream(self.back)


def _shard(t):
    """The tensor this process holds of t: a DTensor's local shard (FSDP2, tensor parallel), or t itself."""
    return t._local_tensor if is_dtensor(t) else t


class _Offloaded:
    """One device param's host side: the copy the host step updates (of the local shard, for a DTensor param,
    whose host copy is then a DTensor of the same mesh and placements), its grad buffer, and which grad (object
    and version) the buffer holds."""

    def __init__(self, param, fp32_master, pin):
        self.param, self.pin = param, pin
        shard = _shard(param)
        dtype = torch.float32 if fp32_master and param.dtype in (torch.bfloat16, torch.float16) else param.dtype
        self.local = torch.empty(shard.shape, dtype=dtype, pin_memory=pin)
        self.local.copy_(shard.detach())
        self.host = self.local if shard is param else self.like_param(self.local)  # what the host optimizer steps
        # a 16-bit param with an fp32 master goes back through a host buffer of its own dtype (rounded on the host)
        self.staging = torch.empty(shard.shape, dtype=param.dtype, pin_memory=pin) if dtype != param.dtype else None
        self.wire = None  # the grad's host copy, in the grad's dtype
        self.grad = None  # what the host step reads: the wire, or its float32 copy for an fp32 master
        self.copied = None  # (grad tensor, its shard's _version) when the wire was filled
        self.pending = None  # the transfer's handle
        self.mark()

    def like_param(self, local):
        """local as a DTensor laid out as the param."""
        p = self.param
        return type(p).from_local(local, device_mesh=p.device_mesh, placements=p.placements, shape=p.shape,
                                  stride=p.stride(), run_check=False)

    def grad_shard(self, g):
        """The part of the param's grad this process steps (FSDP2 pads the grad of an uneven shard)."""
        local = _shard(g)
        if local.shape != self.local.shape:
            local = local[tuple(slice(0, n) for n in self.local.shape)]
        return local

    def mark(self):
        """The device param now holds what the host copy holds."""
        shard = _shard(self.param)
        self.synced = (shard.data_ptr(), shard._version)

    def current(self):
        """Whether nobody wrote the device param since mark (a model checkpoint loaded, weights set by hand)."""
        shard = _shard(self.param)
        return self.synced == (shard.data_ptr(), shard._version)

    def wire_for(self, g):
        if self.wire is None or self.wire.shape != g.shape or self.wire.dtype != g.dtype:
            self.wire = torch.empty(g.shape, dtype=g.dtype, pin_memory=self.pin)
        return self.wire

    def host_grad(self):
        """The grad as the host copy takes it: in its dtype (torch gives a tensor only a grad of its own dtype),
        a DTensor for a DTensor."""
        grad = self.wire
        if self.wire.dtype != self.local.dtype:
            if self.grad is None or self.grad.shape != self.wire.shape:
                self.grad = torch.empty(self.wire.shape, dtype=self.local.dtype)
            grad = self.grad.copy_(self.wire)
        return grad if self.host is self.local else self.like_param(grad)

    def record(self, g, handle):
        self.copied, self.pending = (g, _shard(g)._version), handle

    def holds(self, g):
        return self.copied is not None and self.copied[0] is g and self.copied[1] == _shard(g)._version


class _DeviceKeyedState(collections.abc.MutableMapping):
    """The host optimizer's state keyed by the device params, as torch.optim's is by its params (what
    torch.distributed.checkpoint's state-dict helpers read); a param without state reads as {} (a defaultdict's).
    It reads the host optimizer's state afresh each time: loading a state dict replaces that dict."""

    def __init__(self, offloaded, host_optimizer):
        self._offloaded, self._host = offloaded, host_optimizer

    def __getitem__(self, p):
        return self._host.state[self._offloaded[p].host]

    def __setitem__(self, p, value):
        self._host.state[self._offloaded[p].host] = value

    def __delitem__(self, p):
        del self._host.state[self._offloaded[p].host]

    def __iter__(self):
        return (p for p, off in self._offloaded.items() if off.host in self._host.state)

    def __len__(self):
        return len(self._host.state)


def _hook_of(optimizer_ref):
    """A param's hook that reaches its optimizer through a weak reference: a param does not keep an optimizer
    alive, and the hooks of one that is gone are removed with it."""
    def hook(p):
        optimizer = optimizer_ref()
        if optimizer is not None:
            optimizer._grad_ready(p)
    return hook


class CPUOffload(torch.optim.Optimizer):
    """An lbopt.torch optimizer class stepping host copies of the params with states in host memory.

    optimizer_class: any lbopt.torch optimizer (AdamW4bit, LowBitAdamW, SGD8bit, ...); every keyword argument
    other than fp32_master and step_in_backward goes to it. fp32_master: keep an fp32 host copy of each bf16 or fp16 param (4 bytes of
    host memory per param) and step it, the device param receiving its rounded value; without it a 16-bit param
    is stepped in its own dtype (pass bf16_stochastic_round=True for bf16). step_in_backward: step each param on
    the host as soon as its grad is out, on a worker thread, while backward goes on; for training that neither
    clips nor scales (GradScaler) nor accumulates grads, which must not change after backward (step() raises if
    one did)."""

    def __init__(self, params, optimizer_class, *, fp32_master=False, step_in_backward=False, **kwargs):
        self._fp32_master = fp32_master
        self._copies = {}  # device -> _HostCopies or _CudaCopies
        self._offloaded = {}  # device param -> _Offloaded
        self._hooks = []
        # step_in_backward: one worker, so that the host steps of a backward never run two at a time
        self._worker = concurrent.futures.ThreadPoolExecutor(1) if step_in_backward else None
        self._early = {}  # device param -> the future of its host step, begun during this backward
        super().__init__(params, {})
        host_groups = [{**self._hyper(g), "params": [self._offload(p).host for p in g["params"]]}
                       for g in self.param_groups]
        self.optimizer = optimizer_class(host_groups, **kwargs)
        self.defaults = self.optimizer.defaults
        self._sync_from_host()
        self.state = _DeviceKeyedState(self._offloaded, self.optimizer)

    # ---- groups and params ---------------------------------------------------------------------------------

    @staticmethod
    def _hyper(group):
        return {k: v for k, v in group.items() if k not in _HYPER_SKIP}

    def _offload(self, p):
        off = self._offloaded.get(p)
        if off is None:
            copies = self._copies_for(p.device)
            off = self._offloaded[p] = _Offloaded(p, self._fp32_master, copies.pin)
            if p.requires_grad:
                self._hooks.append(p.register_post_accumulate_grad_hook(_hook_of(weakref.ref(self))))
        return off

    def _copies_for(self, device):
        copies = self._copies.get(device)
        if copies is None:
            if device.type == "cpu":
                copies = _HostCopies()
            elif device.type == "cuda":
                copies = _CudaCopies(device)
            else:
                raise ValueError(f"lbopt: CPUOffload serves params on the CPU or a CUDA device, not {device}")
            self._copies[device] = copies
        return copies

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        if hasattr(self, "optimizer"):  # groups given to __init__ reach the host optimizer there
            group = self.param_groups[-1]
            self.optimizer.add_param_group({**self._hyper(group),
                                            "params": [self._offload(p).host for p in group["params"]]})
            self._sync_from_host()

    def _sync_to_host(self):
        """Hyper-parameters set on this optimizer's groups (an lr scheduler's lr) reach the host optimizer's."""
        for group, host in zip(self.param_groups, self.optimizer.param_groups):
            host.update(self._hyper(group))

    def _sync_from_host(self):
        for group, host in zip(self.param_groups, self.optimizer.param_groups):
            group.update(self._hyper(host))

    # ---- grads out, the host step, params back -----------------------------------------------------------------

    def _grad_ready(self, p):
        """Backward has finished p's grad (for this backward): copy it out now, overlapped with the rest, and with
        step_in_backward step it on the host as soon as it is out."""
        off = self._offloaded[p]
        self._grad_out(p, off)
        if self._worker is not None and p not in self._early:
            self._early[p] = self._worker.submit(self._host_step, [p])

    def _grad_out(self, p, off):
        """Start copying p's grad to its host buffer."""
        g = p.grad
        local = off.grad_shard(g)
        off.record(g, self._copies[p.device].to_host(local, off.wire_for(local), off.pending))

    def _refresh(self, p):
        """A device param written since it last came back gets its host copy from it again before its step."""
        off = self._offloaded[p]
        if not off.current():
            copies = self._copies[p.device]
            copies.wait_to_host(copies.to_host(_shard(p).detach(), off.local))
            off.mark()

    def _host_step(self, params, grad_scale=None, found_inf=None):
        """The wrapped optimizer's step of these device params' host copies, every other host copy without a grad:
        each param's host copy taken again if the device param was written since, its grad copied again if it
        changed since its copy, then waited for. grad_scale, found_inf: GradScaler's, for the host step."""
        for p in params:
            off = self._offloaded[p]
            self._refresh(p)
            if not off.holds(p.grad):
                self._grad_out(p, off)
            self._copies[p.device].wait_to_host(off.pending)
            off.host.grad = off.host_grad()
        self.optimizer.grad_scale, self.optimizer.found_inf = grad_scale, found_inf
        try:
            self.optimizer.step()
        finally:
            self.optimizer.grad_scale = self.optimizer.found_inf = None
            for p in params:
                self._offloaded[p].host.grad = None

    def _with_grads(self):
        return [p for group in self.param_groups for p in group["params"] if p.grad is not None]

    def _params_back(self, stepped):
        for copies in self._copies.values():
            copies.begin_to_device()
        for p in stepped:
            off = self._offloaded[p]
            src = off.local
            if off.staging is not None:
                off.staging.copy_(off.local)  # rounded to nearest on the host
                src = off.staging
            self._copies[p.device].to_device(src, _shard(p).detach())
            off.mark()
        for copies in self._copies.values():
            copies.end_to_device()

    @torch.no_grad()
    def step(self, closure=None):
        loss = _run_closure(closure)
        self._sync_to_host()
        if self._worker is not None:
            self._finish_early()
            return loss
        stepped = self._with_grads()
        # GradScaler sets these for an optimizer with _step_supports_amp_scaling (device scalars: the host step
        # reads them once, a synchronization that step() makes anyway when it waits for the grads)
        self._host_step(stepped, getattr(self, "grad_scale", None), getattr(self, "found_inf", None))
        self._params_back(stepped)
        return loss

    def _finish_early(self):
        """step() with step_in_backward: wait for the host steps begun during backward, step the params whose grads
        came without a backward (set by hand), and send every stepped param back. A grad changed since its host
        step began (clipped, unscaled, accumulated) raises, after the params went back as the host stepped them."""
        if getattr(self, "grad_scale", None) is not None or getattr(self, "found_inf", None) is not None:
            raise RuntimeError("lbopt: CPUOffload(step_in_backward=True) steps during backward, before GradScaler "
                               "has checked the grads; use step_in_backward=False with a GradScaler")
        early, self._early = self._early, {}
        for future in early.values():
            future.result()
        stepped = self._with_grads()
        late = [p for p in stepped if p not in early]  # grads set without a backward
        changed = [p for p in early if p.grad is not None and not self._offloaded[p].holds(p.grad)]
        if late:
            self._host_step(late)
        self._params_back(stepped)
        if changed:
            raise RuntimeError(f"lbopt: {len(changed)} grads changed after their host step began during backward "
                               "(clipping, GradScaler.unscale_ or gradient accumulation); with "
                               "step_in_backward=True grads must stay as backward left them")

    _step_supports_amp_scaling = True

    def __del__(self):
        for handle in getattr(self, "_hooks", ()):
            handle.remove()

    # ---- checkpoints -----------------------------------------------------------------------------------------

    def state_dict(self):
        self._sync_to_host()
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict):
        self.optimizer.load_state_dict(state_dict)
        self._sync_from_host()

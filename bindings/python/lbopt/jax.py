"""lbopt in JAX: every registry operator through one XLA FFI custom call, and optax transformations.

    import optax, lbopt.jax
    tx = optax.chain(optax.clip_by_global_norm(1.0),
                     lbopt.jax.adamw(optax.cosine_decay_schedule(1e-3, 1000), state_kind="4bit"))
    state = tx.init(params)
    updates, state = tx.update(grads, state, params)      # inside jax.jit: the lr is a device scalar
    params = optax.apply_updates(params, updates)

adamw, adam, sgd, lion, ademamix and muon take optax's arguments with optax's defaults (optax.contrib's for
ademamix and muon), then lbopt's own keyword-only ones (state_kind, min_quant_size). Their state is an
OptimizerState of plain arrays shaped like the params (muon's: optax's partition of two), so flax.nnx.Optimizer and
flax's TrainState hold it as they hold optax's.
A hyper-parameter given as a Python number is an attribute of the custom call (an exact double); one given as a
jax array, a tracer (optax.inject_hyperparams) or a schedule is a scalar argument of the call, so changing it
never recompiles. lbopt.jax.adamw_apply(...) returns the fused form, new params themselves (bit-identical to
lbopt.functional), instead of optax's updates (new minus old params, rounded in the params' dtype).

The custom call target "lbopt_invoke" is the generic handler of bindings/jax/lbopt_jax_ffi.cc, built where jax
is importable (Meson option -Djax); it is found at $LBOPT_JAX_FFI, next to the package, or next to the C library.
States are uint8 codes and float32 scales (fp32 states for leaves under min_quant_size), passed to the call as
arguments aliased to its results, so XLA writes them in place; donate the state to the jitted step
(jax.jit(step, donate_argnums=...)) and no state is copied from step to step.
"""
import ctypes
import inspect
import math
import os
import pathlib
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from . import _abi
from .functional import KINDS, config, state_layout

__all__ = ["invoke", "adamw", "adam", "adamw_apply", "sgd", "lion", "ademamix", "muon", "scale_by_muon",
           "OptimizerState"]

TARGET = "lbopt_invoke"
_FLOAT_DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)
_SCALAR_DTYPES = _FLOAT_DTYPES + (jnp.float64,)  # what the handler reads a scalar argument from


def _handler_path():
    env = os.environ.get("LBOPT_JAX_FFI")
    if env:
        return env
    here = pathlib.Path(__file__).resolve().parent
    lib_dir = pathlib.Path(getattr(_abi.lib, "_name", "")).resolve().parent
    for d in (here, lib_dir):
        if (d / "liblbopt_jax.so").exists():
            return str(d / "liblbopt_jax.so")
    raise ImportError("lbopt.jax: the XLA FFI handler liblbopt_jax.so was not found (build lbopt with jax "
                      "importable, or set LBOPT_JAX_FFI)")


_HANDLER = ctypes.CDLL(_handler_path())
jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(_HANDLER.LbOptInvoke), platform="cpu")


class _Op:
    """A registry operator's tensor names and roles and attribute types."""

    def __init__(self, name):
        ops = (_abi.lib.lbopt_op_schema(i).contents for i in range(_abi.lib.lbopt_op_count()))
        op = next((o for o in ops if o.name.decode() == name), None)
        if op is None:
            raise ValueError(f"lbopt.jax: no lbopt operator is named {name!r}")
        self.name = name
        self.tensors = [op.tensors[k].name.decode() for k in range(op.n_tensors)]
        self.roles = [op.tensors[k].role for k in range(op.n_tensors)]
        self.attr_types = {op.attrs[k].name.decode(): op.attrs[k].type for k in range(op.n_attrs)}


_OPS = {}
_CASTS = {_abi.ATTR_DOUBLE: np.float64, _abi.ATTR_INT64: np.int64, _abi.ATTR_BOOL: bool, _abi.ATTR_STRING: str}


def _op(name):
    return _OPS.get(name) or _OPS.setdefault(name, _Op(name))


def _scalar_argument(op, key, value):
    """A hyper-parameter given as a jax array or tracer: a one-element float argument of the call."""
    if op.attr_types[key] == _abi.ATTR_STRING:
        raise ValueError(f"lbopt.jax: {op.name} attribute {key!r} is a string, not an array")
    if value.size != 1:
        raise ValueError(f"lbopt.jax: {op.name} attribute {key!r} must be one number, not an array of shape "
                         f"{value.shape}")
    if not any(value.dtype == d for d in _SCALAR_DTYPES):
        value = value.astype(jnp.float32)
    return value.reshape(())


def invoke(name, tensors, **attrs):
    """Run registry operator `name` on JAX arrays: tensors in the registry's order (None where absent; for a
    tensor the operator only writes, an array of its shape and dtype). Attributes are Python values, or jax arrays
    (tracers included) of one element, which become arguments of the call: a jitted function recompiles for none
    of their values. Returns the new values of the tensors it writes (inout, then out, in registry order). Works
    under jax.jit."""
    op = _op(name)
    if len(tensors) != len(op.roles):
        raise ValueError(f"lbopt.jax: {name} takes {len(op.roles)} tensors, not {len(tensors)}")
    args, results, aliases, present = [], [], {}, 0
    for k, (t, role) in enumerate(zip(tensors, op.roles)):
        if t is None:
            continue
        present |= 1 << k
        if role != _abi.ROLE_OUT:
            args.append(t)
        if role != _abi.ROLE_IN:
            if role == _abi.ROLE_INOUT:
                aliases[len(args) - 1] = len(results)
            results.append(jax.ShapeDtypeStruct(t.shape, t.dtype))
    for key in attrs:
        if key not in op.attr_types:
            raise ValueError(f"lbopt.jax: {name} has no attribute {key!r}")
    arrays = {k: v for k, v in attrs.items() if isinstance(v, jax.Array)}
    typed = {k: _CASTS[op.attr_types[k]](v) for k, v in attrs.items() if k not in arrays}
    if arrays:
        typed["lbopt_scalars"] = ",".join(arrays)
        args += [_scalar_argument(op, k, v) for k, v in arrays.items()]
    call = jax.ffi.ffi_call(TARGET, results, input_output_aliases=aliases)
    return call(*args, lbopt_op=name, lbopt_present=np.int64(present), **typed)


def _invoke_named(name, named, attrs):
    """invoke with the tensors by their registry names (absent ones left out); the written ones by name."""
    op = _op(name)
    outs = invoke(name, [named.get(t) for t in op.tensors], **attrs)
    written = [t for t, role in zip(op.tensors, op.roles) if role != _abi.ROLE_IN and named.get(t) is not None]
    return dict(zip(written, outs))


# ---- optax transformations: one generic class, one state form ------------------------------------------------


class OptimizerState(NamedTuple):
    """The state of every lbopt.jax transformation. codes and scales map each state name of the library's
    operator (adamw: 'm', 'v'; sgd: 'momentum_buffer'; lion: 'exp_avg'; ademamix: 'm1', 'm2', 'nu') to a tree of
    the params' own structure, of plain arrays: uint8 codes and float32 scales, or for an fp32 state its float32
    values and a zero-size float32 array (so flax.nnx and checkpointers see arrays only, no None)."""
    count: Any   # float32 scalar: steps made (the step a call makes is count + 1)
    codes: Any
    scales: Any


def _traced(x):
    return isinstance(x, jax.core.Tracer)


def _at(value, count):
    """A hyper-parameter's value at this step: a schedule's (a float32 array), else the value itself."""
    return jnp.asarray(value(count), jnp.float32) if callable(value) else value


def _keystr(path):
    return jax.tree_util.keystr(path)


def _check_param(path, leaf):
    if not any(leaf.dtype == d for d in _FLOAT_DTYPES):
        raise TypeError(f"lbopt.jax: param {_keystr(path)} has dtype {leaf.dtype}; lbopt steps float32, bfloat16 "
                        f"or float16 params")


class _Transformation:
    """One lbopt optimizer family as optax transformations: `hyper` maps the operator's attribute names to Python
    numbers or bools (attributes of the call, exact doubles), jax arrays or tracers (scalar arguments of the call,
    so a changed value never recompiles) or schedules (evaluated at the state's count); `states` names the state
    tensors the operator steps. nesterov: AdamW's Nesterov momentum, composed here (the kernels have none).
    idle_states: the step leaves the states as they are and passes none (SGD with a momentum of 0, whose step the
    library refuses states)."""

    def __init__(self, who, family, learning_rate, hyper, states, *, state_kind, min_quant_size, mask=None,
                 nesterov=False, idle_states=False):
        if state_kind not in KINDS:
            raise ValueError(f"{who}: unknown state_kind {state_kind!r} (one of {', '.join(KINDS)})")
        self.who, self.family, self.states = who, family, states
        self.learning_rate, self.hyper, self.mask, self.nesterov = learning_rate, hyper, mask, nesterov
        self.state_kind, self.min_quant_size, self.idle_states = state_kind, min_quant_size, idle_states
        names = _op(self._op_name(state_kind)).tensors
        for s in states:
            if f"{s}_codes" not in names or f"{s}_scales" not in names:
                raise ValueError(f"{who}: the library's {family} operators have no state {s!r}")
        self._check_concrete()

    def _check_concrete(self):
        """The checks the library makes of a step's hyper-parameters and lr (lbopt_optimizer_config_validate), made
        here on the concrete ones, so that a value it refuses raises ValueError when the transformation is made,
        not an XLA runtime error at the first step; a schedule or traced value is checked by the step."""
        def concrete(v):
            return not callable(v) and not _traced(v)

        options = {k: v for k, v in self.hyper.items() if concrete(v) and k not in _ROUNDING_ATTRS}
        rounding = [v for k, v in _ROUNDING_ATTRS.items() if self.hyper.get(k)]
        try:
            config(self.family, self.state_kind, **options, state_stochastic_round=rounding[0] if rounding else None)
        except (ValueError, TypeError) as e:
            raise ValueError(f"{self.who}: {e}") from None
        lr = self.learning_rate
        _refuse_unless(self.who, "learning_rate", lr if concrete(lr) else None,
                       lambda x: math.isfinite(np.float32(x)) and float(x) >= 0,
                       "an lr is finite (as a float32: the step takes it so) and >= 0")

    def _op_name(self, kind):
        return f"lbopt.{self.family}_step_capturable.{kind}"

    def optax(self):
        import optax

        return optax.GradientTransformationExtraArgs(self.init, self.update)

    # -- init --------------------------------------------------------------------------------------------------

    def _quant_threshold(self):
        """min_quant_size as an int: read at init only, where it must be concrete."""
        m = self.min_quant_size
        if _traced(m):
            raise ValueError(f"{self.who}: min_quant_size is traced where the state is made; it decides the state's "
                             f"shapes, so pass a Python int (under optax.inject_hyperparams, name it in "
                             f"static_args)")
        try:
            return int(m)
        except (TypeError, ValueError):
            raise ValueError(f"{self.who}: min_quant_size must be an int, not {m!r}") from None

    def init(self, params):
        threshold = self._quant_threshold()

        def zeros(path, p, what):
            _check_param(path, p)
            kind = "fp32" if p.size < threshold else self.state_kind
            lay = state_layout(kind, p.size)
            if what == "codes":
                return jnp.zeros(lay["codes_numel"], jnp.float32 if kind == "fp32" else jnp.uint8)
            return jnp.zeros(0 if kind == "fp32" else lay["scales_numel"], jnp.float32)

        # buffers of their own, one per leaf and state: a jitted step may donate them
        tree = {what: {s: jax.tree_util.tree_map_with_path(lambda path, p: zeros(path, p, what), params)
                       for s in self.states} for what in ("codes", "scales")}
        return OptimizerState(jnp.zeros((), jnp.float32), tree["codes"], tree["scales"])

    # -- checks of a state against the params ------------------------------------------------------------------

    def _leaves(self, params, grads, state):
        """The flat state per state name, each (codes, scales) leaves checked against the params' leaf count."""
        n = len(jax.tree_util.tree_leaves(params))
        checks = [("grads", grads)]
        for what in ("codes", "scales"):
            trees = getattr(state, what, None)
            for s in self.states:
                try:
                    checks.append((f"state.{what}[{s!r}]", trees[s]))
                except (KeyError, TypeError):
                    raise ValueError(f"{self.who}: the state has no {what} of {s!r} (a state of another "
                                     f"optimizer?)") from None
        flat = {}
        for what, tree in checks:
            flat[what] = jax.tree_util.tree_leaves(tree)
            if len(flat[what]) != n:
                raise ValueError(f"{self.who}: {what} does not match the params' tree ({len(flat[what])} leaves, the "
                                 f"params {n})")
        return [{s: (flat[f"state.codes[{s!r}]"][i], flat[f"state.scales[{s!r}]"][i]) for s in self.states}
                for i in range(n)], flat["grads"]

    def _kind(self, path, p, leaf):
        """A leaf's state kind, from its state: float32 codes are an fp32 state, uint8 codes of state_kind."""
        dtypes = {c.dtype for c, _ in leaf.values()}
        if not dtypes:
            return "fp32"  # a stateless step: any operator of the family makes it
        if dtypes not in ({jnp.dtype(jnp.float32)}, {jnp.dtype(jnp.uint8)}):
            raise ValueError(f"{self.who}: the state of param {_keystr(path)} has codes of dtypes "
                             f"{sorted(map(str, dtypes))}; codes are uint8, or float32 for an fp32 state")
        kind = "fp32" if dtypes == {jnp.dtype(jnp.float32)} else self.state_kind
        lay = state_layout(kind, p.size)
        for s, (codes, scales) in leaf.items():
            for what, arr, want in (("codes", codes, lay["codes_numel"]),
                                    ("scales", scales, 0 if kind == "fp32" else lay["scales_numel"])):
                if arr.size != want:
                    raise ValueError(f"{self.who}: {what} of state.{what}[{s!r}] for param {_keystr(path)} have "
                                     f"{arr.size} elements, a {kind} state of {p.size} elements needs {want}")
        return kind

    def _decays(self, params, n):
        """Per leaf, whether weight decay applies: the mask (a tree of bools, or a prefix of the params' tree, or
        a function of the params that gives one), as optax's add_decayed_weights reads it."""
        if self.mask is None or "weight_decay" not in self.hyper:
            return [True] * n
        tree = self.mask(params) if callable(self.mask) else self.mask
        try:
            spread = jax.tree_util.tree_map(lambda m, sub: [m] * len(jax.tree_util.tree_leaves(sub)), tree, params)
        except (ValueError, TypeError) as e:
            raise ValueError(f"{self.who}: mask does not match the params' tree: {e}") from None
        flags = jax.tree_util.tree_leaves(spread)
        if any(_traced(m) for m in flags):
            raise ValueError(f"{self.who}: mask must hold Python bools, not traced values: it decides which "
                             f"leaves decay when the step is traced")
        return [bool(m) for m in flags]

    # -- the step ----------------------------------------------------------------------------------------------

    def _call(self, kind, p, g, leaf, lr, step, attrs):
        """One fused step of one leaf: (new param, new {state: (codes, scales)})."""
        named = {"param": p, "grad": g, "lr": lr, "step": step}
        for s, (codes, scales) in () if self.idle_states else leaf.items():
            named[f"{s}_codes"], named[f"{s}_scales"] = codes, None if kind == "fp32" else scales
        out = _invoke_named(self._op_name(kind), named, attrs)
        return out["param"], {s: (out.get(f"{s}_codes", c), out.get(f"{s}_scales", sc)) for s, (c, sc) in leaf.items()}

    def _nesterov_call(self, kind, p, g, leaf, lr, step, attrs):
        """AdamW with Nesterov momentum, as optax's: the update's m-part b1 m_t / (1 - b1^(t+1)) is the fused
        step's with its lr scaled to lr_m, the decoupled decay's factor kept at lr * weight_decay (by a weight
        decay scaled by lr / lr_m, or here where lr_m is 0); the g-part (1 - b1) g / (1 - b1^t) is added here,
        over v_t as the step stored it (one decode of v more)."""
        b1, b2, eps, wd = (jnp.asarray(attrs[k], jnp.float32) for k in ("beta1", "beta2", "eps", "weight_decay"))
        bc_t = 1 - b1 ** step
        lr_m = lr * b1 * bc_t / (1 - b1 ** (step + 1))
        coupled = attrs["adam"]
        carried = lr_m != 0
        rest = 0.0 if coupled else jnp.where(carried, 0.0, lr * wd)  # decay the m-part's step cannot carry
        wd_m = jnp.where(carried, lr * wd / jnp.where(carried, lr_m, 1), 0.0)
        scaled = attrs if coupled else {**attrs, "weight_decay": wd_m}
        p2, new = self._call(kind, p, g, leaf, lr_m, step, scaled)
        v = _decode(kind, *new["v"], p.size, "v").reshape(p.shape)
        p32 = p.astype(jnp.float32)
        g32 = g.astype(jnp.float32) + (wd * p32 if coupled else 0.0)
        denom = jnp.sqrt(v) / jnp.sqrt(1 - b2 ** step) + eps
        return (p2.astype(jnp.float32) - lr * (1 - b1) / bc_t * g32 / denom - rest * p32).astype(p.dtype), new

    def apply(self, params, grads, state):
        """(new params, new state): one fused step per leaf."""
        leaves, flat_g = self._leaves(params, grads, state)
        with_paths, treedef = jax.tree_util.tree_flatten_with_path(params)
        count = state.count
        lr = jnp.asarray(_at(self.learning_rate, count), jnp.float32)
        hyper = {k: _at(v, count) for k, v in self.hyper.items()}
        step = count + 1
        call = self._nesterov_call if self.nesterov else self._call
        new_p, new_states = [], []
        for (path, p), g, leaf, decays in zip(with_paths, flat_g, leaves, self._decays(params, len(leaves))):
            _check_param(path, p)
            attrs = hyper if decays else {**hyper, "weight_decay": 0.0}
            p2, leaf2 = call(self._kind(path, p, leaf), p, g, leaf, lr, step, attrs)
            new_p.append(p2)
            new_states.append(leaf2)
        trees = [{s: treedef.unflatten([st[s][j] for st in new_states]) for s in self.states} for j in (0, 1)]
        return treedef.unflatten(new_p), OptimizerState(step, *trees)

    def update(self, updates, state, params=None, **extra_args):
        del extra_args  # optax's extra arguments (a loss value, ...): no lbopt step reads them
        if params is None:
            raise ValueError(f"{self.who}: update needs the params (optax passes them as the third argument)")
        new_params, state = self.apply(params, updates, state)
        return jax.tree_util.tree_map(lambda a, b: (a - b).astype(b.dtype), new_params, params), state


def _decode(kind, codes, scales, n, moment):
    if kind == "fp32":
        return codes
    return _invoke_named("lbopt.dequantize", {"codes": codes, "scales": scales,
                                              "dst": jax.ShapeDtypeStruct((n,), jnp.float32)},
                         {"kind": kind, "moment": moment})["dst"]


def _refuse_unless(who, name, value, ok, why):
    """A ValueError naming the argument when a concrete value lbopt cannot honour is given (a traced one, under
    optax.inject_hyperparams, was checked when its concrete value made the state)."""
    if value is None or _traced(value):
        return
    try:
        honoured = ok(value)
    except (TypeError, ValueError):
        honoured = False
    if not honoured:
        raise ValueError(f"{who}: {name}={value!r} is not supported: {why}")


def _float32_only(who, name, dtype):
    _refuse_unless(who, name, dtype, lambda d: jnp.dtype(d) == jnp.float32,
                   "lbopt keeps its states in state_kind ('fp32' for float32); leave it None")


def _no_eps_root(who, eps_root):
    _refuse_unless(who, "eps_root", eps_root, lambda e: float(e) == 0.0, "lbopt's kernels add eps outside the root")


# the operators' attributes of state_stochastic_round, and the value each stands for
_ROUNDING_ATTRS = {"state_stochastic_round": True, "state_nearest_round": False}


def _rounding(who, state_stochastic_round):
    """The attributes of state_stochastic_round: True, False, or None for the library's default (stochastic
    first-moment codes for SGD, Lion and AdEMAMix on 4-bit and FP8 states)."""
    if _traced(state_stochastic_round):
        raise ValueError(f"{who}: state_stochastic_round must be None, True or False, not a traced value (under "
                         "optax.inject_hyperparams, name it in static_args)")
    _abi.state_rounding_flags(state_stochastic_round)  # refuses anything but None, True and False
    return {name: True for name, value in _ROUNDING_ATTRS.items() if state_stochastic_round is value}


def _bind(f, args, kwargs):
    bound = inspect.signature(f).bind(*args, **kwargs)
    bound.apply_defaults()
    return bound.arguments


def _adamw(who, learning_rate, b1, b2, eps, eps_root, mu_dtype, weight_decay, mask, nesterov, state_kind,
           min_quant_size, adam, state_stochastic_round):
    _no_eps_root(who, eps_root)
    _float32_only(who, "mu_dtype", mu_dtype)
    hyper = dict(beta1=b1, beta2=b2, eps=eps, weight_decay=weight_decay, adam=adam,
                 **_rounding(who, state_stochastic_round))
    return _Transformation(who, "adamw", learning_rate, hyper, ("m", "v"), state_kind=state_kind,
                           min_quant_size=min_quant_size, mask=mask, nesterov=nesterov)


def adamw(learning_rate, b1=0.9, b2=0.999, eps=1e-8, eps_root=0.0, mu_dtype=None, weight_decay=1e-4, mask=None, *,
          nesterov=False, state_kind="4bit", min_quant_size=4096, adam=False, state_stochastic_round=None):
    """optax.adamw with lbopt states: optax's arguments and defaults (eps_root must be 0, mu_dtype None or
    float32), then lbopt's own: state_kind ('4bit', '8bit', 'fp8', 'fp32'), min_quant_size (smaller leaves keep
    fp32 states), adam (True: Adam, the decay coupled into the gradient), state_stochastic_round (the rounding of
    the first-moment codes: True stochastic, False nearest, None the library's default, stochastic for SGD, Lion
    and AdEMAMix on 4-bit and FP8 states). nesterov costs one decode of v per leaf and step."""
    return _adamw("lbopt.jax.adamw", **locals()).optax()


def adam(learning_rate, b1=0.9, b2=0.999, eps=1e-8, eps_root=0.0, mu_dtype=None, *, nesterov=False,
         state_kind="4bit", min_quant_size=4096, state_stochastic_round=None):
    """optax.adam with lbopt states: optax's arguments and defaults, then state_kind, min_quant_size and
    state_stochastic_round as adamw's."""
    return _adamw("lbopt.jax.adam", **locals(), weight_decay=0.0, mask=None, adam=True).optax()


def adamw_apply(*args, **kwargs):
    """The fused form of adamw (the same arguments): (init, apply) with apply(params, grads, state) -> (new
    params, new state), the params as the library computes them (bit-identical to lbopt.functional for the same
    lr as float32), instead of optax's updates (new minus old params, rounded in the params' dtype)."""
    t = _adamw("lbopt.jax.adamw_apply", **_bind(adamw, args, kwargs))
    return t.init, t.apply


adamw_apply.__signature__ = inspect.signature(adamw)


def sgd(learning_rate, momentum=None, nesterov=False, accumulator_dtype=None, *, state_kind="4bit",
        min_quant_size=4096, state_stochastic_round=None):
    """optax.sgd with lbopt states: optax's arguments and defaults (momentum a trace, as torch's SGD without
    dampening; None keeps no state; accumulator_dtype None or float32), then state_kind, min_quant_size and
    state_stochastic_round as adamw's."""
    who = "lbopt.jax.sgd"
    _float32_only(who, "accumulator_dtype", accumulator_dtype)
    # a momentum of 0 keeps its trace in the state, as optax's, but the step is plain SGD (Nesterov's included);
    # one known only when the step runs (traced) must then be non-zero
    _refuse_unless(who, "momentum", momentum, lambda m: float(m) >= 0.0, "it must be a number >= 0 or None")
    zero = momentum is None or (not _traced(momentum) and float(momentum) == 0.0)
    hyper = dict(momentum=0.0 if zero else momentum, dampening=0.0, weight_decay=0.0,
                 nesterov=bool(nesterov) and not zero, **_rounding(who, state_stochastic_round))
    return _Transformation(who, "sgd", learning_rate, hyper, () if momentum is None else ("momentum_buffer",),
                           state_kind=state_kind, min_quant_size=min_quant_size, idle_states=zero).optax()


def lion(learning_rate, b1=0.9, b2=0.99, mu_dtype=None, weight_decay=1e-3, mask=None, *, state_kind="4bit",
         min_quant_size=4096, state_stochastic_round=None):
    """optax.lion with lbopt states: optax's arguments and defaults (mu_dtype None or float32), then state_kind,
    min_quant_size and state_stochastic_round as adamw's."""
    who = "lbopt.jax.lion"
    _float32_only(who, "mu_dtype", mu_dtype)
    hyper = dict(beta1=b1, beta2=b2, weight_decay=weight_decay, **_rounding(who, state_stochastic_round))
    return _Transformation(who, "lion", learning_rate, hyper, ("exp_avg",), state_kind=state_kind,
                           min_quant_size=min_quant_size, mask=mask).optax()


def ademamix(learning_rate, b1=0.9, b2=0.999, b3=0.9999, alpha=5.0, eps=1e-8, eps_root=0.0, mu_dtype=None,
             weight_decay=0.0, mask=None, *, state_kind="4bit", min_quant_size=4096, state_stochastic_round=None):
    """optax.contrib.ademamix with lbopt states: optax's arguments and defaults (b3 and alpha may be schedules
    of the step count, as there; eps_root must be 0, mu_dtype None or float32), then state_kind, min_quant_size
    and state_stochastic_round as adamw's."""
    who = "lbopt.jax.ademamix"
    _no_eps_root(who, eps_root)
    _float32_only(who, "mu_dtype", mu_dtype)
    hyper = dict(beta1=b1, beta2=b2, beta3=b3, alpha=alpha, eps=eps, weight_decay=weight_decay, t_alpha=0.0,
                 t_beta3=0.0,  # optax's schedules take the place of the library's own warm-ups
                 **_rounding(who, state_stochastic_round))
    return _Transformation(who, "ademamix", learning_rate, hyper, ("m1", "m2", "nu"), state_kind=state_kind,
                           min_quant_size=min_quant_size, mask=mask).optax()


# ---- Muon: the library steps the momentum, optax's own code orthogonalizes ---------------------------------------


def _optax_muon():
    """optax.contrib's Muon module: its Newton-Schulz iteration, shape scaling and presets are used as they are, so
    that lbopt.jax.muon differs from optax.contrib.muon in where the momentum lives and in nothing else."""
    try:
        from optax.contrib import _muon
        _muon.orthogonalize_via_newton_schulz, _muon.scale_by_shape, _muon._NS_COEFFS_PRESET_DICT  # noqa: B018
    except (ImportError, AttributeError) as e:
        raise ImportError(f"lbopt.jax.muon needs optax.contrib's Muon module (optax.contrib._muon): {e}") from None
    return _muon


class _MuonMomentum(_Transformation):
    """optax.contrib.scale_by_muon with the momentum in lbopt states: the library moves the momentum and returns
    it (its Nesterov form is optax's, with bias corrections, so it is composed here from the returned momentum and
    the gradient), then optax's Newton-Schulz iteration orthogonalizes it."""

    def __init__(self, who, beta, rounding, ns, *, state_kind, min_quant_size):
        # the library checks an lr it does not read: any valid one
        super().__init__(who, "muon", 1.0, dict(momentum=beta, nesterov=False, **rounding), ("momentum_buffer",),
                         state_kind=state_kind, min_quant_size=min_quant_size)
        self.beta, self.ns = beta, ns

    def update(self, updates, state, params=None, **extra_args):
        del params, extra_args  # the direction is the gradients' alone
        ns = self.ns
        zeros = jax.tree_util.tree_map(lambda g: jnp.zeros(g.shape, jnp.float32), updates)
        mu, state = self.apply(zeros, updates, state)  # the momentum, before it was quantized
        beta = jnp.asarray(_at(self.beta, state.count - 1), jnp.float32)
        count = state.count.astype(jnp.int32)  # optax.contrib.scale_by_muon's bias corrections, in its order

        def corrected(x, n):
            return x / (1 - beta ** n).astype(x.dtype)

        if ns["nesterov"]:
            mu_hat = jax.tree_util.tree_map(
                lambda m, g: beta * corrected(m, count + 1) + (1 - beta) * corrected(g, count), mu, updates)
        else:
            mu_hat = jax.tree_util.tree_map(lambda m: corrected(m, count), mu)
        dims = ns["dims"](updates) if callable(ns["dims"]) else ns["dims"]
        if dims is None:  # every param a matrix
            dims = jax.tree_util.tree_map(lambda _: ns["module"].MuonDimensionNumbers(), mu_hat)

        def orthogonalize(x, d):
            return ns["module"].orthogonalize_via_newton_schulz(x, ns["coeffs"], ns["steps"], ns["preconditioning"],
                                                                ns["eps"], d)

        orth = jax.tree_util.tree_map(orthogonalize, mu_hat, dims)
        if ns["adaptive"]:
            orth = jax.tree_util.tree_map(lambda x, y: jnp.sum(x.conj() * y) * y, mu_hat, orth)
        return orth, state


def _ns_coefficients(module, ns_coeffs, ns_steps):
    """optax's checks and selection of the Newton-Schulz coefficients (a preset name, one triple or one per step)."""
    if isinstance(ns_coeffs, str):
        if ns_coeffs not in module._NS_COEFFS_PRESET_DICT:
            raise ValueError(f"Unknown ns_coeff preset string: {ns_coeffs}")
        ns_coeffs = module._NS_COEFFS_PRESET_DICT[ns_coeffs]
    coeffs = jnp.asarray(ns_coeffs)
    if coeffs.ndim > 2 or coeffs.shape[-1] != 3:
        raise ValueError(f"ns_coeffs must have shape (3,) or (n, 3), got {coeffs.shape}")
    if coeffs.ndim == 2:
        if not coeffs.shape[0] <= ns_steps:
            raise ValueError(f"Not enough coeffs to perform {ns_steps} steps")
        coeffs = coeffs[-ns_steps:]
    return coeffs


def scale_by_muon(ns_coeffs=(3.4445, -4.775, 2.0315), ns_steps=5, beta=0.95, eps=1e-8, mu_dtype=None, *,
                  nesterov=True, adaptive=False, preconditioning="frobenius", weight_dimension_numbers=None,
                  state_kind="4bit", min_quant_size=4096, state_stochastic_round=None):
    """optax.contrib.scale_by_muon with the momentum in lbopt states: optax's arguments and defaults (mu_dtype None
    or float32), then state_kind, min_quant_size and state_stochastic_round as adamw's. Its state is an
    OptimizerState (codes and scales of 'momentum_buffer')."""
    who = "lbopt.jax.scale_by_muon"
    _float32_only(who, "mu_dtype", mu_dtype)
    module = _optax_muon()
    if preconditioning not in module._PRECONDITIONINGS:
        raise ValueError(f"Unknown preconditioning {preconditioning}")
    ns = dict(module=module, coeffs=_ns_coefficients(module, ns_coeffs, ns_steps), steps=ns_steps, eps=eps,
              preconditioning=preconditioning, nesterov=nesterov, adaptive=adaptive, dims=weight_dimension_numbers)
    return _MuonMomentum(who, beta, _rounding(who, state_stochastic_round), ns, state_kind=state_kind,
                         min_quant_size=min_quant_size).optax()


def muon(learning_rate, ns_coeffs=(3.4445, -4.775, 2.0315), ns_steps=5, beta=0.95, eps=1e-8, weight_decay=0.0,
         weight_decay_mask=None, mu_dtype=None, *, nesterov=True, adaptive=False, preconditioning="frobenius",
         adam_b1=0.9, adam_b2=0.999, adam_eps_root=0.0, adam_weight_decay=0.0, adam_learning_rate=None,
         muon_weight_dimension_numbers=None, consistent_rms=None, state_kind="4bit", min_quant_size=4096,
         state_stochastic_round=None):
    """optax.contrib.muon with lbopt states: optax's arguments and defaults (mu_dtype None or float32,
    adam_eps_root 0), then state_kind, min_quant_size and state_stochastic_round as adamw's, for both the Muon
    momentum of the matrices and the AdamW states of the other params. As optax's: Muon (scale_by_muon above, then
    optax's shape scaling, decoupled weight decay and lr) for 2-D params, or those muon_weight_dimension_numbers
    names, and AdamW (lbopt.jax.adamw, with Nesterov momentum as optax's) for the rest."""
    import optax

    who = "lbopt.jax.muon"
    _refuse_unless(who, "adam_eps_root", adam_eps_root, lambda e: float(e) == 0.0,
                   "lbopt's kernels add eps outside the root")
    module = _optax_muon()
    dims = muon_weight_dimension_numbers
    labels, dims_of = _muon_labels(module, module.MuonDimensionNumbers() if dims is None else dims, dims is None)
    lbopt_args = dict(state_kind=state_kind, min_quant_size=min_quant_size,
                      state_stochastic_round=state_stochastic_round)
    matrices = optax.chain(
        scale_by_muon(ns_coeffs, ns_steps, beta, eps, mu_dtype, nesterov=nesterov, adaptive=adaptive,
                      preconditioning=preconditioning, weight_dimension_numbers=dims_of, **lbopt_args),
        module.scale_by_shape(weight_dimension_numbers=dims_of, consistent_rms=consistent_rms),
        optax.add_decayed_weights(weight_decay, weight_decay_mask),
        optax.scale_by_learning_rate(learning_rate))
    rest = adamw(learning_rate if adam_learning_rate is None else adam_learning_rate, adam_b1, adam_b2, eps,
                 mu_dtype=mu_dtype, weight_decay=adam_weight_decay, nesterov=nesterov, **lbopt_args)
    return optax.partition({"muon": matrices, "adam": rest}, labels)


def _muon_labels(module, dims, by_rank):
    """optax.contrib.muon's split: (the labels of a params tree, 'muon' or 'adam'; the dimension numbers of its
    'muon' leaves, masked elsewhere). by_rank: 2-D params are the matrices; else those with dimension numbers."""
    import optax

    def is_dims(x):
        return x is None or isinstance(x, (module.MuonDimensionNumbers, optax.MaskedNode))

    def resolve(params):
        return dims(params) if callable(dims) else dims

    def labels(params):
        if by_rank:
            return jax.tree_util.tree_map(lambda x: "muon" if x.ndim == 2 else "adam", params)
        return jax.tree_util.tree_map(lambda d, sub: jax.tree_util.tree_map(
            lambda _: "adam" if d is None else "muon", sub), resolve(params), params, is_leaf=is_dims)

    def dims_of(params):
        mask = jax.tree_util.tree_map(lambda label: label == "muon", labels(params))
        return jax.tree_util.tree_map(lambda d, sub: jax.tree_util.tree_map(
            lambda m: d if m else optax.MaskedNode(), sub), resolve(params), mask, is_leaf=is_dims)

    return labels, dims_of

"""lbopt in JAX: every registry operator through one XLA FFI custom call, and optax transformations.

    import optax, lbopt.jax
    tx = optax.chain(optax.clip_by_global_norm(1.0),
                     lbopt.jax.adamw(optax.cosine_decay_schedule(1e-3, 1000), state_kind="4bit"))
    state = tx.init(params)
    updates, state = tx.update(grads, state, params)      # inside jax.jit: the lr is a device scalar
    params = optax.apply_updates(params, updates)

lbopt.jax.adamw_apply(...) returns the fused form, new params themselves (bit-identical to lbopt.functional),
instead of optax's updates (new minus old params, rounded in the params' dtype).

The custom call target "lbopt_invoke" is the generic handler of bindings/jax/lbopt_jax_ffi.cc, built where jax
is importable (Meson option -Djax); it is found at $LBOPT_JAX_FFI, next to the package, or next to the C library.
States are uint8 codes and float32 scales (fp32 states for leaves under min_quant_size), passed to the call as
arguments aliased to its results, so XLA writes them in place; donate the state to the jitted step
(jax.jit(step, donate_argnums=...)) and no state is copied from step to step.
"""
import ctypes
import os
import pathlib
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from . import _abi
from .functional import KINDS, state_layout

__all__ = ["invoke", "adamw", "adamw_apply", "AdamWState", "Moment"]

TARGET = "lbopt_invoke"
_FLOAT_DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)


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
    """A registry operator's tensor roles and attribute types."""

    def __init__(self, name):
        ops = (_abi.lib.lbopt_op_schema(i).contents for i in range(_abi.lib.lbopt_op_count()))
        op = next((o for o in ops if o.name.decode() == name), None)
        if op is None:
            raise ValueError(f"lbopt.jax: no lbopt operator is named {name!r}")
        self.name = name
        self.roles = [op.tensors[k].role for k in range(op.n_tensors)]
        self.attr_types = {op.attrs[k].name.decode(): op.attrs[k].type for k in range(op.n_attrs)}


_OPS = {}
_CASTS = {_abi.ATTR_DOUBLE: np.float64, _abi.ATTR_INT64: np.int64, _abi.ATTR_BOOL: bool, _abi.ATTR_STRING: str}


def invoke(name, tensors, **attrs):
    """Run registry operator `name` on JAX arrays: tensors in the registry's order (None where absent; for a
    tensor the operator only writes, an array of its shape and dtype). Returns the new values of the tensors it
    writes (inout, then out, in registry order). Works under jax.jit."""
    op = _OPS.get(name) or _OPS.setdefault(name, _Op(name))
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
    typed = {k: _CASTS[op.attr_types[k]](v) for k, v in attrs.items()}
    call = jax.ffi.ffi_call(TARGET, results, input_output_aliases=aliases)
    return call(*args, lbopt_op=name, lbopt_present=np.int64(present), **typed)


# ---- AdamW / Adam as optax transformations -------------------------------------------------------------------


class Moment(NamedTuple):
    """One moment of one leaf's state: uint8 codes and float32 scales, or float32 values and None (fp32)."""
    codes: Any
    scales: Any


class AdamWState(NamedTuple):
    count: Any   # float32 scalar: steps made (the step a call makes is count + 1)
    m: Any       # a Moment per param leaf
    v: Any


def _is_moment(x):
    return isinstance(x, Moment)


def _leaf_kind(leaf, path, state_kind, min_quant_size):
    if not any(leaf.dtype == d for d in _FLOAT_DTYPES):
        raise TypeError(f"lbopt.jax: param {jax.tree_util.keystr(path)} has dtype {leaf.dtype}; lbopt steps "
                        f"float32, bfloat16 or float16 params")
    return "fp32" if leaf.size < min_quant_size else state_kind


def _zeros(kind, n):
    """A fresh moment of one leaf."""
    lay = state_layout(kind, n)
    if kind == "fp32":
        return Moment(jnp.zeros(lay["codes_numel"], jnp.float32), None)
    return Moment(jnp.zeros(lay["codes_numel"], jnp.uint8), jnp.zeros(lay["scales_numel"], jnp.float32))


class _AdamW:
    def __init__(self, learning_rate, b1, b2, eps, weight_decay, state_kind, adam, min_quant_size):
        if state_kind not in KINDS:
            raise ValueError(f"lbopt.jax: unknown state kind {state_kind!r} (one of {', '.join(KINDS)})")
        self.learning_rate = learning_rate
        self.attrs = dict(beta1=b1, beta2=b2, eps=eps, weight_decay=weight_decay, adam=adam)
        self.state_kind, self.min_quant_size = state_kind, min_quant_size

    def kinds(self, params):
        return jax.tree_util.tree_map_with_path(
            lambda path, leaf: _leaf_kind(leaf, path, self.state_kind, self.min_quant_size), params)

    def init(self, params):
        kinds = self.kinds(params)
        m, v = (jax.tree_util.tree_map(lambda k, p: _zeros(k, p.size), kinds, params) for _ in range(2))
        return AdamWState(jnp.zeros((), jnp.float32), m, v)  # buffers of their own: a jitted step may donate them

    def _check_tree(self, params, grads, state):
        ptree = jax.tree_util.tree_structure(params)
        for what, tree, is_leaf in (("grads", grads, None), ("state.m", state.m, _is_moment),
                                    ("state.v", state.v, _is_moment)):
            n = jax.tree_util.tree_structure(tree, is_leaf=is_leaf).num_leaves
            if n != ptree.num_leaves:
                raise ValueError(f"lbopt.jax: {what} does not match the params' tree ({n} leaves, the params "
                                 f"{ptree.num_leaves})")

    def apply(self, params, grads, state):
        """(new params, new state): one fused step per leaf."""
        self._check_tree(params, grads, state)
        lr = self.learning_rate(state.count) if callable(self.learning_rate) else self.learning_rate
        lr = jnp.asarray(lr, jnp.float32)
        step = state.count + 1
        with_paths, tree = jax.tree_util.tree_flatten_with_path(params)
        flat_g, kinds = jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(self.kinds(params))
        ms = jax.tree_util.tree_leaves(state.m, is_leaf=_is_moment)
        vs = jax.tree_util.tree_leaves(state.v, is_leaf=_is_moment)
        new_p, new_m, new_v = [], [], []
        for (path, p), g, kind, (mc, msc), (vc, vsc) in zip(with_paths, flat_g, kinds, ms, vs):
            n = state_layout(kind, p.size)["codes_numel"]
            for what, codes in (("state.m", mc), ("state.v", vc)):
                if codes.size != n:
                    raise ValueError(f"lbopt.jax: codes of {what} for param {jax.tree_util.keystr(path)} have "
                                     f"{codes.size} elements, a {kind} state of {p.size} elements needs {n}")
            out = invoke(f"lbopt.adamw_step_capturable.{kind}", [p, g, mc, msc, vc, vsc, None, None, lr, step, None],
                         **self.attrs)
            p2, mc2, *rest = out
            msc2, vc2, vsc2 = (None, rest[0], None) if kind == "fp32" else rest
            new_p.append(p2)
            new_m.append(Moment(mc2, msc2))
            new_v.append(Moment(vc2, vsc2))
        unflat = tree.unflatten
        return unflat(new_p), AdamWState(step, unflat(new_m), unflat(new_v))

    def update(self, updates, state, params=None):
        if params is None:
            raise ValueError("lbopt.jax.adamw: update needs the params (optax passes them as the third argument)")
        new_params, state = self.apply(params, updates, state)
        return jax.tree_util.tree_map(lambda a, b: (a - b).astype(b.dtype), new_params, params), state


def adamw(learning_rate, b1=0.9, b2=0.999, eps=1e-8, weight_decay=1e-2, *, state_kind="4bit", adam=False,
          min_quant_size=4096):
    """AdamW (or Adam with adam=True) with lbopt states as an optax GradientTransformation. learning_rate: a
    float or an optax schedule (evaluated inside the jitted step: a device scalar, so a schedule never
    recompiles). Leaves under min_quant_size keep fp32 states."""
    import optax

    t = _AdamW(learning_rate, b1, b2, eps, weight_decay, state_kind, adam, min_quant_size)
    return optax.GradientTransformation(t.init, t.update)


def adamw_apply(learning_rate, b1=0.9, b2=0.999, eps=1e-8, weight_decay=1e-2, *, state_kind="4bit", adam=False,
                min_quant_size=4096):
    """The fused form: (init, apply) with apply(params, grads, state) -> (new params, new state), the params as
    the library computes them (bit-identical to lbopt.functional for the same lr as float32)."""
    t = _AdamW(learning_rate, b1, b2, eps, weight_decay, state_kind, adam, min_quant_size)
    return t.init, t.apply

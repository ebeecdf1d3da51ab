"""lbopt in JAX (lbopt.jax): the XLA FFI custom call under jax.jit, optax transformations with a schedule that
never recompiles, the fused apply bit-identical to lbopt.functional, and errors at trace time naming the leaf."""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
optax = pytest.importorskip("optax")
import jax.numpy as jnp  # noqa: E402

import lbopt.functional as F  # noqa: E402

LJ = pytest.importorskip("lbopt.jax", reason="lbopt was built without the JAX FFI handler")

KINDS = ["4bit", "8bit", "fp8", "fp32"]


def mlp_params(seed=0):
    rng = np.random.default_rng(seed)
    return {"layer1": {"w": jnp.asarray(rng.standard_normal((32, 160)) * 0.1, jnp.float32),
                       "b": jnp.zeros(160, jnp.float32)},
            "layer2": [jnp.asarray(rng.standard_normal((160, 40)) * 0.1, jnp.float32), jnp.zeros(40, jnp.float32)]}


def mlp_loss(params, x, y):
    h = jnp.tanh(x @ params["layer1"]["w"] + params["layer1"]["b"])
    return jnp.mean((h @ params["layer2"][0] + params["layer2"][1] - y) ** 2)


def batch(i):
    rng = np.random.default_rng(100 + i)
    x = jnp.asarray(rng.standard_normal((16, 32)), jnp.float32)
    return x, jnp.sin(jnp.tile(x, (1, 2))[:, :40] * 3)


def test_jitted_training_with_a_cosine_schedule_compiles_once():
    schedule = optax.cosine_decay_schedule(3e-3, 100)
    tx = optax.chain(optax.clip_by_global_norm(1.0), LJ.adamw(schedule, state_kind="4bit", min_quant_size=1024))
    params = mlp_params()
    state = tx.init(params)
    traces = []

    @jax.jit
    def step(params, state, x, y):
        traces.append(1)  # runs only while tracing
        loss, grads = jax.value_and_grad(mlp_loss)(params, x, y)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss

    losses = []
    for i in range(100):
        params, state, loss = step(params, state, *batch(i))
        losses.append(float(loss))
    assert len(traces) == 1 and step._cache_size() == 1
    assert losses[-1] < 0.8 * losses[0]


@pytest.mark.parametrize("kind", KINDS)
def test_fused_apply_is_bit_identical_to_functional(kind):
    # a schedule without transcendental functions: XLA may fuse a cosine's approximation differently inside the
    # step than anywhere the test could evaluate it, and the lr must be the same float32 on both sides
    schedule = optax.piecewise_constant_schedule(1e-2, {1: 0.5, 3: 0.25})
    init, apply = LJ.adamw_apply(schedule, weight_decay=0.1, state_kind=kind, min_quant_size=0)
    params = mlp_params(1)
    state = init(params)
    apply = jax.jit(apply)
    ref = [np.array(leaf) for leaf in jax.tree_util.tree_leaves(params)]
    ref_states = [{"m": F.zeros_state(kind, p.size), "v": F.zeros_state(kind, p.size)} for p in ref]
    for i in range(5):
        grads = jax.grad(mlp_loss)(params, *batch(i))
        lr = float(jax.jit(schedule)(jnp.float32(i)))  # the float32 lr the jitted step computes from its count
        F.adamw_step(ref, [np.asarray(g) for g in jax.tree_util.tree_leaves(grads)], ref_states, lr, [i + 1] * 4,
                     kind=kind, weight_decay=0.1)
        params, state = apply(params, grads, state)
    for leaf, want in zip(jax.tree_util.tree_leaves(params), ref):
        assert np.array_equal(np.asarray(leaf), want)
    for (codes, scales), st in zip(jax.tree_util.tree_leaves(state.m, is_leaf=lambda x: isinstance(x, LJ.Moment)),
                                   ref_states):
        assert np.array_equal(np.asarray(codes), st["m"]["codes"])
        assert codes.dtype == (jnp.float32 if kind == "fp32" else jnp.uint8)
        assert scales is None if kind == "fp32" else scales.dtype == jnp.float32


def test_optax_path_stays_within_a_few_ulps_of_the_fused_apply():
    init, apply = LJ.adamw_apply(1e-2, state_kind="8bit", min_quant_size=0)
    tx = LJ.adamw(1e-2, state_kind="8bit", min_quant_size=0)
    fused = optaxed = mlp_params(2)
    fs, os_ = init(fused), tx.init(optaxed)
    for i in range(5):
        g = jax.grad(mlp_loss)(fused, *batch(i))
        fused, fs = apply(fused, g, fs)
        u, os_ = tx.update(g, os_, optaxed)
        optaxed = optax.apply_updates(optaxed, u)
    for a, b in zip(jax.tree_util.tree_leaves(fused), jax.tree_util.tree_leaves(optaxed)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=4e-7, atol=1e-7)


def test_integer_params_are_refused_at_trace_time_naming_the_leaf():
    tx = LJ.adamw(1e-3)
    with pytest.raises(TypeError, match=r"param \['layer2'\]\[1\] has dtype int32"):
        tx.init({"layer1": jnp.zeros(10), "layer2": [jnp.zeros(3), jnp.zeros(3, jnp.int32)]})


def test_a_state_that_does_not_match_the_params_is_refused_at_trace_time():
    tx = LJ.adamw(1e-3, min_quant_size=0)
    params = mlp_params()
    state = tx.init(params)
    grads = jax.tree_util.tree_map(jnp.ones_like, params)
    other = tx.init({"w": jnp.zeros((64, 80))})
    with pytest.raises(ValueError, match=r"state.m does not match the params' tree \(1 leaves, the params 4\)"):
        jax.jit(tx.update)(grads, other, params)
    w_state = state.m["layer1"]["w"]._replace(codes=jnp.zeros(7, jnp.uint8))
    wrong = state._replace(m={**state.m, "layer1": {"w": w_state, "b": state.m["layer1"]["b"]}})
    with pytest.raises(ValueError, match=r"codes of state.m for param \['layer1'\]\['w'\] have 7 elements"):
        jax.jit(tx.update)(grads, wrong, params)


def test_library_refusals_surface_with_the_library_message():
    """A grad of another shape passes JAX's checks but not the library's, which names the argument."""
    p = jnp.zeros(5000)
    lay = F.state_layout("4bit", 5000)
    codes, scales = jnp.zeros(lay["codes_numel"], jnp.uint8), jnp.zeros(lay["scales_numel"], jnp.float32)
    args = [p, jnp.zeros(4999), codes, scales, codes, scales, None, None, jnp.float32(1e-3), jnp.float32(1), None]
    with pytest.raises(Exception, match=r"lbopt.adamw_step_capturable.4bit: slots\[0\]\.grad: shape differs"):
        jax.block_until_ready(LJ.invoke("lbopt.adamw_step_capturable.4bit", args))
    with pytest.raises(ValueError, match="has no attribute 'lr'"):
        LJ.invoke("lbopt.adamw_step_capturable.4bit", args, lr=1e-3)

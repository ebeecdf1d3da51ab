"""lbopt in JAX (lbopt.jax): the XLA FFI custom call under jax.jit, optax transformations with optax's arguments
and, with fp32 states, optax's results, hyper-parameters (schedules, optax.inject_hyperparams) that change without
recompiling, the fused apply bit-identical to lbopt.functional, and errors at trace time naming the leaf or the
argument."""
import inspect

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
    leaves = zip(jax.tree_util.tree_leaves(state.codes["m"]), jax.tree_util.tree_leaves(state.scales["m"]))
    for (codes, scales), st in zip(leaves, ref_states):
        assert np.array_equal(np.asarray(codes), st["m"]["codes"])
        assert codes.dtype == (jnp.float32 if kind == "fp32" else jnp.uint8)
        assert scales.dtype == jnp.float32
        assert scales.size == 0 if kind == "fp32" else np.array_equal(np.asarray(scales), st["m"]["scales"])


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
    with pytest.raises(ValueError, match=r"state.codes\['m'\] does not match the params' tree \(1 leaves, the "
                                         r"params 4\)"):
        jax.jit(tx.update)(grads, other, params)
    m = state.codes["m"]
    wrong = state._replace(codes={**state.codes, "m": {**m, "layer1": {**m["layer1"], "w": jnp.zeros(7, jnp.uint8)}}})
    with pytest.raises(ValueError, match=r"codes of state.codes\['m'\] for param \['layer1'\]\['w'\] have 7 "
                                         r"elements"):
        jax.jit(tx.update)(grads, wrong, params)
    with pytest.raises(ValueError, match=r"lbopt.jax.lion: the state has no codes of 'exp_avg'"):
        jax.jit(LJ.lion(1e-3).update)(grads, state, params)


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


# ---- optax's arguments and results ---------------------------------------------------------------------------

OPTAX_TWINS = {"adamw": lambda: optax.adamw, "adam": lambda: optax.adam, "sgd": lambda: optax.sgd,
               "lion": lambda: optax.lion, "ademamix": lambda: pytest.importorskip("optax.contrib").ademamix}


@pytest.mark.parametrize("name", OPTAX_TWINS)
def test_signatures_and_defaults_are_optax_s_then_lbopt_s_keyword_only(name):
    theirs = list(inspect.signature(OPTAX_TWINS[name]()).parameters.values())
    ours = list(inspect.signature(getattr(LJ, name)).parameters.values())
    assert [(p.name, p.kind, p.default) for p in ours[:len(theirs)]] == \
        [(p.name, p.kind, p.default) for p in theirs]
    extras = ours[len(theirs):]
    assert {p.name for p in extras} >= {"state_kind", "min_quant_size"}
    assert all(p.kind == p.KEYWORD_ONLY for p in extras)


def small_params(dtype=jnp.float32):
    rng = np.random.default_rng(3)
    return {"dense": {"w": jnp.asarray(rng.standard_normal((8, 12)) * 0.3, dtype),
                      "b": jnp.asarray(rng.standard_normal(12) * 0.5, dtype)},
            "out": {"w": jnp.asarray(rng.standard_normal((12, 3)) * 0.3, dtype),
                    "b": jnp.asarray(rng.standard_normal(3) * 0.5, dtype)}}


def small_loss(params, x, y):
    h = jnp.tanh(x @ params["dense"]["w"] + params["dense"]["b"])
    return jnp.mean((h @ params["out"]["w"] + params["out"]["b"] - y) ** 2)


def small_batch(i):
    rng = np.random.default_rng(50 + i)
    x = jnp.asarray(rng.standard_normal((16, 8)), jnp.float32)
    return x, jnp.sin(x[:, :3] * 2)


def train(tx, params, steps, loss_fn=small_loss, batch_fn=small_batch):
    """params after `steps` jitted optax steps of tx on loss_fn(params, *batch_fn(i)), and the losses seen."""
    @jax.jit
    def step(params, state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss

    state, losses = tx.init(params), []
    for i in range(steps):
        params, state, loss = step(params, state, *batch_fn(i))
        losses.append(float(loss))
    return params, state, losses


def no_bias(params):
    return jax.tree_util.tree_map_with_path(lambda path, _: path[-1].key != "b", params)


def warmup(count):
    return 5e-3 * jnp.minimum(count, 2)  # a first step with lr 0


def decay_ramp(count):
    return 0.05 * jnp.minimum(count, 4)


def linear_b3(count):
    return 0.9 + 0.0225 * jnp.minimum(count, 4)


def linear_alpha(count):
    return 1.25 * jnp.minimum(count, 4)


OPTAX_CASES = [
    ("adamw", dict(learning_rate=1e-2, weight_decay=0.1, mask=no_bias)),
    ("adamw", dict(learning_rate=1e-2, weight_decay=0.1, mask={"dense": False, "out": {"w": True, "b": False}},
                   nesterov=True)),
    ("adamw", dict(learning_rate=warmup, b1=0.0, weight_decay=0.1, nesterov=True)),
    ("adam", dict(learning_rate=1e-2)),
    ("adam", dict(learning_rate=1e-2, nesterov=True)),
    ("sgd", dict(learning_rate=5e-2)),
    ("sgd", dict(learning_rate=5e-2, momentum=0.9)),
    ("sgd", dict(learning_rate=5e-2, momentum=0.9, nesterov=True)),
    ("lion", dict(learning_rate=1e-3, weight_decay=0.1, mask=no_bias)),
    ("lion", dict(learning_rate=1e-3, weight_decay=decay_ramp, mask=no_bias)),
    ("ademamix", dict(learning_rate=1e-2, b3=0.99, weight_decay=0.1, mask=no_bias)),
    ("ademamix", dict(learning_rate=1e-2, b3=linear_b3, alpha=linear_alpha)),
]


@pytest.mark.parametrize("name,kwargs", OPTAX_CASES, ids=[f"{n}-{'-'.join(k)}" for n, k in OPTAX_CASES])
def test_fp32_states_follow_optax(name, kwargs):
    """Six steps with fp32 states against optax's own: the same arithmetic up to float32 rounding (the kernels
    multiply by reciprocals and fuse where optax divides), far below what a step moves the params."""
    params = small_params()
    want, _, _ = train(OPTAX_TWINS[name]()(**kwargs), params, 6)
    got, state, _ = train(getattr(LJ, name)(**kwargs, state_kind="fp32"), params, 6)
    for g, w, p in zip(*(jax.tree_util.tree_leaves(t) for t in (got, want, params))):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-6, atol=2e-6)
        assert float(jnp.max(jnp.abs(w - p))) > 1e-3  # every leaf moved
    assert all(c.dtype == jnp.float32 for c in jax.tree_util.tree_leaves(state.codes))


LOW_BIT = [("adamw", dict(learning_rate=1e-2)), ("adam", dict(learning_rate=1e-2)),
           ("sgd", dict(learning_rate=0.1, momentum=0.9)), ("lion", dict(learning_rate=1e-2)),
           ("ademamix", dict(learning_rate=1e-2, b3=0.99))]


@pytest.mark.parametrize("name,kwargs", LOW_BIT, ids=[n for n, _ in LOW_BIT])
def test_4bit_states_train(name, kwargs):
    _, state, losses = train(getattr(LJ, name)(**kwargs, state_kind="4bit", min_quant_size=0), small_params(), 30)
    assert losses[-1] < 0.5 * losses[0]
    assert all(c.dtype == jnp.uint8 for c in jax.tree_util.tree_leaves(state.codes))
    assert all(s.dtype == jnp.float32 and s.size > 0 for s in jax.tree_util.tree_leaves(state.scales))


@pytest.mark.parametrize("name,kwargs", [
    ("adamw", dict(eps_root=1e-8)), ("adamw", dict(mu_dtype=jnp.bfloat16)), ("adam", dict(eps_root=1e-6)),
    ("lion", dict(mu_dtype="bfloat16")), ("ademamix", dict(eps_root=1e-8)),
    ("sgd", dict(accumulator_dtype=jnp.bfloat16)), ("adamw", dict(state_kind="3bit"))])
def test_what_lbopt_cannot_honour_is_refused_naming_the_argument(name, kwargs):
    (arg,) = kwargs
    with pytest.raises(ValueError, match=rf"lbopt.jax.{name}: .*{arg}"):
        getattr(LJ, name)(1e-3, **kwargs)


# ---- traced hyper-parameters ---------------------------------------------------------------------------------


def f32(x):
    return float(np.float32(x))


def test_inject_hyperparams_changes_the_step_as_new_python_values_would_without_recompiling():
    """optax.inject_hyperparams holds the hyper-parameters as float32 arrays in the state: changed between steps,
    each step is bit for bit the step of a new transformation given the same (float32) values as Python numbers,
    and the jitted step is traced once."""
    inject = optax.inject_hyperparams(LJ.adamw)(learning_rate=2 ** -7, state_kind="8bit", min_quant_size=64)
    params = ref_params = mlp_params(4)
    state = inject.init(params)
    ref_state = state.inner_state
    traces = []

    @jax.jit
    def step(params, state, x, y):
        traces.append(1)  # runs only while tracing
        updates, state = inject.update(jax.grad(mlp_loss)(params, x, y), state, params)
        return optax.apply_updates(params, updates), state

    def ref_step(tx, params, state, x, y):
        updates, state = tx.update(jax.grad(mlp_loss)(params, x, y), state, params)
        return optax.apply_updates(params, updates), state

    for i, (lr, b1, wd) in enumerate([(2 ** -7, 0.9, 1e-4), (2 ** -5, 0.5, 0.25), (2 ** -6, 0.8, 0.0)]):
        state.hyperparams.update(learning_rate=jnp.float32(lr), b1=jnp.float32(b1), weight_decay=jnp.float32(wd))
        params, state = step(params, state, *batch(i))
        tx = LJ.adamw(f32(lr), b1=f32(b1), b2=f32(0.999), eps=f32(1e-8), weight_decay=f32(wd), state_kind="8bit",
                      min_quant_size=64)
        ref_params, ref_state = jax.jit(ref_step, static_argnums=0)(tx, ref_params, ref_state, *batch(i))
        for a, b in zip(jax.tree_util.tree_leaves((params, state.inner_state)),
                        jax.tree_util.tree_leaves((ref_params, ref_state))):
            assert np.array_equal(np.asarray(a), np.asarray(b))
    assert len(traces) == 1 and step._cache_size() == 1


@pytest.mark.parametrize("name,kwargs", [("sgd", dict(momentum=0.9)), ("lion", {}), ("ademamix", {})])
def test_inject_hyperparams_traces_every_optimizer(name, kwargs):
    params = small_params()
    _, state, losses = train(optax.inject_hyperparams(getattr(LJ, name))(1e-2, **kwargs), params, 3)
    _, _, want = train(getattr(LJ, name)(1e-2, **kwargs), params, 3)
    assert losses == pytest.approx(want, rel=1e-5)
    assert state.inner_state.count == 3


def test_an_argument_that_decides_the_state_must_not_be_traced():
    init = optax.inject_hyperparams(LJ.adamw)(1e-3).init
    with pytest.raises(ValueError, match=r"min_quant_size is traced .*static_args"):
        jax.jit(init)(mlp_params())
    assert jax.jit(optax.inject_hyperparams(LJ.adamw, static_args="min_quant_size")(1e-3).init)(mlp_params())

    params = mlp_params()

    @jax.jit
    def masked_step(flag):
        tx = LJ.adamw(1e-3, mask={"layer1": flag, "layer2": True})
        return tx.update(params, tx.init(params), params)

    with pytest.raises(ValueError, match=r"lbopt.jax.adamw: mask must hold Python bools"):
        masked_step(jnp.bool_(True))


# ---- the handler's scalar arguments ---------------------------------------------------------------------------


def capturable_args(n=64):
    p = np.linspace(-1, 1, n, dtype=np.float32)
    zeros = jnp.zeros(n, jnp.float32)
    return [jnp.asarray(p), jnp.asarray(p * 0.5), zeros, None, zeros, None, None, None, jnp.float32(1e-2),
            jnp.float32(1), None]


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
def test_a_hyper_parameter_array_reaches_the_operator_as_its_value(dtype):
    op = "lbopt.adamw_step_capturable.fp32"
    want = LJ.invoke(op, capturable_args(), weight_decay=0.375, beta1=0.75)
    other = LJ.invoke(op, capturable_args(), weight_decay=0.25, beta1=0.75)
    got = jax.jit(lambda wd, b1: LJ.invoke(op, capturable_args(), weight_decay=wd, beta1=b1))(
        jnp.asarray(0.375, dtype), jnp.asarray([0.75], dtype))
    assert not np.array_equal(np.asarray(other[0]), np.asarray(want[0]))
    for a, b in zip(got, want):
        assert np.array_equal(np.asarray(a), np.asarray(b))


def test_bad_scalar_arguments_are_refused():
    op = "lbopt.adamw_step_capturable.fp32"
    with pytest.raises(ValueError, match=r"attribute 'beta1' must be one number"):
        LJ.invoke(op, capturable_args(), beta1=jnp.zeros(2))
    # the handler's own checks, for a caller that builds the call by hand
    p, g, m, _, v, *_ = capturable_args()
    lr, step = jnp.float32(1e-2), jnp.float32(1)
    present = np.int64(0b1100010111)  # param, grad, m_codes, v_codes, lr, step

    def call(*scalars, **attrs):
        out = [jax.ShapeDtypeStruct(t.shape, t.dtype) for t in (p, m, v)]
        res = jax.ffi.ffi_call(LJ.TARGET, out, input_output_aliases={0: 0, 2: 1, 3: 2})(
            p, g, m, v, lr, step, *scalars, lbopt_op=op, lbopt_present=present, **attrs)
        jax.block_until_ready(res)

    for scalars, attrs, message in [
            ((jnp.float32(0.5),), {}, "1 arguments follow the tensors, and no lbopt_scalars names them"),
            ((jnp.float32(0.5),), dict(lbopt_scalars="beta1,eps"), "names 2 attributes, but 1 scalar arguments follow"),
            ((jnp.int32(1),), dict(lbopt_scalars="beta1"), "beta1 is not a float32, float64, bfloat16 or float16"),
            ((jnp.zeros(3),), dict(lbopt_scalars="beta1"), "beta1 has 3 elements, not 1"),
            ((jnp.float32(0.5),), dict(lbopt_scalars="lr"), "'lr' is not an attribute of " + op),
            ((jnp.float32(0.5), jnp.float32(0.5)), dict(lbopt_scalars="eps,eps"), "'eps' is named twice"),
            ((jnp.float32(0.5),), dict(lbopt_scalars="eps", eps=np.float64(0.5)), "eps: given as an attribute and"),
            ((jnp.float32(0.5),), dict(lbopt_scalars="seed"), "seed needs an integral value"),
            ((jnp.float32(2.0),), dict(lbopt_scalars="beta1"), op + r": .*beta1")]:  # the library's own check
        with pytest.raises(Exception, match=message):
            call(*scalars, **attrs)

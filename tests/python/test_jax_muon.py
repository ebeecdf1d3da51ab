"""lbopt.jax.muon against optax.contrib.muon: the same arguments, the same split of the params (Muon for the
matrices, AdamW for the rest), with fp32 states the same params up to float32 rounding; low-bit momentum that
trains; the momentum's state in the library's codes; refusals naming the argument."""
import inspect

import numpy as np
import pytest

jax = pytest.importorskip("jax")
optax = pytest.importorskip("optax")
contrib = pytest.importorskip("optax.contrib")
if not hasattr(contrib, "muon"):
    pytest.skip("this optax has no contrib.muon", allow_module_level=True)
import jax.numpy as jnp  # noqa: E402

LJ = pytest.importorskip("lbopt.jax", reason="lbopt was built without the JAX FFI handler")
from test_jax import train as train_on  # noqa: E402


def params(seed=0, dtype=jnp.float32):
    rng = np.random.default_rng(seed)
    return {"hidden": {"w": jnp.asarray(rng.standard_normal((8, 24)) * 0.3, dtype),
                       "b": jnp.asarray(rng.standard_normal(24) * 0.1, dtype)},
            "out": {"w": jnp.asarray(rng.standard_normal((24, 3)) * 0.3, dtype),
                    "b": jnp.zeros(3, dtype)}}


def loss(p, x, y):
    h = jnp.tanh(x @ p["hidden"]["w"] + p["hidden"]["b"])
    return jnp.mean((h @ p["out"]["w"] + p["out"]["b"] - y) ** 2)


def batch(i):
    rng = np.random.default_rng(70 + i)
    x = jnp.asarray(rng.standard_normal((32, 8)), jnp.float32)
    return x, jnp.sin(x[:, :3] * 2)


def train(tx, p, steps):
    return train_on(tx, p, steps, loss, batch)


def test_signature_and_defaults_are_optax_s_then_lbopt_s_keyword_only():
    for theirs_fn, ours_fn in ((contrib.muon, LJ.muon), (contrib.scale_by_muon, LJ.scale_by_muon)):
        theirs = list(inspect.signature(theirs_fn).parameters.values())
        ours = list(inspect.signature(ours_fn).parameters.values())
        assert [(p.name, p.kind, p.default) for p in ours[:len(theirs)]] == \
            [(p.name, p.kind, p.default) for p in theirs]
        extras = ours[len(theirs):]
        assert [p.name for p in extras] == ["state_kind", "min_quant_size", "state_stochastic_round"]
        assert all(p.kind == p.KEYWORD_ONLY for p in extras)


def no_bias(p):
    return jax.tree_util.tree_map_with_path(lambda path, _: path[-1].key != "b", p)


CASES = [dict(learning_rate=2e-2),
         dict(learning_rate=2e-2, nesterov=False),
         dict(learning_rate=optax.cosine_decay_schedule(3e-2, 8), beta=0.9, weight_decay=0.1,
              weight_decay_mask=no_bias, adam_weight_decay=0.05, adam_learning_rate=1e-2),
         dict(learning_rate=2e-2, consistent_rms=0.2, adaptive=True, ns_coeffs="dion"),
         dict(learning_rate=2e-2, ns_coeffs=((4.0, -4.0, 1.5), (3.4445, -4.775, 2.0315)), ns_steps=3,
              preconditioning="spectral")]


@pytest.mark.parametrize("kwargs", CASES, ids=["default", "plain-momentum", "schedules-decay", "rms-adaptive",
                                               "per-step-coefficients"])
def test_fp32_states_follow_optax(kwargs):
    """Eight steps with fp32 states against optax.contrib.muon: the library's momentum is torch.lerp's rounding of
    optax's beta m + (1 - beta) g, so the params agree to float32 rounding, far below a step's move."""
    p0 = params()
    want, want_state, want_losses = train(contrib.muon(**kwargs), p0, 8)
    got, state, losses = train(LJ.muon(**kwargs, state_kind="fp32"), p0, 8)
    for g, w, p in zip(*(jax.tree_util.tree_leaves(t) for t in (got, want, p0))):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-5, atol=2e-6)
        assert float(jnp.max(jnp.abs(w - p))) > 1e-3  # every leaf moved
    assert losses == pytest.approx(want_losses, rel=1e-5)
    # the same split: the momentum of the two matrices, AdamW's m and v of the two biases
    muon_state = state.inner_states["muon"].inner_state[0]
    assert [c.shape for c in jax.tree_util.tree_leaves(muon_state.codes)] == [(8 * 24,), (24 * 3,)]
    adam_leaves = jax.tree_util.tree_leaves(state.inner_states["adam"].inner_state)
    assert sorted(c.shape for c in adam_leaves if c.ndim and c.size) == [(3,), (3,), (24,), (24,)]
    del want_state


@pytest.mark.parametrize("kind", ["4bit", "8bit", "fp8"])
def test_low_bit_momentum_trains_near_fp32(kind):
    p0 = params(1)
    _, _, want = train(LJ.muon(5e-2, state_kind="fp32"), p0, 40)
    _, state, losses = train(LJ.muon(5e-2, state_kind=kind, min_quant_size=0), p0, 40)
    assert losses[-1] < 0.4 * losses[0]
    assert losses[-1] < 1.1 * want[-1]  # seen: 4-bit +4.5%, 8-bit +1.4%, FP8 +7.0%
    codes = jax.tree_util.tree_leaves(state.inner_states["muon"].inner_state[0].codes)
    assert codes and all(c.dtype == jnp.uint8 for c in codes)


def test_the_momentum_is_the_library_s():
    """The state holds the momentum as lbopt.functional's Muon step leaves it (the same codes and scales)."""
    import lbopt.functional as F

    grads = {name: {"w": layer["w"]} for name, layer in jax.grad(loss)(params(2), *batch(0)).items()}
    tx = LJ.scale_by_muon(state_kind="8bit", min_quant_size=0, state_stochastic_round=False)  # matrices only
    _, state = jax.jit(tx.update)(grads, tx.init(grads))
    w = np.asarray(grads["hidden"]["w"]).ravel()
    st = {"momentum_buffer": F.zeros_state("8bit", w.size)}
    F.step("muon", [np.zeros_like(w)], [w.copy()], [st], 1.0, [1], kind="8bit", momentum=0.95,
           state_stochastic_round=False)
    assert np.array_equal(np.asarray(state.codes["momentum_buffer"]["hidden"]["w"]), st["momentum_buffer"]["codes"])
    assert np.array_equal(np.asarray(state.scales["momentum_buffer"]["hidden"]["w"]),
                          st["momentum_buffer"]["scales"])


@pytest.mark.parametrize("kwargs", [dict(mu_dtype=jnp.bfloat16), dict(adam_eps_root=1e-8),
                                    dict(state_kind="3bit"), dict(state_stochastic_round="yes")])
def test_what_lbopt_cannot_honour_is_refused_naming_the_argument(kwargs):
    (arg,) = kwargs
    with pytest.raises((ValueError, TypeError), match=arg if arg != "state_kind" else "state_kind"):
        LJ.muon(1e-2, **kwargs)


def test_optax_s_own_argument_errors():
    with pytest.raises(ValueError, match="Unknown ns_coeff preset"):
        LJ.muon(1e-2, ns_coeffs="nope")
    with pytest.raises(ValueError, match="Unknown preconditioning"):
        LJ.muon(1e-2, preconditioning="nope")


def test_inject_hyperparams_traces_it():
    p0 = params(3)
    _, _, got = train(optax.inject_hyperparams(LJ.muon)(1e-2, state_kind="8bit", min_quant_size=0), p0, 3)
    _, _, want = train(LJ.muon(1e-2, state_kind="8bit", min_quant_size=0), p0, 3)
    assert got == pytest.approx(want, rel=1e-5)


def test_flax_nnx_optimizer_holds_it():
    nnx = pytest.importorskip("flax.nnx")
    model = nnx.Linear(64, 8, rngs=nnx.Rngs(0))
    opt = nnx.Optimizer(model, LJ.muon(5e-2, state_kind="8bit", min_quant_size=256), wrt=nnx.Param)
    x = jnp.ones((4, 64))

    @nnx.jit
    def step(model, opt):
        value, grads = nnx.value_and_grad(lambda m: jnp.mean(m(x) ** 2))(model)
        opt.update(model, grads)
        return value

    losses = [float(step(model, opt)) for _ in range(4)]
    assert losses[-1] < 0.5 * losses[0]

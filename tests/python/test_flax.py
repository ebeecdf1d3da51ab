"""lbopt.jax under flax: nnx.Optimizer and linen's TrainState hold lbopt states as they hold optax's, step after
step, and the states keep their dtypes (uint8 codes, float32 for leaves under min_quant_size)."""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("optax")
pytest.importorskip("flax")
import jax.numpy as jnp  # noqa: E402
from flax import linen, nnx  # noqa: E402
from flax.training import train_state  # noqa: E402

LJ = pytest.importorskip("lbopt.jax", reason="lbopt was built without the JAX FFI handler")


def data():
    x = jnp.asarray(np.random.default_rng(0).standard_normal((32, 8)), jnp.float32)
    return x, jnp.sin(2 * x[:, :3])


class NnxMLP(nnx.Module):
    def __init__(self, rngs):
        self.hidden = nnx.Linear(8, 64, rngs=rngs)
        self.out = nnx.Linear(64, 3, rngs=rngs)

    def __call__(self, x):
        return self.out(jnp.tanh(self.hidden(x)))


def by_layer(tree):
    """{(layer, 'kernel' or 'bias'): leaf} of a tree shaped like the params."""
    return {tuple(k.key for k in path[-2:]): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def code_dtypes(codes):
    return {k: leaf.dtype for k, leaf in by_layer(codes).items()}


NNX_CASES = [("adamw", dict(learning_rate=1e-2), "4bit"), ("adamw", dict(learning_rate=1e-2), "fp32"),
             ("lion", dict(learning_rate=3e-3), "8bit"), ("sgd", dict(learning_rate=0.1, momentum=0.9), "4bit")]


@pytest.mark.parametrize("name,kwargs,kind", NNX_CASES, ids=[f"{n}-{k}" for n, _, k in NNX_CASES])
def test_nnx_optimizer_steps_and_keeps_its_state(name, kwargs, kind):
    model = NnxMLP(nnx.Rngs(0))
    tx = getattr(LJ, name)(**kwargs, state_kind=kind, min_quant_size=128)
    opt = nnx.Optimizer(model, tx, wrt=nnx.Param)
    x, y = data()

    @nnx.jit
    def step(model, opt):
        loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(x) - y) ** 2))(model)
        opt.update(model, grads)
        return loss

    losses = [float(step(model, opt)) for _ in range(15)]
    assert losses[-1] < 0.5 * losses[0]
    state = nnx.as_pure(opt.opt_state)
    assert int(state.count) == 15
    params = by_layer(nnx.as_pure(nnx.state(model, nnx.Param)))
    want = {k: jnp.float32 if kind == "fp32" or p.size < 128 else jnp.uint8 for k, p in params.items()}
    assert len(state.codes) == (2 if name == "adamw" else 1)
    for name in state.codes:
        assert code_dtypes(state.codes[name]) == want


class LinenMLP(linen.Module):
    @linen.compact
    def __call__(self, x):
        return linen.Dense(3)(jnp.tanh(linen.Dense(64)(x)))


def test_linen_train_state_applies_gradients_under_jit():
    x, y = data()
    model = LinenMLP()
    state = train_state.TrainState.create(apply_fn=model.apply, params=model.init(jax.random.key(0), x),
                                          tx=LJ.adamw(1e-2, state_kind="4bit", min_quant_size=128))

    @jax.jit
    def step(state):
        loss, grads = jax.value_and_grad(lambda p: jnp.mean((state.apply_fn(p, x) - y) ** 2))(state.params)
        return state.apply_gradients(grads=grads), loss

    losses = []
    for _ in range(15):
        state, loss = step(state)
        losses.append(float(loss))
    assert losses[-1] < 0.5 * losses[0] and int(state.step) == 15
    assert code_dtypes(state.opt_state.codes["m"]) == {
        ("Dense_0", "kernel"): jnp.uint8, ("Dense_0", "bias"): jnp.float32,  # 64 elements: under min_quant_size
        ("Dense_1", "kernel"): jnp.uint8, ("Dense_1", "bias"): jnp.float32}

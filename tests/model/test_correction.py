"""The correction layer's soft maximum, checked by hand."""

import jax
import jax.numpy as jnp
import numpy as np

from roofcal.model.correction import smax


def test_soft_max_by_hand():
    assert abs(float(smax(3.0, 4.0, 2.0)) - 5.0) < 1e-5          # (9 + 16)^(1/2)
    assert abs(float(smax(2.0, 2.0, 1.0)) - 4.0) < 1e-5          # q = 1: the sum
    assert abs(float(smax(1.0, 0.0, 3.0)) - 1.0) < 1e-6          # one side idle: the other
    assert abs(float(smax(3.0, 4.0, 60.0)) - 4.0) < 1e-5         # large q: the larger
    assert float(smax(0.0, 0.0, 2.0)) < 1e-29                     # no work: ≈ 0


def test_soft_max_is_the_power_mean_it_stands_for():
    """exp(q·log r) in code, (a^q + b^q)^(1/q) in float64, over times of 10 ns to 100 ms."""
    r = np.random.default_rng(0)
    a, b = 10.0 ** r.uniform(-2, 5, 1000), 10.0 ** r.uniform(-2, 5, 1000)
    q = r.uniform(1.0, 8.0, 1000)
    ref = (a ** q + b ** q) ** (1.0 / q)
    f32 = lambda x: jnp.asarray(x, jnp.float32)
    got = np.asarray(smax(f32(a), f32(b), f32(q)))
    assert np.max(np.abs(got / ref - 1.0)) < 2e-6


def test_soft_max_gradients_by_hand_and_finite_at_zero():
    da, db = jax.grad(smax, argnums=(0, 1))(3.0, 4.0, 2.0)
    assert abs(float(da) - 0.6) < 1e-5 and abs(float(db) - 0.8) < 1e-5   # a / smax, b / smax
    g = jax.grad(smax, argnums=(0, 1, 2))(0.0, 4.0, 3.0)                   # one side idle
    assert all(np.isfinite(float(x)) for x in g)
    assert abs(float(g[1]) - 1.0) < 1e-6 and abs(float(g[2])) < 1e-6


def test_product_value_and_gradient_by_hand():
    """``product(w, x_t, x)`` is w @ x_t; its gradient in w, taken from x (= x_tᵀ, held rows
    first), is the product's own: for L = Σ (w @ x_t) ⊙ c, dL/dw = c @ x_tᵀ. By hand: w = [[1, 2]],
    x_t = [[1, 0, 2], [3, 1, 0]]: w @ x_t = [7, 2, 2]; c = [1, 1, 2]: dL/dw = [1 + 4, 3 + 1] = [5, 4]."""
    from roofcal.model.correction import product
    w = jnp.asarray([[1.0, 2.0]])
    x_t = jnp.asarray([[1.0, 0.0, 2.0], [3.0, 1.0, 0.0]])
    c = jnp.asarray([1.0, 1.0, 2.0])
    assert np.asarray(product(w, x_t, x_t.T)).tolist() == [[7.0, 2.0, 2.0]]
    g = jax.grad(lambda w: jnp.sum(product(w, x_t, x_t.T) * c))(w)
    assert np.asarray(g).tolist() == [[5.0, 4.0]]
    r = np.random.default_rng(1)
    w, x_t, c = (jnp.asarray(r.normal(size=s), jnp.float32) for s in ((2, 35), (35, 500), (2, 500)))
    want = jax.grad(lambda w: jnp.sum(jnp.tanh(w @ x_t) * c))(w)
    got = jax.grad(lambda w: jnp.sum(jnp.tanh(product(w, x_t, jnp.asarray(np.asarray(x_t).T))) * c))(w)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)

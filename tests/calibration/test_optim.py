"""The optimisers' contracts (roofcal.calibration.optim), on problems solved by hand."""

import jax.numpy as jnp
import numpy as np
import pytest

from roofcal.calibration import optim


def _bowl(p, data):
    """(x − 3)² + 10·(y + 2)²: minimum 0 at (3, −2)."""
    x, y = p["x"][0], p["x"][1]
    return (x - 3.0) ** 2 + 10.0 * (y + 2.0) ** 2


@pytest.mark.slow
def test_lbfgs_reaches_the_minimum_and_returns_the_loss_at_its_params():
    p = {"x": jnp.asarray([0.0, 0.0], jnp.float32)}
    q, value = optim.lbfgs(_bowl, p, (), 60, chunks=3)
    np.testing.assert_allclose(np.asarray(q["x"]), [3.0, -2.0], atol=1e-3)
    assert value == float(_bowl(q, ()))
    q, value = optim.lbfgs(_bowl, p, (), 2, chunks=1)      # stopped far from it: still its loss
    assert value > 1e-3
    np.testing.assert_allclose(value, float(_bowl(q, ())), rtol=1e-6)


def test_lbfgs_keeps_its_params_where_no_step_gives_a_finite_loss():
    def cliff(p, data):              # finite only at x ≥ 1 − 1e-7; every step goes below
        x = p["x"]
        return jnp.where(x[0] >= 1.0 - 1e-7, jnp.sum(x ** 2), jnp.nan)
    p = {"x": jnp.asarray([1.0, 0.0], jnp.float32)}
    q, value = optim.lbfgs(cliff, p, (), 20, chunks=2)
    np.testing.assert_array_equal(np.asarray(q["x"]), [1.0, 0.0])
    assert value == 1.0


def test_an_lbfgs_block_holds_the_objective_once():
    """One evaluation (value and gradient) per turn of one loop: the line search's trials and the
    step that ends it share it (optax.lbfgs with its line search held the objective twice, and
    a GEMM's L-BFGS program compiled in 1.6 s of CPU instead of 1.1)."""
    traced = []

    def counted(x, data):
        traced.append(1)
        return _bowl({"x": x}, data)
    optim._lbfgs_block.lower(counted, optim.start(np.zeros(2, np.float32)),
                             jnp.zeros((), jnp.int32), (), 5)
    assert len(traced) == 1


def test_a_search_starts_from_the_last_step_grown_by_half_as_optax_does():
    """From (3, −1.99) the bowl's gradient is (0, 0.2): optax's first direction is its negative
    (unscaled, as its norm is below 1), and 10·(0.01 − 0.2·t)² first falls below 10·0.01² at
    t = 0.8¹¹ ≈ 0.086 (0.8¹⁰ ≈ 0.107 overshoots). That step is taken, and the next search starts
    at 1.5 times it (optax.scale_by_backtracking_linesearch's growth)."""
    vec = optim.OnVector(_bowl, (("x", (2,)),))
    s = optim.start(np.asarray([3.0, -1.99], np.float32))
    s, fails, its = optim._lbfgs_block(vec, s, jnp.zeros((), jnp.int32), (), 1)
    assert int(its) == 1 and int(fails) == 0 and int(s.tries) == 0
    t = 0.8 ** 11
    np.testing.assert_allclose(np.asarray(s.x), [3.0, -1.99 - 0.2 * t], rtol=1e-6)
    np.testing.assert_allclose(float(s.value), 10 * (0.01 - 0.2 * t) ** 2, rtol=1e-3)
    np.testing.assert_allclose(float(s.step), 1.5 * t, rtol=1e-6)
    assert float(s.slope) < 0.0


def _floor(p, data):
    """1 + Σ wᵢ·rᵢ² + 0.1·rᵢ⁴, r = x − (0.3, −0.7, 1.1): float32 cannot tell the loss from 1
    once the sum is below ≈ 6e-8, while the gradient still points somewhere."""
    r = p["x"] - jnp.asarray([0.3, -0.7, 1.1])
    return 1.0 + jnp.sum(jnp.asarray([1.0, 3.0, 0.5]) * r ** 2 + 0.1 * r ** 4)


@pytest.mark.slow
def test_lbfgs_stops_where_float32_sees_no_more_decrease():
    """Converged to float32 resolution every line search fails (each of its 31 trials costs an
    evaluation): two failures in a row end the run inside its block, not 400 iterations later."""
    p = {"x": jnp.zeros(3, jnp.float32)}
    vec = optim.OnVector(_floor, optim.layout_of(p))
    s, fails, its = optim._lbfgs_block(vec, optim.start(np.zeros(3, np.float32)),
                                       jnp.zeros((), jnp.int32), (), 400)
    assert int(fails) == optim.FAILED_SEARCHES
    assert int(its) < 40
    np.testing.assert_allclose(np.asarray(s.x), [0.3, -0.7, 1.1], atol=1e-3)
    assert s.value == np.float32(1.0)
    q2, _ = optim.lbfgs(_floor, p, (), 400, chunks=8)            # the run ends with it
    np.testing.assert_array_equal(np.asarray(q2["x"]), np.asarray(s.x))


def test_one_failed_search_does_not_end_the_run():
    """10⁴·|x − ½|² from 10⁻⁴ beside its minimum: the first step (the gradient scaled to length
    1, as optax starts) overshoots even after 30 cuts to 0.8³⁰ ≈ 1.2e-3 and is taken anyway; the
    next iteration has the curvature and lands on the minimum. One failure alone must not end
    the run (with FAILED_SEARCHES = 1 it stops at 0.4992)."""
    def stiff(p, data):
        return 1e4 * jnp.sum((p["x"] - 0.5) ** 2)
    p = {"x": jnp.asarray([0.5001, 0.5001], jnp.float32)}
    q, value = optim.lbfgs(stiff, p, (), 20, chunks=2)
    np.testing.assert_allclose(np.asarray(q["x"]), [0.5, 0.5], atol=1e-6)
    assert value < 1e-8


def _spread(p, data):
    """Σ (a − 1)² + (b + 2)² + Σ 3·(c − 0.5)² over leaves of three shapes: minimum 0."""
    return jnp.sum((p["a"] - 1.0) ** 2) + (p["b"] + 2.0) ** 2 + 3.0 * jnp.sum((p["c"] - 0.5) ** 2)


@pytest.mark.slow
def test_lbfgs_works_on_the_leaves_laid_end_to_end_and_gives_them_back_as_they_came():
    p = {"c": jnp.zeros((2, 3), jnp.float32), "a": jnp.zeros(4, jnp.float32),
         "b": jnp.asarray(0.0, jnp.float32)}
    layout = optim.layout_of(p)
    assert layout == (("a", (4,)), ("b", ()), ("c", (2, 3)))
    x = optim.flattened({k: np.arange(np.size(v), dtype=np.float32).reshape(np.shape(v)) + 10 * i
                         for i, (k, v) in enumerate(sorted(p.items()))}, layout)
    np.testing.assert_array_equal(np.asarray(x), [0, 1, 2, 3, 10, 20, 21, 22, 23, 24, 25])
    back = optim.unflattened(np.asarray(x), layout)
    np.testing.assert_array_equal(back["c"], [[20, 21, 22], [23, 24, 25]])
    assert back["b"].shape == ()
    q, value = optim.lbfgs(_spread, p, (), 60, chunks=3)
    assert {k: (np.shape(v), np.asarray(v).dtype) for k, v in q.items()} == \
        {k: (np.shape(v), np.dtype(np.float32)) for k, v in p.items()}
    np.testing.assert_allclose(np.asarray(q["a"]), np.ones(4), atol=1e-3)
    np.testing.assert_allclose(float(q["b"]), -2.0, atol=1e-3)
    np.testing.assert_allclose(np.asarray(q["c"]), np.full((2, 3), 0.5), atol=1e-3)
    assert value == float(_spread(q, ()))


def test_equal_objectives_on_vectors_are_one_static_argument():
    """A fit builds a fresh :class:`OnVector` per stage; equal ones must hash alike, or every
    stage would trace and compile its L-BFGS block again."""
    layout = (("x", (2,)),)
    assert optim.OnVector(_bowl, layout) == optim.OnVector(_bowl, layout)
    assert hash(optim.OnVector(_bowl, layout)) == hash(optim.OnVector(_bowl, layout))
    assert optim.OnVector(_bowl, layout) != optim.OnVector(_spread, layout)
    np.testing.assert_allclose(float(optim.OnVector(_bowl, layout)(jnp.asarray([3.0, -1.0]), ())),
                               10.0)

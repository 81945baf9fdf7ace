"""The optimisers' contracts (roofcal.calibration.optim), on problems solved by hand."""

import jax.numpy as jnp
import numpy as np

from roofcal.calibration import optim


def _bowl(p, data):
    """(x − 3)² + 10·(y + 2)²: minimum 0 at (3, −2)."""
    x, y = p["x"][0], p["x"][1]
    return (x - 3.0) ** 2 + 10.0 * (y + 2.0) ** 2


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


def test_an_lbfgs_block_holds_the_objective_twice():
    """The first iteration's value and gradient, and the line search's trials: the loss the
    block returns is the one its last search found, not one more evaluation (a program of a
    GEMM's 10,000 rows compiled in 0.93 s instead of 1.08)."""
    traced = []

    def counted(p, data):
        traced.append(1)
        return _bowl(p, data)
    p = {"x": jnp.asarray([0.0, 0.0], jnp.float32)}
    optim._lbfgs_block.lower(counted, p, optim._lbfgs_init(p), (), 5)
    assert len(traced) == 2

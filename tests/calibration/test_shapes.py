"""Surface features factored through the measured shapes: the same polynomial as
:func:`roofcal.model.correction.features`, by hand and on the bundled MoE table."""

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest

from roofcal.calibration import shapes as S
from roofcal.calibration.fit import FitSettings, default_prior, factored_objective, init_op_params, \
    kernel_data, kernel_objective, prior_strengths
from roofcal.measurements.ops import read_ops
from roofcal.model import correction as K
from roofcal.model.predict import row_times
from roofcal.physics.hardware import load_gpu


@pytest.mark.slow
def test_degree_one_gemm_by_hand():
    # descriptors (m, n, k, tile_config), the axis m; terms 1, m, n, k, tile_config.
    # Rows 0 and 2 share (n, k, tile) = (0.5, −1, 0): one shape; row 1 is the other
    z = np.array([[0.2, 0.5, -1.0, 0.0], [-0.4, 1.5, 0.25, 1.0], [0.9, 0.5, -1.0, 0.0]])
    f = S.factor("gemm", z, np.full(4, -5.0), np.full(4, 5.0), 1)
    assert f.shapes.shape == (2, 5) and f.powers.shape == (3, 2)
    assert np.asarray(f.shape_of).tolist() == [0, 1, 0]          # unique shapes, sorted
    # each shape's monomials with m left out (m's own term: 1), each row's powers 1, m
    assert np.allclose(f.shapes, [[1, 1, 0.5, -1.0, 0.0], [1, 1, 1.5, 0.25, 1.0]])
    assert np.allclose(f.powers, [[1, 0.2], [1, -0.4], [1, 0.9]])
    assert np.asarray(f.onehot).tolist() == [[1, 0], [0, 1], [1, 0], [1, 0], [1, 0]]
    # the shapes' columns by the terms' axis power: m^0 (terms 1, n, k, tile), m^1 (term m),
    # each block held both ways (terms × shapes for the product, shapes × terms for its gradient)
    assert np.asarray(f.order).tolist() == [0, 2, 3, 4, 1]
    (b0t, b0), (b1t, b1) = f.blocks
    assert np.allclose(b0, np.asarray(f.shapes)[:, [0, 2, 3, 4]]) and np.allclose(b0t, np.asarray(b0).T)
    assert np.allclose(b1, np.asarray(f.shapes)[:, [1]]) and b1t.shape == (1, 2)
    w = jnp.asarray([[0.3, -1.0], [2.0, 0.5], [-0.5, 1.0], [1.0, 0.0], [0.7, 2.0]])
    # row 0: 0.3 + 2·0.2 − 0.5·0.5 + 1·(−1) + 0 = −0.55; −1 + 0.5·0.2 + 0.5 + 0 + 0 = −0.4
    assert np.allclose(S.logits(f, w)[0], [-0.55, -0.4], atol=1e-6)
    assert np.allclose(S.dense(f), np.asarray(K.features(jnp.asarray(z, jnp.float32), -5.0, 5.0, 1)))


@pytest.mark.slow
def test_moe_table_factored_is_its_feature_matrix_and_objective():
    gpu = load_gpu("h100_sxm")
    t = read_ops("data/microbench/h100_sxm/vllm-0.24.0/moe_perf.parquet")
    t = t[t.dtype == "int4"].reset_index(drop=True)
    settings = FitSettings(progress=False)
    test = np.arange(len(t)) % 5 == 0
    (key, d), = kernel_data(t, gpu, test, settings).items()
    n = len(t)
    assert d.fac is not None and d.feats is None
    # one shape per distinct (hidden, inter, topk, experts, tp, ep, skew): tokens are the axis
    shapes = t[["hidden", "inter", "topk", "experts", "tp", "ep", "skew"]].drop_duplicates()
    assert int(d.fac.shapes.shape[0]) == len(shapes) < n / 10
    # the dense matrix it stands for: the features of the rows (held-out rows clamped)
    _, _, z = row_times(gpu, "moe", "int4", t, np.arange(n))
    ref = np.asarray(K.features(jnp.asarray(z), d.lo, d.hi, 4))
    assert np.allclose(np.asarray(S.dense(d.fac))[:n], ref, rtol=1e-5, atol=1e-5)
    # the objective and its gradient: those of the dense one, to float rounding
    p, c = init_op_params(d, 4), default_prior("moe", 4, d)
    args = (d.fac, d.tc, d.tm, d.resident(), d.y, d.train, c, prior_strengths(c, settings, 100.0, "moe"),
            jnp.ones(p["eff_c"].shape))
    v1, g1 = jax.value_and_grad(factored_objective)(p, args)
    v2, g2 = jax.value_and_grad(kernel_objective)(p, ((d.features().T, d.features()),) + args[1:])
    assert abs(float(v1) / float(v2) - 1) < 1e-5
    for a, b in zip(jax.tree_util.tree_leaves(g1), jax.tree_util.tree_leaves(g2)):
        assert np.allclose(a, b, rtol=1e-3, atol=1e-6 * float(np.abs(b).max()) + 1e-9)


@pytest.mark.slow
def test_kernel_fits_side_by_side_are_the_fits_one_by_one():
    from roofcal.calibration.fit import fit_kernels
    gpu = load_gpu("h100_sxm")
    t = read_ops("data/microbench/h100_sxm/vllm-0.24.0/moe_perf.parquet")
    t = t[t.dtype == "int4"].reset_index(drop=True)
    a = read_ops("data/microbench/h100_sxm/vllm-0.24.0")
    t = pd.concat([t, a[a.op == "allreduce"]], ignore_index=True)
    settings = FitSettings(progress=False, kernel_iters=100)
    data = kernel_data(t, gpu, np.arange(len(t)) % 5 == 0, settings)
    assert len(data) == 3
    one = fit_kernels(data, settings, workers=1)
    two = fit_kernels(data, settings, workers=2)
    assert list(one) == list(two) == sorted(data)
    for k in one:
        for name in ("eff_c", "eff_m", "latency", "sharpness"):
            assert np.asarray(one[k][name]).tobytes() == np.asarray(two[k][name]).tobytes(), (k, name)


def test_monomials_are_the_powers_products_to_the_bit():
    """:func:`shapes.monomials` gathers each value's powers instead of calling ``pow`` per term:
    the same float64 numbers as ``np.prod(x ** e)`` (zeros, negative zeros, every exponent of a
    MoE surface's 495 terms and a GEMM's 70), as a hand-checked row shows."""
    from roofcal.calibration.shapes import monomials
    x = np.random.default_rng(0).normal(0, 1.5, (300, 8))
    x[::7, 2], x[::5, 1] = 0.0, -0.0
    for d, deg in ((8, 4), (4, 4)):
        e = K.exponents(d, deg)
        assert monomials(x[:, :d], e).tobytes() == np.prod(x[:, None, :d] ** e[None], axis=2).tobytes()
    e = np.array([[0, 0], [1, 0], [0, 2], [1, 3]])
    assert monomials(np.array([[2.0, -3.0]]), e).tolist() == [[1.0, 2.0, 9.0, -54.0]]

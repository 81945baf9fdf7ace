"""The steady-state serving model against hand-solved cases."""

import jax.numpy as jnp
import numpy as np
import pytest

from roofcal.model.serving import Load, run_means, steady_state, step_grid


def test_constant_steps_give_the_textbook_means():
    # every step 10 ms whatever the batch: τ = 10 ms; TTFT = α0 + τ/2 + τ + α2;
    # E2E = TTFT + (output − 1)(τ + α2) + α1
    load = Load(rate=5.0, duration=600, prompt=591, cached=560, output=247, max_seqs=128)
    t = jnp.full(129, 10_000.0)
    out = steady_state(t, t, load, jnp.array([3000.0, 500.0, 40.0]))
    ttft = 3000 + 5000 + 10_000 + 40
    assert float(out["step_us"]) == pytest.approx(10_000, rel=1e-6)
    assert float(out["ttft_us"]) == pytest.approx(ttft, rel=1e-6)
    assert float(out["itl_us"]) == pytest.approx(10_040, rel=1e-6)
    assert float(out["e2e_us"]) == pytest.approx(ttft + 246 * 10_040 + 500, rel=1e-6)
    # Little's law: running decodes = rate × decode time = 5/s × 246 × 10 ms = 12.3
    assert float(out["running"]) == pytest.approx(12.3, rel=1e-6)


def test_linear_steps_solve_the_fixed_point_by_hand():
    # t_decode(D) = a + b·D, t_mixed = t_decode + p. With D = λ(O−1)τ and f = λτ:
    # τ = a + bλ(O−1)τ + λτp  →  τ = a / (1 − bλ(O−1) − λp)
    a, b, p = 5000.0, 100.0, 8000.0                                   # µs, µs per decode, µs
    lam, out_len = 10.0, 101
    load = Load(rate=lam, duration=60, prompt=600, cached=0, output=out_len, max_seqs=128)
    d = jnp.arange(129.0)
    res = steady_state(a + b * d, a + b * d + p, load, jnp.zeros(3))
    lam_us = lam * 1e-6
    tau = a / (1 - b * lam_us * (out_len - 1) - lam_us * p)
    assert float(res["step_us"]) == pytest.approx(tau, rel=1e-5)
    assert float(res["running"]) == pytest.approx(lam_us * (out_len - 1) * tau, rel=1e-5)


def test_step_grid_holds_decode_then_mixed_steps():
    load = Load(rate=1.0, duration=1, prompt=600, cached=592, output=200, max_seqs=3)
    g = step_grid(load)
    assert g.decode_ctx.shape[0] == 8                       # 2 × (3 + 1) steps
    assert np.asarray(g.decode_mask).sum(axis=1).tolist() == [0, 1, 2, 3, 0, 1, 2, 3]
    assert set(np.asarray(g.decode_ctx)[np.asarray(g.decode_mask) > 0].tolist()) == {700}
    assert np.asarray(g.prefill_new).sum(axis=1).tolist() == [0, 0, 0, 0, 8, 8, 8, 8]


def test_run_means_weight_stages_by_requests():
    loads = [Load(5.0, 600, 600, 0, 10, 4), Load(10.0, 600, 600, 0, 10, 4)]      # 3000 and 6000 requests
    stages = [{"ttft_us": 30.0, "itl_us": 3.0, "e2e_us": 300.0}, {"ttft_us": 60.0, "itl_us": 6.0, "e2e_us": 600.0}]
    m = run_means(stages, loads)
    assert m["ttft_us"] == pytest.approx(50.0) and m["e2e_us"] == pytest.approx(500.0)


def test_first_token_cycles_shift_ttft_and_e2e_not_itl():
    # flat step times: τ = 10,000 µs whatever the batch; 2 req/s, 11 output tokens, 4 slots
    ld = Load(2.0, 600, 600, 0, 11, 4)
    t = np.full(5, 10_000.0, np.float32)
    a = np.array([1000.0, 500.0, 20.0], np.float32)
    base = steady_state(t, t, ld, a)
    late = steady_state(t, t, ld, a, first_token_cycles=1.0)
    assert float(base["step_us"]) == pytest.approx(10_000.0)
    # TTFT = α0 + τ/2 + t_mixed + α2 (+ one τ): 1000 + 5000 + 10000 + 20 = 16,020 → 26,020 µs
    assert float(base["ttft_us"]) == pytest.approx(16_020.0)
    assert float(late["ttft_us"]) == pytest.approx(26_020.0)
    assert float(late["itl_us"]) == float(base["itl_us"]) == pytest.approx(10_020.0)
    assert float(late["e2e_us"]) - float(base["e2e_us"]) == pytest.approx(10_000.0)

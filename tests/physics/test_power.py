"""The power a stream of steps draws and the clock a power-limited GPU holds
(roofcal.physics.power), checked by hand."""

from __future__ import annotations

import math

import pytest

from roofcal.physics import power as P


def model(**kw):
    base = dict(idle_w=100.0, compute_w=1000.0, memory_w=400.0, voltage_exponent=3.0, clock_elasticity=0.35,
                window_ms=400.0, limit_w=700.0, boost_mhz=2000.0)
    return P.PowerModel(**{**base, **kw})


def test_energy_and_compute_scale_by_hand():
    pm = model()
    # 2 ms of ideal compute at 1,000 W and 1 ms of ideal memory at 400 W: 2.4 J
    assert P.energy_uj(pm, 2000.0, 1000.0) == pytest.approx(2.4e6)
    # β = 0.35 at 69 % of the boost clock: exp(0.35 × 0.37106) = 1.1387
    assert float(P.compute_scale(pm, 0.69)) == pytest.approx(1.1387, abs=1e-4)
    assert float(P.compute_scale(pm, 1.0)) == 1.0


def test_power_at_boost_is_idle_plus_energy_over_cycle():
    pm = model()
    e = P.energy_uj(pm, 2000.0, 1000.0)             # 2.4e6 µJ per 10-ms cycle: 240 W of work
    assert float(P.stream_power_w(pm, 1.0, e, 10_000.0, 8_000.0)) == pytest.approx(100.0 + 240.0)


def test_clock_of_a_stream_that_does_not_stretch_by_hand():
    # no compute-bound time (sens 0): P(r) = idle + (E/T)·r²; E/T = 2,400 W, so the limit of 700 W
    # holds at r² = 600/2400: r = 0.5
    pm = model(voltage_exponent=3.0)
    r = float(P.clock_ratio(pm, 2400.0 * 10_000.0, 10_000.0, 0.0))
    assert r == pytest.approx(0.5, abs=1e-6)
    assert float(P.clock_mhz(pm, r)) == pytest.approx(1000.0, abs=1e-2)


def test_clock_of_a_stretching_stream_draws_the_limit():
    pm = model()
    e, t, sens = 2400.0 * 10_000.0, 10_000.0, 9_000.0   # 90 % of the cycle compute-bound
    r = P.clock_ratio(pm, e, t, sens)
    assert 0.5 < float(r) < 0.6      # stretching lowers the power at a clock: a higher clock than 0.5
    assert float(P.stream_power_w(pm, r, e, t, sens)) == pytest.approx(700.0, abs=0.01)
    # a busier stream runs slower; one within the limit keeps the boost clock; no limit: boost
    assert float(P.clock_ratio(pm, 2 * e, t, sens)) < float(r)
    assert float(P.clock_ratio(pm, 500.0 * t, t, sens)) == 1.0
    assert float(P.clock_ratio(model(limit_w=0.0), e, t, sens)) == 1.0


def test_the_window_counts_what_of_an_idle_gap_fits():
    pm = model(window_ms=400.0)
    e = 1000.0 * 300_000.0                            # 1,000 W of work over a 300-ms busy stretch
    # 300 ms busy, then 300 ms idle: the 400-ms window sees 100 ms of the gap
    assert float(P.stream_power_w(pm, 1.0, e, 300_000.0, 0.0, 1.0, 300_000.0)) == \
        pytest.approx(100.0 + e / 400_000.0)
    # a 10-ms step with a 1-ms gap: the whole gap
    assert float(P.stream_power_w(pm, 1.0, 1000.0 * 10_000.0, 10_000.0, 0.0, 1.0, 1_000.0)) == \
        pytest.approx(100.0 + 1000.0 * 10_000.0 / 11_000.0)


def test_defaults_scale_with_the_limit():
    pm = P.default_power(400.0, 1410.0)
    assert pm.idle_w == pytest.approx(0.187 * 400) and pm.compute_w == pytest.approx(2.46 * 400)
    assert pm.limit_w == 400.0 and pm.boost_mhz == 1410.0
    for name, (lo, hi) in P.BOUNDS.items():
        assert lo <= getattr(pm, name) <= hi
    assert math.isnan(float(P.clock_mhz(P.default_power(1000.0), 0.5)))    # no boost clock known

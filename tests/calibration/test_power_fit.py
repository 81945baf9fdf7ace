"""The power model fitted on the bundled H100 sustained-load measurement
(roofcal.calibration.power): physical parameters, and each phase's clock solved from the fitted
power — as predictions solve it — against what the GPU held."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from roofcal.calibration.power import fit_power, power_file
from roofcal.measurements.sustained import read_sustained
from roofcal.model import coeffs as C
from roofcal.physics import power as P
from roofcal.physics.hardware import load_gpu

ROOT = Path(__file__).resolve().parents[2]
H100 = ROOT / "data" / "sustained" / "h100_sxm"
COEFFS = ROOT / "coeffs" / "h100_sxm.yaml"


@pytest.fixture(scope="module")
def fitted():
    c = C.with_kernels(C.load(COEFFS), "vllm-0.14.0")
    return fit_power(read_sustained(H100), c.params, load_gpu("h100_sxm"), "vllm-0.14.0")


def test_parameters_are_physical(fitted):
    pm = fitted.power
    for name, (lo, hi) in P.BOUNDS.items():
        assert lo <= getattr(pm, name) <= hi
    assert 120 < pm.idle_w < 140                     # the idle board at 1,980 MHz drew 128–135 W
    assert pm.compute_w > pm.memory_w > 0            # tensor work draws more than streaming memory
    assert pm.limit_w == 700.0 and pm.boost_mhz == 1980.0


def test_each_phase_predicted_from_its_solved_clock(fitted):
    t = fitted.table.set_index("phase")
    # the memory-bound 64-token stream stays at the maximum clock, under the limit
    assert t.loc["m64", "sm_clock_mhz_pred"] == 1980.0 and t.loc["m64", "power_w_pred"] < 700
    for name in ("prefill_m8192", "decode_m256", "m1024", "mixed_2048_then_256"):
        row = t.loc[name]
        assert row.sm_clock_mhz_pred == pytest.approx(row.sm_clock_mhz_meas, rel=0.03)
        assert row.power_w_pred == pytest.approx(700.0, abs=0.5)
        # slower than the burst, as measured: within 6 % of the sustained step
        assert row.step_ms_pred > row.burst_ms
        assert row.step_ms_pred == pytest.approx(row.step_ms_meas, rel=0.06)
    assert fitted.source["fit_rms_log_ratio"] < 0.03


@pytest.mark.slow
def test_deterministic_and_what_the_shipped_file_holds(fitted, tmp_path):
    again = fit_power(read_sustained(H100), C.with_kernels(C.load(COEFFS), "vllm-0.14.0").params,
                      load_gpu("h100_sxm"), "vllm-0.14.0")
    assert again.power == fitted.power      # same inputs, same process: the same numbers
    # coeffs/h100_sxm.yaml holds roofcal power fit's output (within the rounding another machine's
    # XLA may bring to the kernel predictions)
    shipped = C.with_kernels(C.load(COEFFS), "vllm-0.14.0").power
    for name in P.BOUNDS:
        assert getattr(shipped, name) == pytest.approx(getattr(fitted.power, name), rel=1e-3)
    res = power_file(COEFFS, H100, tmp_path / "h100.yaml")
    assert set(res.fits) == {"vllm-0.14.0", "vllm-0.24.0"} and "m8192_duty50" in res.text
    back = C.load(tmp_path / "h100.yaml")
    np.testing.assert_allclose(C.with_kernels(back, "vllm-0.14.0").power.compute_w, fitted.power.compute_w, rtol=1e-5)
    assert C.with_kernels(back, "vllm-0.24.0").power.clock_elasticity != fitted.power.clock_elasticity


def test_the_fits_float64_power_is_the_physics_formula(fitted):
    # calibration.power._power_at evaluates physics.power.stream_power_w's formula on a phase's
    # own sustained step (in float64, for the finite-difference fit): the same watts
    from roofcal.calibration.power import _power_at, phase_models
    c = C.with_kernels(C.load(COEFFS), "vllm-0.14.0")
    pm = fitted.power
    for m in phase_models(read_sustained(H100), c.params, load_gpu("h100_sxm")):
        for r in (1.0, 0.8, 0.68):
            busy = m.busy_us(r ** -pm.clock_elasticity)
            want = float(P.stream_power_w(pm, r, P.energy_uj(pm, m.ideal_compute_us, m.ideal_memory_us),
                                          busy, 0.0, 1.0, m.idle_us(busy)))
            assert _power_at(pm, m, r, window=True) == pytest.approx(want, rel=1e-5)

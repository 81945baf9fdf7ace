"""Fitting a GPU's power model (:mod:`roofcal.physics.power`) on a sustained-load measurement
(:mod:`roofcal.measurements.sustained`).

Each phase of the measurement is a stream of one model's layer GEMMs. The kernel corrections
price those GEMMs as they were timed, in bursts, so the power fit does not re-learn the kernels:
a phase's sustained step is predicted as its measured burst step (the burst table's rows; for a
token count the table lacks, the model's step × the table/model ratio of the nearest measured
one) × ``T(s) / T(1)``, the model's step at compute scale ``s = r^(−β)`` over its step at the
boost clock. The energy of a step is the energy roofline's (FLOPs and bytes of its GEMMs).

Residuals, each a log ratio (a relative error):

* every back-to-back phase: its power at the SM clock nvidia-smi sampled, against the power it
  drew; its step time at that clock, against the step it held;
* a phase with idle gaps: its step time at the clock sampled inside its busy stretches, and the
  power the limiter sees there over its window (busy stretch + what of the gap fits) against the
  limit — the clock it holds is the one at which that window draws the limit;
* the idle board's power at the maximum clock.

Six parameters (``idle_w``, ``compute_w``, ``memory_w``, ``voltage_exponent``,
``clock_elasticity``, ``window_ms``) within :data:`roofcal.physics.power.BOUNDS`, by bounded least
squares (SciPy's trust-region reflective method from a fixed start: deterministic). The check
that matters is the other way round — :func:`check`: each phase's clock *solved* from the fitted
power (what a prediction does), and its step and power there, against the measurement.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from roofcal.errors import RoofcalError
from roofcal.physics import power as P

#: compute scales at which each phase's model step is evaluated (then interpolated)
SCALE_GRID = np.round(np.arange(1.0, 2.0001, 0.02), 4)
#: the fit's start (physical values) and which parameters are fitted in log space
START = {"idle_w": 130.0, "compute_w": 1000.0, "memory_w": 400.0, "voltage_exponent": 2.0,
         "clock_elasticity": 0.5, "window_ms": 400.0}
NAMES = tuple(START)


@dataclass(frozen=True)
class PhaseModel:
    """What the fit needs of one phase: its measured burst step (``burst_us``), the model's step
    on :data:`SCALE_GRID` relative to the boost clock's (``ratio``), its ideal compute and memory
    time (µs per step), and the measured phase."""

    phase: object
    burst_us: float
    ratio: np.ndarray
    ideal_compute_us: float
    ideal_memory_us: float

    def busy_us(self, s) -> float:
        """The sustained step (µs) at compute scale ``s``."""
        return self.burst_us * float(np.interp(s, SCALE_GRID, self.ratio))

    def idle_us(self, busy_us: float) -> float:
        """Idle time after each step (µs) at this phase's duty."""
        d = self.phase.duty
        return busy_us * (1.0 / d - 1.0) if d < 1.0 else 0.0


@dataclass
class PowerFit:
    """A fitted :class:`~roofcal.physics.power.PowerModel`, the per-phase check (:func:`check`)
    and the fit's provenance."""

    power: P.PowerModel
    table: pd.DataFrame
    source: dict = field(default_factory=dict)

    def metrics(self) -> dict:
        """Per phase: measured and predicted step (ms), SM clock (MHz) and power (W)."""
        out = {}
        for r in self.table.itertuples():
            out[r.phase] = {k: [round(float(getattr(r, f"{k}_meas")), 4), round(float(getattr(r, f"{k}_pred")), 4)]
                            for k in ("step_ms", "sm_clock_mhz", "power_w")}
        return out


def phase_models(meas, params: dict, gpu) -> list[PhaseModel]:
    """:class:`PhaseModel` of every phase of ``meas`` (a :class:`~roofcal.measurements.sustained.
    Sustained`), priced by the kernel corrections ``params`` (bf16 GEMMs) on ``gpu``."""
    from roofcal.model.predict import IdealTimes, ideal_times, predict_table
    burst = pd.read_csv(meas.burst)
    if "mode" in burst.columns:
        burst = burst[burst["mode"] == "cold"]
    rows = []
    for i, ph in enumerate(meas.phases):
        for m in ph.tokens:
            for n, k in meas.gemms:
                rows.append({"phase": i, "gpu": gpu.name, "op": "gemm", "dtype": "bf16", "m": m, "n": n, "k": k,
                             "source": str(meas.burst)})
    df = pd.DataFrame(rows)
    ideal = ideal_times(gpu, df)                                            # once, for the grid
    base = predict_table(df, params, gpu, ideal=ideal)
    # the grid in one table: the rows once per scale, their compute time that much longer (as
    # predict_table's compute_scale does it, float32 × the scale)
    k = len(SCALE_GRID)
    stacked = pd.concat([df] * k, ignore_index=True)
    scaled = IdealTimes(np.concatenate([ideal.tc * float(s) for s in SCALE_GRID]),
                        np.tile(ideal.tm, k), np.tile(ideal.z, (k, 1)), np.tile(ideal.res, k))
    grid = predict_table(stacked, params, gpu, ideal=scaled)["predicted_us"].to_numpy() \
        .reshape(k, len(df))                                                # (scales, rows)
    # the burst step: the table's row where measured, else the model × the shape's table/model
    # ratio at its nearest measured token count
    table = {(int(r.m), int(r.n), int(r.k)): float(r.latency_us) for r in burst.itertuples()}
    burst_row = np.empty(len(df))
    for j, r in enumerate(df.itertuples()):
        key = (int(r.m), int(r.n), int(r.k))
        if key in table:
            burst_row[j] = table[key]
            continue
        near = sorted((abs(math.log(m / r.m)), m) for (m, n, k) in table if (n, k) == (r.n, r.k))
        if not near:
            raise RoofcalError(f"{meas.burst}: no burst row of GEMM n={r.n} k={r.k}")
        m0 = near[0][1]
        ref = predict_table(df.iloc[[j]].assign(m=m0), params, gpu)["predicted_us"].iloc[0]
        burst_row[j] = base["predicted_us"].iloc[j] * table[(m0, r.n, r.k)] / ref
    out = []
    L = meas.layers
    for i, ph in enumerate(meas.phases):
        sel = (df["phase"] == i).to_numpy()
        t1 = grid[0, sel].sum()
        out.append(PhaseModel(ph, L * float(burst_row[sel].sum()), grid[:, sel].sum(1) / t1,
                              L * float(base["ideal_compute_us"][sel].sum()),
                              L * float(base["ideal_memory_us"][sel].sum())))
    return out


def _model(x: np.ndarray, limit_w: float, boost_mhz: float) -> P.PowerModel:
    v = dict(zip(NAMES, x))
    return P.PowerModel(**v, limit_w=limit_w, boost_mhz=boost_mhz)


def _power_at(pm: P.PowerModel, pmod: PhaseModel, r: float, window: bool) -> float:
    """Average power (W) of a phase at clock ratio r: over its whole cycle (what nvidia-smi's
    1-s average sees), or with ``window`` over the limiter's window. The formula of
    :func:`roofcal.physics.power.stream_power_w` on the phase's own sustained step, in float64:
    the fit differentiates it by finite differences, which JAX's float32 is too coarse for (the
    least squares then stall at their start; a test holds the two equal)."""
    busy = pmod.busy_us(r ** -pm.clock_elasticity)
    idle = pmod.idle_us(busy)
    gap = min(idle, max(pm.window_ms * 1e3 - busy, 0.0)) if window else idle
    energy = pm.compute_w * pmod.ideal_compute_us + pm.memory_w * pmod.ideal_memory_us
    return pm.idle_w + energy * r ** (pm.voltage_exponent - 1.0) / (busy + gap)


def residuals(x: np.ndarray, models: list[PhaseModel], idle_w: float, limit_w: float,
              boost_mhz: float) -> np.ndarray:
    """The fit's log-ratio residuals (module docstring)."""
    pm = _model(x, limit_w, boost_mhz)
    out = [math.log(pm.idle_w / idle_w)] if math.isfinite(idle_w) else []
    for m in models:
        ph = m.phase
        if ph.duty >= 1.0 and math.isfinite(ph.sm_clock_mhz):
            r = ph.sm_clock_mhz / boost_mhz
            out.append(math.log(m.busy_us(r ** -pm.clock_elasticity) / (ph.step_ms * 1e3)))
            out.append(math.log(_power_at(pm, m, r, window=False) / ph.power_w))
        elif math.isfinite(ph.busy_clock_mhz):
            r = ph.busy_clock_mhz / boost_mhz
            out.append(math.log(m.busy_us(r ** -pm.clock_elasticity) / (ph.step_ms * 1e3)))
            out.append(math.log(_power_at(pm, m, r, window=True) / limit_w))
    return np.array(out)


def solve_clock(pm: P.PowerModel, m: PhaseModel) -> float:
    """The clock ratio the fitted model predicts for a phase (its windowed power = the limit)."""
    from scipy.optimize import brentq
    f = lambda r: _power_at(pm, m, r, window=True) - pm.limit_w
    if pm.limit_w <= 0 or f(1.0) <= 0:
        return 1.0
    return float(brentq(f, P.MIN_CLOCK_RATIO, 1.0, xtol=1e-10)) if f(P.MIN_CLOCK_RATIO) < 0 else P.MIN_CLOCK_RATIO


def check(pm: P.PowerModel, models: list[PhaseModel]) -> pd.DataFrame:
    """Per phase, measured against predicted with the clock solved from the power: step (ms), SM
    clock (MHz; inside the busy stretches for a phase with gaps) and power (W, nvidia-smi's
    whole-cycle average)."""
    rows = []
    for m in models:
        ph = m.phase
        r = solve_clock(pm, m)
        busy = m.busy_us(r ** -pm.clock_elasticity)
        rows.append({"phase": ph.name, "tokens": "+".join(map(str, ph.tokens)), "duty": ph.duty,
                     "burst_ms": m.burst_us / 1e3,
                     "step_ms_meas": ph.step_ms, "step_ms_pred": busy / 1e3,
                     "sm_clock_mhz_meas": ph.sm_clock_mhz if ph.duty >= 1.0 else ph.busy_clock_mhz,
                     "sm_clock_mhz_pred": r * pm.boost_mhz,
                     "power_w_meas": ph.power_w, "power_w_pred": _power_at(pm, m, r, window=False)})
    return pd.DataFrame(rows)


def fit_models(models: list[PhaseModel], idle_w: float, limit_w: float, boost_mhz: float):
    """(:class:`~roofcal.physics.power.PowerModel`, residuals) of the phases ``models`` (module
    docstring): bounded least squares from :data:`START`, the parameters rounded to 6 digits."""
    from scipy.optimize import least_squares
    lo = np.array([P.BOUNDS[n][0] for n in NAMES], np.float64)
    hi = np.array([P.BOUNDS[n][1] for n in NAMES], np.float64)
    lo[:3] = np.maximum(lo[:3], 1e-3)                    # powers strictly positive
    x0 = np.clip(np.array([START[n] for n in NAMES], np.float64), lo, hi)
    fit = least_squares(residuals, x0, bounds=(lo, hi), args=(models, idle_w, limit_w, boost_mhz),
                        method="trf", x_scale="jac", xtol=1e-12, ftol=1e-12, gtol=1e-12, max_nfev=2000)
    x = np.array([float(f"{v:.6g}") for v in fit.x])
    return _model(x, limit_w, boost_mhz), residuals(x, models, idle_w, limit_w, boost_mhz)


def fit_power(meas, params: dict, gpu, kernels: str | None = None) -> PowerFit:
    """Fit the power model of ``gpu`` (its datasheet's ``power_limit_w``; boost clock from the
    datasheet, else the highest clock sampled) on the sustained measurement ``meas`` with the
    kernel corrections ``params`` (module docstring)."""
    from roofcal.io import file_record
    if gpu.power_limit_w <= 0:
        raise RoofcalError(f"datasheet {gpu.name}: field 'power_limit_w' is needed to fit a power model")
    if meas.gpu != gpu.name:
        raise RoofcalError(f"{meas.burst}: measured on GPU '{meas.gpu}', not '{gpu.name}'")
    boost = gpu.boost_clock_mhz or meas.max_clock_mhz
    if not boost or not math.isfinite(boost):
        raise RoofcalError(f"{meas.path}: no SM clock samples and no 'boost_clock_mhz' in datasheet {gpu.name}")
    models = phase_models(meas, params, gpu)
    pm, res = fit_models(models, meas.idle_w, float(gpu.power_limit_w), float(boost))
    files = sorted(p for p in meas.path.iterdir() if p.suffix in (".csv", ".json"))
    source = {"kind": "sustained load against bursts (roofcal.calibration.power)",
              "data": [file_record(p) for p in files], "kernels": kernels,
              "limit_w": float(gpu.power_limit_w), "boost_clock_mhz": float(boost),
              "fit_rms_log_ratio": round(float(np.sqrt(np.mean(res ** 2))), 5)}
    return PowerFit(pm, check(pm, models), source)


def bundled_sustained(gpu_name: str):
    """The bundled sustained measurement of a GPU (``data/sustained/<gpu>/``), else None."""
    from roofcal import resources
    d = resources.SUSTAINED / gpu_name
    return d if d.is_dir() else None


def with_power(c, gpu, meas) -> tuple:
    """``c`` with a power model fitted on the sustained measurement ``meas`` for every kernel set
    (relative to that set's kernels), and {set: PowerFit}."""
    from dataclasses import replace
    from roofcal.model import coeffs as coeff_io
    sets, fits = dict(c.kernel_sets), {}
    for name, ks in c.kernel_sets.items():
        if "gemm/bf16" not in ks.ops:
            continue
        f = fit_power(meas, {"ops": ks.ops, "step": c.params["step"]}, gpu, kernels=name)
        fits[name] = f
        sets[name] = replace(ks, power={"model": f.power, "source": f.source, "metrics": f.metrics()})
    out = coeff_io.Coefficients(**{**c.__dict__, "kernel_sets": sets})
    return coeff_io.with_kernels(out, c.kernels), fits


@dataclass
class PowerFileResult:
    """What :func:`power_file` did: the coefficients written, the fits per kernel set, a text."""

    coeffs: object
    fits: dict
    text: str


def fit_line(name: str, f: PowerFit, folder) -> str:
    """One line: a kernel set's fitted power parameters, the measurement and the fit's rms."""
    from roofcal import resources
    pm = f.power
    return (f"power model of kernel set '{name}' on {resources.display(folder)}: idle {pm.idle_w:.0f} W, "
            f"compute {pm.compute_w:.0f} W, memory {pm.memory_w:.0f} W at {pm.boost_mhz:.0f} MHz; voltage "
            f"exponent {pm.voltage_exponent:.2f}, clock elasticity {pm.clock_elasticity:.3f}, window "
            f"{pm.window_ms:.0f} ms; limit {pm.limit_w:.0f} W (fit rms {100 * f.source['fit_rms_log_ratio']:.1f} %)")


def fit_text(fits: dict, folder) -> str:
    """Each kernel set's fitted parameters (:func:`fit_line`) and its per-phase check, as text."""
    from roofcal.tables import table
    lines = []
    for name, f in fits.items():
        lines.append(fit_line(name, f, folder))
        t = f.table.copy()
        lines.append(table(t.to_dict("records"), list(t.columns), floats="{:.2f}"))
    lines.append("(pred: each phase's clock solved from the fitted power, as predictions solve it; sm_clock "
                 "inside the busy stretches for a phase with idle gaps; power_w: nvidia-smi's 1-s average)")
    return "\n".join(lines)


def power_file(coeffs_path, sustained=None, out=None, gpu=None) -> PowerFileResult:
    """``roofcal power fit``: fit the power model of every kernel set of the coefficient file
    ``coeffs_path`` on the sustained measurement folder ``sustained`` (default: the one the
    ``gpu`` overlay names, else the bundled one of the file's GPU) and write the file to ``out``
    (atomically; not written when None). ``gpu``: a datasheet or a probe's overlay of the file's
    GPU whose power limit and boost clock to fit with (default: the bundled datasheet)."""
    from roofcal.measurements.sustained import read_sustained
    from roofcal.model import coeffs as coeff_io
    from roofcal.physics.hardware import load_gpu
    from roofcal.physics.hardware.datasheet import overlay_sustained
    c = coeff_io.load(coeffs_path)
    spec = load_gpu(gpu or c.gpu)
    c.check_gpu(spec, where="--gpu")
    gpu_spec = spec
    folder = sustained or (overlay_sustained(gpu) if gpu else None) or bundled_sustained(spec.name)
    if folder is None:
        raise RoofcalError(f"no sustained-load measurement bundled for GPU '{spec.name}'; give --sustained DIR "
                           f"(roofcal probe writes one)")
    c, fits = with_power(c, gpu_spec, read_sustained(folder))
    if not fits:
        raise RoofcalError(f"{coeffs_path}: no kernel set with a bf16 GEMM correction to price the measured GEMMs")
    if out is not None:
        coeff_io.save(c, out)
    text = fit_text(fits, folder) + (f"\nwrote {out}" if out is not None else "")
    return PowerFileResult(c, fits, text)

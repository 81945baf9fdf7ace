"""What-if analysis: step times on a changed datasheet, and their sensitivity to every field.

``model.step_breakdown`` takes the :class:`GPUSpec` as a static (compile-time) argument, so it
cannot be differentiated with respect to the datasheet. :func:`step_times` is the same
computation with the datasheet numbers (peaks in 1e12 FLOP/s, bandwidths in 1e12 and 1e9 B/s, SM
count) as traced scalars ``theta``. The coefficients belong to their own GPU (``ref``); on other
numbers their efficiency surfaces move as :func:`roofcal.bootstrap.bootstrap` moves them (rule
``sm``: only an SM-count change moves them), so the "after" of a what-if equals a prediction
with the bootstrapped coefficients.

Sensitivity of a step time ``t`` to a field ``f`` is the elasticity ``∂ log t / ∂ log f`` (forward
mode JAX): −0.92 for ``hbm_bandwidth_tbs`` means 1 % more bandwidth makes the step 0.92 % faster,
i.e. the step is "0.92 bandwidth-bound". Per phase, the elasticity of the phase's total time is
the time-weighted mean of its steps'. Fields the time model does not read (``hbm_capacity_gib``)
and peaks the GPU lacks (``fp8_tflops`` = 0: FP8 runs at the BF16 peak) have elasticity 0.

The *fixed share* is the part of the step time that is latencies and overheads, computed directly
(:func:`fixed_time`). Only where nothing else responds to a common scaling of every peak and
bandwidth do the rate elasticities sum to −(1 − fixed share): the efficiency surfaces must stay
put (``--fixed-efficiency``, or rules ``shape``, ``balance``, ``sm`` and ``balance_sm``, which read
only ratios of rates and the SM count; rule ``duration`` moves them with every rate), and the
prefill–decode attention mix must be a sum (mix sharpness 1; the bundled fits have 1.0–1.001).
"""

from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

from roofcal.model import correction as K
from roofcal.model import curves
from roofcal.transfer.bootstrap import DEFAULT_RULE, op_rates, shifted_range, shifts
from roofcal.physics.components import ideal_times
from roofcal.physics.config import ModelSpec, Parallel
from roofcal.physics.decompose import step_ops
from roofcal.errors import RoofcalError
from roofcal.physics.hardware import NUMERIC_FIELDS, GPUSpec
from roofcal.physics.hardware.datasheet import PER_US
from roofcal.model.combine import CPU, OVERHEAD, OVERLAP, combine, kernel_times
from roofcal.physics.steps import StepBatch, step_totals

#: datasheet numbers the time model reads, traced in :func:`step_times`
RATE_FIELDS = (*PER_US, "sm_count")
#: fields reported (the what-if fields of the datasheet schema)
FIELDS = tuple(NUMERIC_FIELDS)
#: output of :func:`step_times` that is not part of :func:`roofcal.model.combine`'s breakdown
FIXED = "fixed"


def theta_of(gpu: GPUSpec) -> dict:
    """The traced datasheet numbers of ``gpu`` (absent peaks as 1.0: never read, see above)."""
    return {f: jnp.asarray(float(getattr(gpu, f)) or 1.0, jnp.float32) for f in RATE_FIELDS}


def op_time(p: dict, kind: str, work, new: tuple, ref: tuple, rule: str):
    """Corrected time (µs) of calls with ``work`` at rates ``new`` (peak FLOP/µs, bytes/µs, SMs),
    with coefficients fitted at ``ref`` and their surfaces carried by bootstrap ``rule``: the
    surfaces and clamp of :func:`roofcal.bootstrap.shift_op`, evaluated without re-expanding the
    polynomials (so the derivatives through the clamp are exact)."""
    tc, tm = ideal_times(work, new[0], new[1])
    z = K.standardize(kind, work.shape)
    dc, dm = shifts(rule, kind, ref, new)
    zc, zm, lo, hi = shifted_range(kind, jax.lax.stop_gradient(p["lo"]),
                                   jax.lax.stop_gradient(p["hi"]), dc, dm, jnp)
    u = jnp.clip(z, lo, hi)                           # the bootstrapped file's clamp
    deg = K.degree_of(z.shape[-1], p["eff_c"].shape[0])
    free = jnp.full(z.shape[-1], 1e30, jnp.float32)
    fm = K.features(u + zm, -free, free, deg)
    fc = fm if rule != "duration" else K.features(u + zc, -free, free, deg)   # else zc = zm
    ec, em = jax.nn.sigmoid(fc @ p["eff_c"]), jax.nn.sigmoid(fm @ p["eff_m"])
    return K.corrected_time(p, ec, em, tc, tm) * curves.factor(p.get("curves"), kind, work.shape)


def fixed_time(params: dict, calls: dict, kernels: dict, out: dict):
    """µs of each step that no rate moves, to first order: the overheads, and each kernel's
    latencies (times its measured-shape factor, :mod:`roofcal.model.curves`) as their share of
    the kernel's time before the step level, carried through its
    step-level scale; with CPU–GPU overlap, the rate-bound GPU time R counts by how much the cycle
    time moves with it, ∂t/∂gpu = (gpu/t)^(q−1), so fixed = t − R·(gpu/t)^(q−1)."""
    fixed = out[OVERHEAD]
    for name, call in calls.items():
        _, p = K.lookup(params["ops"], call.kind, call.variant)
        k = kernels[name]
        lat = call.count * jnp.exp(p["latency"]) * curves.factor(p.get("curves"), call.kind, call.work.shape)
        fixed = fixed + jnp.where(k > 0, lat / jnp.maximum(k, 1e-30), 0.0) * out[name]
    if "overlap" not in params["step"]:
        return fixed
    total = out["total"]
    serial = total - out[OVERLAP]
    gpu = serial - out[CPU]
    q = K.overlap_sharpness(params["step"])
    slope = (jnp.maximum(gpu, 1e-30) / jnp.maximum(total, 1e-30)) ** (q - 1.0)
    return total - (serial - fixed) * slope


@partial(jax.jit, static_argnames=("model", "gpu", "ref", "tp", "rule"))
def step_times(params: dict, theta: dict, model: ModelSpec, gpu: GPUSpec, ref: GPUSpec, tp: int,
               batch: StepBatch, rule: str | None = DEFAULT_RULE) -> dict:
    """:func:`roofcal.model.step_breakdown` with datasheet numbers ``theta`` traced, plus ``fixed``
    (µs of the step no rate moves, :func:`fixed_time`).

    ``gpu`` decides which peak each dtype uses; ``ref`` is the GPU the coefficients were fitted
    for. With ``theta = theta_of(ref)`` and ``gpu = ref`` this equals ``step_breakdown``.
    ``rule`` None keeps the surfaces fixed in shape (the model's own kernel times).
    """
    t = step_totals(batch, jnp)
    calls = step_ops(model, tp, t)
    rates = {name: op_rates(gpu, c.kind, c.variant, theta) for name, c in calls.items()}
    if rule is None:
        ideal = {name: ideal_times(c.work, *rates[name][:2]) for name, c in calls.items()}
        kernels = kernel_times(params, calls, ideal)
    else:
        kernels = {name: c.count * op_time(K.lookup(params["ops"], c.kind, c.variant)[1], c.kind,
                                           c.work, rates[name], op_rates(ref, c.kind, c.variant),
                                           rule)
                   for name, c in calls.items()}
    out = combine(params["step"], model, tp, t, kernels)
    out[FIXED] = fixed_time(params, calls, kernels, out)
    return out


@partial(jax.jit, static_argnames=("model", "gpu", "tp", "rule"))
def sensitivity(params: dict, model: ModelSpec, gpu: GPUSpec, tp: int, batch: StepBatch,
                rule: str | None = DEFAULT_RULE) -> tuple[dict, dict]:
    """(:func:`step_times` at ``gpu``'s own datasheet, {field: ∂ log t / ∂ log field} per step,
    shape (S,)), in one forward-mode pass."""
    theta = theta_of(gpu)

    def log_total(v):                                  # v: log of each field's relative change
        out = step_times(params, {f: theta[f] * jnp.exp(v[f]) for f in theta}, model, gpu, gpu,
                         tp, batch, rule)
        return jnp.log(jnp.maximum(out["total"], 1e-30)), out

    jac, out = jax.jacfwd(log_total, has_aux=True)({f: jnp.zeros((), jnp.float32) for f in theta})
    return out, {f: jnp.where(getattr(gpu, f) > 0, jac[f], 0.0) for f in RATE_FIELDS}


def elasticities(params: dict, model: ModelSpec, gpu: GPUSpec, tp: int, batch: StepBatch,
                 rule: str | None = DEFAULT_RULE) -> dict:
    """{field: ∂ log t / ∂ log field} per step, shape (S,), at ``gpu``'s own datasheet."""
    return sensitivity(params, model, gpu, tp, batch, rule)[1]


# --------------------------------------------------------------------------------------------
# the what-if of a step file

def parse_changes(items) -> dict:
    """``["hbm_bandwidth_tbs=4.8", ...]`` → {field: number}; one-line errors."""
    out = {}
    for item in items or ():
        if "=" not in item:
            raise RoofcalError(f"--set: {item!r} is not FIELD=VALUE (fields: {', '.join(FIELDS)})")
        key, value = (s.strip() for s in item.split("=", 1))
        if key not in NUMERIC_FIELDS:
            raise RoofcalError(f"--set: unknown datasheet field {key!r} (fields: {', '.join(FIELDS)})")
        try:
            v = float(value)
        except ValueError:
            raise RoofcalError(f"--set: field '{key}' needs a number, got {value!r}")
        if not math.isfinite(v):
            raise RoofcalError(f"--set: field '{key}' must be a finite number, got {value!r}")
        if key == "sm_count":
            if v != int(v):
                raise RoofcalError(f"--set: field 'sm_count' must be an integer, got {value!r}")
            v = int(v)
        out[key] = v
    return out


def whatif_batch(params: dict, model: ModelSpec, gpu: GPUSpec, tp: int, batch: StepBatch,
                 changes: dict, rule: str | None = DEFAULT_RULE) -> pd.DataFrame:
    """Per step: ``before_us``, ``after_us`` (datasheet with ``changes``, validated as a datasheet
    file), one ``d_<field>`` column per field (∂ log t / ∂ log field at the unchanged datasheet)
    and ``fixed_share`` (the share of ``before_us`` no rate moves: latencies and overheads)."""
    new = gpu.replace(**changes) if changes else gpu
    out, el = sensitivity(params, model, gpu, tp, batch, rule)
    after = step_times(params, theta_of(new), model, new, gpu, tp, batch, rule)["total"]
    before = np.asarray(out["total"], np.float64)
    df = pd.DataFrame({"before_us": before, "after_us": np.asarray(after, np.float64)})
    for f in FIELDS:
        df[f"d_{f}"] = np.asarray(el[f], np.float64) if f in el else 0.0
    df["fixed_share"] = np.where(before > 0, np.asarray(out[FIXED], np.float64)
                                 / np.maximum(before, 1e-30), 0.0)
    return df


def whatif(steps, coeffs=None, model=None, gpu=None, tp: int | None = None, changes=None,
           rule: str | None = DEFAULT_RULE, parallel: Parallel = Parallel()) -> pd.DataFrame:
    """``roofcal whatif``: one row per step (input order): step, phase, model, gpu, tp, before_us,
    after_us, change_pct, ``d_<field>`` elasticities and fixed_share. ``steps``/``model``/``gpu``/
    ``tp``/``coeffs``/``parallel`` as in :func:`roofcal.predict.predict`; ``changes`` {field: value}."""
    from roofcal.model.predict import per_deployment
    df = per_deployment(steps, model, gpu, tp, coeffs,
                        lambda c, spec, gspec, t, batch, recs:
                        whatif_batch(c.params, spec, gspec, t, batch, changes or {}, rule),
                        parallel=parallel)
    before = df["before_us"].to_numpy()
    df.insert(df.columns.get_loc("after_us") + 1, "change_pct", np.where(
        before > 0, (df["after_us"].to_numpy() / np.maximum(before, 1e-30) - 1.0) * 100.0, 0.0))
    return df.reset_index(drop=True)


def by_phase(df: pd.DataFrame) -> pd.DataFrame:
    """Per phase: steps, mean before/after µs, change % of the total, the elasticities of the
    phase's total time and its fixed share (latencies and overheads; time-weighted means)."""
    rows = []
    for phase, g in df.groupby("phase", sort=True):
        w = g["before_us"].to_numpy()
        row = {"phase": phase, "steps": len(g), "before_us": float(w.mean()),
               "after_us": float(g["after_us"].mean()),
               "change_pct": float((g["after_us"].sum() / w.sum() - 1.0) * 100.0)
               if w.sum() > 0 else 0.0}
        for f in FIELDS:
            row[f"d_{f}"] = float(np.sum(w * g[f"d_{f}"].to_numpy()) / max(w.sum(), 1e-30))
        row["fixed_share"] = float(np.sum(w * g["fixed_share"].to_numpy()) / max(w.sum(), 1e-30))
        rows.append(row)
    return pd.DataFrame(rows)


def describe(phases: pd.DataFrame) -> list[str]:
    """One sentence per phase, e.g. ``decode (32 steps): 0.92 bandwidth-bound, ...``."""
    names = {"hbm_bandwidth_tbs": "bandwidth-bound", "bf16_tflops": "BF16-compute-bound",
             "fp8_tflops": "FP8-compute-bound", "int8_tops": "INT8-compute-bound",
             "fp4_tflops": "FP4-compute-bound",
             "interconnect_bandwidth_gbs": "interconnect-bound"}
    out = []
    for _, r in phases.iterrows():
        parts = [f"{-r[f'd_{f}']:.2f} {n}" for f, n in names.items() if abs(r[f"d_{f}"]) >= 0.005]
        parts.append(f"{r['fixed_share']:.2f} fixed (latencies, overheads)")
        if abs(r["d_sm_count"]) >= 0.005:
            parts.append(f"SM-count elasticity {r['d_sm_count']:+.2f}")
        n = int(r["steps"])
        out.append(f"{r['phase']} ({n} step{'s' if n != 1 else ''}): " + ", ".join(parts))
    return out

"""Coverage of the 80 % prediction bands (:mod:`roofcal.model.intervals`), for ``roofcal bench``.

* **Per-op rows** of a default fit: each held-out row against the band of its stratum
  calibrated on the *other* held-out rows of that stratum (leave-one-out; the fit saw none of
  them). Per kernel kind, variants pooled; target 80 % ± 3.
* **Whole steps** (held-out splitwise configurations): the step band — the stack's phase band
  from the other held-out steps, joined with the kernels' band — and, as a diagnostic, the
  kernels' band alone (how much of a step's error its kernels explain). Target 80 % ± 10.
* **Zero-shot GPUs**: a bootstrap's widened bands where the transfer error was measured in the
  *other* direction only (A100 rows predicted from the H100 fit with bands from H100 rows
  predicted from the A100 fit, and the reverse) — a check across GPU pairs, not exchangeable
  rows, so coverage is not guaranteed.
* **Throughput** of whole-step prediction with bands and out-of-domain flags, once compiled.
"""

from __future__ import annotations

import numpy as np

from roofcal.calibration import conformal
from roofcal.model import intervals as IV

TARGET, TOL_OPS, TOL_STEPS = 80.0, 3.0, 10.0


def _row(label, covered, width, n_extra=None, tol=TOL_OPS) -> dict:
    cov = float(np.mean(covered) * 100.0) if len(covered) else float("nan")
    return {"rows": label, "coverage %": cov, "n": int(len(covered)),
            "median width %": float(np.median(width) * 100.0) if len(width) else float("nan"),
            "target %": f"{TARGET:g} ± {tol:g}",
            "met": "yes" if abs(cov - TARGET) <= tol else "no"}


def op_coverage(result, m, gpu) -> list[dict]:
    """Leave-one-out coverage of held-out per-op rows per kernel kind (``result``: a FitResult,
    ``m``: its Measurements)."""
    from roofcal.model.coeffs import with_kernels
    from roofcal.model.predict import predict_table
    ops = m.ops.reset_index(drop=True)
    sets = ops["kernels"].astype(str).to_numpy()
    out = []
    for name in result.coeffs.kernel_sets:            # each set's held-out rows with its own bands
        c = with_kernels(result.coeffs, name)
        own = np.flatnonzero(((sets == name) | (sets == "")) & result.kernel_test)
        if not len(own):
            continue
        rows = predict_table(ops.iloc[own].reset_index(drop=True), c.params, gpu)
        keys = (rows["op"] + "/" + rows["dtype"]).to_numpy()
        reg = IV.regime(rows["ideal_compute_us"].values, rows["ideal_memory_us"].values)
        ratio = (rows["latency_us"] / rows["predicted_us"]).to_numpy()
        strata = conformal.stratum_of(c.op_bands, keys, reg)
        lo, hi = conformal.loo_coverage(strata, ratio)
        inside = (ratio >= lo) & (ratio <= hi)
        kinds = np.array([k.split("/")[0] for k in keys])
        for kind in sorted(set(kinds)):
            sel = kinds == kind
            out.append({"gpu": gpu.name, "kernels": name, "kernel": kind,
                        **_row("held-out per-op", inside[sel], (hi / lo - 1.0)[sel])})
    return out


def step_coverage(result, steps) -> list[dict]:
    """Coverage on the held-out whole steps of a fit with measured steps, per phase: the full
    step band (stack band leave-one-out ∪ kernels) and the kernels' band alone."""
    from roofcal.physics.decompose import step_ops
    from roofcal.physics.steps import step_totals
    c = result.coeffs
    table = result.step_table
    test = np.concatenate(result.step_test)
    klo, khi, start = [], [], 0
    for d in steps:
        calls = step_ops(d.model, d.tp, step_totals(d.batch, np))
        sub = table.iloc[start:start + len(d)]
        start += len(d)
        parts = {k[:-3]: sub[k].to_numpy() for k in sub.columns if k.endswith("_us")}
        lo, hi, _, _, _ = IV.kernel_step_interval(c.op_bands, calls, parts, sub["predicted_us"].to_numpy())
        klo.append(lo)
        khi.append(hi)
    klo, khi = np.concatenate(klo)[test], np.concatenate(khi)[test]
    t = table[test]
    pred, meas = t["predicted_us"].to_numpy(), t["measured_us"].to_numpy()
    ratio = meas / pred
    phase = t["phase"].to_numpy()
    out = []
    for p in IV.PHASES:
        sel = phase == p
        if not sel.any():
            continue
        slo, shi = conformal.loo_bands(ratio[sel])
        lo = np.minimum(klo[sel], pred[sel] * slo)
        hi = np.maximum(khi[sel], pred[sel] * shi)
        out.append({"phase": p, **_row("held-out steps, band: stack ∪ kernels", (meas[sel] >= lo) & (meas[sel] <= hi),
                                       hi / lo - 1.0, tol=TOL_STEPS)})
        out.append({"phase": p, **_row("held-out steps, band: kernels alone", (meas[sel] >= klo[sel]) & (meas[sel] <= khi[sel]),
                                       khi[sel] / klo[sel] - 1.0, tol=TOL_STEPS)})
    return out


def zero_shot_coverage(h100, a100) -> list[dict]:
    """Coverage of widened bootstrap bands on every row of the other GPU, the transfer bands
    measured in the opposite direction only (``h100``, ``a100``: the default fits' coefficients)."""
    from roofcal.bench.transfer import microbench_table
    from roofcal.physics.hardware import load_gpu
    from roofcal.transfer import bands as TB
    from roofcal.model.coeffs import with_kernels
    H, A = load_gpu("h100_sxm"), load_gpu("a100_sxm")
    ks = TB.common_kernels(h100, a100)            # one kernel library on both GPUs
    h100, a100 = with_kernels(h100, ks), with_kernels(a100, ks)
    tables = {"a100_sxm": microbench_table(A.name, ks), "h100_sxm": microbench_table(H.name, ks)}
    res = {"a100_sxm": TB.transfer_residuals(h100, H, A, tables["a100_sxm"]),
           "h100_sxm": TB.transfer_residuals(a100, A, H, tables["h100_sxm"])}
    refs = {"a100_sxm": h100, "h100_sxm": a100}
    out = []
    for new, other in (("a100_sxm", "h100_sxm"), ("h100_sxm", "a100_sxm")):
        measured = {k: TB.symmetric_band(v) for k, v in res[other].items()}
        bands = conformal.widen(refs[new].op_bands, {k: b for k, b in measured.items() if b})
        for kind, r in sorted(res[new].items()):
            b = IV.op_band(bands, kind, "")
            ratio = np.exp(r)
            inside = (ratio >= b.p10) & (ratio <= b.p90)
            out.append({"gpu": f"{new} ← {refs[new].gpu}", "kernel": kind,
                        **_row("zero shot, all rows", inside, np.full(len(r), b.p90 / b.p10 - 1.0),
                               tol=TOL_STEPS)})
    return out


def throughput(coeffs, steps: int = 1_000_000) -> dict:
    """Steps per second of whole-step prediction with bands and out-of-domain flags, once
    compiled (Llama-2-70B TP 4 on H100; :func:`roofcal.bench.fits.random_batch`): what
    :func:`roofcal.model.predict.predict` computes per deployment
    (:func:`~roofcal.model.predict.step_arrays`), without building the DataFrame; the median of
    :data:`roofcal.bench.fits.TIMED_CALLS` calls."""
    from roofcal.bench.fits import median_seconds, random_batch
    from roofcal.model.predict import step_arrays
    from roofcal.physics.config import load_model
    from roofcal.physics.hardware import load_gpu
    model, gpu = load_model("llama-2-70b-hf"), load_gpu("h100_sxm")
    batch, _ = random_batch(steps)
    step_arrays(coeffs, model, gpu, 4, batch)              # compile
    per = median_seconds(lambda: step_arrays(coeffs, model, gpu, 4, batch))
    return {"steps": steps, "seconds per call": per, "steps per second": steps / per}


def report(h100_result, h100_m, a100_result, a100_m) -> list[tuple[str, str]]:
    """(title, Markdown) sections for ``roofcal bench``."""
    from roofcal.physics.hardware import load_gpu
    from roofcal.tables import table
    cols = ["gpu", "kernel", "rows", "coverage %", "n", "median width %", "target %", "met"]
    ops = op_coverage(h100_result, h100_m, load_gpu("h100_sxm")) + \
        op_coverage(a100_result, a100_m, load_gpu("a100_sxm"))
    out = [("Prediction bands: coverage of held-out per-op rows (80 % band, leave-one-out "
            "over the held-out rows of each stratum)", table(ops, ["gpu", "kernels"] + cols[1:]))]
    st = step_coverage(h100_result, h100_m.steps)
    out.append(("Prediction bands: coverage of held-out whole steps (splitwise stack, H100)",
                table(st, ["phase"] + cols[2:])))
    zs = zero_shot_coverage(h100_result.coeffs, a100_result.coeffs)
    out.append(("Prediction bands: zero-shot GPUs (bands widened by the transfer error measured in "
                "the other direction only)", table(zs, cols)))
    tp = throughput(h100_result.coeffs)
    out.append(("Prediction throughput with bands and out-of-domain flags (CPU, once compiled)",
                table([{**tp, "target": "1e6 steps/s", "met": "yes" if tp["steps per second"] >= 1e6 else "no"}],
                      ["steps", "seconds per call", "steps per second", "target", "met"], floats="{:.3g}")))
    return out

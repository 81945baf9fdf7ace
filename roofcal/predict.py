"""``roofcal predict``: step times with a per-component breakdown, for steps of any deployment."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from . import coeffs as coeff_io
from .config import check_tp, load_model
from .errors import RoofcalError
from .hardware import load_gpu
from .model import NON_COMPONENT, step_breakdown
from .steps import Step, batch_steps, group_by_deployment, read_steps



def resolve_coeffs(coeffs, gpu):
    """A :class:`Coefficients` for ``gpu``: loaded from a path, checked, or neutral when None."""
    if coeffs is None:
        return coeff_io.Coefficients.neutral(gpu)
    if isinstance(coeffs, (str, Path)):
        return coeff_io.load(coeffs, gpu)
    coeffs.check_gpu(gpu)
    return coeffs


def per_deployment(steps, model, gpu, tp, coeffs, compute) -> pd.DataFrame:
    """Run ``compute`` on each deployment's steps; one row per input step, in input order.

    Steps (a JSONL path or :class:`Step` list) are grouped by (model, GPU, TP), a step's own fields
    overriding ``model``/``gpu``/``tp``; each group's model, datasheet, TP and coefficients are
    loaded and checked, then ``compute(coeffs, model_spec, gpu_spec, tp, batch, records)`` returns
    a DataFrame with one row per record. Columns ``step``, ``phase``, ``model``, ``gpu``, ``tp`` come
    first.
    """
    src = str(steps) if isinstance(steps, (str, Path)) else "steps"
    records = read_steps(steps) if isinstance(steps, (str, Path)) else list(steps)
    if not records:
        raise RoofcalError(f"{src}: no steps")
    frames = []
    for (m, g, t), idx in group_by_deployment(records, model, gpu, tp, src).items():
        spec, gspec = load_model(m), load_gpu(g)
        check_tp(spec, int(t), where=f"{src}: tp")
        recs = [records[i] for i in idx]
        df = compute(resolve_coeffs(coeffs, gspec), spec, gspec, int(t), batch_steps(recs), recs)
        front = pd.DataFrame({"step": np.asarray(idx) + 1, "phase": [r.phase for r in recs],
                              "model": spec.name, "gpu": gspec.name, "tp": int(t)})
        frames.append(pd.concat([front, df.reset_index(drop=True)], axis=1))
    return pd.concat(frames, ignore_index=True).sort_values("step", kind="stable") \
        .reset_index(drop=True)


def predict(steps: "str | Path | Sequence[Step]", model=None, gpu=None, tp: int | None = None,
            coeffs=None) -> pd.DataFrame:
    """Predict every step; one row per input step, in input order.

    ``steps``: a JSONL path or a list of :class:`Step`. ``model`` / ``gpu`` / ``tp`` apply to steps
    that do not name their own. ``coeffs``: a coefficient file path, a loaded
    :class:`~roofcal.coeffs.Coefficients`, or None for the neutral roofline defaults.

    Columns: ``step``, ``phase``, ``model``, ``gpu``, ``tp``, ``measured_us`` (when given),
    ``predicted_us``, one ``<component>_us`` column per kernel and ``overhead_us``, then ``flops``
    and ``bytes`` (one GPU, whole step).
    """
    def one(c, spec, gspec, t, batch, recs):
        out = {k: np.asarray(v, np.float64) for k, v in
               step_breakdown(c.params, spec, gspec, t, batch).items()}
        df = pd.DataFrame(index=range(len(recs)))
        if any(r.duration_us is not None for r in recs):
            df["measured_us"] = [np.nan if r.duration_us is None else r.duration_us for r in recs]
        df["predicted_us"] = out["total"]
        for name in sorted(k for k in out if k not in NON_COMPONENT):
            df[f"{name}_us"] = out[name]
        df["flops"], df["bytes"] = out["flops"], out["bytes"]
        return df

    df = per_deployment(steps, model, gpu, tp, coeffs, one)
    comp = [c for c in df.columns if c.endswith("_us") and c not in ("predicted_us", "measured_us")]
    df[comp] = df[comp].fillna(0.0)
    front = [c for c in ("step", "phase", "model", "gpu", "tp", "measured_us", "predicted_us")
             if c in df.columns]
    return df[front + sorted(comp) + ["flops", "bytes"]].reset_index(drop=True)

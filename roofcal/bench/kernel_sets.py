"""Kernel sets side by side (``roofcal bench``): how one GPU's kernels changed between two kernel
libraries (vLLM 0.14 and 0.24 on H100) and how well each set is calibrated.

Per kernel kind/variant:

* **measured ratio**: newer / older latency on the shapes both sets measured (inner join on the
  shape columns; median and the 10th–90th percentiles) — what the library change did;
* **held-out MAPE** of each set's own fit on its held-out rows (the coefficient file's metrics);
* **older coefficients on the newer rows**: the MAPE on every row of the newer set predicted with
  the older set's corrections — the error of calibrating on one library and serving another.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from roofcal.physics.kernels import OPTIONAL_COLUMNS, SHAPE_COLUMNS


def measured_ratios(table: pd.DataFrame, older: str, newer: str) -> dict:
    """{kind/variant: (median, p10, p90, n)} of newer / older latency on the shapes both kernel
    sets of a per-op table measured (repeated shapes: their median first)."""
    out = {}
    for (op, dt), g in table[table["kernels"].isin([older, newer])].groupby(["op", "dtype"]):
        cols = [c for c in SHAPE_COLUMNS[op] + OPTIONAL_COLUMNS.get(op, ()) if c in g.columns]
        per = g.groupby(["kernels"] + cols, dropna=False)["latency_us"].median().reset_index()
        a = per[per["kernels"] == older].drop(columns="kernels")
        b = per[per["kernels"] == newer].drop(columns="kernels")
        j = a.merge(b, on=cols, suffixes=("_old", "_new"))
        if not len(j):
            continue
        r = (j["latency_us_new"] / j["latency_us_old"]).to_numpy()
        out[f"{op}/{dt}"] = (float(np.median(r)), float(np.quantile(r, 0.1)),
                             float(np.quantile(r, 0.9)), int(len(r)))
    return out


def cross_mape(table: pd.DataFrame, coeffs, rows_of: str, with_set: str, gpu) -> dict:
    """{kind/variant: MAPE %} of every row of kernel set ``rows_of`` predicted with the
    coefficient file's set ``with_set``."""
    from roofcal.metrics import mape
    from roofcal.model import correction as K
    from roofcal.model.coeffs import with_kernels
    from roofcal.model.predict import predict_table
    from roofcal.physics.kernels import groups
    rows = table[table["kernels"] == rows_of].reset_index(drop=True)
    pred = predict_table(rows, with_kernels(coeffs, with_set).params, gpu)
    return {K.op_key(op, dt): mape(pred["predicted_us"].values[idx], pred["latency_us"].values[idx])
            for _, op, dt, idx in groups(pred)}


def comparison(coeffs, table: pd.DataFrame, gpu, older: str, newer: str) -> list[dict]:
    """One row per kind/variant of either set: the measured ratio, each set's held-out MAPE,
    the older corrections on the newer rows, and which set borrowed the kernel."""
    ratios = measured_ratios(table, older, newer)
    cross = cross_mape(table, coeffs, newer, older, gpu)
    held = {s: coeffs.kernel_sets[s].metrics.get("heldout", {}) for s in (older, newer)}
    keys = sorted(set(held[older]) | set(held[newer]))
    rows = []
    for key in keys:
        med = ratios.get(key)
        borrowed = coeffs.kernel_sets[newer].borrowed.get(key)
        rows.append({
            "kernel": key,
            f"{newer} / {older} measured": (f"{med[0]:.2f} ({med[1]:.2f}–{med[2]:.2f}, n {med[3]:,})"
                                            if med else "no shared shapes"),
            f"held-out MAPE % {older}": held[older].get(key, {}).get("mape"),
            f"held-out MAPE % {newer}": (held[newer].get(key, {}).get("mape") if not borrowed
                                         else f"borrowed from {borrowed}"),
            f"{older} coefficients on {newer} rows, MAPE %": cross.get(key),
        })
    return rows


def report(coeffs, table: pd.DataFrame, gpu) -> list[tuple[str, str]]:
    """(title, Markdown) of :func:`comparison` for the two newest kernel sets of ``coeffs``
    (nothing when it has one)."""
    from roofcal.measurements.ops import kernel_set_order
    from roofcal.tables import table as md
    names = sorted(coeffs.kernel_sets, key=kernel_set_order)
    if len(names) < 2:
        return []
    older, newer = names[-2], names[-1]
    rows = comparison(coeffs, table, gpu, older, newer)
    cols = list(rows[0]) if rows else []
    return [(f"Kernel sets on {gpu.name}: {newer} against {older} (per kind/variant; measured ratio "
             "median with 10th–90th percentiles over the shapes both measured)", md(rows, cols))]

"""Residual inspection: which component and which regime a model's error comes from.

A *residual table* has one row per measurement — a kernel call of a per-op table (``kind`` =
``kernel``) or a whole step (``kind`` = ``step``) — with the measured and predicted time (µs), the
signed relative error ``predicted / measured − 1``, and the predicted time of every component in
``comp_<name>_us`` columns, which sum to the prediction:

* kernel rows: ``comp_latency_us`` (fixed cost of the call), ``comp_compute_us`` and
  ``comp_memory_us``: the corrected times ``tc / eff_c`` and ``tm / eff_m`` after the soft max
  ``smax_q``, split in proportion to their q-th powers, each times ``shape_factor``, the measured
  shape's curve (1 without one: :mod:`roofcal.model.curves`) (latency + compute + memory =
  prediction);
* step rows: the breakdown of :func:`roofcal.model.step_breakdown` (one column per kernel of the
  step, and ``overhead``), or with BLIS coefficients BLIS's terms β·basis (:data:`BLIS_TERMS`).

Every row carries its regime: ``phase`` (prefill / decode / mixed; attention kernels too),
``batch`` (sequences; tokens ``m`` for GEMM and MoE kernels) and ``context`` (mean KV length per
sequence) with their buckets, ``bound`` (compute- or memory-bound at roofline), model / TP / GPU.

:func:`error_table` summarises MAPE, bias and percentiles of |relative error| per group, sorted by
each group's share of the squared log error (the fitting loss, :mod:`roofcal.loss`).
:mod:`roofcal.attribution` finds, per regime, the component whose scaling would remove most of
the error; :mod:`roofcal.inspection.blis_residuals` builds step rows from BLIS-form coefficients;
:mod:`roofcal.inspection.report` ties them together and writes the report (``roofcal residuals``).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from roofcal.model import correction as K
from roofcal.errors import RoofcalError
from roofcal.physics.hardware import GPUSpec, load_gpu
from roofcal.metrics import error_summary
from roofcal.model import curves
from roofcal.model.combine import padded, padded_size
from roofcal.model.predict import row_times

KERNEL, STEP = "kernel", "step"
#: components of a kernel row, in order
OP_COMPONENTS = ("latency", "compute", "memory")
#: lower edges of the batch buckets (sequences, or tokens for GEMM / MoE kernels)
BATCH_EDGES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
#: lower edges of the context buckets (tokens; buckets are [low, high))
CONTEXT_EDGES = (0, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
#: error statistics of :func:`error_table`, in order
STAT_COLUMNS = ("n", "MAPE %", "bias %", "p50 %", "p90 %", "p99 %", "loss share %")


# --------------------------------------------------------------------------------------------
# regimes

def bucket_index(x, edges) -> np.ndarray:
    """Index of the bucket [edges[i], edges[i+1]) holding each value; -1 below or for NaN."""
    x = np.asarray(x, np.float64)
    idx = np.searchsorted(np.asarray(edges, np.float64), x, side="right") - 1
    return np.where(np.isfinite(x), idx, -1)


def _kilo(v: int) -> str:
    return f"{v // 1024}K" if v >= 1024 and v % 1024 == 0 else str(v)


def batch_labels() -> list[str]:
    """Batch bucket labels (inclusive integer ranges): ``1``, ``2–3``, …, ``≥256``."""
    e = BATCH_EDGES
    out = [str(a) if b - a == 1 else f"{a}–{b - 1}" for a, b in zip(e, e[1:])]
    return out + [f"≥{e[-1]}"]


def context_labels() -> list[str]:
    """Context bucket labels ([low, high) token ranges): ``<256``, ``256–512``, …, ``≥32K``."""
    e = CONTEXT_EDGES
    out = [f"<{e[1]}"] + [f"{_kilo(a)}–{_kilo(b)}" for a, b in zip(e[1:], e[2:])]
    return out + [f"≥{_kilo(e[-1])}"]


def bucket_labels(x, edges, labels) -> np.ndarray:
    """Bucket label of each value (object array; None for NaN or out of range)."""
    idx = bucket_index(x, edges)
    lab = np.array(list(labels) + [None], dtype=object)
    return lab[np.where(idx >= 0, idx, len(labels))]


def add_buckets(df: pd.DataFrame) -> pd.DataFrame:
    """Add ``batch_bucket`` and ``context_bucket`` (strings, empty where not applicable)."""
    df = df.copy()
    df["batch_bucket"] = bucket_labels(df["batch"], BATCH_EDGES, batch_labels())
    df["context_bucket"] = bucket_labels(df["context"], CONTEXT_EDGES, context_labels())
    return df


# --------------------------------------------------------------------------------------------
# kernel rows

def smax_split(a, b, q):
    """(share of a, share of b) of ``smax_q(a, b) = (a^q + b^q)^(1/q)``: proportional to a^q, b^q.

    Times in µs (float64); shares sum to smax. Zero work gives zero shares.
    """
    a, b, q = (np.asarray(x, np.float64) for x in (a, b, q))
    mx = np.maximum(np.maximum(a, b), 1e-300)
    wa, wb = (a / mx) ** q, (b / mx) ** q
    s = mx * (wa + wb) ** (1.0 / q)
    tot = np.maximum(wa + wb, 1e-300)
    return s * wa / tot, s * wb / tot


def number_text(v) -> np.ndarray:
    """Values as short strings (integers without a decimal point), vectorised."""
    v = np.asarray(v, np.float64)
    if np.all(np.isfinite(v) & (v == np.round(v))):
        return v.astype(np.int64).astype(str).astype(object)
    return np.char.mod("%g", v).astype(object)


def _shape_text(df: pd.DataFrame, op: str, idx: np.ndarray) -> np.ndarray:
    """``m=1 n=4096 k=8192`` for the rows ``idx`` of one op."""
    from roofcal.physics.kernels import OPTIONAL_COLUMNS, SHAPE_COLUMNS
    cols = [c for c in SHAPE_COLUMNS[op] + OPTIONAL_COLUMNS.get(op, ()) if c in df.columns]
    text = np.full(len(idx), "", dtype=object)
    for i, c in enumerate(cols):
        text = text + ((" " if i else "") + c + "=") + number_text(df[c].values[idx])
    return text


def kernel_regimes(op: str, df: pd.DataFrame, idx: np.ndarray) -> dict:
    """Per-row phase, batch, context and TP of kernel rows ``idx`` of one op (see module doc)."""
    col = lambda c: df[c].to_numpy(np.float64)[idx] if c in df.columns else np.full(len(idx), np.nan)
    nan = np.full(len(idx), np.nan)
    batch = {"gemm": col("m"), "attn_prefill": col("batch"), "attn_decode": col("batch"),
             "moe": col("tokens")}.get(op, nan)
    context = {"attn_prefill": col("seq") + col("cached"), "attn_decode": col("context")}.get(op, nan)
    tp = {"moe": col("tp"), "allreduce": col("num_gpus")}.get(op, nan)   # (the other collectives
    # are a data- or expert-parallel group's, not TP's)
    phase = {"attn_prefill": "prefill", "attn_decode": "decode"}.get(op)
    return {"phase": np.full(len(idx), phase, dtype=object), "batch": batch, "context": context,
            "tp": tp}


def kernel_parts(gpu: GPUSpec, op: str, dtype: str, table: pd.DataFrame, idx: np.ndarray, p: dict):
    """(ideal compute µs, ideal memory µs on the table's warm L2, compute efficiency, memory
    efficiency) of rows ``idx``, float64 numpy."""
    from roofcal.model.predict import warm_share
    tc, tm, z = row_times(gpu, op, dtype, table, idx)
    if op in K.CACHED_KINDS:
        tm = K.warm_memory_time(p, tm, warm_share(gpu, op, dtype, tm))
    ec, em = K.efficiencies_z(p, z)
    return [np.asarray(x, np.float64) for x in (tc, tm, ec, em)]


def kernel_residuals(table: pd.DataFrame, params: dict, gpu: GPUSpec) -> pd.DataFrame:
    """One row per per-op measurement (all rows for ``gpu``): components, regimes and errors.

    Kernel kinds are evaluated group by group (GPU, op, dtype), each vectorised over its rows.
    """
    from roofcal.physics.kernels import groups
    table = table.reset_index(drop=True)
    parts = []
    for g, op, dt, idx in groups(table):
        if g != gpu.name:
            raise RoofcalError(f"{table['source'].iloc[idx[0]]}: rows are for GPU '{g}' but the "
                               f"coefficients are for '{gpu.name}'")
        _, p = K.lookup(params["ops"], op, dt)
        tc, tm, ec, em = kernel_parts(gpu, op, dt, table, idx, p)
        # a measured shape's curve scales the whole kernel time (model/curves.py), so each part
        shape, _ = curves.row_factors(p.get("curves"), op, table.iloc[idx])
        lat = math.exp(float(p["latency"])) * shape
        q = 1.0 + float(np.logaddexp(0.0, float(p["sharpness"])))
        active = tc + tm > 0
        comp, mem = smax_split(tc / ec, tm / em, q)
        comp, mem = comp * shape, mem * shape
        part = pd.DataFrame({"row": idx, "key": K.op_key(op, dt), "op": op, "dtype": dt,
                             "shape": _shape_text(table, op, idx),
                             "bound": np.where(tc >= tm, "compute", "memory"),
                             "work_us": np.maximum(tc, tm),
                             "comp_latency_us": np.where(active, lat, 0.0),
                             "comp_compute_us": np.where(active, comp, 0.0),
                             "comp_memory_us": np.where(active, mem, 0.0),
                             "ideal_compute_us": tc, "ideal_memory_us": tm,
                             "compute_efficiency": ec, "memory_efficiency": em,
                             "sharpness": q, "shape_factor": shape, **kernel_regimes(op, table, idx)})
        parts.append(part)
    out = pd.concat(parts, ignore_index=True).sort_values("row", kind="stable")
    out["kind"], out["gpu"], out["model"] = KERNEL, gpu.name, None
    out["source"] = table["source"].to_numpy()[out["row"].to_numpy()]
    out["config"] = None
    out["measured_us"] = table["latency_us"].to_numpy(np.float64)[out["row"].to_numpy()]
    out["predicted_us"] = out[["comp_latency_us", "comp_compute_us", "comp_memory_us"]].sum(axis=1)
    return out.drop(columns="row").reset_index(drop=True)


# --------------------------------------------------------------------------------------------
# step rows

def step_context(d) -> np.ndarray:
    """Mean context (KV tokens after the step) per sequence of each step of a StepData."""
    b = d.batch
    pf = (b.prefill_mask * (b.prefill_cached + b.prefill_new)).sum(1)
    dc = (b.decode_mask * b.decode_ctx).sum(1)
    n = b.prefill_mask.sum(1) + b.decode_mask.sum(1)
    return np.where(n > 0, (pf + dc) / np.maximum(n, 1), np.nan)


def _step_frame(d, comps: dict, work_us, bound) -> pd.DataFrame:
    desc = d.describe()
    df = pd.DataFrame({
        "kind": STEP, "key": "steps/" + desc["phase"].astype(str), "source": d.source,
        "gpu": d.gpu, "model": d.model.name, "tp": float(d.tp), "op": None, "dtype": None,
        "phase": desc["phase"].to_numpy(object), "config": desc["config"].to_numpy(object),
        "batch": desc["batch_size"].to_numpy(np.float64), "context": step_context(d),
        "bound": bound, "work_us": np.asarray(work_us, np.float64),
        "measured_us": np.asarray(d.measured_us, np.float64)})
    df["shape"] = (df["phase"] + " batch=" + number_text(df["batch"]) + " new="
                   + number_text(desc["prefill_tokens"]) + " ctx="
                   + number_text(np.round(df["context"].fillna(0.0))))
    for name, v in comps.items():
        df[f"comp_{name}_us"] = np.asarray(v, np.float64)
    cols = [c for c in df.columns if c.startswith("comp_")]
    df["predicted_us"] = df[cols].sum(axis=1)
    return df


def pad_batch(b):
    """A StepBatch padded with empty steps to :func:`padded_size` rows and power-of-two widths
    (so compiled programs are reused); per-step results of the real rows are unchanged."""
    return padded(b, 256, 1, 1)


def step_residuals(steps: list, params: dict) -> pd.DataFrame:
    """One row per measured step: the components of :func:`roofcal.model.step_breakdown`."""
    from roofcal.model.combine import NON_COMPONENT, step_breakdown
    frames = []
    for d in steps:
        gpu = load_gpu(d.gpu)
        out = {k: np.asarray(v) for k, v in step_breakdown(params, d.model, gpu, d.tp, d.batch).items()}
        comps = {k: v for k, v in out.items() if k not in NON_COMPONENT}
        tc = np.asarray(out["ideal_compute"], np.float64)
        tm = np.asarray(out["ideal_memory"], np.float64)
        df = _step_frame(d, comps, np.maximum(tc, tm), np.where(tc >= tm, "compute", "memory"))
        df["flops"], df["bytes"] = np.asarray(out["flops"], np.float64), np.asarray(out["bytes"], np.float64)
        frames.append(df)
    return _concat(frames)


def _concat(frames: list) -> pd.DataFrame:
    if not frames:
        return pd.DataFrame()
    df = pd.concat(frames, ignore_index=True)
    comp = [c for c in df.columns if c.startswith("comp_")]
    df[comp] = df[comp].fillna(0.0)
    return df


# --------------------------------------------------------------------------------------------
# the residual table

FRONT = ("kind", "key", "source", "gpu", "model", "tp", "op", "dtype", "phase", "shape", "config",
         "batch", "context", "batch_bucket", "context_bucket", "bound", "work_us", "measured_us",
         "predicted_us", "rel_error", "log_ratio")
EXTRA = ("ideal_compute_us", "ideal_memory_us", "compute_efficiency", "memory_efficiency",
         "sharpness", "shape_factor", "flops", "bytes")


def finish_table(frames: list) -> pd.DataFrame:
    """Concatenate kernel and step rows: errors, buckets, and columns in a fixed order."""
    frames = [f for f in frames if len(f)]
    if not frames:
        raise RoofcalError("no measurements to inspect")
    df = _concat(frames)
    df["rel_error"] = df["predicted_us"] / df["measured_us"] - 1.0
    df["log_ratio"] = np.log(df["predicted_us"] / df["measured_us"])
    df = add_buckets(df)
    comp = [c for c in df.columns if c.startswith("comp_")]
    extra = [c for c in EXTRA if c in df.columns]
    return df[list(FRONT) + comp + extra].reset_index(drop=True)


def components(df: pd.DataFrame, kind: str | None = None) -> list[str]:
    """Component names (without ``comp_`` / ``_us``) present (non-zero) in rows of ``kind``."""
    rows = df if kind is None else df[df["kind"] == kind]
    return [c[5:-3] for c in df.columns if c.startswith("comp_") and (rows[c] != 0).any()]


# --------------------------------------------------------------------------------------------
# error summaries

def _labels(df: pd.DataFrame, cols) -> pd.Series:
    """One string label per row from ``cols`` (None where any is missing)."""
    if not cols:
        return pd.Series("all", index=df.index, dtype=object)
    out = None
    for c in cols:
        v = df[c]
        s = v.map(lambda x: "{:g}".format(x) if isinstance(x, float) else str(x)).astype(object)
        s[v.isna()] = None
        out = s if out is None else out.str.cat(s, sep=" | ")
    return out


def error_table(df: pd.DataFrame, by, fill: bool = False) -> pd.DataFrame:
    """Error statistics (%) per (kind, *by) group, by :func:`roofcal.loss.error_summary`.

    ``loss share %`` is the group's Σ log(pred/measured)² over the total of its kind. Rows whose
    ``by`` values are missing are left out, or with ``fill`` grouped under ``—``. Sorted by kind
    (steps first), then loss share.
    """
    by = list(by)
    rows = []
    total = df.groupby("kind")["log_ratio"].apply(lambda s: float(np.sum(s.to_numpy() ** 2)))
    if fill and by:
        df = df.copy()
        for c in by:
            df[c] = _labels(df, [c]).fillna("—")
    keep = df.dropna(subset=by) if by else df
    for key, g in keep.groupby(["kind"] + by, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        s = error_summary(g["predicted_us"], g["measured_us"])
        loss = float(np.sum(g["log_ratio"].to_numpy() ** 2))
        tot = total[key[0]]
        rows.append({"kind": key[0], **dict(zip(by, key[1:])), "n": s["n"], "MAPE %": s["mape"],
                     "bias %": s["bias"], "p50 %": s["p50"], "p90 %": s["p90"],
                     "p99 %": s["p99"], "loss share %": 100.0 * loss / tot if tot > 0 else 0.0})
    out = pd.DataFrame(rows, columns=["kind"] + by + list(STAT_COLUMNS))
    if out.empty:
        return out
    out["_k"] = (out["kind"] != STEP).astype(int)
    out = out.sort_values(["_k", "loss share %"] + by, ascending=[True, False] + [True] * len(by),
                          kind="stable")
    return out.drop(columns="_k").reset_index(drop=True)


# --------------------------------------------------------------------------------------------
# worst rows

def breakdown_text(row: pd.Series, names: list[str], top: int = 4) -> str:
    """``compute 61% · memory 30% · latency 9%`` (largest first, shares of the prediction)."""
    v = sorted(((row[f"comp_{n}_us"], n) for n in names if row[f"comp_{n}_us"] > 0), reverse=True)
    parts = [f"{n} {100.0 * t / row['predicted_us']:.0f}%" for t, n in v[:top]]
    return " · ".join(parts)


def worst_rows(df: pd.DataFrame, kind: str, n: int = 20) -> pd.DataFrame:
    """The ``n`` rows of ``kind`` with the largest |log(pred/measured)|, with their breakdown."""
    rows = df[df["kind"] == kind]
    order = np.argsort(-np.abs(rows["log_ratio"].to_numpy()), kind="stable")[:n]
    rows = rows.iloc[order]
    names = components(df, kind)
    return pd.DataFrame({"rank": np.arange(1, len(rows) + 1), "key": rows["key"].to_numpy(),
                         "shape": rows["shape"].to_numpy(),
                         "measured µs": rows["measured_us"].to_numpy(),
                         "predicted µs": rows["predicted_us"].to_numpy(),
                         "error %": 100.0 * rows["rel_error"].to_numpy(),
                         "breakdown": [breakdown_text(r, names) for _, r in rows.iterrows()]})

"""Residual inspection: which component and which regime a model's error comes from.

A *residual table* has one row per measurement — a kernel call of a per-op table (``kind`` =
``kernel``) or a whole step (``kind`` = ``step``) — with the measured and predicted time (µs), the
signed relative error ``predicted / measured − 1``, and the predicted time of every component in
``comp_<name>_us`` columns, which sum to the prediction:

* kernel rows: ``comp_latency_us`` (fixed cost of the call), ``comp_compute_us`` and
  ``comp_memory_us``: the corrected times ``tc / eff_c`` and ``tm / eff_m`` after the soft max
  ``smax_q``, split in proportion to their q-th powers (latency + compute + memory = prediction);
* step rows: the breakdown of :func:`roofcal.model.step_breakdown` (one column per kernel of the
  step, and ``overhead``), or with BLIS coefficients BLIS's terms β·basis (:data:`BLIS_TERMS`).

Every row carries its regime: ``phase`` (prefill / decode / mixed; attention kernels too),
``batch`` (sequences; tokens ``m`` for GEMM and MoE kernels) and ``context`` (mean KV length per
sequence) with their buckets, ``bound`` (compute- or memory-bound at roofline), model / TP / GPU.

:func:`error_table` summarises MAPE, bias and percentiles of |relative error| per group, sorted by
each group's share of the squared log error (the fitting loss, :mod:`roofcal.loss`).
:func:`attribution` asks, for each regime, which component's time scaled by a factor ``s`` would
remove most of that loss: ∂loss/∂log s at s = 1 by ``jax.grad``, then the 1-D optimal ``s`` (a grid
over 1/64…64, refined by Newton steps with JAX derivatives) and the fraction of the regime's loss
it removes. :func:`residuals` ties it together and writes the report (``roofcal residuals``).
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

from . import correction as K
from .errors import RoofcalError
from .hardware import GPUSpec, load_gpu
from .loss import error_summary

KERNEL, STEP = "kernel", "step"
#: components of a kernel row, in order
OP_COMPONENTS = ("latency", "compute", "memory")
#: lower edges of the batch buckets (sequences, or tokens for GEMM / MoE kernels)
BATCH_EDGES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
#: lower edges of the context buckets (tokens; buckets are [low, high))
CONTEXT_EDGES = (0, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
#: error statistics of :func:`error_table`, in order
STAT_COLUMNS = ("n", "MAPE %", "bias %", "p50 %", "p90 %", "p99 %", "loss share %")
#: attribution regimes: columns whose values define a regime, per kind of row
KERNEL_LEVELS = (("key",), ("key", "bound"), ("key", "batch_bucket"), ("key", "context_bucket"))
STEP_LEVELS = ((), ("phase",), ("phase", "batch_bucket"), ("phase", "context_bucket"),
               ("model", "tp", "phase"))
#: 1-D scale search: log-spaced grid over [1/64, 64], then Newton steps
SCALE_RANGE = 64.0
GRID_POINTS = 25
NEWTON_STEPS = 6
#: a regime whose mean squared log error is below this (|error| ≲ 0.001%) has nothing to attribute
NOISE_LOSS = 1e-10

# BLIS's trained-physics terms: (component, β symbol, index in the effective 11-β vector, basis term)
BLIS_TERMS = (
    ("pf_compute", "β1a", 0, "t_pf_compute_us"),
    ("pf_kv", "β1b", 8, "t_pf_kv_us"),
    ("dc_compute", "β2a", 1, "t_dc_compute_us"),
    ("dc_kv", "β2b", 9, "t_dc_kv_us"),
    ("weights", "β3", 2, "t_weight_us"),
    ("tp_allreduce", "β4", 3, "t_tp_allreduce_us"),
    ("moe_dispatch", "β_EP", 10, "t_moe_dispatch_us"),
    ("per_layer", "β5", 4, "num_layers"),
    ("per_request", "β6", 5, "batch_size"),
    ("per_step", "β7", 6, "constant"),
    ("moe_layer", "β8", 7, "interleaved_moe_layers"),
)
#: roofcal GPU name → BLIS hardware_config.json entry
BLIS_GPUS = {"h100_sxm": "H100", "a100_sxm": "A100-SXM", "l40s": "L40S"}


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
    from .ops import OPTIONAL_COLUMNS, SHAPE_COLUMNS
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
    tp = {"moe": col("tp"), "allreduce": col("num_gpus")}.get(op, nan)
    phase = {"attn_prefill": "prefill", "attn_decode": "decode"}.get(op)
    return {"phase": np.full(len(idx), phase, dtype=object), "batch": batch, "context": context,
            "tp": tp}


def padded_size(n: int, minimum: int = 256) -> int:
    """Row count rounded up to one of a few sizes (≤ 12.5% padding, ≥ ``minimum``), so compiled
    programs are reused across inputs of similar size."""
    step = max(minimum, 1 << max(0, int(n).bit_length() - 3))
    return -(-max(n, 1) // step) * step


@partial(jax.jit, static_argnames=("op", "dtype", "peak", "bw"))
def _kernel_parts(op: str, dtype: str, cols: dict, p: dict, peak: float, bw: float):
    """(ideal compute µs, ideal memory µs, compute efficiency, memory efficiency) of rows."""
    from .components import ideal_times
    from .ops import row_work
    w = row_work(op, dtype, cols)
    tc, tm = ideal_times(w, peak, bw)
    ec, em = K.efficiencies_z(p, K.standardize(op, w.shape))
    return tc, tm, ec, em


def kernel_parts(gpu: GPUSpec, op: str, dtype: str, table: pd.DataFrame, idx: np.ndarray, p: dict):
    """:func:`_kernel_parts` of rows ``idx`` (float64 numpy), one compiled program per kind."""
    from .model import op_peak_and_bandwidth
    from .ops import OPTIONAL_COLUMNS, SHAPE_COLUMNS
    peak, bw = op_peak_and_bandwidth(gpu, op, dtype)
    n = len(idx)
    pad = padded_size(n) - n
    cols = {c: np.pad(np.asarray(table[c].values[idx], np.float32), (0, pad), constant_values=1.0)
            for c in SHAPE_COLUMNS[op] + OPTIONAL_COLUMNS.get(op, ()) if c in table.columns}
    out = _kernel_parts(op, dtype, cols, p, float(peak), float(bw))
    return [np.asarray(x, np.float64)[:n] for x in out]


def kernel_residuals(table: pd.DataFrame, params: dict, gpu: GPUSpec) -> pd.DataFrame:
    """One row per per-op measurement (all rows for ``gpu``): components, regimes and errors.

    Kernel kinds are evaluated group by group (GPU, op, dtype), each vectorised over its rows.
    """
    from .ops import groups
    table = table.reset_index(drop=True)
    parts = []
    for g, op, dt, idx in groups(table):
        if g != gpu.name:
            raise RoofcalError(f"{table['source'].iloc[idx[0]]}: rows are for GPU '{g}' but the "
                               f"coefficients are for '{gpu.name}'")
        _, p = K.lookup(params["ops"], op, dt)
        tc, tm, ec, em = kernel_parts(gpu, op, dt, table, idx, p)
        lat = math.exp(float(p["latency"]))
        q = 1.0 + float(np.logaddexp(0.0, float(p["sharpness"])))
        active = tc + tm > 0
        comp, mem = smax_split(tc / ec, tm / em, q)
        part = pd.DataFrame({"row": idx, "key": K.op_key(op, dt), "op": op, "dtype": dt,
                             "shape": _shape_text(table, op, idx),
                             "bound": np.where(tc >= tm, "compute", "memory"),
                             "work_us": np.maximum(tc, tm),
                             "comp_latency_us": np.where(active, lat, 0.0),
                             "comp_compute_us": np.where(active, comp, 0.0),
                             "comp_memory_us": np.where(active, mem, 0.0),
                             "ideal_compute_us": tc, "ideal_memory_us": tm,
                             "compute_efficiency": ec, "memory_efficiency": em,
                             "sharpness": q, **kernel_regimes(op, table, idx)})
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
    from .steps import StepBatch
    S = b.prefill_new.shape[0]
    rows = padded_size(S) - S
    width = lambda w: 1 << max(0, int(w - 1).bit_length())
    P, D = width(b.prefill_new.shape[1]), width(b.decode_ctx.shape[1])
    pad = lambda a, w: np.pad(np.asarray(a, np.float32), ((0, rows), (0, w - a.shape[1])))
    return StepBatch(pad(b.prefill_new, P), pad(b.prefill_cached, P), pad(b.prefill_mask, P),
                     pad(b.decode_ctx, D), pad(b.decode_mask, D))


def step_residuals(steps: list, params: dict) -> pd.DataFrame:
    """One row per measured step: the components of :func:`roofcal.model.step_breakdown`."""
    from .model import step_breakdown
    frames = []
    for d in steps:
        gpu = load_gpu(d.gpu)
        out = step_breakdown(params, d.model, gpu, d.tp, pad_batch(d.batch))
        out = {k: np.asarray(v)[: len(d)] for k, v in out.items()}
        comps = {k: v for k, v in out.items() if k not in ("total", "flops", "bytes")}
        tc = np.asarray(out["flops"], np.float64) / gpu.peak_flops_per_us(d.model.weight_dtype)
        tm = np.asarray(out["bytes"], np.float64) / gpu.hbm_bytes_per_us
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
# BLIS coefficients

@dataclass(frozen=True)
class BlisCoeffs:
    """BLIS trained-physics coefficients: α (µs, request-level: they do not enter step time), β,
    and the BLIS hardware entry they were fitted with (None: use the GPU's bundled entry)."""

    alpha: tuple
    beta: tuple
    source: str
    hardware: object = None           # roofcal.blis.basis.BlisHardware
    hardware_name: str = ""


def _find_beta_block(doc, depth: int = 0):
    if not isinstance(doc, dict) or depth > 3:
        return None
    if "trained_physics_coefficients" in doc:
        return doc["trained_physics_coefficients"], "trained_physics_coefficients."
    if "beta_coeffs" in doc or "beta" in doc:
        return doc, ""
    for k in sorted(doc, key=str):
        found = _find_beta_block(doc[k], depth + 1)
        if found is not None:
            return found[0], f"{k}." + found[1]
    return None


def _blis_form(doc, path: Path):
    """A ``roofcal-blis/1`` file through :mod:`roofcal.blis.export`'s validator, when present."""
    try:
        from .blis.export import form_from_dict
    except ImportError:
        return None
    from .blis.basis import BlisHardware
    from .resources import display
    f = form_from_dict(doc, str(path))
    return BlisCoeffs(tuple(f.alpha), tuple(f.beta), display(path),
                      BlisHardware.from_dict(f.hardware_calib, f"{path}: hardware"), f.hardware)


def read_blis_coeffs(path) -> BlisCoeffs:
    """α/β from a BLIS ``defaults.yaml`` (its ``trained_physics_coefficients`` block), a
    BLIS-form file (``roofcal blis fit``; its ``hardware`` entry is used for the basis), or any
    YAML holding ``beta_coeffs`` / ``beta`` (and optionally ``alpha_coeffs`` / ``alpha``) at a
    depth ≤ 3."""
    from .blis.basis import BlisHardware, validate_blis_coeffs
    from .io import read_yaml
    from .resources import display
    path = Path(path)
    doc = read_yaml(path, "BLIS coefficient file")
    if isinstance(doc, dict) and doc.get("schema") == "roofcal-blis/1":
        form = _blis_form(doc, path)
        if form is not None:
            return form
    found = _find_beta_block(doc)
    if found is None or not isinstance(found[0], dict):
        raise RoofcalError(f"{path}: field 'trained_physics_coefficients.beta_coeffs' is missing")
    block, where = found
    beta = block.get("beta_coeffs", block.get("beta"))
    alpha = block.get("alpha_coeffs", block.get("alpha", [0.0, 0.0, 0.0]))
    for name, v in (("beta_coeffs", beta), ("alpha_coeffs", alpha)):
        if not isinstance(v, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                              for x in v):
            raise RoofcalError(f"{path}: field '{where}{name}' must be a list of numbers")
    try:
        validate_blis_coeffs(alpha, beta)
    except RoofcalError as e:
        raise RoofcalError(f"{path}: field '{where}': {e}")
    hw, name = None, ""
    if isinstance(block.get("hardware"), dict) and "TFlopsPeak" in block["hardware"]:
        name = str(block["hardware"].get("name", ""))
        hw = BlisHardware.from_dict(block["hardware"], f"{path}: field '{where}hardware'")
    return BlisCoeffs(tuple(float(a) for a in alpha), tuple(float(b) for b in beta), display(path),
                      hw, name)


def blis_hardware(gpu: GPUSpec):
    """BLIS's hardware entry for ``gpu`` (data/blis/hardware_config.json), else its datasheet."""
    import json
    from . import resources
    from .blis.basis import BlisHardware
    name = BLIS_GPUS.get(gpu.name)
    path = resources.BLIS / "hardware_config.json"
    if name and path.is_file():
        table = json.loads(path.read_text(encoding="utf-8"))
        if name in table:
            return BlisHardware.from_dict(table[name], f"{resources.display(path)}: {name}")
    return BlisHardware(tflops_peak=gpu.bf16_tflops, bw_peak_tbs=gpu.hbm_bandwidth_tbs,
                        tflops_fp8=gpu.fp8_tflops)


def blis_requests(b):
    """A roofcal StepBatch as BLIS requests (masks are multiplicities; vectorised, no row loop).

    Prefill chunk [new, cached] → input_len = cached + new, progress_index = cached,
    num_new_tokens = new, num_output_tokens = 0; decode at context c → input_len = progress_index
    = c, num_new_tokens = num_output_tokens = 1. Arrays are float64 (a splitwise mean decode step
    sits at a fractional context; BLIS's basis is linear in it).
    """
    from .blis.basis import BlisBatch
    pm, dm = np.rint(b.prefill_mask).astype(np.int64), np.rint(b.decode_mask).astype(np.int64)
    new, cached, ctx = (np.asarray(a, np.float64) for a in (b.prefill_new, b.prefill_cached, b.decode_ctx))
    counts = np.concatenate([pm, dm], 1)
    one, zero = np.ones_like(ctx), np.zeros_like(ctx)
    vals = {"input_len": np.concatenate([cached + new, ctx], 1),
            "progress_index": np.concatenate([cached, ctx], 1),
            "num_new_tokens": np.concatenate([new, one], 1),
            "num_output_tokens": np.concatenate([np.zeros_like(new), one + zero], 1)}
    S, E = counts.shape
    per_step = counts.sum(1)
    width = 1 << max(0, int(max(int(per_step.max()) if S else 0, 1) - 1).bit_length())
    flat = counts.ravel()
    entry = np.repeat(np.arange(S * E), flat)
    step = entry // E
    start = np.concatenate([[0], np.cumsum(per_step)[:-1]])
    pos = np.arange(len(entry)) - start[step]
    out = {}
    for k, v in vals.items():
        a = np.zeros((S, width))
        a[step, pos] = v.ravel()[entry]
        out[k] = a
    mask = np.zeros((S, width), bool)
    mask[step, pos] = True
    return BlisBatch(mask=mask, **out)


def blis_components(basis: dict, beta) -> dict:
    """BLIS's step time split into its terms β·basis (µs per step); they sum to
    :func:`roofcal.blis.basis.blis_step_time_float`. Without the split forms (< 9 / < 10 β) the
    prefill / decode term is β·max(compute, kv), reported under ``pf_compute`` / ``dc_compute``."""
    from .blis.basis import effective_beta
    eff = effective_beta(beta)
    B = np.asarray(eff.beta, np.float64)
    v = {t: np.asarray(basis[t], np.float64) for _, _, _, t in BLIS_TERMS}
    out = {name: B[i] * v[t] for name, _, i, t in BLIS_TERMS}
    if not eff.prefill_split:
        out["pf_compute"] = B[0] * np.maximum(v["t_pf_compute_us"], v["t_pf_kv_us"])
        out["pf_kv"] = 0.0 * out["pf_kv"]
    if not eff.decode_split:
        out["dc_compute"] = B[1] * np.maximum(v["t_dc_compute_us"], v["t_dc_kv_us"])
        out["dc_kv"] = 0.0 * out["dc_kv"]
    return out


def blis_step_residuals(steps: list, coeffs: BlisCoeffs) -> pd.DataFrame:
    """One row per measured step, predicted by BLIS's trained-physics formula with ``coeffs``.

    ``work_us`` is BLIS's unscaled roofline: max(compute terms, KV + weight terms) + all-reduce.
    """
    from .blis.basis import blis_basis
    from .blis.config import load_blis_model
    from .config import resolve_config_path
    frames = []
    for d in steps:
        model = load_blis_model(resolve_config_path(d.model.name), d.model.name)
        hw = coeffs.hardware if coeffs.hardware is not None else blis_hardware(load_gpu(d.gpu))
        basis = blis_basis(model, hw, d.tp, 1, "", blis_requests(pad_batch(d.batch)))
        v = {k: np.asarray(x, np.float64)[: len(d)] for k, x in basis.items()}
        tc = v["t_pf_compute_us"] + v["t_dc_compute_us"]
        tm = v["t_pf_kv_us"] + v["t_dc_kv_us"] + v["t_weight_us"]
        work = np.maximum(tc, tm) + v["t_tp_allreduce_us"] + v["t_moe_dispatch_us"]
        frames.append(_step_frame(d, blis_components(v, coeffs.beta), work,
                                  np.where(tc >= tm, "compute", "memory")))
    return _concat(frames)


# --------------------------------------------------------------------------------------------
# the residual table

FRONT = ("kind", "key", "source", "gpu", "model", "tp", "op", "dtype", "phase", "shape", "config",
         "batch", "context", "batch_bucket", "context_bucket", "bound", "work_us", "measured_us",
         "predicted_us", "rel_error", "log_ratio")
EXTRA = ("ideal_compute_us", "ideal_memory_us", "compute_efficiency", "memory_efficiency",
         "sharpness", "flops", "bytes")


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
# attribution: JAX on per-component scales

def _pred_linear(inputs, S):
    """Steps: prediction with candidate j's components scaled by S[:, j] (µs, shape (R, J))."""
    base, X = inputs
    return base[:, None] + (S - 1.0) * X


def _pred_kernel(inputs, S):
    """Kernels: latency, compute or memory time (candidate 0, 1, 2) scaled by S[:, j]."""
    lat, a, b, q = inputs
    return jnp.stack([S[:, 0] * lat + K.smax(a, b, q),
                      lat + K.smax(S[:, 1] * a, b, q),
                      lat + K.smax(a, S[:, 2] * b, q)], axis=1)


def _seg_loss(u, seg, logy, counts, inputs, n_seg, kernel):
    """Mean squared log-ratio per (segment, candidate) with candidate j of segment g scaled by
    exp(u[g, j]); shape (G, J)."""
    S = jnp.exp(u)[seg]
    pred = (_pred_kernel if kernel else _pred_linear)(inputs, S)
    r = (jnp.log(jnp.maximum(pred, 1e-30)) - logy[:, None]) ** 2
    return jax.ops.segment_sum(r, seg, n_seg) / counts[:, None]


def _seg_mape(u, seg, logy, counts, inputs, n_seg, kernel):
    S = jnp.exp(u)[seg]
    pred = (_pred_kernel if kernel else _pred_linear)(inputs, S)
    r = jnp.abs(pred / jnp.exp(logy)[:, None] - 1.0)
    return jax.ops.segment_sum(r, seg, n_seg) / counts[:, None]


@partial(jax.jit, static_argnames=("n_seg", "n_cand", "kernel"))
def optimal_scales(seg, logy, inputs, n_seg: int, n_cand: int, kernel: bool) -> dict:
    """Per (segment, candidate): loss at scale 1, ∂loss/∂log s at s = 1 (``jax.grad``), the 1-D
    optimal scale in [1/64, 64] and the loss and MAPE (fraction) there. Arrays of shape (G, J).

    The optimum is the best point of a log-spaced grid, refined by safeguarded Newton steps in
    log s (first and second derivatives by forward-mode JAX; a step is kept only if it lowers the
    loss). The losses of different (segment, candidate) entries are independent, so all entries
    are solved at once.
    """
    counts = jnp.maximum(jax.ops.segment_sum(jnp.ones_like(logy), seg, n_seg), 1.0)
    loss = lambda u: _seg_loss(u, seg, logy, counts, inputs, n_seg, kernel)
    zero = jnp.zeros((n_seg, n_cand), logy.dtype)
    one = jnp.ones_like(zero)
    lim = math.log(SCALE_RANGE)
    grid = jnp.linspace(-lim, lim, GRID_POINTS, dtype=logy.dtype)
    on_grid = jax.lax.map(lambda v: loss(zero + v), grid)   # (K, G, J)
    u = grid[jnp.argmin(on_grid, axis=0)]
    d1 = lambda u: jax.jvp(loss, (u,), (one,))               # separable: tangent of ones = diagonal
    step_max = 2.0 * lim / (GRID_POINTS - 1)

    def newton(_, u):
        (f, g), (_, h) = jax.jvp(d1, (u,), (one,))
        step = jnp.clip(jnp.where(h > 0, -g / jnp.maximum(h, 1e-30), 0.0), -step_max, step_max)
        un = jnp.clip(u + step, -lim, lim)
        return jnp.where(loss(un) < f, un, u)

    u = jax.lax.fori_loop(0, NEWTON_STEPS, newton, u)
    best0 = loss(zero)
    u = jnp.where((loss(u) < best0) & (best0 > NOISE_LOSS), u, 0.0)
    grad = jax.grad(lambda v: jnp.sum(loss(v)))(zero)       # entry (g, j) = ∂L_g/∂log s_j at 1
    mape = lambda v: _seg_mape(v, seg, logy, counts, inputs, n_seg, kernel)
    return {"loss0": best0[:, 0], "grad": grad, "scale": jnp.exp(u), "loss": loss(u),
            "mape0": mape(zero)[:, 0], "mape": mape(u), "n": counts}


def _solve(seg, logy, cols, n_seg: int, n_cand: int, kernel: bool) -> dict:
    """:func:`optimal_scales` on inputs padded to a few sizes (rows, segments, candidates), so one
    compiled program serves many inputs; padding rows sit in a spare segment with zero loss."""
    R = len(seg)
    rows = padded_size(R, 4096) - R
    G = -(-(n_seg + 1) // 64) * 64
    J = n_cand if kernel else -(-n_cand // 8) * 8
    seg = np.concatenate([seg, np.full(rows, G - 1)])
    logy = np.concatenate([logy, np.zeros(rows)])
    if kernel:                                       # latency 1, no work → prediction 1
        fill = (1.0, 0.0, 0.0, 1.0)
        cols = [np.concatenate([c, np.full(rows, f)]) for c, f in zip(cols, fill)]
    else:                                            # base 1, candidates scale nothing
        base, X = cols
        cols = [np.concatenate([base, np.ones(rows)]),
                np.pad(np.concatenate([X, np.zeros((rows, X.shape[1]))]), ((0, 0), (0, J - n_cand)))]
    f32 = lambda a: jnp.asarray(np.asarray(a), jnp.float32)
    r = optimal_scales(jnp.asarray(seg, jnp.int32), f32(logy), tuple(f32(c) for c in cols), G, J,
                       kernel)
    out = {k: np.asarray(v, np.float64)[:n_seg] for k, v in r.items()}
    return {k: v[:, :n_cand] if v.ndim == 2 else v for k, v in out.items()}


def step_candidates(names: list[str], blis: bool) -> list[tuple[str, tuple[str, ...]]]:
    """Scalable candidates of step rows: each component, and each kernel group of
    :data:`roofcal.correction.STEP_SCALES` with ≥ 2 present members (its step-level scale)."""
    out = [(n, (n,)) for n in names]
    if not blis:
        for group, members in K.STEP_SCALES.items():
            present = tuple(m for m in members if m in names)
            if len(present) >= 2:
                out.append((f"{group} (group)", present))
    return out


def _regime_text(kind: str, cols, values) -> str:
    word = {"batch_bucket": "batch {}", "context_bucket": "context {}", "bound": "{}-bound",
            "tp": "TP {}", "model": "{}", "key": "{}", "phase": "{}"}
    if kind == STEP:
        phase = dict(zip(cols, values)).get("phase")
        head = f"{phase} steps" if phase else "all steps"
        rest = [word[c].format(v) for c, v in zip(cols, values) if c != "phase"]
    else:
        head = dict(zip(cols, values))["key"]
        rest = [word[c].format(v) for c, v in zip(cols, values) if c != "key"]
    return ", ".join([head] + rest)


def _level_segments(df: pd.DataFrame, kind: str, levels) -> tuple:
    """Stack every regime level: (row positions, segment ids, regime table). Each row appears once
    per level; rows missing a level's values are left out of it. The deployment level is skipped
    when there is only one deployment."""
    rows, segs, regimes = [], [], []
    for cols in levels:
        cols = list(cols)
        if any(c not in df.columns for c in cols):
            continue
        if "tp" in cols and len(df[["model", "tp"]].drop_duplicates()) <= 1:
            continue
        lab = _labels(df, cols)
        ok = np.flatnonzero(lab.notna().to_numpy())
        if not len(ok):
            continue
        codes, uniq = pd.factorize(lab.iloc[ok], sort=True)
        _, first = np.unique(codes, return_index=True)
        for i in ok[first]:
            vals = [df[c].iloc[i] for c in cols]
            vals = ["{:g}".format(v) if isinstance(v, float) else v for v in vals]
            regimes.append({"level": " × ".join(cols) or "all",
                            "regime": _regime_text(kind, cols, vals)})
        rows.append(ok)
        segs.append(codes + (len(regimes) - len(uniq)))
    if not rows:
        return np.zeros(0, int), np.zeros(0, int), pd.DataFrame(columns=["level", "regime"])
    return np.concatenate(rows), np.concatenate(segs), pd.DataFrame(regimes)


def attribution_inputs(rows: pd.DataFrame, kind: str, names: list, blis: bool) -> tuple:
    """(candidates [(name, members)], model inputs, µs of each candidate per row) for rows of
    one kind. Kernels: (latency, corrected compute time, corrected memory time, sharpness);
    steps: (prediction, candidate times)."""
    if kind == KERNEL:
        cands = [(n, (n,)) for n in OP_COMPONENTS]
        a = rows["ideal_compute_us"] / rows["compute_efficiency"]
        b = rows["ideal_memory_us"] / rows["memory_efficiency"]
        amount = rows[[f"comp_{c}_us" for c in OP_COMPONENTS]].to_numpy()
        return cands, [rows["comp_latency_us"], a, b, rows["sharpness"]], amount
    cands = step_candidates(names, blis)
    X = np.stack([rows[[f"comp_{m}_us" for m in mem]].sum(axis=1).to_numpy() for _, mem in cands], 1)
    return cands, [rows["predicted_us"], X], X


def _segment_mean(values, seg, n_seg: int, counts) -> np.ndarray:
    out = np.zeros((n_seg,) + values.shape[1:])
    np.add.at(out, seg, values)
    return out / (counts[:, None] if out.ndim == 2 else counts)


def attribution(df: pd.DataFrame, blis: dict | None = None) -> pd.DataFrame:
    """Which component's scaled correction would remove most of the error, per regime.

    One row per (kind, regime, candidate): ``n``, regime ``loss`` (mean squared log-ratio),
    ``loss share %`` of the kind's total, the candidate's ``share %`` of predicted time,
    ``grad`` = ∂loss/∂log s at s = 1, optimal ``scale``, ``removed %`` of the regime's loss,
    ``impact %`` (removed loss as a share of the kind's total), MAPE before / after (%), and
    ``members`` (components the candidate scales: > 1 for a kernel group).
    ``blis``: {component: (β symbol, β)} adds the implied β·scale. Sorted by impact.
    """
    out = []
    for kind in (STEP, KERNEL):
        rows = df[df["kind"] == kind].reset_index(drop=True)
        if rows.empty:
            continue
        cands, cols, amount = attribution_inputs(rows, kind, components(df, kind), blis is not None)
        idx, seg, regimes = _level_segments(rows, kind, KERNEL_LEVELS if kind == KERNEL else STEP_LEVELS)
        if not len(idx):
            continue
        G = len(regimes)
        logy = np.log(rows["measured_us"].to_numpy(np.float64))[idx]
        r = _solve(seg, logy, [np.asarray(c, np.float64)[idx] for c in cols], G, len(cands),
                   kind == KERNEL)
        pred = rows["predicted_us"].to_numpy()[idx]
        share = 100.0 * _segment_mean(amount[idx] / pred[:, None], seg, G, r["n"])
        sq = rows["log_ratio"].to_numpy()[idx] ** 2
        loss_share = 100.0 * _segment_mean(sq, seg, G, r["n"]) * r["n"] / max(float(
            np.sum(rows["log_ratio"].to_numpy() ** 2)), 1e-300)
        removed = np.where(r["loss0"][:, None] > NOISE_LOSS,
                           100.0 * (1.0 - r["loss"] / np.maximum(r["loss0"][:, None], 1e-300)), 0.0)
        for j, (name, members) in enumerate(cands):
            f = pd.DataFrame({
                "kind": kind, "level": regimes["level"], "regime": regimes["regime"],
                "n": r["n"].astype(int), "loss": r["loss0"], "loss share %": loss_share,
                "component": name, "share %": share[:, j], "grad": r["grad"][:, j],
                "scale": r["scale"][:, j], "removed %": removed[:, j],
                "impact %": loss_share * removed[:, j] / 100.0,
                "mape before %": 100.0 * r["mape0"], "mape after %": 100.0 * r["mape"][:, j],
                "members": len(members)})
            if blis is not None and name in blis:
                f["beta"] = blis[name][0]
                f["implied beta"] = blis[name][1] * f["scale"]
            out.append(f[share[:, j] > 0])
    if not out:
        return pd.DataFrame()
    res = pd.concat(out, ignore_index=True)
    res["_k"] = (res["kind"] != STEP).astype(int)
    res = res.sort_values(["_k", "impact %", "regime", "component"],
                          ascending=[True, False, True, True], kind="stable")
    return res.drop(columns="_k").reset_index(drop=True)


def best_per_regime(attr: pd.DataFrame) -> pd.DataFrame:
    """For each (kind, regime) the candidate removing most of its loss, ranked by impact."""
    if attr.empty:
        return attr
    best = attr.assign(_r=attr["removed %"].round(6))
    best = best.sort_values(["kind", "regime", "_r", "members", "component"],
                            ascending=[True, True, False, True, True], kind="stable")
    best = best.groupby(["kind", "regime"], sort=False).head(1).drop(columns="_r")
    best = best.assign(_k=(best["kind"] != STEP).astype(int))
    best = best.sort_values(["_k", "impact %", "regime"], ascending=[True, False, True], kind="stable")
    return best.drop(columns="_k").reset_index(drop=True)


def scale_text(scale: float) -> str:
    """``×1.12``; at the edge of the searched range ``×≥64`` / ``×≤0.0156``."""
    if scale >= SCALE_RANGE * 0.999:
        return f"×≥{SCALE_RANGE:g}"
    if scale <= 1.0 / SCALE_RANGE * 1.001:
        return f"×≤{1.0 / SCALE_RANGE:.3g}"
    return f"×{scale:.3g}"


def component_label(kind: str, name: str, scale: float, blis: dict | None = None) -> str:
    """Readable correction: ``attn_decode ×1.12``, ``memory time ×1.1 (memory efficiency ×0.909)``,
    ``dc_kv ×1.12 (β2b 1.947 → 2.181)``."""
    x = scale_text(scale)
    if kind == KERNEL:
        if name == "latency":
            return f"latency {x}"
        return f"{name} time {x} ({name} efficiency ×{1.0 / scale:.3g})"
    if blis is not None and name in blis:
        sym, b = blis[name]
        return f"{name} {x} ({sym} {b:.4g} → {b * scale:.4g})"
    return f"{name} {x}"


def attribution_lines(attr: pd.DataFrame, top: int = 12, blis: dict | None = None) -> list[str]:
    """The ranked list: per regime, the correction that would remove most of its error."""
    lines = []
    best = best_per_regime(attr)
    for kind in (STEP, KERNEL):
        part = best[(best["kind"] == kind) & (best["removed %"] > 0.05)].head(top)
        for _, r in part.iterrows():
            lines.append(
                f"{len(lines) + 1}. {r['regime']} (n={r['n']}, {r['loss share %']:.1f}% of the "
                f"{kind} loss): {component_label(kind, r['component'], r['scale'], blis)} would "
                f"remove {r['removed %']:.0f}% of the error (MAPE {r['mape before %']:.1f}% → "
                f"{r['mape after %']:.1f}%)")
    return lines


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


# --------------------------------------------------------------------------------------------
# the report

REGIME_TABLES = (("phase", ["phase"], False), ("batch size", ["batch_bucket"], False),
                 ("context", ["context_bucket"], False), ("roofline bound", ["bound"], False),
                 ("deployment (GPU / model / TP)", ["gpu", "model", "tp"], True))

PLOT_TITLES = {"pred_vs_measured.png": "Predicted against measured (log–log)",
               "error_vs_work.png": "Relative error against amount of work",
               "step_breakdown.png": "Steps: component shares next to the measured time",
               "error_heatmap.png": "Error over batch size and context"}


def _md_table(df: pd.DataFrame, columns=None) -> str:
    from .report import table
    columns = list(columns or df.columns)
    recs = []
    for rec in df[columns].to_dict("records"):
        recs.append({k: (None if isinstance(v, float) and math.isnan(v) and k not in STAT_COLUMNS
                         else v) for k, v in rec.items()})
    return table(recs, columns)


def _fmt_frame(df: pd.DataFrame) -> pd.DataFrame:
    """Display copy: TP and counts as integers, missing labels as '—'."""
    df = df.copy()
    for c in df.columns:
        if c == "tp":
            df[c] = df[c].map(lambda v: f"{v:g}" if isinstance(v, float) and not math.isnan(v)
                              else ("—" if v is None or isinstance(v, float) else str(v)))
        elif df[c].dtype == object:
            df[c] = df[c].map(lambda v: "—" if v is None or (isinstance(v, float) and math.isnan(v)) else v)
    return df


def _fmt_attr(a: pd.DataFrame) -> pd.DataFrame:
    """Display copy of attribution rows: gradient in scientific notation, scale as text."""
    a = a.copy()
    a["grad"] = a["grad"].map("{:+.2e}".format)
    a["scale"] = a["scale"].map(lambda v: scale_text(v)[1:])
    return a


def blis_table(attr: pd.DataFrame, blis: dict) -> pd.DataFrame:
    """Every β of BLIS's formula with the 1-D attribution on all steps (scale NaN for zero terms)."""
    a = attr[(attr["kind"] == STEP) & (attr["level"] == "all")].set_index("component")
    rows = []
    for name, (sym, value) in blis.items():
        r = a.loc[name] if name in a.index else None
        scale = float(r["scale"]) if r is not None else math.nan
        rows.append({"component": name, "β": sym, "value": f"{value:.4g}",
                     "share %": float(r["share %"]) if r is not None else 0.0,
                     "scale": scale_text(scale)[1:] if r is not None else None,
                     "implied β": f"{value * scale:.4g}" if r is not None else None,
                     "removed %": float(r["removed %"]) if r is not None else 0.0})
    t = pd.DataFrame(rows)
    return t.sort_values(["removed %", "share %"], ascending=False, kind="stable")


def render_summary(df: pd.DataFrame, attr: pd.DataFrame, header: list[str], plots: list[str],
                   worst: int = 20, top: int = 12, blis: dict | None = None) -> str:
    """The Markdown report (deterministic for equal inputs). Percentages are of |relative error|
    except bias (signed mean); ``loss share`` is the share of the squared log error."""
    kinds = [k for k in (STEP, KERNEL) if (df["kind"] == k).any()]
    out = ["# roofcal residuals", ""] + header + [""]
    out += ["Errors are relative, `predicted / measured − 1`: MAPE is the mean of |error|, bias the "
            "signed mean, p50/p90/p99 percentiles of |error| (all %). `loss share` is a group's share "
            "of Σ log(predicted/measured)² of its kind (the fitting loss); tables are sorted by it.", ""]
    out += ["## Overall", "", _md_table(_fmt_frame(error_table(df, []))), ""]
    out += ["## Attribution", "",
            "Per regime, the component whose time, scaled alone, would remove most of the regime's "
            "squared log error (1-D optimum of the loss in the scale, from JAX gradients), ranked by "
            "the share of the total loss removed:", ""]
    lines = attribution_lines(attr, top, blis)
    out += lines if lines else ["(no error to attribute)"]
    out += [""]
    if blis is not None and not attr.empty:
        out += ["### BLIS coefficients on all steps", "",
                "Each β with its term's share of the predicted step time and the scale that alone "
                "would best fit all steps, searched in [1/64, 64] (a β far from its implied value "
                "is compensating elsewhere; a zero β cannot be scaled):", "",
                _md_table(blis_table(attr, blis)), ""]
    out += ["## Per op / component", "", _md_table(_fmt_frame(error_table(df, ["key"]))), ""]
    for kind in kinds:
        level = "all" if kind == STEP else "key"
        a = attr[(attr["kind"] == kind) & (attr["level"] == level)] if not attr.empty else attr
        if a.empty:
            continue
        a = a.sort_values(["removed %", "regime", "component"], ascending=[False, True, True],
                          kind="stable")
        what = "all steps" if kind == STEP else "each kernel kind/variant"
        more = f" (top {top} of {len(a)}; all in attribution.csv)" if len(a) > top else ""
        out += [f"### Components of {kind} rows ({what})", "",
                "`share %`: mean share of the prediction; `grad`: ∂loss/∂log(scale) at scale 1; "
                "`scale`: the 1-D optimum; `removed %`: of the regime's loss" + more + ".", "",
                _md_table(_fmt_attr(a.head(top)), ["regime", "component", "share %", "grad",
                                                   "scale", "removed %", "mape before %",
                                                   "mape after %"]), ""]
    out += ["## Per regime", "",
            "Batch buckets are inclusive ranges of sequences (tokens `m` for GEMM and MoE kernels); "
            "context buckets are [low, high) ranges of the mean KV length per sequence.", ""]
    for title, by, fill in REGIME_TABLES:
        t = error_table(df, by, fill)
        if t.empty:
            continue
        out += [f"### By {title}", "", _md_table(_fmt_frame(t)), ""]
    for kind in kinds:
        w = worst_rows(df, kind, worst)
        out += [f"## {len(w)} worst {kind} rows", "", _md_table(w), ""]
    if plots:
        out += ["## Plots", ""]
        out += [f"![{PLOT_TITLES.get(p, p)}]({p})" for p in plots] + [""]
    return "\n".join(out)


def terminal_text(summary: str) -> str:
    """The summary without image embeds (for stdout)."""
    text = summary.split("\n## Plots\n")[0]
    return "\n".join(ln for ln in text.splitlines() if not ln.startswith("![")).rstrip() + "\n"


# --------------------------------------------------------------------------------------------
# the API

@dataclass
class Residuals:
    """A residual report: the table (one row per measurement), attribution, Markdown summary and
    PNG plots ({file name: bytes}); ``files`` lists what was written (empty without out_dir)."""

    table: pd.DataFrame
    attribution: pd.DataFrame
    summary: str
    plots: dict = field(default_factory=dict)
    files: list = field(default_factory=list)
    notes: list = field(default_factory=list)


def _resolve(coeffs, gpu, blis):
    """(Coefficients or None, GPUSpec or None, BlisCoeffs or None) from the user's arguments."""
    from . import coeffs as coeff_io
    if coeffs is None and blis is None:
        raise RoofcalError("residuals: give --coeffs FILE (roofcal) or --blis FILE (BLIS)")
    spec = load_gpu(gpu) if gpu is not None else None
    c = None
    if coeffs is not None:
        c = coeff_io.load(coeffs) if isinstance(coeffs, (str, Path)) else coeffs
        spec = spec or load_gpu(c.gpu)
        c.check_gpu(spec)
        if c.datasheet_sha256 != spec.sha256() and c.source != "<memory>":
            coeff_io.load(c.source, spec)                   # raises its one-line message
    b = None
    if blis is not None:
        b = blis if isinstance(blis, BlisCoeffs) else read_blis_coeffs(blis)
    return c, spec, b


def _load_data(data, spec, model, tp):
    from . import datasets
    if isinstance(data, datasets.Measurements):
        return data
    items = [data] if data is None or isinstance(data, (str, Path)) else list(data)
    paths = []
    for it in items:
        if it is None or str(it) == "bundled":
            if spec is None:
                raise RoofcalError("residuals: bundled data needs a GPU (give --gpu or --coeffs)")
            paths += datasets.bundled_paths(spec.name)
        else:
            paths.append(Path(it))
    return datasets.load(paths, gpu=spec.name if spec else None, model=model, tp=tp)


def _filter_steps(steps: list, model, tp) -> list:
    if model is not None:
        from .config import load_model
        name = load_model(model).name
        steps = [d for d in steps if d.model.name == name]
    if tp is not None:
        steps = [d for d in steps if d.tp == int(tp)]
    return steps


def residuals(coeffs=None, data=None, out_dir=None, *, gpu=None, model=None, tp=None, blis=None,
              plots: bool = True, worst: int = 20, top: int = 12) -> Residuals:
    """Inspect the residuals of a coefficient file on measurements; write the report to ``out_dir``.

    ``coeffs``: a roofcal coefficient file (path or :class:`~roofcal.coeffs.Coefficients`); its GPU
    is used unless ``gpu`` is given (a mismatch is refused). ``blis``: a BLIS ``defaults.yaml`` or
    BLIS-form YAML (path or :class:`BlisCoeffs`): steps are then predicted by BLIS's
    trained-physics formula, components β·basis (per-op rows need ``coeffs`` too, else are skipped).
    ``data``: None or ``"bundled"`` (the bundled measurements of the GPU), a path, a list of
    paths, or a :class:`~roofcal.datasets.Measurements`. ``model`` / ``tp`` name the deployment of
    step JSONL rows without one, and keep only steps of that model / TP.

    Writes ``residuals.csv`` (one row per measurement), ``attribution.csv``, ``summary.md`` and
    the PNG plots, each atomically and only after everything was computed: bad input raises
    :class:`RoofcalError` with nothing written. Times in µs throughout.
    """
    c, spec, b = _resolve(coeffs, gpu, blis)
    m = _load_data(data, spec, model, tp)
    steps = _filter_steps(m.steps, model, tp)
    notes = []
    if m.steps and not steps:
        notes.append(f"{sum(len(d) for d in m.steps)} steps skipped: none match --model/--tp")
    frames = []
    if m.ops is not None and len(m.ops):
        if c is not None:
            frames.append(kernel_residuals(m.ops, c.params, spec))
        else:
            notes.append(f"{len(m.ops)} per-op rows skipped: BLIS predicts whole steps only "
                         "(give --coeffs too to inspect them)")
    if steps:
        frames.append(blis_step_residuals(steps, b) if b is not None
                      else step_residuals(steps, c.params))
    elif b is not None:
        raise RoofcalError("residuals: --blis needs step measurements, and the data has none"
                           + (" matching --model/--tp" if m.steps else ""))
    if not any(len(f) for f in frames):
        raise RoofcalError("residuals: no measurements match" + (" --model/--tp" if m.steps else ""))
    df = finish_table(frames)
    blis_map = None
    if b is not None:
        from .blis.basis import effective_beta
        eff = np.asarray(effective_beta(list(b.beta)).beta, np.float64)
        blis_map = {name: (sym, float(eff[i])) for name, sym, i, _ in BLIS_TERMS}
    attr = attribution(df, blis_map)
    pngs = {}
    if plots:
        from . import plots as P
        pngs = P.all_plots(df)
    header = _header(c, b, m, df, notes)
    summary = render_summary(df, attr, header, list(pngs), worst, top, blis_map)
    res = Residuals(df, attr, summary, pngs, [], notes)
    if out_dir is not None:
        res.files = write_report(res, out_dir)
    return res


def _header(c, b, m, df, notes) -> list[str]:
    lines = []
    if c is not None:
        from .resources import display
        src = display(Path(c.source)) if Path(c.source).exists() else c.source
        lines.append(f"- coefficients: `{src}` (GPU {c.gpu}"
                     + ("" if c.calibrated else ", not calibrated") + ")")
    if b is not None:
        lines.append(f"- BLIS coefficients: `{b.source}`: β = [{', '.join(f'{x:g}' for x in b.beta)}]"
                     f", α = [{', '.join(f'{x:g}' for x in b.alpha)}] µs (α are request-level "
                     "overheads and do not enter step time); basis evaluated with BLIS hardware "
                     + (f"entry {b.hardware_name or 'of the file'}" if b.hardware is not None
                        else "entries of data/blis/hardware_config.json"))
    for p in m.provenance:
        lines.append(f"- data: `{p['path']}` ({p['kind']}, {p['rows']} rows)")
    counts = df["kind"].value_counts()
    lines.append(f"- inspected: {int(counts.get(KERNEL, 0))} kernel rows, "
                 f"{int(counts.get(STEP, 0))} steps")
    lines += [f"- note: {n}" for n in notes]
    return lines


def csv_bytes(df: pd.DataFrame) -> bytes:
    """CSV of ``df`` by Arrow's C++ writer (fast for 10⁵ rows): floats in shortest round-trip form,
    strings quoted, missing values empty; equal frames give equal bytes."""
    import pyarrow as pa
    import pyarrow.csv as pacsv
    buf = io.BytesIO()
    pacsv.write_csv(pa.Table.from_pandas(df, preserve_index=False), buf)
    return buf.getvalue()


def write_report(res: Residuals, out_dir) -> list[Path]:
    """Write the CSVs, summary and plots into ``out_dir`` (each atomically); returns the paths."""
    from .io import write_bytes_atomic, write_text_atomic
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise RoofcalError(f"{out}: exists and is not a folder")
    files = [(out / "residuals.csv", csv_bytes(res.table)),
             (out / "attribution.csv", csv_bytes(res.attribution))]
    files += [(out / name, data) for name, data in res.plots.items()]
    files.append((out / "summary.md", res.summary))
    for path, content in files:
        if isinstance(content, bytes):
            write_bytes_atomic(path, content)
        else:
            write_text_atomic(path, content)
    return [p for p, _ in files]

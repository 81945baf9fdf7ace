"""Per-operation kernel measurements: loading, the CSV interchange format, and per-row prediction.

Interchange CSV (one row per measured kernel call)::

    gpu, op, dtype, <shape columns of the op>, latency_us

=================  ==============================================================  ============
op                 shape columns                                                   dtype means
=================  ==============================================================  ============
``gemm``           m, n, k (x: m×k, W: k×n)                                        GEMM input dtype: bf16, fp8, fp8_block
``attn_prefill``   batch, seq, cached, heads, kv_heads, head_dim (heads per GPU)   KV-cache dtype: bf16, fp8
``attn_decode``    batch, context, heads, kv_heads, head_dim                       KV-cache dtype
``allreduce``      num_gpus, bytes (message per GPU)                               implementation: custom, custom_eager, nccl
``moe``            tokens, hidden, inter, topk, experts, tp, ep (optional skew)    weight dtype: bf16, fp8, fp8_block, int4
=================  ==============================================================  ============

``context`` is the KV length before the decode token; ``skew`` is the routing imbalance (0 =
balanced, else the power-law exponent). The bundled aiconfigurator parquet tables (latency in ms)
are read directly and converted to this form.
"""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

from . import components as C
from . import correction as K
from .errors import RoofcalError
from .hardware import GPUSpec, load_gpu

SHAPE_COLUMNS = {
    "gemm": ("m", "n", "k"),
    "attn_prefill": ("batch", "seq", "cached", "heads", "kv_heads", "head_dim"),
    "attn_decode": ("batch", "context", "heads", "kv_heads", "head_dim"),
    "allreduce": ("num_gpus", "bytes"),
    "moe": ("tokens", "hidden", "inter", "topk", "experts", "tp", "ep"),
}
OPTIONAL_COLUMNS = {"moe": ("skew",)}
DTYPES = {
    "gemm": ("bf16", "fp8", "fp8_block"),
    "attn_prefill": ("bf16", "fp8"),
    "attn_decode": ("bf16", "fp8"),
    "allreduce": ("custom", "custom_eager", "nccl"),
    "moe": ("bf16", "fp8", "fp8_block", "int4"),
}
ALL_SHAPES = tuple(dict.fromkeys(c for cols in SHAPE_COLUMNS.values() for c in cols)) + ("skew",)
BYTES = {"bf16": 2.0, "fp8": 1.0, "fp8_block": 1.0, "int4": 0.5}

#: aiconfigurator's ``power_law_α`` MoE tables are matched by an expert-popularity exponent of
#: about α/2 in :func:`roofcal.components.moe.routing`: the active experts implied by the
#: memory-bound H100 timings (power-law time / balanced time × min(E, T·k)) at T = 16…160 tokens
#: (256 experts, top-8) lie between the model's curves for 0.3α and 0.7α.
POWER_LAW_EXPONENT = 0.5

# aiconfigurator's names → ours
_DTYPE = {"bfloat16": "bf16", "float16": "bf16", "fp8": "fp8", "fp8_block": "fp8_block",
          "int4_wo": "int4", "w4a16_mxfp4": "int4"}
_GPU = {"NVIDIA H100 80GB HBM3": "h100_sxm", "NVIDIA A100-SXM4-80GB": "a100_sxm"}


# --------------------------------------------------------------------------------------------
# loading

def _gpu_name(device: str, gpu: str | None) -> str:
    return gpu or _GPU.get(device) or device


def from_aiconfigurator(df: pd.DataFrame, source: str, gpu: str | None = None) -> pd.DataFrame:
    """Convert one aiconfigurator table (any of its perf parquet files) to the interchange form."""
    cols = set(df.columns)
    dev = _gpu_name(str(df["device"].iloc[0]) if "device" in cols and len(df) else "", gpu)
    out = pd.DataFrame(index=df.index)
    if {"m", "n", "k", "gemm_dtype"} <= cols:
        out["op"] = "gemm"
        out["dtype"] = df["gemm_dtype"].map(_DTYPE)
        for c in "mnk":
            out[c] = df[c]
    elif {"isl", "num_heads", "kv_cache_dtype"} <= cols and (df["op_name"] == "context_attention").all():
        out["op"] = "attn_prefill"
        out["dtype"] = df["kv_cache_dtype"].map(_DTYPE)
        out["batch"], out["seq"], out["cached"] = df["batch_size"], df["isl"], 0
        out["heads"], out["kv_heads"], out["head_dim"] = df["num_heads"], df["num_key_value_heads"], df["head_dim"]
        if "window_size" in cols:
            out = out[df["window_size"] == 0]
    elif {"step", "num_heads", "kv_cache_dtype"} <= cols and (df["op_name"] == "generation_attention").all():
        out["op"] = "attn_decode"
        out["dtype"] = df["kv_cache_dtype"].map(_DTYPE)
        out["batch"], out["context"] = df["batch_size"], df["step"]
        out["heads"], out["kv_heads"], out["head_dim"] = df["num_heads"], df["num_key_value_heads"], df["head_dim"]
        if "window_size" in cols:
            out = out[df["window_size"] == 0]
    elif {"message_size", "backend"} <= cols:
        out["op"] = "allreduce"
        out["dtype"] = df["backend"].map({"vllm_graph": "custom", "vllm_eager": "custom_eager"})
        out["num_gpus"], out["bytes"] = df["num_gpus"], df["message_size"] * 2.0      # bf16 elements
    elif {"message_size", "nccl_dtype"} <= cols:
        keep = (df["op_name"] == "all_reduce") & (df["nccl_dtype"] == "half")
        df, out = df[keep], out[keep]
        out["op"], out["dtype"] = "allreduce", "nccl"
        out["num_gpus"], out["bytes"] = df["num_gpus"], df["message_size"] * 2.0
    elif {"num_tokens", "moe_dtype", "topk"} <= cols:
        out["op"] = "moe"
        out["dtype"] = df["moe_dtype"].map(_DTYPE)
        for a, b in [("tokens", "num_tokens"), ("hidden", "hidden_size"), ("inter", "inter_size"),
                     ("topk", "topk"), ("experts", "num_experts"), ("tp", "moe_tp_size"),
                     ("ep", "moe_ep_size")]:
            out[a] = df[b]
        out["skew"] = df["distribution"].map(
            lambda s: 0.0 if s == "balanced" else POWER_LAW_EXPONENT * float(str(s).rsplit("_", 1)[-1]))
    else:
        raise RoofcalError(f"{source}: not a recognised aiconfigurator table (columns: "
                           f"{', '.join(sorted(cols))})")
    out["gpu"] = dev
    out["latency_us"] = df.loc[out.index, "latency"] * 1000.0
    out = out[out["dtype"].notna()]
    out["source"] = source
    return out.reset_index(drop=True)


def validate_table(df: pd.DataFrame, source: str) -> pd.DataFrame:
    """Check an interchange table; returns it with numeric shape columns and defaults filled."""
    if df.empty:
        raise RoofcalError(f"{source}: no rows")
    for col in ("gpu", "op", "dtype", "latency_us"):
        if col not in df.columns:
            raise RoofcalError(f"{source}: missing column '{col}'")
    df = df.copy()
    bad_op = ~df["op"].isin(list(SHAPE_COLUMNS))
    if bad_op.any():
        i = int(np.flatnonzero(bad_op.values)[0])
        raise RoofcalError(f"{source}: row {i + 1}: unknown op {df['op'].iloc[i]!r} "
                           f"(known: {', '.join(SHAPE_COLUMNS)})")
    lat = pd.to_numeric(df["latency_us"], errors="coerce")
    bad = ~(np.isfinite(lat) & (lat > 0))
    if bad.any():
        i = int(np.flatnonzero(bad.values)[0])
        raise RoofcalError(f"{source}: row {i + 1}: field 'latency_us' must be a positive number, "
                           f"got {df['latency_us'].iloc[i]!r}")
    df["latency_us"] = lat.astype(float)
    for op, cols in SHAPE_COLUMNS.items():
        rows = df["op"] == op
        if not rows.any():
            continue
        for c in cols:
            if c not in df.columns:
                raise RoofcalError(f"{source}: missing column '{c}' (needed by op '{op}')")
            v = pd.to_numeric(df.loc[rows, c], errors="coerce")
            minimum = 0 if c == "cached" else 1
            bad = ~(np.isfinite(v) & (v >= minimum))
            if bad.any():
                i = int(np.flatnonzero(rows.values)[int(np.flatnonzero(bad.values)[0])])
                raise RoofcalError(f"{source}: row {i + 1}: field '{c}' must be a number ≥ "
                                   f"{minimum}, got {df[c].iloc[i]!r}")
        bad_dt = ~df.loc[rows, "dtype"].isin(DTYPES[op])
        if bad_dt.any():
            i = int(np.flatnonzero(rows.values)[int(np.flatnonzero(bad_dt.values)[0])])
            raise RoofcalError(f"{source}: row {i + 1}: dtype {df['dtype'].iloc[i]!r} is not one "
                               f"of {', '.join(DTYPES[op])} for op '{op}'")
    for c in [c for c in ALL_SHAPES if c in df.columns]:
        df[c] = pd.to_numeric(df[c], errors="coerce")
    if "skew" not in df.columns:
        df["skew"] = 0.0
    df["skew"] = df["skew"].fillna(0.0)
    if "source" not in df.columns:
        df["source"] = source
    return df


def read_ops_csv(path: str | Path) -> pd.DataFrame:
    """Read and validate an interchange CSV."""
    path = Path(path)
    try:
        df = pd.read_csv(path)
    except FileNotFoundError:
        raise RoofcalError(f"{path}: no such file")
    except pd.errors.EmptyDataError:
        raise RoofcalError(f"{path}: empty file")
    except (pd.errors.ParserError, UnicodeDecodeError) as e:
        raise RoofcalError(f"{path}: not a CSV file ({str(e).splitlines()[0]})")
    return validate_table(df, str(path))


def read_ops(path: str | Path, gpu: str | None = None) -> pd.DataFrame:
    """Read per-op measurements: an interchange CSV, an aiconfigurator parquet, or a folder of them."""
    path = Path(path)
    if path.is_dir():
        files = sorted(path.rglob("*.parquet")) + sorted(path.rglob("*.csv"))
        if not files:
            raise RoofcalError(f"{path}: folder holds no .parquet or .csv measurements")
        return pd.concat([read_ops(f, gpu) for f in files], ignore_index=True)
    if path.suffix == ".parquet":
        from .resources import display
        try:
            raw = pd.read_parquet(path)
        except FileNotFoundError:
            raise RoofcalError(f"{path}: no such file")
        except Exception as e:  # pyarrow raises several types for corrupt files
            raise RoofcalError(f"{path}: not a readable parquet file ({type(e).__name__})")
        if "latency" not in raw.columns:
            raise RoofcalError(f"{path}: missing column 'latency'")
        return validate_table(from_aiconfigurator(raw, display(path), gpu), display(path))
    return read_ops_csv(path)


def write_ops_csv_text(df: pd.DataFrame) -> str:
    """Interchange CSV text: gpu, op, dtype, the shape columns present, latency_us."""
    shape = [c for c in ALL_SHAPES if c in df.columns and df[c].notna().any()]
    cols = ["gpu", "op", "dtype"] + shape + ["latency_us"]
    return df[cols].to_csv(index=False, float_format="%.10g", lineterminator="\n")


# --------------------------------------------------------------------------------------------
# work of each row

def row_work(op: str, dtype: str, cols: dict) -> C.Work:
    """Work of measured rows (arrays in ``cols``) through the same components a step uses."""
    f = {k: jnp.asarray(v, jnp.float32) for k, v in cols.items()}
    if op == "gemm":
        a = 2.0 if dtype == "bf16" else 1.0
        return C.gemm(f["m"], f["n"], f["k"], a, BYTES[dtype], 2.0)
    if op == "attn_prefill":
        b, s, c = f["batch"], f["seq"], f["cached"]
        kv = BYTES[dtype]
        return C.prefill_attention(b, b * s, b * s * (c + (s + 1.0) / 2.0), b * c, f["heads"],
                                   f["kv_heads"], f["head_dim"], f["head_dim"],
                                   2.0 * f["kv_heads"] * f["head_dim"], 2.0, kv)
    if op == "attn_decode":
        b = f["batch"]
        return C.decode_attention(b, b * (f["context"] + 1.0), f["heads"], f["kv_heads"],
                                  f["head_dim"], f["head_dim"], 2.0 * f["kv_heads"] * f["head_dim"],
                                  2.0, BYTES[dtype])
    if op == "allreduce":
        return C.allreduce(f["num_gpus"], f["bytes"])
    if op == "moe":
        return C.moe(f["tokens"], f["hidden"], f["inter"], f["topk"], f["experts"], f["tp"],
                     f["ep"], BYTES[dtype], 2.0, 3.0, f.get("skew", 0.0 * f["tokens"]))
    raise RoofcalError(f"unknown op {op!r}")


@partial(jax.jit, static_argnames=("op", "dtype", "peak", "bw"))
def _row_times(op: str, dtype: str, cols: dict, peak: float, bw: float):
    """(ideal compute µs, ideal memory µs, standardized shape z) of rows, in one compiled call."""
    w = row_work(op, dtype, cols)
    tc, tm = C.ideal_times(w, peak, bw)
    return tc, tm, K.standardize(op, w.shape)


def padded_size(n: int, minimum: int = 256) -> int:
    """Row count rounded up to one of a few sizes (≤ 12.5 % padding, ≥ ``minimum``), so compiled
    programs are reused across tables of similar size."""
    step = max(minimum, 1 << max(0, int(n).bit_length() - 3))
    return -(-max(n, 1) // step) * step


def row_times(gpu: GPUSpec, op: str, dtype: str, df: pd.DataFrame, idx: np.ndarray):
    """(ideal compute µs, ideal memory µs, standardized shapes z) of rows ``idx`` of an
    interchange table, as float32 arrays of ``len(idx)`` rows (computed padded, see
    :func:`padded_size`)."""
    from .model import op_peak_and_bandwidth
    peak, bw = op_peak_and_bandwidth(gpu, op, dtype)
    n = len(idx)
    pad = padded_size(n) - n
    cols = {c: np.pad(np.asarray(df[c].values[idx], np.float32), (0, pad), constant_values=1.0)
            for c in SHAPE_COLUMNS[op] + OPTIONAL_COLUMNS.get(op, ()) if c in df.columns}
    tc, tm, z = _row_times(op, dtype, cols, float(peak), float(bw))
    return tc[:n], tm[:n], z[:n]


def groups(df: pd.DataFrame):
    """Yield (gpu, op, dtype, row index array) for each homogeneous group of rows."""
    for (g, op, dt), idx in df.groupby(["gpu", "op", "dtype"], sort=True).indices.items():
        yield g, op, dt, np.sort(idx)


def predict_table(df: pd.DataFrame, params: dict, gpu: GPUSpec) -> pd.DataFrame:
    """Predicted time of every row (all rows must be for ``gpu``); adds ideal and predicted µs."""
    out = df.copy()
    for col in ("ideal_compute_us", "ideal_memory_us", "predicted_us"):
        out[col] = np.nan
    for g, op, dt, idx in groups(df):
        if g != gpu.name:
            raise RoofcalError(f"{df['source'].iloc[idx[0]]}: rows are for GPU '{g}' but the "
                               f"coefficients are for '{gpu.name}'")
        tc, tm, z = row_times(gpu, op, dt, df, idx)
        _, p = K.lookup(params["ops"], op, dt)
        t = K.op_time_z(p, z, tc, tm)
        out.loc[out.index[idx], "ideal_compute_us"] = np.asarray(tc, np.float64)
        out.loc[out.index[idx], "ideal_memory_us"] = np.asarray(tm, np.float64)
        out.loc[out.index[idx], "predicted_us"] = np.asarray(t, np.float64)
    if "latency_us" in out.columns:
        out["rel_error"] = out["predicted_us"] / out["latency_us"] - 1.0
    return out


def predict_ops(path, coeffs=None) -> pd.DataFrame:
    """``roofcal predict --ops``: predict every row of a per-op CSV/table with a coefficient file.

    Without ``coeffs`` the neutral roofline defaults of each row's GPU are used.
    """
    from .predict import resolve_coeffs
    df = read_ops(path)
    frames = []
    for g, part in df.groupby("gpu", sort=True):
        spec = load_gpu(g)
        c = resolve_coeffs(coeffs, spec)
        frames.append(predict_table(part, c.params, spec))
    return pd.concat(frames).sort_index()


def mape(pred, meas) -> float:
    """Mean absolute percentage error, %."""
    pred, meas = np.asarray(pred, float), np.asarray(meas, float)
    return float(np.mean(np.abs(pred / meas - 1.0)) * 100.0) if len(meas) else math.nan

"""Per-operation kernel measurements: reading them, and the CSV interchange format.

Interchange CSV (one row per measured kernel call)::

    gpu, op, dtype, <shape columns of the op>, latency_us

=================  ==============================================================  ============
op                 shape columns                                                   dtype means
=================  ==============================================================  ============
``gemm``           m, n, k (x: m×k, W: k×n)                                        GEMM input dtype: bf16, fp8, fp8_block
``attn_prefill``   batch, seq, cached, heads, kv_heads, head_dim (heads per GPU)   KV-cache dtype: bf16, fp8
``attn_decode``    batch, context, heads, kv_heads, head_dim                       KV-cache dtype
``allreduce``      num_gpus, bytes (message per GPU)                               implementation: custom, custom_eager, nccl
``allgather``,     num_gpus, bytes (the whole buffer, as nccl-tests sizes it)     ``nccl``
``reducescatter``,
``alltoall``
``moe``            tokens, hidden, inter, topk, experts, tp, ep (optional skew)    weight dtype: bf16, fp8, fp8_block, int4
=================  ==============================================================  ============

``context`` is the KV length before the decode token; ``skew`` is the routing imbalance (0 =
balanced, else the power-law exponent). The bundled aiconfigurator parquet tables (latency in ms)
are read directly and converted to this form. What each row's kernel computes is
:mod:`roofcal.physics.kernels`; its prediction :func:`roofcal.model.predict.predict_table`.

**Kernel sets.** Every row carries ``kernels``, the kernel library it was measured in: the name
of the nearest folder called ``<framework>-<version>`` (``vllm-0.14.0``) — a fit corrects each
set on its own (:func:`roofcal.calibration.fit.fit`) — or ``""`` for tables every set shares
(``nccl-*``: NCCL does not change with vLLM) and for files outside such folders.

Facts of the bundled vLLM 0.24 tables (from aiconfigurator's collector at that build, commit
d5bad971c; checked against the data):

* its FP8 block-scaled GEMMs were timed **without CUDA graphs** (``use_cuda_graph = gemm_type !=
  "fp8_block"``), so each row carries the host's launch time — floors of 55 µs (FlashInfer),
  77 µs (DeepGemm) and 151 µs (CUTLASS) that no step of a CUDA-graphed server pays. They are left
  out (:data:`NOT_IN_GRAPH`); the set has no ``gemm/fp8_block`` rows of its own;
* ``w4a16_mxfp4`` MoE rows are MXFP4 kernels (Marlin and gpt-oss Triton), not the int4 Marlin
  kernel of ``int4_wo``; no bundled model uses MXFP4, so they are left out rather than pooled;
* its attention tables time FlashAttention 3 and, on 2–3 % of the bf16 rows, FlashAttention 4
  (``kernel_source``): every FA4 row has head dim 512 (with 1–2 KV heads), where the tables hold
  no FA3 row, and no model roofcal maps runs attention at that head dim (MLA is mapped at its qk
  head dim with one KV head). A different kernel at a shape of its own, 14 % (decode) and 9 %
  (prefill) off the surface the FA3 rows share and pulling it: attention rows at that head dim
  are left out (:data:`UNMAPPED_HEAD_DIM`), whichever kernel timed them, so a GPU whose vLLM runs
  FA4 at every head dim (Blackwell) keeps its rows at the head dims models use.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from roofcal.errors import RoofcalError
from roofcal.physics.kernels import ALL_SHAPES, DTYPES, SHAPE_COLUMNS

#: aiconfigurator's ``power_law_α`` MoE tables are matched by an expert-popularity exponent of
#: about α/2 in :func:`roofcal.physics.components.moe.routing`: the active experts implied by the
#: memory-bound H100 timings (power-law time / balanced time × min(E, T·k)) at T = 16…160 tokens
#: (256 experts, top-8) lie between the model's curves for 0.3α and 0.7α.
POWER_LAW_EXPONENT = 0.5
#: nccl-tests' collective names → roofcal's kernel kinds (``message_size``: the whole buffer in
#: elements, :func:`roofcal.physics.components.comm.collective`)
NCCL_OPS = {"all_reduce": "allreduce", "all_gather": "allgather",
            "reduce_scatter": "reducescatter", "alltoall": "alltoall"}

# aiconfigurator's names → ours (MXFP4 left out: see the module docstring)
_DTYPE = {"bfloat16": "bf16", "float16": "bf16", "fp8": "fp8", "fp8_block": "fp8_block", "int4_wo": "int4"}
#: (kernel set, op, dtype) of tables timed outside CUDA graphs, left out (module docstring)
NOT_IN_GRAPH = {("vllm-0.24.0", "gemm", "fp8_block")}
#: attention rows at this head dim are left out: no model roofcal maps runs it (module docstring)
UNMAPPED_HEAD_DIM = 512


class UnknownTable(RoofcalError):
    """A parquet table of none of the kinds roofcal reads (an MLA or Mamba table, say): refused
    when named, left out with its name and row count when a folder holds it (``rows``)."""

    def __init__(self, message: str, rows: int):
        super().__init__(message)
        self.rows = rows


#: a kernel set's name, ``<framework>-<version>`` lower-cased (``vllm-0.14.0``)
KERNEL_SET_NAME = re.compile(r"([a-z][a-z0-9_]*)-(\d+(?:\.\d+)*)")


def kernel_set_of(path: str | Path) -> str:
    """The kernel set of a measurement file: the nearest folder named ``<framework>-<version>``
    whose framework is not NCCL (``vllm-0.14.0``), else ``""`` (shared by every set)."""
    for part in reversed(Path(path).parts[:-1]):
        m = KERNEL_SET_NAME.fullmatch(part.lower())
        if m:
            return "" if m.group(1) == "nccl" else part
    return ""


def kernel_set_order(name: str) -> tuple:
    """Sort key of kernel sets, oldest first: framework, then its version numerically."""
    m = re.fullmatch(r"(.*?)-(\d+(?:\.\d+)*)", name)
    return (m.group(1), tuple(int(x) for x in m.group(2).split("."))) if m else (name, ())


def table_kernel_set(df: pd.DataFrame) -> str | None:
    """The kernel set an aiconfigurator table names in its own columns: ``<framework>-<version>``
    lower-cased (``VLLM``, ``0.24.0`` → ``vllm-0.24.0``); ``""`` for NCCL's collectives (shared
    by every set); None when the table does not say (no single framework and version)."""
    if "nccl_dtype" in df.columns or ("kernel_source" in df.columns
                                      and set(df["kernel_source"].unique()) == {"NCCL"}):
        return ""
    if not {"framework", "version"} <= set(df.columns) or df.empty:
        return None
    fw, ver = df["framework"].unique(), df["version"].unique()
    if len(fw) != 1 or len(ver) != 1:
        return None
    name = f"{str(fw[0]).strip().lower()}-{str(ver[0]).strip()}"
    return name if KERNEL_SET_NAME.fullmatch(name) else None


# --------------------------------------------------------------------------------------------
# loading

def gpu_of_device(device: str) -> str:
    """The bundled datasheet a table's ``device`` (the name nvidia-smi reports, "NVIDIA L40S")
    names through its aliases, else the device name as it is."""
    from roofcal.physics.hardware import load_gpu
    try:
        return load_gpu(device).name if device else device
    except RoofcalError:
        return device


def _gpu_name(device: str, gpu: str | None) -> str:
    return gpu or gpu_of_device(device)


def from_aiconfigurator(df: pd.DataFrame, source: str, gpu: str | None = None) -> pd.DataFrame:
    """Convert one aiconfigurator table (any of its perf parquet files) to the interchange form.

    The rows left out (kernels roofcal does not price, sliding windows, other collectives,
    dtypes without a variant) are gathered into one mask and dropped once, at the end (each
    selection of a table copies its text columns); ``attrs["left_out"]`` counts them by reason,
    ``{label: rows}``, each row under the first reason that leaves it out."""
    cols = set(df.columns)
    dev = _gpu_name(str(df["device"].iloc[0]) if "device" in cols and len(df) else "", gpu)
    left: dict[str, np.ndarray] = {}          # what is left out, and why: {label: row mask}

    def column(c):
        return df[c].to_numpy()
    if "head_dim" in cols and "kv_cache_dtype" in cols:
        at = column("head_dim") == UNMAPPED_HEAD_DIM
        if at.any():
            left[f"attention at head dim {UNMAPPED_HEAD_DIM} (no mapped model runs it)"] = at
    if "window_size" in cols:                           # attention: sliding windows left out
        left["sliding-window attention"] = column("window_size") != 0
    if {"m", "n", "k", "gemm_dtype"} <= cols:
        raw_dtype = df["gemm_dtype"]
        out = {"op": "gemm", "dtype": raw_dtype.map(_DTYPE),
               "m": column("m"), "n": column("n"), "k": column("k")}
    elif {"isl", "num_heads", "kv_cache_dtype"} <= cols and (df["op_name"] == "context_attention").all():
        raw_dtype = df["kv_cache_dtype"]
        out = {"op": "attn_prefill", "dtype": raw_dtype.map(_DTYPE),
               "batch": column("batch_size"), "seq": column("isl"), "cached": np.zeros(len(df), np.int64),
               "heads": column("num_heads"), "kv_heads": column("num_key_value_heads"),
               "head_dim": column("head_dim")}
    elif {"step", "num_heads", "kv_cache_dtype"} <= cols and (df["op_name"] == "generation_attention").all():
        raw_dtype = df["kv_cache_dtype"]
        out = {"op": "attn_decode", "dtype": raw_dtype.map(_DTYPE),
               "batch": column("batch_size"), "context": column("step"), "heads": column("num_heads"),
               "kv_heads": column("num_key_value_heads"), "head_dim": column("head_dim")}
    elif {"message_size", "backend"} <= cols:
        raw_dtype = df["backend"]
        out = {"op": "allreduce",
               "dtype": raw_dtype.map({"vllm_graph": "custom", "vllm_eager": "custom_eager"}),
               "num_gpus": column("num_gpus"), "bytes": column("message_size") * 2.0}   # bf16 elements
    elif {"message_size", "nccl_dtype"} <= cols:
        raw_dtype = None
        ops = df["op_name"].map(NCCL_OPS)
        for op in sorted(set(df["op_name"][ops.isna()].astype(str))):
            left[f"NCCL {op} (not priced)"] = (column("op_name") == op)
        for dt in sorted(set(df["nccl_dtype"].unique()) - {"half"}):
            left[f"NCCL collectives of {dt} (the bf16 rows are read)"] = \
                ops.notna().to_numpy() & (column("nccl_dtype") == dt)
        out = {"op": ops.fillna("").to_numpy(), "dtype": "nccl",
               "num_gpus": column("num_gpus"), "bytes": column("message_size") * 2.0}
    elif {"num_tokens", "moe_dtype", "topk"} <= cols:
        skew = {s: 0.0 if s == "balanced" else POWER_LAW_EXPONENT * float(str(s).rsplit("_", 1)[-1])
                for s in df["distribution"].unique()}           # a few names over 10⁴–10⁵ rows
        raw_dtype = df["moe_dtype"]
        out = {"op": "moe", "dtype": raw_dtype.map(_DTYPE), "tokens": column("num_tokens"),
               "hidden": column("hidden_size"), "inter": column("inter_size"), "topk": column("topk"),
               "experts": column("num_experts"), "tp": column("moe_tp_size"), "ep": column("moe_ep_size"),
               "skew": df["distribution"].map(skew).to_numpy()}
    else:
        raise UnknownTable(f"{source}: not a recognised aiconfigurator table (columns: "
                           f"{', '.join(sorted(cols))})", len(df))
    if isinstance(out["dtype"], pd.Series):
        unmapped = out["dtype"].isna().to_numpy()
        for dt in sorted(set(raw_dtype[unmapped].astype(str))):
            left[f"{out['op']} of dtype {dt} (not priced)"] = unmapped & (raw_dtype.astype(str) == dt).to_numpy()
        out["dtype"] = out["dtype"].array
    if "kernel_source" in cols and isinstance(out["op"], str):
        taken = np.logical_or.reduce(list(left.values())) if left else np.zeros(len(df), bool)
        left |= alternatives(out, column("kernel_source"), taken)
    keep = ~np.logical_or.reduce(list(left.values())) if left else np.ones(len(df), bool)
    out |= {"gpu": dev, "latency_us": column("latency") * 1000.0, "source": source}
    conv = pd.DataFrame({c: x if isinstance(x, str) else x[keep] for c, x in out.items()},
                        index=pd.RangeIndex(int(keep.sum())))
    # each row counted once, under the first reason that leaves it out
    taken = np.zeros(len(df), bool)
    counts = {}
    for label, mask in left.items():
        n = int((mask & ~taken).sum())
        taken |= mask
        if n:
            counts[label] = n
    conv.attrs["left_out"] = counts
    return conv


def alternatives(out: dict, kernel: np.ndarray, taken: np.ndarray) -> dict:
    """Rows of a second kernel at shapes another kernel of the same dtype also timed: {reason: row
    mask}. A variant's rows may come from several kernels where vLLM picks them by shape (the
    H100's vLLM 0.24 FP8-block MoE: FlashInfer's CUTLASS experts at EP > 1, Triton at EP 1), but
    two kernels timed at one shape are alternatives, not what a server runs there; each such
    shape keeps the kernel with the most rows of its dtype in the table, and the others' rows are
    left out, named. ``out``: the converted columns (:func:`from_aiconfigurator`), ``kernel``:
    each row's ``kernel_source``, ``taken``: rows already left out."""
    shape = [c for c in SHAPE_COLUMNS.get(out["op"], ()) if c in out] + (["skew"] if "skew" in out else [])
    df = pd.DataFrame({"dtype": np.asarray(out["dtype"], object), "kernel": kernel,
                       **{c: np.asarray(out[c]) for c in shape}})[~taken]
    if df.empty or df.groupby("dtype")["kernel"].nunique().max() < 2:
        return {}
    n_kernels = df.groupby(["dtype", *shape])["kernel"].transform("nunique")
    rows = df.groupby(["dtype", "kernel"]).size()
    main = rows.groupby(level=0).idxmax().map(lambda t: t[1])     # each dtype's most-timed kernel
    second = (n_kernels > 1).to_numpy() & (df["kernel"].to_numpy() != df["dtype"].map(main).to_numpy())
    left = {}
    for k in sorted(set(df["kernel"][second])):
        mask = np.zeros(len(taken), bool)
        mask[df.index[second & (df["kernel"] == k).to_numpy()]] = True
        left[f"kernel {k} at shapes another kernel also timed (the dtype's most-timed kernel kept)"] = mask
    return left


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
        frames, unknown = [], {}
        for f in files:
            try:
                frames.append(read_ops(f, gpu))
            except UnknownTable as e:
                unknown[unknown_label(f)] = e.rows
        if not frames:
            raise RoofcalError(f"{path}: folder holds no per-op table roofcal reads "
                               f"({', '.join(sorted(unknown))})")
        df = pd.concat(frames, ignore_index=True)
        df.attrs["left_out"] = {**left_out(frames), **unknown}
        return df
    if path.suffix == ".parquet":
        from roofcal.resources import display
        try:
            raw = pd.read_parquet(path)
        except FileNotFoundError:
            raise RoofcalError(f"{path}: no such file")
        except Exception as e:  # pyarrow raises several types for corrupt files
            raise RoofcalError(f"{path}: not a readable parquet file ({type(e).__name__})")
        if "latency" not in raw.columns:
            raise RoofcalError(f"{path}: missing column 'latency'")
        conv = from_aiconfigurator(raw, display(path), gpu)
        left = dict(conv.attrs.get("left_out", {}))
        df = validate_table(conv, display(path))
        kset = table_kernel_set(raw)
    else:
        df, left, kset = read_ops_csv(path), {}, None
    kset = kernel_set_of(path) if kset is None else kset
    df["kernels"] = kset
    drop = np.zeros(len(df), bool)
    for s, op, dt in NOT_IN_GRAPH:
        if s == kset:
            drop |= ((df["op"] == op) & (df["dtype"] == dt)).to_numpy()
    if drop.any():
        left[f"{kset} GEMMs of dtype fp8_block (timed outside CUDA graphs)"] = int(drop.sum())
        df = df[~drop].reset_index(drop=True)
    df.attrs["left_out"] = left
    return df


def unknown_label(path: Path) -> str:
    """The left-out reason of a folder's table of a kind roofcal does not read (:class:`UnknownTable`)."""
    from roofcal.resources import display
    return f"table {display(path)} (not a per-op table roofcal reads)"


def left_out(frames) -> dict:
    """{reason: rows} left out of some tables :func:`read_ops` read, summed by reason."""
    out: dict[str, int] = {}
    for f in frames:
        for k, n in f.attrs.get("left_out", {}).items():
            out[k] = out.get(k, 0) + n
    return out


def write_ops_csv_text(df: pd.DataFrame) -> str:
    """Interchange CSV text: gpu, op, dtype, the shape columns present, latency_us."""
    shape = [c for c in ALL_SHAPES if c in df.columns and df[c].notna().any()]
    cols = ["gpu", "op", "dtype"] + shape + ["latency_us"]
    return df[cols].to_csv(index=False, float_format="%.10g", lineterminator="\n")

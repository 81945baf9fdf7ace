"""One measured kernel call → its :class:`~roofcal.physics.components.Work`: the shapes a per-op
row holds for each kernel kind, and the same components a whole step uses.
The shape columns of each kind (:data:`SHAPE_COLUMNS`) are tabulated, with the meaning of ``dtype``, in
:mod:`roofcal.measurements.ops`, which reads such tables.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

from roofcal.errors import RoofcalError
from roofcal.physics import components as C
from roofcal.physics.components.moe import MAX_EXPERTS
from roofcal.physics.hardware.datasheet import PEAK_FIELD, PER_US
from roofcal.programs import stored

SHAPE_COLUMNS = {
    "gemm": ("m", "n", "k"),
    "attn_prefill": ("batch", "seq", "cached", "heads", "kv_heads", "head_dim"),
    "attn_decode": ("batch", "context", "heads", "kv_heads", "head_dim"),
    "allreduce": ("num_gpus", "bytes"),
    **{c: ("num_gpus", "bytes") for c in C.COLLECTIVES},
    "moe": ("tokens", "hidden", "inter", "topk", "experts", "tp", "ep"),
}
OPTIONAL_COLUMNS = {"moe": ("skew",)}
DTYPES = {
    "gemm": ("bf16", "fp8", "fp8_block"),
    "attn_prefill": ("bf16", "fp8"),
    "attn_decode": ("bf16", "fp8"),
    "allreduce": ("custom", "custom_eager", "nccl"),
    **{c: ("nccl",) for c in C.COLLECTIVES},
    "moe": ("bf16", "fp8", "fp8_block", "int4"),
}
ALL_SHAPES = tuple(dict.fromkeys(c for cols in SHAPE_COLUMNS.values() for c in cols)) + ("skew",)
BYTES = {"bf16": 2.0, "fp8": 1.0, "fp8_block": 1.0, "int4": 0.5}
#: kinds whose work :func:`row_work` computes without their ``dtype`` (for an all-reduce, its
#: implementation): rows of any of their dtypes share one compiled program
DTYPE_FREE = frozenset({"allreduce", *C.COLLECTIVES})


def row_work(op: str, dtype: str, cols: dict, max_experts: int = MAX_EXPERTS) -> C.Work:
    """Work of measured rows (arrays in ``cols``) through the same components a step uses
    (``max_experts``: at least the largest ``experts`` of MoE rows, :func:`experts_bound`)."""
    f = {k: jnp.asarray(v, jnp.float32) for k, v in cols.items()}
    if op == "gemm":
        a = 2.0 if dtype == "bf16" else 1.0
        return C.gemm(f["m"], f["n"], f["k"], a, BYTES[dtype], 2.0, tiled=dtype == "fp8")
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
    if op in C.COLLECTIVES:
        return C.collective(op, f["num_gpus"], f["bytes"])
    if op == "moe":
        return C.moe(f["tokens"], f["hidden"], f["inter"], f["topk"], f["experts"], f["tp"],
                     f["ep"], BYTES[dtype], 2.0, 3.0, f["skew"] if "skew" in f else 0.0,
                     max_experts)
    raise RoofcalError(f"unknown op {op!r}")


#: rows of one call of a row-wise program over a kernel group: a group of up to the first is
#: computed padded to it, a larger one in blocks of the second (:func:`in_blocks`)
OP_ROW_SIZES = (256, 4_096)


def op_rows(n: int) -> int:
    """Rows of one call of a row-wise program (ideal times, features, a kernel's time) over a
    kernel group of ``n`` rows: 256 up to 256 rows, else 4,096, a block of :func:`in_blocks`.
    Every group of a kind shares the one program of each size (≈ 0.14–0.4 s each to compile)."""
    return OP_ROW_SIZES[0] if n <= OP_ROW_SIZES[0] else OP_ROW_SIZES[1]


def in_blocks(fn, n: int, tree, fill: float = 1.0):
    """``fn(tree)`` for a pytree of arrays of ``n`` rows (leading axis) and a row-wise ``fn``,
    computed in blocks of :func:`op_rows` rows (the last padded with ``fill``) and put back
    together as NumPy arrays of ``n`` rows. A row's value does not depend on the rows around it,
    only on its block's size, 256 or 4,096 (XLA's code for another row count may round a row's
    last bit otherwise: 2 of the H100 tables' 262,992 ideal memory times at 2,048 against 4,096).
    Blocks keep the temporaries small and reused (the MoE routing sums: 4,096 rows × 512
    experts); whole groups of up to 65,536 rows took fresh memory at every call (a warm
    ``roofcal fit``: 563,000 page faults, 227,000 in blocks; docs/limits.md#fit-speed)."""
    size = op_rows(n)
    total = -(-max(n, 1) // size) * size
    grown = jax.tree_util.tree_map(
        lambda a: np.pad(np.asarray(a), [(0, total - n)] + [(0, 0)] * (np.ndim(a) - 1), constant_values=fill), tree)
    parts = [fn(jax.tree_util.tree_map(lambda a: a[i:i + size], grown)) for i in range(0, total, size)]
    return jax.tree_util.tree_map(lambda *xs: np.concatenate([np.asarray(x) for x in xs])[:n], *parts)


def fastest_peak(gpu) -> float:
    """FLOP/µs: the fastest dense tensor peak of ``gpu`` (a :class:`GPUSpec`) in any dtype it
    has: no kernel computes its FLOPs faster, whatever it runs them in."""
    return max(getattr(gpu, f) * PER_US[f] for f in set(PEAK_FIELD.values()))


@stored(static_argnames=("op",))
def _row_flops(op: str, cols: dict):
    """(N,) FLOPs of rows of kind ``op`` at balanced routing (:func:`row_work`), in one compiled
    call; a row's FLOPs do not depend on its dtype (only its bytes do), so every variant of a
    kind shares the program."""
    return row_work(op, "bf16", cols).flops


def faster_than_peak(gpu, df: pd.DataFrame) -> pd.Series:
    """(N,) bool per row of a per-op table: measured in less time than its FLOPs (:func:`row_work`)
    take at ``gpu``'s :func:`fastest_peak` (µs = FLOP / (FLOP/µs)), so the kernel timed did less
    work than the row's shape states; the link kinds (no FLOPs) never. A MoE row's FLOPs are
    taken at balanced routing, the fewest its busiest GPU computes whatever the skew (and no
    power-law sums to run)."""
    out = np.zeros(len(df), bool)
    peak = fastest_peak(gpu)
    latency = df["latency_us"].to_numpy(np.float64)
    for _, op, dt, idx in groups(df):
        if op in DTYPE_FREE:
            continue
        cols = {c: df[c].to_numpy()[idx].astype(np.float32) for c in SHAPE_COLUMNS[op] if c in df.columns}
        flops = in_blocks(lambda c: _row_flops(op, c), len(idx), cols)
        out[idx] = latency[idx] < flops / peak
    return pd.Series(out, index=df.index)


def groups(df: pd.DataFrame):
    """Yield (gpu, op, dtype, row index array) for each homogeneous group of rows of a per-op
    table."""
    for (g, op, dt), idx in df.groupby(["gpu", "op", "dtype"], sort=True).indices.items():
        yield g, op, dt, np.sort(idx)

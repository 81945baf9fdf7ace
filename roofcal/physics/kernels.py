"""One measured kernel call → its :class:`~roofcal.physics.components.Work`: the shapes a per-op
row holds for each kernel kind, and the same components a whole step uses.
The shape columns of each kind (:data:`SHAPE_COLUMNS`) are tabulated, with the meaning of ``dtype``, in
:mod:`roofcal.measurements.ops`, which reads such tables.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pandas as pd

from roofcal.errors import RoofcalError
from roofcal.physics import components as C
from roofcal.physics.components.moe import MAX_EXPERTS

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
                     f["ep"], BYTES[dtype], 2.0, 3.0, f.get("skew", 0.0 * f["tokens"]),
                     max_experts)
    raise RoofcalError(f"unknown op {op!r}")


def groups(df: pd.DataFrame):
    """Yield (gpu, op, dtype, row index array) for each homogeneous group of rows of a per-op
    table."""
    for (g, op, dt), idx in df.groupby(["gpu", "op", "dtype"], sort=True).indices.items():
        yield g, op, dt, np.sort(idx)

"""Which shapes to time on a new GPU: a few per kernel, spread over the box of shapes.

A few-shot refit (``roofcal fit --prior``) learns each kernel's efficiency surface, a polynomial
in the kernel's standardized log-shapes (:func:`roofcal.model.correction.standardize`), from the
rows it is given. Rows drawn at random follow a sweep's crowd, and a polynomial is free to swing
at the edges and corners of the box where few of them sit. Taken farthest first — each next row
the one farthest from every row already taken, in the standardized shapes — the same number of
rows covers the box, edges first, then the gaps between: no shape of the sweep is farther from
the rows taken than twice the least that any n of its shapes reach (the greedy k-centre bound,
T. F. Gonzalez, "Clustering to minimize the maximum intercluster distance", 1985).

Measured leaving one GPU out (:func:`roofcal.bench.transfer.learning_curve`, 300 rows per kernel,
20 % of the target's rows held out, the bootstrap as prior; mean held-out per-op MAPE over kinds,
seeds 0 / 1 / 2), random rows against spread rows: A100 from the H100 7.56 / 7.97 / 7.24 % against
6.92 / 6.98 / 6.00; H100 from the A100 7.86 / 8.57 / 7.56 against 6.48 / 6.41 / 6.39; L40S from
the H100 14.9 / 15.4 / 15.2 against 11.9 / 12.9 / 12.2. The shapes alone choose; no timing is read.

:func:`farthest_first` picks positions; :func:`spread_rows` per kind/variant of a table;
:func:`plan` the rows of a sweep to time on a GPU (``roofcal gpu plan``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from roofcal.model import correction as K
from roofcal.physics.hardware import GPUSpec
from roofcal.physics.kernels import ALL_SHAPES, groups


def farthest_first(z: np.ndarray, n: int, seed: int = 0) -> np.ndarray:
    """Sorted positions of ``n`` rows of ``z`` (N, D) spread over their box: a seeded random first
    row, then each next the row farthest (Euclidean) from every row taken so far (ties: the first
    such row). All N positions when N ≤ ``n``, none when ``n`` < 1. Repeated shapes are taken only
    once every distinct one is.

    Hand check: z = [[0], [1], [2], [10]], n = 2, first row 0 → rows 0 and 3."""
    z = np.asarray(z, np.float64)
    if n < 1:
        return np.zeros(0, int)
    if len(z) <= n:
        return np.arange(len(z))
    first = int(np.random.default_rng(seed).integers(len(z)))
    taken = [first]
    d2 = ((z - z[first]) ** 2).sum(axis=1)
    for _ in range(n - 1):
        i = int(np.argmax(d2))
        taken.append(i)
        d2 = np.minimum(d2, ((z - z[i]) ** 2).sum(axis=1))
    return np.sort(np.asarray(taken))


def spread_rows(table: pd.DataFrame, gpu: GPUSpec, n: int, seed: int = 0,
                pool: np.ndarray | None = None) -> dict:
    """{kind/variant: row positions of ``table``}: ``n`` rows per kind/variant (or all it has)
    taken :func:`farthest_first` from ``pool`` (bool (N,); default every row) in the
    standardized shapes of its efficiency surface. ``gpu`` prices the rows; the shapes it
    standardizes do not depend on it."""
    from roofcal.model.predict import ideal_times
    pool = np.ones(len(table), bool) if pool is None else np.asarray(pool, bool)
    ideal = ideal_times(gpu, table)
    out = {}
    for _, op, dt, idx in groups(table):
        cand = idx[pool[idx]]
        z = ideal.rows(op, cand)[2]
        out[K.op_key(op, dt)] = cand[farthest_first(z, n, seed)]
    return out


def distinct_shapes(table: pd.DataFrame) -> pd.DataFrame:
    """One row per distinct (op, dtype, shape) of a per-op table, in the table's order: the same
    shape timed in several kernel sets or files is one shape to time."""
    keys = ["op", "dtype"] + [c for c in ALL_SHAPES if c in table.columns]
    return table.drop_duplicates(subset=keys).reset_index(drop=True)


def plan(shapes: pd.DataFrame, gpu: GPUSpec, n: int, seed: int = 0) -> pd.DataFrame:
    """The rows of a per-op sweep ``shapes`` to time on ``gpu``: its :func:`distinct_shapes`,
    ``n`` per kind/variant taken by :func:`spread_rows`, in the table's order, with ``gpu`` its
    name and ``latency_us`` empty (NaN), to be filled with the measured µs."""
    rows = distinct_shapes(shapes).assign(gpu=gpu.name)
    picked = spread_rows(rows, gpu, n, seed)
    keep = np.sort(np.concatenate(list(picked.values()))) if picked else np.zeros(0, int)
    return rows.iloc[keep].assign(latency_us=np.nan).reset_index(drop=True)


def read_shapes(paths=None) -> pd.DataFrame:
    """Per-op rows whose shapes a plan chooses from: the tables at ``paths`` (files or folders,
    any GPU; :func:`roofcal.measurements.ops.read_ops`), by default every per-op table bundled for
    the H100 (vLLM 0.14 and 0.24, NCCL: the sweeps of aiconfigurator's collector and nccl-tests)."""
    from roofcal.measurements import datasets
    from roofcal.measurements.ops import read_ops
    if not paths:
        return datasets.microbench_table("h100_sxm")
    return pd.concat([read_ops(p) for p in paths], ignore_index=True)


def only_variants(shapes: pd.DataFrame, variants, source: str = "--variants") -> pd.DataFrame:
    """The rows of ``shapes`` of the kind/variants named (``gemm/bf16``, …); all when none is;
    a name no row has is refused, naming what there is."""
    if not variants:
        return shapes
    key = shapes["op"] + "/" + shapes["dtype"]
    have = sorted(set(key))
    missing = [v for v in variants if v not in have]
    if missing:
        from roofcal.errors import RoofcalError
        raise RoofcalError(f"{source}: no shapes of {', '.join(missing)} (there are: {', '.join(have)})")
    return shapes[key.isin(list(variants)).to_numpy()].reset_index(drop=True)


def write_plan(rows: pd.DataFrame, out) -> None:
    """Write a :func:`plan` as an interchange CSV (``latency_us`` empty), atomically."""
    from roofcal.io import write_text_atomic
    from roofcal.measurements.ops import write_ops_csv_text
    write_text_atomic(out, write_ops_csv_text(rows))

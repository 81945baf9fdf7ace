"""Measurement files → an op table and step datasets, with provenance; the bundled defaults.

A ``--data`` path may be: a folder of per-op tables, an aiconfigurator ``.parquet`` table, a
per-op interchange ``.csv``, a splitwise ``.csv`` (recognised by its columns) or a step
``.jsonl`` with ``duration_us``. A folder's parquet table of a kind roofcal does not read (an MLA
table, say) is left out and counted by name; named on its own, it is refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from roofcal import resources
from roofcal.errors import RoofcalError
from roofcal.io import sha256_file
from roofcal.measurements.ops import UnknownTable, left_out, read_ops, unknown_label
from roofcal.measurements.stepdata import SPLITWISE_COLUMNS, read_splitwise, read_step_jsonl

#: what ``roofcal fit --gpu G`` fits when no ``--data`` is given (relative to the source tree)
BUNDLED = {
    "h100_sxm": ["data/microbench/h100_sxm/vllm-0.14.0", "data/microbench/h100_sxm/vllm-0.24.0",
                 "data/microbench/h100_sxm/nccl-2.27.3",
                 "data/steps/splitwise/llama2-70b_h100-80gb_tp4_tp8.csv"],
    "a100_sxm": ["data/microbench/a100_sxm/vllm-0.14.0", "data/microbench/a100_sxm/nccl-2.27.3"],
}


@dataclass
class Measurements:
    """Everything one fit or report reads."""

    ops: pd.DataFrame | None = None
    steps: list = field(default_factory=list)
    provenance: list = field(default_factory=list)
    #: per-op rows read but not priced, by reason: {label: rows} (:func:`roofcal.measurements.ops.left_out`)
    left_out: dict = field(default_factory=dict)


def bundled_paths(gpu: str) -> list[Path]:
    if gpu not in BUNDLED:
        raise RoofcalError(f"no bundled measurements for GPU '{gpu}' (bundled: "
                           f"{', '.join(BUNDLED)}); give --data FILE")
    return [resources.ROOT / p for p in BUNDLED[gpu]]


def _files(path: Path) -> list[Path]:
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.suffix in (".parquet", ".csv", ".jsonl"))
        if not files:
            raise RoofcalError(f"{path}: folder holds no .parquet, .csv or .jsonl measurements")
        return files
    if not path.exists():
        raise RoofcalError(f"{path}: no such file")
    return [path]


def is_splitwise(path: Path) -> bool:
    try:
        header = set(pd.read_csv(path, nrows=0).columns)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError):
        return False
    return SPLITWISE_COLUMNS <= header


def _names(gpu) -> set[str]:
    """The names a GPU's rows may carry: its datasheet name and aliases (lower case, '-' as '_')."""
    from roofcal.physics.hardware import gpu_key
    names = [gpu] if isinstance(gpu, str) else [gpu.name, *gpu.aliases]
    return {gpu_key(n) for n in names}


def _datasheet(gpu):
    """``gpu``'s datasheet (:func:`~roofcal.physics.hardware.load_gpu`: a :class:`GPUSpec` as it
    is, a name resolved), else None (a name no datasheet answers to: no peaks known)."""
    from roofcal.physics.hardware import load_gpu
    try:
        return load_gpu(gpu)
    except RoofcalError:
        return None


def _within_peak(ops: pd.DataFrame, gpu, left: dict) -> pd.DataFrame:
    """``ops`` without the rows timed faster than ``gpu``'s fastest tensor peak computes their
    FLOPs (:func:`roofcal.physics.kernels.faster_than_peak`), counted in ``left`` per kind/variant:
    no efficiency (≤ 1) prices them, and they say the kernel did less work than its shape."""
    from roofcal.physics.kernels import faster_than_peak
    fast = faster_than_peak(gpu, ops).to_numpy()
    if not fast.any():
        return ops
    for (op, dt), n in ops[fast].groupby(["op", "dtype"]).size().items():
        left[f"{op}/{dt} faster than the GPU's fastest tensor peak allows"] = int(n)
    return ops[~fast].reset_index(drop=True)


def load(paths, gpu=None, model=None, tp=None) -> Measurements:
    """Read measurement files; ``model``/``tp`` apply to step JSONL rows that do not name them.

    ``gpu``: a datasheet name or a :class:`~roofcal.physics.hardware.GPUSpec`. Per-op rows for
    another GPU are refused (one fit is for one GPU); rows named by one of the datasheet's aliases
    (the name nvidia-smi reports, as a collector writes it) are this GPU's. Where the datasheet
    is known (a :class:`GPUSpec`, or a name that resolves to one), rows timed faster than its
    fastest tensor peak computes their FLOPs are left out and counted (:func:`_within_peak`).
    """
    m = Measurements()
    frames, unknown = [], {}
    for p in paths:
        in_folder = Path(p).is_dir()
        for f in _files(Path(p)):
            name = resources.display(f)
            if f.suffix == ".jsonl":
                data = read_step_jsonl(f, model=model, gpu=gpu, tp=tp, source=name)
                m.steps.extend(data)
                kind, rows = "steps", sum(len(d) for d in data)
            elif f.suffix == ".csv" and is_splitwise(f):
                data = read_splitwise(f, source=name)
                m.steps.extend(data)
                kind, rows = "steps (splitwise)", sum(len(d) for d in data)
            else:
                try:
                    df = read_ops(f)
                except UnknownTable as e:
                    if not in_folder:                # a table named on its own is refused
                        raise
                    unknown[unknown_label(f)] = e.rows
                    continue
                frames.append(df)
                kind, rows = "per-op", len(df)
            m.provenance.append({"path": name, "sha256": sha256_file(f), "kind": kind, "rows": rows})
    if frames:
        m.ops = pd.concat(frames, ignore_index=True)
    m.left_out = {**left_out(frames), **unknown}
    if gpu is not None:
        name, names = (gpu if isinstance(gpu, str) else gpu.name), _names(gpu)
        if m.ops is not None:
            from roofcal.physics.hardware import gpu_key
            seen = {g: gpu_key(g) in names for g in m.ops["gpu"].unique()}
            other = sorted(g for g, ok in seen.items() if not ok)
            if other:
                src = m.ops.loc[m.ops["gpu"] == other[0], "source"].iloc[0]
                raise RoofcalError(f"{src}: rows are for GPU '{other[0]}', not '{name}' (give the "
                                   f"name the table carries as one of the datasheet's aliases)")
            if any(g != name for g in seen):
                m.ops["gpu"] = name
            spec = _datasheet(gpu)
            if spec is not None:
                m.ops = _within_peak(m.ops, spec, m.left_out)
        for d in m.steps:
            if d.gpu != name:
                raise RoofcalError(f"{d.source}: steps are for GPU '{d.gpu}', not '{name}'")
    if m.ops is None and not m.steps:
        raise RoofcalError("no measurements found in " + ", ".join(str(p) for p in paths)
                           + (f" ({', '.join(sorted(unknown))})" if unknown else ""))
    return m


def microbench_table(gpu: str, kernels: str | None = None):
    """All bundled per-op rows of a GPU (vLLM kernels and NCCL), as one table; with ``kernels``,
    only that kernel set's rows and the shared ones (NCCL)."""
    paths = [p for p in bundled_paths(gpu) if "microbench" in str(p)]
    df = load(paths, gpu=gpu).ops
    if kernels is not None:
        if kernels not in set(df["kernels"].unique()):
            raise RoofcalError(f"no bundled {gpu} per-op rows of kernel set '{kernels}' (sets: "
                               f"{', '.join(sorted(set(df['kernels']) - {''}))})")
        df = df[df["kernels"].isin([kernels, ""])]
    return df.reset_index(drop=True)

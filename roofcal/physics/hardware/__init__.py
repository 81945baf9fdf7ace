"""Bundled GPU datasheets (``*.yaml`` beside this file) and lookup by name, alias or path."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from roofcal.errors import RoofcalError
from roofcal.physics.hardware.datasheet import (NUMERIC_FIELDS, GPUSpec, datasheet_dict, datasheet_yaml,
                                                parse_datasheet, read_datasheet)

HERE = Path(__file__).resolve().parent

__all__ = ["GPUSpec", "NUMERIC_FIELDS", "bundled_gpus", "datasheet_dict", "datasheet_yaml", "gpu_key", "load_gpu",
           "parse_datasheet", "read_datasheet"]


@lru_cache(maxsize=None)
def _bundled() -> dict[str, GPUSpec]:
    return {p.stem: read_datasheet(p) for p in sorted(HERE.glob("*.yaml"))}


def bundled_gpus() -> list[GPUSpec]:
    """Every bundled datasheet, sorted by name."""
    return list(_bundled().values())


def gpu_key(name: str) -> str:
    """A GPU name as names are compared: lower case, '-' and spaces as '_' ("NVIDIA H100 80GB
    HBM3", the name nvidia-smi reports, and ``nvidia-h100-80gb-hbm3`` are one name)."""
    return str(name).strip().lower().replace("-", "_").replace(" ", "_")


def load_gpu(gpu: "str | Path | GPUSpec") -> GPUSpec:
    """A :class:`GPUSpec` from a bundled name or alias (case-insensitive, :func:`gpu_key`; the
    name nvidia-smi reports is an alias of every bundled datasheet) or a YAML path."""
    if isinstance(gpu, GPUSpec):
        return gpu
    key = str(gpu)
    if key.endswith((".yaml", ".yml")) or Path(key).is_file():
        return read_datasheet(key)
    norm = gpu_key(key)
    for spec in _bundled().values():
        names = {gpu_key(spec.name)} | {gpu_key(a) for a in spec.aliases}
        if norm in names:
            return spec
    raise RoofcalError(f"unknown GPU {key!r} (bundled: {', '.join(_bundled())}; or give a "
                       f"datasheet .yaml path)")

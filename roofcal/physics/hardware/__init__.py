"""Bundled GPU datasheets (``*.yaml`` beside this file) and lookup by name, alias or path."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from roofcal.errors import RoofcalError
from roofcal.physics.hardware.datasheet import (NUMERIC_FIELDS, GPUSpec, datasheet_dict, datasheet_yaml,
                                                parse_datasheet, read_datasheet)

HERE = Path(__file__).resolve().parent

__all__ = ["GPUSpec", "NUMERIC_FIELDS", "bundled_gpus", "datasheet_dict", "datasheet_yaml", "load_gpu",
           "parse_datasheet", "read_datasheet"]


@lru_cache(maxsize=None)
def _bundled() -> dict[str, GPUSpec]:
    return {p.stem: read_datasheet(p) for p in sorted(HERE.glob("*.yaml"))}


def bundled_gpus() -> list[GPUSpec]:
    """Every bundled datasheet, sorted by name."""
    return list(_bundled().values())


def load_gpu(gpu: "str | Path | GPUSpec") -> GPUSpec:
    """A :class:`GPUSpec` from a bundled name or alias (case-insensitive) or a YAML path."""
    if isinstance(gpu, GPUSpec):
        return gpu
    key = str(gpu)
    if key.endswith((".yaml", ".yml")) or Path(key).is_file():
        return read_datasheet(key)
    norm = key.lower().replace("-", "_")
    for spec in _bundled().values():
        names = {spec.name.lower()} | {a.lower().replace("-", "_") for a in spec.aliases}
        if norm in names:
            return spec
    raise RoofcalError(f"unknown GPU {key!r} (bundled: {', '.join(_bundled())}; or give a "
                       f"datasheet .yaml path)")

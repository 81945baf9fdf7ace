"""Check :mod:`roofcal.blis.basis` against step times computed by BLIS's Go code.

A goldens file (schema in ``data/blis/trained_physics_goldens.json``'s ``schema`` entry) holds
cases of (model config, hardware, tp, dp, moe_comm_backend, β, batch) → ``step_time_us``. Model
config paths are relative to the goldens file's folder; hardware comes from the case's inline
``hardware_calib`` or from ``hardware_config.entries[<case.hardware>]``. Everything is recomputed
from those inputs: the recorded ``basis``/``features`` are never read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import jax
import numpy as np

from roofcal.blis.basis import (
    BlisBatch,
    BlisConstants,
    BlisHardware,
    basis_for_constants,
    blis_constants,
    combine_basis,
    effective_beta,
    stack_constants,
    truncate_step_time,
    validate_blis_coeffs,
)
from roofcal.blis.config import BlisModel, load_blis_model
from roofcal.errors import RoofcalError
from roofcal.io import read_json_object


@dataclass(frozen=True)
class GoldenReport:
    """Outcome of :func:`check_goldens`: ``mismatches`` lists (case id, expected µs, got µs)."""

    n_cases: int
    max_abs_diff_us: int
    mismatches: list[tuple[str, int, int]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.mismatches


def _get(obj: Any, key: str, path: Path, where: str) -> Any:
    """``obj[key]``, or a one-line :class:`RoofcalError` naming the file and the field."""
    if not isinstance(obj, Mapping) or key not in obj:
        raise RoofcalError(f"{path}: field '{where}{key}' missing")
    return obj[key]


def _read_json(path: Path) -> dict:
    return read_json_object(path, "goldens file")


@dataclass(frozen=True)
class _Case:
    """One golden case's inputs, resolved (model parsed, hardware decoded)."""

    id: str
    model: BlisModel
    hw: BlisHardware
    tp: int
    dp: int
    backend: str
    beta: list[float]
    batch: list
    expected: int


def _int_field(case: Mapping, key: str, path: Path, where: str) -> int:
    value = _get(case, key, path, where)
    if isinstance(value, bool) or not isinstance(value, int):
        raise RoofcalError(f"{path}: field '{where}{key}': expected an integer, got {value!r}")
    return value


def _resolve_cases(path: Path, data: Mapping) -> list[_Case]:
    """Parse every case, loading each (config, model name) once."""
    folder = path.parent
    cases = _get(data, "cases", path, "")
    if not isinstance(cases, list):
        raise RoofcalError(f"{path}: field 'cases': expected a list")
    models: dict[tuple[str, str], BlisModel] = {}
    out = []
    for i, case in enumerate(cases):
        w = f"cases[{i}]."
        cid = str(_get(case, "id", path, w))
        cfg_name = _get(case, "model_config", path, w)
        if not isinstance(cfg_name, str):
            raise RoofcalError(f"{path}: field '{w}model_config': expected a string, got {cfg_name!r}")
        model_name = _get(case, "model", path, w)
        if not isinstance(model_name, str):
            raise RoofcalError(f"{path}: field '{w}model': expected a string, got {model_name!r}")
        entry = _get(_get(data, "model_configs", path, ""), cfg_name, path, "model_configs.")
        rel = _get(entry, "path", path, f"model_configs.{cfg_name}.")
        key = (str(rel), model_name)
        if key not in models:
            models[key] = load_blis_model(folder / rel, model_name)
        if "hardware_calib" in case:
            hw = BlisHardware.from_dict(case["hardware_calib"], f"{path}: {w}hardware_calib")
        else:
            gpu = _get(case, "hardware", path, w)
            entries = _get(_get(data, "hardware_config", path, ""), "entries", path, "hardware_config.")
            calib = _get(entries, gpu, path, "hardware_config.entries.")
            hw = BlisHardware.from_dict(calib, f"{path}: hardware_config.entries.{gpu}")
        backend = _get(case, "moe_comm_backend", path, w)
        beta = _get(case, "beta_coeffs", path, w)
        alpha = _get(case, "alpha_coeffs", path, w)
        batch = _get(case, "batch", path, w)
        if not isinstance(batch, list):
            raise RoofcalError(f"{path}: field '{w}batch': expected a list of requests")
        try:
            validate_blis_coeffs(alpha, beta)
        except (RoofcalError, TypeError, ValueError) as err:
            raise RoofcalError(f"{path}: case {cid}: {err}") from None
        out.append(
            _Case(
                id=cid,
                model=models[key],
                hw=hw,
                tp=_int_field(case, "tp", path, w),
                dp=_int_field(case, "dp", path, w),
                backend=str(backend),
                beta=list(beta),
                batch=batch,
                expected=_int_field(case, "step_time_us", path, w),
            )
        )
    return out


def _basis_by_case(path: Path, cases: list[_Case]) -> dict[str, Any]:
    """Basis terms for every case (one row each, in case order) in a single vectorised call:
    constants are derived once per (model, hardware, tp, dp, backend) group and stacked per row."""
    groups: dict[tuple, BlisConstants] = {}
    rows = []
    for c in cases:
        key = (c.model, c.hw, c.tp, c.dp, c.backend)
        if key not in groups:
            try:
                groups[key] = blis_constants(c.model, c.hw, c.tp, c.dp, c.backend)
            except RoofcalError as err:
                raise RoofcalError(f"{path}: case {c.id}: {err}") from None
        rows.append(groups[key])
    batch = BlisBatch.from_steps([c.batch for c in cases], f"{path}: batch")
    return basis_for_constants(stack_constants(rows), batch)


def check_goldens(path: str | Path) -> GoldenReport:
    """Recompute every case's BLIS step time and compare with ``step_time_us`` (exact integers)."""
    path = Path(path)
    cases = _resolve_cases(path, _read_json(path))
    if not cases:
        return GoldenReport(n_cases=0, max_abs_diff_us=0)
    basis = _basis_by_case(path, cases)
    eff = [effective_beta(c.beta) for c in cases]
    beta = np.stack([e.beta for e in eff])  # (n_cases, 11): each case has its own β length
    pf_split = np.asarray([e.prefill_split for e in eff])
    dc_split = np.asarray([e.decode_split for e in eff])
    with jax.enable_x64(True):
        total = jax.jit(combine_basis)(basis, beta, pf_split, dc_split)
        got = np.asarray(jax.jit(truncate_step_time)(total, basis["batch_size"]))
    expected = np.asarray([c.expected for c in cases], dtype=np.int64)
    diff = np.abs(got - expected)
    mismatches = [(c.id, int(e), int(g)) for c, e, g in zip(cases, expected, got) if e != g]
    return GoldenReport(n_cases=len(cases), max_abs_diff_us=int(diff.max()), mismatches=mismatches)

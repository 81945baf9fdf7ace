"""Residual rows from BLIS trained-physics coefficients: each step's components are BLIS's terms
β·basis, computed with the exact basis of :mod:`roofcal.blis.basis`, so ``roofcal residuals --blis``
shows, for example, a prefill-compute β far below 1 compensating elsewhere."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from roofcal.errors import RoofcalError
from roofcal.physics.hardware import GPUSpec, load_gpu
from roofcal.inspection.residuals import _concat, _step_frame, pad_batch
from roofcal.blis.basis import BlisHardware
from roofcal.blis.fit import BETA_BASIS
from roofcal.blis.sampling import blis_requests_from_steps

#: BLIS's trained-physics terms as reported: (component, β symbol, basis term), in report order
_REPORTED = (
    ("pf_compute", "β1a", "t_pf_compute_us"),
    ("pf_kv", "β1b", "t_pf_kv_us"),
    ("dc_compute", "β2a", "t_dc_compute_us"),
    ("dc_kv", "β2b", "t_dc_kv_us"),
    ("weights", "β3", "t_weight_us"),
    ("tp_allreduce", "β4", "t_tp_allreduce_us"),
    ("moe_dispatch", "β_EP", "t_moe_dispatch_us"),
    ("per_layer", "β5", "num_layers"),
    ("per_request", "β6", "batch_size"),
    ("per_step", "β7", "constant"),
    ("moe_layer", "β8", "interleaved_moe_layers"),
)
#: (component, β symbol, index in the effective 11-β vector, basis term); the index is the term's
#: position in :data:`roofcal.blis.fit.BETA_BASIS`
BLIS_TERMS = tuple((name, sym, BETA_BASIS.index(term), term) for name, sym, term in _REPORTED)


@dataclass(frozen=True)
class BlisCoeffs:
    """BLIS trained-physics coefficients: α (µs, request-level: they do not enter step time), β,
    and the BLIS hardware entry they were fitted with (None: use the GPU's bundled entry)."""

    alpha: tuple
    beta: tuple
    source: str
    hardware: BlisHardware | None = None
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

def read_blis_coeffs(path) -> BlisCoeffs:
    """α/β from a BLIS ``defaults.yaml`` (its ``trained_physics_coefficients`` block), a
    BLIS-form file (``roofcal blis fit``; its ``hardware`` entry is used for the basis), or any
    YAML holding ``beta_coeffs`` / ``beta`` (and optionally ``alpha_coeffs`` / ``alpha``) at a
    depth ≤ 3. Read as :mod:`roofcal.blis.defaults_yaml` reads YAML (duplicate keys refused)."""
    from roofcal.blis.basis import validate_blis_coeffs
    from roofcal.blis.form import BLIS_FORM_SCHEMA, form_from_dict
    from roofcal.blis.defaults_yaml import yaml_numbers, read_text_exact, strict_yaml_load
    from roofcal.resources import display
    path = Path(path)
    doc = strict_yaml_load(read_text_exact(path, "BLIS coefficient file"), str(path))
    if isinstance(doc, dict) and doc.get("schema") == BLIS_FORM_SCHEMA:
        f = form_from_dict(doc, str(path))
        return BlisCoeffs(f.alpha, f.beta, display(path), f.hardware_calib, f.hardware)
    found = _find_beta_block(doc)
    if found is None or not isinstance(found[0], dict):
        raise RoofcalError(f"{path}: field 'trained_physics_coefficients.beta_coeffs' is missing")
    block, where = found
    beta = yaml_numbers(block.get("beta_coeffs", block.get("beta")), f"{path}: field '{where}beta_coeffs'")
    alpha = yaml_numbers(block.get("alpha_coeffs", block.get("alpha", [0.0, 0.0, 0.0])),
                     f"{path}: field '{where}alpha_coeffs'")
    try:
        validate_blis_coeffs(alpha, beta)
    except RoofcalError as e:
        raise RoofcalError(f"{path}: field '{where}': {e}")
    hw, name = None, ""
    if isinstance(block.get("hardware"), dict) and "TFlopsPeak" in block["hardware"]:
        name = str(block["hardware"].get("name", ""))
        hw = BlisHardware.from_dict(block["hardware"], f"{path}: field '{where}hardware'")
    return BlisCoeffs(tuple(alpha), tuple(beta), display(path), hw, name)

def blis_hardware(gpu: GPUSpec):
    """BLIS's hardware entry for ``gpu`` (the bundled hardware_config.json entry that is one of the
    datasheet's aliases), else BLIS's fields read off the datasheet itself."""
    from roofcal import resources
    from roofcal.blis.hardware_json import hardware_for_gpu
    try:
        return hardware_for_gpu(resources.BLIS_HARDWARE, gpu)[1]
    except RoofcalError:
        return BlisHardware(tflops_peak=gpu.bf16_tflops, bw_peak_tbs=gpu.hbm_bandwidth_tbs,
                            tflops_fp8=gpu.fp8_tflops)


def blis_components(basis: dict, beta) -> dict:
    """BLIS's step time split into its terms β·basis (µs per step); they sum to
    :func:`roofcal.blis.basis.blis_step_time_float`. Without the split forms (< 9 / < 10 β) the
    prefill / decode term is β·max(compute, kv), reported under ``pf_compute`` / ``dc_compute``."""
    from roofcal.blis.basis import effective_beta
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

    ``work_us`` is BLIS's unscaled roofline: max(compute terms, KV + weight terms) + TP all-reduce
    + MoE dispatch. Each step's model is read from the config file it was loaded from.
    """
    from roofcal.blis.basis import basis_for_constants
    from roofcal.blis.fit import Deployment, resolve_deployment
    frames = []
    for d in steps:
        hw = coeffs.hardware if coeffs.hardware is not None else blis_hardware(load_gpu(d.gpu))
        r = resolve_deployment(Deployment(d.model.ref, d.tp), hw, where=f"{d.source}: {d.model.name} tp {d.tp}",
                               spec=d.model)
        basis = basis_for_constants(r.constants, blis_requests_from_steps(pad_batch(d.batch), d.source))
        v = {k: np.asarray(x, np.float64)[: len(d)] for k, x in basis.items()}
        tc = v["t_pf_compute_us"] + v["t_dc_compute_us"]
        tm = v["t_pf_kv_us"] + v["t_dc_kv_us"] + v["t_weight_us"]
        work = np.maximum(tc, tm) + v["t_tp_allreduce_us"] + v["t_moe_dispatch_us"]
        frames.append(_step_frame(d, blis_components(v, coeffs.beta), work,
                                  np.where(tc >= tm, "compute", "memory")))
    return _concat(frames)

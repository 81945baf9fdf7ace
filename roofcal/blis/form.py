"""BLIS-form coefficient files: BLIS's alphas and betas with their provenance.

**BLIS-form file** (schema ``roofcal-blis/1``, written by ``roofcal blis fit``)::

    schema: roofcal-blis/1
    roofcal_version: 0.1.0
    hardware: {name: H100, TFlopsPeak: 989.5, TFlopsFP8: 1979.0, BwPeakTBs: 3.35}
    deployments: [{model: llama-2-70b-hf, tp: 4}, ...]     # what the betas were fitted for (distilled
                                                            # and measured; model: name or config path)
    alpha: [α0, α1, α2]                                     # µs (BLIS alpha_coeffs)
    alpha_source: kept from data/blis/defaults.yaml (no request-level data)
    beta: [β1a, β2a, β3, β4, β5, β6, β7, β8, β1b, β2b, β_EP]   # BLIS beta_coeffs order (7–11 values)
    beta_names: [beta1a_prefill_compute, ...]               # optional, informative
    provenance: {method, coeffs, defaults, hardware_config, steps, fit, ...}
    metrics: {heldout: {distill|measured: {all|<phase>|<deployment>: {n, native_mape, blis_mape, input_mape, ...}}}, train: ...}

``hardware`` is the BLIS ``hardware_config.json`` entry the basis was evaluated with (the betas
scale basis terms divided by its peaks, so they belong to it). Loading refuses unknown keys and
coefficients BLIS would refuse.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from roofcal import __version__
from roofcal.blis.basis import N_BETA, BlisHardware, validate_blis_coeffs
from roofcal.blis.defaults_yaml import read_text_exact, strict_yaml_load, yaml_float, yaml_numbers
from roofcal.blis.fit import BETA_NAMES, Deployment, deployments_from_records
from roofcal.blis.hardware_json import require_peaks
from roofcal.errors import RoofcalError
from roofcal.io import write_text_atomic, yaml_text
from roofcal.model.coeffs import READS as COEFFS_READS, SCHEMA as COEFFS_SCHEMA

BLIS_FORM_SCHEMA = "roofcal-blis/1"


def validate_export_coeffs(alpha: Sequence[float], beta: Sequence[float], source: str) -> None:
    """BLIS's rules for what we write: ≥ 3 alphas, 7–11 betas, all finite and ≥ 0."""
    try:
        validate_blis_coeffs(alpha, beta)
    except (TypeError, ValueError) as err:
        raise RoofcalError(f"{source}: {err}") from None
    if len(beta) > N_BETA:
        raise RoofcalError(f"{source}: {len(beta)} beta values; BLIS reads at most {N_BETA} (it would silently drop the rest)")


def source_note(path, sha256: str, kernels: str | None = None) -> str:
    """``of PATH (sha256 <first 12>, kernels K)``: the roofcal file a BLIS export came from, for
    the provenance line above the coefficients of a ``defaults.yaml``."""
    return f"of {path} (sha256 {str(sha256)[:12]}" + (f", kernels {kernels}" if kernels else "") + ")"


def blis_flags(alpha: Sequence[float], beta: Sequence[float]) -> str:
    """The equivalent ``blis run`` flags."""
    join = lambda v: ",".join(yaml_float(x) for x in v)
    return f"--alpha-coeffs {join(alpha)} --beta-coeffs {join(beta)}"


@dataclass(frozen=True)
class BlisForm:
    """BLIS-form coefficients with their provenance (schema ``roofcal-blis/1``, see module doc)."""

    alpha: tuple[float, ...]
    beta: tuple[float, ...]
    hardware: str
    hardware_calib: BlisHardware  # the entry's peaks (TFlopsPeak, TFlopsFP8, BwPeakTBs); validated
    deployments: tuple[Deployment, ...]
    alpha_source: str
    provenance: dict = field(default_factory=dict)
    metrics: dict = field(default_factory=dict)
    source: str = "<memory>"


_FORM_KEYS = ("schema", "roofcal_version", "hardware", "deployments", "alpha", "alpha_source", "beta",
              "beta_names", "provenance", "metrics")
_CALIB_KEYS = ("TFlopsPeak", "TFlopsFP8", "BwPeakTBs")


def form_to_yaml(form: BlisForm) -> str:
    """The text of a BLIS-form file (deterministic)."""
    doc = {
        "schema": BLIS_FORM_SCHEMA,
        "roofcal_version": __version__,
        "hardware": {"name": form.hardware, "TFlopsPeak": float(form.hardware_calib.tflops_peak),
                     "TFlopsFP8": float(form.hardware_calib.tflops_fp8),
                     "BwPeakTBs": float(form.hardware_calib.bw_peak_tbs)},
        "deployments": [d.record() for d in form.deployments],
        "alpha": [float(a) for a in form.alpha],
        "alpha_source": form.alpha_source,
        "beta": [float(b) for b in form.beta],
        "beta_names": list(BETA_NAMES[: len(form.beta)]),
        "provenance": form.provenance,
        "metrics": form.metrics,
    }
    header = (
        f"# roofcal BLIS-form coefficients (schema {BLIS_FORM_SCHEMA}); see roofcal/blis/form.py.\n"
        "# alpha/beta are BLIS trained-physics alpha_coeffs/beta_coeffs (beta in BLIS index order), fitted\n"
        "# for the hardware entry and deployments below. Export: roofcal export blis --coeffs THIS ...\n"
    )
    return header + yaml_text(doc, sort_keys=False, allow_unicode=True, width=110, default_flow_style=None)


def save_form(form: BlisForm, path: str | Path) -> None:
    """Validate, then write atomically."""
    validate_export_coeffs(form.alpha, form.beta, str(path))
    write_text_atomic(path, form_to_yaml(form))


def form_from_dict(doc: Any, source: str) -> BlisForm:
    """Validate a parsed BLIS-form document (unknown keys refused)."""
    if not isinstance(doc, dict):
        raise RoofcalError(f"{source}: not a roofcal BLIS-form file")
    if doc.get("schema") != BLIS_FORM_SCHEMA:
        raise RoofcalError(f"{source}: field 'schema' is {doc.get('schema')!r}; expected {BLIS_FORM_SCHEMA!r}")
    for key in doc:
        if key not in _FORM_KEYS:
            raise RoofcalError(f"{source}: unknown field '{key}' (known: {', '.join(_FORM_KEYS)})")
    for key in ("hardware", "deployments", "alpha", "beta"):
        if key not in doc:
            raise RoofcalError(f"{source}: field '{key}' missing")
    hw = doc["hardware"]
    if not isinstance(hw, dict) or not isinstance(hw.get("name"), str) or not hw["name"]:
        raise RoofcalError(f"{source}: field 'hardware' must give the BLIS hardware entry 'name'")
    calib = require_peaks(BlisHardware.from_dict({k: hw.get(k) for k in _CALIB_KEYS}, f"{source}: hardware"),
                           source, "hardware.")
    alpha = yaml_numbers(doc["alpha"], f"{source}: field 'alpha'")
    beta = yaml_numbers(doc["beta"], f"{source}: field 'beta'")
    validate_export_coeffs(alpha, beta, source)
    for key, typ in (("alpha_source", str), ("provenance", dict), ("metrics", dict), ("beta_names", list)):
        if key in doc and not isinstance(doc[key], typ):
            raise RoofcalError(f"{source}: field '{key}' must be a {typ.__name__}")
    if "beta_names" in doc and list(doc["beta_names"]) != list(BETA_NAMES[: len(beta)]):
        raise RoofcalError(f"{source}: field 'beta_names' must be {', '.join(BETA_NAMES[: len(beta)])} (BLIS order)")
    deps = deployments_from_records(doc["deployments"], f"{source}: field 'deployments'")
    return BlisForm(tuple(alpha), tuple(beta), hw["name"], calib, tuple(deps), doc.get("alpha_source", ""),
                    doc.get("provenance", {}), doc.get("metrics", {}), source)


def load_form(path: str | Path) -> BlisForm:
    """Read and validate a BLIS-form file."""
    path = Path(path)
    return form_from_dict(strict_yaml_load(read_text_exact(path, "BLIS-form file"), str(path)), str(path))

def read_coefficient_doc(path: str | Path) -> tuple[str, Any]:
    """(schema, parsed document) of a roofcal YAML file (coefficients or BLIS-form), read and parsed
    once (strictly: duplicate keys refused)."""
    path = Path(path)
    doc = strict_yaml_load(read_text_exact(path, "coefficient file"), str(path))
    schema = doc.get("schema") if isinstance(doc, dict) else None
    if schema not in (*COEFFS_READS, BLIS_FORM_SCHEMA):
        raise RoofcalError(f"{path}: field 'schema' is {schema!r}; expected {COEFFS_SCHEMA!r} (roofcal fit) "
                           f"or {BLIS_FORM_SCHEMA!r} (roofcal blis fit)")
    return schema, doc

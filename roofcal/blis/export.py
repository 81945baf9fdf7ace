"""Export to BLIS: BLIS-form coefficient files, ``defaults.yaml`` line surgery, hardware entries.

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

**defaults.yaml export** (:func:`replace_coefficients`): only the ``alpha_coeffs`` and
``beta_coeffs`` entries of ``trained_physics_coefficients`` are rewritten (each as one flow-style
line ending in a provenance comment); an entry whose values are unchanged is left alone, and every
other byte of the file is kept. Located with PyYAML's node positions, so comments, key order and
formatting elsewhere survive; a block-style list is collapsed onto its key's line.

**hardware_config.json entry** (:func:`hardware_entry`): ``TFlopsPeak`` (dense BF16), ``TFlopsFP8``
(dense FP8, 0 without FP8 tensor cores), ``BwPeakTBs``, ``MemoryGiB`` from roofcal's datasheet;
``mfuPrefill`` / ``mfuDecode`` from a coefficient file, defined as the *in-step FLOP utilisation of
representative GEMMs*: FLOPs / (peak × calibrated time × step-level GEMM scale), summed over the
four GEMMs of a Llama-3.1-8B layer (QKV, O, gate-up, down; BF16) at m = 2048 tokens (a full
``max_num_batched_tokens`` prefill chunk) and m = 256 tokens (a full ``max_num_seqs`` decode
batch). That is the MFU at which BLIS's roofline compute term reproduces the calibrated GEMM time
of a full prefill chunk / full decode batch. Merging (:func:`merge_hardware_entry`) rewrites only
that entry's value (or appends it); other entries keep their order and bytes.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from roofcal import __version__, resources
from roofcal.blis.basis import N_BETA, BlisHardware, validate_blis_coeffs
from roofcal.blis.fit import (
    BETA_NAMES,
    BlisFitSettings,
    Deployment,
    build_rows,
    deployments_from_records,
    fit_blis,
    resolve_deployment,
    score_rows,
)
from roofcal.errors import RoofcalError
from roofcal.io import read_json_object, sha256_file, write_bytes_atomic, write_text_atomic

BLIS_FORM_SCHEMA = "roofcal-blis/1"
COEFFS_SCHEMA = "roofcal-coeffs/1"

#: GPU names in BLIS's bundled hardware_config.json (each is an alias of a roofcal datasheet).
BLIS_GPU_NAMES = ("H100", "A100-SXM", "A100-80", "L40S")

#: (n, k) of the GEMMs of a Llama-3.1-8B layer at TP 1: QKV, O, gate-up, down.
MFU_GEMMS = ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336))
MFU_PREFILL_TOKENS = 2048
MFU_DECODE_TOKENS = 256

BUNDLED_DEFAULTS = resources.BLIS / "defaults.yaml"
BUNDLED_HARDWARE = resources.BLIS / "hardware_config.json"


# --------------------------------------------------------------------------------------------
# strict YAML and number formatting


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys (as BLIS's yaml.v3 decoder does)."""


def _construct_mapping(loader, node, deep=False):
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return yaml.SafeLoader.construct_mapping(loader, node, deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def strict_yaml_load(text: str, source: str) -> Any:
    """Parse YAML refusing duplicate keys; errors name ``source`` and the line."""
    try:
        return yaml.load(text, Loader=_StrictLoader)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        what = getattr(err, "problem", None) or "invalid YAML"
        raise RoofcalError(f"{source}: {what}" + (f" at line {mark.line + 1}" if mark else "")) from None


def yaml_float(x: float) -> str:
    """Shortest round-trip text of ``x`` that YAML 1.1 (PyYAML) and 1.2 (BLIS) both read as a float."""
    text = repr(float(x))
    if "e" in text:
        mant, exp = text.split("e")
        text = f"{mant if '.' in mant else mant + '.0'}e{exp}"
    elif "." not in text:
        text += ".0"
    return text


def flow_list(values: Sequence[float]) -> str:
    """``[a, b, c]`` with :func:`yaml_float` numbers."""
    return "[" + ", ".join(yaml_float(v) for v in values) + "]"


def validate_export_coeffs(alpha: Sequence[float], beta: Sequence[float], source: str) -> None:
    """BLIS's rules for what we write: ≥ 3 alphas, 7–11 betas, all finite and ≥ 0."""
    try:
        validate_blis_coeffs(alpha, beta)
    except (TypeError, ValueError) as err:
        raise RoofcalError(f"{source}: {err}") from None
    if len(beta) > N_BETA:
        raise RoofcalError(f"{source}: {len(beta)} beta values; BLIS reads at most {N_BETA} (it would silently drop the rest)")


def blis_flags(alpha: Sequence[float], beta: Sequence[float]) -> str:
    """The equivalent ``blis run`` flags."""
    join = lambda v: ",".join(yaml_float(x) for x in v)
    return f"--alpha-coeffs {join(alpha)} --beta-coeffs {join(beta)}"


def _numbers(value: Any, where: str) -> list[float]:
    """A YAML list of numbers (bools and strings refused)."""
    if not isinstance(value, list):
        raise RoofcalError(f"{where}: expected a list of numbers, got {value!r}")
    out = []
    for i, v in enumerate(value):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise RoofcalError(f"{where}[{i}]: expected a number, got {v!r}")
        out.append(float(v))
    return out


# --------------------------------------------------------------------------------------------
# defaults.yaml


@dataclass(frozen=True)
class _Span:
    """Character span [start, end) of one ``key: [...]`` entry (end before any trailing comment)."""

    start: int
    end: int
    values: tuple[float, ...]


def _read_text(path: Path, what: str) -> str:
    """The text of ``path`` with every byte kept (``\\r\\n`` too), for line surgery and strict YAML;
    errors worded as :func:`roofcal.io.read_json_object`'s."""
    try:
        return path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise RoofcalError(f"{path}: no such {what}") from None
    except UnicodeDecodeError:
        raise RoofcalError(f"{path}: not a UTF-8 text file") from None
    except OSError as err:
        raise RoofcalError(f"{path}: cannot read {what}: {err.strerror or err}") from None


def _coefficient_spans(text: str, source: str) -> dict[str, _Span]:
    """Where ``alpha_coeffs`` and ``beta_coeffs`` of ``trained_physics_coefficients`` are."""
    strict_yaml_load(text, source)  # duplicate keys and syntax
    root = yaml.compose(text, Loader=yaml.SafeLoader)
    block_key = "trained_physics_coefficients"
    if not isinstance(root, yaml.MappingNode):
        raise RoofcalError(f"{source}: not a BLIS defaults file (expected a mapping at the top level)")
    block = next((v for k, v in root.value if isinstance(k, yaml.ScalarNode) and k.value == block_key), None)
    if block is None:
        raise RoofcalError(f"{source}: field '{block_key}' missing; nothing to replace")
    if not isinstance(block, yaml.MappingNode) or block.flow_style:
        raise RoofcalError(f"{source}: field '{block_key}' must be a block mapping (one key per line)")
    spans = {}
    for key_node, value in block.value:
        name = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
        if name not in ("alpha_coeffs", "beta_coeffs"):
            continue
        where = f"{source}: field '{block_key}.{name}'"
        if not isinstance(value, yaml.SequenceNode):
            raise RoofcalError(f"{where}: expected a list of numbers")
        values = _numbers(yaml.load(yaml.serialize(value), Loader=yaml.SafeLoader), where)
        start = key_node.start_mark.index
        end = value.value[-1].end_mark.index if (value.value and not value.flow_style) else value.end_mark.index
        line_start = text.rfind("\n", 0, start) + 1
        eol = text.find("\n", end)
        eol = len(text) if eol < 0 else eol
        rest = text[end:eol].strip()
        if text[line_start:start].strip() or (rest and not rest.startswith("#")):
            raise RoofcalError(f"{where}: must sit on its own line(s) to be replaced")
        spans[name] = _Span(start, end, tuple(values))
    for name in ("alpha_coeffs", "beta_coeffs"):
        if name not in spans:
            raise RoofcalError(f"{source}: field '{block_key}.{name}' missing; nothing to replace")
    return spans


def read_defaults_coefficients(path: str | Path) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(alpha, beta) of a BLIS defaults.yaml's ``trained_physics_coefficients``."""
    path = Path(path)
    spans = _coefficient_spans(_read_text(path, "BLIS defaults file"), str(path))
    return spans["alpha_coeffs"].values, spans["beta_coeffs"].values


def _line_end(text: str, pos: int) -> int:
    """Index of the end of the line holding ``pos`` (before ``\\r\\n`` or ``\\n``)."""
    eol = text.find("\n", pos)
    eol = len(text) if eol < 0 else eol
    return eol - 1 if eol > 0 and text[eol - 1] == "\r" else eol


def replace_coefficients(text: str, alpha: Sequence[float] | None, beta: Sequence[float], comment: str,
                         source: str = "defaults.yaml") -> str:
    """``text`` with the ``beta_coeffs`` (and, unless ``alpha`` is None or unchanged, the
    ``alpha_coeffs``) entry rewritten as ``key: [..]  # comment``; every other byte kept.

    Any comment already at the end of a replaced entry's line is replaced too."""
    spans = _coefficient_spans(text, source)
    comment = " ".join(comment.split())
    edits = []
    if alpha is not None and tuple(float(a) for a in alpha) != spans["alpha_coeffs"].values:
        edits.append(("alpha_coeffs", alpha, "alpha from roofcal BLIS-form fit"))
    edits.append(("beta_coeffs", beta, comment))
    for name, values, note in sorted(edits, key=lambda e: -spans[e[0]].start):
        span = spans[name]
        line = f"{name}: {flow_list(values)}" + (f"  # {note}" if note else "")
        text = text[: span.start] + line + text[_line_end(text, span.end):]
    return text


def _check_written(text: str, alpha: Sequence[float], beta: Sequence[float], source: str) -> None:
    """Re-read the new text strictly and make sure it holds exactly the numbers we mean."""
    doc = strict_yaml_load(text, source)
    block = doc.get("trained_physics_coefficients") if isinstance(doc, dict) else None
    got_a = _numbers(block.get("alpha_coeffs"), source) if isinstance(block, dict) else None
    got_b = _numbers(block.get("beta_coeffs"), source) if isinstance(block, dict) else None
    if got_a != [float(a) for a in alpha] or got_b != [float(b) for b in beta]:
        raise RoofcalError(f"{source}: internal error: the rewritten file does not read back the exported coefficients")


def _backup_path(path: Path) -> Path:
    """``path.bak``, or ``path.bak.1``, ``.bak.2``, ... (never overwrites an earlier backup)."""
    candidate = path.with_name(path.name + ".bak")
    i = 0
    while candidate.exists():
        i += 1
        candidate = path.with_name(f"{path.name}.bak.{i}")
    return candidate


# --------------------------------------------------------------------------------------------
# BLIS-form files


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
        "deployments": [{"model": d.model, "tp": int(d.tp)} for d in form.deployments],
        "alpha": [float(a) for a in form.alpha],
        "alpha_source": form.alpha_source,
        "beta": [float(b) for b in form.beta],
        "beta_names": list(BETA_NAMES[: len(form.beta)]),
        "provenance": form.provenance,
        "metrics": form.metrics,
    }
    header = (
        f"# roofcal BLIS-form coefficients (schema {BLIS_FORM_SCHEMA}); see roofcal/blis/export.py.\n"
        "# alpha/beta are BLIS trained-physics alpha_coeffs/beta_coeffs (beta in BLIS index order), fitted\n"
        "# for the hardware entry and deployments below. Export: roofcal export blis --coeffs THIS ...\n"
    )
    return header + yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=110, default_flow_style=None)


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
    calib = _require_peaks(BlisHardware.from_dict({k: hw.get(k) for k in _CALIB_KEYS}, f"{source}: hardware"),
                           source, "hardware.")
    alpha = _numbers(doc["alpha"], f"{source}: field 'alpha'")
    beta = _numbers(doc["beta"], f"{source}: field 'beta'")
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
    return form_from_dict(strict_yaml_load(_read_text(path, "BLIS-form file"), str(path)), str(path))


def _require_peaks(hw: BlisHardware, source: str, prefix: str = "") -> BlisHardware:
    """``hw`` if its TFlopsPeak and BwPeakTBs are positive and finite (BLIS refuses it otherwise)."""
    for key, v in (("TFlopsPeak", hw.tflops_peak), ("BwPeakTBs", hw.bw_peak_tbs)):
        if not (math.isfinite(v) and v > 0):
            raise RoofcalError(f"{source}: field '{prefix}{key}' must be a positive number, got {v!r}")
    return hw


def read_coefficient_doc(path: str | Path) -> tuple[str, Any]:
    """(schema, parsed document) of a roofcal YAML file (coefficients or BLIS-form), read and parsed
    once (strictly: duplicate keys refused)."""
    path = Path(path)
    doc = strict_yaml_load(_read_text(path, "coefficient file"), str(path))
    schema = doc.get("schema") if isinstance(doc, dict) else None
    if schema not in (COEFFS_SCHEMA, BLIS_FORM_SCHEMA):
        raise RoofcalError(f"{path}: field 'schema' is {schema!r}; expected {COEFFS_SCHEMA!r} (roofcal fit) "
                           f"or {BLIS_FORM_SCHEMA!r} (roofcal blis fit)")
    return schema, doc


# --------------------------------------------------------------------------------------------
# hardware_config.json


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


@dataclass(frozen=True)
class _Entry:
    name: str
    key_start: int
    value_start: int
    value_end: int


def _json_entries(text: str, source: str) -> tuple[dict, list[_Entry]]:
    """(parsed object, its top-level entries with their character spans), parsing ``text`` once."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise RoofcalError(f"{source}: not valid JSON (line {err.lineno}: {err.msg})") from None
    if not isinstance(doc, dict):
        raise RoofcalError(f"{source}: expected a JSON object mapping GPU names to entries")
    dec = json.JSONDecoder()
    i = _skip_ws(text, 0) + 1
    out = []
    while True:
        i = _skip_ws(text, i)
        if text[i] == "}":
            return doc, out
        if text[i] == ",":
            i = _skip_ws(text, i + 1)
        key, j = json.decoder.scanstring(text, i + 1)
        j = _skip_ws(text, _skip_ws(text, j) + 1)  # past ':'
        _, end = dec.raw_decode(text, j)
        out.append(_Entry(key, i, j, end))
        i = end


def read_hardware_config(path: str | Path) -> dict[str, BlisHardware]:
    """{GPU name: BlisHardware} of a BLIS hardware_config.json, in file order."""
    doc = read_json_object(path, "hardware config")
    return {name: BlisHardware.from_dict(entry, f"{path}: entry '{name}'") for name, entry in doc.items()}


def blis_gpu_name(gpu: str, spec, names: Sequence[str] = BLIS_GPU_NAMES) -> str | None:
    """The BLIS entry name for a roofcal GPU: ``gpu`` itself if it is one of ``names``, else the
    first of ``names`` that is an alias of the same datasheet; None if there is none."""
    from roofcal.hardware import load_gpu

    if gpu in names:
        return gpu
    for name in names:
        try:
            if load_gpu(name).name == spec.name:
                return name
        except RoofcalError:
            continue
    return None


def hardware_for_gpu(path: str | Path, spec, name: str | None = None) -> tuple[str, BlisHardware]:
    """(entry name, calibration) of the hardware_config.json entry BLIS would use for ``spec``.

    ``name`` picks the entry explicitly; otherwise the first entry whose name is an alias of the
    datasheet. Refuses entries BLIS would refuse (TFlopsPeak, BwPeakTBs must be > 0)."""
    entries = read_hardware_config(path)
    chosen = name or blis_gpu_name("", spec, list(entries))
    if chosen is None or chosen not in entries:
        what = f"entry {chosen!r}" if chosen else f"entry for GPU '{spec.name}'"
        raise RoofcalError(f"{path}: no {what} (entries: {', '.join(entries)}); pass --hardware NAME or add one "
                           f"with 'roofcal export hardware --gpu {spec.name} --into {path}'")
    if name is not None:
        from roofcal.hardware import load_gpu

        try:
            other = load_gpu(name).name
        except RoofcalError:
            other = spec.name  # a custom entry name: the user vouches for it
        if other != spec.name:
            raise RoofcalError(f"{path}: entry '{name}' is GPU '{other}', but the coefficients are for '{spec.name}'")
    return chosen, _require_peaks(entries[chosen], f"{path}: entry '{chosen}'")


def gemm_mfu(coeffs, gpu, tokens: int) -> float:
    """In-step FLOP utilisation of the :data:`MFU_GEMMS` at ``m = tokens`` (see module doc)."""
    import jax.numpy as jnp

    from roofcal import correction as K
    from roofcal.components import gemm, ideal_times

    _, p = K.lookup(coeffs.params["ops"], "gemm", "bf16")
    scale = float(K.step_scales(coeffs.params["step"])["gemm"])
    peak, bw = gpu.peak_flops_per_us("bf16"), gpu.hbm_bytes_per_us
    flops = time = 0.0
    for n, k in MFU_GEMMS:
        w = gemm(jnp.float32(tokens), n, k, 2.0, 2.0, 2.0)
        tc, tm = ideal_times(w, peak, bw)
        time += float(K.op_time(p, "gemm", w.shape, tc, tm)) * scale
        flops += float(w.flops)
    return flops / (peak * time)


def hardware_entry(spec, mfu: tuple[float, float], comment: str) -> dict:
    """A BLIS ``HardwareCalib`` JSON object (key order as BLIS's bundled file), validated."""
    entry = {
        "_comment": comment,
        "TFlopsPeak": float(spec.bf16_tflops),
        "TFlopsFP8": float(spec.fp8_tflops or 0.0),
        "BwPeakTBs": float(spec.hbm_bandwidth_tbs),
        "mfuPrefill": round(float(mfu[0]), 4),
        "mfuDecode": round(float(mfu[1]), 4),
        "MemoryGiB": float(spec.hbm_capacity_gib),
    }
    for key in ("TFlopsPeak", "BwPeakTBs", "mfuPrefill", "mfuDecode"):
        v = entry[key]
        if not (math.isfinite(v) and v > 0):
            raise RoofcalError(f"hardware entry: field '{key}' must be a positive number, got {v}")
    for key in ("mfuPrefill", "mfuDecode"):
        if entry[key] > 1:
            raise RoofcalError(f"hardware entry: field '{key}' must be ≤ 1, got {entry[key]}")
    if not (math.isfinite(entry["TFlopsFP8"]) and entry["TFlopsFP8"] >= 0 and entry["MemoryGiB"] >= 0):
        raise RoofcalError("hardware entry: TFlopsFP8 and MemoryGiB must be non-negative")
    return entry


def _format_entry(entry: Mapping[str, Any], indent: str, unit: str) -> str:
    """``{...}`` in BLIS's style: one key per line, values aligned after the colon."""
    width = max(len(json.dumps(k)) + 1 for k in entry)
    lines = [f"{indent}{unit}{(json.dumps(k) + ':').ljust(width)} {json.dumps(v, ensure_ascii=False)}" for k, v in entry.items()]
    return "{\n" + ",\n".join(lines) + f"\n{indent}}}"


def merge_hardware_entry(text: str | None, name: str, entry: Mapping[str, Any], source: str = "hardware_config.json") -> str:
    """``text`` (a hardware_config.json, or None for a new file) with entry ``name`` set to
    ``entry``: replaced where it is, or appended; all other bytes unchanged."""
    if text is None or not text.strip():
        return "{\n\t" + json.dumps(name) + ": " + _format_entry(entry, "\t", "\t") + "\n}\n"
    return _merge_entry(text, _json_entries(text, source)[1], name, entry, source)


def _merge_entry(text: str, entries: Sequence[_Entry], name: str, entry: Mapping[str, Any], source: str) -> str:
    """:func:`merge_hardware_entry` on a non-empty ``text`` whose ``entries`` are parsed."""
    same = [e for e in entries if e.name == name]
    if len(same) > 1:
        raise RoofcalError(f"{source}: entry '{name}' appears {len(same)} times")
    if entries:
        first = entries[0]
        indent = text[text.rfind("\n", 0, first.key_start) + 1: first.key_start]
        indent = indent if not indent.strip() else "\t"
    else:
        indent = "\t"
    unit = indent if indent else "\t"
    body = _format_entry(entry, indent, unit)
    if same:
        e = same[0]
        return text[: e.value_start] + body + text[e.value_end:]
    if entries:
        last = entries[-1]
        return text[: last.value_end] + f",\n{indent}{json.dumps(name)}: {body}" + text[last.value_end:]
    close = text.rfind("}")
    return text[:close].rstrip() + f"\n{indent}{json.dumps(name)}: {body}\n" + text[close:]


# --------------------------------------------------------------------------------------------
# orchestration: fit a BLIS-form file, export into defaults.yaml, export a hardware entry


def _file_record(path: Path) -> dict:
    return {"path": resources.display(path), "sha256": sha256_file(path)}


def _coeff_step_data(c) -> tuple[list, list]:
    """Measured step files a coefficient file was fitted on, if still present and unchanged:
    (StepData list, provenance notes).

    Step JSONL rows without their own model / TP get the coefficient file's deployment when it
    records exactly one (``fit.deployments``); a file that still cannot be read is skipped with a
    note (it is only scored)."""
    from roofcal import datasets

    recorded = c.fit.get("deployments")
    only = recorded[0] if isinstance(recorded, list) and len(recorded) == 1 and isinstance(recorded[0], dict) else {}
    steps, notes = [], []
    for rec in c.data:
        if not isinstance(rec, dict) or not str(rec.get("kind", "")).startswith("steps"):
            continue
        path = Path(rec.get("path", ""))
        path = path if path.is_absolute() else resources.ROOT / path
        if not path.is_file() or sha256_file(path) != rec.get("sha256"):
            notes.append(f"{rec.get('path')}: missing or changed since the fit; not scored")
            continue
        try:
            steps.extend(datasets.load([path], gpu=c.gpu, model=only.get("model"), tp=only.get("tp")).steps)
        except RoofcalError as err:
            notes.append(f"{rec.get('path')}: not scored ({err})")
            continue
        notes.append(f"{rec.get('path')}: scored (held-out configurations as in the coefficient fit)")
    return steps, notes


def fit_form(coeffs_path: str | Path | None, defaults_path: str | Path = BUNDLED_DEFAULTS,
             hardware_config: str | Path = BUNDLED_HARDWARE, hardware: str | None = None,
             deployments: Sequence[Deployment] | None = None, steps_paths: Sequence[str | Path] = (),
             settings: BlisFitSettings = BlisFitSettings(), steps_gpu: str | None = None) -> BlisForm:
    """Fit BLIS-form coefficients (see :mod:`roofcal.blis.fit`) from files.

    ``coeffs_path``: a roofcal coefficient file to distil (None: measured steps only);
    ``deployments``: what to distil for (default: the coefficient file's ``fit.deployments``);
    ``steps_paths``: measured whole-step files to fit as well. Alphas are kept from
    ``defaults_path``, whose betas also centre the prior. ``steps_gpu`` names the GPU of step
    JSONL rows that do not name one (default: the coefficient file's)."""
    from roofcal import coeffs as coeff_io
    from roofcal import datasets
    from roofcal.hardware import load_gpu

    defaults_path, hardware_config = Path(defaults_path), Path(hardware_config)
    alpha, input_beta = read_defaults_coefficients(defaults_path)
    validate_export_coeffs(alpha, input_beta, f"{defaults_path}: trained_physics_coefficients")
    c = coeff_io.load(coeffs_path) if coeffs_path is not None else None
    gpu = load_gpu(c.gpu) if c is not None else None
    if c is not None:
        c.check_gpu(gpu)
        if steps_paths and steps_gpu is not None and load_gpu(steps_gpu).name != gpu.name:
            raise RoofcalError(f"--gpu {steps_gpu}: {c.source} is for GPU '{gpu.name}'; steps to fit must be on it")
    # datasets.load refuses steps on another GPU than the one named (the coefficient file's)
    loaded = datasets.load([Path(p) for p in steps_paths], gpu=c.gpu if c is not None else steps_gpu) \
        if steps_paths else None
    measured = loaded.steps if loaded is not None else []
    if steps_paths and not measured:
        raise RoofcalError(f"{', '.join(map(str, steps_paths))}: no whole-step measurements (per-op tables cannot fit BLIS betas)")
    if gpu is None:
        if not measured:
            raise RoofcalError("blis fit: give --coeffs FILE (distillation) and/or --steps FILE (measurements)")
        gpu = load_gpu(measured[0].gpu)
        other = [d for d in measured if d.gpu != gpu.name] if steps_gpu is None else []  # else the loader checked
        if other:
            raise RoofcalError(f"{other[0].source}: steps are for GPU '{other[0].gpu}', not '{gpu.name}'")
    hw_name, hw = hardware_for_gpu(hardware_config, gpu, hardware)

    method, resolved = [], []
    if c is not None and settings.samples > 0:
        if deployments:
            deps = list(deployments)
        else:
            recorded = c.fit.get("deployments")
            if not recorded:
                raise RoofcalError(f"{c.source}: records no step deployments (fit.deployments); name the "
                                   "deployments to distil with --model M --tp T")
            deps = deployments_from_records(recorded, f"{c.source}: field 'fit.deployments'")
        resolved = [resolve_deployment(d, hw) for d in deps]
        method.append("distillation")
    if measured:
        method.append("measured")
    if not method:
        raise RoofcalError("blis fit: nothing to fit (distillation disabled with --samples 0 and no --steps)")
    holdout = float(c.fit.get("holdout", settings.holdout)) if c is not None else settings.holdout
    seed = int(c.fit.get("seed", settings.seed)) if c is not None else settings.seed
    params = c.params if c is not None else None
    scored, notes = (measured, []) if measured or c is None else _coeff_step_data(c)
    rows = build_rows(params, gpu, resolved, settings, scored, hw, measured_split=(holdout, seed))
    result = fit_blis([rows[s] for s in ("distill", "measured") if s in rows and (s != "measured" or measured)],
                      input_beta, settings)
    metrics = result.metrics
    if scored and not measured:  # the coefficient file's own measurements: scored, not fitted
        s = score_rows(rows["measured"], result.beta, input_beta)
        for split in metrics:
            metrics[split]["measured"] = s[split]
    # what the betas were fitted for: the distilled deployments, then the measured ones
    deps = [Deployment(r.spec.ref, r.deployment.tp) for r in resolved]
    deps += sorted({Deployment(d.model.ref, d.tp) for d in measured} - set(deps), key=lambda d: (d.model, d.tp))
    provenance = {
        "method": " + ".join(method),
        "coeffs": None if c is None else {**_file_record(Path(coeffs_path)), "gpu": c.gpu},
        "defaults": _file_record(defaults_path),
        "hardware_config": _file_record(hardware_config),
        "steps": loaded.provenance if loaded is not None else [],
        "scored_only": notes,
        "beta_kept_from_defaults": [BETA_NAMES[i] for i in result.kept],
        "rows": result.n_rows,
        "fit": settings.record(),
        "measured_split": {"holdout": holdout, "seed": seed},
    }
    return BlisForm(tuple(alpha), tuple(result.beta), hw_name, hw, tuple(deps),
                    f"kept from {resources.display(defaults_path)} (no request-level data)", provenance, metrics)


def _mape(metrics: dict, source: str, key: str) -> float | None:
    return metrics.get("heldout", {}).get(source, {}).get("all", {}).get(key)


def provenance_comment(form: BlisForm, form_path: str | Path | None = None) -> str:
    """One line for defaults.yaml: roofcal version, source file hashes, held-out errors."""
    p = form.provenance
    c = p.get("coeffs") or {}
    parts = [f"roofcal {__version__}: fitted in BLIS's basis by {p.get('method', 'unknown method')}"]
    if c:
        parts.append(f"of {c.get('path')} (sha256 {str(c.get('sha256'))[:12]})")
    if form_path is not None:
        parts.append(f"via {resources.display(Path(form_path))} (sha256 {sha256_file(form_path)[:12]})")
    deps = ", ".join(f"{d.model} TP{d.tp}" for d in form.deployments)
    parts.append(f"for {deps} on {form.hardware};")
    m = form.metrics
    held = []
    d = _mape(m, "distill", "blis_mape")
    if d is not None:
        held.append(f"{d:.1f}% vs native model (distillation)")
    b, n = _mape(m, "measured", "blis_mape"), _mape(m, "measured", "native_mape")
    if b is not None:
        held.append(f"{b:.1f}% on measured steps" + (f" (native {n:.1f}%)" if n is not None else ""))
    if held:
        parts.append("held-out MAPE " + ", ".join(held) + ";")
    parts.append("alphas " + (form.alpha_source or "from the BLIS-form file"))
    return " ".join(parts)


@dataclass(frozen=True)
class ExportResult:
    """What :func:`export_blis` did: the coefficients, output and backup paths (None when not
    written), the flags line and the provenance comment."""

    form: BlisForm
    out: Path | None
    backup: Path | None
    flags: str
    comment: str


def export_blis(coeffs_path: str | Path, defaults_path: str | Path, out: str | Path | None = None,
                in_place: bool = False, deployments: Sequence[Deployment] | None = None,
                hardware_config: str | Path = BUNDLED_HARDWARE, hardware: str | None = None,
                settings: BlisFitSettings = BlisFitSettings()) -> ExportResult:
    """Write ``defaults_path`` with BLIS-form betas to ``out`` (or in place, keeping a backup).

    ``coeffs_path`` is a roofcal coefficient file (betas fitted here by distillation for
    ``deployments``) or a BLIS-form file (used as is). Everything is validated before anything
    is written."""
    coeffs_path, defaults_path = Path(coeffs_path), Path(defaults_path)
    if in_place and out is not None:
        raise RoofcalError("export blis: give either --out FILE or --in-place, not both")
    target = defaults_path if in_place else (Path(out) if out is not None else None)
    if target is not None and not in_place and target.resolve() == defaults_path.resolve():
        raise RoofcalError(f"{target}: --out is the --defaults file; use --in-place to overwrite it (keeps a backup)")
    text = _read_text(defaults_path, "BLIS defaults file")
    _coefficient_spans(text, str(defaults_path))  # refuse a bad defaults file before any fitting
    schema, doc = read_coefficient_doc(coeffs_path)
    if schema == BLIS_FORM_SCHEMA:
        if deployments:
            raise RoofcalError(f"{coeffs_path}: a BLIS-form file is already fitted; --model/--tp apply to a roofcal coefficient file")
        form = form_from_dict(doc, str(coeffs_path))  # validated, coefficients included
        for d in form.deployments:
            resolve_deployment(d, form.hardware_calib, where=f"{coeffs_path}: deployment {d.model} tp {d.tp}")
        comment = provenance_comment(form, coeffs_path)
    else:
        form = fit_form(coeffs_path, defaults_path, hardware_config, hardware, deployments, (), settings)
        validate_export_coeffs(form.alpha, form.beta, str(coeffs_path))
        comment = provenance_comment(form)
    new = replace_coefficients(text, form.alpha, form.beta, comment, str(defaults_path))
    _check_written(new, form.alpha, form.beta, str(target or defaults_path))
    backup = None
    if target is not None:
        if in_place:
            backup = _backup_path(defaults_path)
            write_bytes_atomic(backup, text.encode("utf-8"))
        write_bytes_atomic(target, new.encode("utf-8"))
    return ExportResult(form, target, backup, blis_flags(form.alpha, form.beta), comment)


@dataclass(frozen=True)
class HardwareExport:
    """What :func:`export_hardware` produced: entry name and object, the full JSON text, where it
    was written (None: not written), the backup, and where the MFUs came from."""

    name: str
    entry: dict
    text: str
    out: Path | None
    backup: Path | None
    mfu_source: str


def export_hardware(gpu: str, coeffs_path: str | Path | None = None, into: str | Path | None = None,
                    out: str | Path | None = None, name: str | None = None) -> HardwareExport:
    """A BLIS hardware entry for ``gpu`` (datasheet peaks, MFUs from ``coeffs_path``, else the
    bundled ``coeffs/<gpu>.yaml``, else the existing entry in ``into``), merged into ``into``.

    Writes ``out`` if given, else ``into`` in place (keeping a backup); with neither, nothing is
    written and ``text`` holds a one-entry file."""
    from roofcal import coeffs as coeff_io
    from roofcal.hardware import load_gpu

    spec = load_gpu(gpu)
    entry_name = name or blis_gpu_name(gpu, spec) or spec.name
    text = _read_text(Path(into), "hardware config") if into is not None else None
    existing, entries = _json_entries(text, str(into)) if text is not None else ({}, [])
    bundled = resources.COEFFS / f"{spec.name}.yaml"
    path = Path(coeffs_path) if coeffs_path is not None else (bundled if bundled.is_file() else None)
    if path is not None:
        c = coeff_io.load(path, spec)
        mfu = (gemm_mfu(c, spec, MFU_PREFILL_TOKENS), gemm_mfu(c, spec, MFU_DECODE_TOKENS))
        rec = _file_record(path)
        src = f"in-step GEMM FLOP utilisation of {rec['path']} (sha256 {rec['sha256'][:12]}) at m = {MFU_PREFILL_TOKENS} / {MFU_DECODE_TOKENS} tokens"
    elif isinstance(existing.get(entry_name), dict) and "mfuPrefill" in existing[entry_name]:
        old = existing[entry_name]
        mfu = (old.get("mfuPrefill"), old.get("mfuDecode"))
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in mfu):
            raise RoofcalError(f"{into}: entry '{entry_name}' has non-numeric MFUs; give --coeffs FILE")
        src = f"kept from the existing entry in {into}"
    else:
        raise RoofcalError(f"no coefficient file for GPU '{spec.name}' to derive mfuPrefill/mfuDecode from; give --coeffs FILE")
    comment = (f"roofcal {__version__}: TFlopsPeak (dense BF16), TFlopsFP8 (dense), BwPeakTBs, MemoryGiB from datasheet "
               f"{spec.name} (sha256 {spec.sha256()[:12]}); mfuPrefill/mfuDecode {src}")
    entry = hardware_entry(spec, mfu, comment)
    merged = _merge_entry(text, entries, entry_name, entry, str(into)) if text is not None \
        else merge_hardware_entry(None, entry_name, entry)
    check = json.loads(merged)
    if check.get(entry_name) != entry or [k for k in check if k != entry_name] != [k for k in existing if k != entry_name]:
        raise RoofcalError("export hardware: internal error: the merged file does not read back as intended")
    target = Path(out) if out is not None else (Path(into) if into is not None else None)
    backup = None
    if target is not None:
        if into is not None and target.resolve() == Path(into).resolve():
            backup = _backup_path(target)
            write_bytes_atomic(backup, text.encode("utf-8"))
        write_bytes_atomic(target, merged.encode("utf-8"))
    return HardwareExport(entry_name, entry, merged, target, backup, src)

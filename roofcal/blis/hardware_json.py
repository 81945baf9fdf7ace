"""BLIS's ``hardware_config.json``: reading its GPU entries, and writing one for a roofcal GPU.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from roofcal import __version__, resources
from roofcal.blis.basis import BlisHardware
from roofcal.errors import RoofcalError
from roofcal.blis.defaults_yaml import read_text_exact
from roofcal.io import backup_path, file_record, read_json_object, write_bytes_atomic

#: GPU names in BLIS's bundled hardware_config.json (each is an alias of a roofcal datasheet).
BLIS_GPU_NAMES = ("H100", "A100-SXM", "A100-80", "L40S")

#: (n, k) of the GEMMs of a Llama-3.1-8B layer at TP 1: QKV, O, gate-up, down.
MFU_GEMMS = ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336))
MFU_PREFILL_TOKENS = 2048
MFU_DECODE_TOKENS = 256


def require_peaks(hw: BlisHardware, source: str, prefix: str = "") -> BlisHardware:
    """``hw`` if its TFlopsPeak and BwPeakTBs are positive and finite (BLIS refuses it otherwise)."""
    for key, v in (("TFlopsPeak", hw.tflops_peak), ("BwPeakTBs", hw.bw_peak_tbs)):
        if not (math.isfinite(v) and v > 0):
            raise RoofcalError(f"{source}: field '{prefix}{key}' must be a positive number, got {v!r}")
    return hw


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
    from roofcal.physics.hardware import load_gpu

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
        from roofcal.physics.hardware import load_gpu

        try:
            other = load_gpu(name).name
        except RoofcalError:
            other = spec.name  # a custom entry name: the user vouches for it
        if other != spec.name:
            raise RoofcalError(f"{path}: entry '{name}' is GPU '{other}', but the coefficients are for '{spec.name}'")
    return chosen, require_peaks(entries[chosen], f"{path}: entry '{chosen}'")


def gemm_mfu(coeffs, gpu, tokens: int) -> float:
    """In-step FLOP utilisation of the :data:`MFU_GEMMS` at ``m = tokens`` (see module doc)."""
    import jax.numpy as jnp

    from roofcal.model import correction as K
    from roofcal.physics.components import gemm, ideal_times

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
    from roofcal.model import coeffs as coeff_io
    from roofcal.physics.hardware import load_gpu

    spec = load_gpu(gpu)
    entry_name = name or blis_gpu_name(gpu, spec) or spec.name
    text = read_text_exact(Path(into), "hardware config") if into is not None else None
    existing, entries = _json_entries(text, str(into)) if text is not None else ({}, [])
    bundled = resources.COEFFS / f"{spec.name}.yaml"
    path = Path(coeffs_path) if coeffs_path is not None else (bundled if bundled.is_file() else None)
    if path is not None:
        c = coeff_io.load(path, spec)
        mfu = (gemm_mfu(c, spec, MFU_PREFILL_TOKENS), gemm_mfu(c, spec, MFU_DECODE_TOKENS))
        rec = file_record(path)
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
            backup = backup_path(target)
            write_bytes_atomic(backup, text.encode("utf-8"))
        write_bytes_atomic(target, merged.encode("utf-8"))
    return HardwareExport(entry_name, entry, merged, target, backup, src)

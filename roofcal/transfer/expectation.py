"""What a zero-shot GPU's error is likely to be, as measured: the figure ``gpu bootstrap`` quotes.

``coeffs/zero_shot.yaml`` holds, for every pair of GPUs with per-op tables of one kernel library,
the per-op MAPE (%) per kernel kind/variant of the target's rows predicted by the source's fit
bootstrapped to it, and (``few_shot``) the mean held-out MAPE after refitting that bootstrap on
300 of the target's rows per kernel spread as ``roofcal gpu plan`` takes them (written by
``python -m roofcal.bench.gpus --write-expectations``). A bootstrap
quotes the pairs whose memory families match its own (HBM to HBM, HBM to GDDR, …): measured,
the family is what separates a small transfer error from a large one (A100 ↔ H100 22–32 % mean
over kinds; from either to the GDDR6, PCIe L40S 52–55 %).
"""

from __future__ import annotations

from pathlib import Path

from roofcal import resources
from roofcal.errors import RoofcalError
from roofcal.io import read_yaml, write_text_atomic, yaml_text

SCHEMA = "roofcal-zero-shot/1"
DEFAULT_PATH = resources.COEFFS / "zero_shot.yaml"


def memory_family(kind: str) -> str:
    """``hbm`` or ``gddr`` of a datasheet's ``memory_kind``; ``unknown`` when it is not given."""
    return "gddr" if kind.startswith("gddr") else "hbm" if kind.startswith("hbm") else "unknown"


def write(doc: dict, out=DEFAULT_PATH) -> None:
    """Write a zero-shot document as YAML, atomically."""
    header = ("# roofcal zero-shot errors between GPUs (roofcal/transfer/expectation.py), written by\n"
              "# python -m roofcal.bench.gpus --write-expectations: per-op MAPE % per kernel kind.\n")
    write_text_atomic(out, header + yaml_text(doc, sort_keys=False, width=100))


def load(path=DEFAULT_PATH) -> list[dict]:
    """The pairs of a zero-shot document, validated."""
    doc = read_yaml(Path(path), "zero-shot file")
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise RoofcalError(f"{path}: field 'schema' must be {SCHEMA!r}")
    pairs = doc.get("pairs")
    if not isinstance(pairs, list) or not all(
            isinstance(p, dict) and isinstance(p.get("kinds"), dict) and p.get("kinds")
            and isinstance(p.get("mean"), (int, float)) for p in pairs):
        raise RoofcalError(f"{path}: field 'pairs' must list {{from, to, mean, kinds}} mappings")
    for p in pairs:
        few = p.get("few_shot")
        if few is not None and not (isinstance(few, dict) and isinstance(few.get("rows"), int)
                                    and isinstance(few.get("mean"), (int, float))):
            raise RoofcalError(f"{path}: field 'few_shot' of pair {p.get('from')} → {p.get('to')} "
                               f"must be a {{rows, draw, mean}} mapping")
    return pairs


def expectation(ref_gpu, new_gpu, pairs: list[dict]) -> str:
    """One sentence: the zero-shot error measured between GPUs of the same memory families as
    ``ref_gpu`` → ``new_gpu`` (all pairs where none match or a family is unknown)."""
    want = (memory_family(ref_gpu.memory_kind), memory_family(new_gpu.memory_kind))
    same = [p for p in pairs if (memory_family(p.get("from_memory", "")),
                                  memory_family(p.get("to_memory", ""))) == want]
    matched = bool(same) and "unknown" not in want
    chosen = same if matched else pairs
    if not chosen:
        return "no zero-shot error has been measured"
    kinds = [v for p in chosen for v in p["kinds"].values()]
    means = [p["mean"] for p in chosen]
    what = f"from {want[0].upper()} to {want[1].upper()} memory" if matched else "between any two measured GPUs"
    names = ", ".join(f"{p['from']} → {p['to']}" for p in chosen)
    out = (f"measured zero shot {what} ({names}): {min(means):.0f}–{max(means):.0f} % per-op "
           f"MAPE on the mean over kernel kinds, {min(kinds):.0f}–{max(kinds):.0f} % per kind")
    few = [p["few_shot"] for p in chosen if "few_shot" in p]
    if few and len(few) == len(chosen) and len({f["rows"] for f in few}) == 1:
        lo, hi = min(f["mean"] for f in few), max(f["mean"] for f in few)
        out += (f"; refitted on {few[0]['rows']} shapes a kernel spread by roofcal gpu plan, "
                f"{lo:.1f}–{hi:.1f} % held out")
    return out

"""BLIS's ``defaults.yaml``: strict reading and line surgery of its ``trained_physics_coefficients``.

**defaults.yaml export** (:func:`replace_coefficients`): only the ``alpha_coeffs`` and
``beta_coeffs`` entries of ``trained_physics_coefficients`` are rewritten (each as one flow-style
line ending in a provenance comment); an entry whose values are unchanged is left alone, and every
other byte of the file is kept. Located with PyYAML's node positions, so comments, key order and
formatting elsewhere survive; a block-style list is collapsed onto its key's line.

Reading is strict (duplicate keys refused), as BLIS's yaml.v3 decoder is; numbers are written in a
form both YAML 1.1 (PyYAML) and YAML 1.2 (BLIS) read back as the same float.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import yaml

from roofcal.errors import RoofcalError


# --------------------------------------------------------------------------------------------
# strict YAML and number formatting


class _StrictLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """The safe loader (libyaml's parser where PyYAML has it: a 3.8 MB coefficient file parses in
    about 1 s instead of 6) that refuses duplicate mapping keys (as BLIS's yaml.v3 decoder does)."""


def _construct_mapping(loader, node, deep=False):
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return yaml.constructor.SafeConstructor.construct_mapping(loader, node, deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def strict_yaml_load(text: str, source: str) -> Any:
    """Parse YAML refusing duplicate keys; errors name ``source`` and the line. A large text parsed
    before in this process is not parsed again (:func:`roofcal.io.remembered`)."""
    from roofcal.io import remembered
    try:
        return remembered(text, lambda t: yaml.load(t, Loader=_StrictLoader), "strict")
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


def yaml_numbers(value: Any, where: str) -> list[float]:
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


def read_text_exact(path: Path, what: str) -> str:
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


def coefficient_spans(text: str, source: str) -> dict[str, _Span]:
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
        values = yaml_numbers(yaml.load(yaml.serialize(value), Loader=yaml.SafeLoader), where)
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
    spans = coefficient_spans(read_text_exact(path, "BLIS defaults file"), str(path))
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
    spans = coefficient_spans(text, source)
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


def check_written(text: str, alpha: Sequence[float], beta: Sequence[float], source: str) -> None:
    """Re-read the new text strictly and make sure it holds exactly the numbers we mean."""
    doc = strict_yaml_load(text, source)
    block = doc.get("trained_physics_coefficients") if isinstance(doc, dict) else None
    got_a = yaml_numbers(block.get("alpha_coeffs"), source) if isinstance(block, dict) else None
    got_b = yaml_numbers(block.get("beta_coeffs"), source) if isinstance(block, dict) else None
    if got_a != [float(a) for a in alpha] or got_b != [float(b) for b in beta]:
        raise RoofcalError(f"{source}: internal error: the rewritten file does not read back the exported coefficients")

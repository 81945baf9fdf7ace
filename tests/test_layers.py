"""Arrows point down the pipeline: a package never imports one above it (the order of
roofcal/__init__.py), and nothing outside bench/ imports bench/."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "roofcal"
ORDER = ["physics", "measurements", "model", "blis", "calibration", "inspection", "transfer", "bench", "cli"]
IMPORT = re.compile(r"^\s*(?:from|import)\s+roofcal\.(\w+)", re.M)


def test_no_package_imports_one_above_it():
    back = []
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT).parts
        pkg = parts[0] if len(parts) > 1 else None
        for target in IMPORT.findall(path.read_text(encoding="utf-8")):
            if target not in ORDER:
                continue
            if pkg is None:                          # top-level helpers import no stage but model/physics
                if target not in ("model", "physics"):
                    back.append((str(path.relative_to(ROOT)), target))
            elif pkg in ORDER and ORDER.index(target) > ORDER.index(pkg):
                back.append((str(path.relative_to(ROOT)), target))
    assert back == []


def test_every_package_is_in_the_order():
    pkgs = {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    assert pkgs == set(ORDER)

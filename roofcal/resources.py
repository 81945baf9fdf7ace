"""Where the bundled data lives: model configs, measurements, BLIS files and fitted coefficients.

roofcal is installed editable (``pip install -e .``) from its source tree, and the bundled folders
sit at the top of that tree beside the package: ``model_configs/``, ``coeffs/`` and ``data/``.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL_CONFIGS = ROOT / "model_configs"
COEFFS = ROOT / "coeffs"
#: the shipped H100 coefficient file: the reference a bootstrap starts from, the stack hints borrow
REFERENCE_COEFFS = COEFFS / "h100_sxm.yaml"
#: the measured zero-shot error bands (roofcal.transfer.bands)
TRANSFER_BANDS = COEFFS / "transfer_bands.yaml"
DATA = ROOT / "data"
MICROBENCH = DATA / "microbench"
STEPS = DATA / "steps"
#: sustained-load measurements per GPU (``<gpu>/``), for the power model (roofcal.calibration.power)
SUSTAINED = DATA / "sustained"
BLIS = DATA / "blis"
BLIS_DEFAULTS = BLIS / "defaults.yaml"
BLIS_HARDWARE = BLIS / "hardware_config.json"
HARDWARE = Path(__file__).resolve().parent / "physics" / "hardware"


#: searched after the bundled model configs, relative to the current directory, when it exists
#: (the serving runs' configs beside the project)
SHARED_MODEL_CONFIGS = Path("..") / "shared" / "workload" / "model_configs"


def here(path) -> str:
    """``path`` as a command run from the current folder names it: relative below it, else
    absolute (hints printed for the user to run)."""
    import os
    rel = os.path.relpath(os.path.abspath(path))
    return rel if not rel.startswith("..") else os.path.abspath(path)


def default_model_configs() -> list[Path]:
    """Folders searched for ``<model>/config.json`` by default: the project's ``model_configs/``,
    then :data:`SHARED_MODEL_CONFIGS` if it exists."""
    return [MODEL_CONFIGS] + ([SHARED_MODEL_CONFIGS] if SHARED_MODEL_CONFIGS.is_dir() else [])


def display(path: Path) -> str:
    """``path`` relative to the source tree when it lies inside it (stable in files we write)."""
    path = Path(path).resolve()
    try:
        return path.relative_to(ROOT).as_posix()
    except ValueError:
        return str(path)

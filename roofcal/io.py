"""Small file utilities shared by every writer: atomic writes and content hashes.

Every file roofcal produces is written to a temporary file in the destination folder and renamed
into place, so a failure never leaves a half-written output behind.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success rename it to ``path``, else delete it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_umask())           # mkstemp makes 0600; give a normal file's mode
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8, ``\\n`` line endings) to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8", newline="\n")


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def sha256_file(path: str | os.PathLike) -> str:
    """Hex SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def sha256_text(text: str) -> str:
    """Hex SHA-256 of a string's UTF-8 bytes."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def write_csv_atomic(df, path: str | os.PathLike) -> None:
    """Write a DataFrame as CSV atomically, floats with 10 significant digits (stable bytes)."""
    write_text_atomic(path, df.to_csv(index=False, float_format="%.10g", lineterminator="\n"))


def read_yaml(path: str | os.PathLike, what: str = "file"):
    """Parse a YAML file; a missing file or bad YAML raises a one-line ``RoofcalError``."""
    import yaml
    from roofcal.errors import RoofcalError
    try:
        return yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RoofcalError(f"{path}: no such {what}")
    except UnicodeDecodeError:
        raise RoofcalError(f"{path}: not a UTF-8 text file")
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        raise RoofcalError(f"{path}: invalid YAML" + (f" at line {mark.line + 1}" if mark else ""))


def read_json_object(path: str | os.PathLike, what: str = "file") -> dict:
    """Parse a JSON file holding an object; any failure raises a one-line ``RoofcalError``."""
    import json
    from roofcal.errors import RoofcalError
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RoofcalError(f"{path}: no such {what}") from None
    except OSError as err:
        raise RoofcalError(f"{path}: cannot read {what}: {err.strerror or err}") from None
    except UnicodeDecodeError:
        raise RoofcalError(f"{path}: not a UTF-8 text file") from None
    except json.JSONDecodeError as err:
        raise RoofcalError(f"{path}: invalid JSON at line {err.lineno}: {err.msg}") from None
    if not isinstance(data, dict):
        raise RoofcalError(f"{path}: expected a JSON object at the top level")
    return data


def backup_path(path: Path) -> Path:
    """``path.bak``, or ``path.bak.1``, ``.bak.2``, ... (never overwrites an earlier backup)."""
    candidate = path.with_name(path.name + ".bak")
    i = 0
    while candidate.exists():
        i += 1
        candidate = path.with_name(f"{path.name}.bak.{i}")
    return candidate


def file_record(path: str | os.PathLike) -> dict:
    """``{path, sha256}`` of a file, its path relative to the source tree where it lies inside it
    (provenance records of the files roofcal writes)."""
    from roofcal.resources import display
    return {"path": display(Path(path)), "sha256": sha256_file(path)}

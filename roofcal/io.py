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
    tmp = _temp_beside(path)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_umask())           # mkstemp makes 0600; give a normal file's mode
        os.replace(tmp, path)
    except OSError as err:                          # name the file the user asked for, not the temporary
        raise _naming(err, path) from None
    finally:
        if tmp.exists():
            tmp.unlink()


def _naming(err: OSError, path) -> OSError:
    """``err`` naming ``path`` (the file the user asked for) instead of a temporary beside it."""
    return OSError(err.errno, err.strerror or str(err), str(path))


def _temp_beside(path: Path) -> Path:
    """An empty temporary file in ``path``'s folder (made if missing); OS errors name ``path``."""
    if path.is_dir():
        raise IsADirectoryError(21, "Is a directory", str(path))
    for up in path.parents:
        if up.exists():
            if not up.is_dir():
                raise NotADirectoryError(20, f"{up} is not a folder", str(path))
            break
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as err:
        raise _naming(err, path) from None
    os.close(fd)
    return Path(tmp)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _nearest_folder(path: Path, what: str) -> Path:
    """The nearest existing ancestor of ``path``, which must be a folder a file can be made in:
    tried by making (and removing) an empty temporary file there — ``os.access`` says yes to
    root even where nothing can be made (``/proc``, a read-only mount)."""
    from roofcal.errors import RoofcalError
    probe = path.parent if str(path.parent) else Path(".")
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir():
        raise RoofcalError(f"{path}: cannot write the {what}: {probe} is not a folder")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".roofcal-probe-", dir=probe)
    except OSError as err:
        raise RoofcalError(f"{path}: cannot write the {what}: {refusal(probe, err)}") from None
    os.close(fd)
    os.unlink(tmp)
    return probe


def refusal(folder: Path, err: OSError) -> str:
    """Why no file could be made in ``folder``, which exists, in words that fit: the system's own
    reason, except its "No such file or directory" for a folder that is there (a virtual file
    system such as ``/proc`` or ``/sys`` answers so)."""
    import errno
    if err.errno == errno.ENOENT and folder.is_dir():
        return (f"the folder {folder} exists but accepts no new files (a virtual file system such as "
                f"/proc or /sys); choose another folder")
    return f"no file can be made in {folder}: {err.strerror or err}"


def check_output(path: str | os.PathLike, what: str = "output file") -> Path:
    """Refuse, before any work, an output file that cannot be written: a folder, a path under a
    file, or a place where no file can be made (:func:`_nearest_folder`). Returns the path."""
    from roofcal.errors import RoofcalError
    path = Path(path)
    if path.is_dir():
        raise RoofcalError(f"{path}: is a folder, not a file ({what})")
    _nearest_folder(path, what)
    return path


def check_output_dir(path: str | os.PathLike, what: str = "output folder") -> Path:
    """Refuse, before any work, an output folder that cannot be made or written into."""
    from roofcal.errors import RoofcalError
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise RoofcalError(f"{path}: exists and is not a folder ({what})")
    if path.is_dir():
        _nearest_folder(path / "x", what)
    else:
        _nearest_folder(path, what)
    return path


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8, ``\\n`` line endings) to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8", newline="\n")


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_files_atomic(files: dict) -> None:
    """Write several files all or nothing: {path: text or bytes}. Every file is written to a
    temporary file beside its destination first; only when all are complete are they renamed
    into place; a destination that is a folder is refused first, and a rename that still fails
    removes the new files already renamed (a file that existed before keeps its new content)."""
    for path in files:
        if Path(path).is_dir():
            raise IsADirectoryError(21, "Is a directory", str(path))
    staged: list[tuple[Path, Path]] = []
    existed = {Path(p): Path(p).exists() for p in files}
    done: list[Path] = []
    try:
        for path, data in files.items():
            path = Path(path)
            tmp = _temp_beside(path)
            staged.append((tmp, path))
            try:
                if isinstance(data, str):
                    tmp.write_text(data, encoding="utf-8", newline="\n")
                else:
                    tmp.write_bytes(data)
                os.chmod(tmp, 0o666 & ~_umask())
            except OSError as err:
                raise _naming(err, path) from None
        try:
            for tmp, path in staged:
                os.replace(tmp, path)
                done.append(path)
        except OSError:
            for path in done:                  # undo what a failed rename left half done
                if not existed[path]:
                    path.unlink(missing_ok=True)
            raise
    finally:
        for tmp, _ in staged:
            if tmp.exists():
                tmp.unlink()


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


def csv_text(df) -> str:
    """A DataFrame as roofcal writes every CSV: no index, floats with 10 significant digits."""
    return df.to_csv(index=False, float_format="%.10g", lineterminator="\n")


def write_csv_atomic(df, path: str | os.PathLike) -> None:
    """Write a DataFrame as CSV atomically (:func:`csv_text`: stable bytes)."""
    write_text_atomic(path, csv_text(df))


def yaml_text(doc, **options) -> str:
    """``yaml.safe_dump(doc, **options)``, through libyaml's emitter where PyYAML has it: the
    same text, four times faster (the H100 coefficient file is 3.8 MB)."""
    import yaml
    return yaml.dump(doc, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper), **options)


#: what the last few large texts parsed gave, by parser and the SHA-256 of the text
_PARSED: dict = {}
#: how many, and from what size (characters) a text is remembered
PARSED_KEPT, PARSED_FROM = 8, 1 << 16


def remembered(text: str, parse, parser: str = "safe", copy=None):
    """``parse(text)``; a large text (a coefficient file: 3.8 MB, 0.7–1.4 s to parse) parsed before
    in this process by the same ``parser`` is not parsed again: what it gave is remembered by the
    text's SHA-256 and handed out as a copy (``copy``; default a deep copy, 35 ms for a YAML
    document), so a caller may change what it gets. A text that fails to parse is not remembered
    (it fails again, with the same error)."""
    import copy as copies
    if len(text) < PARSED_FROM:
        return parse(text)
    key = (parser, hashlib.sha256(text.encode("utf-8")).hexdigest())
    if key not in _PARSED:
        doc = parse(text)
        while len(_PARSED) >= PARSED_KEPT:
            _PARSED.pop(next(iter(_PARSED)))
        _PARSED[key] = doc
    return (copy or copies.deepcopy)(_PARSED[key])


def yaml_load(text: str):
    """``yaml.safe_load(text)``, through libyaml's parser where PyYAML has it (eight times faster),
    a large text parsed once per process (:func:`remembered`)."""
    import yaml
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return remembered(text, lambda t: yaml.load(t, Loader=loader))


def read_text(path: str | os.PathLike, what: str = "file") -> str:
    """A UTF-8 text file's text; a missing or undecodable file raises a one-line ``RoofcalError``."""
    from roofcal.errors import RoofcalError
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RoofcalError(f"{path}: no such {what}")
    except UnicodeDecodeError:
        raise RoofcalError(f"{path}: not a UTF-8 text file")


def parse_yaml(text: str, path: str | os.PathLike):
    """:func:`yaml_load` of a file's ``text``; bad YAML raises a one-line ``RoofcalError``."""
    import yaml
    from roofcal.errors import RoofcalError
    try:
        return yaml_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        raise RoofcalError(f"{path}: invalid YAML" + (f" at line {mark.line + 1}" if mark else ""))


def top_level_entries(text: str, names) -> str | None:
    """The lines of a YAML document's top-level entries ``names``, as a document of their own:
    for a block mapping whose keys each start a line, as PyYAML writes one (what sits at the
    start of a line is then a key, a ``- `` item of a key's list or a comment); None for any
    other layout (a flow mapping, quoted keys, document markers), which the caller parses whole."""
    import re
    key = re.compile(r"([A-Za-z_][A-Za-z0-9_]*):(?:[ \t]|$)")
    out, keep = [], False
    for line in text.splitlines(keepends=True):
        first = line[:1]
        if first in ("", " ", "\t", "\n", "\r", "#") or line.startswith("- ") or line.rstrip() == "-":
            if keep:
                out.append(line)
            continue
        m = key.match(line)
        if m is None:
            return None
        keep = m.group(1) in names
        if keep:
            out.append(line)
    return "".join(out)


def read_yaml(path: str | os.PathLike, what: str = "file"):
    """Parse a YAML file; a missing file or bad YAML raises a one-line ``RoofcalError``."""
    return parse_yaml(read_text(path, what), path)


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

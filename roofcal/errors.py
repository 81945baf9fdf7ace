"""One exception type for every user-facing failure.

A :class:`RoofcalError` carries a single line naming the file and the field at fault. The CLI prints
it as ``roofcal: error: <message>`` and exits with status 2, without a traceback; library users can
catch it like any other exception.
"""

from __future__ import annotations


class RoofcalError(ValueError):
    """Bad input or an impossible request; ``str(err)`` is one line fit for a terminal."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


def where(path, field: str | None = None) -> str:
    """Format ``path`` (and optionally ``field``) for an error message: ``'cfg.json' field 'x'``."""
    loc = f"{path}"
    return f"{loc}: field '{field}'" if field else loc


class RoofcalWarning(UserWarning):
    """Input that is read but predicts differently than when it was written (an older file).
    The CLI prints it as one line, ``roofcal: warning: <message>``."""

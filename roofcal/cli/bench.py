"""``roofcal bench``: held-out accuracy and speed against the targets
(:func:`roofcal.bench.fits.run`)."""

from __future__ import annotations


def register(sub) -> None:
    """Add the ``bench`` subcommand."""
    s = sub.add_parser("bench", help="held-out accuracy and speed against the targets")
    s.add_argument("--out", help="also write the report as Markdown to this file")
    s.add_argument("--no-transfer", action="store_true", help="skip the GPU-transfer benchmark")
    s.add_argument("--traces-mb", type=float, default=0.0, metavar="MB",
                   help="also time 'roofcal traces read' on a synthetic trace of MB megabytes "
                        "(roofcal.bench.traces; default 0: skip)")
    s.set_defaults(func=cmd_bench, outputs=[("out", "file", "report (--out)")])


def cmd_bench(a) -> None:
    import math
    from roofcal.bench.fits import run
    from roofcal.errors import RoofcalError
    if not (math.isfinite(a.traces_mb) and 0.0 <= a.traces_mb <= 100_000):
        raise RoofcalError(f"--traces-mb must be in [0, 100000] MB, got {a.traces_mb}")
    run(a.out, transfer=not a.no_transfer, traces_mb=a.traces_mb)

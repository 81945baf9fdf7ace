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
    s.set_defaults(func=cmd_bench)


def cmd_bench(a) -> None:
    from roofcal.bench.fits import run
    run(a.out, transfer=not a.no_transfer, traces_mb=a.traces_mb)

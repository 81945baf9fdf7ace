"""``roofcal bench``: held-out accuracy and speed against the targets
(:func:`roofcal.bench.fits.run`)."""

from __future__ import annotations


def register(sub) -> None:
    """Add the ``bench`` subcommand."""
    s = sub.add_parser("bench", help="held-out accuracy and speed against the targets")
    s.add_argument("--out", help="also write the report as Markdown to this file")
    s.add_argument("--no-transfer", action="store_true", help="skip the GPU-transfer benchmark")
    s.set_defaults(func=cmd_bench)


def cmd_bench(a) -> None:
    from roofcal.bench.fits import run
    run(a.out, transfer=not a.no_transfer)

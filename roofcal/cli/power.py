"""``roofcal power fit``: fit a GPU's power model — the SM clock it holds at its power limit under a
busy stream of steps — on a sustained-load measurement, into a coefficient file
(:func:`roofcal.calibration.power.power_file`).

Example::

    roofcal power fit --coeffs coeffs/h100_sxm.yaml --sustained data/sustained/h100_sxm --out h100.yaml
"""

from __future__ import annotations


def cmd_power_fit(a) -> None:
    from roofcal.calibration.power import power_file
    res = power_file(a.coeffs, a.sustained, a.out or a.coeffs, a.gpu)
    print(res.text)
    if not a.out:                          # in place: say so (with --out, roofcal.cli.main says it)
        import sys
        from roofcal.cli.main import overwrote
        print(overwrote(a.coeffs, "coefficient file, in place: no --out"), file=sys.stderr)


def register(sub) -> None:
    """Add ``power fit``."""
    p = sub.add_parser("power", help="the GPU at its power limit: fit its power model on a sustained load")
    ps = p.add_subparsers(dest="power_command", required=True)
    s = ps.add_parser("fit", help="fit the power model of every kernel set of a coefficient file",
                      description="Fit the power model (idle, compute and memory power at the boost clock, the "
                                  "voltage exponent, the clock elasticity of compute-bound time, the limiter's "
                                  "window) of every kernel set of a coefficient file on a sustained-load "
                                  "measurement (roofcal probe's folder), and write the file.")
    s.add_argument("--coeffs", required=True, metavar="FILE", help="coefficient file (its kernels stay as they are)")
    s.add_argument("--sustained", metavar="DIR",
                   help="sustained-load measurement folder (default: the bundled one of the file's GPU, "
                        "data/sustained/<gpu>/)")
    s.add_argument("--gpu", metavar="DATASHEET",
                   help="datasheet or roofcal probe's overlay of the file's GPU: its power limit and boost clock, and "
                        "the measurement an overlay names (default: the bundled datasheet)")
    s.add_argument("--out", metavar="FILE", help="coefficient file to write (default: --coeffs, in place)")
    s.set_defaults(func=cmd_power_fit, outputs=[("out", "file", "coefficient file (--out)")])

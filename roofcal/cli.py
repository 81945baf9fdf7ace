"""The ``roofcal`` command line: every command is a thin wrapper over a documented function.

Errors in the input print one line, ``roofcal: error: …``, and exit with status 2; nothing is
written.
"""

from __future__ import annotations

import argparse
import sys

from .errors import RoofcalError


def cmd_predict(a) -> None:
    from .io import write_csv_atomic
    if a.ops:
        from .ops import predict_ops
        df = predict_ops(a.ops, coeffs=a.coeffs)
    else:
        if not a.steps:
            raise RoofcalError("predict: give --steps FILE (step JSONL) or --ops FILE (per-op CSV)")
        from .predict import predict
        df = predict(a.steps, model=a.model, gpu=a.gpu, tp=a.tp, coeffs=a.coeffs)
    write_csv_atomic(df, a.out)
    print(f"wrote {len(df)} rows to {a.out}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="roofcal", description=__doc__.splitlines()[0])
    from . import __version__
    p.add_argument("--version", action="version", version=f"roofcal {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("predict", help="predict step times (or per-op kernel times) with a breakdown")
    s.add_argument("--steps", help="step JSONL file")
    s.add_argument("--ops", help="per-op measurement CSV (predicts every row)")
    s.add_argument("--model", help="bundled model name or config.json path (for steps without one)")
    s.add_argument("--gpu", help="bundled GPU name or datasheet path (for steps without one)")
    s.add_argument("--tp", type=int, help="tensor-parallel degree (for steps without one)")
    s.add_argument("--coeffs", help="coefficient file (default: neutral roofline defaults)")
    s.add_argument("--out", required=True, help="output CSV")
    s.set_defaults(func=cmd_predict)
    return p


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.func(args)
    except RoofcalError as e:
        print(f"roofcal: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("roofcal: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())

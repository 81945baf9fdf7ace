"""``roofcal residuals``: where a coefficient file's error comes from (wraps
:func:`roofcal.inspection.report.residuals`)."""

from __future__ import annotations


def cmd_residuals(a) -> None:
    import time
    from roofcal.inspection.report import residuals, terminal_text
    from roofcal.errors import RoofcalError
    for name in ("worst", "top"):
        if getattr(a, name) < 0:
            raise RoofcalError(f"--{name} must be ≥ 0, got {getattr(a, name)}")
    t0 = time.time()
    data = a.data if a.data else None
    res = residuals(a.coeffs, data, a.out, gpu=a.gpu, model=a.model, tp=a.tp, blis=a.blis,
                    plots=not a.no_plots, worst=a.worst, top=a.top, stack=a.stack,
                    kernels=a.kernels, table_format="csv" if a.csv else "parquet")
    for n in res.notes:
        print(f"note: {n}")
    print(terminal_text(res.summary))
    print(f"wrote {len(res.files)} files to {a.out} in {time.time() - t0:.1f} s, "
          f"{size_text(sum(p.stat().st_size for p in res.files))}:")
    for p in res.files:
        what = FILE_ROLES.get(p.name, "plot" if p.suffix == ".png" else "")
        rows = f"{len(res.table):,} rows, " if p.stem == "residuals" else ""
        print(f"  {p.name}  ({rows}{size_text(p.stat().st_size)}){'  ' + what if what else ''}")


#: what each file of the report holds
FILE_ROLES = {"residuals.parquet": "one row per measurement: measured, predicted, error, components",
              "residuals.csv": "one row per measurement: measured, predicted, error, components",
              "attribution.csv": "every (regime, component) scale and the error it removes",
              "summary.md": "the report: errors per op, phase, batch and context, attribution"}


def size_text(n: int) -> str:
    """Bytes as ``812 B``, ``4.2 kB``, ``9.8 MB`` (powers of 1000)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def register(sub) -> None:
    """Add the ``residuals`` subcommand to the ``roofcal`` parser's subparsers."""
    s = sub.add_parser(
        "residuals", help="inspect a model's errors: per op, component and regime, with plots",
        description="Compare a coefficient file's predictions with measurements and show which "
                    "component and which regime the error comes from. Writes residuals.parquet "
                    "(--csv: residuals.csv), attribution.csv, summary.md and PNG plots into --out.")
    s.add_argument("--coeffs", help="roofcal coefficient file (its GPU chooses the bundled data)")
    s.add_argument("--blis", metavar="PATH",
                   help="inspect BLIS trained-physics coefficients instead: a BLIS defaults.yaml "
                        "(trained_physics_coefficients) or BLIS-form YAML; steps only")
    s.add_argument("--data", nargs="+", metavar="D",
                   help="measurement files or folders (per-op tables, splitwise CSV, step JSONL), "
                        "or 'bundled' (default: the bundled data of the GPU)")
    s.add_argument("--gpu", help="GPU of the measurements (default: the coefficient file's)")
    s.add_argument("--stack", metavar="NAME",
                   help="serving stack that scores the measured steps: a stack of the file, 'none', or "
                        "FILE:NAME (default: each step file's own — the stack fitted on it — else the "
                        "file's default)")
    s.add_argument("--kernels", metavar="SET",
                   help="kernel set of the coefficient file that predicts every row (default: per-op rows "
                        "their own set's, steps their stack's)")
    s.add_argument("--model", help="model of step JSONL rows without one; keeps only its steps")
    s.add_argument("--tp", type=int, help="TP of step JSONL rows without one; keeps only its steps")
    s.add_argument("--out", required=True, metavar="DIR", help="folder for the report")
    s.add_argument("--worst", type=int, default=20, help="worst rows listed per kind (default 20)")
    s.add_argument("--top", type=int, default=12,
                   help="attribution lines per kind of row (default 12)")
    s.add_argument("--no-plots", action="store_true", help="skip the PNG plots (faster)")
    s.add_argument("--csv", action="store_true",
                   help="write the per-row table as residuals.csv instead of residuals.parquet "
                        "(about ten times larger: 100 MB on the bundled H100 data)")
    s.set_defaults(func=cmd_residuals, outputs=[("out", "dir", "report folder (--out)")])

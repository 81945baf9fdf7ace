"""``roofcal predict``: step times with a breakdown (:func:`roofcal.model.predict.predict`), or
every row of a per-op table (:func:`roofcal.model.predict.predict_ops`); then one line saying
how many rows are out of the fitted domain (:func:`roofcal.model.domain.summary`) and one on
their 80 % intervals (:func:`roofcal.model.intervals.summary`)."""

from __future__ import annotations

from roofcal.errors import RoofcalError


def cmd_predict(a) -> None:
    from roofcal.io import write_csv_atomic
    from roofcal.model.domain import summary
    from roofcal.model.intervals import summary as interval_summary
    if a.ops:
        from roofcal.model.predict import predict_ops
        df = predict_ops(a.ops, coeffs=a.coeffs, kernels=a.kernels)
    else:
        if not a.steps:
            raise RoofcalError("predict: give --steps FILE (step JSONL) or --ops FILE (per-op CSV)")
        from roofcal.model.predict import predict
        from roofcal.cli.main import parallel_of
        df = predict(a.steps, model=a.model, gpu=a.gpu, tp=a.tp, coeffs=a.coeffs, stack=a.stack,
                     kernels=a.kernels, clock=a.clock, parallel=parallel_of(a))
    write_csv_atomic(df, a.out)
    print(f"wrote {len(df)} rows to {a.out}")
    if not a.ops and a.clock == "sustained":
        for (m, g, t), grp in df.groupby(["model", "gpu", "tp"], sort=False):
            mhz, s = grp["sm_clock_mhz"].iloc[0], grp["compute_scale"].iloc[0]
            print(f"{m} TP{t} on {g}, the steps back to back: "
                  + (f"SM {mhz:,.0f} MHz, compute-bound time x{s:.3f} (power-limited)" if s > 1 else
                     "boost clock (within the power limit)"))
    print(summary(df, "rows" if a.ops else "steps", neutral=a.coeffs is None))
    line = interval_summary(df, "rows" if a.ops else "steps")
    if line:
        print(line)


def register(sub) -> None:
    """Add the ``predict`` subcommand."""
    from roofcal.cli.main import add_kernels_option, add_parallel_options
    s = sub.add_parser("predict", help="predict step times (or per-op kernel times) with a breakdown")
    s.add_argument("--steps", help="step JSONL file")
    s.add_argument("--ops", help="per-op measurement CSV (predicts every row)")
    s.add_argument("--model", help="bundled model name or config.json path (for steps without one)")
    s.add_argument("--gpu", help="bundled GPU name or datasheet path (for steps without one)")
    s.add_argument("--tp", type=int, help="tensor-parallel degree (for steps without one)")
    add_parallel_options(s)
    s.add_argument("--coeffs", help="coefficient file (default: neutral roofline defaults)")
    s.add_argument("--stack", metavar="NAME",
                   help="serving stack for whole steps: a stack of the coefficient file (default: "
                        "the file's own), 'none' for kernels only, or FILE:NAME to borrow one")
    add_kernels_option(s)
    s.add_argument("--clock", choices=("burst", "sustained"), default="burst",
                   help="burst: each step at the boost clock, as the per-op tables were timed (default); "
                        "sustained: each deployment's steps as one stream run back to back, at the SM clock "
                        "its power limit allows (columns clock, sm_clock_mhz, compute_scale)")
    s.add_argument("--out", required=True, help="output CSV")
    s.set_defaults(func=cmd_predict, outputs=[("out", "file", "prediction CSV (--out)")])


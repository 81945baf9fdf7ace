"""``roofcal fit``: fit a coefficient file to measurements (:func:`roofcal.calibration.fit.fit`)."""

from __future__ import annotations


def cmd_fit(a) -> None:
    import time
    from roofcal.errors import RoofcalError
    from roofcal.model import coeffs as coeff_io
    from roofcal.measurements import datasets
    from roofcal import resources
    from roofcal.calibration.fit import FEW_SHOT_KAPPA, FitSettings, fit
    from roofcal.physics.hardware import load_gpu
    from roofcal.tables import metrics_table
    t0 = time.time()
    gpu = load_gpu(a.gpu)
    paths = a.data or datasets.bundled_paths(gpu.name)
    prior = coeff_io.load(a.prior, gpu) if a.prior else None
    m = datasets.load(paths, gpu=gpu.name, model=a.model, tp=a.tp)
    kappa = a.prior_weight if a.prior_weight is not None else (FEW_SHOT_KAPPA if a.prior else None)
    weight = {} if kappa is None else {"prior_terms": kappa, "prior_scalars": kappa}
    settings = FitSettings(seed=a.seed, holdout=a.holdout, progress=not a.quiet, **weight)
    n_ops = 0 if m.ops is None else len(m.ops)
    print(f"fitting {gpu.name}: {n_ops} per-op rows, {sum(len(d) for d in m.steps)} steps "
          f"from {len(m.provenance)} files", flush=True)
    result = fit(gpu, m.ops, m.steps, settings, prior=prior, provenance=m.provenance)
    out = a.out or resources.COEFFS / f"{gpu.name}.yaml"
    c = result.coeffs
    for spec in a.stack_from or []:               # stacks borrowed explicitly, recorded as such
        if ":" not in spec:
            raise RoofcalError(f"--stack-from {spec}: give FILE:NAME (a stack of another coefficient file)")
        c = coeff_io.resolve_stack(c, spec)
    from pathlib import Path
    if Path(out).is_file() and not a.no_carry:
        try:
            c = coeff_io.carry_stacks(c, coeff_io.load(out))
        except RoofcalError as err:
            print(f"note: serving stacks of {out} not carried over ({err})")
    for name, st in c.stacks.items():
        kind = st.source.get("kind", "")
        print(f"serving stack '{name}'{' (default)' if name == c.stack else ''}: {kind}"
              + (" — borrowed from " + str(st.source["borrowed_from"]["file"]) if "borrowed_from" in st.source else ""))
    if c.stack is None:
        print("no serving stack: whole-step predictions need --stack (none, or FILE:NAME); see --stack-from")
    coeff_io.save(c, out)
    print(metrics_table(result.coeffs.metrics))
    print(f"wrote {out} in {time.time() - t0:.1f} s")


def register(sub) -> None:
    """Add the ``fit`` subcommand."""
    s = sub.add_parser("fit", help="fit corrections to measurements (default: the bundled H100 data)")
    s.add_argument("--gpu", default="h100_sxm", help="GPU the measurements are from (default h100_sxm)")
    s.add_argument("--data", nargs="+", help="measurement files or folders (default: bundled for --gpu)")
    s.add_argument("--model", help="model of step JSONL rows that do not name one")
    s.add_argument("--tp", type=int, help="TP of step JSONL rows that do not name one")
    s.add_argument("--prior", help="coefficient file to centre the priors on (few-shot refit)")
    s.add_argument("--prior-weight", type=float, help="strength of the priors in pseudo-rows "
                   "(default 1 with --prior, best on the A100 learning curve; "
                   "else 0.01: the data decides)")
    s.add_argument("--out", help="coefficient file to write (default coeffs/<gpu>.yaml)")
    s.add_argument("--seed", type=int, default=0, help="seed of the held-out split (default 0)")
    s.add_argument("--holdout", type=float, default=0.2, help="held-out fraction (default 0.2)")
    s.add_argument("--stack-from", action="append", metavar="FILE:NAME",
                   help="borrow serving stack NAME of another coefficient file (repeatable; the last is "
                        "the default), e.g. for a GPU without whole-step data")
    s.add_argument("--no-carry", action="store_true",
                   help="do not keep the serving stacks of an existing --out file that this fit does "
                        "not produce (workload-calibrated or borrowed ones are kept by default)")
    s.add_argument("--quiet", action="store_true", help="no progress bars")
    s.set_defaults(func=cmd_fit)

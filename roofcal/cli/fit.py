"""``roofcal fit``: fit a coefficient file to measurements (:func:`roofcal.calibration.fit.fit`)."""

from __future__ import annotations


#: where ``roofcal fit`` writes by default (relative to the current folder): a user's results,
#: not the shipped, tested files in ``coeffs/`` (write those with ``--out coeffs/<gpu>.yaml``)
DEFAULT_OUT = "out"


def cmd_fit(a) -> None:
    import sys
    import time
    from pathlib import Path
    from roofcal.errors import RoofcalError
    from roofcal.model import coeffs as coeff_io
    from roofcal.measurements import datasets
    from roofcal import resources
    from roofcal.calibration.fit import FEW_SHOT_KAPPA, FitSettings, fit
    from roofcal.physics.hardware import load_gpu
    from roofcal.tables import metrics_table
    import math
    from roofcal.io import check_output
    if not (0.0 <= a.holdout < 1.0):
        raise RoofcalError(f"--holdout must be in [0, 1), got {a.holdout}")
    if a.prior_weight is not None and not (math.isfinite(a.prior_weight) and a.prior_weight >= 0):
        raise RoofcalError(f"--prior-weight must be a finite number ≥ 0, got {a.prior_weight}")
    t0 = time.time()
    gpu = load_gpu(a.gpu)
    if not a.out:                        # a given --out was checked with every command's outputs
        check_output(Path(DEFAULT_OUT) / f"{gpu.name}.yaml", "coefficient file (--out)")
    paths = a.data or datasets.bundled_paths(gpu.name)
    prior = coeff_io.load(a.prior, gpu) if a.prior else None
    m = datasets.load(paths, gpu=gpu, model=a.model, tp=a.tp)
    kappa = a.prior_weight if a.prior_weight is not None else (FEW_SHOT_KAPPA if a.prior else None)
    weight = {} if kappa is None else {"prior_terms": kappa, "prior_scalars": kappa}
    if a.max_rows < 1:
        raise RoofcalError(f"--max-rows must be ≥ 1, got {a.max_rows}")
    settings = FitSettings(seed=a.seed, holdout=a.holdout, progress=not a.quiet and sys.stderr.isatty(),
                           step_target=a.step_target, max_rows=a.max_rows, kernels=a.kernels, **weight)
    if (a.requests or a.context) and not m.steps:
        raise RoofcalError("--requests: measured alphas need whole steps in --data (a step JSONL of "
                           "'roofcal traces read'), whose serving stack they belong to")
    if a.context and not a.requests:
        raise RoofcalError("--context: give the requests table too (--requests)")
    n_ops = 0 if m.ops is None else len(m.ops)
    print(f"fitting {gpu.name}: {n_ops} per-op rows, {sum(len(d) for d in m.steps)} steps "
          f"from {len(m.provenance)} files", flush=True)
    if m.left_out:
        print("left out, not priced: " + "; ".join(f"{n:,} rows: {k}" for k, n in m.left_out.items()))
    result = fit(gpu, m.ops, m.steps, settings, prior=prior, provenance=m.provenance)
    out = Path(a.out) if a.out else Path(DEFAULT_OUT) / f"{gpu.name}.yaml"
    c = result.coeffs
    if a.requests:
        from roofcal.calibration.alphas import alphas_from_files, with_alphas
        al = alphas_from_files(a.requests, a.context)
        c = with_alphas(c, c.stack, al, list(a.requests) + list(a.context or []))
        shown = ", ".join(f"{k} {v:.1f}" if v is not None else f"{k} not measured"
                          for k, v in al.as_dict().items())
        print(f"alphas of stack '{c.stack}' from {al.counts['finished']} finished requests: {shown} (µs)"
              + (f"; output_token before clipping at 0: {al.output_token_raw_us:.1f}"
                 if al.output_token_raw_us is not None and al.output_token_raw_us < 0 else ""))
    for spec in a.stack_from or []:               # stacks borrowed explicitly, recorded as such
        if ":" not in spec:
            raise RoofcalError(f"--stack-from {spec}: give FILE:NAME (a stack of another coefficient file)")
        c = coeff_io.resolve_stack(c, spec)
    # the stacks a kernel fit does not produce (calibrated on serving runs, borrowed) are kept from
    # the file it replaces, or — writing a new file — from the shipped one of this GPU
    shipped = resources.COEFFS / f"{gpu.name}.yaml"
    carry_from = out if out.is_file() else (shipped if shipped.is_file() and not a.data else None)
    if carry_from is not None and not a.no_carry:
        try:
            c = coeff_io.carry_stacks(c, coeff_io.read_stacks(carry_from))
            if carry_from != out:
                print(f"serving stacks not fitted here are carried from {resources.display(carry_from)}")
        except RoofcalError as err:
            print(f"note: serving stacks of {carry_from} not carried over ({err})")
    c = _fit_power(a, c, gpu)
    for name, st in c.stacks.items():
        kind = st.source.get("kind", "")
        print(f"serving stack '{name}'{' (default)' if name == c.stack else ''}: {kind}"
              + (" — borrowed from " + str(st.source["borrowed_from"]["file"]) if "borrowed_from" in st.source else ""))
    if c.stack is None:
        from roofcal.cli.gpu import reference_coeffs
        print(f"no serving stack: whole-step predictions need --stack none (kernels only), or one borrowed "
              f"(--stack {reference_coeffs()}:vllm, the H100's; a refit with --stack-from keeps it in the file)")
    for name, ks in c.kernel_sets.items():
        print(f"kernel set '{name}'{set_role(c, name)}: {len(ks.ops)} kernels"
              + ("; for want of rows, " + ", ".join(f"{k} from {o}" for k, o in sorted(ks.borrowed.items()))
                 if ks.borrowed else ""))
    coeff_io.save(c, out)
    print(metrics_table(c.metrics, {n: ks.metrics for n, ks in c.kernel_sets.items()}))
    if any(p.get("curves") for ks in c.kernel_sets.values() for p in ks.ops.values()):
        print("GEMM, MoE, all-reduce and attention: priced from each measured shape's curve, which "
              "follows its training rows (train MAPE near 0 where the curve is trusted fully, shrink 1); "
              "judge them by the held-out rows (docs/model.md)")
    print(f"wrote {out} in {time.time() - t0:.1f} s")


def set_role(c, name: str) -> str:
    """What kernel set ``name`` of coefficients ``c`` is used for, as ``roofcal fit`` reports it:
    predictions use the default stack's set (the one it was calibrated with), which may differ
    from the file's ``kernels:`` (used with ``--stack none``)."""
    if name == c.kernels:
        return " (default)" if name == c.default_kernels else \
            f" (default with stack '{c.stack}', calibrated with it)"
    return " (the file's default, for --stack none)" if name == c.default_kernels else ""


def _fit_power(a, c, gpu):
    """``c`` with each kernel set's power model fitted on ``--sustained`` (default: the GPU's
    bundled sustained-load measurement, when the fit reads the bundled data), with a line per set."""
    from roofcal.calibration.power import bundled_sustained, fit_line, with_power
    from roofcal.measurements.sustained import read_sustained
    from roofcal.physics.hardware.datasheet import overlay_sustained
    folder = a.sustained or overlay_sustained(a.gpu) or (bundled_sustained(gpu.name) if not a.data else None)
    if folder is None:
        return c
    if gpu.power_limit_w <= 0:
        print(f"no power model: datasheet {gpu.name} gives no power_limit_w")
        return c
    c, fits = with_power(c, gpu, read_sustained(folder))
    for name, f in fits.items():
        print(fit_line(name, f, folder))
    return c


def register(sub) -> None:
    """Add the ``fit`` subcommand."""
    s = sub.add_parser("fit", help="fit corrections to measurements (default: the bundled H100 data)")
    s.add_argument("--gpu", default="h100_sxm", help="GPU the measurements are from (default h100_sxm)")
    s.add_argument("--data", nargs="+", help="measurement files or folders (default: bundled for --gpu)")
    s.add_argument("--model", help="model of step JSONL rows that do not name one")
    s.add_argument("--tp", type=int, help="TP of step JSONL rows that do not name one")
    s.add_argument("--prior", help="coefficient file to centre the priors on (few-shot refit)")
    s.add_argument("--prior-weight", type=float, help="strength of the priors in pseudo-rows "
                   "(default 0.1 with --prior, best on the few-shot learning curves beside "
                   "the surface anchor; a tenth of it, no anchor, for a kernel with 5 training "
                   "rows or more per surface term, or 2 to 5 where that predicts a fifth of them "
                   "set aside the closer; else 0.01: the data decides)")
    s.add_argument("--out", help=f"coefficient file to write (default {DEFAULT_OUT}/<gpu>.yaml; the shipped files "
                   "are coeffs/<gpu>.yaml)")
    s.add_argument("--seed", type=int, default=0, help="seed of the held-out split (default 0)")
    s.add_argument("--holdout", type=float, default=0.2, help="held-out fraction (default 0.2)")
    s.add_argument("--stack-from", action="append", metavar="FILE:NAME",
                   help="borrow serving stack NAME of another coefficient file (repeatable; the last is "
                        "the default), e.g. for a GPU without whole-step data")
    s.add_argument("--no-carry", action="store_true",
                   help="do not keep the serving stacks of an existing --out file that this fit does "
                        "not produce (workload-calibrated or borrowed ones are kept by default)")
    from roofcal.calibration import STEP_TARGET_NAMES
    s.add_argument("--step-target", choices=STEP_TARGET_NAMES, default="step",
                   help="what measured steps are fitted on: 'step' = duration_us against the whole "
                        "predicted step (a profiler's step time, as splitwise; default), 'gpu' = "
                        "duration_us against its GPU side (vLLM step tracing's forward time), "
                        "'cycle' = cycle_us (start to next start) against the whole step, "
                        "'gpu+cycle' = both")
    s.add_argument("--requests", nargs="+", metavar="CSV",
                   help="requests tables of 'roofcal traces read': the fitted stack takes BLIS's "
                        "alphas measured from them (roofcal/calibration/alphas.py)")
    s.add_argument("--context", nargs="+", metavar="CSV",
                   help="their step-context tables (cycle times), for the per-output-token alpha")
    s.add_argument("--kernels", metavar="SET",
                   help="kernel set whole steps are fitted with, and the file's default (default: the "
                        "newest, e.g. vllm-0.24.0); every set in --data is fitted")
    s.add_argument("--max-rows", type=int, default=10_000, metavar="N",
                   help="training rows fitted per kernel and kernel set (a seeded sample beyond; "
                        "default 10000)")
    s.add_argument("--sustained", metavar="DIR",
                   help="sustained-load measurement (roofcal probe's folder) to fit the GPU's power model "
                        "on (default: the one a --gpu overlay names, else the bundled one of --gpu, "
                        "data/sustained/<gpu>/, when --data is not given)")
    s.add_argument("--quiet", action="store_true", help="no progress bars")
    s.set_defaults(func=cmd_fit, outputs=[("out", "file", "coefficient file (--out)")])

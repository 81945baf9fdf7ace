"""The ``roofcal`` command line: every command is a thin wrapper over a documented function.

Errors in the input print one line, ``roofcal: error: …``, and exit with status 2; nothing is
written. A check that runs but fails (``roofcal blis check``) exits with status 1.
"""

from __future__ import annotations

import argparse
import sys

from .errors import RoofcalError


def enable_compilation_cache() -> None:
    """Keep XLA's compiled programs on disk (``$ROOFCAL_CACHE``, default ``~/.cache/roofcal``),
    so repeated fits skip compilation (outputs are identical either way). ``ROOFCAL_CACHE=off``
    disables it."""
    import os
    where = os.environ.get("ROOFCAL_CACHE", os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "roofcal"))
    if where.lower() in ("off", "0", "none", ""):
        return
    try:
        os.makedirs(where, exist_ok=True)
        import jax
        jax.config.update("jax_compilation_cache_dir", os.path.join(where, "jax"))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)
    except OSError:
        pass                                   # read-only home: run without the cache


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


def cmd_fit(a) -> None:
    import time
    from . import coeffs as coeff_io
    from . import datasets, resources
    from .fit import FEW_SHOT_KAPPA, FitSettings, fit
    from .hardware import load_gpu
    from .report import metrics_table
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
    coeff_io.save(result.coeffs, out)
    print(metrics_table(result.coeffs.metrics))
    print(f"wrote {out} in {time.time() - t0:.1f} s")


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
    s.add_argument("--quiet", action="store_true", help="no progress bars")
    s.set_defaults(func=cmd_fit)
    _register_plugins(sub)
    return p


#: modules that add their own subcommands: each defines ``register(subparsers)``
COMMAND_MODULES = ("roofcal.bench", "roofcal.blis.cli", "roofcal.residuals_cli", "roofcal.gpu_cli")


def _register_plugins(sub) -> None:
    import importlib
    for name in COMMAND_MODULES:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name == name:
                continue
            raise
        mod.register(sub)


def main(argv=None) -> int:
    enable_compilation_cache()
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code = args.func(args)             # a handler may return a non-zero exit status
    except RoofcalError as e:
        print(f"roofcal: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("roofcal: interrupted", file=sys.stderr)
        return 130
    return code if isinstance(code, int) else 0


if __name__ == "__main__":
    sys.exit(main())

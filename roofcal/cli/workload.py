"""``roofcal workload validate`` and ``calibrate``: replay measured vLLM serving runs in BLIS and
compare latencies (:func:`roofcal.blis.validate.validate`); fit a serving stack with BLIS in the
loop (:func:`roofcal.calibration.workload.calibrate_file`).

Examples::

    roofcal workload validate ../shared/workload/default_args --blis ../shared/tools/blis
    roofcal workload validate EXP1 EXP2 --arrivals closed --prompts fresh --out closed.csv --keep runs/
    roofcal workload validate ../shared/workload/default_args --coeffs coeffs/h100_sxm.yaml
    roofcal workload calibrate ../shared/workload/default_args --coeffs coeffs/h100_sxm.yaml

Each EXP is an experiment folder or a folder of them. Defaults: ``--defaults`` and
``--hardware-config`` are BLIS's own files bundled in ``data/blis/``; ``--model-configs`` searches
the project's ``model_configs/`` and then ``../shared/workload/model_configs`` when that folder
exists relative to the current directory; ``--blis`` falls back to ``$ROOFCAL_BLIS``.
"""

from __future__ import annotations

from pathlib import Path

#: searched after the bundled model configs, relative to the current directory, when it exists
SHARED_MODEL_CONFIGS = Path("..") / "shared" / "workload" / "model_configs"


def default_model_configs() -> list[Path]:
    """The project's ``model_configs/``, then :data:`SHARED_MODEL_CONFIGS` if it exists."""
    from roofcal.resources import MODEL_CONFIGS
    return [MODEL_CONFIGS] + ([SHARED_MODEL_CONFIGS] if SHARED_MODEL_CONFIGS.is_dir() else [])


def settings_from_args(a):
    """:class:`~roofcal.blis.run.BlisSettings` from the parsed options."""
    from roofcal.blis.run import BlisSettings, find_blis
    from roofcal.errors import RoofcalError

    if a.workers < 1:
        raise RoofcalError(f"--workers must be ≥ 1, got {a.workers}")
    if not a.timeout > 0:
        raise RoofcalError(f"--timeout must be positive, got {a.timeout}")
    folders = tuple(Path(p) for p in (a.model_configs or default_model_configs()))
    return BlisSettings(blis=find_blis(a.blis), defaults=Path(a.defaults),
                        hardware_config=Path(a.hardware_config), model_configs=folders,
                        arrivals=a.arrivals, timeout_s=a.timeout, workers=a.workers, prompts=a.prompts,
                        kv_blocks=a.kv_blocks)


def coefficients_from_args(a, exps, settings):
    """(alpha, beta) overriding the defaults' coefficients: exported from ``--coeffs`` (its
    ``--stack``) for the experiments' deployments, or (None, None) to use ``--defaults``' own."""
    if not getattr(a, "coeffs", None):
        return None, None
    from roofcal.calibration.workload import export_for
    from roofcal.model import coeffs as coeff_io
    from roofcal.calibration.workload import replay_alphas
    c = coeff_io.resolve_stack(coeff_io.load(a.coeffs), a.stack, required=True)
    alpha, beta = export_for(c, [e for e in exps if not e.overload] or exps, settings)
    print(f"exported {a.coeffs} (stack {c.stack or 'none'}): --alpha-coeffs "
          f"{','.join(f'{x:.6g}' for x in alpha)} --beta-coeffs {','.join(f'{x:.6g}' for x in beta)}")
    per_run = replay_alphas(c, exps, alpha, settings.model_configs)
    if per_run is not alpha:
        print("  first-token delay: alpha0 per run = " + ", ".join(
            f"{name}: {v[0]:.0f}" for name, v in per_run.items()))
    return per_run, beta


def cmd_validate(a) -> None:
    from roofcal.blis.validate import validate, validation_text, write_validation_csv
    from roofcal.measurements.workload import read_experiments

    exps = read_experiments(a.experiments)
    settings = settings_from_args(a)
    alpha, beta = coefficients_from_args(a, exps, settings)
    v = validate(exps, settings, alpha, beta, progress=True, keep=a.keep)
    print(validation_text(v))
    if a.out:
        write_validation_csv(v, a.out)
        print(f"wrote {a.out}")


def cmd_calibrate(a) -> None:
    from roofcal.calibration.workload import WorkloadSettings, calibrate_file
    from roofcal.measurements.workload import read_experiments

    exps = read_experiments(a.experiments)
    settings = settings_from_args(a)
    ws = WorkloadSettings(refreshes=a.refreshes, samples=a.samples,
                          first_token_cycles=a.first_token_cycles)
    out = a.out or a.coeffs
    res = calibrate_file(a.coeffs, exps, settings, ws, out, name=a.name, holdout=a.holdout)
    print(res.text)
    print(f"wrote stack '{a.name}' into {out} in {res.seconds:.0f} s")


def cmd_lomo(a) -> None:
    from roofcal.calibration.workload import WorkloadSettings, leave_one_model_out
    from roofcal.io import write_csv_atomic
    from roofcal.measurements.workload import read_experiments
    from roofcal.tables import table

    exps = read_experiments(a.experiments)
    settings = settings_from_args(a)
    held, m, reports = leave_one_model_out(a.coeffs, exps, settings,
                                           WorkloadSettings(refreshes=a.refreshes, samples=a.samples,
                                                            first_token_cycles=a.first_token_cycles))
    cols = ["experiment", "overload"] + [f"err_{k}_pct" for k in ("e2e", "ttft", "itl")]
    print(table(held.to_dict("records"), cols, floats="{:+.1f}"))
    print(f"held-out MAPE over {int((~held['overload'].astype(bool)).sum())} runs: E2E {m['e2e']:.1f} %, "
          f"TTFT {m['ttft']:.1f} %, ITL {m['itl']:.1f} %  ({settings.replay}; "
          f"{sum(r.seconds for r in reports):.0f} s)")
    if a.out:
        write_csv_atomic(held, a.out)
        print(f"wrote {a.out}")


def _replay_options(s) -> None:
    from roofcal.blis import ARRIVALS, PROMPTS
    from roofcal.resources import BLIS_DEFAULTS, BLIS_HARDWARE
    s.add_argument("experiments", nargs="+", metavar="EXP",
                   help="experiment folder (exp-config.yaml, profile.yaml, results/) or a folder of them")
    s.add_argument("--blis", metavar="PATH", help="BLIS binary (default: $ROOFCAL_BLIS)")
    s.add_argument("--defaults", default=str(BLIS_DEFAULTS), metavar="FILE",
                   help="BLIS defaults.yaml, whose trained_physics_coefficients are used unless --coeffs "
                        "(default: BLIS's own, bundled)")
    s.add_argument("--arrivals", choices=ARRIVALS, default="open",
                   help="open: Poisson arrivals at the profile's rates, as inference-perf sent them "
                        "(default); closed: BLIS's closed-loop session expansion")
    s.add_argument("--prompts", choices=PROMPTS, default="pool",
                   help="pool: each simulated user replays its one prompt, as inference-perf sent "
                        "them, so the prefix cache holds it (default); fresh: BLIS's expansion, a "
                        "new question per request")
    s.add_argument("--model-configs", nargs="+", action="extend", metavar="DIR",
                   help="folders of <model>/config.json, searched in order (default: the bundled "
                        "model_configs/, then ../shared/workload/model_configs if it exists)")
    s.add_argument("--hardware-config", default=str(BLIS_HARDWARE), metavar="FILE",
                   help="BLIS hardware_config.json (default: BLIS's own, bundled)")
    s.add_argument("--kv-blocks", choices=("blis", "capacity"), default="blis",
                   help="GPU KV blocks where vLLM's logged count is not known: BLIS's auto value / TP "
                        "(default, as BLIS's validation does) or 'capacity' (roofcal capacity, vLLM's rule)")
    s.add_argument("--workers", type=int, default=2, help="BLIS processes at once (default 2)")
    s.add_argument("--timeout", type=float, default=300.0, help="seconds per BLIS run (default 300)")


def _calibration_options(s) -> None:
    from types import SimpleNamespace
    from roofcal.calibration import WORKLOAD_DEFAULTS
    d = SimpleNamespace(**WORKLOAD_DEFAULTS)     # WorkloadSettings' defaults, without importing JAX
    _replay_options(s)
    s.add_argument("--coeffs", required=True, metavar="FILE", help="coefficient file (its kernel corrections are kept)")
    s.add_argument("--refreshes", type=int, default=d.refreshes,
                   help=f"BLIS replays of the runs per calibration (default {d.refreshes})")
    s.add_argument("--samples", type=int, default=d.samples,
                   help=f"distillation steps per deployment (default {d.samples})")
    s.add_argument("--first-token-cycles", type=float, default=d.first_token_cycles, metavar="C",
                   help="cycles between a step and its tokens reaching the client (vLLM processes "
                        "a step's outputs during the next step); BLIS replays take alpha0 + C x each "
                        f"run's steady-state cycle (default {d.first_token_cycles:g}; 0: one alpha0 "
                        "for all runs)")


def register(sub) -> None:
    """Add ``workload`` (validate, calibrate) to the ``roofcal`` subcommands."""
    w = sub.add_parser("workload", help="measured serving runs replayed in BLIS; serving-stack calibration")
    ws = w.add_subparsers(dest="workload_command", required=True)
    s = ws.add_parser("validate", help="replay experiments in BLIS; simulated vs measured E2E, TTFT, ITL",
                      description="Replay measured vLLM serving runs in BLIS and compare simulated "
                                  "with measured mean E2E, TTFT and ITL (MAPE over the runs that are "
                                  "not overloaded).")
    _replay_options(s)
    s.add_argument("--coeffs", metavar="FILE",
                   help="roofcal coefficient file to export and replay instead of --defaults' coefficients")
    s.add_argument("--stack", metavar="NAME", help="its serving stack (default: the file's own; 'none' = kernels only)")
    s.add_argument("--out", metavar="FILE", help="write the per-(experiment, scope) table as CSV")
    s.add_argument("--keep", metavar="DIR", help="keep each run's spec, metrics and log in DIR/<experiment>/")
    s.set_defaults(func=cmd_validate)

    s = ws.add_parser("calibrate", help="fit a serving stack and BLIS's alphas to serving runs, BLIS in the loop",
                      description="Fit the serving-stack layer of a coefficient file (CPU work, launch gaps, "
                                  "CPU-GPU overlap, BLIS's alphas) so that BLIS, fed the exported "
                                  "coefficients, reproduces the measured mean E2E, TTFT and ITL.")
    _calibration_options(s)
    s.add_argument("--out", metavar="FILE", help="coefficient file to write (default: --coeffs, in place)")
    s.add_argument("--name", default="vllm", help="name of the stack (default vllm); it becomes the default stack")
    s.add_argument("--holdout", metavar="MODEL", action="append",
                   help="leave a model's runs out of the fit (HF id or its last part; repeatable); they are "
                        "still replayed and reported")
    s.set_defaults(func=cmd_calibrate)

    s = ws.add_parser("lomo", help="leave-one-model-out benchmark of the workload calibration",
                      description="For each model: calibrate the serving stack on the other models' runs, "
                                  "then replay the held-out model's runs in BLIS; prints signed errors and "
                                  "the held-out MAPE.")
    _calibration_options(s)
    s.add_argument("--out", metavar="FILE", help="write the held-out rows as CSV")
    s.set_defaults(func=cmd_lomo)

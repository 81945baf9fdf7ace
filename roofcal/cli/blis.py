"""``roofcal blis check|fit`` and ``roofcal export blis|hardware``: thin wrappers over
:mod:`roofcal.blis.goldens`, :mod:`roofcal.blis.fit` and :mod:`roofcal.blis.export`.

Examples::

    roofcal blis check --goldens data/blis/trained_physics_goldens.json
    roofcal blis fit --coeffs coeffs/h100_sxm.yaml --out h100_blis.yaml
    roofcal export blis --coeffs coeffs/h100_sxm.yaml --defaults defaults.yaml --out new_defaults.yaml --flags
    roofcal export blis --coeffs h100_blis.yaml --defaults defaults.yaml --in-place
    roofcal export blis --coeffs coeffs/h100_sxm.yaml --defaults data/blis/defaults.yaml --out-dir blis/ \
        --for ../shared/workload/default_args
    roofcal export hardware --gpu h100_sxm --into hardware_config.json
"""

from __future__ import annotations

import time

from roofcal.errors import RoofcalError


def _deployments(a):
    """Deployments from ``--model`` × ``--tp`` (None when neither is given). A model written
    ``NAME:T1,T2`` carries its own TP degrees instead of ``--tp``'s. ``--dp``,
    ``--enable-expert-parallel`` and ``--moe-comm-backend`` lay every one of them out beyond TP."""
    import re

    from roofcal.blis.fit import Deployment
    from roofcal.cli.main import parallel_of
    from roofcal.physics.config import Parallel

    layout = parallel_of(a)
    if not a.model and not a.tp:
        if layout != Parallel():
            raise RoofcalError("--dp, --enable-expert-parallel and --moe-comm-backend apply to the "
                               "deployments given by --model NAME:TP")
        return None
    out, plain = [], False
    for m in a.model or []:
        own = re.fullmatch(r"(.+):(\d+(?:,\d+)*)", m)
        if own:
            out += [Deployment(own.group(1), int(t)) for t in own.group(2).split(",")]
        else:
            plain = True
            out += [Deployment(m, t) for t in a.tp or []]
    if not a.model or (plain and not a.tp):
        raise RoofcalError("give both --model and --tp (every model is distilled at every TP), "
                           "or --model NAME:TP[,TP...]")
    if a.tp and not plain:
        raise RoofcalError("--tp given but every --model names its own TP degrees (NAME:TP,...)")
    return out if layout == Parallel() else [Deployment(d.model, d.tp, layout) for d in out]


def _settings(a, deployment_export: bool = False):
    """The distillation settings of the options; ``--samples`` defaults to the workload
    commands' value for an export for runs or deployments (``--for``, ``--out-dir``: the betas
    ``workload validate`` replays), else to :data:`roofcal.blis.FIT_DEFAULTS`."""
    from roofcal.blis import FIT_DEFAULTS
    from roofcal.blis.fit import BlisFitSettings
    from roofcal.calibration import WORKLOAD_DEFAULTS

    if a.samples is None:
        a.samples = WORKLOAD_DEFAULTS["samples"] if deployment_export else FIT_DEFAULTS["samples"]
    if not 0 <= a.samples <= 1_000_000:
        raise RoofcalError(f"--samples must be in 0 … 1,000,000, got {a.samples}")
    if not 0.0 <= a.holdout < 1.0:
        raise RoofcalError(f"--holdout must be in [0, 1), got {a.holdout}")
    if a.iters < 1:
        raise RoofcalError(f"--iters must be ≥ 1, got {a.iters}")
    return BlisFitSettings(seed=a.seed, holdout=a.holdout, samples=a.samples, iters=a.iters)


def metrics_table(metrics: dict) -> str:
    """Held-out MAPE side by side: native model, BLIS-form fit, input defaults' betas."""
    from roofcal.tables import table

    rows = []
    for source, groups in metrics.get("heldout", {}).items():
        for group, m in groups.items():
            rows.append({
                "held out": f"{source} / {group}",
                "n": m.get("n"),
                "native MAPE %": m.get("native_mape", 0.0 if source == "distill" else None),
                "BLIS-form MAPE %": m.get("blis_mape"),
                "BLIS-form p90 %": m.get("blis_p90"),
                "BLIS-form bias %": m.get("blis_bias"),
                "input betas MAPE %": m.get("input_mape"),
            })
    cols = ["held out", "n", "native MAPE %", "BLIS-form MAPE %", "BLIS-form p90 %", "BLIS-form bias %",
            "input betas MAPE %"]
    note = "\n(distill: targets are the native model's predictions, so its error there is 0)"
    return table(rows, cols) + (note if "distill" in metrics.get("heldout", {}) else "")


def _print_form(form) -> None:
    from roofcal.blis.fit import BETA_NAMES

    print(metrics_table(form.metrics))
    print(f"hardware entry: {form.hardware}; deployments: "
          + ", ".join(f"{d.model} TP{d.tp}" for d in form.deployments))
    kept = set(form.provenance.get("beta_kept_from_defaults", []))
    for name, value in zip(BETA_NAMES, form.beta):
        print(f"  {name:36s} {value!r}" + ("   (kept from defaults: no data)" if name in kept else ""))
    print(f"alphas {list(form.alpha)}: {form.alpha_source}")


def cmd_check(a) -> int:
    from roofcal.blis.goldens import check_goldens

    report = check_goldens(a.goldens)
    print(f"{report.n_cases} cases, largest absolute difference {report.max_abs_diff_us} µs")
    if not report.ok:
        for cid, want, got in report.mismatches[:10]:
            print(f"  mismatch {cid}: BLIS {want} µs, roofcal {got} µs")
        print(f"{len(report.mismatches)} of {report.n_cases} cases differ")
        return 1
    return 0


def cmd_fit(a) -> None:
    from roofcal.blis.distill import fit_form
    from roofcal.blis.form import save_form

    t0 = time.time()
    form = fit_form(a.coeffs, a.defaults, a.hardware_config, a.hardware, _deployments(a), a.steps or (),
                    _settings(a), steps_gpu=a.gpu, stack=a.stack, kernels=a.kernels)
    save_form(form, a.out)
    _print_form(form)
    print(f"wrote {a.out} in {time.time() - t0:.1f} s")


def _blis_binary(a):
    """The BLIS binary the printed commands name: ``--blis``, else ``$ROOFCAL_BLIS``, else None
    (they say ``blis``); one named that is not an executable file is an error, before any work."""
    import os

    from roofcal.blis.run import BLIS_ENV, find_blis
    if getattr(a, "blis", None) or os.environ.get(BLIS_ENV):
        return find_blis(getattr(a, "blis", None))
    return None


def cmd_export_blis(a) -> None:
    from roofcal.blis.distill import export_blis

    t0 = time.time()
    a.blis = _blis_binary(a)
    if a.out_dir:
        return _export_per_deployment(a, t0)
    if a.experiments and a.out and not (a.in_place or a.per_run):
        return _export_global(a, t0)
    if a.per_run or a.experiments:
        raise RoofcalError("export blis: --for goes with --out-dir DIR (one defaults.yaml per deployment, or per "
                           "run with --per-run) or --out FILE (one for all the runs' deployments)")
    if not (a.out or a.in_place or a.flags):
        raise RoofcalError("export blis: give --out FILE, --in-place, --flags, or --out-dir DIR")
    result = export_blis(a.coeffs, a.defaults, a.out, a.in_place, _deployments(a), a.hardware_config,
                         a.hardware, _settings(a), stack=a.stack, kernels=a.kernels)
    if result.form.metrics:
        _print_form(result.form)
    if result.out is not None:
        print(f"wrote {result.out}" + (f" (backup {result.backup})" if result.backup else "")
              + f" in {time.time() - t0:.1f} s")
        print(f"  # {result.comment}")
    if a.flags:
        print(result.flags)


def _export_per_deployment(a, t0) -> None:
    """``export blis --out-dir DIR``: one defaults.yaml per deployment (per run with --per-run)."""
    from pathlib import Path

    from roofcal.blis.deployments import (defaults_paths, export_deployments, targets_for_deployments, usage,
                                          write_defaults)
    from roofcal.io import check_output_dir
    from roofcal.model import coeffs as coeff_io

    if a.out or a.in_place:
        raise RoofcalError("export blis: --out-dir writes one file per deployment; drop --out / --in-place")
    if a.hardware:
        raise RoofcalError("export blis: --out-dir uses the hardware entry of each run's GPU; drop --hardware")
    check_output_dir(a.out_dir, "folder of defaults files (--out-dir)")
    c = coeff_io.resolve_stack(coeff_io.load(a.coeffs), a.stack, required=True, kernels=a.kernels)
    if a.experiments:
        from roofcal.calibration.workload import export_targets
        from roofcal.resources import default_model_configs
        from roofcal.measurements.workload import read_experiments
        if _deployments(a):
            raise RoofcalError("export blis: give the deployments either by --for EXP or by --model/--tp, not both")
        folders = tuple(Path(p) for p in (a.model_configs or default_model_configs()))
        targets = export_targets(read_experiments(a.experiments), folders, per_run=a.per_run)
    else:
        if a.per_run:
            raise RoofcalError("export blis: --per-run needs the runs (--for EXP...)")
        deps = _deployments(a)
        if not deps:
            from roofcal.blis.fit import deployments_from_records
            recorded = c.fit.get("deployments")
            if not recorded:
                raise RoofcalError(f"{a.coeffs}: records no deployments (fit.deployments); give --for EXP... or --model NAME:TP")
            deps = deployments_from_records(recorded, f"{a.coeffs}: field 'fit.deployments'")
        targets = targets_for_deployments(deps)
    paths = defaults_paths([_stub(t) for t in targets], a.out_dir)
    for p in paths:
        if p.is_dir():
            raise RoofcalError(f"{p}: is a directory, not a file")
    exports = export_deployments(c, targets, a.defaults, a.hardware_config, _settings(a, True), a.seed_replay,
                                 a.clock)
    paths = write_defaults(exports, a.defaults, a.out_dir, a.coeffs)
    print(f"wrote {len(paths)} defaults file(s) into {a.out_dir} in {time.time() - t0:.1f} s; each goes with "
          "its deployment's blis command:")
    print(usage(exports, paths, a.hardware_config, a.defaults, a.blis))


def _export_global(a, t0) -> None:
    """``export blis --for EXP... --out FILE``: one defaults.yaml for every deployment of the runs
    (betas distilled over all of them, α0 request-weighted over their first-token delays) — the
    file ``workload validate --export global`` replays."""
    from pathlib import Path

    from roofcal.blis.deployments import export_deployment, usage, write_defaults_file
    from roofcal.calibration.workload import export_targets
    from roofcal.measurements.workload import read_experiments
    from roofcal.model import coeffs as coeff_io
    from roofcal.resources import default_model_configs

    if _deployments(a):
        raise RoofcalError("export blis: give the deployments either by --for EXP or by --model/--tp, not both")
    if a.hardware:
        raise RoofcalError("export blis: --for uses the hardware entry of the runs' GPU; drop --hardware")
    c = coeff_io.resolve_stack(coeff_io.load(a.coeffs), a.stack, required=True, kernels=a.kernels)
    folders = tuple(Path(p) for p in (a.model_configs or default_model_configs()))
    targets = export_targets(read_experiments(a.experiments), folders)
    ex = export_deployment(c, targets, a.defaults, a.hardware_config, _settings(a, True), a.seed_replay, a.clock)
    write_defaults_file(ex, a.defaults, a.out, a.coeffs)
    print(f"wrote {a.out} in {time.time() - t0:.1f} s; it goes with each deployment's blis command:")
    print(usage([ex], [a.out], a.hardware_config, a.defaults, a.blis))


def _stub(target):
    """A stand-in export for naming files before any fitting (defaults_paths needs only targets)."""
    from types import SimpleNamespace
    return SimpleNamespace(targets=(target,))


def cmd_export_hardware(a) -> None:
    import json

    from roofcal.blis.hardware_json import export_hardware

    result = export_hardware(a.gpu, a.coeffs, a.into, a.out, a.name)
    if result.out is None:
        print(result.text, end="")
    else:
        print(json.dumps({result.name: result.entry}, indent=1, ensure_ascii=False))
        print(f"wrote entry '{result.name}' to {result.out}" + (f" (backup {result.backup})" if result.backup else ""))


def _into_written(a):
    """``export hardware --into FILE`` rewrites FILE only without ``--out`` (else FILE is read)."""
    return None if a.out else a.into


def _fit_options(s, deployment_samples: bool = False) -> None:
    from types import SimpleNamespace
    from roofcal import resources
    from roofcal.blis import FIT_DEFAULTS
    from roofcal.calibration import WORKLOAD_DEFAULTS

    d = SimpleNamespace(**FIT_DEFAULTS)          # BlisFitSettings' defaults, without importing JAX

    s.add_argument("--model", action="append", help="model to distil for, at every --tp, or NAME:TP[,TP...] "
                   "(repeatable; default: the deployments of the runs the stack was calibrated on, else the "
                   "coefficient file's fit.deployments)")
    s.add_argument("--tp", action="append", type=int, help="TP degree to distil for (repeatable; with --model)")
    from roofcal.cli.main import add_parallel_options
    add_parallel_options(s)
    s.add_argument("--hardware-config", default=str(resources.BLIS_HARDWARE),
                   help="BLIS hardware_config.json (default: the bundled one)")
    s.add_argument("--hardware", help="its entry to fit for (default: the entry aliasing the coefficients' GPU)")
    s.add_argument("--samples", type=int, default=None,
                   help=f"distillation steps per deployment (default {d.samples}"
                        + (f"; {WORKLOAD_DEFAULTS['samples']} with --for or --out-dir, as workload validate"
                           if deployment_samples else "") + ")")
    s.add_argument("--seed", type=int, default=d.seed, help=f"seed of the sample and held-out split (default {d.seed})")
    s.add_argument("--holdout", type=float, default=d.holdout, help=f"held-out fraction (default {d.holdout})")
    s.add_argument("--iters", type=int, default=d.iters, help=f"L-BFGS iterations (default {d.iters})")
    s.add_argument("--stack", metavar="NAME",
                   help="serving stack to distil: a stack of the coefficient file (default: the file's own), "
                        "'none' for kernels only, or FILE:NAME to borrow one")
    from roofcal.cli.main import add_kernels_option
    add_kernels_option(s, "distil")


def register(sub) -> None:
    """Add ``blis check``, ``blis fit``, ``export blis`` and ``export hardware``."""
    from roofcal import resources

    blis = sub.add_parser("blis", help="BLIS trained-physics: check the basis against goldens, fit BLIS-form betas") \
        .add_subparsers(dest="blis_command", required=True)
    s = blis.add_parser("check", help="recompute a BLIS goldens file; exit 0 only if every case matches")
    s.add_argument("--goldens", default=str(resources.BLIS / "trained_physics_goldens.json"),
                   help="goldens JSON (default: the bundled BLIS goldens)")
    s.set_defaults(func=cmd_check)

    s = blis.add_parser("fit", help="fit BLIS-form betas (distillation and/or measured steps) to a roofcal-blis/1 file")
    s.add_argument("--coeffs", help="roofcal coefficient file to distil")
    s.add_argument("--steps", nargs="+", help="measured whole-step files (step JSONL, splitwise CSV) to fit as well")
    s.add_argument("--gpu", help="GPU of step JSONL rows that do not name one")
    s.add_argument("--defaults", default=str(resources.BLIS_DEFAULTS),
                   help="BLIS defaults.yaml: alphas kept, betas centre the prior (default: bundled)")
    _fit_options(s)
    s.add_argument("--out", required=True, help="BLIS-form file to write")
    s.set_defaults(func=cmd_fit, outputs=[("out", "file", "BLIS-form file (--out)")])

    export = sub.add_parser("export", help="export coefficients for other simulators") \
        .add_subparsers(dest="export_command", required=True)
    s = export.add_parser("blis", help="write BLIS-form betas into a BLIS defaults.yaml")
    s.add_argument("--coeffs", required=True, help="roofcal coefficient file (fitted here by distillation) "
                   "or BLIS-form file (from 'roofcal blis fit')")
    s.add_argument("--defaults", required=True, help="BLIS defaults.yaml to start from")
    s.add_argument("--out", help="defaults.yaml to write")
    s.add_argument("--in-place", action="store_true", help="overwrite --defaults, keeping a .bak backup")
    s.add_argument("--flags", action="store_true", help="print the equivalent 'blis run' coefficient flags")
    s.add_argument("--out-dir", metavar="DIR",
                   help="write one defaults.yaml per deployment into DIR (<model>-tp<T>.yaml): betas distilled for "
                        "it, alpha0 from its own first-token delay; prints which file goes with which blis command")
    s.add_argument("--for", dest="experiments", nargs="+", metavar="EXP",
                   help="the serving runs (inference-perf folders or recorded traces) whose deployments and "
                        "loads to export for: with --out-dir one file per deployment, with --out one file for "
                        "all of them (default: --model/--tp, at a nominal load)")
    s.add_argument("--per-run", action="store_true",
                   help="with --for: one file per run (the deployment at that run's load) instead of per deployment")
    s.add_argument("--model-configs", nargs="+", action="extend", metavar="DIR",
                   help="with --for: folders of <model>/config.json for the runs' models (default: the bundled "
                        "model_configs/, then ../shared/workload/model_configs if it exists)")
    s.add_argument("--replay-seed", dest="seed_replay", type=int, default=42,
                   help="with --for: seed of the runs' rebuilt schedules (default 42, as workload validate)")
    s.add_argument("--clock", choices=("sustained", "burst"), default="sustained",
                   help="with --out-dir or --for: the native model at the GPU's clock under the deployment's load "
                        "(sustained: each stage of its runs, or its limit steps without runs, at the clock its power "
                        "limit allows) or as the per-op tables were timed (burst); the plain --out distils at the "
                        "burst clock (default: sustained)")
    s.add_argument("--blis", metavar="PATH",
                   help="with --out-dir or --for: the BLIS binary the printed commands name (default: $ROOFCAL_BLIS; "
                        "neither: they say 'blis')")
    _fit_options(s, deployment_samples=True)
    s.set_defaults(func=cmd_export_blis, outputs=[("out", "file", "defaults file (--out)"),
                                                  ("out_dir", "dir", "folder of defaults files (--out-dir)")])

    s = export.add_parser("hardware", help="write a BLIS hardware_config.json entry for a GPU")
    s.add_argument("--gpu", required=True, help="roofcal GPU name, alias or datasheet path")
    s.add_argument("--coeffs", help="coefficient file for the MFUs (default: bundled coeffs/<gpu>.yaml)")
    s.add_argument("--into", help="hardware_config.json to merge into (written in place with a backup unless --out)")
    s.add_argument("--out", help="file to write (default: --into; neither: print the JSON)")
    s.add_argument("--name", help="entry name (default: the BLIS name aliasing the GPU, e.g. H100)")
    s.set_defaults(func=cmd_export_hardware, outputs=[("out", "file", "hardware config (--out)"),
                                                      (_into_written, "file", "hardware config (--into)")])

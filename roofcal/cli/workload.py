"""``roofcal workload trace|validate|calibrate|lomo``: serving runs as BLIS traces, replayed in BLIS
against measurement (:func:`roofcal.blis.validate.validate`), and the serving-stack calibration
with BLIS in the loop (:func:`roofcal.calibration.workload.calibrate_file`).

Examples::

    roofcal workload trace ../shared/workload/default_args --out traces/
    roofcal workload validate ../shared/workload/default_args --coeffs coeffs/h100_sxm.yaml --keep runs/
    roofcal workload validate EXP --coeffs coeffs/h100_sxm.yaml --export global
    roofcal workload validate ../shared/workload/default_args            # BLIS's own coefficients
    roofcal workload calibrate ../shared/workload/default_args --coeffs coeffs/h100_sxm.yaml

Each EXP is an experiment folder — an inference-perf run (``exp-config.yaml``, ``results/``) or a
recorded trace with its ``server.yaml`` — or a folder of them. Defaults: ``--defaults`` and
``--hardware-config`` are BLIS's own files bundled in ``data/blis/``; ``--model-configs`` searches
the project's ``model_configs/`` and then ``../shared/workload/model_configs`` when that folder
exists relative to the current directory; ``--blis`` falls back to ``$ROOFCAL_BLIS``.
"""

from __future__ import annotations

from pathlib import Path

from roofcal.resources import default_model_configs
#: how ``--coeffs`` is exported for BLIS (roofcal.calibration.workload.EXPORTS, without importing JAX)
EXPORTS = ("per-deployment", "per-run", "global")
EXPORT_HELP = ("per-deployment: one defaults.yaml per deployment, its betas distilled for it and alpha0 from "
               "its own first-token delay at its runs' loads (default); per-run: one per run (the deployment "
               "at that run's load); global: one defaults.yaml for all")


def settings_from_args(a, need_blis: bool = True):
    """:class:`~roofcal.blis.run.BlisSettings` from the parsed options (``blis`` None when not
    needed and not given)."""
    from roofcal.blis.run import BLIS_ENV, BlisSettings, find_blis
    from roofcal.errors import RoofcalError
    import os

    if a.workers < 1:
        raise RoofcalError(f"--workers must be ≥ 1, got {a.workers}")
    for name, most in (("samples", 1_000_000), ("refreshes", 100)):
        v = getattr(a, name, None)
        if v is not None and not 1 <= v <= most:
            raise RoofcalError(f"--{name} must be in 1 … {most}, got {v}")
    c = getattr(a, "first_token_cycles", None)
    if c is not None and not (0.0 <= c <= 10.0):
        raise RoofcalError(f"--first-token-cycles must be in [0, 10], got {c}")
    for folder in a.model_configs or ():
        if not Path(folder).is_dir():
            raise RoofcalError(f"{folder}: no such model-config folder (--model-configs)")
    if not a.timeout > 0:
        raise RoofcalError(f"--timeout must be positive, got {a.timeout}")
    for path, what in ((a.defaults, "BLIS defaults file (--defaults)"),
                       (a.hardware_config, "BLIS hardware config (--hardware-config)")):
        if not Path(path).is_file():
            raise RoofcalError(f"{path}: no such {what}")
    folders = tuple(Path(p) for p in (a.model_configs or default_model_configs()))
    blis = find_blis(a.blis) if (need_blis or a.blis or os.environ.get(BLIS_ENV)) else None
    return BlisSettings(blis=blis, defaults=Path(a.defaults), hardware_config=Path(a.hardware_config),
                        model_configs=folders, replay=a.replay, timeout_s=a.timeout, workers=a.workers,
                        kv_blocks=a.kv_blocks, seed=a.seed)


def exports_from_args(a, exps, settings, work: Path, kept: bool = True):
    """Export ``--coeffs`` (its ``--stack``) for the runs' deployments as ``--export`` says, write
    the defaults.yaml files into ``work/defaults/`` and return ({run: defaults path}, text saying
    which file goes with which blis command); (None, "") without ``--coeffs``. ``kept``: whether
    ``work`` stays after the command; when it does not, the text names no file in it (only the
    coefficients as flags over ``settings.defaults``)."""
    if not getattr(a, "coeffs", None):
        return None, ""
    from roofcal.blis.deployments import usage, write_defaults
    from roofcal.calibration.workload import export_for
    from roofcal.model import coeffs as coeff_io
    c = coeff_io.resolve_stack(coeff_io.load(a.coeffs), a.stack, required=True, kernels=a.kernels)
    exports = export_for(c, exps, settings, a.samples, export=a.export, clock=a.clock)
    paths = write_defaults(exports, settings.defaults, work / "defaults", a.coeffs)
    per_run = {}
    for e in exps:
        ex = next(i for i, x in enumerate(exports) if x.covers(e))
        per_run[e.name] = paths[ex]
    how = {"per-deployment": "one defaults.yaml per deployment", "per-run": "one defaults.yaml per run",
           "global": "one defaults.yaml for all deployments"}[a.export]
    text = (f"exported {a.coeffs} (stack {c.stack or 'none'}, kernels {c.kernels}) as {how}"
            + (f" into {(work / 'defaults').resolve()}" if kept else
               f" into a temporary folder ({KEEP_HINT} keeps it)")
            + f"; the same files: {export_command(a, paths if kept else None)}\n"
            + usage(exports, paths if kept else None, settings.hardware_config, settings.defaults, settings.blis))
    return per_run, text


#: where ``workload validate`` suggests keeping its runs' files (the README's folder)
KEEP_HINT = "--keep runs/"


def export_command(a, written=None) -> str:
    """The ``roofcal export blis`` command that writes the files ``workload validate`` replays
    with these options (same coefficients, stack, kernels, defaults, runs, samples and seed), as
    it runs: into the folder (``--out``: the file) of ``written``, the files validate wrote and
    keeps, or, where validate keeps none, into ``blis/`` (``--out blis.yaml``) as the README's
    export."""
    import shlex
    from roofcal.calibration import WORKLOAD_DEFAULTS
    from roofcal.resources import BLIS_DEFAULTS, BLIS_HARDWARE
    args = ["roofcal", "export", "blis", "--coeffs", a.coeffs, "--defaults", str(a.defaults)]
    if a.stack:
        args += ["--stack", a.stack]
    if a.kernels:
        args += ["--kernels", a.kernels]
    if Path(a.hardware_config).resolve() != BLIS_HARDWARE.resolve():
        args += ["--hardware-config", str(a.hardware_config)]
    if a.model_configs:
        args += ["--model-configs", *map(str, a.model_configs)]
    if a.samples != WORKLOAD_DEFAULTS["samples"]:
        args += ["--samples", str(a.samples)]
    if getattr(a, "clock", "sustained") != "sustained":
        args += ["--clock", a.clock]
    if a.seed != 42:
        args += ["--replay-seed", str(a.seed)]
    args += ["--for", *map(str, a.experiments)]
    folder = str(Path(written[0]).resolve().parent) if written else "blis/"
    args += {"per-deployment": ["--out-dir", folder], "per-run": ["--out-dir", folder, "--per-run"],
             "global": ["--out", str(Path(written[0]).resolve()) if written else "blis.yaml"]}[a.export]
    return shlex.join(args)


def cmd_trace(a) -> None:
    from roofcal.blis.run import replay_args
    from roofcal.blis.trace import data_text, header_text, trace_paths
    from roofcal.errors import RoofcalError
    from roofcal.io import check_output_dir
    from roofcal.measurements.workload import read_experiments
    import shlex

    check_output_dir(a.out, "trace folder (--out)")
    exps = read_experiments(a.experiments)
    settings = settings_from_args(a, need_blis=False)
    out = Path(a.out)
    for e in exps:
        head, data = trace_paths(out / e.name)
        for p in (head, data):
            if p.is_dir():
                raise RoofcalError(f"{p}: is a directory, not a file (trace output)")
    from roofcal.io import write_files_atomic
    files = {}
    for e in exps:
        head, data = trace_paths(out / e.name)
        files[head] = header_text(e, settings.seed)
        files[data] = data_text(e, settings.seed)
    write_files_atomic(files)
    print(f"wrote {len(exps)} trace(s) into {out} (seed {settings.seed})")
    for e in exps:
        req = e.requests(settings.seed)
        print(f"{e.name}: {len(req)} requests over {req.send_us.max() / 1e6:.0f} s, "
              f"{len(set(req.prefix_group.tolist()) - {''})} prefix groups")
        if settings.blis is not None:
            args, blocks, source = replay_args(e, settings, settings.defaults, str((out / e.name).resolve()))
            print("  " + shlex.join(args) + f"   # KV blocks: {source}")
    if settings.blis is None:
        print("(give --blis with the BLIS binary's path, or set ROOFCAL_BLIS to it, to print each run's blis "
              "replay command)")


def _print_commands(v, keep) -> None:
    """Each run's BLIS command as run, in its kept folder (``--keep``), where its trace and
    defaults file stay; without ``--keep`` those files are gone, so no command is printed."""
    import shlex
    if not keep:
        print(f"\nBLIS command per run: rerun with {KEEP_HINT} to keep the files these commands need (each run's "
              "trace and defaults.yaml); 'roofcal workload trace' writes the traces and 'roofcal export blis' "
              "the defaults files")
        return
    print(f"\nBLIS command per run (in {Path(keep).resolve()}/<run>/, where its files are):")
    for r in v.results:
        print(f"  {r.experiment}: cd {shlex.quote(str((Path(keep) / r.experiment).resolve()))} && {r.command}")


def cmd_validate(a) -> None:
    import shutil
    import tempfile
    from roofcal.blis.validate import validate, validation_text, write_validation_csv
    from roofcal.io import check_output, check_output_dir
    from roofcal.measurements.workload import read_experiments

    if a.out:
        check_output(a.out, "validation CSV (--out)")
    if a.keep:
        check_output_dir(a.keep, "folder of kept runs (--keep)")
    exps = read_experiments(a.experiments)
    settings = settings_from_args(a)
    work = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="roofcal-validate-"))
    try:
        defaults, text = exports_from_args(a, exps, settings, work, kept=bool(a.keep))
        if text:
            print(text)
        v = validate(exps, settings, progress=True, keep=a.keep, defaults=defaults)
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(validation_text(v))
    if a.coeffs:
        _print_saturation(a, exps, settings)
    _print_commands(v, a.keep)
    if a.out:
        write_validation_csv(v, a.out)
        print(f"wrote {a.out}")


def _print_saturation(a, exps, settings) -> None:
    """Each run's offered rate next to the rate its deployment sustains (the native model)."""
    from roofcal.calibration.workload import saturation_rows
    from roofcal.model import coeffs as coeff_io
    from roofcal.tables import table
    c = coeff_io.resolve_stack(coeff_io.load(a.coeffs), a.stack, required=True, kernels=a.kernels)
    rows = saturation_rows(c, exps, settings.model_configs, settings.seed, a.clock)
    print("\nWhere each deployment saturates for its run's requests (steady state of the native model, "
          f"busiest stage, {a.clock} clock; roofcal workload saturation):\n")
    cols = ["experiment", "offered req/s", "sustains req/s", "limit", "predicted overload", "cycle ms", "clock",
            "measured step ms", "measured cadence allows req/s", "measured step allows req/s"]

    def shown(v):
        return "–" if v is None else v
    print(table([{"experiment": r["experiment"] + (" (overload)" if r["measured_overload"] else ""),
                  "offered req/s": r["offered_rate"], "sustains req/s": r["saturation_rate"],
                  "limit": r["limit"], "predicted overload": "yes" if r["predicted_overload"] else "no",
                  "cycle ms": r["cycle_ms"], "clock": r["clock"], "measured step ms": shown(r["step_ms"]),
                  "measured cadence allows req/s": shown(r["cadence_rate"]),
                  "measured step allows req/s": shown(r["step_rate"])}
                 for r in rows], cols))
    if any(r["cadence_rate"] is not None for r in rows):
        print("(cycle: the predicted step at saturation. An overloaded run's running requests at its measured "
              "ITL (cadence) or at its median gap between tokens (step, without the stalls of preempted "
              "requests) instead of the predicted cycle; below 'sustains', the simulated server is faster at "
              "full load than the real one)")


def cmd_saturation(a) -> None:
    from roofcal.errors import RoofcalError
    from roofcal.model import coeffs as coeff_io
    from roofcal.model.serving import Load, saturation
    from roofcal.physics.capacity import capacity
    from roofcal.physics.config import check_tp, load_model
    from roofcal.physics.hardware import load_gpu
    for name in ("prompt", "output", "max_num_seqs", "max_num_batched_tokens"):
        if getattr(a, name) < 1:
            raise RoofcalError(f"--{name.replace('_', '-')} must be ≥ 1, got {getattr(a, name)}")
    if not 0 <= a.cached < a.prompt:
        raise RoofcalError(f"--cached must be in [0, --prompt), got {a.cached}")
    c = coeff_io.resolve_stack(coeff_io.load(a.coeffs), a.stack, required=True, kernels=a.kernels)
    spec, gpu = load_model(a.model), load_gpu(a.gpu or c.gpu)
    c.check_gpu(gpu, where="--gpu")
    check_tp(spec, a.tp)
    from roofcal.cli.main import parallel_of
    from roofcal.physics.config import served
    par = parallel_of(a)
    spec = served(spec, par)
    # a data-parallel deployment's steady state is all its ranks' (each with vLLM's limits)
    r = par.dp
    kv = r * (a.kv_blocks or capacity(spec, gpu, a.tp, max_num_batched_tokens=a.max_num_batched_tokens,
                                      max_num_seqs=a.max_num_seqs).kv_blocks)
    load = Load(rate=1.0, duration=1.0, prompt=float(a.prompt), cached=float(a.cached), output=float(a.output),
                max_seqs=r * a.max_num_seqs, budget=r * a.max_num_batched_tokens)
    from roofcal.model.operating import power_of
    s = saturation(c.params, spec, gpu, a.tp, load, kv, power=power_of(c, gpu) if a.clock == "sustained" else None)
    layout = par.title(a.tp)
    per_gpu = "" if r == 1 else f" ({s.rate / (r * a.tp):.3f} per GPU)"
    print(f"{spec.name} {layout} on {gpu.name} (stack {c.stack}), {a.prompt}-token prompts ({a.cached} cached), "
          f"{a.output} output tokens: sustains {s.rate:.2f} requests/s{per_gpu}; limited by {s.limit} "
          f"({s.running:.0f} running, {s.prefills:.2f} prompt chunks per step, cycle {s.cycle_us / 1000:.1f} ms; "
          f"KV blocks {kv:,}{'' if r == 1 else ' over the ranks'}: {s.kv_limit:.0f} requests fit)")
    print(f"clock: {s.operating.text() if a.clock == 'sustained' else 'burst (as the per-op tables were timed)'}")


def cmd_calibrate(a) -> None:
    from roofcal.calibration.workload import WorkloadSettings, calibrate_file
    from roofcal.io import check_output
    from roofcal.measurements.workload import read_experiments

    out = a.out or a.coeffs
    check_output(out, "coefficient file (--out)")
    exps = read_experiments(a.experiments)
    settings = settings_from_args(a)
    ws = WorkloadSettings(refreshes=a.refreshes, samples=a.samples, first_token_cycles=a.first_token_cycles,
                          export=a.export, clock=a.clock)
    res = calibrate_file(a.coeffs, exps, settings, ws, out, name=a.name, holdout=a.holdout, kernels=a.kernels)
    print(res.text)
    print(f"wrote stack '{a.name}' into {out} in {res.seconds:.0f} s")
    if not a.out:                          # in place: say so (with --out, roofcal.cli.main says it)
        import sys
        from roofcal.cli.main import overwrote
        print(overwrote(out, "coefficient file, in place: no --out"), file=sys.stderr)


def cmd_lomo(a) -> None:
    from roofcal.calibration.workload import WorkloadSettings, leave_one_model_out
    from roofcal.io import check_output, write_csv_atomic
    from roofcal.measurements.workload import read_experiments
    from roofcal.tables import table

    if a.out:
        check_output(a.out, "held-out table (--out)")
    exps = read_experiments(a.experiments)
    settings = settings_from_args(a)
    held, m, within, reports = leave_one_model_out(
        a.coeffs, exps, settings, WorkloadSettings(refreshes=a.refreshes, samples=a.samples,
                                                   first_token_cycles=a.first_token_cycles, export=a.export,
                                                   clock=a.clock),
        kernels=a.kernels)
    cols = ["experiment", "overload"] + [f"err_{k}_pct" for k in ("e2e", "ttft", "itl")]
    print(table(held.to_dict("records"), cols, floats="{:+.1f}"))
    n = int((~held["overload"].astype(bool)).sum())
    print(f"held-out MAPE over {n} runs: E2E {m['e2e']:.1f} %, TTFT {m['ttft']:.1f} %, ITL {m['itl']:.1f} %; "
          f"all three within 10 % on {within} of {n}  ({settings.description}; "
          f"{sum(r.seconds for r in reports):.0f} s)")
    if a.out:
        write_csv_atomic(held, a.out)
        print(f"wrote {a.out}")


def _replay_options(s, experiments: bool = True, trace: bool = False) -> None:
    """The options of commands that replay runs in BLIS (``trace``: of ``workload trace``, which
    writes traces and prints the commands, without --replay or --coeffs)."""
    from roofcal.blis import REPLAYS
    from roofcal.resources import BLIS_DEFAULTS, BLIS_HARDWARE
    if experiments:
        s.add_argument("experiments", nargs="+", metavar="EXP",
                       help="experiment folder (an inference-perf run, or a recorded trace with its server.yaml) "
                            "or a folder of them")
    s.add_argument("--blis", metavar="PATH", help="BLIS binary (default: $ROOFCAL_BLIS)")
    s.add_argument("--defaults", default=str(BLIS_DEFAULTS), metavar="FILE",
                   help=("BLIS defaults.yaml the printed blis replay commands name" if trace else
                         "BLIS defaults.yaml, whose trained_physics_coefficients are used unless --coeffs")
                        + " (default: BLIS's own, bundled)")
    if trace:
        s.set_defaults(replay="trace")
    else:
        s.add_argument("--replay", choices=REPLAYS, default="trace",
                       help="trace: each run's faithful TraceV2 through blis replay — open-loop sends as the "
                            "client scheduled them, the prompt pool as prefix groups, generated tokens (default); "
                            "expansion: BLIS's own closed-loop inference_perf expansion through blis run (to "
                            "compare)")
    s.add_argument("--seed", type=int, default=42, help="seed of the rebuilt schedules and BLIS (default 42)")
    s.add_argument("--model-configs", nargs="+", action="extend", metavar="DIR",
                   help="folders of <model>/config.json, searched in order (default: the bundled "
                        "model_configs/, then ../shared/workload/model_configs if it exists)")
    s.add_argument("--hardware-config", default=str(BLIS_HARDWARE), metavar="FILE",
                   help="BLIS hardware_config.json (default: BLIS's own, bundled)")
    s.add_argument("--kv-blocks", choices=("blis", "capacity"), default="blis",
                   help="GPU KV blocks where neither the run nor vLLM's log gives them: BLIS's auto value / TP "
                        "(default, as BLIS's validation does) or 'capacity' (roofcal capacity, vLLM's rule)")
    s.add_argument("--workers", type=int, default=2, help="BLIS processes at once (default 2)")
    s.add_argument("--timeout", type=float, default=300.0, help="seconds per BLIS run (default 300)")


#: ``--clock`` choices (roofcal.model.operating.CLOCKS, without importing JAX)
CLOCKS = ("sustained", "burst")
CLOCK_HELP = ("the GPU's clock under load: sustained — each load at the SM clock its power limit allows "
              "(compute-bound time slower once a busy stream reaches the limit; roofcal/physics/power.py); "
              "burst — as the per-op tables were timed, at the boost clock (default: sustained)")


def _clock_option(s) -> None:
    s.add_argument("--clock", choices=CLOCKS, default="sustained", help=CLOCK_HELP)


def _calibration_options(s) -> None:
    from roofcal.cli.main import add_kernels_option
    from types import SimpleNamespace
    from roofcal.calibration import WORKLOAD_DEFAULTS
    d = SimpleNamespace(**WORKLOAD_DEFAULTS)     # WorkloadSettings' defaults, without importing JAX
    _replay_options(s)
    s.add_argument("--coeffs", required=True, metavar="FILE", help="coefficient file (its kernel corrections are kept)")
    add_kernels_option(s, "calibrate the stack with (recorded in it)")
    s.add_argument("--refreshes", type=int, default=d.refreshes,
                   help=f"BLIS replays of the runs per calibration (default {d.refreshes})")
    s.add_argument("--samples", type=int, default=d.samples,
                   help=f"distillation steps per deployment (default {d.samples})")
    s.add_argument("--first-token-cycles", type=float, default=d.first_token_cycles, metavar="C",
                   help="cycles between a step and its tokens reaching the client (vLLM processes "
                        "a step's outputs during the next step); each deployment's alpha0 takes C x its "
                        f"steady-state cycle (default {d.first_token_cycles:g}; 0: one alpha0 for all)")
    s.add_argument("--export", choices=EXPORTS, default="per-deployment",
                   help="how BLIS gets the stack in every replay — " + EXPORT_HELP)
    _clock_option(s)


def register(sub) -> None:
    """Add ``workload`` (trace, validate, saturation, calibrate, lomo) to the ``roofcal`` subcommands."""
    from roofcal.cli.main import add_kernels_option
    from roofcal.calibration import WORKLOAD_DEFAULTS
    w = sub.add_parser("workload", help="serving runs as BLIS traces, replayed in BLIS; serving-stack calibration")
    ws = w.add_subparsers(dest="workload_command", required=True)
    s = ws.add_parser("trace", help="write each run as a TraceV2 that blis replay replays as the client sent it",
                      description="Write each run as a TraceV2 (<out>/<run>.yaml + .csv): an inference-perf run's "
                                  "schedule rebuilt from what it ran (open-loop sends, the prompt pool as prefix "
                                  "groups, generated tokens, the client's timeout), or a recorded trace from its "
                                  "first send; prints the blis replay command of each (with --blis).")
    _replay_options(s, trace=True)
    s.add_argument("--out", required=True, metavar="DIR", help="folder to write the traces into")
    s.set_defaults(func=cmd_trace, outputs=[("out", "dir", "trace folder (--out)")])

    s = ws.add_parser("validate", help="replay experiments in BLIS; simulated vs measured E2E, TTFT, ITL",
                      description="Replay measured vLLM serving runs in BLIS and compare simulated "
                                  "with measured mean E2E, TTFT and ITL (MAPE over the runs that are "
                                  "not overloaded, and how many have all three within 10 %).")
    _replay_options(s)
    s.add_argument("--coeffs", metavar="FILE",
                   help="roofcal coefficient file to export (as --export says) and replay instead of --defaults' coefficients")
    s.add_argument("--stack", metavar="NAME", help="its serving stack (default: the file's own; 'none' = kernels only)")
    add_kernels_option(s, "export with")
    s.add_argument("--export", choices=EXPORTS, default="per-deployment", help=EXPORT_HELP)
    s.add_argument("--samples", type=int, default=WORKLOAD_DEFAULTS["samples"],
                   help=f"distillation steps per deployment (default {WORKLOAD_DEFAULTS['samples']})")
    _clock_option(s)
    s.add_argument("--out", metavar="FILE", help="write the per-(experiment, scope) table as CSV")
    s.add_argument("--keep", metavar="DIR", help="keep each run's trace, defaults.yaml, metrics and log in DIR")
    s.set_defaults(func=cmd_validate, outputs=[("out", "file", "validation CSV (--out)"),
                                               ("keep", "dir", "folder of kept runs (--keep)")])

    s = ws.add_parser("saturation", help="the largest request rate a deployment sustains for a workload",
                      description="The largest request rate the steady state of the native model sustains for "
                                  "a workload on a deployment, and what limits it (max_num_seqs, the KV cache or "
                                  "the token budget).")
    s.add_argument("--coeffs", required=True, metavar="FILE", help="coefficient file (its serving stack)")
    s.add_argument("--stack", metavar="NAME", help="its serving stack (default: the file's own)")
    add_kernels_option(s)
    s.add_argument("--model", required=True, help="bundled model name or config.json")
    s.add_argument("--gpu", help="GPU (default: the coefficient file's)")
    s.add_argument("--tp", type=int, required=True, help="tensor-parallel degree")
    from roofcal.cli.main import add_parallel_options
    add_parallel_options(s)
    s.add_argument("--prompt", type=int, required=True, help="prompt tokens per request")
    s.add_argument("--cached", type=int, default=0, help="of them in the prefix cache (default 0)")
    s.add_argument("--output", type=int, required=True, help="generated tokens per request")
    s.add_argument("--max-num-seqs", type=int, default=256, help="vLLM's max_num_seqs (default 256; per data-parallel rank)")
    s.add_argument("--max-num-batched-tokens", type=int, default=8192,
                   help="vLLM's token budget per step (default 8192; per data-parallel rank)")
    s.add_argument("--kv-blocks", type=int,
                   help="GPU KV blocks (default: roofcal capacity, vLLM's rule; per data-parallel rank)")
    _clock_option(s)
    s.set_defaults(func=cmd_saturation)

    s = ws.add_parser("calibrate", help="fit a serving stack and BLIS's alphas to serving runs, BLIS in the loop",
                      description="Fit the serving-stack layer of a coefficient file (CPU work, launch gaps, "
                                  "CPU-GPU overlap, BLIS's alphas) so that BLIS, fed each deployment's export, "
                                  "reproduces the measured mean E2E, TTFT and ITL.")
    _calibration_options(s)
    s.add_argument("--out", metavar="FILE", help="coefficient file to write (default: --coeffs, in place)")
    s.add_argument("--name", default="vllm", help="name of the stack (default vllm); it becomes the default stack")
    s.add_argument("--holdout", metavar="MODEL", action="append",
                   help="leave a model's runs out of the fit (HF id or its last part; repeatable); they are "
                        "still replayed and reported")
    s.set_defaults(func=cmd_calibrate, outputs=[("out", "file", "coefficient file (--out)")])

    s = ws.add_parser("lomo", help="leave-one-model-out benchmark of the workload calibration",
                      description="For each model: calibrate the serving stack on the other models' runs, "
                                  "then replay the held-out model's runs in BLIS with its deployment's export; "
                                  "prints signed errors, the held-out MAPE and how many runs have all three within 10 %.")
    _calibration_options(s)
    s.add_argument("--out", metavar="FILE", help="write the held-out rows as CSV")
    s.set_defaults(func=cmd_lomo, outputs=[("out", "file", "held-out table (--out)")])

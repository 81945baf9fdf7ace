"""The ``roofcal`` command line: every command is a thin wrapper over a documented function.

Errors in the input, and files that cannot be read or written, print one line, ``roofcal:
error: …``, and exit with status 2; nothing is written. A check that runs but fails (``roofcal blis check``) exits with status 1.
"""

from __future__ import annotations

import argparse
import sys
import warnings

from roofcal.errors import RoofcalError, RoofcalWarning


def enable_compilation_cache() -> None:
    """Keep XLA's compiled programs on disk (``$ROOFCAL_CACHE``, default ``~/.cache/roofcal``):
    JAX's cache in ``jax/``, :mod:`roofcal.programs`' in ``programs/``, so repeated fits skip
    compilation (outputs are identical either way). ``ROOFCAL_CACHE=off`` disables both;
    ``ROOFCAL_PROGRAMS=off`` the second alone (keyed by roofcal's source, it compiles its programs
    afresh after every edit of roofcal, where JAX's cache still holds those that did not change)."""
    import os
    where = os.environ.get("ROOFCAL_CACHE", os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "roofcal"))
    if where.lower() in ("off", "0", "none", ""):
        return
    try:
        os.makedirs(where, exist_ok=True)
    except OSError:
        return                                 # read-only home: run without the cache
    # every program, however quick to compile: a few-shot fit compiles ≈ 35 programs of
    # 10–50 ms each, ≈ 1.3 s of its 7 s, which a cache under 0.2 s never kept
    from roofcal import programs                # whole programs, found without tracing
    if os.environ.get("ROOFCAL_PROGRAMS", "").lower() not in ("off", "0", "none"):
        programs.keep_in(os.path.join(where, "programs"))
    settings = {"jax_compilation_cache_dir": os.path.join(where, "jax"),
                "jax_persistent_cache_min_compile_time_secs": 0.0}
    if "jax" in sys.modules:                   # already imported (roofcal called in-process)
        import jax
        for k, v in settings.items():
            jax.config.update(k, v)
    else:                                      # read by JAX when (and if) a command imports it
        for k, v in settings.items():
            os.environ.setdefault(k.upper(), str(v))


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """``-h`` shows every option's default: `` (default: X)`` after its help, unless the help
    already says what the default is, or there is none to show (no value, a flag that is off)."""

    def _get_help_string(self, action) -> str:
        text = action.help or ""
        default = action.default
        if (default in (None, False, argparse.SUPPRESS) or "default" in text.lower()
                or not action.option_strings or isinstance(default, (list, tuple)) and not default):
            return text
        shown = ", ".join(map(str, default)) if isinstance(default, (list, tuple)) else default
        return f"{text} (default: {str(shown).replace('%', '%%')})"


class Parser(argparse.ArgumentParser):
    """roofcal's parsers, the subcommands' too: ``-h`` shows defaults (:class:`DefaultsHelpFormatter`)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", DefaultsHelpFormatter)
        super().__init__(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="roofcal", description=__doc__.splitlines()[0])
    from roofcal import __version__
    p.add_argument("--version", action="version", version=f"roofcal {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    _register_plugins(sub)
    return p


#: one module per command group, in the order ``roofcal -h`` lists them; each defines
#: ``register(subparsers)``
COMMAND_MODULES = ("roofcal.cli.predict", "roofcal.cli.fit", "roofcal.cli.bench", "roofcal.cli.blis",
                   "roofcal.cli.residuals", "roofcal.cli.gpu", "roofcal.cli.workload", "roofcal.cli.capacity",
                   "roofcal.cli.traces", "roofcal.cli.power", "roofcal.cli.probe")


def add_kernels_option(s, what: str = "predict with") -> None:
    """The ``--kernels NAME`` option: which kernel set of the coefficient file to use."""
    s.add_argument("--kernels", metavar="SET",
                   help=f"kernel set of the coefficient file to {what} (e.g. vllm-0.14.0; default: "
                        "the one its serving stack was calibrated with, else the file's default, the "
                        "newest)")


def add_parallel_options(s) -> None:
    """A deployment's layout beyond TP, as vLLM and BLIS name it (:class:`roofcal.physics.config.Parallel`)."""
    from roofcal.physics.config import MOE_COMM_BACKENDS
    s.add_argument("--dp", type=int, default=1, metavar="N",
                   help="data-parallel ranks of TP GPUs each (vLLM --data-parallel-size, BLIS --dp; "
                        "default 1): a step is then the whole deployment's batch, timed on its busiest rank")
    s.add_argument("--enable-expert-parallel", action="store_true",
                   help="MoE experts split whole over all dp x TP GPUs (vLLM's and BLIS's flag)")
    s.add_argument("--moe-comm-backend", default="allgather_reducescatter", metavar="NAME",
                   help="how MoE layers move tokens between ranks (vLLM VLLM_ALL2ALL_BACKEND, BLIS "
                        f"--moe-comm-backend): {', '.join(MOE_COMM_BACKENDS)} (default allgather_reducescatter)")


def parallel_of(a):
    """The :class:`roofcal.physics.config.Parallel` of :func:`add_parallel_options`' options."""
    from roofcal.physics.config import Parallel
    return Parallel(a.dp, a.enable_expert_parallel, a.moe_comm_backend)


def _register_plugins(sub) -> None:
    import importlib
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)


def os_error_line(e: OSError) -> str:
    """``<file>: <reason>`` of an OS error (both files for a rename), on one line."""
    where = e.filename if e.filename is not None else ""
    if getattr(e, "filename2", None):
        where = f"{where} -> {e.filename2}"
    what = e.strerror or str(e)
    return f"{where}: {what}" if where else what


def check_outputs(args) -> list[str]:
    """Refuse, before any work, every output a command declared that cannot be written, two
    outputs that are one file, and an output that would overwrite an input. Returns the notices
    :func:`main` prints on stderr once the command has succeeded, one line per output file that
    existed before it (``roofcal: overwrote FILE (the WHAT; it existed before this run)``), so
    that no file the run did not make is replaced silently — and a bad input still gets its one
    line alone.

    A command declares ``set_defaults(outputs=[(dest, "file" | "dir", what)], inputs=[dest])``;
    an output's ``dest`` may also be a function of the arguments (a path derived from another
    option, or None when the command writes no such file), and ``inputs`` name the options
    holding input files (one path or a list).
    """
    from pathlib import Path

    from roofcal.io import check_output, check_output_dir
    seen: dict = {}
    for dest, kind, what in getattr(args, "outputs", ()):
        value = dest(args) if callable(dest) else getattr(args, dest, None)
        if not value:
            continue
        path = Path(value)
        (check_output_dir if kind == "dir" else check_output)(path, what)
        key = path.resolve()
        if key in seen:
            raise RoofcalError(f"{path}: given as both the {seen[key]} and the {what}")
        seen[key] = what
    for dest in getattr(args, "inputs", ()):
        given = getattr(args, dest, None) or []
        for value in [given] if isinstance(given, (str, Path)) else given:
            what = seen.get(Path(value).resolve())
            if what is not None:
                raise RoofcalError(f"{value}: the {what} would overwrite an input file")
    return [overwrote(value, what) for dest, kind, what in getattr(args, "outputs", ())
            for value in [dest(args) if callable(dest) else getattr(args, dest, None)]
            if value and kind == "file" and Path(value).is_file()]


def overwrote(path, what: str) -> str:
    """The notice of an output file that existed before the command and was replaced by it."""
    return f"roofcal: overwrote {path} (the {what}; it existed before this run)"


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings as one line each: ``roofcal: warning: <message>`` (:class:`RoofcalWarning`), or
    Python's own form for anything else."""
    if issubclass(category, RoofcalWarning):
        print(f"roofcal: warning: {message}", file=file or sys.stderr)
    else:
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


def jax_defaults(environ=None) -> None:
    """Run JAX on the CPU unless ``$JAX_PLATFORMS`` names a backend (``JAX_PLATFORMS=cuda``: the
    GPU), and XLA's GPU programs bit-reproducible unless ``$XLA_FLAGS`` says otherwise.

    roofcal's programs are chains of small steps (an L-BFGS iteration is ≈ 0.3 ms of work), which a
    GPU runs no faster than its host: on an H200 machine with 16 cores ``roofcal fit`` took 39–41 s
    warm and 78 s cold on the GPU, 20–21 s and 27 s on the CPU. There, two GPU fits of one input
    wrote different files; with ``--xla_gpu_deterministic_ops=true`` they wrote the same (and took
    32 s warm, 57 s cold). The CPU ignores that flag (same bytes). Measured: docs/limits.md#fit-speed.
    JAX reads both variables when it starts, so :func:`main` sets them only in a process
    that has not imported JAX yet.

    ``environ``: the mapping to set (default ``os.environ``)."""
    import os
    env = os.environ if environ is None else environ
    env.setdefault("JAX_PLATFORMS", "cpu")
    flags = env.get("XLA_FLAGS", "")
    if "xla_gpu_deterministic_ops" not in flags:
        env["XLA_FLAGS"] = f"{flags} --xla_gpu_deterministic_ops=true".strip()


def command_name(args) -> str:
    """The command and its subcommands, joined by ``-`` (``roofcal export blis``: ``export-blis``)."""
    subs = [v for k, v in sorted(vars(args).items()) if k.endswith("_command") and isinstance(v, str)]
    return "-".join([args.command, *subs])


def main(argv=None) -> int:
    if "jax" not in sys.modules:
        jax_defaults()
    enable_compilation_cache()
    warnings.showwarning = _show_warning
    parser = build_parser()
    args = parser.parse_args(argv)
    from roofcal import programs
    command = command_name(args)
    programs.prefetch(command)             # the programs its last run read, loaded ahead
    try:
        notices = check_outputs(args)
        code = args.func(args)             # a handler may return a non-zero exit status
        if not code:
            programs.remember(command)
            for line in notices:
                print(line, file=sys.stderr)
    except RoofcalError as e:
        print(f"roofcal: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:                   # a file that cannot be read or written: one line, no traceback
        print(f"roofcal: error: {os_error_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("roofcal: interrupted", file=sys.stderr)
        return 130
    return code if isinstance(code, int) else 0


#: thresholds of Python's cycle collector in a ``roofcal`` process (the interpreter's: 700, 10, 10)
BATCH_GC_THRESHOLDS = (100_000, 50, 1000)


def batch_gc() -> None:
    """Tune Python's cycle collector for a command that runs once and ends: with the default
    thresholds, a ``roofcal fit`` ran 8 full collections of the whole heap (JAX's, pandas'
    and the fit's objects), 0.94 s (≈ 0.12 s each, every thread stopped behind the one that
    collects), and 1,254 young ones, 0.15 s; with :data:`BATCH_GC_THRESHOLDS` a young
    collection runs every 100,000 net allocations (7 a fit, 0.14 s) and a full one practically
    never, the peak memory the same. For the process entry points only (:func:`run`,
    ``python -m roofcal.cli``): a program that calls :func:`main` keeps its own settings."""
    import gc
    gc.set_threshold(*BATCH_GC_THRESHOLDS)


def run() -> None:
    """The ``roofcal`` executable: :func:`main`, then the process ends at once with its status.
    Every output file is written and closed by then (atomically), and standard output and error
    are flushed here; what is skipped is the teardown of JAX's backends and caches and of the
    interpreter's objects, ≈ 0.45 s at the end of every command (measured on ``roofcal fit``:
    JAX's exit handler 0.2 s, the interpreter's finalisation 0.3 s). ``python -m roofcal.cli``
    runs :func:`main` and exits normally (for profilers and other exit handlers)."""
    import os
    batch_gc()
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    batch_gc()
    sys.exit(main())

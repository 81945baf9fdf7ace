"""Compiled XLA programs kept whole on disk, found again without tracing.

JAX's persistent cache (:func:`roofcal.cli.main.enable_compilation_cache`) keys a program by its
lowered text, so every process still traces and lowers a program before the cache hands back its
code: in a warm ``roofcal fit``, 59 programs took 2.3 s of CPU that way (the 8 L-BFGS programs 1.1
s) and 1.2 s to load (docs/limits.md#fit-speed). A function decorated with :func:`stored` is
keyed instead by what its trace depends on — roofcal's source, the versions of Python, JAX,
jaxlib, optax and NumPy, JAX's settings, ``$XLA_FLAGS``, the backend and the host's CPU, the
function, its static arguments, and the structure, shapes and dtypes of the others — and its
executable is kept in the folder :func:`keep_in` names (``jax.experimental.serialize_executable``).
What runs is the code XLA compiled (the same results to the bit); tracing and lowering are skipped.

Off until :func:`keep_in` names a folder (the CLI: ``$ROOFCAL_CACHE/programs``, off with
``ROOFCAL_CACHE=off``). A key without a file compiles its program afresh — under a new name, so
not from JAX's cache, whose executables serialize without their code, nor into it, where no later
process would ask for that name (:func:`_not_in_jax_cache`) — and writes it atomically.
A call inside a trace, a static argument or pytree node this module cannot key (a function from
outside roofcal, whose source is not in the key), a program that does not serialize and a file
that does not load fall back to ``jax.jit``: slower, never wrong. What a trace records on the
side does not happen when the program comes from the store: ``domain.step_numeric`` records its
column labels while traced, so ``domain.step_flags`` traces it alone for them (no compile) when
``predict.step_outputs`` came from the store. A call costs ≈ 36 µs against ``jax.jit``'s 9 µs (its
key is found in Python): for programs called hundreds of times a run, not in tight loops. The
folder is safe to delete; it keeps the programs of the last few roofcal sources (a changed file is
a new key). Each command lists the programs it read (:func:`remember`), and its next run loads
them ahead in a background thread while it reads its inputs (:func:`prefetch`).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import inspect
import os
import pickle
import sys
import threading
import types
import uuid
import zlib
from pathlib import Path

import numpy as np

#: the folder programs are kept in (None: off); see :func:`keep_in`
_folder: Path | None = None
#: {in-process key: compiled program} of every stored function
_loaded: dict = {}
_locks: dict = {}
_lock = threading.Lock()
_environment: list = []
#: bumped when the file layout changes
FORMAT = 1
#: packages whose functions and classes are keyed by name: roofcal (its source is in the key)
#: and those whose versions are (another module's function, e.g. a test's, falls back to jax.jit)
KEYED_PACKAGES = frozenset({"roofcal", "jax", "jaxlib", "optax", "numpy", "builtins"})
#: JAX settings that do not change a program (where caches and logs go)
NOT_KEYED = frozenset({"jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
                       "jax_persistent_cache_min_entry_size_bytes", "jax_enable_compilation_cache",
                       "jax_compilation_cache_max_size", "jax_log_compiles", "jax_explain_cache_misses",
                       "jax_logging_level", "jax_pprint_use_color", "jax_traceback_filtering"})


class Unkeyable(Exception):
    """A static argument or pytree node with no deterministic text (:func:`text_of`)."""


def keep_in(folder: str | os.PathLike | None) -> None:
    """Keep stored programs in ``folder`` (made when first written); None turns the store off."""
    global _folder
    _folder = None if folder is None else Path(folder)


def folder() -> Path | None:
    """The folder programs are kept in, or None."""
    return _folder


#: what the store holds for a program that runs through ``jax.jit`` (one that does not serialize)
JIT = "jit"


#: XLA's options for a program whose compiling outweighs its running, when it has many fusions
#: (``stored(…, options=LIGHT)``): the CPU backend's older fusion emitters, which write each
#: fusion's LLVM IR directly, where the newer ones build it through MLIR, in a context of its own
#: (dialects registered, rewrite patterns frozen, then torn down: a quarter to a half of a
#: program's compile time). ``correction.op_time_z`` compiles in 0.08–0.12 s of CPU, not
#: 0.12–0.26, and runs no slower (a MoE block of 4,096 rows: 1.5 ms, not 2.7). The L-BFGS loops
#: are left at the default: compiled in 0.47–0.63 s rather than 0.63–1.10, they run 8–43 % slower
#: an iteration, and run thousands of iterations.
#: Floats may differ from the default program's in the last bit.
LIGHT = {"xla_cpu_use_fusion_emitters": False}

#: XLA's options for a program compiled for its compile time (``stored(…, options=FAST_COMPILE)``):
#: :data:`LIGHT`, and LLVM without its optimisation passes. For programs run once or twice a
#: process, whose compiling is their cost: ``combine.kernel_breakdown``'s took 1.05 s of CPU at
#: the default level, 0.69 s at level 0, 0.50 s with the older emitters too, and runs in 1–4 ms
#: every way. Floats may differ from the optimised program's in the last bit.
FAST_COMPILE = {"xla_backend_optimization_level": 0, **LIGHT}


def stored(fn=None, *, static_argnames=(), options=None):
    """Decorator: :class:`Stored` ``fn`` (``@stored`` or ``@stored(static_argnames=(…))``);
    ``options``: XLA's compiler options (:data:`LIGHT`, :data:`FAST_COMPILE`), or None."""
    if fn is None:
        return functools.partial(stored, static_argnames=static_argnames, options=options)
    return Stored(fn, static_argnames, options)


class Stored:
    """``jax.jit(fn, static_argnames=…)`` whose compiled programs are kept in the store (module
    docstring); called like ``fn``. ``jitted`` is the plain ``jax.jit`` function, which a call
    inside another trace uses; with ``options`` a call outside one compiles with those compiler
    options (``top``)."""

    def __init__(self, fn, static_argnames=(), options=None):
        import jax
        self.fn, self.static = fn, tuple(static_argnames)
        self.options = dict(options) if options else None
        self.variant = tuple(sorted((self.options or {}).items()))    # in the in-process key
        self.jitted = jax.jit(fn, static_argnames=self.static)
        self.top = self.jitted if self.options is None else \
            jax.jit(fn, static_argnames=self.static, compiler_options=self.options)
        self.signature = inspect.signature(fn)
        if any(p.kind is not p.POSITIONAL_OR_KEYWORD for p in self.signature.parameters.values()):
            raise TypeError(f"{fn.__qualname__}: stored functions take plain parameters only")
        functools.update_wrapper(self, fn)

    def __call__(self, *args, **kwargs):
        import jax
        if jax.config.jax_disable_jit or (_folder is None and self.options is None):
            return self.jitted(*args, **kwargs)
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        named = bound.arguments
        statics = tuple(named[n] for n in named if n in self.static)
        dynamic = [named[n] for n in named if n not in self.static]
        leaves, treedef = jax.tree_util.tree_flatten(dynamic)
        if any(isinstance(x, jax.core.Tracer) for x in leaves):
            return self.jitted(*args, **kwargs)          # inside another trace: part of its program
        if _folder is None:
            return self.top(*args, **kwargs)
        here = (self.fn, self.variant, statics, treedef, tuple(map(jax.typeof, leaves)), _configuration())
        try:
            program = _loaded.get(here)
        except TypeError:                                # an unhashable static argument
            return self.top(*args, **kwargs)
        if program is None:
            program = self._program(here, bound.args)
        return self.top(*args, **kwargs) if program is JIT else program(*dynamic)

    def with_options(self, options) -> "Stored":
        """``fn`` stored again under other compiler options (:data:`LIGHT`, :data:`FAST_COMPILE`):
        programs of their own, in the store and in the process."""
        return Stored(self.fn, self.static, options)

    def lower(self, *args, **kwargs):
        """``jax.jit``'s ``lower`` (of ``top``): the program traced and lowered, not stored."""
        return self.top.lower(*args, **kwargs)

    def programs(self) -> int:
        """How many programs of ``fn`` this process holds: from the store or compiled for it, and
        through ``jax.jit`` (the store off, or a call inside a trace)."""
        with _lock:
            top = 0 if self.top is self.jitted else self.top._cache_size()
            return self.jitted._cache_size() + top + \
                sum(1 for k in _loaded if k[0] is self.fn and k[1] == self.variant)

    def _program(self, here, ordered):
        """The program of in-process key ``here`` for the positional arguments ``ordered``: from
        the store, else compiled afresh and written to it; :data:`JIT` where it cannot be keyed."""
        with _lock:
            lock = _locks.setdefault(here, threading.Lock())
        with lock:
            if here in _loaded:
                return _loaded[here]
            try:
                key = self.key(here)
            except Unkeyable:
                program = JIT
            else:
                path = here_folder() / f"{self.fn.__name__.strip('_')}-{key[:40]}.xla"
                program = _read(path)
                if program is None:
                    program = self._compile(path, ordered)
            _loaded[here] = program
            return program

    def key(self, here) -> str:
        """The SHA-256 that names in-process key ``here``'s program in the store."""
        _, _, statics, treedef, avals, config = here
        text = "\n".join([environment(), text_of(self.fn), text_of(statics), tree_text(treedef),
                          ";".join(f"{a.dtype.name}{list(a.shape)}{'~' if a.weak_type else ''}" for a in avals),
                          text_of(config), text_of(self.options or {})])
        return hashlib.sha256(text.encode()).hexdigest()

    def _compile(self, path: Path, ordered):
        """Compile ``fn`` for ``ordered`` under a new name (so not from JAX's cache) and write it to
        ``path``; the compiled program (:data:`JIT`, and a file saying so, where it does not
        serialize: a program with captured constants)."""
        import jax
        from jax.experimental import serialize_executable
        from roofcal.io import write_bytes_atomic
        fresh = types.FunctionType(self.fn.__code__, self.fn.__globals__,
                                   f"{self.fn.__name__}_{uuid.uuid4().hex[:12]}",
                                   self.fn.__defaults__, self.fn.__closure__)
        with _not_in_jax_cache():
            compiled = jax.jit(fresh, static_argnames=self.static,
                               compiler_options=self.options).lower(*ordered).compile()
        try:
            blob = zlib.compress(pickle.dumps(serialize_executable.serialize(compiled), protocol=4), 6)
        except Exception:
            blob, compiled = JIT.encode(), JIT
        try:
            write_bytes_atomic(path, blob)
            _mark_used(path.parent, wrote=True)
            with _lock:
                _uses.setdefault(path.name, None)  # the next run reads it: loaded ahead then too
        except OSError:                     # a read-only cache: run without keeping it
            pass
        return compiled


def _not_in_jax_cache():
    """A context in which this thread's compiles are not written to JAX's persistent cache: a
    program compiled under a fresh name there is one no later process asks for (its key holds
    the name), so writing it only fills the disk (1.5 MB a cold fit; no time measurably). JAX's
    write threshold in seconds, raised for this thread alone (a thread-local setting of
    ``jax._src.config``; where a JAX lacks it, no change)."""
    import contextlib
    try:
        from jax._src import config
        return config.persistent_cache_min_compile_time_secs(float("inf"))
    except (ImportError, AttributeError, TypeError):
        return contextlib.nullcontext()


def text_of(x) -> str:
    """A deterministic text of ``x``, the same in every process for equal values: Python scalars,
    strings, enums, tuples, lists, dicts, NumPy arrays (their bytes' SHA-256), classes and
    module-level functions of :data:`KEYED_PACKAGES` (by name), ``functools.partial`` objects,
    objects with a string ``digest`` (e.g. :class:`roofcal.model.curves.Curves`) and
    dataclasses of these. Raises :class:`Unkeyable` for anything else (an object's ``repr`` may
    hold its address)."""
    if x is None or isinstance(x, (bool, int, float, complex, str, bytes)):
        return f"{type(x).__name__}:{x!r}"
    if isinstance(x, enum.Enum):
        return f"{text_of(type(x))}.{x.name}"
    if isinstance(x, (tuple, list)):
        return f"{type(x).__name__}({','.join(map(text_of, x))})"
    if isinstance(x, dict):
        return "dict(" + ",".join(sorted(f"{text_of(k)}={text_of(v)}" for k, v in x.items())) + ")"
    if isinstance(x, (np.ndarray, np.generic)):
        a = np.asarray(x)
        return f"array({a.dtype.str},{a.shape},{hashlib.sha256(a.tobytes()).hexdigest()})"
    if isinstance(x, (type, types.FunctionType, types.BuiltinFunctionType)):
        module = getattr(x, "__module__", None) or "?"
        name = f"{module}.{x.__qualname__}"
        if "<" in name or module.split(".")[0] not in KEYED_PACKAGES:
            raise Unkeyable(name)            # <locals>, <lambda>; code whose source is not keyed
        return name
    if isinstance(x, functools.partial):
        return f"partial({text_of(x.func)},{text_of(x.args)},{text_of(x.keywords)})"
    digest = getattr(x, "digest", None)
    if isinstance(digest, str):
        return f"{text_of(type(x))}#{digest}"
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return f"{text_of(type(x))}(" + ",".join(
            f"{f.name}={text_of(getattr(x, f.name))}" for f in dataclasses.fields(x)) + ")"
    raise Unkeyable(type(x).__qualname__)


def tree_text(treedef) -> str:
    """:func:`text_of` a pytree structure: each node's type and data, its children in order."""
    node = treedef.node_data()
    if node is None:
        return "*"
    kind, data = node
    return f"{text_of(kind)}[{text_of(data)}]({','.join(tree_text(c) for c in treedef.children())})"


def source_digest() -> str:
    """The SHA-256 of roofcal's files, its source and the datasheets beside it (names and bytes;
    ≈ 5 ms; compiled ``.pyc`` files left out)."""
    h = hashlib.sha256()
    root = Path(__file__).resolve().parent
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.suffix != ".pyc":
            h.update(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


#: :func:`source_digest` when roofcal was imported (a file edited while a process runs does not
#: key the programs that process compiled from the code it had)
SOURCE = source_digest()


def environment() -> str:
    """The SHA-256 of what every program depends on besides its function, its arguments and JAX's
    configuration: roofcal's source files, the versions of Python, JAX, jaxlib, optax and NumPy,
    ``$XLA_FLAGS``, the backend's platform, version and devices and the host's CPU (computed once
    a process)."""
    with _lock:
        if not _environment:
            import jax
            import jaxlib
            import optax
            h = hashlib.sha256(f"format {FORMAT}\n{SOURCE}\n".encode())
            d = jax.devices()[0]
            h.update(repr((sys.version, jax.__version__, jaxlib.__version__, optax.__version__,
                           np.__version__, os.environ.get("XLA_FLAGS", ""), d.platform, d.device_kind,
                           d.client.platform_version, jax.device_count(), _host())).encode())
            _environment.append(h.hexdigest())
        return _environment[0]


def _host() -> str:
    """The CPU's model and instruction-set flags (Linux; XLA compiles for the host's CPU)."""
    import platform
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            lines = [ln for ln in f.read().split("\n\n")[0].splitlines()
                     if ln.split(":")[0].strip() in ("vendor_id", "model name", "flags", "Features")]
    except OSError:
        lines = []
    return repr((platform.machine(), platform.processor(), lines))


def _configuration() -> tuple:
    """JAX's settings as they stand in this thread (``jax.enable_x64`` and other contexts
    included), in a fixed order, but for :data:`NOT_KEYED`."""
    import jax
    return tuple((k, v) for k, v in jax.config.values.items() if k not in NOT_KEYED)


#: {path: Future of its program} of the programs :func:`prefetch` is loading ahead
_ahead: dict = {}
#: names of the files this process read from the store or wrote to it, in the order first used
_uses: dict = {}


def _read(path: Path):
    """The program stored at ``path`` (:func:`_load`), taken from :func:`prefetch` where it loaded
    it ahead, and noted for :func:`remember`."""
    with _lock:
        ahead = _ahead.pop(path, None)
    if ahead is not None and not ahead.cancel():          # loading or loaded: wait for it
        program = ahead.result()
    else:
        program = _load(path)
    if program is not None:
        with _lock:
            _uses.setdefault(path.name, None)
    return program


def prefetch(name: str) -> None:
    """Start loading, in a background thread, the programs that the last run of ``name`` (a
    command) read from the store or wrote to it (:func:`remember`), in that order: what a warm run
    would load one by one when first called, on the thread that calls it, while a core sits
    idle as the command reads its inputs (36 programs, ≈ 0.7 s of CPU, in a warm ``roofcal
    fit``). A program asked for before its turn is loaded by the caller; one that no call asks
    for is loaded for nothing. Nothing happens with the store off or no list."""
    if _folder is None:
        return
    from concurrent.futures import Future
    try:
        names = (here_folder() / f"{name}.uses").read_text(encoding="utf-8").split()
    except (OSError, UnicodeDecodeError):
        return
    todo = []
    with _lock:
        for n in names:
            path = here_folder() / n
            if path.suffix == ".xla" and path.parent == here_folder() and path not in _ahead:
                _ahead[path] = Future()
                todo.append((path, _ahead[path]))

    def load_all():
        for path, future in todo:
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(_load(path))
                except BaseException:          # never leaves a caller waiting
                    future.set_result(None)
    threading.Thread(target=load_all, name="roofcal-prefetch", daemon=True).start()


def remember(name: str) -> None:
    """Write the files this process read from the store or wrote to it (in the order first used)
    as the list :func:`prefetch` ``name`` loads ahead next time (``<name>.uses`` beside them;
    written when it changed, atomically; never an error: the list is a hint). A first run, which
    compiles, writes it too, so the second loads ahead (a warm ``roofcal fit`` 7.80 → 7.63 s with
    its list, 8 pairs)."""
    if _folder is None:
        return
    from roofcal.io import write_bytes_atomic
    with _lock:
        text = "".join(f"{n}\n" for n in _uses)
    path = here_folder() / f"{name}.uses"
    try:
        if not text or (path.exists() and path.read_text(encoding="utf-8") == text):
            return
        write_bytes_atomic(path, text.encode())
    except (OSError, UnicodeDecodeError):
        pass


def _load(path: Path):
    """The program stored at ``path``: None where there is none or it does not load (truncated,
    or from another build), :data:`JIT` where the program does not serialize."""
    from jax.experimental import serialize_executable
    try:
        data = path.read_bytes()
        if data == JIT.encode():
            return JIT
        blob, in_tree, out_tree = pickle.loads(zlib.decompress(data))
        program = serialize_executable.deserialize_and_load(blob, in_tree, out_tree)
    except Exception:
        return None
    _mark_used(path.parent, wrote=False)
    return program


def here_folder() -> Path:
    """The subfolder of :func:`folder` for this roofcal source (:data:`SOURCE`)."""
    return _folder / SOURCE[:16]


#: how many roofcal sources' subfolders are kept: the last used (one a release; while roofcal
#: is edited, a few: e.g. two checkouts compared)
KEEP_SOURCES = 4
_used: set = set()


def _mark_used(mine: Path, wrote: bool) -> None:
    """Mark ``mine`` as used now (once a process); after this process's first write, also remove
    the subfolders of other roofcal sources but the :data:`KEEP_SOURCES` − 1 last used."""
    import shutil
    with _lock:
        if wrote in _used:
            return
        _used.add(wrote)                    # True: pruned; False: marked on a read
    try:
        os.utime(mine)
        if wrote:
            others = sorted((p for p in mine.parent.iterdir() if p.is_dir() and p != mine),
                            key=lambda p: p.stat().st_mtime, reverse=True)
            for old in others[KEEP_SOURCES - 1:]:
                shutil.rmtree(old, ignore_errors=True)
    except OSError:
        pass

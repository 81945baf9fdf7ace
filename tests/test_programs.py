"""roofcal.programs: compiled programs kept whole on disk and found again without tracing."""

import csv
import io
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from roofcal import programs as P
from roofcal.model import correction as K
from roofcal.model.curves import Curves
from roofcal.physics.config import load_model

Z = np.linspace(-1.0, 1.0, 12, dtype=np.float32).reshape(4, 3)
LO, HI = np.full(3, -0.5, np.float32), np.full(3, 0.8, np.float32)


@pytest.fixture
def store(tmp_path):
    """The store in an empty folder, this process's loaded programs set aside (and put back)."""
    folder, loaded, used = P.folder(), dict(P._loaded), set(P._used)
    P.keep_in(tmp_path / "programs")
    P._loaded.clear()
    P._used.clear()
    P._uses.clear()
    P._ahead.clear()
    yield tmp_path / "programs"
    P._uses.clear()
    P._ahead.clear()
    P.keep_in(folder)
    P._loaded.clear()
    P._loaded.update(loaded)
    P._used.clear()
    P._used.update(used)


def files(store) -> list:
    """The programs in the store (none before the first is written)."""
    return sorted(store.rglob("*.xla"))


def traces(fn):
    """(what ``fn()`` returns, how many functions JAX traced meanwhile)."""
    seen = []

    def listen(event, duration, **kw):
        if event == "/jax/core/compile/jaxpr_trace_duration":
            seen.append(1)
    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        out = fn()
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    return out, len(seen)


def test_a_stored_program_is_read_back_without_tracing_and_computes_the_same(store):
    expected = np.asarray(K.features.jitted(Z, LO, HI, 3))
    first, traced = traces(lambda: np.asarray(K.features(Z, LO, HI, 3)))
    assert traced == 1 and [p.suffix for p in files(store)] == [".xla"]
    P._loaded.clear()                                   # as a new process finds it: on disk only
    again, traced = traces(lambda: np.asarray(K.features(Z, LO, HI, 3)))
    assert traced == 0
    assert first.tobytes() == expected.tobytes() == again.tobytes()
    assert again.shape == (4, 20)                       # 1 + 3 + 6 + 10 monomials of degree ≤ 3


@pytest.mark.slow
def test_another_process_reads_the_program_one_wrote(store):
    K.features(Z, LO, HI, 2)
    script = ("import sys, jax, numpy as np\n"
              "from roofcal.cli.main import jax_defaults; jax_defaults()\n"
              "from roofcal import programs as P; from roofcal.model import correction as K\n"
              f"P.keep_in({str(store)!r})\n"
              "seen = []\n"
              "jax.monitoring.register_event_duration_secs_listener(lambda e, d, **k: seen.append(e))\n"
              "z = np.linspace(-1.0, 1.0, 12, dtype=np.float32).reshape(4, 3)\n"
              "out = K.features(z, np.full(3, -0.5, np.float32), np.full(3, 0.8, np.float32), 2)\n"
              "print(seen.count('/jax/core/compile/jaxpr_trace_duration'), np.asarray(out).tobytes().hex())\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_COMPILATION", "JAX_PERSISTENT"))}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
    traced, values = out.stdout.split()
    assert traced == "0"
    assert values == np.asarray(K.features.jitted(Z, LO, HI, 2)).tobytes().hex()


def test_the_programs_a_command_used_are_loaded_ahead_by_its_next_run(store, monkeypatch):
    K.features(Z, LO, HI, 2)                            # compiled and written
    (two,) = [f.name for f in files(store)]
    K.features(Z, LO, HI, 3)
    (three,) = [f.name for f in files(store) if f.name != two]
    P.remember("fit")                                   # a first run lists what it wrote
    assert (P.here_folder() / "fit.uses").read_text() == f"{two}\n{three}\n"
    P._loaded.clear()                                   # as a new process: read, in this order
    P._uses.clear()
    K.features(Z, LO, HI, 3)
    K.features(Z, LO, HI, 2)
    P.remember("fit")
    assert (P.here_folder() / "fit.uses").read_text() == f"{three}\n{two}\n"
    P._loaded.clear()                                   # the command's next run
    P._uses.clear()
    P.prefetch("fit")
    assert P._ahead[P.here_folder() / three].result() is not None   # loaded in the background
    assert P._ahead[P.here_folder() / two].result() is not None
    monkeypatch.setattr(P, "_load", lambda path: pytest.fail(f"{path} read again"))
    out, traced = traces(lambda: np.asarray(K.features(Z, LO, HI, 3)))
    assert traced == 0 and out.tobytes() == np.asarray(K.features.jitted(Z, LO, HI, 3)).tobytes()
    assert list(P._uses) == [three] and list(P._ahead) == [P.here_folder() / two]


def test_a_stale_or_garbled_list_of_programs_is_only_a_hint(store):
    K.features(Z, LO, HI, 2)
    (P.here_folder() / "fit.uses").write_text("features-0000.xla\n../../elsewhere.xla\nnot a program\n")
    P._loaded.clear()
    P.prefetch("fit")                                   # names no file: nothing to wait for
    assert [p.name for p in P._ahead] == ["features-0000.xla"]
    assert P._ahead[P.here_folder() / "features-0000.xla"].result() is None
    out, traced = traces(lambda: np.asarray(K.features(Z, LO, HI, 2)))
    assert traced == 0 and out.tobytes() == np.asarray(K.features.jitted(Z, LO, HI, 2)).tobytes()
    (P.here_folder() / "fit.uses").write_bytes(b"\xff\xfe")
    P.prefetch("fit")                                   # unreadable: ignored
    P.keep_in(None)
    P.prefetch("fit")                                   # the store off: nothing
    P.remember("fit")


def test_each_shape_static_argument_dtype_and_setting_is_a_program_of_its_own(store):
    K.features(Z, LO, HI, 2)
    K.features(Z, LO, HI, 2)                            # the same: no new file
    assert len(list(files(store))) == 1
    K.features(Z[:3], LO, HI, 2)                        # 3 rows, not 4
    K.features(Z, LO, HI, 3)                            # another degree
    K.features(Z.astype(np.float16), LO, HI, 2)         # another dtype
    with jax.default_matmul_precision("highest"):       # another setting of JAX's
        K.features(Z, LO, HI, 2)
    assert len(list(files(store))) == 5
    assert K.features.programs() >= 5


def test_inside_a_trace_it_is_part_of_the_caller_program(store):
    def total(z):
        return jnp.sum(K.features(z, LO, HI, 2))
    g = jax.jit(jax.grad(total))(Z)
    assert list(files(store)) == []                  # traced into the caller's program
    np.testing.assert_allclose(np.asarray(g), np.asarray(jax.grad(
        lambda z: jnp.sum(K.features.jitted(z, LO, HI, 2)))(Z)), rtol=1e-6)


def test_a_damaged_file_is_compiled_again_and_rewritten(store):
    expected = np.asarray(K.features(Z, LO, HI, 2))
    (path,) = files(store)
    size = path.stat().st_size
    path.write_bytes(path.read_bytes()[: size // 2])    # truncated
    P._loaded.clear()
    again, traced = traces(lambda: np.asarray(K.features(Z, LO, HI, 2)))
    assert traced == 1 and again.tobytes() == expected.tobytes()
    assert path.stat().st_size > size // 2              # rewritten whole: read back untraced
    P._loaded.clear()
    assert traces(lambda: K.features(Z, LO, HI, 2))[1] == 0


@pytest.mark.slow
@pytest.mark.parametrize("options", [P.FAST_COMPILE, P.LIGHT], ids=["fast_compile", "light"])
def test_a_program_with_compiler_options_is_kept_apart_and_its_calls_inside_traces_are_not(store, options):
    """``options`` (``FAST_COMPILE``: ``combine.kernel_breakdown``, ``combine.combined``, the
    held-kernels Adam; ``LIGHT``: ``correction.op_time_z``): called outside a
    trace, XLA compiles it with those options, its own key; inside a trace it is part of the
    caller's program, which ``compiler_options`` may not be given to. Its values are the
    default program's up to the last bit; the store's and the unstored ones are the same."""
    fast = P.stored(K.features.fn, static_argnames=("degree",), options=options)
    out = np.asarray(fast(Z, LO, HI, 3))
    np.testing.assert_allclose(out, np.asarray(K.features.jitted(Z, LO, HI, 3)), rtol=1e-6)
    K.features(Z, LO, HI, 3)
    assert len(files(store)) == 2                       # the same function, shapes, statics
    total = jax.jit(lambda z: jnp.sum(fast(z, LO, HI, 3)))(Z)
    assert len(files(store)) == 2 and np.isclose(float(total), out.sum(), rtol=1e-6)
    P._loaded.clear()
    again, traced = traces(lambda: np.asarray(fast(Z, LO, HI, 3)))
    assert traced == 0 and again.tobytes() == out.tobytes()
    P.keep_in(None)
    assert np.asarray(fast(Z, LO, HI, 3)).tobytes() == out.tobytes()


def test_off_unkeyable_or_unwritable_it_runs_through_jax_jit(store, tmp_path):
    def local_objective(p, data):                       # a test's function: its source is not keyed
        return jnp.sum((p["x"] - data) ** 2)
    from roofcal.calibration import optim
    vec = optim.OnVector(local_objective, (("x", (2,)),))
    s, *_ = optim._lbfgs_block(vec, optim.start(np.zeros(2, np.float32)), jnp.zeros((), jnp.int32),
                               jnp.asarray([1.0, 2.0]), 20)
    np.testing.assert_allclose(np.asarray(s.x), [1.0, 2.0], atol=1e-5)
    assert list(files(store)) == []
    P.keep_in(None)
    K.features(Z, LO, HI, 4)
    assert list(files(store)) == []
    locked = tmp_path / "locked"
    locked.write_text("a file where the folder would be")
    P.keep_in(locked / "programs")
    out = np.asarray(K.features(Z, LO, HI, 4))
    assert out.tobytes() == np.asarray(K.features.jitted(Z, LO, HI, 4)).tobytes()


def test_keys_are_texts_of_values_not_of_addresses():
    m = load_model("llama-2-7b-hf")
    assert P.text_of(m) == P.text_of(load_model("llama-2-7b-hf")) != P.text_of(load_model("llama-2-70b-hf"))
    assert P.text_of(m).startswith("roofcal.physics.config.ModelSpec(name=str:'llama-2-7b-hf',num_layers=int:32,")
    a = Curves({(1.0,): ([1.0, 2.0], [0.1, -0.1])})
    assert P.text_of(a) == P.text_of(Curves({(1.0,): ([1.0, 2.0], [0.1, -0.1])})) \
        != P.text_of(Curves({(1.0,): ([1.0, 2.0], [0.1, -0.2])}))
    assert P.text_of({"b": 1, "a": (2, 0.5)}) == "dict(str:'a'=tuple(int:2,float:0.5),str:'b'=int:1)"
    assert P.text_of(np.float32(0.5)) != P.text_of(np.float64(0.5))
    for x in (object(), lambda: 0, test_keys_are_texts_of_values_not_of_addresses):
        with pytest.raises(P.Unkeyable):
            P.text_of(x)


@pytest.mark.slow
@pytest.mark.parametrize("start, fewer, fast", [("cold", 0, False), ("warm", 0, True), ("warm", 1, False)])
def test_a_kernel_fit_from_stored_programs_is_the_fit_jax_jit_gives(store, monkeypatch, start, fewer, fast):
    """The L-BFGS blocks of a kernel fit (40 all-reduce rows), compiled for the store, read back
    from it, and through ``jax.jit`` with the store off: the same parameters to the bit. A fit
    started from a fitted kernel (a few-shot refit) on at most ``fit.QUICK_FIT_ROWS`` rows runs
    them compiled for compile time; a fit from scratch, or on ``fewer`` rows than it has, as
    they run fastest."""
    from roofcal.calibration import fit as F, optim
    from roofcal.measurements.ops import read_ops
    from roofcal.physics.hardware import load_gpu
    t = read_ops("data/microbench/h100_sxm/vllm-0.24.0/custom_allreduce_perf.parquet").iloc[:40]
    settings = F.FitSettings(progress=False, kernel_iters=100)
    d = next(iter(F.kernel_data(t.reset_index(drop=True), load_gpu("h100_sxm"), np.zeros(len(t), bool),
                                settings).values()))
    monkeypatch.setattr(F, "QUICK_FIT_ROWS", int(np.asarray(d.train).sum()) - fewer)
    init = F.fit_one(d, F.FitSettings(progress=False, kernel_iters=20)) if start == "warm" else None

    def fitted():
        p = F.fit_one(d, settings, init=init)
        return b"".join(np.asarray(p[k]).tobytes() for k in sorted(p))
    compiled = fitted()
    assert "lbfgs_block" in {f.name.split("-")[0] for f in files(store)}
    P._loaded.clear()
    read, traced = traces(fitted)
    assert traced == 0 and read == compiled
    used = {k[1] for k in P._loaded if k[0] is optim._lbfgs_block.fn}
    assert used == {(optim._lbfgs_block_fast if fast else optim._lbfgs_block).variant}
    assert optim._lbfgs_block_fast.variant != optim._lbfgs_block.variant
    P.keep_in(None)
    assert fitted() == compiled


@pytest.mark.slow
def test_a_step_fit_from_stored_programs_is_the_fit_jax_jit_gives(store):
    """The step level's Adam blocks (the splitwise steps, kernels held): their loss is keyed by
    value (``fit.HeldKernelsLoss``), so the program is compiled (for its compile time, cheap to
    run) for the store and read back without tracing; with the store off, through ``jax.jit``
    with the same options: the same parameters to the bit."""
    from roofcal.calibration import optim
    from roofcal.calibration.fit import FitSettings, fit_steps, split_groups
    from roofcal.measurements.stepdata import read_splitwise
    from roofcal.model import coeffs as coeff_io
    sets = read_splitwise("data/steps/splitwise/llama2-70b_h100-80gb_tp4_tp8.csv")
    kernels = coeff_io.load("coeffs/h100_sxm.yaml", "h100_sxm").params["ops"]
    masks = [~split_groups(d.config, 0.2, 1) for d in sets]
    settings = FitSettings(progress=False, step_iters=100)

    def fitted():
        step = fit_steps(sets, kernels, settings, masks)["step"]
        return b"".join(np.asarray(step[k]).tobytes() for k in sorted(step))
    compiled = fitted()
    assert "adam_block" in {f.name.split("-")[0] for f in files(store)}
    P._loaded.clear()
    read, traced = traces(fitted)
    adam = [(k[1], p) for k, p in P._loaded.items() if k[0] is optim._adam_block.fn]
    assert read == compiled and traced == 0 and len(adam) == 1 and adam[0][1] is not P.JIT
    assert adam[0][0] == optim._adam_block_fast.variant != optim._adam_block.variant   # FAST_COMPILE
    P.keep_in(None)
    assert fitted() == compiled


def test_the_store_keeps_the_last_used_sources(store):
    """Programs of each roofcal source sit in a subfolder of their own; a write removes those of
    other sources but the KEEP_SOURCES − 1 last used."""
    for i in range(6):
        old = store / f"source{i}"
        old.mkdir(parents=True)
        (old / "x.xla").write_bytes(b"x")
        os.utime(old, (1_000_000 + i, 1_000_000 + i))          # source5 the last used
    K.features(Z, LO, HI, 1)
    kept = sorted(p.name for p in store.iterdir())
    assert kept == sorted([P.SOURCE[:16]] + [f"source{i}" for i in range(6 - P.KEEP_SOURCES + 1, 6)])
    assert P.SOURCE == P.source_digest()


@pytest.mark.parametrize("cache, switch, expected", [
    ("{tmp}", "", "{tmp}/programs"), ("{tmp}", "off", "None"), ("off", "", "None")])
def test_the_commands_keep_programs_beside_jax_cache_unless_told_not_to(tmp_path, cache, switch, expected):
    env = {**os.environ, "ROOFCAL_CACHE": cache.format(tmp=tmp_path), "ROOFCAL_PROGRAMS": switch}
    script = ("from roofcal.cli.main import enable_compilation_cache; enable_compilation_cache(); "
              "from roofcal import programs; print(programs.folder())")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == expected.format(tmp=tmp_path)


def test_a_stored_program_is_not_also_written_to_jax_cache_which_other_programs_still_use(tmp_path):
    """The store compiles under a fresh name, so an entry in JAX's cache would be one no process
    asks for again (a cold fit wrote 41 such, 1.5 MB); a plain ``jax.jit`` program, compiled
    beside it, still goes there."""
    env = {**os.environ, "ROOFCAL_CACHE": str(tmp_path), "ROOFCAL_PROGRAMS": ""}
    script = ("import os, numpy as np, jax, jax.numpy as jnp\n"
              "from roofcal.cli.main import enable_compilation_cache, jax_defaults\n"
              "enable_compilation_cache(); jax_defaults()\n"
              "from roofcal.model import correction as K\n"
              "z = np.linspace(-1.0, 1.0, 12, dtype=np.float32).reshape(4, 3)\n"
              "K.features(z, np.full(3, -0.5, np.float32), np.full(3, 0.8, np.float32), 2)\n"
              "jax_dir = os.path.join(os.environ['ROOFCAL_CACHE'], 'jax')\n"
              "before = len(os.listdir(jax_dir)) if os.path.isdir(jax_dir) else 0\n"
              "jax.jit(lambda x: jnp.sin(x) * 3.0)(jnp.ones(5)).block_until_ready()\n"
              "print(before, len(os.listdir(jax_dir)))\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
    before, after = map(int, out.stdout.split())
    assert [f.name.split("-")[0] for f in files(tmp_path / "programs")] == ["features"]
    assert before == 0 and after >= 1


@pytest.mark.slow
def test_a_prediction_from_stored_programs_is_the_prediction_without_them(tmp_path):
    """``roofcal predict`` (times and the out-of-domain flags, whose column labels the step
    program records while traced) run twice with the store — compiling, then reading — and once
    with it off: the same CSV to the byte."""
    steps = tmp_path / "steps.jsonl"
    steps.write_text('{"prefill": [[2048, 0]], "decode": []}\n{"prefill": [[65536, 0]], "decode": [100, 70000]}\n')

    def predicted(name, switch):
        env = {**os.environ, "ROOFCAL_CACHE": str(tmp_path / "cache"), "ROOFCAL_PROGRAMS": switch}
        out = tmp_path / name
        subprocess.run([sys.executable, "-m", "roofcal.cli", "predict", "--model", "llama-2-70b-hf", "--gpu",
                        "h100_sxm", "--tp", "4", "--steps", str(steps), "--coeffs", "coeffs/h100_sxm.yaml",
                        "--out", str(out)], env=env, check=True, capture_output=True)
        return out.read_text()
    compiled, read, off = predicted("a.csv", ""), predicted("b.csv", ""), predicted("c.csv", "off")
    assert [f.name.split("-")[0] for f in files(tmp_path / "cache" / "programs")] == ["step_outputs"]
    assert compiled == read == off
    rows = list(csv.DictReader(io.StringIO(compiled)))
    assert [r["ood_context"] for r in rows] == ["False", "True"]     # 70,000 tokens past 4,096
    assert rows[1]["ood_what"] == "qkv_proj.m" and float(rows[1]["ood_shape"]) > 2.9   # 65,536 rows

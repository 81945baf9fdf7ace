"""Replay a measured serving run in the real BLIS simulator.

In: an :class:`~roofcal.measurements.workload.Experiment`, the BLIS binary, its ``defaults.yaml``,
``hardware_config.json`` and model-config folders (:class:`BlisSettings`), optionally a
``defaults.yaml`` of its own or α/β coefficients overriding the defaults'.
Out: :class:`SimResult` — simulated mean E2E / TTFT / ITL per scope, the command line that
produced them, and per-request arrays.

Two replays (``BlisSettings.replay``):

* ``"trace"`` (the default): the run as the client sent it — its TraceV2
  (:mod:`roofcal.blis.trace`: inference-perf's open-loop schedule and prompt pool, or a recorded
  trace from its first send) through ``blis replay``. Anyone can repeat it with ``roofcal
  workload trace`` and the printed ``blis replay`` command alone.
* ``"expansion"``: BLIS's own ``inference_perf:`` expansion of ``profile.yaml`` (as requested,
  which is what inference-sim's sim-to-real validation feeds it) through ``blis run`` —
  closed-loop multi-turn sessions with a fresh question per request (stretching 1,200 s of load
  over 1,570–2,640 s, cache hits ≈ 12 % of tokens). Kept to compare with BLIS's own numbers; it
  is not the load the server got.

The server: ``--max-num-seqs`` / ``--max-num-batched-tokens`` from the run; the GPU's
``hardware_config.json`` entry; no CPU KV tier (``--kv-cpu-blocks 0``, which gives the same
metrics as the 8 GiB tier on these runs and is ≈ 4× faster); ``--latency-model
trained-physics``; seed 42. GPU KV blocks (:func:`kv_blocks`): the server description's, else the
count vLLM logged where known, else BLIS's own estimate divided by TP (BLIS counts the memory of
all TP GPUs against one GPU's KV size, ≈ TP × what vLLM reports) or ``roofcal capacity``.

Scores, the same rule as the measured side: per scope (the run; each inference-perf stage) the
mean E2E and TTFT of the completed requests after the warm-up, and ITL by
:func:`roofcal.measurements.requests.itl_us` — (E2E − TTFT) / (generated − 1) per request.
BLIS's E2E includes α1 (its post-decode overhead), as the real client's includes the end of the
stream.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from roofcal.blis import REPLAYS
from roofcal.errors import RoofcalError
from roofcal.measurements.requests import itl_us
from roofcal.measurements.workload import Experiment

#: environment variable naming the BLIS binary when ``--blis`` is not given
BLIS_ENV = "ROOFCAL_BLIS"
#: BLIS's CPU-tier flag: tier off
KV_CPU_FLAGS = ("--kv-cpu-blocks", "0")

#: GPU KV blocks vLLM reported, by (lower-cased model id, TP). Llama-2-7B TP1: 7463 blocks, from
#: vLLM's log of these runs' server configuration (the log is not published; the value is recorded
#: in BLIS's testdata/trained_physics_iter29.json, inference-sim/inference-sim, and used by
#: ../shared/tools/blis_experiment.py).
KNOWN_KV_BLOCKS: Mapping[tuple[str, int], int] = {
    ("meta-llama/llama-2-7b-hf", 1): 7463,
}

_AUTO_KV = re.compile(r"auto-calculated total-kv-blocks=(\d+)")
_LOG_MSG = re.compile(r'msg="((?:[^"\\]|\\.)*)"')
_REQUEST_FIELDS = ("arrived_at", "ttft_ms", "e2e_ms", "num_prefill_tokens", "num_decode_tokens")


@dataclass(frozen=True)
class BlisSettings:
    """Where BLIS and its inputs are, and how to run it.

    ``model_configs`` are folders searched (in order) for ``<model>/config.json``; ``timeout_s`` is
    per BLIS process; ``workers`` BLIS processes run at once in :func:`run_experiments`; ``seed``
    seeds the rebuilt inference-perf schedules and BLIS's token ids."""

    blis: Path
    defaults: Path
    hardware_config: Path
    model_configs: tuple[Path, ...]
    replay: str = "trace"
    timeout_s: float = 300
    seed: int = 42
    workers: int = 2
    kv_blocks: str = "blis"          # KV blocks when neither the run nor vLLM's log says: "blis" (auto / TP) or "capacity"

    def __post_init__(self):
        if self.replay not in REPLAYS:
            raise RoofcalError(f"replay must be one of {', '.join(REPLAYS)}, got {self.replay!r}")
        if self.kv_blocks not in ("blis", "capacity"):
            raise RoofcalError(f"kv_blocks must be 'blis' or 'capacity', got {self.kv_blocks!r}")
        if not (self.timeout_s > 0):
            raise RoofcalError(f"BLIS timeout must be positive, got {self.timeout_s}")
        if int(self.workers) < 1:
            raise RoofcalError(f"workers must be ≥ 1, got {self.workers}")

    @property
    def description(self) -> str:
        """How the runs are replayed, in words."""
        return ("faithful trace (open-loop sends, prompt pool, generated tokens) through blis replay"
                if self.replay == "trace" else "BLIS's closed-loop inference_perf expansion through blis run")


@dataclass(frozen=True)
class SimScope:
    """Simulated means over one scope (the run, or one stage's requests), in ms, and the 1st
    percentile of its requests' E2E (the fastest requests; linear interpolation, numpy's rule)."""

    e2e_ms: float
    ttft_ms: float
    itl_ms: float
    completed: int
    e2e_p1_ms: float = math.nan


@dataclass(frozen=True, eq=False)
class SimResult:
    """One BLIS replay of one experiment.

    Per-request arrays (read-only, one entry per completed request — timed-out ones are left out
    — in BLIS's order):
    ``index`` (position in the run's requests; -1 for BLIS's own expansion), ``arrived_at`` (s),
    ``ttft_ms``, ``e2e_ms``, ``num_prefill_tokens``, ``num_decode_tokens``. ``command``: the
    BLIS command line as run (in its work folder)."""

    experiment: str
    replay: str
    scopes: dict[str, SimScope]       # "summary", "stage_0", ...
    completed: int
    injected: int
    timed_out: int
    preemptions: int
    sim_duration_s: float             # BLIS's vllm_estimated_duration_s
    cache_hit_rate: float             # BLIS's prefix-cache hit rate (hit tokens / all tokens)
    kv_blocks: int
    kv_source: str
    wall_s: float                     # wall-clock time of the BLIS process
    command: str
    index: np.ndarray = field(repr=False)
    arrived_at: np.ndarray = field(repr=False)
    ttft_ms: np.ndarray = field(repr=False)
    e2e_ms: np.ndarray = field(repr=False)
    num_prefill_tokens: np.ndarray = field(repr=False)
    num_decode_tokens: np.ndarray = field(repr=False)


# --------------------------------------------------------------------------------------------
# locating things


def find_blis(path: str | os.PathLike | None = None) -> Path:
    """The BLIS binary: ``path``, else ``$ROOFCAL_BLIS``; it must be an executable file. Returned
    absolute: BLIS runs in a temporary working directory, where a relative path means nothing."""
    chosen = path if path not in (None, "") else os.environ.get(BLIS_ENV) or None
    if chosen is None:
        raise RoofcalError(f"no BLIS binary: pass --blis PATH or set {BLIS_ENV}")
    p = Path(chosen)
    if not p.is_file() or not os.access(p, os.X_OK):
        raise RoofcalError(f"{p}: not an executable file (the BLIS binary)")
    return p.resolve()


def model_config_folder(exp: Experiment, folders: Sequence[str | os.PathLike]) -> Path:
    """The first ``<root>/<dir>/`` holding a ``config.json`` whose ``<dir>`` equals the last part of
    ``exp.model`` case-insensitively (meta-llama/Llama-2-7b-hf → llama-2-7b-hf)."""
    want = exp.model.rsplit("/", 1)[-1].lower()
    for root in folders:
        root = Path(root)
        if not root.is_dir():
            continue
        for sub in sorted(root.iterdir()):
            if sub.name.lower() == want and (sub / "config.json").is_file():
                return sub
    searched = ", ".join(str(f) for f in folders) or "(none)"
    raise RoofcalError(f"{exp.path}: no config.json for model {exp.model} in the model-config folders "
                       f"{searched}: pass --model-configs DIR")


def blis_hardware(exp: Experiment, settings: BlisSettings) -> str:
    """The ``hardware_config.json`` entry BLIS runs ``exp``'s GPU as (e.g. ``H100``)."""
    from roofcal.blis.hardware_json import hardware_for_gpu
    from roofcal.physics.hardware import load_gpu
    return hardware_for_gpu(settings.hardware_config, load_gpu(exp.server.gpu))[0]


# --------------------------------------------------------------------------------------------
# BLIS's own expansion (the anchor)


def expansion_spec(exp: Experiment, seed: int = 42) -> str:
    """BLIS's v2 workload spec with an ``inference_perf:`` block for an inference-perf run, as
    JSON (valid YAML), built as inference-sim's validation (and the reference runner) builds it:
    from ``profile.yaml`` as requested — its stages and shared-prefix generator, multi-turn flag
    included — with ``num_requests`` = Σ round(rate · duration)."""
    from roofcal.measurements.workload import requested_profile
    if exp.kind != "inference-perf":
        raise RoofcalError(f"{exp.path}: BLIS's inference_perf expansion needs an inference-perf run")
    prof = requested_profile(exp)
    stages = []
    for i, s in enumerate(prof["stages"]):
        if s["duration"] != int(s["duration"]):
            raise RoofcalError(f"{exp.path / 'profile.yaml'}: field 'load.stages.{i}.duration': "
                               f"BLIS takes whole seconds, got {s['duration']}")
        stages.append({"rate": float(s["rate"]), "duration": int(s["duration"])})
    spec = {"version": "2", "seed": int(seed),
            "num_requests": sum(round(s["rate"] * s["duration"]) for s in stages),
            "inference_perf": {"stages": stages, "shared_prefix": prof["shared_prefix"]}}
    return json.dumps(spec, indent=1) + "\n"


# --------------------------------------------------------------------------------------------
# processes


def _call(args: list[str], cwd, timeout_s: float, what: str) -> subprocess.CompletedProcess:
    """Run ``args`` in ``cwd``; a timeout kills the process and raises a one-line error."""
    try:
        proc = subprocess.Popen(args, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, text=True)
    except OSError as err:
        raise RoofcalError(f"{args[0]}: cannot run BLIS: {err.strerror or err}") from None
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise RoofcalError(f"BLIS timed out after {timeout_s:g} s on {what}") from None
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def blis_error_line(stderr: str) -> str:
    """The one line that says why BLIS failed: a Go ``panic:`` line, else the last non-empty
    stderr line (its logrus ``msg="…"`` when it has one)."""
    lines = [ln.strip() for ln in (stderr or "").splitlines() if ln.strip()]
    if not lines:
        return "no message on stderr"
    line = next((ln for ln in lines if ln.startswith("panic:")), lines[-1])
    m = _LOG_MSG.search(line)
    if m:
        line = m.group(1).replace('\\"', '"').replace("\\\\", "\\")
    return line


def _check_inputs(settings: BlisSettings, defaults: Path) -> None:
    """Refuse missing input files up front, with the file named."""
    if not Path(defaults).is_file():
        raise RoofcalError(f"{defaults}: no such BLIS defaults file")
    if not Path(settings.hardware_config).is_file():
        raise RoofcalError(f"{settings.hardware_config}: no such BLIS hardware config file")


def server_flags(exp: Experiment, settings: BlisSettings, defaults: Path, folder: Path) -> list[str]:
    """The flags that describe ``exp``'s model, GPU and latency model to BLIS."""
    return ["--model", exp.model_id, "--tp", str(exp.tp), "--hardware", blis_hardware(exp, settings),
            "--latency-model", "trained-physics",
            "--defaults-filepath", str(Path(defaults).resolve()),
            "--model-config-folder", str(folder.resolve()),
            "--hardware-config", str(Path(settings.hardware_config).resolve())]


_probe_cache: dict[tuple, int] = {}
_probe_lock = threading.Lock()


def kv_blocks(exp: Experiment, settings: BlisSettings) -> tuple[int, str]:
    """GPU KV blocks for ``exp`` and where the number comes from: the run's server description,
    else :data:`KNOWN_KV_BLOCKS`, else (``settings.kv_blocks == "capacity"``) what vLLM would
    allocate (:func:`roofcal.physics.capacity.capacity` at the server's limits), else (the
    default, as the reference runner does) BLIS's auto-calculated count (probed with a
    one-request run, ``--log info``) divided by TP. Probes are cached in memory."""
    if exp.server.kv_blocks is not None:
        return int(exp.server.kv_blocks), "server description"
    known = KNOWN_KV_BLOCKS.get((exp.model_id, exp.tp))
    if known is not None:
        return known, "vllm-log"
    folder = model_config_folder(exp, settings.model_configs)
    if settings.kv_blocks == "capacity":
        from roofcal.physics.capacity import capacity
        from roofcal.physics.config import load_model
        from roofcal.physics.hardware import load_gpu
        cap = capacity(load_model(folder / "config.json"), load_gpu(exp.server.gpu), int(exp.tp),
                       max_num_batched_tokens=exp.max_num_batched_tokens, max_num_seqs=exp.max_num_seqs)
        return cap.kv_blocks, "roofcal capacity"
    key = (exp.model_id, exp.tp, exp.server.gpu, str(Path(settings.defaults).resolve()),
           str(Path(settings.hardware_config).resolve()), str(folder.resolve()), str(settings.blis))
    with _probe_lock:
        if key not in _probe_cache:
            _check_inputs(settings, settings.defaults)
            args = [str(settings.blis), "run", *server_flags(exp, settings, settings.defaults, folder),
                    "--num-requests", "1", "--seed", str(settings.seed), "--log", "info"]
            with tempfile.TemporaryDirectory(prefix="roofcal-kvprobe-") as tmp:
                proc = _call(args, tmp, settings.timeout_s, f"the KV-block probe for {exp.name}")
            if proc.returncode != 0:
                raise RoofcalError(f"BLIS failed probing KV blocks for {exp.model_id} TP{exp.tp} "
                                   f"(exit {proc.returncode}): {blis_error_line(proc.stderr)}")
            m = _AUTO_KV.search(proc.stderr)
            if not m:
                raise RoofcalError(f"BLIS printed no 'auto-calculated total-kv-blocks' for "
                                   f"{exp.model_id} TP{exp.tp}")
            _probe_cache[key] = int(m.group(1))
        auto = _probe_cache[key]
    return auto // exp.tp, f"blis-auto {auto}/tp{exp.tp}"


def coefficient_flags(alpha: Sequence[float] | None, beta: Sequence[float] | None) -> list[str]:
    """``--alpha-coeffs``/``--beta-coeffs`` (comma lists of repr floats), or none. BLIS needs both
    together, ≥ 3 alphas and ≥ 7 betas, all finite and ≥ 0."""
    if alpha is None and beta is None:
        return []
    if alpha is None or beta is None:
        raise RoofcalError("give both alpha and beta coefficients (BLIS refuses one without the other)")
    out = []
    for name, values, least in (("alpha", alpha, 3), ("beta", beta, 7)):
        values = [float(v) for v in values]
        if len(values) < least:
            raise RoofcalError(f"BLIS needs at least {least} {name} coefficients, got {len(values)}")
        for i, v in enumerate(values):
            if not math.isfinite(v) or v < 0:
                raise RoofcalError(f"{name} coefficient [{i}] must be finite and ≥ 0, got {v!r}")
        out += [f"--{name}-coeffs", ",".join(repr(v) for v in values)]
    return out


# --------------------------------------------------------------------------------------------
# one run


def replay_args(exp: Experiment, settings: BlisSettings, defaults: Path, trace_prefix: str,
                coeffs: Sequence[str] = ()) -> tuple[list[str], int, str]:
    """(argv of ``blis replay`` for ``exp``'s trace ``<trace_prefix>.yaml/.csv``, KV blocks,
    where they come from). ``coeffs``: extra ``--alpha-coeffs``/``--beta-coeffs`` flags."""
    folder = model_config_folder(exp, settings.model_configs)
    blocks, source = kv_blocks(exp, settings)
    args = [str(settings.blis), "replay", *server_flags(exp, settings, defaults, folder),
            "--max-num-seqs", str(exp.max_num_seqs), "--max-num-batched-tokens", str(exp.max_num_batched_tokens),
            "--total-kv-blocks", str(blocks), *KV_CPU_FLAGS, "--seed", str(settings.seed),
            "--trace-header", f"{trace_prefix}.yaml", "--trace-data", f"{trace_prefix}.csv", *coeffs]
    return args, blocks, source


def run_experiment(exp: Experiment, settings: BlisSettings, alpha: Sequence[float] | None = None,
                   beta: Sequence[float] | None = None, keep: str | os.PathLike | None = None,
                   defaults: str | os.PathLike | None = None) -> SimResult:
    """Replay ``exp`` in BLIS (see the module docstring) and read back its metrics.

    ``defaults``: the run's own ``defaults.yaml`` (default ``settings.defaults``); ``alpha`` /
    ``beta`` override its coefficients by flags. The run happens in a temporary folder that is
    removed afterwards; with ``keep`` it happens in ``keep/<experiment>/`` and stays (trace or
    workload spec, ``metrics.json``, ``cmd.txt``, ``stderr.txt``)."""
    from roofcal.blis.trace import write_trace
    coeffs = coefficient_flags(alpha, beta)
    defaults = Path(defaults) if defaults is not None else Path(settings.defaults)
    _check_inputs(settings, defaults)
    if settings.replay == "expansion" and exp.kind != "inference-perf":
        raise RoofcalError(f"{exp.path}: BLIS's inference_perf expansion applies to inference-perf runs only")
    if keep is not None:
        work = Path(keep) / exp.name
        work.mkdir(parents=True, exist_ok=True)
    else:
        work = Path(tempfile.mkdtemp(prefix="roofcal-blis-"))
    try:
        if settings.replay == "trace":
            write_trace(exp, work / exp.name, settings.seed)
            args, blocks, source = replay_args(exp, settings, defaults, exp.name, coeffs)
        else:
            (work / "workload_spec.yaml").write_text(expansion_spec(exp, settings.seed), encoding="utf-8")
            folder = model_config_folder(exp, settings.model_configs)
            blocks, source = kv_blocks(exp, settings)
            args = [str(settings.blis), "run", *server_flags(exp, settings, defaults, folder),
                    "--max-num-seqs", str(exp.max_num_seqs),
                    "--max-num-batched-tokens", str(exp.max_num_batched_tokens),
                    "--total-kv-blocks", str(blocks), *KV_CPU_FLAGS, "--seed", str(settings.seed),
                    "--workload-spec", "workload_spec.yaml", *coeffs]
        args += ["--metrics-path", "metrics.json"]
        command = shlex.join(args)
        (work / "cmd.txt").write_text(command + "\n", encoding="utf-8")
        t0 = time.perf_counter()
        proc = _call(args, work, settings.timeout_s, exp.name)
        wall = time.perf_counter() - t0
        (work / "stderr.txt").write_text(proc.stderr, encoding="utf-8")
        if proc.returncode != 0:
            raise RoofcalError(f"BLIS failed on {exp.name} (exit {proc.returncode}): "
                               f"{blis_error_line(proc.stderr)}")
        metrics = _read_metrics(work / "metrics.json", exp.name)
    finally:
        if keep is None:
            shutil.rmtree(work, ignore_errors=True)
    return sim_result(exp, metrics, settings, blocks, source, wall, command)


def _read_metrics(path: Path, name: str) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise RoofcalError(f"BLIS wrote no readable metrics for {name}: {err}") from None
    if not isinstance(data, dict):
        raise RoofcalError(f"BLIS metrics of {name}: expected a JSON object")
    return data


def _metric(d: Mapping, key: str, name: str) -> float:
    value = d.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RoofcalError(f"BLIS metrics of {name}: field '{key}' missing or not a number")
    return float(value)


def _frozen(values, dtype=float) -> np.ndarray:
    a = np.asarray(values, dtype=dtype)
    a.setflags(write=False)
    return a


def stage_of(arrived_at: np.ndarray, durations: Sequence[float]) -> np.ndarray:
    """Stage index of each arrival time (s): the first stage whose cumulative end is ≥ it, the last
    stage taking everything after (BLIS's own expansion, whose requests are not ours)."""
    ends = np.cumsum(np.asarray(durations, dtype=float))
    return np.minimum(np.searchsorted(ends, np.asarray(arrived_at, dtype=float), side="left"),
                      len(ends) - 1)


def scope_means(ttft_ms: np.ndarray, e2e_ms: np.ndarray, generated: np.ndarray) -> SimScope:
    """Means of one scope's completed requests: E2E, TTFT and ITL by
    :func:`roofcal.measurements.requests.itl_us`, and E2E's 1st percentile (NaN when empty)."""
    n = len(ttft_ms)
    if n == 0:
        return SimScope(math.nan, math.nan, math.nan, 0)
    return SimScope(e2e_ms=float(np.mean(e2e_ms)), ttft_ms=float(np.mean(ttft_ms)),
                    itl_ms=itl_us(np.asarray(e2e_ms), np.asarray(ttft_ms), np.asarray(generated)), completed=n,
                    e2e_p1_ms=float(np.percentile(np.asarray(e2e_ms, np.float64), 1.0)))


def sim_result(exp: Experiment, metrics: Mapping, settings: BlisSettings, kv: int, kv_source: str,
               wall_s: float, command: str) -> SimResult:
    """A :class:`SimResult` from BLIS's metrics JSON (``--metrics-path``) for ``exp``."""
    name = exp.name
    completed = int(_metric(metrics, "completed_requests", name))
    raw = metrics.get("requests") or []
    if not isinstance(raw, list):
        raise RoofcalError(f"BLIS metrics of {name}: field 'requests' is not a list")
    # completed requests only: BLIS lists timed-out ones too, with e2e_ms 0 (the measured side
    # likewise averages over successes only)
    rows = [r for r in raw if isinstance(r, dict)
            and all(isinstance(r.get(k), (int, float)) and not isinstance(r.get(k), bool) for k in _REQUEST_FIELDS)
            and r["e2e_ms"] > 0]
    cols = {k: _frozen([r[k] for r in rows]) for k in _REQUEST_FIELDS}
    if settings.replay == "trace":
        req = exp.requests(settings.seed)
        pos = {int(rid): i for i, rid in enumerate(req.request_id)}
        index = np.array([pos.get(_request_number(r.get("requestID")), -1) for r in rows], np.int64)
        if (index < 0).any():
            raise RoofcalError(f"BLIS metrics of {name}: a request id that is not in the trace")
        stage = req.stage[index]
        scored = index >= exp.warm_up
    else:
        index = np.full(len(rows), -1, np.int64)
        stage = stage_of(cols["arrived_at"], [s.duration for s in exp.stages])
        scored = np.ones(len(rows), bool)
    gen = cols["num_decode_tokens"]
    scopes = {"summary": scope_means(cols["ttft_ms"][scored], cols["e2e_ms"][scored], gen[scored])}
    for i in range(len(exp.stages)):
        key = f"stage_{i}"
        if key in exp.truth:
            sel = scored & (stage == i)
            scopes[key] = scope_means(cols["ttft_ms"][sel], cols["e2e_ms"][sel], gen[sel])
    return SimResult(
        experiment=name, replay=settings.replay, scopes=scopes, completed=completed,
        injected=int(_metric(metrics, "injected_requests", name)),
        timed_out=int(metrics.get("timed_out_requests") or 0),
        preemptions=int(_metric(metrics, "preemption_count", name)),
        sim_duration_s=_metric(metrics, "vllm_estimated_duration_s", name),
        cache_hit_rate=_metric(metrics, "cache_hit_rate", name),
        kv_blocks=int(kv), kv_source=kv_source, wall_s=float(wall_s), command=command,
        index=_frozen(index, np.int64), **cols)


def _request_number(rid) -> int:
    """``request_<n>`` (BLIS's id of trace request n) → n; -1 when it is not one."""
    if isinstance(rid, str) and rid.startswith("request_") and rid[8:].isdigit():
        return int(rid[8:])
    return -1


# --------------------------------------------------------------------------------------------
# many runs


def _per_run(value, name: str):
    return value.get(name) if isinstance(value, Mapping) else value


def run_experiments(exps: Sequence[Experiment], settings: BlisSettings,
                    alpha: "Sequence[float] | Mapping[str, Sequence[float]] | None" = None,
                    beta: "Sequence[float] | Mapping[str, Sequence[float]] | None" = None,
                    progress: bool = True, keep: str | os.PathLike | None = None,
                    defaults: "os.PathLike | Mapping[str, os.PathLike] | None" = None) -> list[SimResult]:
    """:func:`run_experiment` on every experiment, up to ``settings.workers`` BLIS processes at once;
    results in input order. ``alpha``, ``beta`` and ``defaults`` are one value for every run or
    {experiment name: value}. With ``progress`` a line per finished run goes to stderr. The
    first failure cancels the runs not yet started and is raised."""
    exps = list(exps)
    for e in exps:                                       # refuse bad coefficients before any run
        coefficient_flags(_per_run(alpha, e.name), _per_run(beta, e.name))
    if not exps:
        return []
    results: list[SimResult | None] = [None] * len(exps)
    with ThreadPoolExecutor(max_workers=min(int(settings.workers), len(exps))) as pool:
        futures = {pool.submit(run_experiment, e, settings, _per_run(alpha, e.name), _per_run(beta, e.name),
                               keep, _per_run(defaults, e.name)): i
                   for i, e in enumerate(exps)}
        try:
            for done, fut in enumerate(as_completed(futures), 1):
                r = fut.result()
                results[futures[fut]] = r
                if progress:
                    print(f"roofcal: [{done}/{len(exps)}] {r.experiment}: BLIS {r.wall_s:.1f} s, "
                          f"simulated {r.sim_duration_s:.0f} s ({r.replay})", file=sys.stderr, flush=True)
        except BaseException:
            for f in futures:
                f.cancel()
            raise
    return results  # type: ignore[return-value]

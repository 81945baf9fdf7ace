"""Replay a measured serving experiment in the real BLIS simulator (``blis run``).

In: an :class:`~roofcal.measurements.workload.Experiment`, the BLIS binary, its ``defaults.yaml``,
``hardware_config.json`` and model-config folders (:class:`BlisSettings`), optionally α/β
coefficients to override the defaults' ``trained_physics_coefficients``.
Out: :class:`SimResult` — simulated mean E2E / TTFT / ITL per scope, the simulated duration, and
per-request arrays for calibration.

How a run is set up (facts from inference-sim's sim-to-real validation adapter, as restated by
``../shared/tools/blis_experiment.py``; this code is roofcal's own):

* **Workload.** A BLIS v2 spec with an ``inference_perf:`` block: the profile's stages (rate req/s,
  duration s) and shared-prefix generator, ``num_requests`` = Σ round(rate · duration).
  ``arrivals="closed"`` runs that spec as written: BLIS expands it into closed-loop sessions, each
  sending its next round only after the previous reply plus a think time, which stretches the real
  1200 s of load (e.g. to ≈ 1570 s for the Llama-2-7B codegen run) and so lowers the load.
  ``arrivals="open"`` (the default) matches what inference-perf did — open-loop Poisson arrivals
  at each stage's rate (its ``load_summary.schedule_delay`` averages 0.4 ms; the real 7B codegen
  run lasted 1206 s): the spec is expanded by ``blis convert inference-perf`` and every client gets
  ``closed_loop: false``; ``num_requests`` is kept.
* **Prompts.** inference-perf's shared-prefix generator builds a fixed *pool* of prompts — one
  per simulated user, ``num_unique_system_prompts × num_users_per_system_prompt`` of them, each a
  system prompt plus that user's question — and cycles through it (kubernetes-sigs/inference-perf,
  ``SharedPrefixDataGenerator``), so after a prompt's first use vLLM's prefix cache holds all of
  it but the last partial block. BLIS's expansion instead draws a fresh question for every
  request and shares only the system prompt (its cache hit rate on the 7B codegen run is 0.12
  of all tokens, i.e. ≈ 96 of 566 prompt tokens), so it prefills ≈ 470 tokens per request the
  real server did not compute. ``prompts="pool"`` (the default) replays the pool: each
  converted client (one per user) is its own prefix group whose prefix is system prompt +
  question, followed by the prompt's remaining tokens as measured (mean ``prompt_len`` − pool
  prompt, the chat template; at least 1). ``prompts="fresh"`` keeps BLIS's expansion.
* **Server.** ``--max-num-seqs`` / ``--max-num-batched-tokens`` from ``exp-config.yaml``;
  ``--hardware H100``; no CPU KV tier (``--kv-cpu-blocks 0``, which gives the same metrics as the
  8 GiB tier on these runs and is ≈ 4× faster); ``--latency-model trained-physics``; seed 42.
* **GPU KV blocks** (:func:`kv_blocks`): the count vLLM logged where known, else BLIS's own
  auto-calculated value divided by TP (BLIS counts the memory of all TP GPUs against one GPU's KV
  size, ≈ TP × what vLLM reports).
* **Per-stage metrics**: requests are assigned to stages by arrival time, each stage ending at the
  cumulative duration and the last stage taking the rest. The run's ("summary") means are BLIS's
  own aggregates (``e2e_mean_ms``, ``ttft_mean_ms``, ``itl_mean_ms``); a stage's are the means of
  its requests' ``e2e_ms``, ``ttft_ms``, ``itl_ms``.
"""

from __future__ import annotations

import json
import math
import os
import re
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
import yaml

from roofcal.blis import ARRIVALS, PROMPTS       # replay modes (see the module docstring)
from roofcal.errors import RoofcalError
from roofcal.measurements.workload import Experiment

#: environment variable naming the BLIS binary when ``--blis`` is not given
BLIS_ENV = "ROOFCAL_BLIS"
#: the GPU of every measured run (an entry of ``hardware_config.json``)
GPU = "H100"
#: BLIS's CPU-tier flags: tier off; threshold and bandwidth as the validation adapter passes them
KV_CPU_FLAGS = ("--kv-cpu-blocks", "0", "--kv-offload-threshold", "0.9", "--kv-transfer-bandwidth", "0.2")

#: GPU KV blocks vLLM reported, by (lower-cased model id, TP). Llama-2-7B TP1: 7463 blocks, from
#: vLLM's log of these runs' server configuration (the log is not published; the value is recorded
#: in BLIS's testdata/trained_physics_iter29.json, inference-sim/inference-sim, and used by
#: ../shared/tools/blis_experiment.py).
KNOWN_KV_BLOCKS: Mapping[tuple[str, int], int] = {
    ("meta-llama/llama-2-7b-hf", 1): 7463,
}

_AUTO_KV = re.compile(r"auto-calculated total-kv-blocks=(\d+)")
_LOG_MSG = re.compile(r'msg="((?:[^"\\]|\\.)*)"')
_REQUEST_FIELDS = ("arrived_at", "ttft_ms", "itl_ms", "e2e_ms", "num_prefill_tokens", "num_decode_tokens")


@dataclass(frozen=True)
class BlisSettings:
    """Where BLIS and its inputs are, and how to run it.

    ``model_configs`` are folders searched (in order) for ``<model>/config.json``; ``timeout_s`` is
    per BLIS process; ``workers`` BLIS processes run at once in :func:`run_experiments`.
    """

    blis: Path
    defaults: Path
    hardware_config: Path
    model_configs: tuple[Path, ...]
    arrivals: str = "open"
    timeout_s: float = 300
    seed: int = 42
    workers: int = 2
    prompts: str = "pool"
    kv_blocks: str = "blis"          # KV blocks when vLLM's count is not known: "blis" (auto / TP) or "capacity"

    def __post_init__(self):
        if self.arrivals not in ARRIVALS:
            raise RoofcalError(f"arrivals must be one of {', '.join(ARRIVALS)}, got {self.arrivals!r}")
        if self.prompts not in PROMPTS:
            raise RoofcalError(f"prompts must be one of {', '.join(PROMPTS)}, got {self.prompts!r}")
        if self.kv_blocks not in ("blis", "capacity"):
            raise RoofcalError(f"kv_blocks must be 'blis' or 'capacity', got {self.kv_blocks!r}")

    @property
    def replay(self) -> str:
        """How the runs are replayed, in words: e.g. ``open-loop arrivals, pool prompts``."""
        return f"{self.arrivals}-loop arrivals, {self.prompts} prompts"
        if not (self.timeout_s > 0):
            raise RoofcalError(f"BLIS timeout must be positive, got {self.timeout_s}")
        if int(self.workers) < 1:
            raise RoofcalError(f"workers must be ≥ 1, got {self.workers}")


@dataclass(frozen=True)
class SimScope:
    """Simulated means over one scope (the run, or one stage's arrivals), in ms."""

    e2e_ms: float
    ttft_ms: float
    itl_ms: float
    completed: int


@dataclass(frozen=True, eq=False)
class SimResult:
    """One BLIS replay of one experiment.

    The per-request arrays (read-only, one entry per completed request, in BLIS's order) are
    ``arrived_at`` (s from the start), ``ttft_ms``, ``itl_ms`` (the request's mean gap between
    output tokens), ``e2e_ms``, ``num_prefill_tokens`` (prompt tokens) and ``num_decode_tokens``
    (output tokens).
    """

    experiment: str
    arrivals: str
    scopes: dict[str, SimScope]       # "summary", "stage_0", ...
    completed: int
    injected: int
    timed_out: int
    preemptions: int
    sim_duration_s: float             # BLIS's vllm_estimated_duration_s
    cache_hit_rate: float             # prefix-cache hit rate over the run, 0..1
    kv_blocks: int
    kv_source: str
    wall_s: float                     # wall-clock time of the BLIS process
    arrived_at: np.ndarray = field(repr=False)
    ttft_ms: np.ndarray = field(repr=False)
    itl_ms: np.ndarray = field(repr=False)
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


# --------------------------------------------------------------------------------------------
# workload spec


def base_spec(exp: Experiment, seed: int = 42) -> dict:
    """The v2 workload spec with an ``inference_perf:`` block, as a dict (closed-loop expansion)."""
    stages = []
    for i, s in enumerate(exp.stages):
        if s.duration != int(s.duration):
            raise RoofcalError(f"{exp.path / 'profile.yaml'}: field 'load.stages.{i}.duration': BLIS "
                               f"takes whole seconds, got {s.duration}")
        stages.append({"rate": float(s.rate), "duration": int(s.duration)})
    p = exp.prefix
    return {
        "version": "2",
        "seed": int(seed),
        "num_requests": exp.num_requests,
        "inference_perf": {
            "stages": stages,
            "shared_prefix": {
                "num_unique_system_prompts": p.num_unique_system_prompts,
                "num_users_per_system_prompt": p.num_users_per_system_prompt,
                "system_prompt_len": p.system_prompt_len,
                "question_len": p.question_len,
                "output_len": p.output_len,
                "enable_multi_turn_chat": p.enable_multi_turn_chat,
            },
        },
    }


def workload_spec(exp: Experiment, arrivals: str = "open", blis: str | os.PathLike | None = None,
                  seed: int = 42, timeout_s: float = 60, prompts: str = "fresh") -> str:
    """The text of the BLIS workload spec for ``exp``.

    ``"closed"`` with ``"fresh"`` prompts: the ``inference_perf`` spec as JSON (valid YAML).
    Otherwise that spec expanded by ``blis convert inference-perf`` (so ``blis`` is required), as
    YAML with ``num_requests`` kept: ``"open"`` sets ``closed_loop: false`` on every client;
    ``"pool"`` makes each client replay its own prompt (:func:`_pool_prompt`).
    """
    if arrivals not in ARRIVALS:
        raise RoofcalError(f"arrivals must be one of {', '.join(ARRIVALS)}, got {arrivals!r}")
    if prompts not in PROMPTS:
        raise RoofcalError(f"prompts must be one of {', '.join(PROMPTS)}, got {prompts!r}")
    spec = base_spec(exp, seed)
    text = json.dumps(spec, indent=1) + "\n"
    if arrivals == "closed" and prompts == "fresh":
        return text
    if blis is None:
        raise RoofcalError("open-loop arrivals need the BLIS binary (blis convert inference-perf)")
    with tempfile.TemporaryDirectory(prefix="roofcal-spec-") as tmp:
        src = Path(tmp) / "inference_perf_spec.yaml"
        src.write_text(text, encoding="utf-8")
        proc = _call([str(blis), "convert", "inference-perf", "--spec", str(src)], tmp, timeout_s,
                     f"blis convert inference-perf on {exp.name}")
    if proc.returncode != 0:
        raise RoofcalError(f"blis convert inference-perf failed on {exp.name} (exit {proc.returncode}): "
                           f"{blis_error_line(proc.stderr)}")
    try:
        converted = yaml.safe_load(proc.stdout)
    except yaml.YAMLError:
        converted = None
    clients = converted.get("clients") if isinstance(converted, dict) else None
    if not isinstance(clients, list) or not all(isinstance(c, dict) for c in clients):
        raise RoofcalError(f"blis convert inference-perf on {exp.name}: output has no list of 'clients'")
    if arrivals == "open":
        clients = [_open_loop(c) for c in clients]
    if prompts == "pool":
        clients = [_pool_prompt(c, exp) for c in clients]
    converted["clients"] = clients
    converted["num_requests"] = spec["num_requests"]
    return yaml.safe_dump(converted, sort_keys=False, default_flow_style=False, allow_unicode=True)


def _pool_prompt(client: dict, exp: Experiment) -> dict:
    """``client`` (one simulated user) replaying one fixed prompt: its own prefix group holding
    system prompt + question, then the rest of the measured mean prompt (≥ 1 token)."""
    out = dict(client)
    out["prefix_group"] = str(client.get("id"))
    out["prefix_length"] = exp.pool_prompt_tokens
    out["input_distribution"] = {"type": "constant",
                                 "params": {"value": exp.prompt_tokens - exp.pool_prompt_tokens}}
    return out


def _open_loop(client: dict) -> dict:
    """``client`` with ``closed_loop: false`` (placed after its ``id``)."""
    out = {k: v for k, v in client.items() if k == "id"}
    out["closed_loop"] = False
    out.update((k, v) for k, v in client.items() if k not in ("id", "closed_loop"))
    return out


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


def _paths(settings: BlisSettings) -> None:
    """Refuse missing input files up front, with the file named."""
    if not Path(settings.defaults).is_file():
        raise RoofcalError(f"{settings.defaults}: no such BLIS defaults file")
    if not Path(settings.hardware_config).is_file():
        raise RoofcalError(f"{settings.hardware_config}: no such BLIS hardware config file")


def _common_flags(exp: Experiment, settings: BlisSettings, folder: Path) -> list[str]:
    return ["--model", exp.model_id, "--tp", str(exp.tp), "--hardware", GPU,
            "--latency-model", "trained-physics",
            "--defaults-filepath", str(Path(settings.defaults).resolve()),
            "--model-config-folder", str(folder.resolve()),
            "--hardware-config", str(Path(settings.hardware_config).resolve())]


_probe_cache: dict[tuple, int] = {}
_probe_lock = threading.Lock()


def kv_blocks(exp: Experiment, settings: BlisSettings) -> tuple[int, str]:
    """GPU KV blocks for ``exp`` and where the number comes from: :data:`KNOWN_KV_BLOCKS`, else
    (``settings.kv_blocks == "capacity"``) what vLLM would allocate on an H100
    (:func:`roofcal.physics.capacity.capacity` at the server's limits), else (the default, as the
    reference runner does) BLIS's auto-calculated count (probed with a one-request run, ``--log
    info``) divided by TP.
    Probes are cached in memory per (model, TP, defaults, hardware config, model-config folder)."""
    known = KNOWN_KV_BLOCKS.get((exp.model_id, exp.tp))
    if known is not None:
        return known, "vllm-log"
    folder = model_config_folder(exp, settings.model_configs)
    if settings.kv_blocks == "capacity":
        from roofcal.physics.capacity import capacity
        from roofcal.physics.config import load_model
        from roofcal.physics.hardware import load_gpu
        cap = capacity(load_model(folder / "config.json"), load_gpu("h100_sxm"), int(exp.tp),
                       max_num_batched_tokens=exp.max_num_batched_tokens, max_num_seqs=exp.max_num_seqs)
        return cap.kv_blocks, "roofcal capacity"
    key = (exp.model_id, exp.tp, str(Path(settings.defaults).resolve()),
           str(Path(settings.hardware_config).resolve()), str(folder.resolve()), str(settings.blis))
    with _probe_lock:
        if key not in _probe_cache:
            _paths(settings)
            args = [str(settings.blis), "run", *_common_flags(exp, settings, folder),
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


def run_experiment(exp: Experiment, settings: BlisSettings, alpha: Sequence[float] | None = None,
                   beta: Sequence[float] | None = None, keep: str | os.PathLike | None = None) -> SimResult:
    """Replay ``exp`` in BLIS (see the module docstring) and read back its metrics.

    The run happens in a temporary folder that is removed afterwards; with ``keep`` it happens in
    ``keep/<experiment>/`` and stays (``workload_spec.yaml``, ``metrics.json``, ``cmd.txt``,
    ``stderr.txt``). ``alpha``/``beta`` override the defaults' coefficients.
    """
    coeffs = coefficient_flags(alpha, beta)
    _paths(settings)
    folder = model_config_folder(exp, settings.model_configs)
    blocks, source = kv_blocks(exp, settings)
    spec = workload_spec(exp, settings.arrivals, settings.blis, settings.seed, settings.timeout_s,
                         settings.prompts)
    if keep is not None:
        work = Path(keep) / exp.name
        work.mkdir(parents=True, exist_ok=True)
    else:
        work = Path(tempfile.mkdtemp(prefix="roofcal-blis-"))
    try:
        (work / "workload_spec.yaml").write_text(spec, encoding="utf-8")
        args = [str(settings.blis), "run", *_common_flags(exp, settings, folder),
                "--max-num-seqs", str(exp.max_num_seqs),
                "--max-num-batched-tokens", str(exp.max_num_batched_tokens),
                "--total-kv-blocks", str(blocks), *KV_CPU_FLAGS, "--seed", str(settings.seed),
                "--workload-spec", "workload_spec.yaml", "--metrics-path", "metrics.json",
                "--log", "info", *coeffs]
        (work / "cmd.txt").write_text(" ".join(args) + "\n", encoding="utf-8")
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
    return sim_result(exp, metrics, settings.arrivals, blocks, source, wall)


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


def _frozen(values) -> np.ndarray:
    a = np.asarray(values, dtype=float)
    a.setflags(write=False)
    return a


def stage_of(arrived_at: np.ndarray, durations: Sequence[float]) -> np.ndarray:
    """Stage index of each arrival time (s): the first stage whose cumulative end is ≥ it, the last
    stage taking everything after."""
    ends = np.cumsum(np.asarray(durations, dtype=float))
    return np.minimum(np.searchsorted(ends, np.asarray(arrived_at, dtype=float), side="left"),
                      len(ends) - 1)


def sim_result(exp: Experiment, metrics: Mapping, arrivals: str, kv: int, kv_source: str,
               wall_s: float) -> SimResult:
    """A :class:`SimResult` from BLIS's metrics JSON (``--metrics-path``) for ``exp``."""
    name = exp.name
    completed = int(_metric(metrics, "completed_requests", name))
    nan = float("nan")
    summary = SimScope(
        e2e_ms=_metric(metrics, "e2e_mean_ms", name) if completed else nan,
        ttft_ms=_metric(metrics, "ttft_mean_ms", name) if completed else nan,
        itl_ms=_metric(metrics, "itl_mean_ms", name) if completed else nan,
        completed=completed)
    raw = metrics.get("requests") or []
    if not isinstance(raw, list):
        raise RoofcalError(f"BLIS metrics of {name}: field 'requests' is not a list")
    rows = [r for r in raw if isinstance(r, dict)
            and all(isinstance(r.get(k), (int, float)) and not isinstance(r.get(k), bool)
                    for k in _REQUEST_FIELDS)]
    cols = {k: _frozen([r[k] for r in rows]) for k in _REQUEST_FIELDS}
    scopes = {"summary": summary}
    which = stage_of(cols["arrived_at"], [s.duration for s in exp.stages])
    for i in range(len(exp.stages)):
        sel = which == i
        n = int(sel.sum())
        mean = (lambda a: float(a[sel].mean())) if n else (lambda a: nan)
        scopes[f"stage_{i}"] = SimScope(e2e_ms=mean(cols["e2e_ms"]), ttft_ms=mean(cols["ttft_ms"]),
                                        itl_ms=mean(cols["itl_ms"]), completed=n)
    return SimResult(
        experiment=name, arrivals=arrivals, scopes=scopes, completed=completed,
        injected=int(_metric(metrics, "injected_requests", name)),
        timed_out=int(metrics.get("timed_out_requests") or 0),
        preemptions=int(_metric(metrics, "preemption_count", name)),
        sim_duration_s=_metric(metrics, "vllm_estimated_duration_s", name),
        cache_hit_rate=_metric(metrics, "cache_hit_rate", name),
        kv_blocks=int(kv), kv_source=kv_source, wall_s=float(wall_s), **cols)


# --------------------------------------------------------------------------------------------
# many runs


def run_experiments(exps: Sequence[Experiment], settings: BlisSettings,
                    alpha: "Sequence[float] | Mapping[str, Sequence[float]] | None" = None,
                    beta: Sequence[float] | None = None,
                    progress: bool = True, keep: str | os.PathLike | None = None) -> list[SimResult]:
    """:func:`run_experiment` on every experiment, up to ``settings.workers`` BLIS processes at once;
    results in input order. ``alpha`` is one set for every run or {experiment name: alphas}. With
    ``progress`` a line per finished run goes to stderr. The first failure cancels the runs not
    yet started and is raised."""
    exps = list(exps)
    alphas = {e.name: (alpha[e.name] if isinstance(alpha, Mapping) else alpha) for e in exps}
    for a in alphas.values() or [alpha]:
        coefficient_flags(a, beta)                      # refuse bad coefficients before any run
    if not exps:
        return []
    results: list[SimResult | None] = [None] * len(exps)
    with ThreadPoolExecutor(max_workers=min(int(settings.workers), len(exps))) as pool:
        futures = {pool.submit(run_experiment, e, settings, alphas[e.name], beta, keep): i
                   for i, e in enumerate(exps)}
        try:
            for done, fut in enumerate(as_completed(futures), 1):
                r = fut.result()
                results[futures[fut]] = r
                if progress:
                    print(f"roofcal: [{done}/{len(exps)}] {r.experiment}: BLIS {r.wall_s:.1f} s, "
                          f"simulated {r.sim_duration_s:.0f} s ({r.arrivals} arrivals)",
                          file=sys.stderr, flush=True)
        except BaseException:
            for f in futures:
                f.cancel()
            raise
    return results  # type: ignore[return-value]

"""Real vLLM serving experiments: what the server was, what load it got, and what was measured.

Two kinds of experiment, one :class:`Experiment`:

* an **inference-perf run** — a folder in the layout of inference-sim/training's
  ``default_args/<name>/`` (read here)::

      exp-config.yaml                        the vLLM server: model, tensor_parallelism,
                                             max_model_len, max_num_batched_tokens, max_num_seqs
      results/config.yaml                    the configuration inference-perf *actually ran*
      results/summary_lifecycle_metrics.json inference-perf's measurements of the run (seconds)
      results/stage_<i>_lifecycle_metrics.json  one per load stage (required for every stage)

  (``profile.yaml``, the profile as *requested*, is not read: the build that made the bundled
  runs ignored several of its keys — ``../shared/workload/README.md``);
* a **recorded trace** — a TraceV2 with a server description (:mod:`.tracev2`).

What inference-perf sent, from ``results/config.yaml`` and inference-perf's source at the build
of these runs (facts restated in ``../shared/workload/README.md``; the code is roofcal's own):

* **open-loop arrivals**: stage *i* sends ⌊rate · duration⌋ requests at exponential gaps rescaled
  to sum to the stage's duration (its ``ConstantLoadTimer``); the next stage starts once the
  earlier one has drained, ≈ 2 s after its last reply (:data:`STAGE_PAUSE_S`; the drain is the
  stage's measured longest request);
* **a pool of prompts**: ``num_groups × num_prompts_per_group`` prompts, each a group's system
  prompt and its own question; request *n* of a stage uses pool prompt *n* mod pool size, so
  after its first use vLLM's prefix cache holds a prompt but its last partial block. Prompt
  lengths as measured (the distribution of ``successes.prompt_len``: pool prompt *j* of *P* takes
  its quantile (j + ½)/P; template and re-tokenisation included);
* **output tokens**: with ``server.ignore_eos`` vLLM generates exactly ``output_len`` tokens. The
  summary's ``output_len`` is the client re-tokenising the streamed text (195 of 247 on
  Llama-2-7B codegen), not the number generated;
* **client timeout**: ``load.request_timeout``, or when unset 300 s — aiohttp's default total
  timeout, which the failures of the three overloaded runs show (their latencies: 300.0–301.0 s).

Ground truth: mean E2E, mean TTFT, and ITL = (mean E2E − mean TTFT) / (generated − 1) — the
generated count, not the client's; a run whose failure rate is ≥ 10 % is an overload run
(reported, not scored — inference-sim's validation rule).

Reading is strict: a missing file, a missing or ill-typed field, an unknown field in
``data.shared_prefix`` or a stage, a load that is not ``constant``, or a setting roofcal does not
model (``data.path``, a multi-turn chat, …) raises a :class:`~roofcal.errors.RoofcalError`
naming the file and the dotted field.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from roofcal.errors import RoofcalError, where
from roofcal.io import read_json_object, read_yaml
from roofcal.measurements.requests import Requests

#: failure rate (failures / requests) at and above which a run counts as overload
OVERLOAD_FAILURE_RATE = 0.10
#: the client's timeout when ``load.request_timeout`` is unset: aiohttp's default total timeout
DEFAULT_TIMEOUT_S = 300.0
#: idle time between a stage's last reply and the next stage's start (inference-perf, measured)
STAGE_PAUSE_S = 2.0
#: the GPU of the bundled serving runs (roofcal's datasheet name)
DEFAULT_GPU = "h100_sxm"

EXP_CONFIG = "exp-config.yaml"
RESULTS = "results"
RAN_CONFIG = "config.yaml"
SUMMARY_FILE = "summary_lifecycle_metrics.json"

#: ``exp-config.yaml`` integer fields (besides ``model``); other keys (``app``) are ignored
SERVER_FIELDS = ("tensor_parallelism", "max_model_len", "max_num_batched_tokens", "max_num_seqs")
#: ``results/config.yaml`` ``data.shared_prefix``: these integers, and nothing else set
POOL_FIELDS = ("num_groups", "num_prompts_per_group", "system_prompt_len", "question_len", "output_len")
#: keys of ``data.shared_prefix`` other builds write that roofcal accepts only when unset (null,
#: false or 0): each would change the load
INERT_POOL_FIELDS = ("enable_multi_turn_chat", "num_unique_system_prompts", "num_users_per_system_prompt")
STAGE_FIELDS = ("rate", "duration")
#: ``data`` keys that would replace the shared-prefix generator; must be unset
INERT_DATA_FIELDS = ("path", "input_distribution", "output_distribution")


@dataclass(frozen=True)
class Server:
    """The vLLM server of a run. ``model``: HF id or a bundled name / config path; ``gpu``:
    roofcal's datasheet name; ``kv_blocks``: GPU KV blocks it had (None: not known)."""

    model: str
    tp: int
    max_num_batched_tokens: int    # tokens per step (chunked-prefill budget)
    max_num_seqs: int
    max_model_len: int | None = None
    gpu: str = DEFAULT_GPU
    kv_blocks: int | None = None


@dataclass(frozen=True)
class Stage:
    """One stage of load: ``rate`` requests/s for ``duration`` s (``requests`` of them)."""

    rate: float        # requests/s
    duration: float    # s
    requests: int = -1  # requests sent; -1: ⌊rate · duration⌋ (inference-perf's count)

    def __post_init__(self):
        if self.requests < 0:
            object.__setattr__(self, "requests", int(self.rate * self.duration))


@dataclass(frozen=True)
class PromptPool:
    """inference-perf's shared-prefix generator as it ran: ``groups`` system prompts, each with
    ``prompts_per_group`` questions; lengths in tokens (before the chat template)."""

    groups: int
    prompts_per_group: int
    system_prompt_len: int
    question_len: int
    output_len: int

    @property
    def size(self) -> int:
        """Prompts in the pool."""
        return self.groups * self.prompts_per_group


@dataclass(frozen=True)
class Measured:
    """What was measured over one scope (the run or one stage), in ms.

    ``itl_ms`` = (``e2e_ms`` − ``ttft_ms``) / (``generated`` − 1), with ``generated`` the tokens
    the server generated per request; NaN when that is ≤ 1 or nothing succeeded (then every
    latency is NaN). ``client_output_len``: the client's own count of output tokens (inference-perf
    re-tokenises the streamed text); ``e2e_max_ms``: the longest successful request;
    ``e2e_p1_ms``: the 1st percentile of the successful requests' E2E — the fastest requests, which
    on a run that overloads are those served before its queue built (NaN when not reported);
    ``token_gap_p50_ms``: the median gap between two generated tokens (see :func:`token_gap_ms`),
    a step of the server, where ``itl_ms`` also carries the stalls of preempted requests.
    """

    e2e_ms: float        # mean request latency, ms
    ttft_ms: float       # mean time to first token, ms
    itl_ms: float        # ms per generated token after the first
    generated: float     # tokens generated per request (mean)
    n_success: int
    n_failures: int
    prompt_len: float = math.nan          # mean prompt tokens of the successful requests
    client_output_len: float = math.nan   # the client's mean output_len
    e2e_max_ms: float = math.nan
    token_gap_p50_ms: float = math.nan    # median gap between generated tokens, ms
    e2e_p1_ms: float = math.nan           # 1st percentile of the successful requests' E2E, ms

    @property
    def failure_rate(self) -> float:
        """failures / (successes + failures); 0 for a scope without requests."""
        total = self.n_success + self.n_failures
        return self.n_failures / total if total else 0.0


@dataclass(frozen=True, eq=False)
class Experiment:
    """One measured serving run: server, load, and ground truth per scope.

    ``kind``: ``"inference-perf"`` (its schedule is rebuilt from the run's facts, seeded:
    :meth:`requests`) or ``"trace"`` (``recorded`` holds the requests as sent). ``truth`` has
    ``"summary"`` and, for inference-perf runs, ``"stage_<i>"``."""

    name: str
    path: Path
    kind: str
    server: Server
    stages: tuple[Stage, ...]
    truth: dict[str, Measured]
    pool: PromptPool | None = None
    prompt_quantiles: tuple[tuple[float, float], ...] = ()   # (quantile, tokens) of prompt lengths
    timeout_s: float = 0.0                                    # client timeout (0: none)
    stage_starts_s: tuple[float, ...] = (0.0,)                # when each stage began
    recorded: Requests | None = None
    warm_up: int = 0                                          # leading requests not scored

    # ------------------------------------------------------------ the server, for short
    @property
    def model(self) -> str:
        return self.server.model

    @property
    def model_id(self) -> str:
        """The lower-cased HF id, as BLIS's ``--model`` takes it."""
        return self.server.model.lower()

    @property
    def tp(self) -> int:
        return self.server.tp

    @property
    def max_model_len(self) -> int | None:
        return self.server.max_model_len

    @property
    def max_num_batched_tokens(self) -> int:
        return self.server.max_num_batched_tokens

    @property
    def max_num_seqs(self) -> int:
        return self.server.max_num_seqs

    # ------------------------------------------------------------ load and truth
    @property
    def overload(self) -> bool:
        """True if the run's failure rate is ≥ 10 % (reported, not scored)."""
        return self.truth["summary"].failure_rate >= OVERLOAD_FAILURE_RATE

    @property
    def scopes(self) -> tuple[str, ...]:
        """The scopes of :attr:`truth`, in order: ``("summary", "stage_0", …)``."""
        return tuple(self.truth)

    @property
    def num_requests(self) -> int:
        """Requests the load sends."""
        return sum(s.requests for s in self.stages)

    def requests(self, seed: int = 42) -> Requests:
        """The requests as the client sent them: the recorded ones, or inference-perf's schedule
        rebuilt with ``seed`` (:func:`inference_perf_requests`)."""
        if self.recorded is not None:
            return self.recorded
        return inference_perf_requests(self, seed)


# --------------------------------------------------------------------------------------------
# inference-perf's schedule


def experiment_seed(name: str, seed: int) -> int:
    """A run's own seed: ``seed`` mixed with a CRC-32 of its name (stable across machines)."""
    return (int(seed) * 1_000_003 + zlib.crc32(name.encode("utf-8"))) % (2 ** 32)


def pool_prompt_tokens(exp: Experiment) -> np.ndarray:
    """Tokens of each pool prompt as the server saw it: the measured prompt-length distribution,
    prompt *j* of *P* at quantile (j + ½)/P (the pool is cycled evenly, so the requests' lengths
    are the pool's); the pool's nominal length (system + question + 1) when none was reported."""
    p = exp.pool
    q = (np.arange(p.size) + 0.5) / p.size
    if exp.prompt_quantiles:
        qs, vs = (np.array(x, np.float64) for x in zip(*exp.prompt_quantiles))
        return np.maximum(np.rint(np.interp(q, qs, vs)).astype(np.int64), 2)
    return np.full(p.size, p.system_prompt_len + p.question_len + 1, np.int64)


def inference_perf_requests(exp: Experiment, seed: int = 42) -> Requests:
    """inference-perf's schedule for ``exp`` (module docstring), reproducible from ``seed``:
    per stage ⌊rate · duration⌋ sends at exponential gaps rescaled to the stage's duration; pool
    prompt *n* mod pool size, each its own prefix group holding all of it but its last token;
    ``output_len`` generated tokens; the client's timeout as deadline."""
    if exp.pool is None:
        raise RoofcalError(f"{exp.path}: not an inference-perf run")
    rng = np.random.default_rng(experiment_seed(exp.name, seed))
    lengths = pool_prompt_tokens(exp)
    cols: dict[str, list] = {k: [] for k in ("send_us", "pool", "stage")}
    for i, (stage, start) in enumerate(zip(exp.stages, exp.stage_starts_s)):
        n = stage.requests
        gaps = rng.exponential(1.0 / stage.rate, n)
        t = start + np.cumsum(gaps) * (stage.duration / gaps.sum())
        cols["send_us"].append(np.rint(t * 1e6).astype(np.int64))
        cols["pool"].append(np.arange(n) % exp.pool.size)
        cols["stage"].append(np.full(n, i))
    send = np.concatenate(cols["send_us"])
    pool = np.concatenate(cols["pool"])
    stage = np.concatenate(cols["stage"])
    prompt = lengths[pool]
    deadline = send + int(round(exp.timeout_s * 1e6)) if exp.timeout_s > 0 else np.zeros_like(send)
    width = len(str(exp.pool.size - 1))
    return Requests(request_id=np.arange(len(send)), send_us=send,
                    prefix_group=np.array([f"prompt-{j:0{width}d}" for j in pool], dtype=object),
                    prefix_len=prompt - 1, suffix_len=np.ones(len(send), np.int64),
                    output_tokens=np.full(len(send), exp.pool.output_len), deadline_us=deadline,
                    stage=stage)


# --------------------------------------------------------------------------------------------
# strict field access


def _get(obj: Mapping[str, Any], key: str, path: Path, prefix: str) -> Any:
    field = f"{prefix}{key}"
    if not isinstance(obj, Mapping):
        raise RoofcalError(f"{where(path, prefix.rstrip('.') or key)}: expected a mapping")
    if key not in obj or obj[key] is None:
        raise RoofcalError(f"{where(path, field)}: missing")
    return obj[key]


def _mapping(obj, key, path, prefix="") -> Mapping[str, Any]:
    value = _get(obj, key, path, prefix)
    if not isinstance(value, Mapping):
        raise RoofcalError(f"{where(path, prefix + key)}: expected a mapping, got {value!r}")
    return value


def _number(obj, key, path, prefix="", positive=False) -> float:
    value = _get(obj, key, path, prefix)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RoofcalError(f"{where(path, prefix + key)}: expected a number, got {value!r}")
    if positive and value <= 0:
        raise RoofcalError(f"{where(path, prefix + key)}: must be positive, got {value!r}")
    return float(value)


def _int(obj, key, path, prefix="", minimum=1) -> int:
    value = _get(obj, key, path, prefix)
    if isinstance(value, bool) or not isinstance(value, int):
        raise RoofcalError(f"{where(path, prefix + key)}: expected an integer, got {value!r}")
    if value < minimum:
        raise RoofcalError(f"{where(path, prefix + key)}: must be ≥ {minimum}, got {value}")
    return value


def _flag(obj, key, path, prefix="") -> bool:
    value = _get(obj, key, path, prefix)
    if not isinstance(value, bool):
        raise RoofcalError(f"{where(path, prefix + key)}: expected true or false, got {value!r}")
    return value


def _only(obj: Mapping[str, Any], known: Iterable[str], path: Path, prefix: str) -> None:
    known = tuple(known)
    for key in obj:
        if key not in known:
            raise RoofcalError(f"{where(path, prefix + str(key))}: unknown field "
                               f"(known: {', '.join(known)})")


def _unset(obj: Mapping[str, Any], keys: Iterable[str], path: Path, prefix: str) -> None:
    for key in keys:
        value = obj.get(key)
        if value is not None and value is not False and value != 0:
            raise RoofcalError(f"{where(path, prefix + key)}: set to {value!r}, which roofcal does "
                               "not model (it must be unset)")


# --------------------------------------------------------------------------------------------
# the files


def read_server(path: Path) -> Server:
    """``exp-config.yaml`` as a :class:`Server` (on an H100, as the bundled runs were)."""
    cfg = read_yaml(path, "experiment config (exp-config.yaml)")
    if not isinstance(cfg, Mapping):
        raise RoofcalError(f"{path}: expected a mapping of fields")
    model = _get(cfg, "model", path, "")
    if not isinstance(model, str) or not model.strip():
        raise RoofcalError(f"{where(path, 'model')}: expected a HuggingFace model id, got {model!r}")
    v = {f: _int(cfg, f, path) for f in SERVER_FIELDS}
    return Server(model=model.strip(), tp=v["tensor_parallelism"], max_model_len=v["max_model_len"],
                  max_num_batched_tokens=v["max_num_batched_tokens"], max_num_seqs=v["max_num_seqs"])


def read_ran_config(path: Path) -> tuple[tuple[Stage, ...], PromptPool, float, bool]:
    """``results/config.yaml``: (stages, prompt pool, client timeout in s, ignore_eos)."""
    cfg = read_yaml(path, "inference-perf configuration (results/config.yaml)")
    if not isinstance(cfg, Mapping):
        raise RoofcalError(f"{path}: expected a mapping of fields")
    api = _mapping(cfg, "api", path)
    if not _flag(api, "streaming", path, "api."):
        raise RoofcalError(f"{where(path, 'api.streaming')}: false — a run without streaming "
                           "measured no time to first token")
    data = _mapping(cfg, "data", path)
    kind = _get(data, "type", path, "data.")
    if kind != "shared_prefix":
        raise RoofcalError(f"{where(path, 'data.type')}: only 'shared_prefix' data is supported, got {kind!r}")
    _unset(data, INERT_DATA_FIELDS, path, "data.")
    sp = _mapping(data, "shared_prefix", path, "data.")
    _only(sp, POOL_FIELDS + INERT_POOL_FIELDS, path, "data.shared_prefix.")
    _unset(sp, INERT_POOL_FIELDS, path, "data.shared_prefix.")
    ints = {f: _int(sp, f, path, "data.shared_prefix.", minimum=0 if f == "system_prompt_len" else 1)
            for f in POOL_FIELDS}
    pool = PromptPool(groups=ints["num_groups"], prompts_per_group=ints["num_prompts_per_group"],
                      system_prompt_len=ints["system_prompt_len"], question_len=ints["question_len"],
                      output_len=ints["output_len"])

    load = _mapping(cfg, "load", path)
    if _get(load, "type", path, "load.") != "constant":
        raise RoofcalError(f"{where(path, 'load.type')}: only 'constant' load is supported, got {load['type']!r}")
    _unset(load, ("sweep", "trace"), path, "load.")
    raw = _get(load, "stages", path, "load.")
    if not isinstance(raw, list) or not raw:
        raise RoofcalError(f"{where(path, 'load.stages')}: expected a non-empty list, got {raw!r}")
    stages = []
    for i, s in enumerate(raw):
        pre = f"load.stages.{i}."
        if not isinstance(s, Mapping):
            raise RoofcalError(f"{where(path, f'load.stages.{i}')}: expected a mapping, got {s!r}")
        _only(s, STAGE_FIELDS, path, pre)
        stage = Stage(rate=_number(s, "rate", path, pre, positive=True),
                      duration=_number(s, "duration", path, pre, positive=True))
        if stage.requests < 1:
            raise RoofcalError(f"{where(path, f'load.stages.{i}')}: rate × duration sends no request")
        stages.append(stage)
    timeout = DEFAULT_TIMEOUT_S
    if load.get("request_timeout") is not None:
        timeout = _number(load, "request_timeout", path, "load.", positive=True)
    server = _mapping(cfg, "server", path)
    ignore_eos = _flag(server, "ignore_eos", path, "server.") if "ignore_eos" in server else False
    return tuple(stages), pool, timeout, ignore_eos


_QUANTILES = (("min", 0.0), ("p0.1", 0.001), ("p1", 0.01), ("p5", 0.05), ("p10", 0.1), ("p25", 0.25),
              ("median", 0.5), ("p75", 0.75), ("p90", 0.9), ("p95", 0.95), ("p99", 0.99),
              ("p99.9", 0.999), ("max", 1.0))


STREAM_EVENTS_PER_TOKEN = 2
"""Stream events inference-perf timed per generated token (its ``inter_token_latency`` is per event):
with ``ignore_eos`` a stream of n tokens carries 2n + 2 events (``../shared/workload/README.md``),
and in every run the lower half of the event gaps is under 0.2 ms."""


def token_gap_ms(inter_event: Mapping, q: float = 0.5, path: str | Path = "", prefix: str = "") -> float:
    """The q-quantile of the gaps between generated tokens (ms) from the client's quantiles of
    the gaps between stream events (s). With e events per token, e − 1 of them arrive at once
    with the token, so a token gap's q-quantile is the event gaps' 1 − (1 − q)/e quantile:
    the median token gap is the events' p75. NaN when that quantile is not reported; a reported
    one that is not a number is an error naming ``path`` and the field (``prefix`` + key)."""
    want = 1.0 - (1.0 - q) / STREAM_EVENTS_PER_TOKEN
    for key, quantile in _QUANTILES:
        if abs(quantile - want) < 1e-9 and key in inter_event:
            return _number(inter_event, key, path, prefix) * 1e3
    return math.nan


def read_measured(path: str | Path, generated: float | None = None) -> Measured:
    """One inference-perf ``*_lifecycle_metrics.json`` (seconds) as a :class:`Measured` (ms).
    ``generated``: tokens the server generated per request (None: the client's ``output_len``)."""
    path = Path(path)
    d = read_json_object(path, "inference-perf results file")
    succ = _mapping(d, "successes", path)
    n_success = _int(succ, "count", path, "successes.", minimum=0)
    n_failures = _int(_mapping(d, "failures", path), "count", path, "failures.", minimum=0)
    if n_success == 0:
        nan = math.nan
        return Measured(nan, nan, nan, nan if generated is None else float(generated), 0, n_failures)
    lat = _mapping(succ, "latency", path, "successes.")
    pre = "successes.latency."
    req = _mapping(lat, "request_latency", path, pre)
    e2e = _number(req, "mean", path, pre + "request_latency.")
    e2e_max = _number(req, "max", path, pre + "request_latency.") if "max" in req else math.nan
    e2e_p1 = _number(req, "p1", path, pre + "request_latency.") if "p1" in req else math.nan
    ttft = _number(_mapping(lat, "time_to_first_token", path, pre), "mean", path,
                   pre + "time_to_first_token.")
    out_len = _number(_mapping(succ, "output_len", path, "successes."), "mean", path, "successes.output_len.")
    gen = float(generated) if generated is not None else out_len
    itl = (e2e - ttft) / (gen - 1) * 1e3 if gen > 1 else math.nan
    prompt = succ.get("prompt_len")
    prompt_len = _number(prompt, "mean", path, "successes.prompt_len.") if prompt is not None else math.nan
    gap = token_gap_ms(_mapping(lat, "inter_token_latency", path, pre), path=path,
                       prefix=pre + "inter_token_latency.") if "inter_token_latency" in lat else math.nan
    return Measured(e2e_ms=e2e * 1e3, ttft_ms=ttft * 1e3, itl_ms=itl, generated=gen,
                    n_success=n_success, n_failures=n_failures, prompt_len=prompt_len,
                    client_output_len=out_len, e2e_max_ms=e2e_max * 1e3, token_gap_p50_ms=gap,
                    e2e_p1_ms=e2e_p1 * 1e3)


def prompt_quantiles(path: Path) -> tuple[tuple[float, float], ...]:
    """(quantile, tokens) of ``successes.prompt_len`` in a results file; () when not reported."""
    d = read_json_object(path, "inference-perf results file")
    p = (d.get("successes") or {}).get("prompt_len")
    if not isinstance(p, Mapping):
        return ()
    out = []
    for key, q in _QUANTILES:
        if key in p:
            out.append((q, _number(p, key, path, "successes.prompt_len.")))
    vs = [v for _, v in out]
    if any(b < a for a, b in zip(vs, vs[1:])):
        raise RoofcalError(f"{where(path, 'successes.prompt_len')}: quantiles are not increasing")
    return tuple(out)


#: ``profile.yaml`` ``data.shared_prefix`` keys BLIS's ``inference_perf:`` expansion takes
PROFILE_PREFIX_FIELDS = ("num_unique_system_prompts", "num_users_per_system_prompt", "system_prompt_len",
                         "question_len", "output_len", "enable_multi_turn_chat")
PROFILE = "profile.yaml"


def requested_profile(exp: Experiment) -> dict:
    """The load as ``profile.yaml`` *requested* it (not what ran): ``{"stages": [{rate,
    duration}], "shared_prefix": {…}}`` — what BLIS's ``inference_perf:`` expansion and the
    reference runner (../shared/tools/blis_experiment.py) are fed. Strict: a missing file or
    field is a one-line error."""
    path = exp.path / PROFILE
    prof = read_yaml(path, "load profile (profile.yaml)")
    if not isinstance(prof, Mapping):
        raise RoofcalError(f"{path}: expected a mapping of fields")
    sp = _mapping(_mapping(prof, "data", path), "shared_prefix", path, "data.")
    prefix = {}
    for f in PROFILE_PREFIX_FIELDS:
        if f == "enable_multi_turn_chat":
            prefix[f] = _flag(sp, f, path, "data.shared_prefix.") if f in sp else False
        else:
            prefix[f] = _int(sp, f, path, "data.shared_prefix.", minimum=0 if f == "system_prompt_len" else 1)
    raw = _get(_mapping(prof, "load", path), "stages", path, "load.")
    if not isinstance(raw, list) or not raw:
        raise RoofcalError(f"{where(path, 'load.stages')}: expected a non-empty list, got {raw!r}")
    stages = [{"rate": _number(st, "rate", path, f"load.stages.{i}.", positive=True),
               "duration": _number(st, "duration", path, f"load.stages.{i}.", positive=True)}
              for i, st in enumerate(raw)]
    return {"stages": stages, "shared_prefix": prefix}


def is_experiment_folder(path: Path) -> bool:
    """True if ``path`` holds an inference-perf run (``exp-config.yaml``) or a recorded trace
    (``server.yaml``)."""
    from roofcal.measurements.tracev2 import SERVER_FILE
    return (path / EXP_CONFIG).is_file() or (path / SERVER_FILE).is_file()


def read_experiment(path: str | Path) -> Experiment:
    """Read one experiment folder (strictly; see the module docstring): an inference-perf run,
    or a recorded trace with its server description (:func:`.tracev2.read_trace_experiment`)."""
    path = Path(path)
    if not path.is_dir():
        raise RoofcalError(f"{path}: no such experiment folder")
    from roofcal.measurements.tracev2 import SERVER_FILE, read_trace_experiment
    if (path / SERVER_FILE).is_file() and not (path / EXP_CONFIG).is_file():
        return read_trace_experiment(path / SERVER_FILE)
    server = read_server(path / EXP_CONFIG)
    results = path / RESULTS
    stages, pool, timeout, ignore_eos = read_ran_config(results / RAN_CONFIG)
    generated = float(pool.output_len) if ignore_eos else None
    truth = {"summary": read_measured(results / SUMMARY_FILE, generated)}
    for i in range(len(stages)):
        truth[f"stage_{i}"] = read_measured(results / f"stage_{i}_lifecycle_metrics.json", generated)
    starts = [0.0]
    for i, s in enumerate(stages[:-1]):
        drain = truth[f"stage_{i}"].e2e_max_ms / 1e3
        starts.append(starts[-1] + s.duration + (drain if math.isfinite(drain) else 0.0) + STAGE_PAUSE_S)
    return Experiment(name=path.resolve().name, path=path, kind="inference-perf", server=server,
                      stages=stages, truth=truth, pool=pool,
                      prompt_quantiles=prompt_quantiles(results / SUMMARY_FILE), timeout_s=timeout,
                      stage_starts_s=tuple(starts))


def read_experiments(paths: Iterable[str | Path]) -> list[Experiment]:
    """Experiments from ``paths``, each an experiment folder or a folder of experiment folders
    (those read in name order; sub-folders that are not experiments are skipped). Names must be
    unique."""
    out: list[Experiment] = []
    for p in paths:
        p = Path(p)
        if not p.is_dir():
            raise RoofcalError(f"{p}: no such experiment folder")
        if is_experiment_folder(p):
            out.append(read_experiment(p))
            continue
        subs = sorted((s for s in p.iterdir() if s.is_dir() and is_experiment_folder(s)),
                      key=lambda s: s.name)
        if not subs:
            raise RoofcalError(f"{p}: not an experiment folder ({EXP_CONFIG}, or a trace's server.yaml) "
                               f"and has no experiment sub-folders")
        out += [read_experiment(s) for s in subs]
    seen: dict[str, Path] = {}
    for e in out:
        if e.name in seen:
            raise RoofcalError(f"{e.path}: experiment '{e.name}' given twice (also {seen[e.name]})")
        seen[e.name] = e.path
    if not out:
        raise RoofcalError("no experiments given")
    return out

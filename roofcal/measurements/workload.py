"""Real vLLM serving experiments: what the server was, what load it got, and what was measured.

One experiment is a folder (the layout of inference-sim/training's ``default_args/<name>/``)::

    exp-config.yaml                       the vLLM server: model, tensor_parallelism, max_model_len,
                                          max_num_batched_tokens, max_num_seqs (flat YAML)
    profile.yaml                          the inference-perf load (one line of JSON): constant-rate
                                          Poisson stages and a shared-prefix prompt generator
    results/summary_lifecycle_metrics.json   inference-perf's measurements of the whole run (seconds)
    results/stage_<i>_lifecycle_metrics.json one per load stage (required for every stage)

Reading is strict: a missing file, a missing or ill-typed field, an unknown field in
``data.shared_prefix``, ``load`` or a stage, or a load that is not ``constant``, raises a
:class:`~roofcal.errors.RoofcalError` naming the file and the dotted field.

Ground truth, the rule of inference-sim's sim-to-real validation (facts from
``../shared/workload/README.md``): mean E2E, mean TTFT, and ITL = (mean E2E − mean TTFT) /
(mean output_len − 1); a run whose failure rate is ≥ 10 % is an overload run (reported, not scored).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from roofcal.errors import RoofcalError, where
from roofcal.io import read_json_object, read_yaml

#: failure rate (failures / requests) at and above which a run counts as overload
OVERLOAD_FAILURE_RATE = 0.10

EXP_CONFIG = "exp-config.yaml"
PROFILE = "profile.yaml"
RESULTS = "results"
SUMMARY_FILE = "summary_lifecycle_metrics.json"

#: ``exp-config.yaml`` integer fields (besides ``model``); other keys (``app``) are ignored
SERVER_FIELDS = ("tensor_parallelism", "max_model_len", "max_num_batched_tokens", "max_num_seqs")
#: ``profile.yaml`` ``data.shared_prefix``: exactly these keys (integers except the flag)
PREFIX_INT_FIELDS = ("num_unique_system_prompts", "num_users_per_system_prompt", "system_prompt_len",
                     "question_len", "output_len")
PREFIX_FIELDS = PREFIX_INT_FIELDS + ("enable_multi_turn_chat",)
LOAD_FIELDS = ("type", "stages")
STAGE_FIELDS = ("rate", "duration")


@dataclass(frozen=True)
class Stage:
    """One constant-rate load stage: Poisson arrivals at ``rate`` for ``duration``."""

    rate: float        # requests/s
    duration: float    # s


@dataclass(frozen=True)
class SharedPrefix:
    """inference-perf's shared-prefix generator: prompts are a system prompt shared by a group of
    users plus a per-user question; lengths in tokens."""

    num_unique_system_prompts: int
    num_users_per_system_prompt: int
    system_prompt_len: int      # tokens
    question_len: int           # tokens
    output_len: int             # tokens
    enable_multi_turn_chat: bool


@dataclass(frozen=True)
class Measured:
    """What inference-perf measured over one scope (the run or one stage), in ms.

    ``itl_ms`` = (``e2e_ms`` − ``ttft_ms``) / (``output_len`` − 1); NaN when ``output_len`` ≤ 1 or
    nothing succeeded (then every latency is NaN).
    """

    e2e_ms: float        # mean request latency, ms
    ttft_ms: float       # mean time to first token, ms
    itl_ms: float        # ms per output token after the first
    output_len: float    # mean output tokens of the successful requests
    n_success: int
    n_failures: int
    prompt_len: float = float("nan")   # mean prompt tokens of the successful requests (NaN if not reported)

    @property
    def failure_rate(self) -> float:
        """failures / (successes + failures); 0 for a scope without requests."""
        total = self.n_success + self.n_failures
        return self.n_failures / total if total else 0.0


@dataclass(frozen=True)
class Experiment:
    """One measured serving run: server configuration, load, and ground truth per scope."""

    name: str
    path: Path
    model: str                      # HF id as in exp-config.yaml, e.g. meta-llama/Llama-2-7b-hf
    tp: int
    max_model_len: int              # tokens
    max_num_batched_tokens: int     # tokens per step (chunked-prefill budget)
    max_num_seqs: int
    stages: tuple[Stage, ...]
    prefix: SharedPrefix
    truth: dict[str, Measured]      # "summary", "stage_0", "stage_1", ...

    @property
    def model_id(self) -> str:
        """The lower-cased HF id, as BLIS's ``--model`` takes it."""
        return self.model.lower()

    @property
    def overload(self) -> bool:
        """True if the run's failure rate is ≥ 10 % (reported, not scored)."""
        return self.truth["summary"].failure_rate >= OVERLOAD_FAILURE_RATE

    @property
    def scopes(self) -> tuple[str, ...]:
        """``("summary", "stage_0", …)``: the scopes of :attr:`truth`, in order."""
        return ("summary",) + tuple(f"stage_{i}" for i in range(len(self.stages)))

    @property
    def pool_prompt_tokens(self) -> int:
        """Tokens of one prompt of inference-perf's pool: system prompt + question."""
        return self.prefix.system_prompt_len + self.prefix.question_len

    @property
    def prompt_tokens(self) -> int:
        """Tokens of one prompt as the server saw it: the pool prompt, then the rest of the measured
        mean prompt (the chat template), at least 1 token; pool + 1 when no prompt length was
        reported."""
        measured = self.truth["summary"].prompt_len
        rest = round(measured - self.pool_prompt_tokens) if math.isfinite(measured) else 1
        return self.pool_prompt_tokens + max(1, int(rest))

    @property
    def num_requests(self) -> int:
        """Requests the load sends: Σ round(rate · duration) over the stages."""
        return sum(round(s.rate * s.duration) for s in self.stages)


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


def _only(obj: Mapping[str, Any], known: Iterable[str], path: Path, prefix: str) -> None:
    for key in obj:
        if key not in known:
            raise RoofcalError(f"{where(path, prefix + str(key))}: unknown field "
                               f"(known: {', '.join(known)})")


# --------------------------------------------------------------------------------------------
# the three files


def _read_server(path: Path) -> dict:
    cfg = read_yaml(path, "experiment config (exp-config.yaml)")
    if not isinstance(cfg, Mapping):
        raise RoofcalError(f"{path}: expected a mapping of fields")
    model = _get(cfg, "model", path, "")
    if not isinstance(model, str) or not model.strip():
        raise RoofcalError(f"{where(path, 'model')}: expected a HuggingFace model id, got {model!r}")
    out = {"model": model.strip()}
    out.update({f: _int(cfg, f, path) for f in SERVER_FIELDS})
    return out


def _read_profile(path: Path) -> tuple[tuple[Stage, ...], SharedPrefix]:
    prof = read_yaml(path, "load profile (profile.yaml)")
    if not isinstance(prof, Mapping):
        raise RoofcalError(f"{path}: expected a mapping of fields")
    data = _mapping(prof, "data", path)
    kind = _get(data, "type", path, "data.")
    if kind != "shared_prefix":
        raise RoofcalError(f"{where(path, 'data.type')}: only 'shared_prefix' data is supported, "
                           f"got {kind!r}")
    sp = _mapping(data, "shared_prefix", path, "data.")
    _only(sp, PREFIX_FIELDS, path, "data.shared_prefix.")
    ints = {f: _int(sp, f, path, "data.shared_prefix.", minimum=0 if f == "system_prompt_len" else 1)
            for f in PREFIX_INT_FIELDS}
    flag = _get(sp, "enable_multi_turn_chat", path, "data.shared_prefix.")
    if not isinstance(flag, bool):
        raise RoofcalError(f"{where(path, 'data.shared_prefix.enable_multi_turn_chat')}: expected "
                           f"true or false, got {flag!r}")
    prefix = SharedPrefix(**ints, enable_multi_turn_chat=flag)

    load = _mapping(prof, "load", path)
    _only(load, LOAD_FIELDS, path, "load.")
    if _get(load, "type", path, "load.") != "constant":
        raise RoofcalError(f"{where(path, 'load.type')}: only 'constant' load is supported, "
                           f"got {load['type']!r}")
    raw = _get(load, "stages", path, "load.")
    if not isinstance(raw, list) or not raw:
        raise RoofcalError(f"{where(path, 'load.stages')}: expected a non-empty list, got {raw!r}")
    stages = []
    for i, s in enumerate(raw):
        pre = f"load.stages.{i}."
        if not isinstance(s, Mapping):
            raise RoofcalError(f"{where(path, f'load.stages.{i}')}: expected a mapping, got {s!r}")
        _only(s, STAGE_FIELDS, path, pre)
        stages.append(Stage(rate=_number(s, "rate", path, pre, positive=True),
                            duration=_number(s, "duration", path, pre, positive=True)))
    return tuple(stages), prefix


def read_measured(path: str | Path) -> Measured:
    """One inference-perf ``*_lifecycle_metrics.json`` (seconds) as a :class:`Measured` (ms)."""
    path = Path(path)
    d = read_json_object(path, "inference-perf results file")
    succ = _mapping(d, "successes", path)
    n_success = _int(succ, "count", path, "successes.", minimum=0)
    n_failures = _int(_mapping(d, "failures", path), "count", path, "failures.", minimum=0)
    if n_success == 0:
        nan = float("nan")
        return Measured(nan, nan, nan, nan, 0, n_failures)
    lat = _mapping(succ, "latency", path, "successes.")
    pre = "successes.latency."
    e2e = _number(_mapping(lat, "request_latency", path, pre), "mean", path, pre + "request_latency.")
    ttft = _number(_mapping(lat, "time_to_first_token", path, pre), "mean", path,
                   pre + "time_to_first_token.")
    out_len = _number(_mapping(succ, "output_len", path, "successes."), "mean", path,
                      "successes.output_len.")
    itl = (e2e - ttft) / (out_len - 1) * 1e3 if out_len > 1 else float("nan")
    prompt = succ.get("prompt_len")
    prompt_len = _number(prompt, "mean", path, "successes.prompt_len.") if prompt is not None else float("nan")
    return Measured(e2e_ms=e2e * 1e3, ttft_ms=ttft * 1e3, itl_ms=itl, output_len=out_len,
                    n_success=n_success, n_failures=n_failures, prompt_len=prompt_len)


def is_experiment_folder(path: Path) -> bool:
    """True if ``path`` holds an ``exp-config.yaml`` or a ``profile.yaml``."""
    return (path / EXP_CONFIG).is_file() or (path / PROFILE).is_file()


def read_experiment(path: str | Path) -> Experiment:
    """Read one experiment folder (strictly; see the module docstring)."""
    path = Path(path)
    if not path.is_dir():
        raise RoofcalError(f"{path}: no such experiment folder")
    server = _read_server(path / EXP_CONFIG)
    stages, prefix = _read_profile(path / PROFILE)
    results = path / RESULTS
    truth = {"summary": read_measured(results / SUMMARY_FILE)}
    for i in range(len(stages)):
        truth[f"stage_{i}"] = read_measured(results / f"stage_{i}_lifecycle_metrics.json")
    return Experiment(name=path.resolve().name, path=path, model=server["model"],
                      tp=server["tensor_parallelism"], max_model_len=server["max_model_len"],
                      max_num_batched_tokens=server["max_num_batched_tokens"],
                      max_num_seqs=server["max_num_seqs"], stages=stages, prefix=prefix, truth=truth)


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
            raise RoofcalError(f"{p}: not an experiment folder ({EXP_CONFIG}, {PROFILE}) and has no "
                               f"experiment sub-folders")
        out += [read_experiment(s) for s in subs]
    seen: dict[str, Path] = {}
    for e in out:
        if e.name in seen:
            raise RoofcalError(f"{e.path}: experiment '{e.name}' given twice (also {seen[e.name]})")
        seen[e.name] = e.path
    if not out:
        raise RoofcalError("no experiments given")
    return out

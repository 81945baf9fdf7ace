"""vLLM steps: the JSONL interchange format, :class:`Step` records and the padded :class:`StepBatch`.

One JSON object per line::

    {"prefill": [[new_tokens, cached_tokens], ...],  # chunks computed this step; cached = KV already present
     "decode": [context, ...],                       # one token each; context = KV length before it
     "duration_us": 12345.6,                         # optional measured step time (µs)
     "cycle_us": 13456.7,                            # optional: start of this step to the next's (µs)
     "model": "llama-2-70b-hf", "gpu": "h100_sxm", "tp": 4,   # optional per-row deployment
     "dp": 4, "ep": true, "moe_comm": "deepep_low_latency"}   # optional: its layout beyond TP

``duration_us`` is the whole step as a profiler timed it (splitwise) or, from vLLM's step
tracing, the GPU forward time (``step.duration_us``); ``cycle_us`` is the time from this step's
start to the next one's, CPU work included — what a simulator's clock advances by. Which of them
``roofcal fit`` compares with which prediction is ``--step-target``
(:data:`roofcal.calibration.fit.STEP_TARGETS`). ``dp``, ``ep`` and ``moe_comm`` lay a row's
deployment out beyond TP as ``--dp``, ``--enable-expert-parallel`` and ``--moe-comm-backend`` do
(:class:`roofcal.physics.config.Parallel`); the row is then the whole deployment's batch.

A :class:`StepBatch` holds many steps as zero-padded arrays of shape ``(steps, max_chunks)`` so the
components can be jitted and vectorised; padding entries have zero tokens and zero mask.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import jax
import numpy as np

from roofcal.errors import RoofcalError
from roofcal.physics.config import Parallel


#: a step's optional layout fields beyond TP (:func:`layout_of`)
LAYOUT_FIELDS = ("dp", "ep", "moe_comm")


@dataclass(frozen=True)
class Step:
    """One scheduler step. Token counts are integers ≥ 0; ``duration_us`` and ``cycle_us`` in µs
    when measured (see the module docstring)."""

    prefill: tuple[tuple[int, int], ...] = ()
    decode: tuple[int, ...] = ()
    duration_us: float | None = None
    model: str | None = None
    gpu: str | None = None
    tp: int | None = None
    cycle_us: float | None = None     # measured start of this step to start of the next, µs
    dp: int | None = None             # data-parallel ranks (None: the command line's)
    ep: bool | None = None            # expert parallelism
    moe_comm: str | None = None       # MoE comm backend

    @property
    def phase(self) -> str:
        """``prefill``, ``decode``, ``mixed`` or ``empty``."""
        if self.prefill and self.decode:
            return "mixed"
        return "prefill" if self.prefill else ("decode" if self.decode else "empty")

    def to_json(self) -> dict:
        d: dict = {"prefill": [list(c) for c in self.prefill], "decode": list(self.decode)}
        for key in ("duration_us", "cycle_us", "model", "gpu", "tp", *LAYOUT_FIELDS):
            if getattr(self, key) is not None:
                d[key] = getattr(self, key)
        return d


def _count(value, where: str, field_name: str, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value != int(value) or value < minimum:
        raise RoofcalError(f"{where}: field '{field_name}' must be an integer ≥ {minimum}, got {value!r}")
    return int(value)


def step_from_dict(obj, where: str = "<step>") -> Step:
    """Validate one step mapping (the JSONL schema above); ``where`` names it in errors."""
    if not isinstance(obj, dict):
        raise RoofcalError(f"{where}: a step must be a JSON object")
    known = {"prefill", "decode", "duration_us", "cycle_us", "model", "gpu", "tp", *LAYOUT_FIELDS}
    for key in obj:
        if key not in known:
            raise RoofcalError(f"{where}: unknown field '{key}' (known: {', '.join(sorted(known))})")
    prefill = obj.get("prefill", []) or []
    decode = obj.get("decode", []) or []
    if not isinstance(prefill, list):
        raise RoofcalError(f"{where}: field 'prefill' must be a list of [new_tokens, cached_tokens]")
    if not isinstance(decode, list):
        raise RoofcalError(f"{where}: field 'decode' must be a list of context lengths")
    chunks = []
    for i, chunk in enumerate(prefill):
        if not isinstance(chunk, (list, tuple)) or len(chunk) != 2:
            raise RoofcalError(f"{where}: field 'prefill[{i}]' must be [new_tokens, cached_tokens]")
        chunks.append((_count(chunk[0], where, f"prefill[{i}][0]", 1),
                       _count(chunk[1], where, f"prefill[{i}][1]", 0)))
    ctx = tuple(_count(c, where, f"decode[{i}]", 0) for i, c in enumerate(decode))
    dur, cyc = (_time(obj.get(k), where, k) for k in ("duration_us", "cycle_us"))
    tp = obj.get("tp")
    if tp is not None:
        tp = _count(tp, where, "tp", 1)
    dp = obj.get("dp")
    if dp is not None:
        dp = _count(dp, where, "dp", 1)
    ep = obj.get("ep")
    if ep is not None and not isinstance(ep, bool):
        raise RoofcalError(f"{where}: field 'ep' must be true or false, got {ep!r}")
    for key in ("model", "gpu", "moe_comm"):
        if obj.get(key) is not None and not isinstance(obj[key], str):
            raise RoofcalError(f"{where}: field '{key}' must be a string")
    return Step(tuple(chunks), ctx, dur, obj.get("model"), obj.get("gpu"), tp, cyc, dp, ep,
                obj.get("moe_comm"))


def _time(v, where: str, field_name: str) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise RoofcalError(f"{where}: field '{field_name}' must be a positive number, got {v!r}")
    return float(v)


def read_steps(path: str | Path) -> list[Step]:
    """Read a steps JSONL file (blank lines allowed). Errors name the file and line."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise RoofcalError(f"{path}: no such steps file")
    except UnicodeDecodeError:
        raise RoofcalError(f"{path}: not a UTF-8 text file")
    steps = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise RoofcalError(f"{path}: bad JSON on line {n}: {e.msg}")
        steps.append(step_from_dict(obj, f"{path}: line {n}"))
    if not steps:
        raise RoofcalError(f"{path}: no steps in file")
    return steps


def write_steps_text(steps: Iterable[Step]) -> str:
    """The JSONL text of ``steps`` (one compact object per line)."""
    return "".join(json.dumps(s.to_json(), separators=(", ", ": ")) + "\n" for s in steps)


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class StepBatch:
    """Steps as padded arrays (float32 token counts; masks 1.0 for real entries).

    Shapes: ``prefill_new``, ``prefill_cached``, ``prefill_mask``: (S, P);
    ``decode_ctx``, ``decode_mask``: (S, D), with P, D ≥ 1.
    """

    prefill_new: np.ndarray
    prefill_cached: np.ndarray
    prefill_mask: np.ndarray
    decode_ctx: np.ndarray
    decode_mask: np.ndarray

    @property
    def num_steps(self) -> int:
        return self.prefill_new.shape[0]

    def take(self, idx) -> "StepBatch":
        """The steps at integer indices ``idx`` (padding width kept)."""
        return StepBatch(*(np.asarray(a)[idx] for a in (self.prefill_new, self.prefill_cached,
                                                       self.prefill_mask, self.decode_ctx,
                                                       self.decode_mask)))


def batch_steps(steps: Sequence[Step], pad_prefill: int | None = None,
                pad_decode: int | None = None) -> StepBatch:
    """Pack steps into a :class:`StepBatch` (widths = the longest step unless given)."""
    S = len(steps)
    P = max([len(s.prefill) for s in steps] + [pad_prefill or 1])
    D = max([len(s.decode) for s in steps] + [pad_decode or 1])
    new = np.zeros((S, P), np.float32)
    cached = np.zeros((S, P), np.float32)
    pmask = np.zeros((S, P), np.float32)
    ctx = np.zeros((S, D), np.float32)
    dmask = np.zeros((S, D), np.float32)
    for i, s in enumerate(steps):
        if s.prefill:
            arr = np.asarray(s.prefill, np.float32)
            new[i, :len(arr)] = arr[:, 0]
            cached[i, :len(arr)] = arr[:, 1]
            pmask[i, :len(arr)] = 1.0
        if s.decode:
            ctx[i, :len(s.decode)] = s.decode
            dmask[i, :len(s.decode)] = 1.0
    return StepBatch(new, cached, pmask, ctx, dmask)


def uniform_steps(num_prefill, prefill_len, prefill_cached, num_decode, decode_ctx) -> StepBatch:
    """Steps whose prefill chunks (and decode contexts) are all alike, from per-step arrays.

    Each argument has shape (S,): ``num_prefill`` chunks of ``prefill_len`` new tokens over
    ``prefill_cached`` cached ones, and ``num_decode`` decodes at context ``decode_ctx``. Built
    with one chunk/decode column each, weighted by the count through the mask, so it stays
    O(S) however large the batches are.
    """
    col = lambda a: np.asarray(a, np.float32).reshape(-1, 1)
    return StepBatch(col(prefill_len), col(prefill_cached), col(num_prefill), col(decode_ctx),
                     col(num_decode))


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class StepTotals:
    """Per-step sums derived from a :class:`StepBatch` (each array of shape (S,)).

    ``pairs`` counts causal (query, key) pairs of the prefill chunks:
    Σ new·(cached + (new+1)/2). ``*_tokens`` are token counts.
    """

    n_prefill: object
    n_decode: object
    prefill_tokens: object
    prefill_cached_tokens: object
    pairs: object
    decode_kv_tokens: object          # Σ (context + 1): keys attended by the decode tokens
    tokens: object = field(default=None)


def step_totals(b: StepBatch, xp=np) -> StepTotals:
    """Reduce a batch to the per-step sums the components need (``xp`` = numpy or jax.numpy).

    Masks double as multiplicities, so :func:`uniform_steps` batches work unchanged.
    """
    w = b.prefill_mask
    n_pf = xp.sum(w, axis=1)
    pf_tok = xp.sum(w * b.prefill_new, axis=1)
    pf_cached = xp.sum(w * b.prefill_cached, axis=1)
    pairs = xp.sum(w * b.prefill_new * (b.prefill_cached + (b.prefill_new + 1.0) / 2.0), axis=1)
    n_dc = xp.sum(b.decode_mask, axis=1)
    dc_kv = xp.sum(b.decode_mask * (b.decode_ctx + 1.0), axis=1)
    return StepTotals(n_pf, n_dc, pf_tok, pf_cached, pairs, dc_kv, pf_tok + n_dc)


def layout_of(step: Step, parallel: Parallel = Parallel()) -> Parallel:
    """A step's layout beyond TP: its own ``dp``, ``ep`` and ``moe_comm`` over ``parallel``'s."""
    return Parallel(parallel.dp if step.dp is None else step.dp,
                    parallel.ep if step.ep is None else step.ep,
                    step.moe_comm or parallel.moe_comm)


def group_by_deployment(steps: Sequence[Step], model=None, gpu=None, tp=None,
                        src: str = "steps", parallel: Parallel = Parallel()) -> dict[tuple, list[int]]:
    """Indices of ``steps`` per (model, gpu, tp, layout); a step's own fields override the
    defaults (the layout: :func:`layout_of`).

    A step left without a model, GPU or TP is refused, naming it.
    """
    groups: dict[tuple, list[int]] = {}
    for i, s in enumerate(steps):
        dep = (s.model or model, s.gpu or gpu, s.tp or tp)
        for name, value in zip(("model", "gpu", "tp"), dep):
            if value is None:
                raise RoofcalError(f"{src}: step {i + 1} has no {name} (give --{name} or a "
                                   f"'{name}' field)")
        groups.setdefault((*dep, layout_of(s, parallel)), []).append(i)
    return groups


def given_by(steps: Sequence[Step], idx: Sequence[int], name: str, src: str = "steps") -> str:
    """Where the ``name`` (model, gpu, tp, or ``layout``: dp, ep, moe_comm) of the steps ``idx`` of
    one deployment came from, for an error to blame: the first of them that names it itself
    (``steps.jsonl: step 3 'tp'``), else the command-line option they all took it from (``--tp``;
    the layout: ``--dp``)."""
    names = LAYOUT_FIELDS if name == "layout" else (name,)
    for i in idx:
        own = [f"'{n}'" for n in names if getattr(steps[i], n, None) is not None]
        if own:
            return f"{src}: step {i + 1} {', '.join(own)}"
    return "--dp" if name == "layout" else f"--{name}"

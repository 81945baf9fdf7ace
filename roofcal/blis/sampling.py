"""Realistic vLLM scheduler steps for distillation, in roofcal's and BLIS's views of a step.

:func:`sample_steps` draws steps the way a vLLM server (V1 scheduler, chunked prefill) builds them:

* **Phase mix** (per step): decode-only with probability 0.5, mixed 0.3, prefill-only 0.2.
* **Token budget** (``max_num_batched_tokens``): one of 2048, 4096, 8192 per step.
* **Decodes are scheduled first** (running requests): a batch size log-uniform in 1..256
  (``max_num_seqs``), at most budget − 1 in a mixed step. Contexts are log-normal around a step
  centre drawn log-uniform in [128, max context): the spread σ ∈ [0, 1) (in ln units) is drawn per
  step, so both uniform-context benchmark batches (σ ≈ 0) and heterogeneous server batches occur.
  The generated part of a decode's context is uniform in [0, min(context, 2048)).
* **Prefill chunks fill the rest of the budget**: a queue of 1..8 waiting prompts, lengths
  log-uniform in [128, max context]; with probability 0.5 the first one is half-way through a
  chunked prefill (its cached prefix uniform in [0, length)). Chunks are taken in queue order until
  the budget or ``max_num_seqs`` is exhausted.
* **KV capacity**: decodes beyond the KV cache's capacity (:func:`kv_capacity_tokens`) are not
  scheduled (the first decode always is); the maximum context is capped at the capacity.

Each step is returned twice: as a roofcal :class:`~roofcal.physics.steps.StepBatch` (prefill chunks
``[new, cached]``, decode contexts) and as the matching BLIS request batch
(:class:`~roofcal.blis.basis.BlisBatch`) with the *true* prompt length of each chunk, which is what
BLIS sees in a simulation. Measured roofcal steps, whose prompts are unknown, are mapped to BLIS
requests by :func:`blis_requests_from_steps`.

Everything is drawn with one seeded :class:`numpy.random.Generator` in vectorised numpy, so the
sample is a pure function of (settings, seed, deployment).
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import numpy as np

from roofcal.blis.basis import BlisBatch
from roofcal.physics.config import ModelSpec
from roofcal.errors import RoofcalError
from roofcal.physics.hardware import GPUSpec
from roofcal.physics.steps import Step, StepBatch

PHASES = ("prefill", "decode", "mixed")


@dataclass(frozen=True)
class SamplerSettings:
    """How steps are drawn (see the module docstring). Token counts in tokens."""

    phase_probs: tuple[float, float, float] = (0.2, 0.5, 0.3)  # prefill, decode, mixed
    token_budgets: tuple[int, ...] = (2048, 4096, 8192)  # max_num_batched_tokens
    max_num_seqs: int = 256  # requests per step (decode batch ≤ this)
    max_queue: int = 8  # waiting prompts considered per step
    min_context: int = 128  # shortest sampled prompt / decode-context centre
    max_context: int = 16384  # longest, further capped by the model's max_position_embeddings
    max_generated: int = 2048  # generated tokens so far of a decode are < min(context, this)
    gpu_memory_utilization: float = 0.9  # vLLM's share of GPU memory (weights + KV cache)

    def record(self) -> dict:
        """A plain dict for provenance."""
        return {
            "phase_probs": dict(zip(PHASES, self.phase_probs)),
            "token_budgets": list(self.token_budgets),
            "max_num_seqs": self.max_num_seqs,
            "max_queue": self.max_queue,
            "context_range": [self.min_context, self.max_context],
            "max_generated": self.max_generated,
            "gpu_memory_utilization": self.gpu_memory_utilization,
        }


@dataclass(frozen=True, eq=False)
class SampledSteps:
    """``n`` sampled steps of one deployment in both views.

    ``steps``: roofcal view, prefill arrays (n, max_queue), decode arrays (n, max_num_seqs).
    ``requests``: BLIS view, (n, max_queue + max_num_seqs) — prefill requests first.
    ``phase``: (n,) ``prefill`` / ``decode`` / ``mixed``.
    """

    steps: StepBatch
    requests: BlisBatch
    phase: np.ndarray

    def __len__(self) -> int:
        return len(self.phase)


def deployment_seed(seed: int, model: str, tp: int, stream: int = 0) -> np.random.Generator:
    """A generator for one deployment: a function of (seed, model name, TP, stream) only, so adding
    or reordering deployments leaves each one's draws unchanged. ``stream`` 0 draws the sample;
    other streams are independent generators of the same deployment (e.g. its held-out split)."""
    entropy = [int(seed), zlib.crc32(model.encode("utf-8")), int(tp)]
    return np.random.default_rng(entropy + [int(stream)] if stream else entropy)


def kv_capacity_tokens(model: ModelSpec, gpu: GPUSpec, tp: int, utilization: float = 0.9) -> int:
    """Tokens the KV cache holds per GPU, as vLLM sizes it: :func:`roofcal.physics.capacity.capacity`
    (KV blocks × block size 16, after weights, activation peak and non-torch memory at ``utilization``
    of the GPU's memory; KV dtype the model's). Refuses a deployment that does not fit (vLLM would not
    start)."""
    from roofcal.physics.capacity import capacity
    return capacity(model, gpu, tp, gpu_memory_utilization=utilization).kv_tokens


def _loguniform_int(rng: np.random.Generator, low: float, high: float, size) -> np.ndarray:
    """Integers log-uniform in [low, high] (inclusive)."""
    x = np.exp(rng.uniform(math.log(low), math.log(high + 1.0), size))
    return np.clip(np.floor(x), low, high).astype(np.int64)


def sample_steps(rng: np.random.Generator, n: int, max_context: int, kv_capacity: int,
                 settings: SamplerSettings = SamplerSettings()) -> SampledSteps:
    """Draw ``n`` steps (see the module docstring); contexts ≤ min(max_context, kv_capacity)."""
    s = settings
    hi = int(min(max_context, s.max_context, kv_capacity))
    lo = int(min(s.min_context, hi // 2))
    if hi < 2 or lo < 1:
        raise RoofcalError(f"sampler: maximum context {hi} tokens is too small to sample steps")
    D, K = s.max_num_seqs, s.max_queue
    cols_d, cols_k = np.arange(D), np.arange(K)

    phase_idx = rng.choice(3, size=n, p=np.asarray(s.phase_probs) / sum(s.phase_probs))
    budget = rng.choice(np.asarray(s.token_budgets, np.int64), size=n)
    has_pf, has_dc = phase_idx != 1, phase_idx != 0

    # decodes (running requests) first
    n_dc = _loguniform_int(rng, 1, D, n)
    n_dc = np.where(phase_idx == 2, np.minimum(n_dc, budget - 1), n_dc) * has_dc
    centre = np.exp(rng.uniform(math.log(lo), math.log(hi), n))
    sigma = rng.uniform(0.0, 1.0, n)
    ctx = np.rint(centre[:, None] * np.exp(sigma[:, None] * rng.standard_normal((n, D))))
    ctx = np.clip(ctx, 1, hi - 1).astype(np.int64)
    want = cols_d[None, :] < n_dc[:, None]
    used = np.cumsum(np.where(want, ctx, 0), axis=1)
    dmask = want & ((used <= kv_capacity) | (cols_d[None, :] == 0))
    n_dc = dmask.sum(1)
    generated = np.floor(rng.random((n, D)) * np.minimum(ctx, s.max_generated)).astype(np.int64)

    # prefill chunks fill the remaining token budget, in queue order
    length = _loguniform_int(rng, lo, hi, (n, K))
    in_progress = rng.random(n) < 0.5
    cached = np.zeros((n, K), np.int64)
    cached[:, 0] = np.where(in_progress, np.floor(rng.random(n) * length[:, 0]), 0)
    queue = rng.integers(1, K + 1, n)
    remaining = length - cached
    start = np.cumsum(remaining, axis=1) - remaining
    room = np.where(has_pf, budget - n_dc, 0)
    chunk = np.clip(room[:, None] - start, 0, remaining)
    pmask = (chunk > 0) & (cols_k[None, :] < queue[:, None]) & (cols_k[None, :] < (D - n_dc)[:, None])
    chunk = np.where(pmask, chunk, 0)

    steps = StepBatch(
        prefill_new=chunk.astype(np.float32),
        prefill_cached=np.where(pmask, cached, 0).astype(np.float32),
        prefill_mask=pmask.astype(np.float32),
        decode_ctx=np.where(dmask, ctx, 0).astype(np.float32),
        decode_mask=dmask.astype(np.float32),
    )
    z = lambda a, m: np.where(m, a, 0).astype(np.int64)
    requests = BlisBatch(
        input_len=np.concatenate([z(length, pmask), z(ctx - generated, dmask)], axis=1),
        progress_index=np.concatenate([z(cached, pmask), z(ctx, dmask)], axis=1),
        num_new_tokens=np.concatenate([z(chunk, pmask), z(1, dmask)], axis=1),
        num_output_tokens=np.concatenate([np.zeros((n, K), np.int64), z(generated + 1, dmask)], axis=1),
        mask=np.concatenate([pmask, dmask], axis=1),
    )
    phase = np.array(PHASES)[np.where(pmask.any(1) & dmask.any(1), 2, np.where(dmask.any(1), 1, 0))]
    return SampledSteps(steps, requests, phase)


def _expand(counts: np.ndarray, values: list[np.ndarray], where: str) -> tuple[list[np.ndarray], np.ndarray]:
    """Repeat each (step, column) entry ``counts`` times: arrays (S, C) → (S, W) padded, + mask.

    ``counts`` are a :class:`StepBatch` mask (multiplicities, see ``uniform_steps``)."""
    c = np.asarray(counts, np.float64)
    if np.any(c < 0) or np.any(c != np.round(c)):
        raise RoofcalError(f"{where}: request multiplicities must be non-negative integers")
    c = c.astype(np.int64)
    S = c.shape[0]
    per_step = c.sum(1)
    W = int(per_step.max()) if S else 0
    flat = c.ravel()
    rows = np.repeat(np.repeat(np.arange(S), c.shape[1]), flat)
    first = np.concatenate([[0], np.cumsum(per_step)[:-1]]) if S else np.zeros(0, np.int64)
    pos = np.arange(rows.size) - first[rows]
    out = []
    for v in values:
        a = np.zeros((S, W), np.int64)
        a[rows, pos] = np.repeat(np.asarray(v).ravel(), flat)
        out.append(a)
    mask = np.zeros((S, W), bool)
    mask[rows, pos] = True
    return out, mask


def blis_requests_from_steps(batch: StepBatch, where: str = "steps") -> BlisBatch:
    """BLIS requests of roofcal steps whose prompts are unknown (measured steps).

    A prefill chunk [new, cached] → input_len = cached + new (the chunk is assumed to complete the
    prompt), progress_index = cached, num_new_tokens = new, no output yet: BLIS classifies it as
    prefill since cached < cached + new. A decode at context c (KV length before the token, rounded
    to an integer) → input_len = progress_index = c, num_new_tokens = 1, num_output_tokens = 1:
    not prefill (progress ≥ input) and has output, so BLIS classifies it as decode with context c.
    Mask entries > 1 (multiplicities of ``uniform_steps``) become that many requests.
    """
    new = np.rint(np.asarray(batch.prefill_new, np.float64)).astype(np.int64)
    cached = np.rint(np.asarray(batch.prefill_cached, np.float64)).astype(np.int64)
    ctx = np.rint(np.asarray(batch.decode_ctx, np.float64)).astype(np.int64)
    (p_new, p_cached), pm = _expand(batch.prefill_mask, [new, cached], where)
    (d_ctx,), dm = _expand(batch.decode_mask, [ctx], where)
    return BlisBatch(
        input_len=np.concatenate([p_new + p_cached, d_ctx], axis=1),
        progress_index=np.concatenate([p_cached, d_ctx], axis=1),
        num_new_tokens=np.concatenate([p_new, dm.astype(np.int64)], axis=1),
        num_output_tokens=np.concatenate([np.zeros_like(p_new), dm.astype(np.int64)], axis=1),
        mask=np.concatenate([pm, dm], axis=1),
    )


def to_step_records(sample: SampledSteps, model: str | None = None, gpu: str | None = None,
                    tp: int | None = None) -> list[Step]:
    """The roofcal view as :class:`Step` records (for inspection or a step JSONL file)."""
    b = sample.steps
    out = []
    for i in range(len(sample)):
        pm, dm = b.prefill_mask[i] > 0, b.decode_mask[i] > 0
        chunks = tuple((int(a), int(c)) for a, c in zip(b.prefill_new[i][pm], b.prefill_cached[i][pm]))
        out.append(Step(chunks, tuple(int(c) for c in b.decode_ctx[i][dm]), model=model, gpu=gpu, tp=tp))
    return out

"""What a client sent to a server, request by request (and, when recorded, what it saw).

:class:`Requests` is the common currency of serving runs: the schedule inference-perf sent
(:meth:`roofcal.measurements.workload.Experiment.requests`) and a recorded TraceV2
(:mod:`roofcal.measurements.tracev2`) both become one; :mod:`roofcal.blis.trace` writes one as a
TraceV2 that ``blis replay`` replays.

A prompt is ``prefix_len`` tokens shared by every request of its ``prefix_group`` followed by
``suffix_len`` tokens of its own (BLIS's TraceV2 convention: ``prefix_length`` and a suffix-only
``input_tokens``). Times are integers in µs from the start of the run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

import numpy as np

#: tokens per KV block (vLLM's and BLIS's default): the prefix cache holds whole blocks only
BLOCK_TOKENS = 16


def _frozen(a, dtype) -> np.ndarray:
    out = np.array(a, dtype=dtype)
    out.setflags(write=False)
    return out


@dataclass(frozen=True, eq=False)
class Requests:
    """Columns of one run's requests, one entry per request, in the order they were sent.

    ``send_us``: when the client sent it (µs from the start); ``prefix_group`` (``""``: none),
    ``prefix_len`` / ``suffix_len``: its prompt (tokens, see the module docstring);
    ``output_tokens``: tokens the server generated; ``deadline_us``: when the client gives up
    (µs from the start, 0 = never); ``stage``: load stage (0 for a single-stage run).
    Recorded runs also carry ``first_chunk_us`` / ``last_chunk_us`` (0 when the request saw no
    token) and ``ok`` (the request succeeded).
    """

    request_id: np.ndarray
    send_us: np.ndarray
    prefix_group: np.ndarray
    prefix_len: np.ndarray
    suffix_len: np.ndarray
    output_tokens: np.ndarray
    deadline_us: np.ndarray
    stage: np.ndarray
    first_chunk_us: np.ndarray | None = field(default=None)
    last_chunk_us: np.ndarray | None = field(default=None)
    ok: np.ndarray | None = field(default=None)

    def __post_init__(self):
        kinds = {"prefix_group": object, "ok": bool}
        n = None
        for f in fields(self):
            v = getattr(self, f.name)
            if v is None:
                continue
            arr = _frozen(v, kinds.get(f.name, np.int64))
            object.__setattr__(self, f.name, arr)
            if n is not None and len(arr) != n:
                raise ValueError(f"Requests: column {f.name} has {len(arr)} entries, expected {n}")
            n = len(arr)

    def __len__(self) -> int:
        return len(self.request_id)

    @property
    def recorded(self) -> bool:
        """True when the per-request times the client saw are known."""
        return self.first_chunk_us is not None

    @property
    def prompt_tokens(self) -> np.ndarray:
        """Tokens of each prompt: prefix + suffix."""
        return self.prefix_len + self.suffix_len

    def cached_tokens(self, block: int = BLOCK_TOKENS) -> np.ndarray:
        """Prompt tokens each request finds in the prefix cache, were nothing ever evicted: the
        whole blocks of its prefix when an earlier request of its group was sent, else 0; never
        the whole prompt (the last token is always computed, as vLLM does)."""
        groups = self.prefix_group
        seen = np.zeros(len(self), bool)
        if len(self):
            order = np.argsort(self.send_us, kind="stable")
            g = groups[order]
            named = g != ""
            _, first = np.unique(g, return_index=True)
            repeat = np.ones(len(g), bool)
            repeat[first] = False
            seen[order] = repeat & named
        whole = (np.minimum(self.prefix_len, self.prompt_tokens - 1) // block) * block
        return np.where(seen, whole, 0)

    def take(self, mask) -> "Requests":
        """The requests where ``mask`` is true."""
        return Requests(**{f.name: (None if getattr(self, f.name) is None else getattr(self, f.name)[mask])
                           for f in fields(self)})

    # ---------------------------------------------------------------- what the client saw
    def ttft_us(self) -> np.ndarray:
        """Time to first token of each request (µs): first chunk − send (recorded runs)."""
        return (self.first_chunk_us - self.send_us).astype(np.float64)

    def e2e_us(self) -> np.ndarray:
        """End-to-end latency of each request (µs): last chunk − send (recorded runs)."""
        return (self.last_chunk_us - self.send_us).astype(np.float64)


def itl_us(e2e_us: np.ndarray, ttft_us: np.ndarray, output_tokens: np.ndarray) -> float:
    """Mean inter-token latency (µs): the mean over requests with ≥ 2 generated tokens of
    (E2E − TTFT) / (generated − 1) — the same rule on the measured and the simulated side. With
    every request generating the same count it equals (mean E2E − mean TTFT) / (count − 1)."""
    out = np.asarray(output_tokens, np.float64)
    sel = out >= 2
    if not sel.any():
        return math.nan
    return float(np.mean((np.asarray(e2e_us)[sel] - np.asarray(ttft_us)[sel]) / (out[sel] - 1.0)))

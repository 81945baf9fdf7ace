"""The :class:`Work` record shared by every component, and ideal (roofline) times."""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp


class Work(NamedTuple):
    """Work of one kernel call; every field has the batch shape of the inputs.

    ``flops``: floating-point operations (multiply-add = 2).
    ``bytes``: bytes moved through device memory, or over the GPU link for communication.
    ``shape``: tuple of descriptor arrays the correction layer's efficiency surface reads
    (for example ``(m, n, k)`` of a GEMM); see ``roofcal.model.correction.OP_KINDS``.
    """

    flops: jnp.ndarray
    bytes: jnp.ndarray
    shape: tuple


def ideal_times(work: Work, peak_flops_per_us: float, bytes_per_us: float):
    """(compute µs, memory µs) at the datasheet peaks: FLOPs / (FLOP/µs), bytes / (B/µs)."""
    return work.flops / peak_flops_per_us, work.bytes / bytes_per_us

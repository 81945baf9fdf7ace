"""Tensor-parallel communication."""

from __future__ import annotations

import jax.numpy as jnp

from .base import Work


#: vLLM's custom all-reduce handles messages below 8 MiB (its buffer size,
#: ``CustomAllreduce(max_size=8192 * 1024)``); larger ones go to NCCL. The measured latency jumps
#: there (A100, 2 GPUs: 25 µs at 4 MiB, 90 µs at 8 MiB), so the regime is a shape descriptor.
CUSTOM_ALLREDUCE_MAX_BYTES = 8 * 2 ** 20


def allreduce(num_gpus, message_bytes) -> Work:
    """Work of one all-reduce of ``message_bytes`` per GPU across ``num_gpus`` GPUs.

    Bytes = ring volume sent by each GPU over its link: 2·(g−1)/g·message (reduce-scatter then
    all-gather). FLOPs = (g−1)/g·message/2 additions (bf16 elements), negligible but counted.
    Shape descriptors: (num_gpus, message_bytes, 1 if message ≥ 8 MiB else 0).
    Zero work when ``num_gpus`` = 1.

    Example: 8 GPUs, 16 MiB: each GPU sends 2·7/8·16 MiB = 28 MiB.
    """
    frac = (num_gpus - 1.0) / num_gpus
    large = (jnp.asarray(message_bytes) >= CUSTOM_ALLREDUCE_MAX_BYTES).astype(jnp.float32)
    return Work(frac * message_bytes / 2.0, 2.0 * frac * message_bytes,
                (num_gpus, message_bytes, large))

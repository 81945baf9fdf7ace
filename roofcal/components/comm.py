"""Tensor-parallel communication."""

from __future__ import annotations

from .base import Work


def allreduce(num_gpus, message_bytes) -> Work:
    """Work of one all-reduce of ``message_bytes`` per GPU across ``num_gpus`` GPUs.

    Bytes = ring volume sent by each GPU over its link: 2·(g−1)/g·message (reduce-scatter then
    all-gather). FLOPs = (g−1)/g·message/2 additions (bf16 elements), negligible but counted.
    Shape descriptors: (num_gpus, message_bytes). Zero work when ``num_gpus`` = 1.

    Example: 8 GPUs, 16 MiB: each GPU sends 2·7/8·16 MiB = 28 MiB.
    """
    frac = (num_gpus - 1.0) / num_gpus
    return Work(frac * message_bytes / 2.0, 2.0 * frac * message_bytes, (num_gpus, message_bytes))

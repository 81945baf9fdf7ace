"""Communication between GPUs: the tensor-parallel all-reduce, and the all-gather, reduce-scatter
and all-to-all that data- and expert-parallel deployments run."""

from __future__ import annotations

import jax.numpy as jnp

from .base import Work


#: vLLM's custom all-reduce handles messages below 8 MiB (its buffer size,
#: ``CustomAllreduce(max_size=8192 * 1024)``); larger ones go to NCCL. The measured latency jumps
#: there (A100, 2 GPUs: 25 µs at 4 MiB, 90 µs at 8 MiB), so the regime is a shape descriptor.
CUSTOM_ALLREDUCE_MAX_BYTES = 8 * 2 ** 20
#: Below that, the custom all-reduce picks its kernel by size (vLLM ``csrc/custom_all_reduce.cuh``,
#: full NVLink): one stage (each GPU reads every peer's buffer and reduces) on 2 GPUs, and on up to
#: 4 GPUs below 512 KiB or up to 8 below 256 KiB; otherwise two stages (reduce-scatter, then
#: all-gather), with a second synchronisation. The measured latency jumps there (H100, 8 GPUs:
#: 7.7 µs at 128 KiB, 14.7 µs at 256 KiB; 4 GPUs: 7.1 µs at 256 KiB, 11.4 µs at 512 KiB).
ONE_STAGE_MAX_BYTES = {4: 512 * 2 ** 10, 8: 256 * 2 ** 10}


def two_stage(num_gpus, message_bytes):
    """1.0 where vLLM's custom all-reduce runs its two-stage kernel for a message of
    ``message_bytes`` bytes, else 0.0 (see :data:`ONE_STAGE_MAX_BYTES`; 2 GPUs always one stage,
    more than 8 treated as 8). NCCL rows carry it too, as a size regime their surface may use."""
    g = jnp.asarray(num_gpus, jnp.float32)
    limit = jnp.where(g <= 4.0, ONE_STAGE_MAX_BYTES[4], ONE_STAGE_MAX_BYTES[8])
    return ((g > 2.0) & (jnp.asarray(message_bytes) >= limit)).astype(jnp.float32)


def allreduce(num_gpus, message_bytes) -> Work:
    """Work of one all-reduce of ``message_bytes`` per GPU across ``num_gpus`` GPUs.

    Bytes = ring volume sent by each GPU over its link: 2·(g−1)/g·message (reduce-scatter then
    all-gather). FLOPs = (g−1)/g·message/2 additions (bf16 elements), negligible but counted.
    Shape descriptors: (num_gpus, message_bytes, 1 if message ≥ 8 MiB else 0, 1 where the custom
    all-reduce runs two stages else 0: :func:`two_stage`).
    Zero work when ``num_gpus`` = 1.

    Example: 8 GPUs, 16 MiB: each GPU sends 2·7/8·16 MiB = 28 MiB.
    """
    frac = (num_gpus - 1.0) / num_gpus
    large = (jnp.asarray(message_bytes) >= CUSTOM_ALLREDUCE_MAX_BYTES).astype(jnp.float32)
    return Work(frac * message_bytes / 2.0, 2.0 * frac * message_bytes,
                (num_gpus, message_bytes, large, two_stage(num_gpus, message_bytes)))


#: collectives other than the all-reduce, each moving (g−1)/g of its buffer per GPU (NCCL's ring and
#: pairwise algorithms): the all-gather (buffer = the gathered output), the reduce-scatter (buffer =
#: the input, reduced as it passes) and the all-to-all (buffer = the send buffer, a 1/g slice kept)
COLLECTIVES = ("allgather", "reducescatter", "alltoall")


def collective(name: str, num_gpus, buffer_bytes) -> Work:
    """Work of one NCCL collective ``name`` (:data:`COLLECTIVES`) of a ``buffer_bytes`` buffer
    across ``num_gpus`` GPUs, as nccl-tests sizes it (the whole buffer, not a per-GPU part).

    Bytes = what each GPU sends over its link: (g−1)/g·buffer. FLOPs = the reduce-scatter's
    additions, (g−1)/g·buffer/2 (bf16 elements); 0 for the others. Shape descriptors:
    (num_gpus, buffer_bytes). Zero work when ``num_gpus`` = 1.

    Example: an all-to-all of 64 MiB across 8 GPUs: each GPU sends 7/8·64 MiB = 56 MiB (its own
    eighth stays), 130 µs over a 450 GB/s link at full speed.
    """
    if name not in COLLECTIVES:
        raise ValueError(f"unknown collective {name!r} (known: {', '.join(COLLECTIVES)})")
    frac = (num_gpus - 1.0) / num_gpus
    sent = frac * buffer_bytes
    flops = sent / 2.0 if name == "reducescatter" else 0.0 * sent
    return Work(flops, sent, (num_gpus, buffer_bytes))

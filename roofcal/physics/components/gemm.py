"""Dense matrix multiply ``y = x · W`` with ``x`` of shape m×k and ``W`` of shape k×n."""

from __future__ import annotations

from .base import Work


def gemm(m, n, k, act_bytes=2.0, weight_bytes=2.0, out_bytes=2.0) -> Work:
    """Work of one GEMM.

    FLOPs = 2·m·n·k. Bytes = m·k·act_bytes (read x) + k·n·weight_bytes (read W)
    + m·n·out_bytes (write y). Shape descriptors: (m, n, k). No work at all when m = 0 (the
    kernel is not launched, so its weights are not read).

    Example: Llama-2-7B's QKV projection for 1 token is m=1, n=3·4096, k=4096:
    2·1·12288·4096 = 100,663,296 FLOPs and 4096·12288·2 = 100,663,296 weight bytes.
    """
    flops = 2.0 * m * n * k
    nbytes = m * k * act_bytes + k * n * weight_bytes * (m > 0) + m * n * out_bytes
    return Work(flops, nbytes, (m, n, k))

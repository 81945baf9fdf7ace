"""Dense matrix multiply ``y = x · W`` with ``x`` of shape m×k and ``W`` of shape k×n."""

from __future__ import annotations

import jax.numpy as jnp

from .base import Work

#: vLLM's CUTLASS FP8 (per-tensor / per-channel scaled) GEMM on Hopper picks its tile by the
#: token count m (``csrc/quantization/w8a8/cutlass/c3x/scaled_mm_sm90_fp8_dispatch.cuh``):
#: (largest m, rows of work per tile along m). Up to 64 tokens it swaps the operands, so m runs
#: along the tile's narrow side (16 rows; 64 with the cluster of 4 or the 64-wide tile above 16
#: tokens); up to 128 a 64-row tile in a cluster of 2; beyond, 128-row tiles in clusters of 2, so
#: m is computed in blocks of 256. The last block is computed whole: the measured time steps there
#: (vLLM 0.24, H100, n = k = 8192: 37.7 µs at m = 256, 80.0 µs at 257; 57.5 µs at 512, 112.7 at 513).
CUTLASS_FP8_M_BLOCKS = ((16, 16), (64, 64), (128, 128), (float("inf"), 256))
#: rows of the tile along n: 64 where the operands are swapped (m ≤ 64), else 128
CUTLASS_FP8_N_BLOCK = ((64, 64), (float("inf"), 128))
#: the tile-configuration descriptor of each m range (its configuration's efficiency is its own):
#: 4 up to 16 tokens, 3 up to 64, 2 up to 128; beyond, 0 where m fills its last 256-row block and
#: 1 where it leaves it part-empty (such a block costs more than its rows even counted whole)
CUTLASS_FP8_CONFIG = ((16, 4.0), (64, 3.0), (128, 2.0), (float("inf"), 0.0))


def _block(m, table):
    """The value of the first entry of ``table`` (bound, value) whose bound m is at or below."""
    out = jnp.full(jnp.shape(m), float(table[-1][1]), jnp.float32)
    for bound, size in reversed(table[:-1]):
        out = jnp.where(m <= bound, float(size), out)
    return out


def cutlass_fp8_tiles(m, n):
    """(m, n rounded up to whole tiles of vLLM's CUTLASS FP8 GEMM, its tile configuration
    :data:`CUTLASS_FP8_CONFIG`); see :data:`CUTLASS_FP8_M_BLOCKS`. m, n in elements.

    Example: m = 257, n = 8192 → (512, 8192, 1); m = 100, n = 1000 → (128, 1024, 2).
    """
    m = jnp.asarray(m, jnp.float32)
    bm, bn = _block(m, CUTLASS_FP8_M_BLOCKS), _block(m, CUTLASS_FP8_N_BLOCK)
    m_tiled = jnp.ceil(m / bm) * bm
    part_filled = (m > CUTLASS_FP8_CONFIG[-2][0]) & (m_tiled != m)
    config = jnp.where(part_filled, 1.0, _block(m, CUTLASS_FP8_CONFIG))
    return m_tiled, jnp.ceil(jnp.asarray(n, jnp.float32) / bn) * bn, config


def gemm(m, n, k, act_bytes=2.0, weight_bytes=2.0, out_bytes=2.0, tiled=False) -> Work:
    """Work of one GEMM.

    FLOPs = 2·m·n·k. Bytes = m·k·act_bytes (read x) + k·n·weight_bytes (read W)
    + m·n·out_bytes (write y). Shape descriptors: (m, n, k, tile configuration). No work at all
    when m = 0 (the kernel is not launched, so its weights are not read).

    ``tiled``: the GEMM is vLLM's CUTLASS FP8 kernel, whose tensor cores compute whole tiles:
    FLOPs count m and n rounded up to them, and the tile-configuration descriptor says which of
    its configurations runs (:func:`cutlass_fp8_tiles`); otherwise (cuBLAS, which picks its
    tiles per shape at run time) FLOPs are the exact count and the descriptor is 0. The tiles
    are Hopper's (SM90) dispatch, applied to an FP8 GEMM on any GPU.

    Example: Llama-2-7B's QKV projection for 1 token is m=1, n=3·4096, k=4096:
    2·1·12288·4096 = 100,663,296 FLOPs and 4096·12288·2 = 100,663,296 weight bytes; as an FP8
    CUTLASS GEMM the one token fills a 16-row tile: 16 × as many FLOPs.
    """
    nbytes = m * k * act_bytes + k * n * weight_bytes * (m > 0) + m * n * out_bytes
    if tiled:
        mt, nt, config = cutlass_fp8_tiles(m, n)
        return Work(2.0 * mt * nt * k, nbytes, (m, n, k, config))
    return Work(2.0 * m * n * k, nbytes, (m, n, k, 0.0))

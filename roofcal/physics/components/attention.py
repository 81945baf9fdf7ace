"""Attention kernels: causal prefill (with a cached prefix, i.e. chunked prefill) and decode.

Heads are those of one GPU. ``qk_dim`` is the query/key head size, ``v_dim`` the value head size
(equal for standard attention). ``kv_elems`` is the KV-cache elements stored per token per layer on
this GPU (``kv_heads·(qk_dim + v_dim)`` normally; the latent width for MLA).
"""

from __future__ import annotations

import jax.numpy as jnp

from .base import Work


def prefill_attention(seqs, new_tokens, pairs, cached_tokens, heads, kv_heads, qk_dim, v_dim,
                      kv_elems, act_bytes=2.0, kv_bytes=2.0) -> Work:
    """Work of one varlen causal-attention call over ``seqs`` prefill chunks.

    ``new_tokens`` = Σ new, ``cached_tokens`` = Σ cached (prefix KV read), ``pairs`` = causal
    (query, key) pairs Σ new·(cached + (new+1)/2).
    FLOPs = 2·heads·(qk_dim + v_dim)·pairs (QKᵀ and PV, multiply-add = 2).
    Bytes = Q read + O write: new·heads·(qk_dim + v_dim)·act_bytes
          + K,V read of prefix and chunk, and KV-cache write of the chunk:
            (cached + 2·new)·kv_elems·kv_bytes.
    Shape descriptors: (seqs, equivalent chunk length per seq, cached per seq, heads, kv_heads,
    qk_dim). The equivalent length n (tokens) is the uncached chunk with the same causal pairs as the
    mean chunk, n(n+1)/2 = s(s+1)/2 + s·c for mean new s and mean cached c, i.e.
    n = (√((2s+1)² + 8sc) − 1)/2; without a cache n = s. The per-op tables hold no cached prefix, so
    the efficiency of a chunk over cached KV is looked up at the uncached chunk doing the same work
    (one query over 762 cached keys: n ≈ 38.6) instead of at a one-token chunk, whose launch-bound
    efficiency would otherwise be charged to all 762 keys.

    Example: one 128-token chunk, no cache, 32 heads of 128: pairs = 128·129/2 = 8256,
    FLOPs = 2·32·256·8256 = 135,266,304.
    """
    flops = 2.0 * heads * (qk_dim + v_dim) * pairs
    nbytes = new_tokens * heads * (qk_dim + v_dim) * act_bytes \
        + (cached_tokens + 2.0 * new_tokens) * kv_elems * kv_bytes
    per_seq = seqs + (seqs == 0)
    new, cached = new_tokens / per_seq, cached_tokens / per_seq
    return Work(flops, nbytes, (seqs, equivalent_chunk(jnp, new, cached), cached, heads, kv_heads, qk_dim))


def equivalent_chunk(xp, new, cached):
    """The uncached chunk length n (tokens) with the causal pairs of ``new`` tokens over
    ``cached`` ones per sequence: n(n+1)/2 = s(s+1)/2 + s·c, n = (√((2s+1)² + 8sc) − 1)/2.
    ``xp``: numpy or jax.numpy. Example: one token over 762 cached keys: n ≈ 38.55."""
    return 0.5 * (xp.sqrt((2.0 * new + 1.0) ** 2 + 8.0 * new * cached) - 1.0)


def prefix_share(xp, seq_len, cached):
    """Share of a prefill chunk's causal (query, key) pairs that are against its cached prefix,
    in [0, 1), from its attention descriptors: the equivalent uncached chunk ``seq_len`` n and the
    cached tokens c per sequence (tokens). The mean new tokens s solve n(n+1)/2 = s(s+1)/2 + s·c;
    the share is s·c / (n(n+1)/2). ``xp``: numpy or jax.numpy.

    Example: one new token over 762 cached keys, n = 38.55: s = 1, share 762/763."""
    n, c = seq_len, cached
    s = 0.5 * (xp.sqrt((1.0 + 2.0 * c) ** 2 + 4.0 * n * (n + 1.0)) - (1.0 + 2.0 * c))
    pairs = 0.5 * n * (n + 1.0)
    return xp.where(pairs > 0, s * c / xp.where(pairs > 0, pairs, 1.0), 0.0)


def decode_attention(seqs, kv_tokens, heads, kv_heads, qk_dim, v_dim, kv_elems, act_bytes=2.0,
                     kv_bytes=2.0) -> Work:
    """Work of one decode-attention call: ``seqs`` single queries over ``kv_tokens`` keys in all.

    ``kv_tokens`` = Σ (context + 1) (each query also attends to its own new key).
    FLOPs = 2·heads·(qk_dim + v_dim)·kv_tokens.
    Bytes = KV read kv_tokens·kv_elems·kv_bytes + KV write of the new tokens seqs·kv_elems·kv_bytes
          + Q read and O write seqs·heads·(qk_dim + v_dim)·act_bytes.
    Shape descriptors: (seqs, context per seq, heads, kv_heads, qk_dim).

    Example: 1 sequence at context 1023, 8 KV heads of 128, bf16: KV read 1024·2048·2 = 4 MiB.
    """
    flops = 2.0 * heads * (qk_dim + v_dim) * kv_tokens
    nbytes = (kv_tokens + seqs) * kv_elems * kv_bytes + seqs * heads * (qk_dim + v_dim) * act_bytes
    per_seq = seqs + (seqs == 0)
    return Work(flops, nbytes, (seqs, jnp.maximum(kv_tokens / per_seq - 1.0, 0.0), heads, kv_heads,
                                qk_dim))

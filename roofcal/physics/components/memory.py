"""Memory-bound elementwise work of a transformer layer (norms, residuals, activation, rotary)."""

from __future__ import annotations

from .base import Work


def elementwise(tokens, hidden, inter, q_width, kv_width, act_bytes=2.0, gated=True) -> Work:
    """Work of one layer's elementwise kernels for ``tokens`` tokens (widths per GPU).

    Element traffic per token: two RMSNorms (read + write hidden: 4·hidden), two residual adds
    (read 2, write 1: 6·hidden), activation (gated: read 2·inter, write inter; plain: 2·inter) and
    rotary embedding of queries and keys (read + write: 2·(q_width + kv_width)).
    Bytes = tokens·elements·act_bytes; FLOPs ≈ 4 per element touched (counted, never dominant).
    Shape descriptors: (tokens, hidden).

    Example: Llama-2-7B, 1 token, TP 1: 10·4096 + 3·11008 + 2·(4096 + 4096) = 90,368 elements,
    180,736 bytes.
    """
    act = (3.0 if gated else 2.0) * inter
    elems = tokens * (10.0 * hidden + act + 2.0 * (q_width + kv_width))
    return Work(4.0 * elems, elems * act_bytes, (tokens, hidden))

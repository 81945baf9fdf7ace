"""Mixture-of-experts layer: the routed expert GEMMs of vLLM's fused MoE kernel, with routing physics.

The router GEMM that picks the experts is a separate kernel (a replicated linear layer before the
fused MoE call), a GEMM of its own in a step (:func:`roofcal.physics.decompose.step_ops`); it is
not part of this component, nor of the per-op MoE measurements (aiconfigurator's vLLM collector
times ``fused_experts`` on precomputed top-k ids and weights).

Routing decides two quantities on the busiest GPU (the one that sets the layer's time):
``pairs``, the (token, expert) pairs it computes, and ``active``, the distinct experts whose
weights it reads.

* **balanced** (``skew = 0``, the step model's assumption, as BLIS's balanced placement and
  aiconfigurator's balanced tables): the T·k pairs are spread evenly, so a GPU gets
  ⌈T·k/ep⌉ pairs on min(E/ep, ⌈T·k/ep⌉) distinct experts.
* **power law** (``skew = α > 0``): expert i is chosen with probability ∝ (i+1)^−α; experts are
  placed in order, so GPU 0 holds the hottest. A token picks expert i with
  q_i = min(1, k·p_i); the GPU computes T·Σ q_i pairs on Σ (1 − (1 − q_i)^T) expected distinct
  experts (sums over its experts). α = 0 would be uniform random routing:
  E·(1 − (1 − k/E)^T) active experts (:func:`expected_active_experts`).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from .base import Work

#: largest expert count the power-law routing sums over (static, for jit) unless told a smaller one
MAX_EXPERTS = 1024


def experts_bound(experts) -> int:
    """The power of two (≥ 8, ≤ :data:`MAX_EXPERTS`) the power-law routing of rows with these
    expert counts sums over: every term past a row's own count is an exact zero, so any bound at
    or above the largest count gives the same values, and a smaller one less work (a table of
    MoE rows with up to 256 experts: a quarter of the 1,024 terms per row)."""
    top = float(np.max(experts)) if np.size(experts) else 1.0
    if not np.isfinite(top) or top > MAX_EXPERTS:
        return MAX_EXPERTS
    return max(8, 1 << max(0, int(np.ceil(top)) - 1).bit_length())


def expected_active_experts(tokens, topk, experts):
    """Expected number of distinct experts chosen by ``tokens`` tokens under uniform random routing.

    Each token picks ``topk`` distinct experts of ``experts``, so an expert is missed by one token
    with probability 1 − topk/experts and by all of them with (1 − topk/experts)^tokens:
    E[active] = experts·(1 − (1 − topk/experts)^tokens).
    Example: Mixtral (8 experts, top-2): 1 token → 2, 2 tokens → 3.5, 16 tokens → 7.92.
    """
    miss = jnp.clip(1.0 - topk / experts, 0.0, 1.0)
    return experts * (1.0 - miss ** tokens)


def routing(tokens, topk, experts, ep=1.0, skew=0.0, max_experts: int = MAX_EXPERTS):
    """(pairs, active experts) on the busiest of ``ep`` GPUs; see the module docstring.

    ``max_experts`` (static): how many experts the power-law sums run over, at least the largest
    ``experts`` (:func:`experts_bound`); a ``skew`` given as the number 0 (a step's balanced
    routing) computes no power law at all."""
    balanced_only = isinstance(skew, (int, float)) and skew == 0
    tokens, topk, experts, ep, skew = (jnp.asarray(x, jnp.float32) for x in
                                       (tokens, topk, experts, ep, skew))
    local = experts / ep
    pairs_bal = jnp.ceil(tokens * topk / ep)
    active_bal = jnp.minimum(local, pairs_bal)
    if balanced_only:
        return pairs_bal, active_bal
    i = jnp.arange(max_experts, dtype=jnp.float32)
    e = experts[..., None]
    w = jnp.where(i < e, (i + 1.0) ** -skew[..., None], 0.0)
    q = jnp.minimum(1.0, topk[..., None] * w / jnp.sum(w, axis=-1, keepdims=True))
    mine = (i < local[..., None]).astype(jnp.float32)
    pairs_pl = tokens * jnp.sum(mine * q, axis=-1)
    active_pl = jnp.sum(mine * (1.0 - (1.0 - q) ** tokens[..., None]), axis=-1)
    skewed = skew > 0
    return jnp.where(skewed, pairs_pl, pairs_bal), jnp.where(skewed, active_pl, active_bal)


def moe(tokens, hidden, inter, topk, experts, tp=1.0, ep=1.0, weight_bytes=2.0, act_bytes=2.0,
        matrices=3.0, skew=0.0, max_experts: int = MAX_EXPERTS) -> Work:
    """Work of one MoE layer on the busiest GPU (experts split over ``ep``, each FFN over ``tp``).

    With ``i = inter/tp`` and (pairs, active) from :func:`routing`:
    FLOPs = pairs·2·hidden·i·matrices (gate, up, down); the router is not included (module
    docstring).
    Bytes = active·matrices·hidden·i·weight_bytes (expert weights read)
          + tokens·hidden·2·act_bytes + pairs·(2·hidden + 3·i)·act_bytes (activations; an FP8
          kernel's quantisation of its inputs happens inside the call and is within these).
    Shape descriptors: (tokens, hidden, inter, topk, experts, tp, ep, skew). ``max_experts``: see
    :func:`routing`.

    Example: Mixtral at TP 1, one token, balanced: 2 pairs on 2 experts,
    FLOPs = 2·2·4096·14336·3 = 704,643,072; expert weights 2·3·4096·14336·2 bytes.
    """
    pairs, active = routing(tokens, topk, experts, ep, skew, max_experts)
    i = inter / tp
    flops = pairs * 2.0 * hidden * i * matrices
    nbytes = active * matrices * hidden * i * weight_bytes \
        + tokens * hidden * 2.0 * act_bytes + pairs * (2.0 * hidden + 3.0 * i) * act_bytes
    return Work(flops, nbytes, (tokens, hidden, inter, topk, experts, tp, ep, skew))

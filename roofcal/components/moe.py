"""Mixture-of-experts layer: router plus routed expert GEMMs (vLLM fused MoE)."""

from __future__ import annotations

import jax.numpy as jnp

from .base import Work


def expected_active_experts(tokens, topk, experts):
    """Expected number of distinct experts chosen by ``tokens`` tokens with uniform routing.

    Each token picks ``topk`` distinct experts of ``experts``, so an expert is missed by one token
    with probability 1 − topk/experts and by all of them with (1 − topk/experts)^tokens:
    E[active] = experts·(1 − (1 − topk/experts)^tokens).
    Example: Mixtral (8 experts, top-2): 1 token → 2, 2 tokens → 3.5, 16 tokens → 7.92.
    """
    miss = jnp.clip(1.0 - topk / experts, 0.0, 1.0)
    return experts * (1.0 - miss ** tokens)


def moe(tokens, hidden, inter, topk, experts, tp=1.0, ep=1.0, weight_bytes=2.0, act_bytes=2.0,
        matrices=3.0, skew=0.0) -> Work:
    """Work of one MoE layer on one GPU (experts split over ``ep``, each expert's FFN over ``tp``).

    With ``i = inter/tp`` and ``r = tokens·topk/ep`` routed (token, expert) pairs on this GPU:
    FLOPs = r·2·hidden·i·matrices (gate, up, down) + 2·tokens·hidden·experts (router).
    Bytes = weights of the active local experts: E[active]/ep·matrices·hidden·i·weight_bytes
          + activations: tokens·hidden·2·act_bytes + r·(2·hidden + 3·i)·act_bytes.
    Shape descriptors: (tokens, hidden, inter, topk, experts, tp, ep, skew), where ``skew`` is the
    routing imbalance (0 balanced; the power-law exponent in the microbenchmarks).

    Example: Mixtral at TP 1, one token: r = 2, FLOPs = 2·2·4096·14336·3 + 2·4096·8
    = 704,708,608; expert weights 2·3·4096·14336·2 bytes = 704,643,072.
    """
    i = inter / tp
    routed = tokens * topk / ep
    active = expected_active_experts(tokens, topk, experts) / ep
    flops = routed * 2.0 * hidden * i * matrices + 2.0 * tokens * hidden * experts
    nbytes = active * matrices * hidden * i * weight_bytes \
        + tokens * hidden * 2.0 * act_bytes + routed * (2.0 * hidden + 3.0 * i) * act_bytes
    return Work(flops, nbytes, (tokens, hidden, inter, topk, experts, tp, ep, skew))

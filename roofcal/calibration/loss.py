"""Losses of the coefficient fit: the relative-error loss (:func:`roofcal.metrics.log_ratio_sq`,
re-exported here with the other measures) and the Gaussian prior on parameters."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from roofcal.metrics import error_summary, log_ratio_sq, mape  # noqa: F401  (the fit's measures)


def prior_penalty(params, center, strength):
    """Σ strength·(θ − θ₀)² over matching leaves of three pytrees (missing centers are skipped)."""
    terms = jax.tree_util.tree_map(lambda p, c, s: jnp.sum(s * (p - c) ** 2), params, center, strength)
    return sum(jax.tree_util.tree_leaves(terms))

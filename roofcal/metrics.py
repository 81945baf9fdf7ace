"""Relative-error measures and held-out splits, shared by every fit and report.

The fitting loss is the mean squared log-ratio ``mean(log(pred / measured)²)``:

* relative: a 2 µs kernel and a 2 s prefill count alike, as timing noise is multiplicative;
* symmetric: predicting 2× too slow costs the same as 2× too fast (MAPE punishes
  over-prediction more, and invites a downward bias);
* smooth with a simple gradient, and for small errors ≈ the squared relative error.
MAPE, bias and percentiles are reported alongside, as users read them.
"""

from __future__ import annotations

import math

import numpy as np


def log_ratio_sq(pred, measured, weight=None):
    """Weighted mean of log(pred/measured)² (weights default to 1; zero weights drop rows).
    Works on NumPy and JAX arrays alike."""
    xp = _xp(pred)
    r = xp.log(xp.maximum(pred, 1e-12) / measured) ** 2
    if weight is None:
        return xp.mean(r)
    return xp.sum(weight * r) / xp.maximum(xp.sum(weight), 1.0)


def _xp(a):
    if type(a).__module__.startswith("jax"):
        import jax.numpy as jnp
        return jnp
    return np


def error_summary(pred, measured) -> dict:
    """MAPE %, signed mean relative error % (bias), p50/p90/p99 of |relative error| %, count."""
    pred, measured = np.asarray(pred, np.float64), np.asarray(measured, np.float64)
    if len(measured) == 0:
        return {"n": 0}
    rel = pred / measured - 1.0
    a = np.abs(rel) * 100.0
    return {"n": int(len(measured)), "mape": float(np.mean(a)), "bias": float(np.mean(rel) * 100.0),
            "p50": float(np.percentile(a, 50)), "p90": float(np.percentile(a, 90)),
            "p99": float(np.percentile(a, 99))}


def mape(pred, meas) -> float:
    """Mean absolute percentage error, %."""
    pred, meas = np.asarray(pred, float), np.asarray(meas, float)
    return float(np.mean(np.abs(pred / meas - 1.0)) * 100.0) if len(meas) else math.nan


def split_groups(groups_: np.ndarray, holdout: float, seed: int) -> np.ndarray:
    """Boolean test mask holding out whole groups (e.g. step configurations), seeded."""
    rng = np.random.default_rng(seed)
    uniq = np.array(sorted(set(groups_.tolist())))
    k = int(round(holdout * len(uniq)))
    chosen = set(rng.choice(uniq, size=k, replace=False).tolist()) if k else set()
    return np.array([g in chosen for g in groups_])

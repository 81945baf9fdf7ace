"""The operating point of a sustained load: the SM clock a power-limited GPU holds for a stream of
steps, and how much longer compute-bound time runs there than in the bursts the kernels were
timed in.

In: the native model (``params``, a deployment: model, GPU, TP), a stream — its steps and how
often each runs — and the GPU's :class:`~roofcal.physics.power.PowerModel` (a coefficient file's
``power`` block, else the datasheet's defaults: :func:`power_of`).
Out: an :class:`OperatingPoint`; :func:`roofcal.model.combine.at_compute_scale` puts it into
``params`` so that every step time is predicted at that clock.

The stream's mean cycle ``T``, its energy at the boost clock ``E`` (from the ideal compute and
memory time of its kernels) and the cycle's sensitivity to the compute scale ``dT/ds`` (the
compute-bound share of the cycle, by forward-mode differentiation of the step model) give the
clock by :func:`roofcal.physics.power.clock_ratio`; the step times move with the clock, so the
solve is repeated around the new scale (:data:`ITERATIONS`; it changes by < 1e-4 after the
second).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from roofcal.model.combine import at_compute_scale, padded, step_breakdown
from roofcal.physics import power as P

#: fixed-point passes of :func:`operating_point` (re-linearising the cycle around the last scale)
ITERATIONS = 3
#: how a prediction is clocked: ``burst`` — as the per-op tables were timed (the boost clock,
#: today's kernels exactly); ``sustained`` — at the clock the stream's power allows
CLOCKS = ("burst", "sustained")


@dataclass(frozen=True)
class OperatingPoint:
    """Where a stream runs: SM clock ratio ``ratio`` (of the boost clock) and ``clock_mhz`` (NaN
    when the datasheet has no boost clock), the ``compute_scale`` of its compute-bound time
    (≥ 1), the power it would draw at the boost clock (``demand_w``) and draws at its clock
    (``power_w``), W; ``limit_w``: the board's limit (0: none modelled)."""

    ratio: float
    clock_mhz: float
    compute_scale: float
    demand_w: float
    power_w: float
    limit_w: float

    @property
    def limited(self) -> bool:
        """Whether the power limit lowers the clock."""
        return self.ratio < 1.0

    def text(self) -> str:
        clock = f"{self.clock_mhz:,.0f} MHz" if math.isfinite(self.clock_mhz) else f"{self.ratio:.2f} of boost"
        if not self.limit_w:
            return "burst clock (no power limit in the datasheet)"
        if not self.limited:
            return f"boost clock ({self.demand_w:,.0f} W of {self.limit_w:,.0f})"
        return (f"power-limited: SM {clock}, compute-bound time x{self.compute_scale:.3f} "
                f"({self.demand_w:,.0f} W at boost against {self.limit_w:,.0f})")


def burst(pm: P.PowerModel | None) -> OperatingPoint:
    """The operating point of the per-op tables: the boost clock."""
    limit = pm.limit_w if pm is not None else 0.0
    mhz = pm.boost_mhz if pm is not None and pm.boost_mhz > 0 else math.nan
    return OperatingPoint(1.0, mhz, 1.0, math.nan, math.nan, limit)


def power_of(coeffs, gpu) -> P.PowerModel | None:
    """The power model of ``gpu``: the coefficient file's fitted ``power`` block when it has one
    (:attr:`~roofcal.model.coeffs.Coefficients.power`) at the datasheet's power limit and boost
    clock (so a what-if or a probe's overlay of the limit applies), else the datasheet's defaults
    (:func:`roofcal.physics.power.default_power`); None when neither gives a power limit."""
    pm = getattr(coeffs, "power", None) if coeffs is not None else None
    if pm is not None:                 # the fitted parameters, under the datasheet's own limit (a what-if,
        from dataclasses import replace   # an overlay a probe measured) when it gives one
        return replace(pm, limit_w=gpu.power_limit_w or pm.limit_w, boost_mhz=gpu.boost_clock_mhz or pm.boost_mhz)
    if gpu.power_limit_w > 0:
        return P.default_power(gpu.power_limit_w, gpu.boost_clock_mhz)
    return None


def step_terms(params: dict, model, gpu, tp: int, batch, scale: float = 1.0) -> dict:
    """Per step at compute scale ``scale``: ``total`` (µs), its sensitivity ``sens`` = dT/ds (µs
    per unit of scale), ``ideal_compute`` and ``ideal_memory`` (µs). Arrays of shape (S,),
    computed :func:`~roofcal.model.combine.padded` as :func:`~roofcal.model.combine.step_breakdown`
    is."""
    out = _step_terms(params, model, gpu, tp, padded(batch), np.float32(scale))
    return {k: v[:batch.num_steps] for k, v in out.items()}


@partial(jax.jit, static_argnames=("model", "gpu", "tp"))
def _step_terms(params: dict, model, gpu, tp: int, batch, scale) -> dict:
    """:func:`step_terms` as one compiled program (traced once per deployment and padded batch size;
    a ``jvp`` outside ``jit`` traced the whole step again at every call)."""
    f = lambda s: step_breakdown(at_compute_scale(params, s), model, gpu, tp, batch)
    out, tangent = jax.jvp(f, (scale,), (jnp.float32(1.0),))
    return {"total": out["total"], "sens": tangent["total"], "ideal_compute": out["ideal_compute"],
            "ideal_memory": out["ideal_memory"]}


def operating_point(pm: P.PowerModel | None, params: dict, model, gpu, tp: int, batch,
                    weights=None, idle_us: float = 0.0) -> OperatingPoint:
    """The operating point of a stream of the steps of ``batch``, step i running ``weights[i]``
    times as often as the others (default: each once), each followed by ``idle_us`` µs idle; the
    burst clock when ``pm`` is None. Empty steps (no tokens) do no work and are left out."""
    if pm is None:
        return burst(pm)
    w = np.ones(batch.num_steps) if weights is None else np.asarray(weights, np.float64)
    busy = (np.asarray(batch.prefill_mask).sum(1) + np.asarray(batch.decode_mask).sum(1)) > 0
    keep = np.flatnonzero((w > 0) & busy)
    if not len(keep):
        return burst(pm)
    batch, w = batch.take(keep), jnp.asarray(w[keep] / w[keep].sum(), jnp.float32)
    s, first = 1.0, None
    for _ in range(ITERATIONS):
        t = step_terms(params, model, gpu, tp, batch, s)
        first = t if first is None else first        # the steps at the boost clock
        energy = P.energy_uj(pm, w @ t["ideal_compute"], w @ t["ideal_memory"])
        cycle, sens = w @ t["total"], w @ t["sens"]
        r = P.clock_ratio(pm, energy, cycle, sens, s, idle_us)
        drawn = P.stream_power_w(pm, r, energy, cycle, sens, s, idle_us)
        s = float(P.compute_scale(pm, r))
    demand = P.stream_power_w(pm, 1.0, energy, w @ first["total"], w @ first["sens"], 1.0, idle_us)
    return OperatingPoint(float(r), float(P.clock_mhz(pm, r)), s, float(demand), float(drawn), pm.limit_w)

"""A busy GPU at its power limit: the power a stream of steps draws, and the SM clock it holds.

Per-op tables are timed in bursts (a few calls between idle gaps), at the boost clock. A server
busy with compute-heavy steps runs them back to back; the board then reaches its power limit and
lowers its SM clock until the power it draws is the limit's (NVIDIA's "SW Power Cap"). An energy
roofline (Choi et al., "A Roofline Model of Energy", IPDPS 2013: time and energy of a kernel from
its FLOPs, its bytes and a constant power) gives the power of such a stream::

    P(r) = P_idle + (π_c · I_c + π_m · I_m) · r^(γ − 1) / T(r)          [W]

* ``r = f / f_boost`` ∈ (0, 1]: the SM clock as a fraction of its maximum (the datasheet's
  ``boost_clock_mhz``);
* ``I_c``: the stream's ideal compute time per cycle, µs (its FLOPs at the dense peaks);
  ``I_m``: its ideal memory time, µs (its bytes at the datasheet bandwidths); so ``π_c · I_c``
  is the energy (W·µs = µJ) of its FLOPs and ``π_m · I_m`` of its bytes at the boost clock:
  ``π_c`` (``compute_w``) is what the tensor cores would draw at 100 % of the dense peak,
  ``π_m`` (``memory_w``) what moving data at 100 % of the bandwidth draws, beyond idle;
* ``r^(γ − 1)``: dynamic energy per operation ∝ V², and V falls with the clock, so dynamic
  power at a fixed rate of work ∝ f^γ (``voltage_exponent`` γ: 1 for a fixed voltage, ≈ 3 when
  V ∝ f);
* ``T(r)``: the cycle (µs per step, idle gaps included) at that clock. Compute-bound time
  stretches with the clock, memory-bound time does not: each kernel's compute term is scaled by
  ``s = r^(−β)`` (``clock_elasticity`` β ∈ (0, 1]: the share of a compute-bound kernel's time
  that follows the SM clock nvidia-smi reports);
* ``P_idle`` (``idle_w``): the board at its boost clock doing nothing.

Under a limit ``P_max`` the GPU runs at r = 1 when ``P(1) ≤ P_max``, else at the r where
``P(r) = P_max`` (P grows with r), so a stream of memory-bound decodes keeps the boost clock and a
prefill-heavy one loses it. Idle gaps between steps count into the cycle and so let the clock
recover, as far as they fall within the limiter's averaging window (``window_ms``).

Every function takes and returns plain floats or JAX/NumPy arrays (broadcasting), units as named.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax.numpy as jnp

#: lowest clock ratio the solver considers (the H100's idle clock is 345 of 1,980 MHz)
MIN_CLOCK_RATIO = 0.2
#: bisection steps of :func:`clock_ratio` (2^-40 of the interval)
BISECTION_STEPS = 40


@dataclass(frozen=True)
class PowerModel:
    """The power parameters of one GPU (module docstring): watts at the boost clock, two
    exponents, and ``window_ms``, the limiter's averaging window (ms: a cycle shorter than it is
    averaged over; a busy stretch longer than it is capped on its own, with as much of the idle
    gap after it as the window still holds). ``limit_w``: the board's power limit (W; 0 = none
    modelled); ``boost_mhz``: its maximum SM clock (MHz; 0 = unknown)."""

    idle_w: float
    compute_w: float
    memory_w: float
    voltage_exponent: float
    clock_elasticity: float
    window_ms: float
    limit_w: float
    boost_mhz: float = 0.0


#: bounds of the fitted parameters (physical: powers ≥ 0, 1 ≤ γ ≤ 3, 0 < β ≤ 1)
BOUNDS = {"idle_w": (0.0, math.inf), "compute_w": (0.0, math.inf), "memory_w": (0.0, math.inf),
          "voltage_exponent": (1.0, 3.0), "clock_elasticity": (0.01, 1.0), "window_ms": (10.0, 2000.0)}
#: defaults for a GPU without a power fit, as fractions of its power limit (the three powers) and
#: the exponents and window: the H100 SXM's fit on ``data/sustained/h100_sxm`` with the vLLM 0.14
#: kernels (``roofcal power fit``, 2026-11-27), rounded — idle 131 W, compute 1,723 W, memory
#: 306 W of 700; γ 3 (its upper bound: power falls as the cube of the clock), β 0.33, window
#: 380 ms. A GPU of another generation differs; ``roofcal probe`` measures one.
DEFAULT_FRACTIONS = {"idle_w": 0.187, "compute_w": 2.46, "memory_w": 0.437}
DEFAULT_EXPONENTS = {"voltage_exponent": 3.0, "clock_elasticity": 0.33, "window_ms": 380.0}


def default_power(limit_w: float, boost_mhz: float = 0.0) -> PowerModel:
    """The documented defaults (:data:`DEFAULT_FRACTIONS`) for a GPU whose limit is ``limit_w``
    W; with ``limit_w`` 0 no cap is modelled."""
    return PowerModel(**{k: f * limit_w for k, f in DEFAULT_FRACTIONS.items()}, **DEFAULT_EXPONENTS,
                      limit_w=float(limit_w), boost_mhz=float(boost_mhz))


def energy_uj(pm: PowerModel, ideal_compute_us, ideal_memory_us):
    """Dynamic energy at the boost clock (µJ = W·µs) of work whose ideal times are given (µs):
    ``π_c · I_c + π_m · I_m``. Example: 2 ms of ideal compute at π_c = 1,000 W and 1 ms of ideal
    memory at π_m = 400 W: 2,000 µs × 1,000 W + 1,000 µs × 400 W = 2.4e6 µJ = 2.4 J."""
    return pm.compute_w * ideal_compute_us + pm.memory_w * ideal_memory_us


def compute_scale(pm: PowerModel, r):
    """How much longer compute-bound time runs at clock ratio ``r`` than at the boost clock:
    ``r^(−β)`` (1 at r = 1; β = 0.35, r = 0.69: 1.139)."""
    return jnp.asarray(r) ** (-pm.clock_elasticity)


def cycle_us(pm: PowerModel, r, t_ref_us, sens_us, s_ref=1.0):
    """The busy cycle (µs) at clock ratio ``r``, linear in the compute scale around a reference:
    ``t_ref_us`` at compute scale ``s_ref``, whose sensitivity dT/ds there is ``sens_us`` (µs per
    unit of scale: the compute-bound share of the cycle)."""
    return t_ref_us + sens_us * (compute_scale(pm, r) - s_ref)


def stream_power_w(pm: PowerModel, r, energy, t_ref_us, sens_us, s_ref=1.0, idle_us=0.0):
    """Average power (W) the limiter sees from a stream at clock ratio ``r``: busy cycles as in
    :func:`cycle_us` doing work of dynamic ``energy`` (µJ at the boost clock, :func:`energy_uj`),
    each followed by ``idle_us`` µs idle, of which the window counts what fits after the busy
    stretch (all of it for serving steps, whose gaps are short)."""
    busy = cycle_us(pm, r, t_ref_us, sens_us, s_ref)
    gap = jnp.minimum(idle_us, jnp.maximum(pm.window_ms * 1e3 - busy, 0.0))
    return pm.idle_w + energy * jnp.asarray(r) ** (pm.voltage_exponent - 1.0) / (busy + gap)


def clock_ratio(pm: PowerModel, energy, t_ref_us, sens_us, s_ref=1.0, idle_us=0.0):
    """The clock ratio r ∈ [:data:`MIN_CLOCK_RATIO`, 1] a power-limited GPU holds for the stream
    (arguments as :func:`stream_power_w`; arrays broadcast): 1 when its power at the boost clock
    is within the limit or no limit is modelled, else the root of P(r) = limit by bisection (P
    grows with r). Fixed steps, so it traces under ``jax.jit``; no gradient flows through it."""
    shape = jnp.broadcast_shapes(jnp.shape(energy), jnp.shape(t_ref_us), jnp.shape(sens_us))
    if pm.limit_w <= 0:
        return jnp.ones(shape)
    lo, hi = jnp.full(shape, MIN_CLOCK_RATIO), jnp.ones(shape)
    for _ in range(BISECTION_STEPS):
        mid = 0.5 * (lo + hi)
        over = stream_power_w(pm, mid, energy, t_ref_us, sens_us, s_ref, idle_us) > pm.limit_w
        lo, hi = jnp.where(over, lo, mid), jnp.where(over, mid, hi)
    at_boost = stream_power_w(pm, 1.0, energy, t_ref_us, sens_us, s_ref, idle_us) <= pm.limit_w
    return jnp.where(at_boost, 1.0, lo)


def clock_mhz(pm: PowerModel, r):
    """The SM clock (MHz) at ratio ``r``; NaN when the maximum is unknown."""
    return jnp.asarray(r) * (pm.boost_mhz if pm.boost_mhz > 0 else math.nan)

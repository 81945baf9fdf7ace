"""Combine: corrected kernel times + step overheads → the time of each step, with its breakdown.

``step_breakdown`` is the model's single hot path: pure, jitted once per (model, GPU, TP) and
padded batch size, and vectorised over the steps of a :class:`~roofcal.physics.steps.StepBatch`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from roofcal.model import correction as K
from roofcal.model import curves
from roofcal.physics.components import ideal_times
from roofcal.physics.config import ModelSpec
from roofcal.physics.decompose import busiest_rank, step_ops
from roofcal.physics.hardware import GPUSpec
from roofcal.physics.hardware.datasheet import PER_US
from roofcal.physics.steps import StepBatch, step_totals
from roofcal.programs import FAST_COMPILE, stored

#: breakdown column for the step-level overheads
OVERHEAD = "overhead"
#: breakdown column for the CPU time hidden behind GPU work (≤ 0 µs; 0 for a serial stack)
OVERLAP = "overlap"
#: 1 for the overheads paid on the CPU, in the order of ``STEP_OVERHEADS``
CPU_MASK = np.array([n in K.CPU_OVERHEADS for n in K.STEP_OVERHEADS], np.float32)
#: output of :func:`combine`: the CPU-side part of the overheads (µs), before any overlap
CPU = "cpu"
#: outputs of :func:`step_breakdown` that are not components of the predicted time
NON_COMPONENT = ("total", "flops", "bytes", "ideal_compute", "ideal_memory", CPU)


def op_rate_fields(gpu: GPUSpec, kind: str, variant: str) -> tuple[str, str]:
    """(peak field, bandwidth field) of the datasheet that bound a kernel: GEMM/MoE peaks follow
    the weight dtype (:meth:`GPUSpec.peak_field`), attention runs at BF16, communication moves
    its bytes over the GPU link, everything else over HBM."""
    dtype = variant if kind in ("gemm", "moe") else "bf16"
    bw = "interconnect_bandwidth_gbs" if K.OP_KINDS[kind].link else "hbm_bandwidth_tbs"
    return gpu.peak_field(dtype), bw


def op_peak_and_bandwidth(gpu: GPUSpec, kind: str, variant: str) -> tuple[float, float]:
    """(peak FLOP/µs, bytes/µs) that bound a kernel (fields :func:`op_rate_fields`)."""
    peak, bw = op_rate_fields(gpu, kind, variant)
    return getattr(gpu, peak) * PER_US[peak], getattr(gpu, bw) * PER_US[bw]


def ideal_step_times(gpu: GPUSpec, calls: dict) -> dict:
    """{name: (ideal compute µs, ideal memory µs)} of each kernel call, at its own peak and
    bandwidth (GEMM/MoE peaks by weight dtype, all-reduce bytes over the GPU link)."""
    return {name: ideal_times(call.work, *op_peak_and_bandwidth(gpu, call.kind, call.variant))
            for name, call in calls.items()}


#: key of ``params`` holding the operating point of a sustained load: how much longer
#: compute-bound time runs than in the bursts the kernels were timed in (≥ 1; :mod:`.operating`)
COMPUTE_SCALE = "compute_scale"


def at_compute_scale(params: dict, scale) -> dict:
    """``params`` at an operating point whose compute-bound time is ``scale`` × the burst's
    (a scalar ≥ 1; the SM clock of a GPU at its power limit, :mod:`roofcal.model.operating`).
    ``scale`` None: the burst clock, exactly as the kernels were timed."""
    out = {k: v for k, v in params.items() if k != COMPUTE_SCALE}
    if scale is not None:
        out[COMPUTE_SCALE] = jnp.asarray(scale, jnp.float32)
    return out


def kernel_times(params: dict, calls: dict, ideal: dict) -> dict:
    """µs per step of each kernel call (count × corrected time of one call); at a sustained
    operating point (:func:`at_compute_scale`) each call's ideal compute time is scaled first, so
    its compute-bound time follows the clock and its memory-bound time does not."""
    scale = params.get(COMPUTE_SCALE)
    out = {}
    for name, call in calls.items():
        _, p = K.lookup(params["ops"], call.kind, call.variant)
        tc, tm = ideal[name]
        if scale is not None:
            tc = tc * scale
        out[name] = call.count * K.op_time(p, call.kind, call.work.shape, tc, tm) \
            * curves.factor(p.get("curves"), call.kind, call.work.shape)
    return out


def combine(step: dict, model: ModelSpec, tp: int, t, kernels: dict) -> dict:
    """Step level: kernel times (µs per step, by component) → every component, ``overhead`` and
    ``total`` (µs). Applies the kernel-group scales, the prefill–decode attention mix of a mixed
    step (soft max with sharpness ``mix``; 1 = sum), the overheads, and the CPU–GPU ``overlap``
    (:func:`roofcal.model.correction.overlap`; ``overlap`` ≤ 0 is the CPU time hidden behind the
    GPU's); ``t`` = step totals."""
    out = dict(kernels)
    scales = K.step_scales(step)
    for group, names in K.STEP_SCALES.items():
        for name in names:
            if name in out:
                out[name] = out[name] * scales[group]
    a, b = out["attn_prefill"], out["attn_decode"]
    both = K.smax(a, b, K.mix_sharpness(step))
    scale = jnp.where(a + b > 0, both / jnp.maximum(a + b, 1e-30), 1.0)
    out["attn_prefill"], out["attn_decode"] = a * scale, b * scale
    counts = overhead_counts(model, tp, t, jnp)
    out[OVERHEAD] = counts @ K.step_overheads(step)
    serial = sum(out.values())
    cpu = counts @ (K.step_overheads(step) * CPU_MASK)
    if "overlap" in step:                      # a stack whose CPU work can hide behind the GPU's
        out[OVERLAP] = K.overlap(serial - cpu, cpu, step) - serial
    else:
        out[OVERLAP] = jnp.zeros_like(serial)
    out["total"] = serial + out[OVERLAP]
    out[CPU] = cpu
    return out


#: :func:`combine` compiled: one program per (model, TP) and step count, where a step level is
#: computed outside a trace (a fit's start and metrics; :func:`kernel_breakdown`); run a few
#: times a fit, so compiled for its compile time (``programs.FAST_COMPILE``)
combined = stored(combine, static_argnames=("model", "tp"), options=FAST_COMPILE)


def gpu_side(out: dict):
    """The GPU side of a :func:`combine` / :func:`step_breakdown` output (µs): the step less its
    CPU work and the overlap that hides part of it — kernels × in-step scales, launch gaps,
    all-reduce synchronisation."""
    return out["total"] - out[OVERLAP] - out[CPU]


def overhead_counts(model: ModelSpec, tp: int, t, xp=np):
    """(S, overheads) matrix: how many times each overhead of ``STEP_OVERHEADS`` is paid per step:
    once per busy step, per layer, per prefill sequence, per decode sequence, per token, and per
    all-reduce per peer GPU (2 per layer, TP − 1 peers). ``t``: the step's totals; a data-parallel
    deployment's overheads are its busiest rank's
    (:func:`~roofcal.physics.decompose.busiest_rank`)."""
    t = busiest_rank(t, model.parallel.dp)
    busy = (t.tokens > 0) * 1.0
    L = model.num_layers
    return xp.stack([busy, busy * L, t.n_prefill, t.n_decode, t.tokens,
                     busy * 2.0 * L * (tp - 1)], axis=-1)


#: the fewest steps, prefill slots and decode slots a batch is padded to (:func:`padded`)
PAD_STEPS, PAD_PREFILL, PAD_DECODE = 512, 8, 128


def padded_size(n: int, minimum: int = 256) -> int:
    """Row count rounded up to one of a few sizes (≤ 25 % padding — 65,537 → 81,920 — and
    ≥ ``minimum``), so compiled programs are reused across tables of similar size."""
    step = max(minimum, 1 << max(0, int(n).bit_length() - 3))
    return -(-max(n, 1) // step) * step


def padded(batch: StepBatch, steps: int = PAD_STEPS, prefill: int = PAD_PREFILL,
           decode: int = PAD_DECODE) -> StepBatch:
    """``batch`` with empty steps and slots (zero tokens, mask 0) appended: its steps to
    :func:`padded_size` (at least ``steps``), its prefill and decode slots to a power of two (at
    least ``prefill``, ``decode``). NumPy float32 arrays."""
    S, P, D = batch.num_steps, batch.prefill_new.shape[1], batch.decode_ctx.shape[1]
    rows = padded_size(S, steps) - S
    width = lambda w, least: max(least, 1 << max(0, int(w - 1).bit_length()))  # noqa: E731
    P2, D2 = width(P, prefill), width(D, decode)
    grow = lambda a, w: np.pad(np.asarray(a, np.float32), ((0, rows), (0, w - a.shape[1])))  # noqa: E731
    return StepBatch(grow(batch.prefill_new, P2), grow(batch.prefill_cached, P2),
                     grow(batch.prefill_mask, P2), grow(batch.decode_ctx, D2),
                     grow(batch.decode_mask, D2))


def step_breakdown(params: dict, model: ModelSpec, gpu: GPUSpec, tp: int, batch: StepBatch) -> dict:
    """Per-step times (µs) of every component, ``overhead``, ``total``, and work totals.

    Returns a dict of arrays of shape (S,): one entry per kernel of
    :func:`roofcal.decompose.step_ops` (µs), ``overhead`` (µs), ``total`` (µs, the prediction),
    ``flops`` and ``bytes`` (whole step on one GPU), and ``ideal_compute`` / ``ideal_memory``
    (µs: the roofline times of every kernel summed, each at its own peak and bandwidth).

    A batch of arrays is computed :func:`padded`, so that the batches of one deployment (an
    export's step grids: 4 to 1,326 steps) share a compiled program; the real steps' values are
    returned. Steps are independent and the added slots empty, so they are the values of the batch
    as given up to float32 rounding of sums over the slots (the exports and the fit: the same
    bytes; the residual report: 40 of 263,412 roofline times 1 ulp apart). Inside a trace
    (tracers among ``params`` or ``batch``) it is traced as given.
    """
    leaves = jax.tree_util.tree_leaves((params, batch))
    if any(isinstance(x, jax.core.Tracer) for x in leaves):
        return _step_breakdown(params, model, gpu, tp, batch)
    out = _step_breakdown(params, model, gpu, tp, padded(batch))
    return {k: v[:batch.num_steps] for k, v in out.items()}


@stored(static_argnames=("model", "gpu", "tp"))
def _step_breakdown(params: dict, model: ModelSpec, gpu: GPUSpec, tp: int, batch: StepBatch) -> dict:
    """:func:`step_breakdown` of ``batch`` as given: one compiled program per (model, GPU, TP)
    and batch shape."""
    t, calls, ideal, kernels = _kernel_part(params, model, gpu, tp, batch)
    out = combine(params["step"], model, tp, t, kernels)
    out["ideal_compute"] = sum(c.count * ideal[n][0] for n, c in calls.items())
    out["ideal_memory"] = sum(c.count * ideal[n][1] for n, c in calls.items())
    out["flops"] = sum(c.count * c.work.flops for c in calls.values())
    out["bytes"] = sum(c.count * c.work.bytes for c in calls.values())
    return out


def kernel_breakdown(params: dict, model: ModelSpec, gpu: GPUSpec, tp: int, batch: StepBatch):
    """(step totals, {kernel call: µs per step}) of ``batch``: what :func:`combine` takes, the
    kernels before the step level (scales, attention mix, overheads, overlap). For a fit of the
    step level alone, whose kernels do not move: ``combine(params["step"], model, tp, *parts)``
    (or :data:`combined`) is then :func:`step_breakdown`'s components, ``total`` and ``cpu`` at
    any step-level parameters, without the kernels in its program. Arrays of shape (S,),
    computed :func:`padded` as :func:`step_breakdown` is and cut to the real steps on the host,
    so called outside a trace; only ``params``' kernel entries are read."""
    kernels = {k: v for k, v in params.items() if k != "step"}
    t, times = _kernel_breakdown(kernels, model, gpu, tp, padded(batch))
    n = batch.num_steps                      # the real steps, cut on the host: no XLA program
    return jax.tree_util.tree_map(lambda v: jax.device_put(np.asarray(v)[:n]), (t, times))


@stored(static_argnames=("model", "gpu", "tp"), options=FAST_COMPILE)
def _kernel_breakdown(params: dict, model: ModelSpec, gpu: GPUSpec, tp: int, batch: StepBatch):
    """:func:`kernel_breakdown` of ``batch`` as given; run once or twice a fit, so compiled for
    its compile time (``programs.FAST_COMPILE``)."""
    t, _, _, kernels = _kernel_part(params, model, gpu, tp, batch)
    return t, kernels


def _kernel_part(params: dict, model: ModelSpec, gpu: GPUSpec, tp: int, batch: StepBatch):
    """(step totals, kernel calls, their ideal times, their µs per step) of ``batch``: the part
    of a step before the step level, traced inside :func:`_step_breakdown` and
    :func:`_kernel_breakdown` alike."""
    t = step_totals(batch, jnp)
    calls = step_ops(model, tp, t)
    ideal = ideal_step_times(gpu, calls)
    return t, calls, ideal, kernel_times(params, calls, ideal)


def step_time(params: dict, model: ModelSpec, gpu: GPUSpec, tp: int, batch: StepBatch):
    """Predicted step times (µs), shape (S,)."""
    return step_breakdown(params, model, gpu, tp, batch)["total"]

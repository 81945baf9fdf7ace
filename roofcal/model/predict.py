"""``roofcal predict``: step times with a per-component breakdown, for steps of any deployment,
and the corrected time of every row of a per-op table."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import jax
import numpy as np
import pandas as pd

from roofcal.errors import RoofcalError
from roofcal.measurements.ops import read_ops
from roofcal.model import coeffs as coeff_io
from roofcal.model import correction as K
from roofcal.model import curves as measured_curves
from roofcal.model import domain
from roofcal.model import intervals
from roofcal.model.combine import (NON_COMPONENT, gpu_side, op_peak_and_bandwidth, padded,
                                   step_breakdown)
from roofcal.physics import components as C
from roofcal.physics.components.moe import MAX_EXPERTS, experts_bound
from roofcal.physics.config import Parallel, check_tp, load_model, served
from roofcal.physics.hardware import GPUSpec, load_gpu
from roofcal.physics.kernels import (DTYPE_FREE, OPTIONAL_COLUMNS, SHAPE_COLUMNS, groups, in_blocks,
                                     row_work)
from roofcal.physics.decompose import step_ops
from roofcal.physics.steps import Step, batch_steps, given_by, group_by_deployment, read_steps
from roofcal.programs import stored


def resolve_coeffs(coeffs, gpu, stack: str | None = None, steps: bool = False,
                   kernels: str | None = None):
    """A :class:`Coefficients` for ``gpu``: loaded from a path, checked, or neutral when None;
    for whole ``steps`` with serving stack ``stack`` and kernel set ``kernels``
    (:func:`roofcal.model.coeffs.resolve_stack`; None: the file's own stack and that stack's
    kernel set), a file without any stack being refused unless ``stack`` says ``none`` (kernels
    only), so no step is predicted without its overheads by accident; for kernels alone, the
    kernel set ``kernels`` (None: the file's default)."""
    if coeffs is None:
        c = coeff_io.Coefficients.neutral(gpu)
    elif isinstance(coeffs, (str, Path)):
        c = coeff_io.load(coeffs, gpu)
    else:
        coeffs.check_gpu(gpu)
        c = coeffs
    if not steps:                    # kernels alone: no stack, the file's default kernel set
        return coeff_io.with_kernels(c, kernels) if kernels is not None else c
    return coeff_io.resolve_stack(c, stack, required=coeffs is not None, kernels=kernels)


def per_deployment(steps, model, gpu, tp, coeffs, compute, stack: str | None = None,
                   kernels: str | None = None, parallel: Parallel = Parallel()) -> pd.DataFrame:
    """Run ``compute`` on each deployment's steps; one row per input step, in input order.

    Steps (a JSONL path or :class:`Step` list) are grouped by (model, GPU, TP, layout), a step's
    own fields overriding ``model``/``gpu``/``tp``/``parallel``; each group's model (served as its
    layout), datasheet, TP and coefficients are loaded and checked, then ``compute(coeffs,
    model_spec, gpu_spec, tp, batch, records)`` returns a DataFrame with one row per record.
    Columns ``step``, ``phase``, ``model``, ``gpu``, ``tp`` come first (then ``dp``, ``ep``,
    ``moe_comm`` where any group has a layout beyond TP).
    """
    src = str(steps) if isinstance(steps, (str, Path)) else "steps"
    records = read_steps(steps) if isinstance(steps, (str, Path)) else list(steps)
    if not records:
        raise RoofcalError(f"{src}: no steps")
    frames = []
    groups = group_by_deployment(records, model, gpu, tp, src, parallel)
    laid_out = any(layout != Parallel() for *_, layout in groups)
    for (m, g, t, layout), idx in groups.items():
        spec, gspec = load_model(m), load_gpu(g)
        check_tp(spec, int(t), where=given_by(records, idx, "tp", src))
        spec = served(spec, layout, where=given_by(records, idx, "layout", src))
        recs = [records[i] for i in idx]
        c = resolve_coeffs(coeffs, gspec, stack, steps=True, kernels=kernels)
        df = compute(c, spec, gspec, int(t), batch_steps(recs), recs)
        front = pd.DataFrame({"step": np.asarray(idx) + 1, "phase": [r.phase for r in recs],
                              "model": spec.name, "gpu": gspec.name, "tp": int(t),
                              **({"dp": layout.dp, "ep": layout.ep, "moe_comm": layout.moe_comm}
                                 if laid_out else {}),
                              "stack": c.stack or coeff_io.NO_STACK, "kernels": c.kernels})
        frames.append(pd.concat([front, df.reset_index(drop=True)], axis=1))
    return pd.concat(frames, ignore_index=True).sort_values("step", kind="stable") \
        .reset_index(drop=True)


@stored(static_argnames=("model", "gpu", "tp"))
def step_outputs(params: dict, model, gpu, tp: int, batch):
    """One compiled call for :func:`predict`: (:func:`~roofcal.model.combine.step_breakdown`,
    :func:`~roofcal.model.domain.step_numeric`) of a batch — the times and the numbers behind
    the flags, with the step totals last."""
    parts = step_breakdown(params, model, gpu, tp, batch)
    return parts, domain.step_numeric(params["ops"], model, tp, batch, parts)


#: :func:`step_arrays` computes batches of up to this many steps padded
PAD_UP_TO = 4096


def step_arrays(c, model, gpu, tp: int, batch) -> tuple[dict, tuple, dict]:
    """What :func:`predict` computes for one deployment's steps, as arrays of shape (S,): the
    breakdown (µs, :func:`~roofcal.model.combine.step_breakdown`, float64), the 80 % interval
    ``(p10 µs, p90 µs, basis)`` (:func:`roofcal.model.intervals.step_interval`) and the
    out-of-domain flags (:func:`roofcal.model.domain.step_flags`); ``c``: the coefficients.

    A batch of up to :data:`PAD_UP_TO` steps is computed :func:`~roofcal.model.combine.padded`
    (as ``step_breakdown`` computes one), so one deployment's step files share a compiled program
    (a new file: 2.4–2.6 s instead of 3.4–4.0 s); a larger one, as given (padding 10⁶ steps to
    whole slots would double the work)."""
    n = batch.num_steps
    parts, numeric = jax.tree_util.tree_map(lambda a: np.asarray(a)[:n], step_outputs(
        c.params, model, gpu, tp, padded(batch) if n <= PAD_UP_TO else batch))
    out = {k: np.asarray(v, np.float64) for k, v in parts.items()}
    totals = numeric[-1]
    band = intervals.step_interval(c.op_bands, c.stack_bands, step_ops(model, tp, totals), out,
                                   out["total"], totals, c.params["ops"])
    return out, band, domain.step_flags(c, model, gpu, tp, batch, numeric)


#: leading columns of :func:`predict`, in order (``measured_us`` only when given)
FRONT = ("step", "phase", "model", "gpu", "tp", "dp", "ep", "moe_comm", "stack", "kernels", "clock", "sm_clock_mhz", "compute_scale",
         "measured_us", "measured_cycle_us", "predicted_us", "p10_us", "p90_us", "interval_basis",
         "predicted_gpu_us")


def predict(steps: "str | Path | Sequence[Step]", model=None, gpu=None, tp: int | None = None,
            coeffs=None, stack: str | None = None, kernels: str | None = None,
            clock: str = "burst", parallel: Parallel = Parallel()) -> pd.DataFrame:
    """Predict every step; one row per input step, in input order.

    ``steps``: a JSONL path or a list of :class:`Step`. ``model`` / ``gpu`` / ``tp`` apply to steps
    that do not name their own. ``coeffs``: a coefficient file path, a loaded
    :class:`~roofcal.model.coeffs.Coefficients`, or None for the neutral roofline defaults.
    ``stack``: the serving stack (a name in the file, ``none`` for kernels only, or
    ``FILE:NAME``; default the file's own); ``kernels``: the kernel set (default the stack's own,
    else the file's default). ``clock``: ``burst`` — each step as the per-op tables were timed, at
    the boost clock (default); ``sustained`` — each deployment's steps as one stream run back to
    back, at the SM clock the GPU's power limit allows for it (:mod:`roofcal.model.operating`).
    ``parallel``: every deployment's layout beyond TP (:class:`~roofcal.physics.config.Parallel`:
    data-parallel ranks, expert parallelism, MoE comm backend); a step is then the whole
    deployment's batch and its time the busiest rank's (:mod:`roofcal.physics.decompose`).

    Columns: ``step``, ``phase``, ``model``, ``gpu``, ``tp`` (with ``dp``, ``ep``, ``moe_comm``
    for a data- or expert-parallel ``parallel``), ``stack``, ``kernels``, the clock a row
    assumes (``clock``, ``sm_clock_mhz`` — NaN where the datasheet gives no boost clock — and
    ``compute_scale``, ≥ 1: how much longer its compute-bound time runs than at the boost clock),
    ``measured_us`` and
    ``measured_cycle_us`` (the steps' ``duration_us`` and ``cycle_us``, when given),
    ``predicted_us`` (the whole step: what a cycle takes), the 80 % interval ``p10_us``,
    ``p90_us`` and its ``interval_basis`` (:func:`roofcal.model.intervals.step_interval`),
    ``predicted_gpu_us`` (its GPU side: compare a trace's ``duration_us``), one ``<component>_us``
    column per kernel, ``overhead_us`` and ``overlap_us`` (CPU time hidden behind the GPU's,
    ≤ 0), then ``flops`` and ``bytes`` (one GPU, whole step), then the out-of-domain flags
    :data:`roofcal.model.domain.STEP_FLAGS` (``ood_shape`` in log2 units, ``ood_what``,
    ``ood_context``, ``fits_memory``, ``zero_shot``, ``no_kernel_data``; see
    :mod:`roofcal.model.domain`).
    """
    from roofcal.model.combine import at_compute_scale
    from roofcal.model.operating import CLOCKS, burst, operating_point, power_of
    if clock not in CLOCKS:
        raise RoofcalError(f"clock must be one of {', '.join(CLOCKS)}, got {clock!r}")

    def one(c, spec, gspec, t, batch, recs):
        pm = power_of(c, gspec)
        op = operating_point(pm, c.params, spec, gspec, t, batch) if clock == "sustained" else burst(pm)
        if op.compute_scale != 1.0:
            c = coeff_io.Coefficients(**{**c.__dict__, "params": at_compute_scale(c.params, op.compute_scale)})
        out, band, flags = step_arrays(c, spec, gspec, t, batch)
        df = pd.DataFrame(index=range(len(recs)))
        df["clock"] = clock
        df["sm_clock_mhz"] = op.clock_mhz
        df["compute_scale"] = op.compute_scale
        if any(r.duration_us is not None for r in recs):
            df["measured_us"] = [np.nan if r.duration_us is None else r.duration_us for r in recs]
        if any(r.cycle_us is not None for r in recs):
            df["measured_cycle_us"] = [np.nan if r.cycle_us is None else r.cycle_us for r in recs]
        df["predicted_us"] = out["total"]
        df["predicted_gpu_us"] = gpu_side(out)
        df["p10_us"], df["p90_us"], df["interval_basis"] = band
        for name in sorted(k for k in out if k not in NON_COMPONENT):
            df[f"{name}_us"] = out[name]
        df["flops"], df["bytes"] = out["flops"], out["bytes"]
        for name, v in flags.items():
            df[name] = v
        return df

    df = per_deployment(steps, model, gpu, tp, coeffs, one, stack, kernels, parallel)
    comp = [c for c in df.columns if c.endswith("_us") and c not in FRONT]
    df[comp] = df[comp].fillna(0.0)
    front = [c for c in FRONT if c in df.columns]
    return df[front + sorted(comp) + ["flops", "bytes", *domain.STEP_FLAGS]].reset_index(drop=True)


# --------------------------------------------------------------------------------------------
# per-op rows

@stored(static_argnames=("op", "dtype", "peak", "bw", "max_experts"))
def _row_times(op: str, dtype: str, cols: dict, peak: float, bw: float, max_experts: int):
    """(ideal compute µs, ideal memory µs, standardized shape z) of rows, in one compiled call."""
    w = row_work(op, dtype, cols, max_experts)
    tc, tm = C.ideal_times(w, peak, bw)
    return tc, tm, K.standardize(op, w.shape)


def row_times(gpu: GPUSpec, op: str, dtype: str, df: pd.DataFrame, idx: np.ndarray):
    """(ideal compute µs, ideal memory µs, standardized shapes z) of rows ``idx`` of an
    interchange table, as float32 arrays of ``len(idx)`` rows (computed in blocks:
    :func:`in_blocks`)."""
    peak, bw = op_peak_and_bandwidth(gpu, op, dtype)
    cols = {c: np.asarray(df[c].values[idx], np.float32)
            for c in SHAPE_COLUMNS[op] + OPTIONAL_COLUMNS.get(op, ()) if c in df.columns}
    bound = experts_bound(cols["experts"]) if "experts" in cols else MAX_EXPERTS   # the group's
    work_dtype = "" if op in DTYPE_FREE else dtype
    return in_blocks(lambda c: _row_times(op, work_dtype, c, float(peak), float(bw), bound), len(idx), cols)


@dataclass(frozen=True)
class IdealTimes:
    """:func:`row_times` of every row of a per-op table, computed once and shared by whoever
    predicts its rows (a fit computes them once instead of for its features, its curves and its
    metrics: the MoE rows' routing sums alone took ≈ 0.3 s a pass).

    ``tc``, ``tm`` (N,) float32 ideal compute and memory µs; ``z`` (N, D) float32 standardized
    shapes, D the most descriptors of any kernel kind (a kind's own in its first columns);
    ``res`` (N,) float32 the share of each row's working set a warm L2 holds as the table timed
    it (:func:`roofcal.physics.cache.resident_fraction`)."""

    tc: np.ndarray
    tm: np.ndarray
    z: np.ndarray
    res: np.ndarray

    def take(self, idx) -> "IdealTimes":
        """The rows ``idx`` (positions), in that order."""
        return IdealTimes(self.tc[idx], self.tm[idx], self.z[idx], self.res[idx])

    def rows(self, op: str, idx) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(tc, tm, z) of rows ``idx`` of kernel kind ``op``, as :func:`row_times` gives them."""
        return self.tc[idx], self.tm[idx], self.z[idx, :len(K.OP_KINDS[op].descriptors)]


def ideal_times(gpu: GPUSpec, df: pd.DataFrame) -> IdealTimes:
    """:class:`IdealTimes` of every row of ``df`` (all rows must be for ``gpu``), one
    :func:`row_times` call per (op, dtype) group."""
    width = max(len(k.descriptors) for k in K.OP_KINDS.values())
    tc, tm = np.zeros(len(df), np.float32), np.zeros(len(df), np.float32)
    res = np.zeros(len(df), np.float32)
    z = np.zeros((len(df), width), np.float32)
    parts = list(groups(df))
    for g, op, dt, idx in parts:
        if g != gpu.name:
            raise RoofcalError(f"{df['source'].iloc[idx[0]]}: rows are for GPU '{g}' but the "
                               f"coefficients are for '{gpu.name}'")
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max_workers=2) as pool:      # one group's program compiles (or loads)
        times = pool.map(lambda p: row_times(gpu, p[1], p[2], df, p[3]), parts)  # as another runs
        for (g, op, dt, idx), (tci, tmi, zi) in zip(parts, times):
            tc[idx], tm[idx] = tci, tmi
            z[idx, :zi.shape[1]] = zi
            if op in K.CACHED_KINDS:
                res[idx] = warm_share(gpu, op, dt, tmi)
    return IdealTimes(tc, tm, z, res)


def warm_share(gpu: GPUSpec, op: str, dtype: str, tm) -> np.ndarray:
    """(N,) float32 share of each call's working set (its ideal memory bytes: ``tm`` µs at the
    kernel's bandwidth) that ``gpu``'s L2 holds when the call repeats on the same buffers, as a
    per-op table times it (:mod:`roofcal.physics.cache`; 0 where the datasheet gives no L2)."""
    from roofcal.physics.cache import MIB, resident_fraction
    _, bw = op_peak_and_bandwidth(gpu, op, dtype)
    w = np.asarray(tm, np.float64) * bw
    return np.asarray(resident_fraction(w, gpu.l2_cache_mib * MIB), np.float32)


def _op_times(p: dict, z, tc, tm, res) -> np.ndarray:
    """:func:`~roofcal.model.correction.op_time_z` of ``len(tc)`` rows (:func:`in_blocks`)."""
    return in_blocks(lambda a: K.op_time_z(p, *a), len(tc), (z, tc, tm, res))


def predict_table(df: pd.DataFrame, params: dict, gpu: GPUSpec, flags: bool = False,
                  bands: dict | None = None, compute_scale: float = 1.0,
                  surface: bool = False, ideal: IdealTimes | None = None,
                  surfaces: np.ndarray | None = None, warm: bool = True) -> pd.DataFrame:
    """Predicted time of every row (all rows must be for ``gpu``); adds ideal and predicted µs,
    with ``bands`` (:attr:`Coefficients.op_bands`) the 80 % interval ``p10_us``, ``p90_us``
    (NaN for kernels without held-out evidence), and with ``flags`` the shape flags
    ``ood_shape`` (log2 units), ``ood_what`` and ``no_kernel_data`` of
    :mod:`roofcal.model.domain` after them. ``compute_scale`` > 1: every kernel's compute-bound
    time that much longer (an SM clock below the bursts', :mod:`roofcal.model.operating`); 1 is
    the kernels as timed. With ``surface``, also ``surface_us``: a kernel with measured shapes'
    curves priced by its surface alone, as a shape no table measured (NaN for other kinds).
    ``ideal``: the rows' :func:`ideal_times`, when already computed; ``surfaces`` (N,): the rows'
    times by their kernels' surfaces alone (µs, at ``compute_scale`` 1), where already computed
    with these parameters (a group with any NaN is computed). ``warm``: priced as the per-op tables
    time a kernel, on a warm L2 (:mod:`roofcal.physics.cache`); False: as a served step runs it,
    on a cold one."""
    out = df.copy()
    cols = ("ideal_compute_us", "ideal_memory_us", "predicted_us") + \
        (("p10_us", "p90_us") if bands is not None else ()) + (("surface_us",) if surface else ())
    col = {c: np.full(len(df), np.nan) for c in cols}     # filled group by group, put in once
    flag = {"ood_shape": np.zeros(len(df)), "ood_what": np.full(len(df), "", object),
            "ood_detail": np.full(len(df), "", object), "no_kernel_data": np.zeros(len(df), bool)}
    ideal = ideal_times(gpu, df) if ideal is None else ideal
    for g, op, dt, idx in groups(df):
        tc, tm, z = ideal.rows(op, idx)
        _, p = K.lookup(params["ops"], op, dt)
        known = None if surfaces is None or compute_scale != 1.0 or not warm else surfaces[idx]
        t = known if known is not None and not np.isnan(known).any() else \
            _op_times(measured_curves.surface_only(p), z, tc * compute_scale if compute_scale != 1.0 else tc, tm,
                      ideal.res[idx] if warm else np.zeros(len(idx), np.float32))
        factor, measured = measured_curves.row_factors(p.get("curves"), op, df.iloc[idx])
        if surface and op in measured_curves.AXES:
            col["surface_us"][idx] = np.asarray(t, np.float64)
        t = t * factor                                     # measured shapes (:mod:`.curves`)
        col["ideal_compute_us"][idx] = np.asarray(tc, np.float64)
        col["ideal_memory_us"][idx] = np.asarray(tm, np.float64)
        col["predicted_us"][idx] = np.asarray(t, np.float64)
        shape_flags = domain.op_shape_flags(params["ops"], op, dt, z) if (flags or bands is not None) else None
        if bands is not None:
            share = None
            if op == "attn_prefill":                 # chunks over a cached prefix (descriptors 1, 2)
                k = K.OP_KINDS[op]
                x = np.exp2(np.asarray(z, np.float64) * np.asarray(k.scale) + np.asarray(k.center)) - 1.0
                share = intervals.prefix_share(x[:, 1], x[:, 2])
            lo, hi = intervals.op_interval(bands, op, dt, tc, tm, t, shape_flags["ood_shape"], share,
                                           measured if op in measured_curves.AXES else None)
            col["p10_us"][idx], col["p90_us"][idx] = lo, hi
        if flags:
            for name, v in shape_flags.items():
                flag[name][idx] = v
    for c in cols:
        out[c] = col[c]
    if "latency_us" in out.columns:
        out["rel_error"] = out["predicted_us"] / out["latency_us"] - 1.0
    if flags:
        for name, v in flag.items():
            out[name] = v
    return out


def predict_ops(path, coeffs=None, kernels: str | None = None) -> pd.DataFrame:
    """``roofcal predict --ops``: predict every row of a per-op CSV/table with a coefficient file
    and its kernel set ``kernels`` (default: each row's own set, a set the file lacks by the nearest
    older one of its framework, :func:`roofcal.model.coeffs.nearest_kernel_set`; rows of no set
    by the file's default).

    Without ``coeffs`` the neutral roofline defaults of each row's GPU are used. After the
    predicted columns come the 80 % interval ``p10_us``, ``p90_us`` (:mod:`roofcal.model.intervals`)
    and the flags :data:`roofcal.model.domain.OP_FLAGS` (``ood_shape``, ``ood_what``,
    ``zero_shot``, ``no_kernel_data``).
    """
    df = read_ops(path)
    frames = []
    for (g, rows_set), part in df.groupby(["gpu", "kernels"], sort=True):
        spec = load_gpu(g)
        c = resolve_coeffs(coeffs, spec, kernels=kernels)
        if kernels is None and rows_set and coeffs is not None:
            c = coeff_io.with_kernels(c, coeff_io.nearest_kernel_set(c.kernel_sets, rows_set, c.kernels))
        frames.append(predict_table(part, c.params, spec, flags=True, bands=c.op_bands)
                      .assign(zero_shot=domain.zero_shot(c, steps=False)))
    out = pd.concat(frames).sort_index()
    rest = [col for col in out.columns if col not in domain.OP_FLAGS]
    return out[rest + list(domain.OP_FLAGS)]

"""Out-of-domain flags: where a prediction leaves what the coefficients were fitted on.

Every predicted row (a whole step, or one per-op row) carries these columns:

==================  =============================================================================
``ood_shape``       largest distance of any shape descriptor of the row's kernels outside the
                    range fitted for that kernel, in log2(1 + x) units (0 inside). Outside the
                    range the efficiency surface is clamped (held flat), so this is how far the
                    prediction extrapolates. Kernels with no fitted parameters have no range and
                    count 0 here (see ``no_kernel_data``); in a step, neither do kernels that
                    take under :data:`MATERIAL_SHARE` of it (a MoE router GEMM of n = 8
                    experts, below the smallest n measured, 32, cannot move the step by more).
                    A cached prefix is not a distance (:data:`MAPPED`): prefill attention over
                    one is looked up at the uncached chunk with the same causal pairs, and its
                    measured error widens the band instead.
``ood_what``        which one: ``<component>.<descriptor>`` for steps (``attn_decode.context``,
                    ``mlp_up.m``), ``<kind>.<descriptor>`` for per-op rows; empty inside
``ood_detail``      the same in natural units: the descriptor's value and the range fitted,
                    e.g. ``context 10,000,001 (fitted 128–131,073)``; empty inside
``ood_context``     (steps) some sequence's context — cached + new tokens of a prefill chunk, or
                    decode context + 1 — exceeds the model's ``max_position_embeddings``
``fits_memory``     (steps) vLLM could run the step at once at that TP: every sequence's KV, in
                    whole blocks, fits the cache vLLM would allocate and there are at most
                    max_num_seqs (256) sequences (:func:`roofcal.physics.capacity.capacity` with
                    vLLM's defaults, :func:`~roofcal.physics.capacity.fits`); False also when the
                    weights alone do not fit
``zero_shot``       the coefficients were not calibrated on this GPU: no file (neutral roofline),
                    a bootstrap (``calibrated: false``), or a serving stack marked ``zero_shot`` or
                    borrowed from another GPU's file
``no_kernel_data``  some kernel's (kind, variant) has no parameters of its own in the file, so
                    :func:`roofcal.model.correction.lookup` fell back to the kind's default variant
                    or to the neutral roofline (e.g. FP8 GEMMs with an A100 file). Only kinds
                    that per-op data can measure (:data:`MEASURED_KINDS`) count: elementwise
                    kernels are never fitted per op (they run at the roofline, scaled by the
                    serving stack), so they would flag every step
==================  =============================================================================

Distances below :data:`TOLERANCE` are 0: a file stores its ranges to 6 significant digits and
the model reads them back as float32.

The range checked is the range printed (``fitted 1–266``): the stored bounds, in natural units,
rounded to the nearest whole count (:func:`log2_bounds`; every descriptor but
:data:`REAL_DESCRIPTORS` counts whole sequences, tokens, heads or bytes). A fit's own bounds are
measured shapes, whole already; a bootstrap moves them by the SM-count or balance ratio
(:func:`roofcal.transfer.bootstrap.shifted_range`), to fractions: from the H100 fit to the L40S
(132 → 142 SMs) prefill attention's lowest ``seqs`` moves from 1 to 1.08, and both the check and
the line take 1 (a step of one sequence was flagged 0.053 log2 units out under the line ``seqs 1
(fitted 1–266)``); to the A100 (108 SMs) decode attention's highest ``kv_heads`` moves from 8 to
7.14, and both take 7. A bound moves by at most half a count: log2((x + 1.5) / (x + 1)) log2
units at a bound x (0.58 at 0, 0.32 at 1, 0.09 at 7).

Everything here is vectorised over rows: the numbers behind the step flags come from one jitted
call per deployment (:func:`step_numeric`), beside :func:`~roofcal.model.combine.step_breakdown`,
so the prediction's hot path is unchanged.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

from roofcal.errors import RoofcalError
from roofcal.grouping import unique_rows
from roofcal.model import correction as K
from roofcal.model.combine import step_breakdown
from roofcal.physics import capacity as cap_
from roofcal.physics.decompose import step_ops
from roofcal.physics.kernels import SHAPE_COLUMNS
from roofcal.physics.steps import StepBatch, step_totals

#: flag columns of whole steps, in output order
STEP_FLAGS = ("ood_shape", "ood_what", "ood_detail", "ood_context", "fits_memory", "zero_shot", "no_kernel_data")
#: flag columns of per-op rows (no model, so no context limit or memory)
OP_FLAGS = ("ood_shape", "ood_what", "ood_detail", "zero_shot", "no_kernel_data")
#: config fields that give a model's context limit, first present wins
CONTEXT_LIMIT_FIELDS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")
#: kernel kinds per-op measurements exist for (the others are never fitted per op)
MEASURED_KINDS = frozenset(SHAPE_COLUMNS)
#: distances (log2 units) below this are rounding of the stored range, not extrapolation
TOLERANCE = 1e-4
#: a step's kernel is checked against its fitted range only when it takes at least this share
#: of the predicted step
MATERIAL_SHARE = 0.01
#: descriptors that are real numbers, not counts: their bounds are checked as stored
#: (:func:`log2_bounds`; the MoE routing skew, an exponent)
REAL_DESCRIPTORS = frozenset({"skew"})
#: descriptors that are not looked up where they are: the per-op prefill-attention tables hold
#: no cached prefix (cached = 0), and the physics maps a chunk over a cached prefix to the uncached
#: chunk with the same causal pairs (the ``seq_len`` descriptor, see
#: :func:`roofcal.physics.components.attention.prefill_attention`), which is checked instead. The
#: error of that mapping is measured, not extrapolated: its band
#: (:data:`roofcal.model.intervals.CACHED_PREFIX`) widens the band of such a step's prefill
#: attention instead of a flag
MAPPED = {"attn_prefill": frozenset({"cached"})}


def checked(kind: str) -> list[int]:
    """Positions of ``kind``'s descriptors checked against the fitted range (all but
    :data:`MAPPED`)."""
    skip = MAPPED.get(kind, frozenset())
    return [j for j, d in enumerate(K.OP_KINDS[kind].descriptors) if d not in skip]


# --------------------------------------------------------------------------------------------
# shapes

def log2_bounds(kind: str, p: dict, xp=np) -> tuple:
    """Fitted range of ``kind``'s descriptors as (low, high) arrays in log2(1 + x) units, from the
    standardized bounds ``p["lo"]``, ``p["hi"]`` (z = (log2(1 + x) − center) / scale), each count
    rounded to the nearest whole one (not the :data:`REAL_DESCRIPTORS`): the range a flag prints
    is the range it checks. Hand check, a bootstrap's 1.076 .. 265.6 sequences: 1 .. 266, i.e.
    log2 units 1 .. log2(267) = 8.0606.
    float64 with NumPy (``xp``), float32 with jax.numpy."""
    k = K.OP_KINDS[kind]
    f = np.float64 if xp is np else jnp.float32
    c, s = xp.asarray(k.center, f), xp.asarray(k.scale, f)
    low, high = xp.asarray(p["lo"], f) * s + c, xp.asarray(p["hi"], f) * s + c
    whole = xp.asarray([d not in REAL_DESCRIPTORS for d in k.descriptors])
    n_low = xp.maximum(xp.round(xp.exp2(low) - 1.0), 0.0)
    n_high = xp.maximum(xp.round(xp.exp2(high) - 1.0), n_low)
    return (xp.where(whole, xp.log2(1.0 + n_low), low).astype(f),
            xp.where(whole, xp.log2(1.0 + n_high), high).astype(f))


def distance(u, low, high, xp=np):
    """Distance of log2(1 + x) values ``u`` outside [low, high], ≥ 0 (log2 units)."""
    return xp.maximum(xp.maximum(u - high, low - u), 0.0)


def excess(u, low, high) -> np.ndarray:
    """:func:`distance` of ``u`` (rows × descriptors), 0 below :data:`TOLERANCE`."""
    d = distance(u, low, high)
    return np.where(d > TOLERANCE, d, 0.0)


def worst(dist: np.ndarray, labels) -> tuple[np.ndarray, np.ndarray]:
    """(largest distance per row, its label or "" when 0) of a (rows, columns) distance matrix."""
    if dist.shape[1] == 0:
        return np.zeros(dist.shape[0]), np.full(dist.shape[0], "", object)
    j = np.argmax(dist, axis=1)
    d = dist[np.arange(dist.shape[0]), j]
    return d, np.where(d > 0, np.asarray(labels, object)[j], "")


def op_shape_flags(ops: dict, kind: str, variant: str, z) -> dict:
    """``ood_shape``, ``ood_what``, ``no_kernel_data`` of per-op rows of one (kind, variant) with
    standardized shapes ``z`` (rows × descriptors), against the parameters ``lookup`` uses."""
    z = np.asarray(z, np.float64)
    n = z.shape[0]
    key, p = K.lookup(ops, kind, variant)
    k = K.OP_KINDS[kind]
    detail = np.full(n, "", object)
    if key in ops:
        u = z * np.asarray(k.scale) + np.asarray(k.center)
        low, high = log2_bounds(kind, p)
        dist = excess(u, low, high)
        dist[:, [j for j in range(len(k.descriptors)) if j not in checked(kind)]] = 0.0
        d, what = worst(dist, [f"{kind}.{x}" for x in k.descriptors])
        if (d > 0).any():
            j = np.argmax(dist, axis=1)
            detail = _details(d, k.descriptors, j, np.take_along_axis(u, j[:, None], 1)[:, 0], low[j], high[j])
    else:
        d, what = np.zeros(n), np.full(n, "", object)
    missing = kind in MEASURED_KINDS and K.op_key(kind, variant) not in ops
    return {"ood_shape": d, "ood_what": what, "ood_detail": detail, "no_kernel_data": np.full(n, missing)}


def _natural(u) -> np.ndarray:
    """log2(1 + x) units back to x (tokens, bytes, …)."""
    return np.exp2(np.asarray(u, np.float64)) - 1.0


def _count(x: float) -> str:
    """A descriptor's value as a detail prints it: whole with thousands separators, else to two
    decimals (a fraction is never printed as the whole count it is outside of)."""
    return f"{x:,.0f}" if float(x).is_integer() else f"{x:,.2f}"


def _details(d, descriptors, j, u, low, high) -> np.ndarray:
    """``<descriptor> <value> (fitted <low>–<high>)`` per row with d > 0, in natural units; each
    distinct text is formatted once (a million out-of-domain steps share a few thousand)."""
    out = np.full(len(d), "", object)
    rows = np.flatnonzero(np.asarray(d) > 0)
    if not len(rows):
        return out
    key = np.stack([np.asarray(j, np.float64)[rows], np.round(_natural(np.asarray(u)[rows]), 2),
                    np.round(_natural(np.asarray(low)[rows]), 2), np.round(_natural(np.asarray(high)[rows]), 2)], 1)
    uniq, inverse = unique_rows(key)
    texts = np.array([f"{descriptors[int(jj)]} {_count(x)} (fitted {_count(lo_)}–{_count(hi_)})"
                      for jj, x, lo_, hi_ in uniq], object)
    out[rows] = texts[np.ravel(inverse)]
    return out


def _shape_columns(ops: dict, calls: dict, times: dict | None = None):
    """(labels, distances, missing) of steps' kernel calls (jax.numpy): one (S,) distance in log2
    units per descriptor of a call with fitted parameters (0 where the call does no work in a
    step, or — with ``times``, a step breakdown in µs — takes under :data:`MATERIAL_SHARE` of
    the step), and whether a measurable call without parameters of its own does work (S,)."""
    labels, cols, missing = [], [], 0.0
    for name, call in calls.items():
        w = call.work
        active = ((w.flops + w.bytes) > 0) & (call.count > 0)
        material = active
        if times is not None and name in times:
            material = active & (times[name] >= MATERIAL_SHARE * times["total"])
        key, p = K.lookup(ops, call.kind, call.variant)
        if call.kind in MEASURED_KINDS and K.op_key(call.kind, call.variant) not in ops:
            missing = missing + active * 1.0
        if key not in ops:
            continue
        low, high = log2_bounds(call.kind, p, jnp)
        for j in checked(call.kind):
            u = jnp.log2(1.0 + jnp.asarray(w.shape[j], jnp.float32))
            cols.append(distance(u, low[j], high[j], jnp) * material)
            labels.append(f"{name}.{K.OP_KINDS[call.kind].descriptors[j]}")
    return labels, cols, missing


#: labels of the distance columns of :func:`step_numeric`, per traced structure
_LABELS: dict = {}


@partial(jax.jit, static_argnames=("model", "tp"))
def step_numeric(ops: dict, model, tp: int, batch: StepBatch, times: dict | None = None):
    """Jitted numbers behind the step flags: (largest shape distance, its column index,
    no-kernel-data count, longest sequence in tokens, the :class:`StepTotals`), each (S,);
    ``times``: the steps' breakdown (µs per component and ``total``), to leave out kernels
    under :data:`MATERIAL_SHARE` of a step. The column labels land in :data:`_LABELS` while
    tracing (:func:`step_flags` traces it for them when its numbers came from a stored program)."""
    t = step_totals(batch, jnp)
    labels, cols, missing = _shape_columns(ops, step_ops(model, tp, t), times)
    _LABELS[(model, tp, jax.tree_util.tree_structure(ops))] = labels
    rows = batch.prefill_new.shape[0]
    best, arg = jnp.zeros((rows,), jnp.float32), jnp.zeros((rows,), jnp.int32)
    for j, c in enumerate(cols):                 # running (max, argmax): no (S, columns) matrix
        c = jnp.broadcast_to(c, (rows,))
        arg = jnp.where(c > best, j, arg)
        best = jnp.maximum(best, c)
    pf = jnp.max((batch.prefill_cached + batch.prefill_new) * (batch.prefill_mask > 0), axis=1,
                 initial=0.0)
    dc = jnp.max(jnp.where(batch.decode_mask > 0, batch.decode_ctx + 1.0, 0.0), axis=1, initial=0.0)
    return best, arg, jnp.broadcast_to(missing, (rows,)), jnp.maximum(pf, dc), t


# --------------------------------------------------------------------------------------------
# context and memory

def context_limit(model) -> int:
    """The model's context limit in tokens (``max_position_embeddings`` or an alias in its
    config file); 0 when the config gives none."""
    for name in CONTEXT_LIMIT_FIELDS:
        v = cap_._raw_int(model.config_path, name)
        if v > 0:
            return v
    return 0


def fits_memory(model, gpu, tp: int, batch: StepBatch) -> np.ndarray:
    """Whether vLLM could run each step at once with ``model`` on ``gpu`` at TP ``tp`` and its
    defaults: every sequence's whole KV blocks fit the cache and there are at most max_num_seqs
    (256) sequences (:func:`roofcal.physics.capacity.fits`); all False when vLLM could not even
    start (the weights do not fit). A data-parallel deployment's step (``model.parallel``) is all
    its ranks' batches: it fits when its KV blocks fit the ranks' caches together and its
    busiest rank (⌈n/dp⌉ sequences) stays within max_num_seqs."""
    try:
        c = cap_.capacity(model, gpu, tp)
    except RoofcalError:
        return np.zeros(batch.num_steps, bool)
    return cap_.fits(c, batch, model.parallel.dp)


# --------------------------------------------------------------------------------------------
# provenance

def zero_shot(c, steps: bool = True) -> bool:
    """Whether coefficients ``c`` (:class:`~roofcal.model.coeffs.Coefficients`) are zero-shot
    for their GPU: not ``calibrated`` (neutral or bootstrap), or — for whole ``steps`` — a
    serving stack marked ``zero_shot`` or borrowed from a file of another GPU."""
    if not c.calibrated:
        return True
    if not steps or c.stack is None or c.stack not in c.stacks:
        return False
    src = c.stacks[c.stack].source or {}
    lent = src.get("borrowed_from") or {}
    return bool(src.get("zero_shot")) or (isinstance(lent, dict) and lent.get("gpu", c.gpu) != c.gpu)


# --------------------------------------------------------------------------------------------
# all flags

def step_flags(c, model, gpu, tp: int, batch: StepBatch, numeric=None) -> dict:
    """Every column of :data:`STEP_FLAGS` for the steps of one deployment, as arrays of shape
    (S,); ``c`` the coefficients used (their ``params["ops"]`` and provenance). The numbers come
    from one jitted call (:func:`step_numeric`, or ``numeric``: its output when already
    computed); token sums are float32, exact up to 2^24 tokens per step."""
    ops = c.params["ops"]
    if numeric is None:
        numeric = step_numeric(ops, model, tp, batch, step_breakdown(c.params, model, gpu, tp, batch))
    dist, arg, missing, longest, totals = jax.tree_util.tree_map(np.asarray, numeric)
    key = (model, tp, jax.tree_util.tree_structure(ops))
    if key not in _LABELS:        # numbers of a stored program (roofcal.programs): trace, no compile
        jax.eval_shape(lambda o, b: step_numeric(o, model, tp, b), ops, batch)
    labels = _LABELS[key]
    dist = np.where(dist > TOLERANCE, dist.astype(np.float64), 0.0)
    what = np.asarray(labels + [""], object)[np.where(dist > 0, arg, len(labels))] if labels \
        else np.full(len(dist), "", object)
    rows = batch.num_steps
    limit = context_limit(model)
    detail = _step_details(ops, model, tp, totals, dist, what)
    return {"ood_shape": dist, "ood_what": what, "ood_detail": detail,
            "ood_context": longest > limit if limit else np.zeros(rows, bool),
            "fits_memory": fits_memory(model, gpu, tp, batch),
            "zero_shot": np.full(rows, zero_shot(c, steps=True)),
            "no_kernel_data": missing > 0}


def _step_details(ops: dict, model, tp: int, totals, dist, what) -> np.ndarray:
    """The :func:`_details` of steps: the worst descriptor's value and fitted range in natural
    units, from the steps' kernel calls (NumPy, outside the jitted call)."""
    out = np.full(len(dist), "", object)
    if not (dist > 0).any():
        return out
    calls = step_ops(model, tp, totals)
    for label in sorted(set(what[dist > 0].tolist())):
        name, desc = label.rsplit(".", 1)
        call = calls[name]
        key, p = K.lookup(ops, call.kind, call.variant)
        j = K.OP_KINDS[call.kind].descriptors.index(desc)
        low, high = log2_bounds(call.kind, p)
        sel = (what == label) & (dist > 0)
        x = np.broadcast_to(np.asarray(call.work.shape[j], np.float64), dist.shape)[sel]
        n = int(sel.sum())
        out[sel] = _details(np.ones(n), K.OP_KINDS[call.kind].descriptors, np.full(n, j),
                            np.log2(1.0 + x), np.full(n, low[j]), np.full(n, high[j]))
    return out


def summary(df: pd.DataFrame, unit: str = "steps", neutral: bool = False) -> str:
    """One line saying how many rows are out of domain and why, e.g. ``3 of 10 steps out of
    domain: 2 beyond the fitted shapes (attn_decode.context up to 6.3 log2), 1 beyond the context
    limit; 1 does not fit in memory``. Rows with kernels that have no fitted data have no fitted
    shapes to be checked against, and are never called inside the domain. ``neutral``: the
    prediction came from the neutral roofline defaults (no coefficient file), which the line says
    instead of calling the rows zero-shot. Columns missing from ``df`` are skipped."""
    from roofcal.tables import count
    n = len(df)
    col = lambda name, default: df[name].to_numpy() if name in df.columns else np.full(n, default)
    shape, ctx = col("ood_shape", 0.0).astype(float) > 0, col("ood_context", False).astype(bool)
    unchecked = col("no_kernel_data", False).astype(bool)
    ood = shape | ctx
    parts = []
    if shape.any():
        sub = df.loc[shape]
        worst_by = sub.groupby("ood_what")["ood_shape"].max().sort_values(ascending=False)
        names = []
        for w, d in worst_by.head(3).items():
            txt = w
            if "ood_detail" in sub.columns:       # the farthest row's value and the fitted range
                row = sub[sub["ood_what"] == w].sort_values("ood_shape", ascending=False).iloc[0]
                if str(row["ood_detail"]):
                    txt = f"{w.rsplit('.', 1)[0]} {row['ood_detail']}"
            names.append(txt)
        more = ", …" if len(worst_by) > 3 else ""
        parts.append(f"{shape.sum()} beyond the fitted shapes ({'; '.join(names)}{more})")
    if ctx.any():
        parts.append(f"{ctx.sum()} beyond the context limit")
    if ood.any():
        line = f"{ood.sum()} of {n} {unit} out of domain: " + ", ".join(parts)
    elif unchecked.all():
        line = (f"{count(n, unit)} not checked against a fitted domain: "
                + ("no fitted data (neutral roofline defaults, no --coeffs)" if neutral
                   else f"{'its' if n == 1 else 'their'} kernels have no fitted data"))
    elif unchecked.any():
        line = f"{n - unchecked.sum()} of {n} {unit} inside the fitted domain"
    else:
        line = f"all {n} {unit} inside the fitted domain" if n != 1 else f"the 1 {unit[:-1]} inside the fitted domain"
    extra = []
    nofit = ~col("fits_memory", True).astype(bool)
    if nofit.any():
        extra.append(f"{nofit.sum()} {'does' if nofit.sum() == 1 else 'do'} not fit in memory")
    zs = col("zero_shot", False).astype(bool)
    if zs.any() and not neutral:
        extra.append(f"{zs.sum()} zero-shot (coefficients or serving stack not calibrated on this GPU)")
    if unchecked.any() and (ood.any() or not unchecked.all()):
        extra.append("neutral roofline defaults (no --coeffs): no fitted shapes to check" if neutral else
                     f"{unchecked.sum()} with kernels that have no fitted data (their shapes not checked)")
    return "; ".join([line] + extra)

"""Fitting the correction layer to measurements, in two stages.

1. **Kernels.** Each kernel kind/variant (``gemm/bf16``, ``attn_decode/fp8``, …) of each kernel
   set (the kernel library the rows were measured in, e.g. ``vllm-0.24.0``) is fitted on its per-op
   rows: efficiency surfaces, latency and sharpness. Rows are held out at random, stratified per
   set and kind/variant (seeded per stratum, so adding a set does not reshuffle another's split);
   at most ``max_rows`` training rows per kernel are fitted (a seeded sample beyond that). Tables
   every set shares (NCCL) are fitted once and join every set; a set without rows of a kernel
   another set has borrows that one (recorded).
2. **Steps.** With the kernel corrections from stage 1 frozen, the step-level parameters are
   fitted on whole-step measurements: overheads, per-kernel-group scales (a serving stack's kernels
   inside real steps against the same kernels in isolation) and the prefill–decode mix. Freezing
   keeps the per-op calibration intact; ``finetune`` > 0 instead lets the kernels move with a
   prior of that many pseudo-rows (``roofcal bench`` compares the two). Steps are held out by
   configuration, so repeated runs of one configuration never straddle train and test.

Objective per stage: mean squared log-ratio over training rows (see :mod:`roofcal.loss`) plus a
Gaussian prior on the raw parameters, scaled as ``κ/N`` so it acts like κ pseudo-rows: strong when
data is scarce (a few-shot refit stays near its prior), negligible with thousands of rows; a
surface's terms of a degree whose terms outnumber the rows are held harder (:func:`held_by_rows`),
and a refit's surfaces are held near its prior's over the box of the rows' shapes as well
(:func:`anchored_objective`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, field, replace

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

from roofcal.calibration import STEP_TARGET_NAMES, conformal
from roofcal.calibration import shapes as S
from roofcal.errors import RoofcalError
from roofcal.grouping import members
from roofcal.model import correction as K
from roofcal.model import curves
from roofcal.model import intervals as IV
from roofcal.model.coeffs import (UNVERSIONED, Coefficients, KernelSet, Stack, add_stack,
                                  nearest_kernel_set, newest_kernel_set, op_as_read, roundtrip,
                                  with_kernels, with_stack)
from roofcal.measurements.ops import kernel_set_order
from roofcal.physics.hardware import GPUSpec
from roofcal.calibration.loss import prior_penalty
from roofcal.metrics import error_summary, log_ratio_sq, split_groups
from roofcal.model.combine import (NON_COMPONENT, combine, combined, kernel_breakdown,
                                   overhead_counts, step_breakdown)
from roofcal.physics.kernels import groups, in_blocks
from roofcal.model.predict import IdealTimes, ideal_times, predict_table
from roofcal.calibration.optim import lbfgs, minimize
from roofcal.physics.steps import step_totals


#: what whole-step measurements are compared with (``roofcal fit --step-target``): target →
#: [(measured field of :class:`~roofcal.measurements.stepdata.StepData`, predicted quantity)]
#: with the predicted ``step`` = GPU and CPU work combined by the stack's overlap (what a
#: simulator's clock advances by) and ``gpu`` = its GPU side alone (kernels × in-step scales,
#: launch gaps, all-reduce synchronisation)
STEP_TARGETS = {
    "step": (("measured_us", "step"),),        # a profiler's whole-step time (splitwise)
    "gpu": (("measured_us", "gpu"),),          # vLLM step tracing's forward time (step.duration_us)
    "cycle": (("cycle_us", "step"),),          # start of a step to the next one's (traces)
    "gpu+cycle": (("measured_us", "gpu"), ("cycle_us", "step")),
}
assert tuple(STEP_TARGETS) == STEP_TARGET_NAMES


def measured(d, field_name: str) -> np.ndarray:
    """A StepData's measured ``measured_us`` or ``cycle_us`` (NaN where not measured), µs."""
    return np.asarray(d.measured_us if field_name == "measured_us" else d.cycles, np.float64)


def predicted(out: dict, what: str):
    """The predicted ``step`` (µs, the breakdown's total) or its ``gpu`` side (total less the
    CPU work and the overlap that hides part of it) from a :func:`step_breakdown` output."""
    from roofcal.model.combine import gpu_side
    return out["total"] if what == "step" else gpu_side(out)


def steps_error(terms):
    """Mean squared log-ratio of predicted to measured steps over ``terms``, an iterable of
    (:func:`step_breakdown` output, quantity, training weights (S,), measured µs (S,)): each
    term's mean weighted by its weight (stage 2's data term, whether the kernels move or not)."""
    total, count = 0.0, 0.0
    for out, what, w, y in terms:
        total = total + log_ratio_sq(predicted(out, what), y, w) * jnp.sum(w)
        count = count + jnp.sum(w)
    return total / count


#: L-BFGS iterations per block of a kernel fit, and the relative gain of the loss over a block
#: below which a degree stage stops: lower-degree stages (warm starts) converge in 50–250 of their
#: 400 iterations, while the full degree still improves at 400 (moe/bf16: −1.7 % over its last 50)
KERNEL_BLOCK = 50
KERNEL_TOL = 1e-4

#: training rows up to which a warm-started kernel fit (a few-shot refit from ``--prior``: one
#: stage, from near its optimum) runs L-BFGS compiled for compile time (``programs.FAST_COMPILE``):
#: a first few-shot fit of 7 A100 kernels on 50 rows each takes 4.1 s with it, 7.0 s without (most
#: of it compiling 5 L-BFGS programs); later runs take 0.1 s more (1.5 against 1.4 s), where
#: without the cap a fit of up to 7,392 rows a kernel takes 1.0 s more (docs/limits.md#fit-speed)
QUICK_FIT_ROWS = 1_000

#: prior strength (pseudo-rows) of a few-shot refit (``roofcal fit --prior``) on its parameters:
#: 0.1 among 0.01, 0.1, 0.3 and 1 with the surface anchor (:data:`ANCHOR`), on the few-shot
#: learning curves of A100 from H100 and H100 from A100, seeds 0–2 (roofcal.bench.transfer;
#: docs/accuracy.md). Without the anchor 1 had been best among 0.1, 0.3, 1, 3 and 10
FEW_SHOT_KAPPA = 0.1


@dataclass(frozen=True)
class FitSettings:
    """Settings of a fit; all recorded in the coefficient file."""

    seed: int = 0
    holdout: float = 0.2              # fraction of per-op rows / step configurations held out
    kernel_iters: int = 400           # L-BFGS iterations per degree stage (see fit_kernel)
    step_iters: int = 500
    lr: float = 0.05                  # Adam step size of stage 2
    degree: tuple = ()                # ((kind, degree), ...) overrides of OP_KINDS defaults
    prior_terms: float = 0.01         # κ of the efficiency-surface terms (pseudo-rows)
    prior_scalars: float = 0.01       # κ of intercepts, latency, sharpness
    finetune: float = 0.0             # 0: kernels frozen in stage 2; else κ holding them to stage 1
    prior_scales: float = 1.0         # κ holding the step-level kernel scales at 1
    step_target: str = "step"         # what measured steps are compared with (STEP_TARGETS)
    max_rows: int = 10_000            # training rows fitted per kernel (a seeded sample beyond)
    kernels: str | None = None        # kernel set whole steps are fitted with (None: the newest)
    progress: bool = True

    def degree_of(self, kind: str) -> int:
        return dict(self.degree).get(kind, K.OP_KINDS[kind].degree)

    def record(self) -> dict:
        d = asdict(self)
        d.pop("progress")
        d["degree"] = {k: self.degree_of(k) for k in K.OP_KINDS}
        d["loss"] = "mean squared log-ratio + Gaussian prior (kappa/N pseudo-rows)"
        d["optimizer"] = ("kernels: optax L-BFGS by continuation in surface degree; "
                          "steps: optax Adam, cosine-decayed step size")
        return d


# --------------------------------------------------------------------------------------------
# splits

def _rng(seed: int, label: str) -> np.random.Generator:
    """A generator seeded by ``seed`` and the label (stable across processes)."""
    import zlib
    return np.random.default_rng([seed, zlib.crc32(label.encode())])


def label_rows(labels: np.ndarray) -> dict:
    """{label: its rows' positions, ascending} of an array of labels, labels sorted: one hashing
    pass and one sort (a comparison of all 262,992 row labels with each of 29 cost 0.06 s)."""
    codes, names = pd.factorize(np.asarray(labels, object))
    rows = dict(zip(names.tolist(), members(codes, len(names))))
    return {lab: rows[lab] for lab in sorted(rows)}


def split_rows(labels: np.ndarray, holdout: float, seed: int) -> np.ndarray:
    """Boolean test mask: ``holdout`` of the rows of every label (stratified), seeded per label."""
    test = np.zeros(len(labels), bool)
    for lab, idx in label_rows(labels).items():
        k = int(round(holdout * len(idx)))
        if len(idx) >= 5 and k:
            test[_rng(seed, lab).choice(idx, size=k, replace=False)] = True
    return test


def cap_rows(labels: np.ndarray, keep: np.ndarray, max_rows: int, seed: int) -> np.ndarray:
    """``keep`` with at most ``max_rows`` rows of every label left (a seeded sample)."""
    out = keep.copy()
    for lab, idx in label_rows(labels).items():
        idx = idx[keep[idx]]
        if len(idx) > max_rows:
            out[idx] = False
            out[_rng(seed + 1, lab).choice(idx, size=max_rows, replace=False)] = True
    return out


def row_labels(table: pd.DataFrame) -> np.ndarray:
    """``<kernel set>|<kind>/<variant>`` of every per-op row (the strata of the split)."""
    if not len(table):
        return np.array([], object)
    sets = table["kernels"] if "kernels" in table else pd.Series("", index=table.index)
    return (sets.astype(str) + "|" + table["op"] + "/" + table["dtype"]).to_numpy()


def kernel_set_rows(table: pd.DataFrame) -> dict:
    """{kernel set: boolean row mask} of a per-op table: each set's own rows and the rows every
    set shares (``kernels`` ""); a table without versioned rows is one set, ``unversioned``."""
    sets = table["kernels"].astype(str).to_numpy() if "kernels" in table and len(table) \
        else np.full(len(table), "", object)
    names = sorted(set(sets.tolist()) - {""}, key=kernel_set_order)
    if not names:
        return {UNVERSIONED: np.ones(len(table), bool)} if len(table) else {}
    return {n: (sets == n) | (sets == "") for n in names}


# --------------------------------------------------------------------------------------------
# stage 1: kernels

#: kernel kinds whose fit reads its features factored through the measured shapes
#: (:mod:`roofcal.calibration.shapes`): the MoE surfaces' 495 terms over ≈ 500 shapes (its fits
#: 39 → 32 s); the 35–126-term surfaces are faster dense (a GEMM's fit 0.9 → 2.5 s factored: the
#: per-row gather and scatter cost more than the product they save), and stay exactly as before
FACTORED_KINDS = ("moe",)


@dataclass
class KernelData:
    """Rows of one kernel kind/variant, ready for the jitted loss."""

    kind: str
    feats: jnp.ndarray | None  # (terms, N), transposed (kernel_objective); None: ``fac`` holds them
    tc: jnp.ndarray           # ideal compute µs
    tm: jnp.ndarray           # ideal memory µs
    y: jnp.ndarray            # measured µs
    train: jnp.ndarray        # 1.0 for training rows
    lo: np.ndarray
    hi: np.ndarray
    index: np.ndarray         # row positions in the table
    fac: S.Factored | None = None   # the features factored through the shapes (FACTORED_KINDS)
    rows_first: jnp.ndarray | None = None   # ``feats`` also as (N, terms), for their gradient
    res: jnp.ndarray | None = None  # share of each row's working set a warm L2 holds (None: 0)

    def resident(self):
        """(N,) the warm L2's share of each row (:attr:`res`; zeros where not given)."""
        return jnp.zeros_like(self.tm) if self.res is None else self.res

    def features(self) -> jnp.ndarray:
        """The (N, terms) feature matrix, whichever way it is held."""
        return self.feats.T if self.fac is None else S.dense(self.fac)

    def objective(self) -> tuple:
        """(objective, its feature argument): :func:`kernel_objective` with ``feats`` or
        :func:`factored_objective` with ``fac``."""
        return ((kernel_objective, (self.feats, self.rows_first)) if self.fac is None
                else (factored_objective, self.fac))


#: a dense kind's features are also held rows first (:attr:`KernelData.rows_first`, for their
#: gradient) from this many rows: a GEMM's 10,000 rows × 70 terms, an L-BFGS iteration 0.35 → 0.28
#: ms; below it (the all-reduces' 55–101 rows) the product is as fast either way
ROWS_FIRST_FROM = 1024


def kernel_data(table: pd.DataFrame, gpu: GPUSpec, test: np.ndarray, settings: FitSettings,
                ideal: IdealTimes | None = None) -> dict:
    """Precompute features and ideal times per kernel kind/variant (factored through the
    measured shapes for :data:`FACTORED_KINDS`); ``ideal``: the rows' ideal times, when already
    computed (:func:`roofcal.model.predict.ideal_times`).

    Every variant of a kind is zero-padded (weight 0) to the kind's largest row count (and
    shape count), so the variants share one compiled objective.
    """
    prepared = []
    ideal = ideal_times(gpu, table) if ideal is None else ideal
    for g, op, dt, idx in groups(table):
        tc, tm, z = ideal.rows(op, idx)
        res = ideal.res[idx]
        z = np.asarray(z)
        train = ~test[idx]
        ztr = z[train] if train.any() else z
        lo, hi = ztr.min(0), ztr.max(0)
        deg = settings.degree_of(op)
        fac = S.factor(op, z, lo, hi, deg) if op in FACTORED_KINDS else None
        f = None
        if fac is None:         # row-wise, in blocks: every set shares a program
            f = in_blocks(lambda zb: K.features(zb, lo, hi, deg), len(z), np.asarray(z, np.float32), 0.0)
        prepared.append((op, dt, idx, tc, tm, train, lo, hi, f, fac, res))
    rows, shapes = {}, {}
    for op, _, idx, *_, fac, _res in prepared:
        rows[op] = max(rows.get(op, 0), len(idx))
        shapes[op] = max(shapes.get(op, 0), 0 if fac is None else int(fac.shapes.shape[0]))
    out = {}
    for op, dt, idx, tc, tm, train, lo, hi, f, fac, res in prepared:
        f = None if f is None else np.asarray(f)              # on the host: no XLA program
        out[K.op_key(op, dt)] = grown(KernelData(
            op, None if f is None else f.T, tc, tm, table["latency_us"].values[idx], train, lo, hi, idx,
            fac, None if f is None or rows[op] < ROWS_FIRST_FROM else f, res), rows[op], shapes[op])
    return out


def grown(d: KernelData, rows: int, shapes: int) -> KernelData:
    """``d`` zero-padded (weight 0) to ``rows`` rows and, factored, ``shapes`` shapes: padded on
    the host and put on the device once (no XLA program per array)."""
    pad = rows - int(np.shape(d.tc)[0])

    def grow(a, v, axis=0):
        a = np.asarray(a, np.float32)
        return jax.device_put(np.pad(a, [(0, pad) if i == axis else (0, 0) for i in range(a.ndim)],
                                     constant_values=v))
    return replace(d, feats=None if d.feats is None else grow(d.feats, 0.0, axis=1),
                   rows_first=None if d.rows_first is None else grow(d.rows_first, 0.0),
                   tc=grow(d.tc, 1.0), tm=grow(d.tm, 1.0), y=grow(d.y, 1.0), train=grow(d.train, 0.0),
                   res=grow(d.resident(), 0.0),
                   fac=None if d.fac is None else S.padded(d.fac, rows, shapes))


#: kinds whose data is padded to one size across kernel sets, so both sets' fits of a kind share
#: one compiled L-BFGS program (:func:`shared_sizes`): where the sizes are close (GEMM 7,392 and
#: 10,000 rows, MoE 9,526 and 10,000 rows, 402 and 602 shapes) or small (the all-reduces' 55 and
#: 101 rows) a program fewer (≈ 1.6 s of CPU to compile, ≈ 0.3 s to trace and load) costs more
#: than the padded rows. The all-reduces, over 20 seeded splits, held out: every table within
#: ±0.1 point of its own size (0.14 eager 6.87 → 6.83 %, 0.24 eager 4.80 → 4.89 %, SE 0.4–0.6).
#: Attention (4,348 / 4,366 against 12,903 / 10,526 rows) is a trade, measured: 2 programs fewer,
#: ≈ 4 s of CPU less to compile cold, but each warm fit 5 % slower (A/B 1.05, the padded rows
#: computed at every step; held out, 0.14's attention −0.006 to −0.002 points). The cost is
#: decode's: its 126 terms take 0.70 ms an L-BFGS iteration at 4,348 rows, 1.06 ms at 10,000.
#: Prefill's 84 take 0.137 and 0.166 ms, so prefill alone is padded: one program fewer (≈ 0.7 s
#: of CPU to compile, 0.15 s to trace) for 0.10 s more of CPU a warm fit (its two fits timed
#: alone: 0.151 → 0.190 s, 0.145 → 0.206 s); held out, 0.14's prefill 5.351 → 5.348 % (bf16)
#: and 5.467 → 5.462 % (fp8)
SHARED_SIZE_KINDS = ("gemm", "moe", "allreduce", "attn_prefill")


def shared_sizes(data: dict, kinds=SHARED_SIZE_KINDS) -> dict:
    """``data`` ({key: :class:`KernelData`}) with every kernel of ``kinds`` zero-padded (weight 0)
    to its kind's largest row count (and shape count) over all keys."""
    rows, shapes = {}, {}
    for d in data.values():
        if d.kind in kinds:
            rows[d.kind] = max(rows.get(d.kind, 0), int(d.tc.shape[0]))
            shapes[d.kind] = max(shapes.get(d.kind, 0), 0 if d.fac is None else int(d.fac.shapes.shape[0]))
    same = lambda d: int(d.tc.shape[0]) == rows[d.kind] and \
        (d.fac is None or int(d.fac.shapes.shape[0]) == shapes[d.kind])
    return {k: d if d.kind not in kinds or same(d) else grown(d, rows[d.kind], shapes[d.kind])
            for k, d in data.items()}


def init_op_params(d: KernelData, degree: int) -> dict:
    """A data-informed start: intercepts from the median achieved fraction of peak in the rows
    bound by each resource, latency half the fastest measurement, sharpness 3."""
    p = {k: np.array(v) for k, v in K.neutral_op_params(d.kind, degree).items()}
    tc, tm, y = np.asarray(d.tc), np.asarray(d.tm), np.asarray(d.y)
    keep = np.asarray(d.train) > 0
    for name, mine, other in (("eff_c", tc, tm), ("eff_m", tm, tc)):
        sel = keep & (mine >= other) & (mine > 0)
        frac = float(np.median(mine[sel] / y[sel])) if sel.any() else 0.5
        p[name][0] = K.logit(min(max(frac, 0.02), 0.95))
    p["latency"] = math.log(0.5 * float(y[keep].min()))
    p["sharpness"] = K.softplus_inv(_sharpness(d.kind)[0] - 1.0)
    if "l2_saving" in p:
        p["l2_saving"] = np.float32(K.l2_saving_raw(L2_SAVING_START))
    p["lo"], p["hi"] = d.lo, d.hi
    return K.on_device(p)


#: where a kernel's warm-L2 saving starts and its physical prior is centred (the share of
#: device-memory time saved on bytes a warm L2 holds): the fitted values run from about 0 (A100)
#: to 0.6 (H100 decode attention) and 0.8–0.9 (the L40S's), docs/model.md
L2_SAVING_START = 0.3


def _sharpness(kind: str) -> tuple[float, float | None]:
    """(prior centre of the soft-max sharpness q, pseudo-rows holding it or None: the weak
    default) of a kernel kind (:attr:`roofcal.model.correction.OpKind.sharpness`)."""
    fixed = K.OP_KINDS[kind].sharpness
    return fixed if fixed is not None else (3.0, None)


def prior_strengths(p: dict, settings: FitSettings, n: float, kind: str | None = None) -> dict:
    """Per-leaf κ/N weights: surface terms get ``prior_terms``, intercepts and scalars
    ``prior_scalars`` (the sharpness its kind's own pseudo-rows where it fixes it); clamp
    bounds none."""
    def surf(w):                    # NumPy: built on the host, without an XLA program each
        s = np.full(w.shape, settings.prior_terms / n, np.float32)
        s[0] = settings.prior_scalars / n
        return s
    q_rows = _sharpness(kind)[1] if kind is not None else None
    return {"eff_c": surf(p["eff_c"]), "eff_m": surf(p["eff_m"]),
            "latency": np.float32(settings.prior_scalars / n),
            "sharpness": np.float32((q_rows if q_rows is not None else settings.prior_scalars) / n),
            "lo": np.zeros(p["lo"].shape, np.float32), "hi": np.zeros(p["hi"].shape, np.float32),
            **({"l2_saving": np.float32(settings.prior_scalars / n)} if "l2_saving" in p else {})}


def default_prior(kind: str, degree: int, d: KernelData) -> dict:
    """Physical prior: 60% of peak on both resources, flat surface, 3 µs latency, q = 3 (or the
    kind's own, :func:`_sharpness`)."""
    p = {k: np.array(v) for k, v in K.neutral_op_params(kind, degree).items()}
    for name in ("eff_c", "eff_m"):
        p[name][0] = K.logit(0.6)
    p["latency"] = math.log(3.0)
    p["sharpness"] = K.softplus_inv(_sharpness(kind)[0] - 1.0)
    if "l2_saving" in p:
        p["l2_saving"] = np.float32(K.l2_saving_raw(L2_SAVING_START))
    p["lo"], p["hi"] = d.lo, d.hi
    return K.on_device(p)


def kernel_objective(p: dict, data: tuple):
    """Mean squared log-ratio of one kernel kind/variant plus its prior (see module docstring).

    ``data``: ((features (terms, N), the same (N, terms)), tc, tm, the warm L2's share of each
    row, measured µs, training weights, prior centre, prior strengths, mask); ``mask`` (terms,) switches surface terms on (1) or off
    (0), for continuation in degree (the layouts: :func:`roofcal.model.correction.op_time_from_features`).
    """
    (feats_t, feats), tc, tm, res, y, train, center, strength, mask = data
    q = {**p, "eff_c": p["eff_c"] * mask, "eff_m": p["eff_m"] * mask}
    pred = K.op_time_from_features(q, feats_t, tc, tm, feats, res)
    return log_ratio_sq(pred, y, train) + prior_penalty(q, center, strength)


def factored_objective(p: dict, data: tuple):
    """:func:`kernel_objective` with the features factored through the measured shapes
    (``data[0]`` a :class:`roofcal.calibration.shapes.Factored`): the same value up to float
    rounding."""
    fac, tc, tm, res, y, train, center, strength, mask = data
    q = {**p, "eff_c": p["eff_c"] * mask, "eff_m": p["eff_m"] * mask}
    z = S.logits(fac, jnp.stack([q["eff_c"], q["eff_m"]], axis=1))
    pred = K.corrected_time(q, jax.nn.sigmoid(z[:, 0]), jax.nn.sigmoid(z[:, 1]), tc, tm, res)
    return log_ratio_sq(pred, y, train) + prior_penalty(q, center, strength)


#: the power of :func:`held_by_rows`: 2 rather than 0 (off) or 1 on the few-shot learning curve of
#: A100 from H100, seeds 0–2, then checked on H100 from A100 (docs/accuracy.md, "Transfer between
#: GPUs")
HOLD_POWER = 2.0


def held_by_rows(order: np.ndarray, n: float) -> np.ndarray:
    """(terms,) float32 factors on the prior strengths of a surface's terms, ``order`` (terms,)
    their degrees, for a fit on ``n`` training rows: (terms of that degree and below / n) **
    :data:`HOLD_POWER` where the terms outnumber the rows, else 1. Fewer rows than a degree's
    terms hold that degree near the prior (the reference GPU's surface in a few-shot refit, the
    flat physical one from scratch) rather than let 30 rows set 495 terms; every fit with more
    rows than terms (all of the bundled tables' main fits) is unchanged."""
    upto = np.searchsorted(np.sort(order), order, side="right").astype(np.float64)
    return np.maximum(1.0, (upto / max(n, 1.0)) ** HOLD_POWER).astype(np.float32)


#: the surface anchor of a kernel fit with a prior given (a few-shot refit from ``--prior``,
#: :func:`anchored_objective`): pseudo-rows per term and training row (:func:`anchor_rows`); 0:
#: none. 1 rather than 0.5 or 2, and rather than fixed pseudo-rows (0.03–10: the best weight
#: fell from 1–3 at 100 rows to 0.03–0.1 at 1,000), on the learning curves of seeds 0–2
#: (docs/accuracy.md, "Transfer between GPUs")
ANCHOR = 1.0


def anchor_rows(terms: int, n: float) -> float:
    """Pseudo-rows of the surface anchor of a surface of ``terms`` terms fitted on ``n`` rows:
    :data:`ANCHOR` × terms / n. A least-squares surface's variance at a shape it was not fitted
    on grows with the mean leverage of its rows, terms / n; its pull toward the prior with it:
    a decode surface (126 terms) 1.26 pseudo-rows on 100 rows, 0.13 on 1,000."""
    return ANCHOR * terms / max(n, 1.0)


def box_gram(exps: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """(terms, terms) float64 Gram matrix E[f_i(z) f_j(z)] of the monomials f with exponents
    ``exps`` (terms, descriptors), z uniform on the box [``lo``, ``hi``] (descriptors,) of
    standardized log-shapes: for a surface change Δ (terms,), Δ·G·Δ is the mean squared change
    of the surface over the box. Exact: E[z^k] = (hi^(k+1) − lo^(k+1)) / ((k+1)(hi − lo)) per
    descriptor (lo^k where the box is flat in it), multiplied across descriptors."""
    lo, hi = np.asarray(lo, np.float64), np.asarray(hi, np.float64)
    k = exps[:, None, :] + exps[None, :, :]                       # (terms, terms, descriptors)
    j = np.arange(int(k.max()) + 1, dtype=np.float64)
    width = hi - lo
    flat = width < 1e-9
    wide = (hi[:, None] ** (j + 1) - lo[:, None] ** (j + 1)) / ((j + 1) * np.where(flat, 1.0, width)[:, None])
    moments = np.where(flat[:, None], lo[:, None] ** j, wide)     # (descriptors, powers)
    return np.prod(moments[np.arange(len(lo)), k], axis=-1)


def surface_change(p: dict, center: dict, gram) -> jnp.ndarray:
    """Mean squared change (logit²) of both efficiency surfaces of ``p`` from ``center`` over
    the box of :func:`box_gram` (``gram``, (terms, terms))."""
    dc, dm = p["eff_c"] - center["eff_c"], p["eff_m"] - center["eff_m"]
    return dc @ (gram @ dc) + dm @ (gram @ dm)


def anchored_objective(objective, p: dict, data: tuple):
    """``objective(p, inner)`` plus the surface anchor: ``data`` = (inner, (gram, center,
    weight)), the weight κ/N (κ: :func:`anchor_rows`) so that it acts as κ pseudo-rows spread
    evenly over the box of measured shapes, each pulling the efficiency logits toward the prior's
    (:func:`surface_change` of the surface in use: ``inner``'s last item masks its terms, as in
    :func:`kernel_objective`).
    The coefficient prior alone holds every term alike; a term's coefficient matters in
    proportion to its monomial, which at the corners of the box (the log-shapes' extremes
    together) is largest: 100 A100 decode rows refitted from the H100 (κ = 1, no anchor) moved
    the surface there until batch 1 at context 1 was predicted 90 times too slow."""
    inner, (gram, center, weight) = data
    mask = inner[-1]
    q = {"eff_c": p["eff_c"] * mask, "eff_m": p["eff_m"] * mask}
    return objective(p, inner) + weight * surface_change(q, center, gram)


@functools.cache
def with_anchor(objective):
    """:func:`anchored_objective` of ``objective``, one object per objective: the optimiser's
    compiled programs are keyed by their loss function, so every anchored fit of one kind (and
    row count) reuses the programs of the first instead of compiling its own."""
    return functools.partial(anchored_objective, objective)


def fit_kernel(d: KernelData, settings: FitSettings, center: dict, init: dict | None,
               anchored: bool = False) -> dict:
    """Fit one kernel kind/variant by continuation in the surface degree.

    The surfaces are not convex, and a direct fit of a degree-4 polynomial lands in different
    local minima for different step sizes. So the degree-1 surface is fitted first (L-BFGS), then
    the degree-2 terms are switched on and the fit resumed from there, and so on up to the full
    degree; each stage starts where the simpler surface ended, so it never ends worse than it on
    the training objective. One compiled program serves every stage (terms are masked). The
    clamp bounds ``lo``, ``hi`` are the rows' (features are computed with them): they are set
    aside, not carried through L-BFGS (their gradient is 0; two leaves fewer, the same sums).
    ``anchored`` (a prior given, not the flat default): the surfaces are also held near
    ``center``'s over the box of the rows' shapes (:func:`anchored_objective`).
    """
    n = float(np.asarray(d.train).sum())
    strength = prior_strengths(center, settings, max(n, 1.0), d.kind)
    p = {**init, "lo": center["lo"], "hi": center["hi"]} if init is not None \
        else init_op_params(d, settings.degree_of(d.kind))
    bounds = {"lo": p["lo"], "hi": p["hi"]}
    free = lambda tree: {k: v for k, v in tree.items() if k not in bounds}
    p, center, strength = free(p), free(center), free(strength)
    k = K.OP_KINDS[d.kind]
    exps = K.exponents(len(k.descriptors), K.degree_of(len(k.descriptors), int(p["eff_c"].shape[0])))
    order = exps.sum(1)
    f = held_by_rows(order, n)                            # 1 where the rows outnumber the terms
    strength = {**strength, "eff_c": strength["eff_c"] * f, "eff_m": strength["eff_m"] * f}
    best = np.inf
    start = int(order.max()) if init is not None else 1   # a warm start already holds every term
    objective, feats = d.objective()
    anchor = None
    if anchored and ANCHOR > 0:
        anchor = (jax.device_put(box_gram(exps, d.lo, d.hi).astype(np.float32)),
                  {"eff_c": center["eff_c"], "eff_m": center["eff_m"]},
                  jax.device_put(np.float32(anchor_rows(len(order), n) / max(n, 1.0))))
        objective = with_anchor(objective)
    for deg in range(start, int(order.max()) + 1):
        mask = jax.device_put((order <= deg).astype(np.float32))
        data = (feats, d.tc, d.tm, d.resident(), d.y, d.train, center, strength, mask)
        data = data if anchor is None else (data, anchor)
        # blocks of KERNEL_BLOCK iterations; a stage stops once a block gains < KERNEL_TOL
        q, value = lbfgs(objective, p, data, settings.kernel_iters,
                         chunks=max(1, settings.kernel_iters // KERNEL_BLOCK), tol=KERNEL_TOL,
                         fast_compile=init is not None and n <= QUICK_FIT_ROWS)
        if np.isfinite(value) and value <= best:       # a diverged stage keeps the simpler fit
            p, best = q, value
    return {**p, **bounds}


def with_default_variants(ops: dict, keys) -> dict:
    """``ops`` ({kind/variant: raw params}: a prior's kernels) and, for each of ``keys`` it lacks,
    its kind's default variant's params: what a prediction of that variant reads
    (:func:`roofcal.model.correction.lookup`). A refit centres such a kernel there (H100's FP8
    kernels from an A100 prior: the A100 runs no FP8) and starts it from scratch."""
    out = dict(ops)
    for key in keys:
        found, p = K.lookup(ops, *key.split("/", 1))   # the key itself when ops has it or no default
        if found != key:
            out[key] = p
    return out


#: training rows per surface term below which a few-shot kernel fit starts at its prior's surface
#: (:func:`fit_one`); from there on it starts from scratch and runs the main fit's continuation
#: in degree, still centred on the prior. Started at the prior's full-degree surface, L-BFGS
#: stops where even the training rows are fitted worse: 1,000 A100 prefill-attention rows
#: refitted from the H100 (seed 0), mean squared log-ratio 0.0087 there against 0.0052 by the
#: continuation, held out 7.3 against 5.5 %. 2 rather than 1, 3 or 4, and rather than always
#: starting at the prior, on the few-shot learning curves of seeds 0–2 (docs/accuracy.md,
#: "Transfer between GPUs")
WARM_ROWS_PER_TERM = 2.0

#: training rows per surface term from which a few-shot kernel fit is a main fit, only centred on
#: its prior: the main fit's κ (:func:`main_kappa`) and no surface anchor (:func:`fit_one`). 5
#: rather than 2: from 2, a GEMM refitted on 300 A100 rows (4.3 a term) strayed to 50 % held out
#: on seed 0; from 5, 1,000 rows a kernel gained 0.19–0.44 point on each of seeds 0–5, A100 from
#: H100 and H100 from A100 (docs/accuracy.md, "Transfer between GPUs")
MAIN_ROWS_PER_TERM = 5.0


def main_kappa(kappa: float) -> float:
    """κ (pseudo-rows) of a few-shot kernel fit with :data:`MAIN_ROWS_PER_TERM` rows per term or
    more: the main fit's (``FitSettings.prior_terms``, 0.01) for the default few-shot κ
    (:data:`FEW_SHOT_KAPPA`, 0.1), in proportion for another (``--prior-weight``)."""
    return kappa / FEW_SHOT_KAPPA * FitSettings.prior_terms


def rows_per_term(d: KernelData, p: dict) -> float:
    """``d``'s training rows per term of the efficiency surface of raw params ``p``."""
    return float(np.asarray(d.train).sum()) / int(np.shape(p["eff_c"])[0])


def set_aside(d: KernelData, seed: int) -> tuple[KernelData, np.ndarray]:
    """(``d`` with a fifth of its training rows set aside, their weights (N,) float32): a seeded
    draw per kernel kind, for :func:`fit_one`'s choice of fit."""
    train = np.asarray(d.train) > 0
    idx = np.flatnonzero(train)
    aside = _rng(seed, f"set aside {d.kind}").choice(idx, size=len(idx) // 5, replace=False)
    keep, held = train.astype(np.float32), np.zeros(len(train), np.float32)
    keep[aside], held[aside] = 0.0, 1.0
    return replace(d, train=jnp.asarray(keep)), held


def rows_error(d: KernelData, p: dict, weight: np.ndarray) -> float:
    """Mean squared log-ratio of raw params ``p`` on ``d``'s rows of ``weight`` (N,): its
    objective with every prior strength 0 and every term on."""
    objective, feats = d.objective()
    free = {k: v for k, v in p.items() if k not in ("lo", "hi")}
    zero = jax.tree_util.tree_map(jnp.zeros_like, free)
    on = jnp.ones(free["eff_c"].shape, jnp.float32)
    return float(objective(free, (feats, d.tc, d.tm, d.resident(), d.y, jnp.asarray(weight), free, zero, on)))


def fit_one(d: KernelData, settings: FitSettings, prior: dict | None = None,
            init: dict | None = None) -> dict:
    """:func:`fit_kernel` of ``d`` with its prior centred on ``prior`` (raw params; default
    :func:`default_prior`) and started from ``init`` (default :func:`init_op_params`); a
    prior's or start's curves are set aside.

    With a prior (a few-shot refit), by ``d``'s training rows per surface term: below
    :data:`WARM_ROWS_PER_TERM` started at ``init`` and held by the few-shot strengths
    (``settings``' κ, the surface anchor); from :data:`MAIN_ROWS_PER_TERM` on the rows
    set the surface and those strengths would hold it toward another GPU's, so ``d`` is fitted as
    a main fit, centred on ``prior`` with :func:`main_kappa` and no anchor. Between, the few-shot
    strengths and the main fit, both by continuation from scratch, are fitted on four fifths of
    the rows, and the one closer on the fifth set aside (:func:`set_aside`) is fitted on all: the
    two trade places from kernel to kernel there (300 A100 rows: decode attention 13.9 % held out
    with the few-shot strengths, 9.1 as a main fit; GEMM 10.1 and, on one seed, 50 %)."""
    c = curves.surface_only(prior) or default_prior(d.kind, settings.degree_of(d.kind), d)
    c = {**c, **K.on_device({"lo": d.lo, "hi": d.hi})}
    if prior is None:
        return fit_kernel(d, settings, c, curves.surface_only(init))
    main = replace(settings, prior_terms=main_kappa(settings.prior_terms),
                   prior_scalars=main_kappa(settings.prior_scalars))
    as_main = lambda rows: fit_kernel(rows, main, c, None)
    held = lambda rows, start=None: fit_kernel(rows, settings, c, start, anchored=True)
    r = rows_per_term(d, c)
    if r < WARM_ROWS_PER_TERM:
        return held(d, curves.surface_only(init))
    if r >= MAIN_ROWS_PER_TERM:
        return as_main(d)
    part, aside = set_aside(d, settings.seed)
    closer = rows_error(d, as_main(part), aside) < rows_error(d, held(part), aside)
    return as_main(d) if closer else held(d)


def kernel_work(d: KernelData) -> int:
    """Minus the work of one objective of ``d`` (rows × surface terms): sorting by it puts the
    largest fit first."""
    terms = d.feats.shape[0] if d.fac is None else d.fac.shapes.shape[1]
    return -int(d.tc.shape[0]) * int(terms)


def kernel_workers() -> int:
    """Kernel fits run side by side in threads, one per core this process may use: each L-BFGS
    is a chain of small XLA programs that keeps ≈ 1.2 of 2 cores busy, so one chain leaves a
    machine idle. Each fit computes exactly what it computes alone (same programs, same
    inputs), so the results do not depend on the count."""
    import os
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


def side_by_side(fn, items) -> list:
    """``[fn(x) for x in items]``, computed :func:`kernel_workers` at a time in threads (work that
    is largely XLA programs, compiling or running, which release the interpreter's lock)."""
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max_workers=kernel_workers()) as pool:
        return list(pool.map(fn, items))


def fitted_kernels(data: dict, settings: FitSettings, prior: dict | None = None,
                   init: dict | None = None, workers: int | None = None, first=()):
    """Fit every kernel kind/variant in ``data`` ({key: :class:`KernelData`}, a key such as
    ``"gemm/bf16"`` or a (kernel set, kernel) pair) and yield (key, raw params) as each fit
    ends. The fits are independent and run ``workers`` (default :func:`kernel_workers`) at a
    time in threads: the keys in ``first`` before the others, each group largest first. The
    order of the yields varies from run to run; what each fit gives does not.

    ``prior`` / ``init`` map keys to raw params (e.g. a reference GPU's, for a few-shot refit);
    keys they lack use :func:`default_prior` / :func:`init_op_params`.
    """
    from concurrent.futures import ThreadPoolExecutor, as_completed
    keys = sorted(data, key=lambda k: (k not in first, kernel_work(data[k]), k))
    bar = None
    if settings.progress and keys:
        from tqdm import tqdm
        bar = tqdm(total=len(keys), desc="kernels", unit="kernel", leave=False, dynamic_ncols=True)
    try:
        with ThreadPoolExecutor(max_workers=workers or kernel_workers()) as pool:
            jobs = {pool.submit(fit_one, data[k], settings, (prior or {}).get(k), (init or {}).get(k)): k
                    for k in keys}
            for job in as_completed(jobs):
                k = jobs[job]
                if bar is not None:
                    bar.set_postfix_str(" ".join(k).strip() if isinstance(k, tuple) else k)
                    bar.update(1)
                yield k, job.result()
    finally:
        if bar is not None:
            bar.close()


def fit_kernels(data: dict, settings: FitSettings, prior: dict | None = None,
                init: dict | None = None, workers: int | None = None) -> dict:
    """Stage 1: {key: raw params} of every kernel in ``data``, in key order
    (:func:`fitted_kernels`, all at once)."""
    done = dict(fitted_kernels(data, settings, prior, init, workers))
    return {k: done[k] for k in sorted(done)}


def surface_times(rows: pd.DataFrame, ops: dict, gpu: GPUSpec, ideal: IdealTimes | None = None) -> np.ndarray:
    """µs of each per-op row of a kind with measured shapes' curves predicted by its surface
    alone (what a shape no table measured gets); NaN for the other rows (:func:`predict_table`'s
    ``surface_us``, which the fit's metrics take from their own prediction). ``ideal``: the
    rows' ideal times, when already computed."""
    sel = rows["op"].isin(list(curves.AXES)).to_numpy()
    out = np.full(len(rows), np.nan)
    if sel.any():
        at = np.flatnonzero(sel)
        out[sel] = predict_table(rows[sel].reset_index(drop=True), {"ops": ops, "step": K.neutral_step_params()},
                                 gpu, surface=True, ideal=None if ideal is None else ideal.take(at))["surface_us"].to_numpy()
    return out


def add_curves(ops: dict, rows: pd.DataFrame, train: np.ndarray, gpu: GPUSpec,
               ideal: IdealTimes | None = None) -> np.ndarray:
    """Give each fitted kernel of a kind with a curve axis the curves of its measured shapes
    (:mod:`roofcal.model.curves`): the log-ratio of its training rows (``rows`` where ``train``;
    every row not held out, also those beyond the fit's row cap) to its fitted surface. In place.
    The surface prices all ``rows`` of those kinds (:func:`surface_times`), which are returned:
    a kernel set's metrics take them instead of predicting them again (:func:`predict_table`'s
    ``surfaces``); ``ideal``: the rows' ideal times, when already computed."""
    surface = surface_times(rows, ops, gpu, ideal)
    train = np.asarray(train)
    for _, op, dt, idx in groups(rows):
        key, idx = K.op_key(op, dt), idx[train[idx]]
        if op in curves.AXES and key in ops and len(idx):
            ops[key] = {**ops[key], "curves": curves.fit_curves(
                op, rows.iloc[idx], rows["latency_us"].values[idx], surface[idx])}
    return surface


# --------------------------------------------------------------------------------------------
# stage 2: steps

def _overhead_init(datasets: list, parts: list, step: dict, masks: list, target: str) -> np.ndarray:
    """Start: non-negative least squares of the relative residual (measured − kernels)/measured
    on the overhead counts, over every measurement of the target (CPU overheads only where the
    target sees them); ``parts``: each dataset's :func:`kernel_breakdown`, ``step`` the
    step level the kernels are combined at (neutral)."""
    from scipy.optimize import nnls
    from roofcal.model.combine import CPU_MASK
    rows, rhs = [], []
    for d, part, m in zip(datasets, parts, masks):
        out = combined(step, d.model, d.tp, *part)
        kern = np.asarray(out["total"]) - np.asarray(out["overhead"])
        counts = overhead_counts(d.model, d.tp, step_totals(d.batch))
        for field_name, what in STEP_TARGETS[target]:
            y = measured(d, field_name)
            ok = m & np.isfinite(y)
            seen = counts * (1.0 - CPU_MASK) if what == "gpu" else counts
            rows.append((seen / y[:, None])[ok])
            rhs.append(((y - kern) / y)[ok])
    x, _ = nnls(np.concatenate(rows), np.concatenate(rhs))
    return np.maximum(x, 1e-3)


def _gpu(name):
    from roofcal.physics.hardware import load_gpu
    return load_gpu(name)


@dataclass(frozen=True)
class HeldKernelsLoss:
    """Stage 2's loss with the kernels held (their times per step are data): the training rows'
    mean squared log-ratio of predicted to measured, plus the step level's priors, of
    ``x = {"step": raw step parameters}`` and ``data = (parts, targets, center, strength)`` —
    per deployment its :func:`~roofcal.model.combine.kernel_breakdown` and, per quantity it
    fits, (weights, measured µs). Static: each deployment's (model, TP, quantities); hashable
    and keyed by value, so Adam's program is kept in the store (:mod:`roofcal.programs`)
    instead of traced and lowered again by every fit (≈ 0.2 s)."""

    deployments: tuple

    def __call__(self, x, data):
        parts, targets, center, strength = data
        outs = [combine(x["step"], model, tp, *part)
                for (model, tp, _), part in zip(self.deployments, parts)]
        terms = ((out, what, w, y) for out, (_, _, whats), wy in zip(outs, self.deployments, targets)
                 for what, (w, y) in zip(whats, wy))
        return steps_error(terms) + prior_penalty(x["step"], center, strength)


def fit_steps(datasets: list, kernel_params: dict, settings: FitSettings, train_masks: list,
              step_prior: dict | None = None) -> dict:
    """Stage 2: step-level overheads, kernel-group scales and the prefill–decode mix (and, when
    cycle times are fitted, the CPU–GPU overlap), on ``settings.step_target``.

    Kernel corrections stay as fitted on per-op data (``settings.finetune`` = 0; their times
    are then computed once, :func:`~roofcal.model.combine.kernel_breakdown`, and Adam's program
    holds the step level alone), or move with a prior of ``finetune`` pseudo-rows holding them to
    stage 1. Scales have a prior at 1.
    """
    target = settings.step_target
    if target not in STEP_TARGETS:
        raise RoofcalError(f"step target {target!r} is not one of {', '.join(STEP_TARGETS)}")
    params = {"ops": kernel_params, "step": K.neutral_step_params()}
    terms = STEP_TARGETS[target]
    masks = [[m & np.isfinite(measured(d, f)) for f, _ in terms] for d, m in zip(datasets, train_masks)]
    if not datasets or not any(w.any() for ws in masks for w in ws):
        return params
    parts = [kernel_breakdown(params, d.model, _gpu(d.gpu), d.tp, d.batch) for d in datasets]
    o = _overhead_init(datasets, parts, params["step"], train_masks, target)
    params["step"].update(K.on_device({"overheads": np.log(o), "mix": K.softplus_inv(1e-3)}))
    if any(f == "cycle_us" for f, _ in terms):          # cycle times see the CPU–GPU overlap
        params["step"]["overlap"] = K.on_device(K.softplus_inv(1.0))
    n = float(sum(w.sum() for ws in masks for w in ws))
    center = step_prior or {k: params["step"][k] for k in ("overheads", "scales", "mix", "overlap")
                            if k in params["step"]}
    strength = K.on_device({"overheads": np.full(len(K.STEP_OVERHEADS), 1e-3 / n),
                            "scales": np.full(len(K.STEP_SCALES), settings.prior_scales / n),
                            "mix": 1e-3 / n, "overlap": 1e-3 / n})
    strength = {k: v for k, v in strength.items() if k in center}
    sets = [(d, [(what, *K.on_device((w, np.nan_to_num(measured(d, f), nan=1.0))))
                 for (f, what), w in zip(terms, ws)], _gpu(d.gpu))
            for d, ws in zip(datasets, masks)]
    if settings.finetune <= 0:          # kernels held: their times are data (HeldKernelsLoss)
        loss = HeldKernelsLoss(tuple((d.model, d.tp, tuple(what for what, *_ in ys)) for d, ys, _ in sets))
        data = (tuple(parts), tuple(tuple((w, y) for _, w, y in ys) for _, ys, _ in sets), center, strength)
        x, _ = minimize(loss, {"step": params["step"]}, data, settings.step_iters, settings.lr,
                        desc="steps", progress=settings.progress, fast_compile=True)
        return {"ops": kernel_params, "step": x["step"]}

    # kernels free, held near stage 1 by finetune pseudo-rows: the loss prices every step's
    # kernels and closes over the steps (its Adam program runs on jax.jit, not the store)
    surfaces = curves.surfaces(kernel_params)
    k_strength = jax.tree_util.tree_map(lambda x: np.full(np.shape(x), settings.finetune / n, np.float32),
                                        surfaces)
    frozen = {k: p["curves"] for k, p in kernel_params.items() if "curves" in p}   # never move
    attach = lambda ops: {k: {**p, **({"curves": frozen[k]} if k in frozen else {})} for k, p in ops.items()}

    def loss(x, data=None):
        ps = {"ops": attach(x["ops"]), "step": x["step"]}
        outs = [step_breakdown(ps, d.model, g, d.tp, d.batch) for d, _, g in sets]
        terms = ((out, what, w, y) for out, (_, ys, _) in zip(outs, sets) for what, w, y in ys)
        reg = prior_penalty(x["step"], center, strength) + prior_penalty(x["ops"], surfaces, k_strength)
        return steps_error(terms) + reg

    x, _ = minimize(loss, {"step": params["step"], "ops": surfaces}, None, settings.step_iters,
                    settings.lr, desc="steps", progress=settings.progress)
    return {"ops": attach(x["ops"]), "step": x["step"]}


# --------------------------------------------------------------------------------------------
# evaluation and the whole fit

def kernel_metrics(table: pd.DataFrame, params: dict, gpu: GPUSpec, test: np.ndarray,
                   pred: pd.DataFrame | None = None) -> dict:
    """{'train': {key: summary}, 'heldout': {key: summary}} for every kernel kind/variant
    (``pred``: :func:`predict_table` of ``table``, when already computed)."""
    pred = predict_table(table, params, gpu) if pred is None else pred
    out = {"train": {}, "heldout": {}}
    for g, op, dt, idx in groups(table):
        key = K.op_key(op, dt)
        for split, sel in (("train", ~test[idx]), ("heldout", test[idx])):
            rows = idx[sel]
            out[split][key] = error_summary(pred["predicted_us"].values[rows],
                                            pred["latency_us"].values[rows])
    return out


def step_predictions(datasets: list, params: dict) -> pd.DataFrame:
    """One row per measured step: description (with ``measured_us`` and ``cycle_us``), the
    predicted step (``predicted_us``) and its GPU side (``predicted_gpu_us``), and every
    component (µs)."""
    frames = []
    for d in datasets:
        out = combined(params["step"], d.model, d.tp,
                       *kernel_breakdown(params, d.model, _gpu(d.gpu), d.tp, d.batch))
        df = d.describe()
        df["predicted_us"] = np.asarray(out["total"], np.float64)
        df["predicted_gpu_us"] = np.asarray(predicted(out, "gpu"), np.float64)
        for k, v in out.items():
            if k not in NON_COMPONENT:
                df[f"{k}_us"] = np.asarray(v, np.float64)
        frames.append(df)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


#: metric name prefix and (measured, predicted) columns of each fitted comparison
METRIC_COLUMNS = {("measured_us", "step"): ("steps", "measured_us", "predicted_us"),
                  ("measured_us", "gpu"): ("steps", "measured_us", "predicted_gpu_us"),
                  ("cycle_us", "step"): ("cycles", "cycle_us", "predicted_us")}


def step_metrics(pred: pd.DataFrame, test: np.ndarray, target: str = "step") -> dict:
    """{'train'|'heldout': {'<steps|cycles>/<phase>': summary}} over the step predictions, for
    each comparison of ``target`` (:data:`STEP_TARGETS`): ``steps/`` = ``duration_us`` against the
    predicted step or its GPU side, ``cycles/`` = ``cycle_us`` against the predicted step."""
    out = {"train": {}, "heldout": {}}
    for term in STEP_TARGETS[target]:
        name, meas, pr = METRIC_COLUMNS[term]
        y = pred[meas].to_numpy(np.float64)
        for split, sel in (("train", ~test), ("heldout", test)):
            for phase in sorted(set(pred["phase"])):
                rows = sel & (pred["phase"].values == phase) & np.isfinite(y)
                if rows.any():
                    out[split][f"{name}/{phase}"] = error_summary(pred[pr].values[rows], y[rows])
    return out


@dataclass
class FitResult:
    coeffs: Coefficients
    kernel_test: np.ndarray
    step_test: list = field(default_factory=list)
    step_table: pd.DataFrame | None = None


def fit(gpu: GPUSpec, table: pd.DataFrame | None, steps: list, settings: FitSettings = FitSettings(),
        prior: Coefficients | None = None, provenance: list | None = None) -> FitResult:
    """Fit a coefficient set for ``gpu`` from per-op rows (``table``) and/or step datasets.

    Per-op rows are fitted per kernel set (their ``kernels`` column; see the module docstring);
    whole steps with the set ``settings.kernels`` (default the newest), which the fitted stack
    records. ``prior``: coefficients to centre the priors on (and start from), e.g. a
    bootstrapped file for a few-shot fit — per set, its set of the same name, else its active
    one; kernel kinds it lacks use the physical default prior.
    """
    import time
    clock = time.time()

    def log(msg):
        if settings.progress:
            print(f"  [{time.time() - clock:5.1f} s] {msg}", flush=True)

    table = table if table is not None else pd.DataFrame(columns=["gpu", "op", "dtype", "latency_us"])
    table = table.reset_index(drop=True)
    if "kernels" not in table:
        table["kernels"] = ""
    ideal = ideal_times(gpu, table)          # every row's ideal times, once
    labels = row_labels(table)
    test = split_rows(labels, settings.holdout, settings.seed)
    fitted = cap_rows(labels, ~test, settings.max_rows, settings.seed)
    set_rows = kernel_set_rows(table)
    sets_of_rows = table["kernels"].astype(str).to_numpy()
    # what pricing, curves and metrics read of a row: all but its file and kernel set, string
    # columns that every copy of a kernel's rows would take along (30,000 rows: 15 → 6 ms)
    priced_rows = table.drop(columns=[c for c in ("source", "kernels") if c in table])
    units = sorted(set(sets_of_rows.tolist()), key=lambda n: (n != "", kernel_set_order(n)))
    if set_rows and UNVERSIONED in set_rows:
        units = [""]

    def prior_ops(name):
        if prior is None:
            return {}
        near = nearest_kernel_set(prior.kernel_sets, name, prior.kernels) if name else prior.kernels
        ks = prior.kernel_sets.get(near) or prior.kernel_set
        return dict(ks.ops)

    def unit_data(unit):           # a unit's fitted rows, ready for the loss
        own = np.flatnonzero(fitted & (sets_of_rows == unit))
        sub = priced_rows.iloc[own].reset_index(drop=True)
        return sub, kernel_data(sub, gpu, np.zeros(len(sub), bool), settings, ideal.take(own))

    prepared = side_by_side(unit_data, units)     # their feature programs compile in parallel
    data, p0, centres = {}, {}, {}   # (unit ("" = shared), kernel key) → its rows; start; prior
    for unit, (sub, rows) in zip(units, prepared):
        ops = prior_ops(unit or (next(iter(set_rows)) if set_rows else UNVERSIONED))
        data.update({(unit, k): d for k, d in rows.items()})
        p0.update({(unit, k): v for k, v in ops.items()})
        centres.update({(unit, k): v for k, v in with_default_variants(ops, rows).items()})
        log(f"kernel set {unit or '(shared)'}: {len(sub)} of {int((sets_of_rows == unit).sum())} "
            f"per-op rows fitted in {len(rows)} kernel kinds/variants")
    data = shared_sizes(data)
    names = list(set_rows)
    have = {u: [k for (v, k) in sorted(data) if v == u] for u in units}   # unit → its kernels
    borrow = {name: _borrowable(names, name, have) for name in names}    # set → {kernel: set}
    set_names = names or (list(prior.kernel_sets) if prior is not None else [UNVERSIONED])
    step_set = settings.kernels or (prior.kernels if prior is not None and not set_rows else None) \
        or newest_kernel_set(set_names)
    if step_set not in set_names:
        raise RoofcalError(f"--kernels {step_set}: no per-op rows of that kernel set (sets: "
                           f"{', '.join(set_names)})")
    step_tests = [split_groups(d.config, settings.holdout, settings.seed + 1) for d in steps]

    def kernel_sets_of(fits, which):     # {set: KernelSet} of the fits so far
        if not set_rows:                 # whole steps only: the prior's kernel sets, unchanged
            return {n: replace(ks, ops=dict(ks.ops)) for n, ks in prior.kernel_sets.items()} \
                if prior is not None else {UNVERSIONED: KernelSet({})}
        # kinds with no rows keep the prior's (or neutral) corrections; a kernel another set
        # measured and this one did not is borrowed from it
        return {name: KernelSet({**prior_ops(name), **fits[""], **fits.get(name, {}),
                                 **{k: fits[o][k] for k, o in borrow[name].items()}},
                                borrowed=dict(borrow[name]), data=_set_files(provenance, name))
                for name in which}

    def step_fit(kernel_sets):           # stage 2, with the step set's kernels
        ops = kernel_sets[step_set].ops
        return fit_steps(steps, ops, settings, [~t for t in step_tests]) if steps else \
            {"ops": ops, "step": K.neutral_step_params()}

    # The step set's kernels (its own, the shared ones, those it borrows) are fitted first and
    # the steps as soon as they are done, beside the other sets' kernels: the same fits, sooner.
    needed = {(u, k) for (u, k) in data if u in ("", step_set)} | \
        {(o, k) for k, o in borrow.get(step_set, {}).items()} if steps and set_rows else set()
    where = _kernel_rows(table, sets_of_rows, units)
    fits, params = {u: {} for u in ["", *units]}, None        # unit → {kernel: raw params}
    in_order = lambda fits: {u: {k: fits[u][k] for k in have.get(u, []) if k in fits[u]} for u in fits}
    priced = {}        # (unit, kernel) → the surface its rows were priced by, their µs by it
    for (unit, key), p in fitted_kernels(data, settings, prior=centres, init=p0, first=needed):
        at = where[(unit, key)]
        ops = {key: op_as_read(key, p)}          # the surface as the file will hold it
        priced[(unit, key)] = (ops[key], add_curves(
            ops, priced_rows.iloc[at].reset_index(drop=True), ~test[at], gpu, ideal.take(at)))
        fits[unit][key] = ops[key]
        if params is None and needed and all(k in fits[u] for u, k in needed):
            params = step_fit(kernel_sets_of(in_order(fits), [step_set]))
    fits = in_order(fits)
    log("stage 1 (kernels) done")
    kernel_sets = kernel_sets_of(fits, names)
    if params is None:
        params = step_fit(kernel_sets)
    if steps:
        log(f"stage 2 (steps: {sum(len(d) for d in steps)} measured, kernel set {step_set}) done")
        kernel_sets[step_set].ops = params["ops"]           # moved only with finetune > 0

    notes = [] if prior is None else \
        [f"fitted with priors centred on {prior.source} (a variant it lacks: its kind's default "
         f"variant), the surfaces also held near its over the box of the rows' shapes "
         f"({ANCHOR:g} pseudo-row per term and row), started at its surfaces below "
         f"{WARM_ROWS_PER_TERM:g} training rows per term (from scratch above); from "
         f"{MAIN_ROWS_PER_TERM:g} a term, fitted as a main fit centred on it (a tenth of the "
         f"prior's weight, no anchor); between, whichever of the two predicts a fifth of the "
         f"rows set aside the closer"] + \
        [f"prior: {n}" for n in prior.notes]
    c = Coefficients(gpu.name, gpu.sha256(), params, calibrated=True, notes=notes,
                     data=provenance or [], fit=settings.record(), kernel_sets=kernel_sets,
                     kernels=step_set)
    if steps:                                  # the serving stack these steps were measured on
        step_files = [p for p in provenance or [] if str(p.get("kind", "")).startswith("steps")]
        c = add_stack(c, stack_name(step_files), Stack(
            params["step"], source={"kind": STACK_KINDS[settings.step_target],
                                    "step_target": settings.step_target, "kernels": step_set,
                                    "data": step_files}))
    elif prior is not None and prior.stacks:
        c = Coefficients(**{**c.__dict__, "stacks": dict(prior.stacks)})
        c = with_stack(c, prior.stack)
    if prior is not None:
        c.fit["prior"] = prior.source
    if steps:
        c.fit["deployments"] = [{"model": m, "tp": t} for m, t in
                                sorted({(d.model.ref, d.tp) for d in steps})]
    c = roundtrip(c)                        # metrics of exactly what the file will hold

    def set_metrics(name):                  # (metrics, bands) of a kernel set on its rows
        idx = np.flatnonzero(set_rows[name])
        sub, sub_test, ops = priced_rows.iloc[idx].reset_index(drop=True), test[idx], c.kernel_sets[name].ops
        known = np.full(len(table), np.nan)    # rows whose kernel here has the surface they were priced by
        for (unit, key), (p, times) in priced.items():
            if key in ops and curves.same_surface(ops[key], p):
                known[where[(unit, key)]] = times
        pred = predict_table(sub, {"ops": ops, "step": K.neutral_step_params()}, gpu, surface=True,
                             ideal=ideal.take(idx), surfaces=known[idx])
        return (_round_metrics(kernel_metrics(sub, {"ops": ops}, gpu, sub_test, pred)),
                op_intervals(pred, sub_test, settings, pred["surface_us"].to_numpy()))
    for name, (m, bands) in zip(set_rows, side_by_side(set_metrics, list(set_rows))):
        c.kernel_sets[name].metrics, c.kernel_sets[name].intervals = m, bands
    c = with_kernels(c, c.kernels)          # the active set's bands mirrored
    metrics = {"train": {}, "heldout": {}}
    step_table = None
    if steps:
        step_table = step_predictions(steps, c.params)
        step_test = np.concatenate(step_tests)
        metrics = step_metrics(step_table, step_test, settings.step_target)
        bands = step_bands(step_table, step_test, settings.step_target)
        if bands and c.stack in c.stacks:
            c.stacks[c.stack] = replace(c.stacks[c.stack], intervals=bands)
    c.metrics = _round_metrics(metrics)
    log("metrics done")
    return FitResult(c, test, step_tests, step_table)


def _kernel_rows(table: pd.DataFrame, sets_of_rows: np.ndarray, units: list) -> dict:
    """{(unit, kernel key): positions in ``table`` of that unit's rows of that kernel}."""
    out, keys = {}, table[["gpu", "op", "dtype"]]       # the grouping columns alone: no copy of the rest
    for unit in units:
        mine = np.flatnonzero(sets_of_rows == unit)
        for _, op, dt, idx in groups(keys.iloc[mine]):
            out[(unit, K.op_key(op, dt))] = mine[idx]
    return out


def _set_files(provenance, name: str) -> list:
    """Paths of the per-op files of kernel set ``name`` (its own and the shared ones)."""
    from roofcal.measurements.ops import kernel_set_of
    return [p["path"] for p in provenance or [] if p.get("kind") == "per-op"
            and (name == UNVERSIONED or kernel_set_of(p["path"]) in ("", name))]


def _borrowable(names: list, name: str, fits: dict) -> dict:
    """{kernel: set} a set lacks rows of and another set measured: the nearest older set's,
    else the nearest newer one's."""
    order = sorted(names, key=kernel_set_order)
    i = order.index(name)
    nearest = order[:i][::-1] + order[i + 1:]
    have = set(fits.get(name, {})) | set(fits.get("", {}))
    out = {}
    for other in nearest:
        for key in fits.get(other, {}):
            if key not in have and key not in out:
                out[key] = other
    return out


def op_intervals(pred: pd.DataFrame, test: np.ndarray, settings: FitSettings,
                 surface: np.ndarray | None = None) -> dict:
    """The ``intervals`` of a fit: conformal bands (:mod:`roofcal.calibration.conformal`) of
    measured / predicted on the held-out per-op rows (``pred``: :func:`predict_table` output),
    per kernel and regime; with ``surface`` (µs per row of ``pred``, the surfaces alone; NaN
    elsewhere) each kernel with measured shapes' curves also gets its :data:`IV.SURFACE` band."""
    at = np.flatnonzero(test)
    rows = pred.iloc[at]
    keys = (rows["op"] + "/" + rows["dtype"]).to_numpy()
    reg = IV.regime(rows["ideal_compute_us"].values, rows["ideal_memory_us"].values)
    ratios = (rows["latency_us"] / rows["predicted_us"]).to_numpy()
    bands = conformal.op_bands(keys, reg, ratios)
    if surface is not None:     # per kernel, pooled per kind as the other strata (one regime)
        alone = rows["latency_us"].to_numpy() / np.asarray(surface)[at]
        has = np.isfinite(alone)
        pooled = conformal.op_bands(keys[has], np.full(int(has.sum()), IV.ALL, object), alone[has])
        for name, strata in pooled.items():
            bands.setdefault(name, {})[IV.SURFACE] = strata[IV.ALL]
    source = {"residuals": f"held-out per-op rows of this fit ({settings.holdout:.0%} per kernel, "
                           f"seed {settings.seed}): measured / predicted",
              "method": f"split conformal, central {IV.LEVEL:.0%}, per kernel and regime "
                        f"(compute / memory by ideal time); strata under {conformal.MIN_ROWS} rows "
                        "pool per kernel, then per kind, then (communication) over the link kinds"}
    return {"ops": bands, "source": source} if bands else {}


def step_bands(step_table: pd.DataFrame, test: np.ndarray, target: str) -> dict:
    """A stack's phase bands from held-out steps: measured / predicted of the whole step — the
    cycle time when fitted on it, the step time for ``step``; none for ``gpu`` alone (no
    measurement of the whole step)."""
    terms = STEP_TARGETS[target]
    field_name = "cycle_us" if ("cycle_us", "step") in terms else \
        ("measured_us" if ("measured_us", "step") in terms else None)
    if field_name is None:
        return {}
    y = step_table[field_name].to_numpy(np.float64)
    ok = test & np.isfinite(y)
    return conformal.phase_bands(step_table["phase"].values[ok], (y / step_table["predicted_us"].to_numpy())[ok])


#: a stack's ``source.kind`` per step target (the first words name what was measured)
STACK_KINDS = {
    "step": "whole steps (GPU time per step), fitted with the kernels",
    "gpu": "whole steps (GPU forward time; CPU-side overheads not seen, left at their start), "
           "fitted with the kernels",
    "cycle": "whole steps (cycle time: start to next start), fitted with the kernels",
    "gpu+cycle": "whole steps (GPU forward time and cycle time), fitted with the kernels",
}


def stack_name(step_files: list) -> str:
    """Name of the stack fitted on whole-step files: ``splitwise`` for splitwise's CSVs (its
    2023 serving stack), else ``steps``."""
    kinds = {str(p.get("kind", "")) for p in step_files}
    return "splitwise" if kinds == {"steps (splitwise)"} else "steps"


def _round_metrics(m):
    if isinstance(m, dict):
        return {k: _round_metrics(v) for k, v in m.items()}
    return round(m, 4) if isinstance(m, float) else m

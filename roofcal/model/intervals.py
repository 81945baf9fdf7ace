"""Prediction intervals: a central 80 % band around every prediction, from held-out residuals.

A band is two quantiles of the ratio measured / predicted on rows the fit did not see
(:mod:`roofcal.calibration.conformal` computes them), so a prediction ``t`` becomes the interval
``[p10 · t, p90 · t]``. Bands are kept

* per kernel (``gemm/bf16``) and *regime* — ``compute`` when the kernel's ideal compute time is
  at least its ideal memory time, else ``memory`` — with the kernel's pooled band (``all``) and the
  kind's band pooled over variants (``gemm``) as fall-backs for strata with too few rows;
* per serving stack and step phase (``prefill``, ``decode``), from held-out whole steps, when the
  stack was fitted on measured steps.

A whole step's band is the union of (a) its stack's phase band and (b) the band its kernels
imply: every kernel component moved to its own p10 / p90 together (errors of one step's kernels
are strongly correlated: the same shapes repeat in every layer), the overheads held.
A stack without measured steps (calibrated on serving runs, or none) gets (b) only; its own
error is then not in the band, which the output says (``interval_basis``).

Everything here is NumPy on arrays of rows, outside the jitted hot path.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from roofcal.errors import RoofcalError
from roofcal.model import correction as K
from roofcal.model import curves
from roofcal.physics.components.attention import prefix_share as prefix_share_of
from roofcal.physics.components.comm import COLLECTIVES
from roofcal.physics.kernels import SHAPE_COLUMNS

#: central coverage of every band
LEVEL = 0.8
#: regimes of a kernel row, by which ideal time is larger
REGIMES = ("compute", "memory")
#: the pooled stratum of a kernel (all regimes)
ALL = "all"
#: the stratum of a kernel with measured shapes' curves (:mod:`roofcal.model.curves`) for the
#: shapes without one: its held-out rows predicted by the surface alone, the error a shape no
#: table measured has (vLLM 0.24 MoE bf16 on H100: ×0.94–1.06 with a curve, ×0.86–1.11 without)
SURFACE = "surface"
#: the band a communication kind (``link``: the all-reduce, the NCCL collectives) falls back to
#: where neither its kernel nor its kind has enough held-out rows for one: the held-out rows of
#: every link kind pooled. An all-gather, reduce-scatter or all-to-all table times 63–126 rows
#: (13–25 held out), under :data:`~roofcal.calibration.conformal.MIN_ROWS`; NCCL times all of them
#: and the NCCL all-reduce alike
LINK = "link"
#: step phases a stack band can have; a mixed step takes the union of both
PHASES = ("prefill", "decode")
#: ``interval_basis`` values: what a step band is made of (see :func:`step_interval`)
BASES = ("steps+kernels", "kernels", "kernels (partial)", "none")
#: kernel kinds with per-op measurements (bands); the rest have none
MEASURED_KINDS = frozenset(SHAPE_COLUMNS)
#: how fast a kernel's error grows outside its fitted shapes: natural-log units of the 90th
#: percentile of |log(predicted / measured)| per log2 unit of distance beyond the fitted range
#: (``ood_shape``), measured by ``python -m roofcal.bench.extrapolation`` on the bundled H100
#: rows (fit on the smaller 75 % of a size descriptor, score beyond it; 2026-11-24). All-reduce
#: has too few rows beyond its range to measure (15): it takes the largest slope measured. An
#: out-of-domain kernel's band is widened by e^(∓ slope · distance): 2× beyond the fitted size
#: (1 log2 unit) widens a GEMM band by 31 % each way.
EXTRAPOLATION = {"gemm": 0.27, "attn_prefill": 0.27, "attn_decode": 0.15, "moe": 0.24, "allreduce": 0.27, **{c: 0.27 for c in COLLECTIVES}}
#: ``interval_basis`` suffix of a band widened for extrapolation
EXTRAPOLATED = " + extrapolation"
#: measured / predicted of prefill attention over a cached prefix at its one measured limit: a
#: chunk of one new token over c cached keys per sequence is the kernel the decode tables time
#: (20,242 H100 decode rows with c ≥ 255, 1–2,048 sequences, vLLM 0.14 and 0.24 pooled, each
#: set weighted equally; ``python -m roofcal.bench.extrapolation``, 2026-12-06). The lookup at the
#: equivalent uncached chunk is right for one sequence (median 1.05 / 0.97) and charges many
#: one-token chunks too much (median 0.31 / 0.38 at 2,048 sequences): the (p10, p90) below. A step's
#: prefill-attention band is widened to them in proportion to the share of its causal pairs that
#: are against the prefix (:func:`cached_widening`): 0 without a cache, → 1 for one-token chunks.
CACHED_PREFIX = (0.44, 1.20)
#: ``interval_basis`` suffix of a band widened for a cached prefix
CACHED = " + cached prefix"


@dataclass(frozen=True)
class Band:
    """Quantiles of measured / predicted (dimensionless) on ``n`` held-out rows: ``p10`` ≤ 1 ≤
    ``p90`` is typical but not required (a biased model has both above or below 1)."""

    p10: float
    p90: float
    n: int

    def to_dict(self) -> dict:
        return {"p10": float(f"{self.p10:.6g}"), "p90": float(f"{self.p90:.6g}"), "n": int(self.n)}

    @classmethod
    def from_dict(cls, d, where: str) -> "Band":
        if not isinstance(d, dict) or set(d) != {"p10", "p90", "n"}:
            raise RoofcalError(f"{where}' must give p10, p90 and n")
        vals = []
        for name in ("p10", "p90"):
            v = d[name]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise RoofcalError(f"{where}.{name}' must be a positive ratio, got {v!r}")
            vals.append(float(v))
        if vals[0] > vals[1]:
            raise RoofcalError(f"{where}' has p10 {vals[0]} above p90 {vals[1]}")
        n = d["n"]
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise RoofcalError(f"{where}.n' must be a positive integer, got {n!r}")
        return cls(vals[0], vals[1], n)

    def union(self, other: "Band | None") -> "Band":
        """The smallest band holding both (``n`` of the wider evidence)."""
        if other is None:
            return self
        return Band(min(self.p10, other.p10), max(self.p90, other.p90), max(self.n, other.n))


def regime(tc, tm) -> np.ndarray:
    """``compute`` where the ideal compute time ``tc`` (µs) ≥ the ideal memory time ``tm`` (µs),
    else ``memory``; shape of the inputs."""
    return np.where(np.asarray(tc) >= np.asarray(tm), REGIMES[0], REGIMES[1]).astype(object)


# --------------------------------------------------------------------------------------------
# lookup

def is_link(kind: str) -> bool:
    """Whether kernels of ``kind`` are communication (their bytes cross the GPU link), whose
    rows may pool into the :data:`LINK` band."""
    return kind in K.OP_KINDS and K.OP_KINDS[kind].link


def band_chain(kind: str, variant: str, reg: str = ALL) -> tuple:
    """The (name, stratum) pairs a kernel row's band is looked up in, first found first: the
    (kernel, regime) stratum, the kernel's pooled band, the kind's, and for a link kind the
    :data:`LINK` pool."""
    key = K.op_key(kind, variant)
    link = ((LINK, ALL),) if is_link(kind) else ()
    return ((key, reg), (key, ALL), (kind, ALL)) + link


def op_band(bands: dict, kind: str, variant: str, reg: str = ALL, surface: bool = False) -> "Band | None":
    """The band of a kernel row (:func:`band_chain`), else None (no held-out evidence: no
    interval); with ``surface`` (a shape without a measured curve) the :data:`SURFACE` bands of
    the same chain first. ``bands`` maps ``kind/variant``, ``kind`` and :data:`LINK` to
    {stratum: Band}."""
    chain = band_chain(kind, variant, reg)
    first = tuple((key, SURFACE) for key, s in chain if s == ALL) if surface else ()
    for key, stratum in first + chain:
        b = bands.get(key, {}).get(stratum)
        if b is not None:
            return b
    return None


def widening(kind: str, distance) -> np.ndarray:
    """e^(slope · distance) of :data:`EXTRAPOLATION` for rows ``distance`` log2 units outside the
    fitted shapes (1 inside)."""
    return np.exp(EXTRAPOLATION.get(kind, max(EXTRAPOLATION.values())) * np.asarray(distance, np.float64))


def prefix_share(seq_len, cached) -> np.ndarray:
    """:func:`~roofcal.physics.components.attention.prefix_share` of numpy arrays."""
    n, c = np.broadcast_arrays(np.asarray(seq_len, np.float64), np.asarray(cached, np.float64))
    return np.asarray(prefix_share_of(np, n, c), np.float64)


def cached_widening(share) -> tuple[np.ndarray, np.ndarray]:
    """(p10, p90) ratio bounds of prefill attention over a cached prefix with ``share`` of its
    pairs against the prefix: :data:`CACHED_PREFIX` raised to ``share`` (1 at share 0)."""
    share = np.asarray(share, np.float64)
    return CACHED_PREFIX[0] ** share, CACHED_PREFIX[1] ** share


def op_interval(bands: dict, kind: str, variant: str, tc, tm, pred, distance=None, share=None,
                measured=None) -> tuple[np.ndarray, np.ndarray]:
    """(p10 µs, p90 µs) of per-op rows of one kernel: ``pred`` µs times the band of each row's
    regime (ideal times ``tc``, ``tm`` µs) — the :data:`SURFACE` band for rows whose shape has no
    measured curve (``measured`` False; None: every row has one or the kind has none) — widened by
    :func:`widening` for rows ``distance`` log2 units outside the fitted shapes and, for prefill
    attention, to :func:`cached_widening` of the rows' :func:`prefix_share` ``share``; NaN where
    no band exists."""
    pred = np.asarray(pred, np.float64)
    reg = regime(tc, tm)
    wide = widening(kind, 0.0 if distance is None else distance) * np.ones(pred.shape)
    c10, c90 = (np.ones(pred.shape), np.ones(pred.shape)) if share is None else \
        (x * np.ones(pred.shape) for x in cached_widening(share))
    own = np.ones(pred.shape, bool) if measured is None else np.asarray(measured, bool)
    lo, hi = np.full(pred.shape, np.nan), np.full(pred.shape, np.nan)
    for r in REGIMES:
        for is_own in (True, False):
            b = op_band(bands, kind, variant, r, surface=not is_own)
            if b is not None:
                sel = (reg == r) & (own == is_own)
                lo[sel] = pred[sel] * np.minimum(b.p10 / wide[sel], c10[sel])
                hi[sel] = pred[sel] * np.maximum(b.p90 * wide[sel], c90[sel])
    return lo, hi


def stack_band(stack_bands: dict, has_prefill, has_decode) -> tuple[np.ndarray, np.ndarray]:
    """(p10, p90) ratios per step from a stack's phase bands, by whether a step has prefill
    chunks and decodes (bool arrays (S,)); a mixed step takes the union of the prefill and decode
    bands; NaN where the stack has none for the phase."""
    pf, dc = np.asarray(has_prefill, bool), np.asarray(has_decode, bool)
    lo, hi = np.full(pf.shape, np.nan), np.full(pf.shape, np.nan)
    pb, db = stack_bands.get("prefill"), stack_bands.get("decode")
    for sel, b in ((pf & ~dc, pb), (dc & ~pf, db), (pf & dc, pb.union(db) if pb and db else None)):
        if b is not None:
            lo[sel], hi[sel] = b.p10, b.p90
    return lo, hi


def call_distance(ops: dict, call) -> np.ndarray:
    """How far a kernel call's shapes lie outside the range its parameters were fitted on (log2
    units, the largest over its descriptors; 0 without fitted parameters) — per step."""
    from roofcal.model import domain
    key, p = K.lookup(ops, call.kind, call.variant)
    if key not in ops:
        return np.zeros(())
    low, high = domain.log2_bounds(call.kind, p)
    d = [domain.excess(np.log2(1.0 + np.asarray(call.work.shape[j], np.float64))[..., None],
                       low[j:j + 1], high[j:j + 1])[..., 0] for j in domain.checked(call.kind)]
    return functools.reduce(np.maximum, d) if d else np.zeros(())     # broadcasts, no (descriptors, S) stack


def kernel_step_interval(bands: dict, calls: dict, parts: dict, total, ops: dict | None = None
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(p10 µs, p90 µs, covered, extrapolated) of whole steps from their kernels alone.

    ``calls``: the step's kernel calls (:func:`roofcal.physics.decompose.step_ops`), ``parts``:
    µs per component (the breakdown, stack scales applied), ``total``: predicted µs (S,). Each
    component with a band moves to its p10 / p90 — its kernel's :data:`SURFACE` band when ``ops``
    gives it measured shapes' curves but none for this shape, widened by :func:`widening` when its
    shapes lie outside the fitted range of ``ops`` (:func:`call_distance`); the rest of the step (overheads,
    overlap, kernels without held-out data) is held. ``covered``: fraction of the time of kernels
    that per-op data can measure (:data:`MEASURED_KINDS`; not the elementwise ones, which run at
    the roofline times the stack's scale) that had a band (1.0 = every such kernel);
    ``extrapolated``: some banded component was widened (bool); ``cached``: prefill attention
    over a cached prefix widened to :func:`cached_widening` (bool)."""
    total = np.asarray(total, np.float64)
    lo, hi = total.copy(), total.copy()
    kern, banded = np.zeros_like(total), np.zeros_like(total)
    extrapolated, cached = np.zeros(total.shape, bool), np.zeros(total.shape, bool)
    for name, call in calls.items():
        if name not in parts:
            continue
        t = np.asarray(parts[name], np.float64)
        if call.kind in MEASURED_KINDS:
            kern += t
        alone = ops is not None and call.kind in curves.AXES and not curves.measured(
            K.lookup(ops, call.kind, call.variant)[1].get("curves"), call.kind, call.work.shape)
        b = op_band(bands, call.kind, call.variant, surface=alone)
        if b is None:
            continue
        dist = call_distance(ops, call) if ops is not None else np.zeros(())
        wide = widening(call.kind, dist)
        p10, p90 = b.p10 / wide, b.p90 * wide
        extrapolated |= (dist > 0) & (t > 0)
        if call.kind == "attn_prefill":
            share = prefix_share(call.work.shape[1], call.work.shape[2])
            c10, c90 = cached_widening(share)
            cached |= (share > 0) & (t > 0)
            p10, p90 = np.minimum(p10, c10), np.maximum(p90, c90)
        banded += t
        lo += t * (p10 - 1.0)
        hi += t * (p90 - 1.0)
    covered = np.divide(banded, kern, out=np.ones_like(kern), where=kern > 0)
    return np.maximum(lo, 0.0), hi, covered, extrapolated, cached


#: every basis text, at 4 × (index in BASES) + (1 if EXTRAPOLATED) + (2 if CACHED)
_BASIS_TEXTS = tuple(b + (EXTRAPOLATED if m & 1 else "") + (CACHED if m & 2 else "") for b in BASES
                     for m in range(4))


def step_interval(bands: dict, stack_bands: dict, calls: dict, parts: dict, total, totals, ops: dict | None = None):
    """(p10 µs, p90 µs, basis) of whole steps: the union of the stack's phase band (phase from
    the :class:`~roofcal.physics.steps.StepTotals` ``totals``) and the kernels' band
    (:func:`kernel_step_interval`, widened where a kernel extrapolates beyond ``ops``' fitted
    shapes). ``basis`` per step: ``steps+kernels`` when the stack had a band for the phase,
    ``kernels`` when only kernels did (the stack's own error is not in it), ``kernels
    (partial)`` when some kernel time had no band, ``none`` when nothing had; with
    :data:`EXTRAPOLATED` appended when a kernel's band was widened beyond its fitted shapes and
    :data:`CACHED` when prefill attention over a cached prefix was."""
    total = np.asarray(total, np.float64)
    klo, khi, covered, extrapolated, cached = kernel_step_interval(bands, calls, parts, total, ops)
    slo, shi = stack_band(stack_bands, np.asarray(totals.n_prefill) > 0, np.asarray(totals.n_decode) > 0)
    has_stack = np.isfinite(slo)
    lo = np.where(has_stack, np.minimum(klo, total * np.where(has_stack, slo, 1.0)), klo)
    hi = np.where(has_stack, np.maximum(khi, total * np.where(has_stack, shi, 1.0)), khi)
    none = ~has_stack & ((klo == khi) | (covered <= 0))
    code = np.where(has_stack, 0, np.where(covered < 1.0, 2, 1))
    code[none] = 3
    marks = (extrapolated & ~none) + 2 * (cached & ~none)           # 0–3: which suffixes
    basis = np.asarray(_BASIS_TEXTS, object)[4 * code + marks]       # one lookup, no string ops per step
    lo[none], hi[none] = np.nan, np.nan
    return lo, hi, basis


# --------------------------------------------------------------------------------------------
# file form

def bands_to_dict(bands: dict) -> dict:
    """{kernel or kind: {stratum: Band}} → plain dicts, sorted."""
    return {key: {s: bands[key][s].to_dict() for s in sorted(bands[key])} for key in sorted(bands)}


def bands_from_dict(d, where: str) -> dict:
    """Inverse of :func:`bands_to_dict`, validated (``where`` names the field in errors, e.g.
    ``coeffs.yaml: field 'intervals.ops``)."""
    if not isinstance(d, dict):
        raise RoofcalError(f"{where}' must map kernels to bands")
    out = {}
    for key, strata in d.items():
        kind = str(key).split("/")[0]
        if (kind not in K.OP_KINDS and key != LINK) or str(key).count("/") > 1:
            raise RoofcalError(f"{where}.{key}' is not a kernel kind, kind/variant or '{LINK}'")
        if not isinstance(strata, dict) or not set(strata) <= {ALL, *REGIMES, SURFACE} or not strata:
            raise RoofcalError(f"{where}.{key}' must map {', '.join((ALL,) + REGIMES + (SURFACE,))} to bands")
        out[str(key)] = {s: Band.from_dict(b, f"{where}.{key}.{s}") for s, b in strata.items()}
    return out


def phase_bands_to_dict(bands: dict) -> dict:
    return {p: bands[p].to_dict() for p in PHASES if p in bands}


def phase_bands_from_dict(d, where: str) -> dict:
    if not isinstance(d, dict) or not set(d) <= set(PHASES):
        raise RoofcalError(f"{where}' must map {', '.join(PHASES)} to bands")
    return {p: Band.from_dict(b, f"{where}.{p}") for p, b in d.items()}


# --------------------------------------------------------------------------------------------
# terminal

def summary(df, unit: str = "steps") -> str:
    """One line on the intervals of a prediction table, e.g. ``80 % interval: median −7 % /
    +8 % of the prediction; 3 steps from kernels only (their serving stack's own error is not
    in the band)``; empty when ``df`` has no interval columns."""
    from roofcal.tables import count
    if "p10_us" not in df.columns:
        return ""
    pred = df["predicted_us"].to_numpy(np.float64)
    lo = df["p10_us"].to_numpy(np.float64) / pred - 1.0
    hi = df["p90_us"].to_numpy(np.float64) / pred - 1.0
    ok = np.isfinite(lo) & np.isfinite(hi)
    if not ok.any():
        return f"80 % interval: none (no held-out residuals for these {unit})"
    parts = [f"80 % interval: median {np.median(lo[ok]) * 100:+.0f} % / {np.median(hi[ok]) * 100:+.0f} % "
             "of the prediction"]
    if (~ok).any():
        parts.append(f"{count((~ok).sum(), unit)} without one (no held-out data for their kernels)")
    if "interval_basis" in df.columns:
        basis = df["interval_basis"].astype(str).to_numpy()
        plain = np.char.replace(np.char.replace(basis.astype(str), CACHED, ""), EXTRAPOLATED, "")
        k = np.isin(plain, ("kernels", "kernels (partial)")).sum()
        if k:
            parts.append(f"{count(k, unit)} from kernels only (their serving stack has no held-out "
                         "steps, so its own error is not in the band)")
        x = (np.char.find(basis.astype(str), EXTRAPOLATED) >= 0).sum()
        if x:
            parts.append(f"{count(x, unit)} widened for kernels outside their fitted shapes (ood_shape; "
                         "roofcal.model.intervals.EXTRAPOLATION)")
        c = np.char.endswith(basis.astype(str), CACHED).sum()
        if c:
            parts.append(f"{count(c, unit)} widened for prefill attention over a cached prefix (its "
                         "measured error, roofcal.model.intervals.CACHED_PREFIX)")
    elif "ood_shape" in df.columns:
        x = (df["ood_shape"].to_numpy(np.float64) > 0).sum()
        if x:
            parts.append(f"{count(x, unit)} widened for shapes outside the fitted range (ood_shape)")
    return "; ".join(parts)

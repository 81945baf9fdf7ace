"""Split-conformal prediction bands from held-out residuals (see :mod:`roofcal.model.intervals`).

For ``n`` held-out ratios ρ = measured / predicted of a stratum, sorted ρ₍₁₎ ≤ … ≤ ρ₍ₙ₎, the
central band at level 1 − α is [ρ₍ₗ₎, ρ₍ₕ₎] with l = ⌊(n + 1)·α/2⌋ and h = ⌈(n + 1)·(1 − α/2)⌉:
a new row exchangeable with the held-out ones falls below ρ₍ₗ₎ with probability ≤ α/2 and above
ρ₍ₕ₎ with probability ≤ α/2 (Vovk et al.; Lei et al. 2018, "Distribution-free predictive
inference for regression"), whatever the distribution of the errors. This needs n ≥ 2/α − 1
rows (9 at 80 %); strata with fewer than :data:`MIN_ROWS` fall back to a pooled band.

:func:`loo_coverage` measures how often rows land in bands calibrated without them
(leave-one-out over the held-out rows), which is what ``roofcal bench`` reports.
"""

from __future__ import annotations

import math

import numpy as np

from roofcal.model.intervals import ALL, LEVEL, LINK, PHASES, REGIMES, Band, band_chain, is_link

#: fewest held-out rows a stratum needs for a band of its own (else it pools). The band's
#: expected coverage is (h − l)/(n + 1) ≥ 80 %, coarse for small n: 84.6 % at n = 25 (ranks
#: 2 and 24), 80.6 % at n = 30 (3 and 28), so from 30 rows it stays within 80 % ± 3.
MIN_ROWS = 30


def ranks(n: int, level: float = LEVEL) -> tuple[int, int]:
    """(l, h): 1-based order statistics of the central ``level`` band from ``n`` calibration
    values (h may exceed n, l may be 0 when n is too small: no finite band)."""
    a = (1.0 - level) / 2.0
    return int(math.floor((n + 1) * a + 1e-9)), int(math.ceil((n + 1) * (1.0 - a) - 1e-9))


def band(ratios, level: float = LEVEL) -> Band | None:
    """The conformal band of measured / predicted ``ratios`` (1-D), or None when there are too
    few for a finite band."""
    r = np.sort(np.asarray(ratios, np.float64))
    r = r[np.isfinite(r) & (r > 0)]
    lo, hi = ranks(len(r), level)
    if lo < 1 or hi > len(r):
        return None
    return Band(float(r[lo - 1]), float(r[hi - 1]), len(r))


def op_bands(keys, regimes, ratios, level: float = LEVEL, min_rows: int = MIN_ROWS) -> dict:
    """{kernel or kind: {stratum: Band}} from held-out per-op rows.

    ``keys``: ``kind/variant`` per row, ``regimes``: ``compute``/``memory`` per row, ``ratios``:
    measured / predicted. Every kernel pool and (kernel, regime) with ≥ ``min_rows`` rows gets a
    band (a regime only when the kernel has rows of both); a kind gets a pooled band when one of
    its kernels lacks one; and the link kinds' rows pooled give the :data:`LINK` band when a link
    kernel has neither (the NCCL collectives' 13–25 held-out rows each)."""
    keys, regimes = np.asarray(keys, object), np.asarray(regimes, object)
    ratios = np.asarray(ratios, np.float64)
    out: dict = {}

    def put(name, stratum, sel):
        if sel.sum() >= min_rows:
            b = band(ratios[sel], level)
            if b is not None:
                out.setdefault(name, {})[stratum] = b

    for key in sorted(set(keys.tolist())):
        in_key = keys == key
        put(key, ALL, in_key)
        for r in REGIMES:
            sel = in_key & (regimes == r)
            if sel.sum() < in_key.sum():        # one regime only: its band is the pooled one
                put(key, r, sel)
    kinds = np.array([k.split("/")[0] for k in keys], object)
    for kind in sorted(set(kinds.tolist())):
        if any(k not in out for k in set(keys[kinds == kind].tolist())):
            put(kind, ALL, kinds == kind)
    link = np.isin(kinds, [k for k in set(kinds.tolist()) if is_link(k)])
    if any(k not in out and k.split("/")[0] not in out for k in set(keys[link].tolist())):
        put(LINK, ALL, link)
    return out


def phase_bands(phases, ratios, level: float = LEVEL, min_rows: int = MIN_ROWS) -> dict:
    """{phase: Band} of held-out whole steps (``prefill``/``decode``; other phases ignored)."""
    phases, ratios = np.asarray(phases, object), np.asarray(ratios, np.float64)
    out = {}
    for p in PHASES:
        sel = phases == p
        if sel.sum() >= min_rows:
            b = band(ratios[sel], level)
            if b is not None:
                out[p] = b
    return out


def stratum_of(bands: dict, keys, regimes) -> np.ndarray:
    """Per row, the (name, stratum) whose band :func:`roofcal.model.intervals.op_band` uses, as
    ``name|stratum`` strings ("" when none)."""
    out = []
    for key, reg in zip(np.asarray(keys, object), np.asarray(regimes, object)):
        hit = ""
        for name, s in band_chain(*key.split("/", 1), reg):
            if s in bands.get(name, {}):
                hit = f"{name}|{s}"
                break
        out.append(hit)
    return np.asarray(out, object)


def loo_bands(ratios, level: float = LEVEL) -> tuple[np.ndarray, np.ndarray]:
    """Per value, the (p10, p90) band calibrated on all the *other* values (leave-one-out);
    NaN when n − 1 values are too few. Vectorised: removing a value shifts an order statistic
    by one place only if the value sat at or below it."""
    r = np.asarray(ratios, np.float64)
    n = len(r)
    lo_k, hi_k = ranks(n - 1, level)
    if n < 2 or lo_k < 1 or hi_k > n - 1:
        return np.full(n, np.nan), np.full(n, np.nan)
    order = np.argsort(r, kind="stable")
    s = r[order]
    pos = np.empty(n, int)
    pos[order] = np.arange(n)
    # k-th smallest of the others: s[k-1] if this value sits after position k-1, else s[k]
    lo = np.where(pos > lo_k - 1, s[lo_k - 1], s[lo_k])
    hi = np.where(pos > hi_k - 1, s[hi_k - 1], s[min(hi_k, n - 1)])
    return lo, hi


def loo_coverage(groups, ratios, level: float = LEVEL) -> tuple[np.ndarray, np.ndarray]:
    """Per row, its leave-one-out band within its group (``groups``: a label per row, e.g. from
    :func:`stratum_of`), as (p10, p90) ratios; rows whose group is "" get NaN."""
    groups, ratios = np.asarray(groups, object), np.asarray(ratios, np.float64)
    lo, hi = np.full(len(ratios), np.nan), np.full(len(ratios), np.nan)
    for g in sorted(set(groups.tolist()) - {""}):
        idx = np.flatnonzero(groups == g)
        lo[idx], hi[idx] = loo_bands(ratios[idx], level)
    return lo, hi


def widen(bands: dict, transfer: dict) -> dict:
    """Bands of a zero-shot GPU: every kind gets its measured transfer band (``transfer``:
    {kind: Band}), and each kernel with a band of its own the union of the two; kinds with no
    measured transfer take the widest measured one. Regime strata are dropped (the transfer
    error is measured per kind)."""
    if not transfer:
        return dict(bands)
    widest = max(transfer.values(), key=lambda b: math.log(b.p90 / b.p10))
    out = {kind: {ALL: b} for kind, b in transfer.items()}
    for name, strata in bands.items():
        t = transfer.get(name.split("/")[0], widest)
        own = strata.get(ALL) or next(iter(strata.values()))
        out[name] = {ALL: t.union(own)}
    return out

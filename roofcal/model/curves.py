"""Measured-shape curves: what one smooth surface cannot know about each measured kernel shape.

A kernel library tunes shapes one by one. vLLM's fused MoE reads a Triton configuration per expert
count, width and GPU (``fused_moe/configs/E=…,N=…,device_name=….json``, or a default where none is
shipped); its custom all-reduce switches kernels by size and GPU count; cuBLAS and vLLM's CUTLASS
dispatch pick a GEMM kernel and tile per (m, n, k). So a measured shape sits off the surface fitted
across all shapes by 5–20 %, with a sign that changes from one shape to the next (Mixtral's expert
shape: +33 % at TP 1, −12 % at TP 2, +12 % at TP 4 in vLLM 0.14's FP8 table), which no polynomial
in the shape descriptors follows. Along a shape's own token axis, though, the measurements are
partly smooth: interpolating a held-out row between its measured neighbours is 3–5 % off where
the surface is 6–9 % (docs/limits.md).

So for the kinds in :data:`AXES` the fit keeps, for every measured **shape** (all descriptors but
the axis: :data:`KEYS`), the log-ratio ``r = ln(measured / surface)`` of its training rows at each
axis value. A call of exactly that shape is multiplied by ``exp(λ · r(x))``, with ``r``
interpolated linearly in ``log2(1 + x)`` between the measured points and held at the end values
beyond them; a call of any other shape gets factor 1 (the surface alone).

``λ`` in [0, 1] (:func:`shrinkage`) is how far a kernel's curves are trusted between their points:
where neighbouring axis values run different kernels (a GEMM's m crossing a cuBLAS heuristic's
boundary), the neighbours' residual is partly noise for the point between them. It is chosen per
kernel from its training rows alone: each training row is priced by the other rows of its shape,
as a held-out row would be (leave one out: its repeats at the same axis value, else its
neighbours'), and λ minimises the mean relative error of those prices on a grid of 0.05 steps.
A row alone at its axis value and more than 2× off the line through its neighbours is a
measurement artifact, not a kernel's tuning, and is left out of its curve (:func:`artifacts`).

Attention has two axes: a shape (heads, KV heads, head size) is measured at batch sizes an octave
apart, each along its sequence / context length. A curve is kept per measured batch size; each is
blended with its neighbours' (triangular weights in log2(1 + sequences), 1.5 wide:
:data:`ACROSS_WIDTH`, :func:`blend_weights`; its own weighs 1, an octave away 1/3), and a call
between two measured batch sizes is priced linearly in log2(1 + sequences) between their blended
curves (:func:`groups`). So a step's time is continuous in its number of sequences (a curve of the
measured batch size alone would jump between 32 and 33 sequences), and a measured point is
smoothed with its neighbouring batch sizes. λ is chosen on the training rows priced as a call
would be (:func:`leave_one_out_across`). Held-out H100 (seed 0),
surface alone → blended curves: vLLM 0.24 prefill bf16 / fp8-KV 5.68 / 6.34 → 4.41 / 4.48 %,
decode 4.77 / 4.12 → 3.80 / 3.00 %; vLLM 0.14 prefill 6.41 / 6.92 → 5.34 / 5.46 %, decode
4.95 / 4.25 → 3.84 / 3.44 %; A100 decode 7.09 → 4.66 %, prefill 4.70 → 3.26 %. A chunk over a
cached prefix, which no table measured, is looked up at its uncached chunk of the same work, as
its surface is.

The curves are data, not physics: they never move the surface. A datasheet transfer to another
GPU carries them with the surface they are relative to (:mod:`roofcal.transfer.bootstrap`;
measured on the zero-shot MoE tables they help a little: H100 → A100 21.0 → 20.0 %, A100 → H100
26.2 → 25.6 % mean error).

A curve set is a :class:`Curves`, ``{shape key: (at, rs)}`` with its ``shrink`` λ: ``at`` the
measured axis values, ascending, and ``rs`` their log-ratios (float64 arrays); a shape key is the
tuple of :data:`KEYS` values rounded by :func:`shape_key`. Inside jitted code it is a constant, not
a traced input (thousands of small arrays would cost every call more than the step itself).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from roofcal.errors import RoofcalError
from roofcal.grouping import members, unique_rows
from roofcal.model.correction import OP_KINDS
from roofcal.physics.components.comm import COLLECTIVES
from roofcal.physics.components.attention import equivalent_chunk, prefix_share

#: kernel kind → the descriptor its curves run along
AXES = {"moe": "tokens", "allreduce": "bytes", "gemm": "m", "attn_prefill": "seq_len",
        "attn_decode": "context", **{c: "bytes" for c in COLLECTIVES}}
#: kernel kind → the descriptors that name a measured shape (the others are the axis, or are
#: derived from it: the all-reduce's size regimes; a prefill chunk's cached prefix, which the
#: tables never hold, is priced at the uncached chunk of the same work: ``equivalent_chunk``)
KEYS = {"moe": ("hidden", "inter", "topk", "experts", "tp", "ep", "skew"), "allreduce": ("num_gpus",),
        "gemm": ("n", "k"), "attn_prefill": ("heads", "kv_heads", "head_dim", "seqs"),
        "attn_decode": ("heads", "kv_heads", "head_dim", "seqs"),
        **{c: ("num_gpus",) for c in COLLECTIVES}}
#: kernel kind → its last key, across whose measured values the curves are blended (:func:`groups`)
ACROSS = {"attn_prefill": "seqs", "attn_decode": "seqs"}
#: half-width of the blend's triangular weights in log2(1 + x) (≈ octaves; the tables measure
#: batch sizes an octave apart, so a point's two neighbours weigh 1/3 of its own)
ACROSS_WIDTH = 1.5
#: the per-op table's column of a descriptor, where the names differ
COLUMNS = {"seqs": "batch", "seq_len": "seq"}
#: a row this many times off the line through its shape's neighbours is an artifact (:func:`artifacts`)
ARTIFACT_RATIO = 2.0
#: the values :func:`shrinkage` chooses λ from
SHRINK_GRID = tuple(round(0.05 * i, 2) for i in range(21))


class Curves(Mapping):
    """The curves of one kernel kind/variant, read-only: {shape key: (at, rs)} in key order, and
    ``shrink``, the λ in [0, 1] their log-ratios are scaled by (module docstring).

    A static pytree node (no leaves): jitted functions take it as part of their program, compared
    by content (a digest of λ, keys and values), so equal curves share one compiled program."""

    def __init__(self, curves: dict, shrink: float = 1.0):
        self._c = {k: (np.asarray(a, np.float64), np.asarray(r, np.float64))
                   for k, (a, r) in sorted(curves.items())}
        self.shrink = float(shrink)
        h = hashlib.sha256(repr(self.shrink).encode())
        for k, (a, r) in self._c.items():
            h.update(repr(k).encode() + a.tobytes() + r.tobytes())
        self._digest = h.hexdigest()
        self._groups = None                              # :func:`groups`, built on first use

    def __getitem__(self, key):
        return self._c[key]

    def __iter__(self):
        return iter(self._c)

    def __len__(self):
        return len(self._c)

    @property
    def digest(self) -> str:
        """The SHA-256 of λ, keys and values: what equal curves share (and a stored program's key)."""
        return self._digest

    def __hash__(self):
        return hash(self._digest)

    def __eq__(self, other):
        return isinstance(other, Curves) and other._digest == self._digest

    def __deepcopy__(self, memo):
        return self                                      # read-only: a copy may share it


jax.tree_util.register_pytree_node(Curves, lambda c: ((), c), lambda c, _: c)


def shrink_of(curves) -> float:
    """The λ of a curve set (1.0 for a plain mapping, as hand-built in tests)."""
    return float(getattr(curves, "shrink", 1.0))


def surface_only(p: dict | None) -> dict | None:
    """An op's raw parameters without its measured shapes' curves: its surface alone (what the
    optimiser moves, and what a shape no table measured gets)."""
    return None if p is None else {k: v for k, v in p.items() if k != "curves"}


def same_surface(p: dict, q: dict) -> bool:
    """Whether two ops' raw parameters hold the same surface, bit for bit (their curves aside):
    then every shape's time by the surface alone is the same."""
    a, b = surface_only(p), surface_only(q)
    return a.keys() == b.keys() and all(np.array_equal(np.asarray(a[k]), np.asarray(b[k])) for k in a)


def surfaces(ops: dict) -> dict:
    """{kernel: :func:`surface_only` parameters} of an ``ops`` mapping."""
    return {k: surface_only(p) for k, p in ops.items()}


def shape_key(values) -> tuple:
    """A measured shape's key: its :data:`KEYS` values as floats rounded to 6 decimals (so a
    step's ``4096`` and a table's ``4096.0`` meet)."""
    return tuple(round(float(v), 6) for v in values)


def _positions(kind: str) -> tuple[int, list[int]]:
    names = OP_KINDS[kind].descriptors
    return names.index(AXES[kind]), [names.index(n) for n in KEYS[kind]]


def _values(rows, name: str) -> np.ndarray:
    """A descriptor's values in a per-op table (a missing column is 0): its column
    (:data:`COLUMNS`), and for a prefill chunk's ``seq_len`` the uncached chunk of the same work
    when the table gives a cached prefix."""
    col = COLUMNS.get(name, name)
    x = np.asarray(rows[col], np.float64) if col in rows else np.zeros(len(rows))
    if name == "seq_len" and "cached" in rows:
        x = equivalent_chunk(np, x, np.nan_to_num(np.asarray(rows["cached"], np.float64)))
    return x


def _keys_and_axis(kind: str, rows) -> tuple[np.ndarray, np.ndarray]:
    """(shape descriptors (rows × keys), axis values) of a per-op table's rows."""
    keys = np.stack([_values(rows, k) for k in KEYS[kind]], 1)
    return keys, _values(rows, AXES[kind])


def log_axis(x):
    """The curves' interpolation coordinate, log2(1 + x)."""
    return np.log2(1.0 + np.asarray(x, np.float64))


def fit_curves(kind: str, rows, measured, surface) -> Curves:
    """Curves of one kernel kind/variant from its training rows.

    ``rows``: a per-op table (DataFrame) with columns named as the descriptors (a missing
    ``skew`` is 0); ``measured``, ``surface``: µs per row (the surface's prediction without
    curves). Rows of one shape at the same axis value are averaged in log, after leaving out
    :func:`artifacts`; λ by :func:`shrinkage`. Returns a :class:`Curves` (module docstring),
    empty for a kind without an axis.
    """
    if kind not in AXES:
        return Curves({})
    y, s = np.asarray(measured, np.float64), np.asarray(surface, np.float64)
    keys, x = _keys_and_axis(kind, rows)
    ok = np.isfinite(y) & np.isfinite(s) & (y > 0) & (s > 0)
    r = np.log(np.where(ok, y, 1.0) / np.where(ok, s, 1.0))
    good = np.flatnonzero(ok)
    uniq, inv = unique_rows(np.round(keys[good], 6))
    kept = ~artifacts(x[good], r[good], inv)      # an artifact is interior: no shape loses all rows
    good, inv = good[kept], inv[kept]
    # every (shape, axis value) point at once, in order (shapes ascending, then their values)
    points, point = unique_rows(np.stack([inv, x[good]], 1))
    mean = stored(np.bincount(point, weights=r[good]) / np.bincount(point))
    cut = np.searchsorted(points[:, 0], np.arange(len(uniq) + 1))
    out = {shape_key(key): (points[a:b, 1].copy(), mean[a:b])
           for key, a, b in zip(uniq, cut[:-1], cut[1:])}
    if kind in ACROSS:
        group = unique_rows(uniq[:, :-1])[1][inv]
        return Curves(out, shrinkage(*leave_one_out_across(x[good], r[good], inv, group,
                                                           keys[good, -1])))
    return Curves(out, shrinkage(*leave_one_out(x[good], r[good], inv)))


def _neighbour_prices(x, r, shape) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row: its price from the other rows of its shape (module docstring), whether it has one
    from repeats at its axis value, and whether it has one from the line between its neighbours."""
    x, r = np.asarray(x, np.float64), np.asarray(r, np.float64)
    # the (shape, axis value) points in lexicographic order; each row's point g
    points, g = unique_rows(np.stack([np.asarray(shape, np.float64), x], 1))
    total, count = np.bincount(g, weights=r), np.bincount(g)
    mean, lx, same = total / count, log_axis(points[:, 1]), points[:, 0]
    n = len(points)
    lo, hi = np.maximum(g - 1, 0), np.minimum(g + 1, n - 1)
    interior = (g > 0) & (g < n - 1) & (same[lo] == same[g]) & (same[hi] == same[g])
    line = mean[lo] + (mean[hi] - mean[lo]) * (lx[g] - lx[lo]) / np.where(interior, lx[hi] - lx[lo], 1.0)
    repeat = count[g] > 1
    return np.where(repeat, (total[g] - r) / np.maximum(count[g] - 1, 1), line), repeat, interior & ~repeat


def leave_one_out(x, r, shape) -> tuple[np.ndarray, np.ndarray]:
    """(log-ratio, its prediction from the other rows of its shape) of training rows, as a held-out
    row is priced: the mean of its repeats at the same axis value where there are any, else the
    line in log2(1 + axis) between the means at the neighbouring axis values. A row alone at its
    shape's first or last axis value has no such prediction and is left out.

    ``x``: axis values, ``r``: log-ratios, ``shape``: an integer label of each row's shape."""
    r = np.asarray(r, np.float64)
    if not len(r):
        return np.zeros(0), np.zeros(0)
    got, repeat, line = _neighbour_prices(x, r, shape)
    keep = repeat | line
    return r[keep], got[keep]


def blend_weights(xp, across, at):
    """Weights (len(at), *across.shape) of a shape's curves at its measured values ``at`` of the
    :data:`ACROSS` descriptor for values ``across`` (both log2(1 + x), ``at`` ascending; ``across``
    held at the ends): wᵢ = max(0, 1 − |across − atᵢ| / w), w = :data:`ACROSS_WIDTH` or the widest
    gap between measured values. At a measured value its own curve weighs 1 and those an octave
    away 1/3."""
    at = np.asarray(at, np.float64)
    width = max(ACROSS_WIDTH, float(np.max(np.diff(at))) if len(at) > 1 else 0.0)
    a = xp.asarray(xp.clip(across, at[0], at[-1]))
    return xp.maximum(0.0, 1.0 - xp.abs(a[None] - at.reshape((-1,) + (1,) * a.ndim).astype(a.dtype))
                      / width)


def leave_one_out_across(x, r, shape, group, across) -> tuple[np.ndarray, np.ndarray]:
    """:func:`leave_one_out` of a kind with an :data:`ACROSS` descriptor: each training row priced
    as a call at its measured value is (:func:`groups`), by the blend of its group's curves (the
    shapes that differ in that descriptor alone) with its own curve's value replaced by its price
    from the other rows of its shape — or, where it has none, its own curve left out of the
    blend. A row with no price either way is left out. ``shape``, ``group``: integer labels per
    row; ``across``: the descriptor's values."""
    x, r = np.asarray(x, np.float64), np.asarray(r, np.float64)
    own, repeat, line = _neighbour_prices(x, r, shape)
    has_own = repeat | line
    lx, la = log_axis(x), log_axis(across)
    got = np.full(len(r), np.nan)
    for idx in members(group):                        # per group and measured value, not per row
        if not len(idx):
            continue
        at = np.unique(la[idx])
        weights = blend_weights(np, la[idx], at)
        num, den = np.zeros(len(idx)), np.zeros(len(idx))
        for a, w in zip(at, weights):
            mine = la[idx] == a
            j = idx[mine]
            pts, pos = np.unique(x[j], return_inverse=True)
            pos = pos.reshape(-1)
            v = np.where(mine, own[idx], np.interp(lx[idx], log_axis(pts),
                                                   np.bincount(pos, weights=r[j]) / np.bincount(pos)))
            w = w * ~(mine & ~has_own[idx])
            num, den = num + w * v, den + w
        got[idx] = np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)
    keep = np.isfinite(got)
    return r[keep], got[keep]


def artifacts(x, r, shape) -> np.ndarray:
    """Rows that are measurement artifacts: alone at their axis value, between two measured
    neighbours of their shape, and more than :data:`ARTIFACT_RATIO` × off the line through them
    (in time). A kernel's time does not jump 2× and back between neighbouring sizes; vLLM 0.14's
    H100 bf16 GEMM table has 40 such rows among its 7,392 training rows (2560 × 8192 at
    m = 4,096: 753 µs, where m = 2,048 takes 103 µs and m = 8,192 takes 421 µs)."""
    r = np.asarray(r, np.float64)
    if not len(r):
        return np.zeros(0, bool)
    got, _, line = _neighbour_prices(x, r, shape)
    return line & (np.abs(r - got) > math.log(ARTIFACT_RATIO))


def shrinkage(want, got) -> float:
    """λ of :data:`SHRINK_GRID` minimising mean |exp(r − λ·r̂) − 1| over the training rows'
    leave-one-out predictions r̂ (:func:`leave_one_out`): the relative error of a row's time when
    the other rows of its shape price it. 1.0 when no row has a prediction; the smaller λ on a
    tie."""
    want, got = np.asarray(want, np.float64), np.asarray(got, np.float64)
    if not len(want):
        return 1.0
    errs = [float(np.mean(np.abs(np.expm1(want - lam * got)))) for lam in SHRINK_GRID]
    return float(SHRINK_GRID[int(np.argmin(errs))])


def groups(curves) -> dict:
    """{key without its :data:`ACROSS` value: (log2(1 + its measured values), ascending; the union
    of their curves' axis values in log2(1 + x); the blended log-ratios on that grid, (values ×
    union))} of a curve set whose keys end in such a value (cached on a :class:`Curves`). A
    single measured value or axis value is doubled one unit on, so every grid has two cells'
    corners and a call beyond it is held.

    Blended: each measured value's curve averaged with its neighbours' by :func:`blend_weights`.
    On the union grid each curve is exact (its own points are among it; between them and beyond
    its ends it is linear and held, as :func:`factor` has it), so a call interpolates the grid
    bilinearly: one search per axis, four look-ups."""
    cached = getattr(curves, "_groups", None)
    if cached is not None:
        return cached
    out: dict = {}
    for key in sorted(curves):
        out.setdefault(key[:-1], ([], []))
        out[key[:-1]][0].append(float(log_axis(key[-1])))
        out[key[:-1]][1].append(curves[key])
    for k, (at, per) in out.items():
        at = np.array(at)
        union = log_axis(np.unique(np.concatenate([c[0] for c in per])))
        raw = np.stack([np.interp(union, log_axis(c[0]), np.asarray(c[1], np.float64)) for c in per])
        w = blend_weights(np, at, at)                   # (values × values), symmetric
        table = (w @ raw) / w.sum(1, keepdims=True)
        if len(at) == 1:
            at, table = np.array([at[0], at[0] + 1.0]), np.concatenate([table, table])
        if len(union) == 1:
            union, table = np.array([union[0], union[0] + 1.0]), np.concatenate([table, table], 1)
        out[k] = (at, union, table)
    if isinstance(curves, Curves):
        curves._groups = out
    return out


def _curve_of(curves, kind: str, shape):
    """The curve of a call's shape (its own descriptors Python numbers) — for a kind with an
    :data:`ACROSS` descriptor, the curves of its group (:func:`groups`) — else None."""
    if not curves or kind not in AXES:
        return None
    _, pos = _positions(kind)
    if kind in ACROSS:
        pos = pos[:-1]
    vals = [shape[j] for j in pos]
    if not all(isinstance(v, (int, float, np.integer, np.floating)) for v in vals):
        return None
    return (groups(curves) if kind in ACROSS else curves).get(shape_key(vals))


def measured(curves, kind: str, shape) -> bool:
    """Whether a kernel call's shape has a curve: its time rests on its own measurements, and its
    band is the kernel's (else, for a kind with curves, the surface's: :mod:`.intervals`)."""
    return _curve_of(curves, kind, shape) is not None


def _cell(xp, grid, x, dt):
    """(index, fraction) of values ``x`` in an ascending ``grid`` (≥ 2 points), held at its ends."""
    g = xp.asarray(grid, dt)
    i = xp.clip(xp.searchsorted(g, x, side="right") - 1, 0, len(grid) - 2)
    return i, xp.clip((x - g[i]) / (g[i + 1] - g[i]), 0.0, 1.0)


def _log_ratio(xp, curve, kind: str, axis, across):
    """The curve's log-ratio at the axis values — for an :data:`ACROSS` kind, of its group's
    blended curves (:func:`groups`), linear in log2(1 + x) of that descriptor between its measured
    values — in ``xp`` (numpy or jax.numpy)."""
    dt = np.float64 if xp is np else jnp.float32
    x = xp.log2(1.0 + xp.asarray(axis, dt))
    if kind not in ACROSS:
        at, rs = curve
        return xp.interp(x, xp.asarray(log_axis(at), dt), xp.asarray(rs, dt))
    at, union, table = curve
    x, a = xp.broadcast_arrays(x, xp.log2(1.0 + xp.asarray(across, dt)))
    ib, tb = _cell(xp, at, a, dt)
    ix, tx = _cell(xp, union, x, dt)
    flat, n = xp.asarray(table.ravel(), dt), len(union)
    lo = flat[ib * n + ix] * (1.0 - tx) + flat[ib * n + ix + 1] * tx
    hi = flat[(ib + 1) * n + ix] * (1.0 - tx) + flat[(ib + 1) * n + ix + 1] * tx
    return lo * (1.0 - tb) + hi * tb


def uncached(xp, seq_len, cached):
    """How far a prefill chunk's curve counts: 1 − the share of its pairs against a
    cached prefix (:func:`~roofcal.physics.components.attention.prefix_share`) — the tables time
    uncached chunks, and one new token over a long prefix is the decode kernel's work, not the
    measured short chunk's that its surface lookup shares (decode rows priced as one token over
    their context: mean error 11.9 / 12.1 % with the surface alone, 13.3 / 13.0 % with the whole
    curve, vLLM 0.14 / 0.24). Other kinds' curves count fully."""
    return 1.0 - prefix_share(xp, seq_len, cached)


def factor(curves, kind: str, shape):
    """Multiplier of a kernel call's corrected time from its shape's curve (1.0 without one).

    ``shape``: the call's descriptor values (:class:`~roofcal.physics.components.Work` ``.shape``)
    — the shape's own descriptors as Python numbers (as inside a model's step), the axis (and an
    :data:`ACROSS` descriptor) a number or an array. A shape given as arrays (per-op tables) is
    looked up row by row with :func:`row_factors` instead.
    """
    curve = _curve_of(curves, kind, shape)
    if curve is None:
        return 1.0
    names = OP_KINDS[kind].descriptors             # the curve: constants of the program (:class:`Curves`)
    across = shape[names.index(ACROSS[kind])] if kind in ACROSS else None
    trust = uncached(jnp, *(shape[names.index(n)] for n in ("seq_len", "cached"))) \
        if kind == "attn_prefill" else 1.0
    r = _log_ratio(jnp, curve, kind, shape[_positions(kind)[0]], across)
    return jnp.exp(shrink_of(curves) * trust * r)


def row_factors(curves, kind: str, rows) -> tuple[np.ndarray, np.ndarray]:
    """(:func:`factor`, :func:`measured`) of every row of a per-op table ``rows`` (a DataFrame
    whose columns are named as the descriptors or as in :data:`COLUMNS`; a missing ``skew`` is
    0)."""
    out, found = np.ones(len(rows)), np.zeros(len(rows), bool)
    if not curves or kind not in AXES:
        return out, found
    keys, x = _keys_and_axis(kind, rows)
    trust = uncached(np, x, _values(rows, "cached")) if kind == "attn_prefill" else \
        np.ones(len(rows))
    lookup = curves
    if kind in ACROSS:
        keys, across, lookup = keys[:, :-1], keys[:, -1], groups(curves)
    uniq, inv = unique_rows(np.round(keys, 6))
    for key, sel in zip(uniq, members(inv, len(uniq))):
        curve = lookup.get(shape_key(key))
        if curve is not None:
            found[sel] = True
            out[sel] = np.exp(shrink_of(curves) * trust[sel] * _log_ratio(
                np, curve, kind, x[sel], across[sel] if kind in ACROSS else None))
    return out, found


# --------------------------------------------------------------------------------------------
# in a coefficient file: an op's ``measured_shapes`` block

#: decimals of a stored log-ratio (0.01 % of the time)
RATIO_DECIMALS = 4


def stored(log_ratios) -> np.ndarray:
    """Log-ratios at a file's precision (:data:`RATIO_DECIMALS`), as :func:`to_dict` writes them
    and :func:`from_dict` reads them back: fitted curves are the file's curves, so the steps are
    fitted with what the file will hold (and a fit's programs that hold the curves are the ones
    its file's predictions use). Python's ``round`` (correctly rounded decimals) decides, in
    arrays: away from a tie k + ½ at this precision the nearest k is the one rint finds, and k /
    10⁴ is the double ``round`` gives; near one (within 10⁻⁶) ``round`` itself decides."""
    x = np.asarray(log_ratios, np.float64)
    scaled = x * 10.0 ** RATIO_DECIMALS
    out = np.rint(scaled) / 10.0 ** RATIO_DECIMALS + 0.0          # + 0.0: no negative zero
    tie = np.abs(np.abs(scaled - np.floor(scaled)) - 0.5) < 1e-6
    out[tie] = [round(float(r), RATIO_DECIMALS) + 0.0 for r in x[tie]]
    return out


def _text(values) -> str:
    """Numbers as one space-separated line (integers without a decimal point): thousands of
    curves parse as one string each instead of one YAML scalar per number (4× faster to load)."""
    return _texts([values])[0]


def _texts(lines: list) -> list[str]:
    """:func:`_text` of each sequence of numbers in ``lines``, written in one pass over all of
    them (a fit's 35,000 lines, 414,000 numbers: ``repr`` of each float, ``str`` of each whole
    number below 2⁵³, as a loop over the numbers wrote them)."""
    arrays = [np.asarray(v, np.float64).ravel() for v in lines]
    flat = np.concatenate(arrays) if arrays else np.zeros(0)
    words = list(map(repr, flat.tolist()))
    whole = np.flatnonzero((flat == np.floor(flat)) & (np.abs(flat) < 2.0 ** 53))
    for i, w in zip(whole.tolist(), map(str, flat[whole].astype(np.int64).tolist())):
        words[i] = w
    out, at = [], 0
    for a in arrays:
        out.append(" ".join(words[at:at + len(a)]))
        at += len(a)
    return out


#: the curve lines :func:`to_dict` wrote last, by kind and :class:`Curves` digest (a fit writes
#: each curve set twice, for its metrics' round trip and for its file: ≈ 0.25 s of text a time)
_LINES: dict = {}
LINES_KEPT = 128
#: what those lines read back as (:func:`from_dict`), by kind and the lines' own digest: the
#: numbers :func:`to_dict` wrote them from, since a float's ``repr`` reads back as that float (a
#: fit's round trip parsed 35,000 lines again, 0.2 s)
_READ: dict = {}


def _lines_digest(kind: str, shrink: float, lines) -> str:
    """The SHA-256 of a curve block's λ and (shape, at, log_ratio) lines."""
    h = hashlib.sha256(f"{kind}\n{shrink!r}\n".encode())
    h.update("\n".join("\t".join(line) for line in lines).encode())
    return h.hexdigest()


def to_dict(kind: str, curves: dict) -> dict:
    """An op's curves as its file block: the axis, the shape descriptors, the ``shrink`` λ, and
    per measured shape its ``shape`` values, the axis values ``at`` and the ``log_ratio``
    ln(measured / surface), each a line of space-separated numbers."""
    digest = getattr(curves, "digest", None)           # what the lines are made of: λ, keys, values
    lines = _LINES.get((kind, digest)) if digest is not None else None
    if lines is None:
        items = sorted(curves.items())
        ratios = [np.asarray(rs, np.float64).ravel() for _, (_, rs) in items]
        given = np.concatenate(ratios) if ratios else np.zeros(0)
        rounded = stored(given)                                          # in one pass
        ratios = np.split(rounded, np.cumsum([len(r) for r in ratios])[:-1])
        text = iter(_texts([x for (key, (at, _)), rs in zip(items, ratios) for x in (key, at, rs)]))
        lines = list(zip(text, text, text))
        if digest is not None:
            while len(_LINES) >= LINES_KEPT:
                _LINES.pop(next(iter(_LINES)), None)
                _READ.pop(next(iter(_READ)), None)
            _LINES[(kind, digest)] = lines
            # curves a fit made are stored already (:func:`stored`): they read back as themselves
            _READ[(kind, _lines_digest(kind, shrink_of(curves), lines))] = \
                curves if isinstance(curves, Curves) and rounded.tobytes() == given.tobytes() else Curves(
                    {shape_key(np.asarray(key, np.float64)): (np.asarray(at, np.float64).ravel(), rs)
                     for (key, (at, _)), rs in zip(items, ratios)}, shrink_of(curves))
    return {"axis": AXES[kind], "shape": " ".join(KEYS[kind]), "shrink": shrink_of(curves), "curves": [
        {"shape": k, "at": a, "log_ratio": r} for k, a, r in lines]}


def _numbers(v, where: str, low: float = -math.inf) -> np.ndarray:
    """A line of space-separated finite numbers (≥ ``low``), else a one-line error."""
    try:
        x = np.array(str(v).split(), np.float64) if isinstance(v, (str, int, float)) else None
    except ValueError:
        x = None
    if x is None or not len(x) or not np.all(np.isfinite(x)) or np.any(x < low):
        bound = "" if low == -math.inf else f" ≥ {low:g}"
        raise RoofcalError(f"{where}' must be a line of finite numbers{bound}, got {str(v)[:40]!r}")
    return x


def _lines(values: list, where_of, low: float = -math.inf) -> tuple[list, np.ndarray | None]:
    """Many lines of numbers (:func:`_numbers`) parsed and checked in one pass: (the arrays, their
    lengths). A bad line is named by its own parse (``where_of(i)``: its field), which raises."""
    if all(isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in values):
        texts = [str(v) for v in values]                 # a one-number line reads as a number
        counts = np.array([len(t.split()) for t in texts], np.int64)
        try:
            flat = np.array(" ".join(texts).split(), np.float64)
        except ValueError:
            flat = None
        if flat is not None and counts.all() and np.isfinite(flat).all() and not (flat < low).any():
            return np.split(flat, np.cumsum(counts)[:-1]), counts
    return [_numbers(v, where_of(i), low) for i, v in enumerate(values)], None


def _ascending(lines: list, counts: np.ndarray) -> bool:
    """Whether every line (lengths ``counts``, none empty) ascends strictly: one diff over all of
    them, the steps from one line's last value to the next's first left out."""
    if not lines:
        return True
    up = np.diff(np.concatenate(lines)) > 0
    up[np.cumsum(counts)[:-1] - 1] = True
    return bool(up.all())


def from_dict(kind: str, d, where: str) -> Curves:
    """The curves of a file block (:func:`to_dict`); ``where``: ``<file>: field 'ops.<key>.measured_shapes``
    (without the closing quote), for one-line errors. A block without ``shrink`` (written before
    it existed) has λ = 1, as it was fitted."""
    if kind not in AXES:
        raise RoofcalError(f"{where}' is only for {', '.join(AXES)} kernels")
    if not isinstance(d, dict) or not {"axis", "shape", "curves"} <= set(d) <= {"axis", "shape", "shrink", "curves"}:
        raise RoofcalError(f"{where}' must be a mapping of axis, shape, shrink and curves")
    shrink = d.get("shrink", 1.0)
    if isinstance(shrink, bool) or not isinstance(shrink, (int, float)) or not 0.0 <= shrink <= 1.0:
        raise RoofcalError(f"{where}.shrink' must be a number in [0, 1], got {str(shrink)[:40]!r}")
    if d["axis"] != AXES[kind] or d["shape"] != " ".join(KEYS[kind]):
        raise RoofcalError(f"{where}' must have axis {AXES[kind]} and shape '{' '.join(KEYS[kind])}'")
    if not isinstance(d["curves"], list):
        raise RoofcalError(f"{where}.curves' must be a list")
    cs = d["curves"]
    for i, c in enumerate(cs):
        if not isinstance(c, dict) or set(c) != {"shape", "at", "log_ratio"}:
            raise RoofcalError(f"{where}.curves[{i}]' must be a mapping of shape, at and log_ratio")
    if all(isinstance(v, str) for c in cs for v in c.values()):     # lines this process wrote?
        lines = [(c["shape"], c["at"], c["log_ratio"]) for c in cs]
        known = _READ.get((kind, _lines_digest(kind, float(shrink), lines)))
        if known is not None:
            return known
    field = lambda name: lambda i: f"{where}.curves[{i}].{name}"
    keys, _ = _lines([c["shape"] for c in cs], field("shape"), 0.0)
    ats, n_at = _lines([c["at"] for c in cs], field("at"), 0.0)
    rss, n_rs = _lines([c["log_ratio"] for c in cs], field("log_ratio"))
    checked = n_at is not None and np.array_equal(n_at, n_rs) and _ascending(ats, n_at)
    out = {}
    for i, (key, at, rs) in enumerate(zip(keys, ats, rss)):
        if len(key) != len(KEYS[kind]):
            raise RoofcalError(f"{where}.curves[{i}].shape' must give {len(KEYS[kind])} values "
                               f"({', '.join(KEYS[kind])})")
        if not checked and (len(rs) != len(at) or np.any(np.diff(at) <= 0)):
            raise RoofcalError(f"{where}.curves[{i}]' must give ascending 'at' values and one "
                               f"log_ratio for each")
        out[shape_key(key)] = (at, rs)
    return Curves(out, float(shrink))

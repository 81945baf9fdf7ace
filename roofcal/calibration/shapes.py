"""A kernel's surface features factored through its measured shapes (the fit's hot path).

An efficiency surface is a polynomial in a kernel's standardized descriptors ``z``: term ``t`` is
``Π_d z_d^e[t,d]`` (:func:`roofcal.model.correction.exponents`). The tables measure a few hundred
*shapes* (every descriptor but one axis: a MoE's tokens, a GEMM's m, :data:`curves.AXES`) at many
axis values each, so the (rows × terms) feature matrix repeats itself: a term is the shape's
monomial ``S[s, t]`` (the axis left out) times the row's axis power ``A[r, e[t, axis]]``. Hence,
exactly,

    f[r] · w = Σ_j A[r, j] · C[s(r), j],    C = S · (w ⊙ E),    E[t, j] = [e[t, axis] = j],

which reads a (shapes × terms) matrix and a (rows × degree + 1) one instead of (rows × terms): a MoE
table's 10,000 rows × 495 terms (20 MB read by each product: an objective and its gradient took
2.6 ms, now 1.05) become ≈ 500 shapes × 495 terms and 10,000 rows × 5 powers. Same polynomial, same
values up to float rounding. Over the 35–126 terms of the other kinds the per-row gather (and its
scatter in the gradient) costs more than it saves, so their fits keep the dense matrix.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from roofcal.grouping import unique_rows
from roofcal.model import correction as K
from roofcal.model import curves


class Factored(NamedTuple):
    """The features of N rows over U shapes and T terms of a degree-``J − 1`` surface."""

    shapes: jnp.ndarray      # (U, T) float32: each shape's monomials, axis power 0
    powers: jnp.ndarray      # (N, J) float32: each row's clipped axis value to the powers 0 … J − 1
    shape_of: jnp.ndarray    # (N,) int32: each row's shape
    onehot: jnp.ndarray      # (T, J) float32: E[t, j] = 1 where term t holds the axis to power j
    blocks: tuple = ()       # J pairs: ``shapes``' columns of the terms with axis power j, (T_j, U), (U, T_j)
    order: jnp.ndarray | None = None   # (T,) int32: the terms, by axis power (the blocks' columns)


def axis_of(kind: str) -> int | None:
    """Index of ``kind``'s curve axis among its descriptors (None: rows are their own shapes)."""
    name = curves.AXES.get(kind)
    desc = K.OP_KINDS[kind].descriptors
    return desc.index(name) if name in desc else None


def factor(kind: str, z: np.ndarray, lo: np.ndarray, hi: np.ndarray, degree: int) -> Factored:
    """The degree-``degree`` features of standardized shapes ``z`` (N, n_desc), clamped to
    [lo, hi] as :func:`roofcal.model.correction.features` does, factored through the shapes
    (computed in float64, stored in float32)."""
    e = K.exponents(z.shape[1], degree)                          # (T, D)
    zc = np.clip(np.asarray(z, np.float64), np.asarray(lo, np.float64), np.asarray(hi, np.float64))
    a = axis_of(kind)
    if a is None or not len(zc):                                 # every row its own shape
        shapes = np.prod(zc[:, None, :] ** e[None], axis=2)
        return with_blocks(Factored(jnp.asarray(shapes, jnp.float32), jnp.ones((len(zc), 1), jnp.float32),
                                    jnp.arange(len(zc), dtype=jnp.int32),
                                    jnp.ones((len(e), 1), jnp.float32)))
    keys = zc.copy()
    keys[:, a] = 1.0                                             # the axis leaves the shape
    uniq, shape_of = unique_rows(keys)
    shapes = monomials(uniq, e)                                  # (U, T)
    j = np.arange(degree + 1)
    powers = zc[:, a:a + 1] ** j[None]                           # (N, J)
    onehot = (e[:, a][:, None] == j[None]).astype(np.float32)   # (T, J)
    put = lambda x, dt: jax.device_put(np.asarray(x, dt))     # converted on the host: no XLA program
    return with_blocks(Factored(put(shapes, np.float32), put(powers, np.float32),
                                put(shape_of.reshape(-1), np.int32), put(onehot, np.float32)))


def monomials(x: np.ndarray, e: np.ndarray) -> np.ndarray:
    """(N, T) products over descriptors d of ``x[:, d] ** e[t, d]`` (``x`` (N, D) float64, ``e``
    (T, D) integer exponents): each power computed once per value and exponent, then gathered
    and multiplied in descriptor order — the same numbers as ``np.prod(x[:, None] ** e, 2)``
    without N·T·D calls of ``pow`` (a MoE table's 600 shapes × 495 terms × 8 descriptors:
    60 → 5 ms)."""
    powers = x[:, :, None] ** np.arange(int(e.max(initial=0)) + 1)  # (N, D, P)
    return np.prod(powers[:, np.arange(x.shape[1])[None, :], e], axis=2)


def with_blocks(f: Factored) -> Factored:
    """``f`` with its shapes' columns split by the terms' axis power (:func:`logits`)."""
    power = np.asarray(f.onehot).argmax(1)                       # (T,) each term's axis power
    order = np.argsort(power, kind="stable")
    shapes = np.asarray(f.shapes)
    put = lambda x: jax.device_put(np.ascontiguousarray(x))
    cols = [order[power[order] == j] for j in range(f.onehot.shape[1])]
    return f._replace(blocks=tuple((put(shapes[:, c].T), put(shapes[:, c])) for c in cols),
                      order=jax.device_put(order.astype(np.int32)))


def padded(f: Factored, rows: int, shapes: int) -> Factored:
    """``f`` grown to ``rows`` rows (axis powers 0, shape 0) and ``shapes`` shapes (zeros), so the
    variants of a kind share one compiled objective."""
    grow = lambda x, n: jax.device_put(np.pad(np.asarray(x), [(0, n - x.shape[0])] + [(0, 0)] * (x.ndim - 1)))
    grow_t = lambda x, n: jax.device_put(np.pad(np.asarray(x), [(0, 0), (0, n - x.shape[1])]))
    return Factored(grow(f.shapes, shapes), grow(f.powers, rows), grow(f.shape_of, rows), f.onehot,
                    tuple((grow_t(bt, shapes), grow(b, shapes)) for bt, b in f.blocks), f.order)


def logits(f: Factored, w):
    """Surface values f[r] · w of every row for the columns of ``w`` (T, K): (N, K).

    C[:, :, j] is the product of the shapes' columns of the terms with axis power j (``blocks``,
    held both ways for :func:`~roofcal.model.correction.product`) with their rows of ``w``:
    U·T·K multiplications instead of U·T·K·J over a one-hot of the powers, and no reduce over
    that one-hot in the gradient (vLLM 0.24's MoE bf16, 602 shapes × 495 terms: an L-BFGS
    iteration 0.61 → 0.45 ms)."""
    n, j = f.powers.shape
    k = w.shape[1]
    wo = w[f.order].T                                               # (K, T): terms by axis power
    parts, at = [], 0
    for bt, b in f.blocks:
        parts.append(K.product(wo[:, at:at + bt.shape[0]], bt, b))  # (K, U)
        at += bt.shape[0]
    c = jnp.stack(parts, axis=2).transpose(1, 0, 2)                 # (U, K, J)
    g = c[f.shape_of]
    # the J products added one by one, not reduced over a length-J axis: XLA's CPU backend hands
    # such a reduce to YNNPACK, which took 1.3 ms of a MoE iteration's 3.3 (10,000 × 2 × 5)
    out = g[:, :, 0] * f.powers[:, None, 0]
    for i in range(1, j):
        out = out + g[:, :, i] * f.powers[:, None, i]
    return out


def dense(f: Factored) -> jnp.ndarray:
    """The (N, T) feature matrix itself (for predictions over a kernel's rows)."""
    return f.shapes[f.shape_of] * (f.powers @ f.onehot.T)

"""Attribution: which component's correction, scaled, would remove most of a regime's error.

For each regime (a group of residual rows: phase, batch or context bucket, model/TP, kernel kind)
and each component, the loss is the mean squared log error of the rows with that component's time
multiplied by ``s``. :func:`attribution` reports ∂loss/∂log s at s = 1 (``jax.grad``), the 1-D
optimal ``s`` (a log-spaced grid over 1/64…64 refined by Newton steps with JAX derivatives) and the
fraction of the regime's loss it removes; :func:`attribution_lines` ranks them as sentences, e.g.
"decode steps at batch ≥ 64: attn_decode ×1.12 would remove 70% of the squared log error (MAPE
9.1% → 4.2%)".
"""

from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

from roofcal.model import correction as K
from roofcal.inspection.residuals import KERNEL, OP_COMPONENTS, STEP, _labels, components, padded_size

#: attribution regimes: columns whose values define a regime, per kind of row
KERNEL_LEVELS = (("key",), ("key", "bound"), ("key", "batch_bucket"), ("key", "context_bucket"))

STEP_LEVELS = ((), ("phase",), ("phase", "batch_bucket"), ("phase", "context_bucket"),
               ("model", "tp", "phase"))

#: 1-D scale search: log-spaced grid over [1/64, 64], then Newton steps
SCALE_RANGE = 64.0

GRID_POINTS = 25

NEWTON_STEPS = 6

#: a regime whose mean squared log error is below this (|error| ≲ 0.001%) has nothing to attribute
NOISE_LOSS = 1e-10

def _pred_linear(inputs, S):
    """Steps: prediction with candidate j's components scaled by S[:, j] (µs, shape (R, J))."""
    base, X = inputs
    return base[:, None] + (S - 1.0) * X

def _pred_kernel(inputs, S):
    """Kernels: latency, compute or memory time (candidate 0, 1, 2) scaled by S[:, j]."""
    lat, a, b, q = inputs
    return jnp.stack([S[:, 0] * lat + K.smax(a, b, q),
                      lat + K.smax(S[:, 1] * a, b, q),
                      lat + K.smax(a, S[:, 2] * b, q)], axis=1)

def _seg_pred(u, seg, inputs, kernel):
    """Prediction per (row, candidate) with candidate j of row i's segment scaled by
    exp(u[seg[i], j]); shape (R, J)."""
    return (_pred_kernel if kernel else _pred_linear)(inputs, jnp.exp(u)[seg])

def _seg_loss(u, seg, logy, counts, inputs, n_seg, kernel):
    """Mean squared log-ratio per (segment, candidate) with candidate j of segment g scaled by
    exp(u[g, j]); shape (G, J)."""
    pred = _seg_pred(u, seg, inputs, kernel)
    r = (jnp.log(jnp.maximum(pred, 1e-30)) - logy[:, None]) ** 2
    return jax.ops.segment_sum(r, seg, n_seg) / counts[:, None]

def _seg_mape(u, seg, logy, counts, inputs, n_seg, kernel):
    """Mean |relative error| per (segment, candidate), as :func:`_seg_loss`; shape (G, J)."""
    r = jnp.abs(_seg_pred(u, seg, inputs, kernel) / jnp.exp(logy)[:, None] - 1.0)
    return jax.ops.segment_sum(r, seg, n_seg) / counts[:, None]

@partial(jax.jit, static_argnames=("n_seg", "n_cand", "kernel"))
def optimal_scales(seg, logy, inputs, n_seg: int, n_cand: int, kernel: bool) -> dict:
    """Per (segment, candidate): loss at scale 1, ∂loss/∂log s at s = 1 (``jax.grad``), the 1-D
    optimal scale in [1/64, 64] and the loss and MAPE (fraction) there. Arrays of shape (G, J).

    The optimum is the best point of a log-spaced grid, refined by safeguarded Newton steps in
    log s (first and second derivatives by forward-mode JAX; a step is kept only if it lowers the
    loss). The losses of different (segment, candidate) entries are independent, so all entries
    are solved at once.
    """
    counts = jnp.maximum(jax.ops.segment_sum(jnp.ones_like(logy), seg, n_seg), 1.0)
    loss = lambda u: _seg_loss(u, seg, logy, counts, inputs, n_seg, kernel)
    zero = jnp.zeros((n_seg, n_cand), logy.dtype)
    one = jnp.ones_like(zero)
    lim = math.log(SCALE_RANGE)
    grid = jnp.linspace(-lim, lim, GRID_POINTS, dtype=logy.dtype)
    on_grid = jax.lax.map(lambda v: loss(zero + v), grid)   # (K, G, J)
    u = grid[jnp.argmin(on_grid, axis=0)]
    d1 = lambda u: jax.jvp(loss, (u,), (one,))               # separable: tangent of ones = diagonal
    step_max = 2.0 * lim / (GRID_POINTS - 1)

    def newton(_, u):
        (f, g), (_, h) = jax.jvp(d1, (u,), (one,))
        step = jnp.clip(jnp.where(h > 0, -g / jnp.maximum(h, 1e-30), 0.0), -step_max, step_max)
        un = jnp.clip(u + step, -lim, lim)
        return jnp.where(loss(un) < f, un, u)

    u = jax.lax.fori_loop(0, NEWTON_STEPS, newton, u)
    best0 = loss(zero)
    u = jnp.where((loss(u) < best0) & (best0 > NOISE_LOSS), u, 0.0)
    grad = jax.grad(lambda v: jnp.sum(loss(v)))(zero)       # entry (g, j) = ∂L_g/∂log s_j at 1
    mape = lambda v: _seg_mape(v, seg, logy, counts, inputs, n_seg, kernel)
    return {"loss0": best0[:, 0], "grad": grad, "scale": jnp.exp(u), "loss": loss(u),
            "mape0": mape(zero)[:, 0], "mape": mape(u), "n": counts}

def _solve(seg, logy, cols, n_seg: int, n_cand: int, kernel: bool) -> dict:
    """:func:`optimal_scales` on inputs padded to a few sizes (rows, segments, candidates), so one
    compiled program serves many inputs; padding rows sit in a spare segment with zero loss."""
    R = len(seg)
    rows = padded_size(R, 4096) - R
    G = -(-(n_seg + 1) // 64) * 64
    J = n_cand if kernel else -(-n_cand // 8) * 8
    seg = np.concatenate([seg, np.full(rows, G - 1)])
    logy = np.concatenate([logy, np.zeros(rows)])
    if kernel:                                       # latency 1, no work → prediction 1
        fill = (1.0, 0.0, 0.0, 1.0)
        cols = [np.concatenate([c, np.full(rows, f)]) for c, f in zip(cols, fill)]
    else:                                            # base 1, candidates scale nothing
        base, X = cols
        cols = [np.concatenate([base, np.ones(rows)]),
                np.pad(np.concatenate([X, np.zeros((rows, X.shape[1]))]), ((0, 0), (0, J - n_cand)))]
    f32 = lambda a: jnp.asarray(np.asarray(a), jnp.float32)
    r = optimal_scales(jnp.asarray(seg, jnp.int32), f32(logy), tuple(f32(c) for c in cols), G, J,
                       kernel)
    out = {k: np.asarray(v, np.float64)[:n_seg] for k, v in r.items()}
    return {k: v[:, :n_cand] if v.ndim == 2 else v for k, v in out.items()}

def step_candidates(names: list[str], blis: bool) -> list[tuple[str, tuple[str, ...]]]:
    """Scalable candidates of step rows: each component, and each kernel group of
    :data:`roofcal.model.correction.STEP_SCALES` with ≥ 2 present members (its step-level scale)."""
    out = [(n, (n,)) for n in names]
    if not blis:
        for group, members in K.STEP_SCALES.items():
            present = tuple(m for m in members if m in names)
            if len(present) >= 2:
                out.append((f"{group} (group)", present))
    return out

def _regime_text(kind: str, cols, values) -> str:
    word = {"batch_bucket": "batch {}", "context_bucket": "context {}", "bound": "{}-bound",
            "tp": "TP {}", "model": "{}", "key": "{}", "phase": "{}"}
    if kind == STEP:
        phase = dict(zip(cols, values)).get("phase")
        head = f"{phase} steps" if phase else "all steps"
        rest = [word[c].format(v) for c, v in zip(cols, values) if c != "phase"]
    else:
        head = dict(zip(cols, values))["key"]
        rest = [word[c].format(v) for c, v in zip(cols, values) if c != "key"]
    return ", ".join([head] + rest)

def _level_segments(df: pd.DataFrame, kind: str, levels) -> tuple:
    """Stack every regime level: (row positions, segment ids, regime table). Each row appears once
    per level; rows missing a level's values are left out of it. The deployment level is skipped
    when there is only one deployment."""
    rows, segs, regimes = [], [], []
    for cols in levels:
        cols = list(cols)
        if any(c not in df.columns for c in cols):
            continue
        if "tp" in cols and len(df[["model", "tp"]].drop_duplicates()) <= 1:
            continue
        lab = _labels(df, cols)
        ok = np.flatnonzero(lab.notna().to_numpy())
        if not len(ok):
            continue
        codes, uniq = pd.factorize(lab.iloc[ok], sort=True)
        _, first = np.unique(codes, return_index=True)
        for i in ok[first]:
            vals = [df[c].iloc[i] for c in cols]
            vals = ["{:g}".format(v) if isinstance(v, float) else v for v in vals]
            regimes.append({"level": " × ".join(cols) or "all",
                            "regime": _regime_text(kind, cols, vals)})
        rows.append(ok)
        segs.append(codes + (len(regimes) - len(uniq)))
    if not rows:
        return np.zeros(0, int), np.zeros(0, int), pd.DataFrame(columns=["level", "regime"])
    return np.concatenate(rows), np.concatenate(segs), pd.DataFrame(regimes)

def attribution_inputs(rows: pd.DataFrame, kind: str, names: list, blis: bool) -> tuple:
    """(candidates [(name, members)], model inputs, µs of each candidate per row) for rows of
    one kind. Kernels: (latency, corrected compute time, corrected memory time, sharpness);
    steps: (prediction, candidate times)."""
    if kind == KERNEL:
        cands = [(n, (n,)) for n in OP_COMPONENTS]
        # a measured shape's curve scales the kernel's time; the soft max is homogeneous, so it
        # scales both corrected times (the latency column already carries it)
        f = rows["shape_factor"] if "shape_factor" in rows else 1.0
        a = rows["ideal_compute_us"] / rows["compute_efficiency"] * f
        b = rows["ideal_memory_us"] / rows["memory_efficiency"] * f
        amount = rows[[f"comp_{c}_us" for c in OP_COMPONENTS]].to_numpy()
        return cands, [rows["comp_latency_us"], a, b, rows["sharpness"]], amount
    cands = step_candidates(names, blis)
    X = np.stack([rows[[f"comp_{m}_us" for m in mem]].sum(axis=1).to_numpy() for _, mem in cands], 1)
    return cands, [rows["predicted_us"], X], X

def _segment_mean(values, seg, n_seg: int, counts) -> np.ndarray:
    out = np.zeros((n_seg,) + values.shape[1:])
    np.add.at(out, seg, values)
    return out / (counts[:, None] if out.ndim == 2 else counts)

def attribution(df: pd.DataFrame, blis: dict | None = None) -> pd.DataFrame:
    """Which component's scaled correction would remove most of the error, per regime.

    One row per (kind, regime, candidate): ``n``, regime ``loss`` (mean squared log-ratio),
    ``loss share %`` of the kind's total, the candidate's ``share %`` of predicted time,
    ``grad`` = ∂loss/∂log s at s = 1, optimal ``scale``, ``removed %`` of the regime's loss,
    ``impact %`` (removed loss as a share of the kind's total), MAPE before / after (%), and
    ``members`` (components the candidate scales: > 1 for a kernel group).
    ``blis``: {component: (β symbol, β)} adds the implied β·scale. Sorted by impact.
    """
    out = []
    for kind in (STEP, KERNEL):
        rows = df[df["kind"] == kind].reset_index(drop=True)
        if rows.empty:
            continue
        cands, cols, amount = attribution_inputs(rows, kind, components(df, kind), blis is not None)
        idx, seg, regimes = _level_segments(rows, kind, KERNEL_LEVELS if kind == KERNEL else STEP_LEVELS)
        if not len(idx):
            continue
        G = len(regimes)
        logy = np.log(rows["measured_us"].to_numpy(np.float64))[idx]
        r = _solve(seg, logy, [np.asarray(c, np.float64)[idx] for c in cols], G, len(cands),
                   kind == KERNEL)
        pred = rows["predicted_us"].to_numpy()[idx]
        share = 100.0 * _segment_mean(amount[idx] / pred[:, None], seg, G, r["n"])
        sq = rows["log_ratio"].to_numpy()[idx] ** 2
        loss_share = 100.0 * _segment_mean(sq, seg, G, r["n"]) * r["n"] / max(float(
            np.sum(rows["log_ratio"].to_numpy() ** 2)), 1e-300)
        removed = np.where(r["loss0"][:, None] > NOISE_LOSS,
                           100.0 * (1.0 - r["loss"] / np.maximum(r["loss0"][:, None], 1e-300)), 0.0)
        for j, (name, members) in enumerate(cands):
            f = pd.DataFrame({
                "kind": kind, "level": regimes["level"], "regime": regimes["regime"],
                "n": r["n"].astype(int), "loss": r["loss0"], "loss share %": loss_share,
                "component": name, "share %": share[:, j], "grad": r["grad"][:, j],
                "scale": r["scale"][:, j], "removed %": removed[:, j],
                "impact %": loss_share * removed[:, j] / 100.0,
                "mape before %": 100.0 * r["mape0"], "mape after %": 100.0 * r["mape"][:, j],
                "members": len(members)})
            if blis is not None and name in blis:
                f["beta"] = blis[name][0]
                f["implied beta"] = blis[name][1] * f["scale"]
            out.append(f[share[:, j] > 0])
    if not out:
        return pd.DataFrame()
    res = pd.concat(out, ignore_index=True)
    res["_k"] = (res["kind"] != STEP).astype(int)
    res = res.sort_values(["_k", "impact %", "regime", "component"],
                          ascending=[True, False, True, True], kind="stable")
    return res.drop(columns="_k").reset_index(drop=True)

def best_per_regime(attr: pd.DataFrame) -> pd.DataFrame:
    """For each (kind, regime) the candidate removing most of its loss, ranked by impact."""
    if attr.empty:
        return attr
    best = attr.assign(_r=attr["removed %"].round(6))
    best = best.sort_values(["kind", "regime", "_r", "members", "component"],
                            ascending=[True, True, False, True, True], kind="stable")
    best = best.groupby(["kind", "regime"], sort=False).head(1).drop(columns="_r")
    best = best.assign(_k=(best["kind"] != STEP).astype(int))
    best = best.sort_values(["_k", "impact %", "regime"], ascending=[True, False, True], kind="stable")
    return best.drop(columns="_k").reset_index(drop=True)

def scale_text(scale: float) -> str:
    """``×1.12``; at the edge of the searched range ``×≥64`` / ``×≤0.0156``."""
    if scale >= SCALE_RANGE * 0.999:
        return f"×≥{SCALE_RANGE:g}"
    if scale <= 1.0 / SCALE_RANGE * 1.001:
        return f"×≤{1.0 / SCALE_RANGE:.3g}"
    return f"×{scale:.3g}"

def component_label(kind: str, name: str, scale: float, blis: dict | None = None) -> str:
    """Readable correction: ``attn_decode ×1.12``, ``memory time ×1.1 (memory efficiency ×0.909)``,
    ``dc_kv ×1.12 (β2b 1.947 → 2.181)``."""
    x = scale_text(scale)
    if kind == KERNEL:
        if name == "latency":
            return f"latency {x}"
        return f"{name} time {x} ({name} efficiency ×{1.0 / scale:.3g})"
    if blis is not None and name in blis:
        sym, b = blis[name]
        return f"{name} {x} ({sym} {b:.4g} → {b * scale:.4g})"
    return f"{name} {x}"

def effect_text(removed: float, before: float, after: float) -> str:
    """What a scale does to a regime, in the two measures it is judged by: the squared log error
    it minimises, and MAPE, which can move the other way (fewer large misses, more small ones)."""
    what = f"remove {removed:.0f}% of the squared log error"
    if round(after, 1) > round(before, 1):
        return f"{what}, but raise MAPE {before:.1f}% → {after:.1f}%"
    return f"{what} (MAPE {before:.1f}% → {after:.1f}%)"


def attribution_lines(attr: pd.DataFrame, top: int = 12, blis: dict | None = None) -> list[str]:
    """The ranked list: per regime, the correction that would remove most of its squared log
    error (the fitting loss), with what it does to the regime's MAPE (:func:`effect_text`)."""
    lines = []
    best = best_per_regime(attr)
    for kind in (STEP, KERNEL):
        part = best[(best["kind"] == kind) & (best["removed %"] > 0.05)].head(top)
        for _, r in part.iterrows():
            lines.append(
                f"{len(lines) + 1}. {r['regime']} (n={r['n']}, {r['loss share %']:.1f}% of the "
                f"{kind} loss): {component_label(kind, r['component'], r['scale'], blis)} would "
                + effect_text(r['removed %'], r['mape before %'], r['mape after %']))
    return lines

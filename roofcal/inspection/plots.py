"""PNG plots of a residual table (:mod:`roofcal.residuals`), drawn off-screen.

Figures are built with matplotlib's object API (``Figure`` + the Agg renderer: no pyplot, no
display, no global state) and returned as PNG bytes without a ``Software`` stamp, so equal tables
give equal bytes. Times in µs, errors in % (``100·(predicted/measured − 1)``); axes are
logarithmic where values span decades.
"""

from __future__ import annotations

import io
import math

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.colors import TwoSlopeNorm
from matplotlib.figure import Figure

DPI = 100
#: at most this many points drawn per panel (evenly spaced rows, plus the worst ones)
MAX_POINTS = 3000
MAX_BARS = 24
PANEL = (5.0, 4.2)          # inches per panel


def png_bytes(fig: Figure) -> bytes:
    """Render ``fig`` with Agg to PNG bytes (no metadata that changes between runs)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    return buf.getvalue()


def _grid(n: int, ncols: int = 3, panel=PANEL):
    ncols = max(1, min(ncols, n))
    nrows = math.ceil(n / ncols)
    fig = Figure(figsize=(panel[0] * ncols, panel[1] * nrows + 0.6))
    fig.subplots_adjust(left=0.8 / (panel[0] * ncols), right=1 - 0.3 / (panel[0] * ncols),
                        bottom=0.7 / (panel[1] * nrows + 0.6), top=1 - 0.9 / (panel[1] * nrows + 0.6),
                        wspace=0.35, hspace=0.45)
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax in axes[n:]:
        ax.set_visible(False)
    return fig, axes[:n]


def panels(df: pd.DataFrame) -> list[tuple[str, pd.DataFrame, str]]:
    """(title, rows, colour column): one panel per kernel op, and one for all steps."""
    out = []
    kern = df[df["kind"] == "kernel"]
    for op in sorted(kern["op"].dropna().unique()):
        out.append((op, kern[kern["op"] == op], "dtype"))
    steps = df[df["kind"] == "step"]
    if len(steps):
        out.append(("steps", steps, "phase"))
    return out


def sample(rows: pd.DataFrame, n: int = MAX_POINTS) -> pd.DataFrame:
    """At most ``n`` rows: evenly spaced ones plus the 2% with the largest |log error|."""
    if len(rows) <= n:
        return rows
    worst = np.argsort(-np.abs(rows["log_ratio"].to_numpy()), kind="stable")[: n // 50]
    even = np.linspace(0, len(rows) - 1, n - len(worst)).astype(int)
    return rows.iloc[np.unique(np.concatenate([even, worst]))]


def _mape(rows) -> float:
    return float(np.mean(np.abs(rows["rel_error"]))) * 100.0


def _colour_groups(rows: pd.DataFrame, col: str):
    for i, (key, g) in enumerate(rows.groupby(rows[col].fillna("—"), sort=True)):
        yield f"C{i % 10}", str(key), g


def pred_vs_measured(df: pd.DataFrame) -> bytes:
    """Predicted against measured time, log–log, one panel per op (and steps); y = x and ±25%."""
    ps = panels(df)
    fig, axes = _grid(len(ps))
    for ax, (title, rows, col) in zip(axes, ps):
        shown = sample(rows)
        for colour, label, g in _colour_groups(shown, col):
            ax.plot(g["measured_us"], g["predicted_us"], ".", ms=3, alpha=0.5, color=colour,
                    label=label)
        lo = float(min(rows["measured_us"].min(), rows["predicted_us"].min())) / 1.5
        hi = float(max(rows["measured_us"].max(), rows["predicted_us"].max())) * 1.5
        x = np.array([lo, hi])
        ax.plot(x, x, color="black", lw=1, label="y = x")
        ax.plot(x, 1.25 * x, color="grey", lw=0.8, ls="--", label="±25%")
        ax.plot(x, x / 1.25, color="grey", lw=0.8, ls="--")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_aspect("equal")
        ax.set_xlabel("measured (µs)")
        ax.set_ylabel("predicted (µs)")
        ax.set_title(f"{title}: MAPE {_mape(rows):.1f}%, n = {len(rows)}", fontsize=10)
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", markerscale=2)
    fig.suptitle("Predicted against measured time (log–log)")
    return png_bytes(fig)


def _binned_median(x, y, bins: int = 16):
    """Median of ``y`` in log-spaced bins of ``x`` (bins with ≥ 5 points)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    ok = x > 0
    if ok.sum() < 10:
        return np.array([]), np.array([])
    edges = np.logspace(np.log10(x[ok].min()), np.log10(x[ok].max()) + 1e-9, bins + 1)
    idx = np.digitize(x[ok], edges) - 1
    centers, med = [], []
    for i in range(bins):
        sel = idx == i
        if sel.sum() >= 5:
            centers.append(math.sqrt(edges[i] * edges[i + 1]))
            med.append(float(np.median(y[ok][sel])))
    return np.array(centers), np.array(med)


def error_vs_work(df: pd.DataFrame) -> bytes:
    """Signed relative error (%) against the ideal roofline time of the work (µs, log x), per op;
    black line: median error in log-spaced bins."""
    ps = panels(df)
    fig, axes = _grid(len(ps))
    for ax, (title, rows, col) in zip(axes, ps):
        err = 100.0 * rows["rel_error"].to_numpy()
        lo, hi = np.percentile(err, [0.5, 99.5])
        pad = max(2.0, 0.1 * (hi - lo))
        lo, hi = max(-100.0, lo - pad), hi + pad
        shown = sample(rows)
        for colour, label, g in _colour_groups(shown, col):
            ax.plot(g["work_us"], 100.0 * g["rel_error"], ".", ms=3, alpha=0.5, color=colour,
                    label=label)
        cx, my = _binned_median(rows["work_us"], err)
        if len(cx):
            ax.plot(cx, my, color="black", lw=1.5, label="median")
        ax.axhline(0.0, color="grey", lw=0.8)
        ax.set_xscale("log")
        ax.set_ylim(lo, hi)
        outside = int(np.sum((err < lo) | (err > hi)))
        ax.set_xlabel("ideal roofline time of the work (µs)")
        ax.set_ylabel("relative error (%)")
        extra = f", {outside} outside" if outside else ""
        ax.set_title(f"{title}: bias {np.mean(err):+.1f}%, n = {len(rows)}{extra}", fontsize=10)
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=7, loc="upper right", markerscale=2)
    fig.suptitle("Relative error (predicted/measured − 1) against the amount of work")
    return png_bytes(fig)


def pick_steps(steps: pd.DataFrame, n: int = MAX_BARS) -> pd.DataFrame:
    """Up to ``n`` representative steps: per phase, evenly spaced in measured time."""
    if len(steps) <= n:
        return steps.sort_values(["phase", "measured_us"], kind="stable")
    phases = sorted(steps["phase"].unique())
    per = max(1, n // len(phases))
    out = []
    for ph in phases:
        g = steps[steps["phase"] == ph].sort_values("measured_us", kind="stable")
        out.append(g.iloc[np.unique(np.linspace(0, len(g) - 1, per).astype(int))])
    return pd.concat(out)


def ms_text(us: float) -> str:
    """A step time for a label: ``27.9 ms``, ``3,604 ms``."""
    ms = us / 1000.0
    return f"{ms:,.0f} ms" if ms >= 100 else f"{ms:.3g} ms"


def step_breakdown(df: pd.DataFrame) -> bytes | None:
    """Stacked bars of each component's predicted time as % of the measured step time, for
    representative steps; the hidden CPU time (overlap, ≤ 0) is cut from the top of the stack
    (hatched), so the solid top — marked — is the prediction; the dashed line at 100% is the
    measured time."""
    steps = df[df["kind"] == "step"]
    if steps.empty:
        return None
    comp = [c for c in df.columns if c.startswith("comp_") and (steps[c] != 0).any()]
    comp.sort(key=lambda c: -float((steps[c] / steps["predicted_us"]).mean()))
    rows = pick_steps(steps)
    x = np.arange(len(rows))
    fig = Figure(figsize=(max(8.0, 0.45 * len(rows) + 4.0), 6.0), layout="constrained")
    ax = fig.subplots()
    bottom = np.zeros(len(rows))
    cmap = matplotlib.colormaps["tab20"]
    meas = rows["measured_us"].to_numpy()
    # positive components stacked; a negative one (the CPU time hidden behind the GPU's, ≤ 0) is
    # then cut from the top as a hatched band, so the solid top is the prediction
    pos = [c for c in comp if (rows[c] >= 0).all()]
    neg = [c for c in comp if c not in pos]
    for i, c in enumerate(pos):
        h = 100.0 * rows[c].to_numpy() / meas
        ax.bar(x, h, bottom=bottom, width=0.8, color=cmap(i % 20), label=c[5:-3])
        bottom += h
    for c in neg:
        h = 100.0 * rows[c].to_numpy() / meas
        ax.bar(x, -h, bottom=bottom + h, width=0.8, facecolor="white", edgecolor="0.4", hatch="///",
               label=f"{c[5:-3]} (hidden, cut from the top)")
    top = 100.0 * rows["predicted_us"].to_numpy() / meas
    ax.scatter(x, top, marker="_", s=160, color="black", zorder=3, label="predicted")
    ax.axhline(100.0, color="black", ls="--", lw=1.2, label="measured = 100%")
    labels = [f"{r.phase} b={r.batch:g} ctx={r.context:.0f} · {ms_text(r.measured_us)}"
              for r in rows.itertuples()]
    ax.set_xticks(x, labels, rotation=90, fontsize=7)
    ax.set_ylabel("predicted component time (% of measured step time)")
    ax.set_ylim(0, max(110.0, float(bottom.max()) * 1.05))
    ax.set_title("Steps: predicted components (stacked) next to the measured time (dashed)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(True, axis="y", alpha=0.3)
    return png_bytes(fig)


def heat_panels(df: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """(title, rows) with both batch and context buckets: steps per phase, attention kernels."""
    out = []
    ok = df.dropna(subset=["batch_bucket", "context_bucket"])
    steps = ok[ok["kind"] == "step"]
    for ph in sorted(steps["phase"].dropna().unique()):
        out.append((f"{ph} steps", steps[steps["phase"] == ph]))
    kern = ok[ok["kind"] == "kernel"]
    for op in sorted(kern["op"].dropna().unique()):
        out.append((f"{op} kernels", kern[kern["op"] == op]))
    return out


def error_heatmap(df: pd.DataFrame) -> bytes | None:
    """Signed mean error (colour, %) and MAPE (text, %) over (batch size, context) buckets."""
    from roofcal.inspection.residuals import batch_labels, context_labels
    ps = heat_panels(df)
    if not ps:
        return None
    fig, axes = _grid(len(ps), ncols=2, panel=(6.5, 5.0))
    for ax, (title, rows) in zip(axes, ps):
        bl = [b for b in batch_labels() if b in set(rows["batch_bucket"])]
        cl = [c for c in context_labels() if c in set(rows["context_bucket"])]
        err = 100.0 * rows["rel_error"]
        g = pd.DataFrame({"b": rows["batch_bucket"], "c": rows["context_bucket"], "e": err,
                          "a": err.abs()}).groupby(["c", "b"])
        bias = g["e"].mean().unstack().reindex(index=cl, columns=bl)
        mape = g["a"].mean().unstack().reindex(index=cl, columns=bl)
        count = g["e"].size().unstack().reindex(index=cl, columns=bl)
        v = float(np.clip(np.nanmax(np.abs(bias.to_numpy())), 5.0, 100.0))
        cmap = matplotlib.colormaps["RdBu_r"].with_extremes(bad="#dddddd")
        im = ax.imshow(np.ma.masked_invalid(bias.to_numpy(float)), cmap=cmap, origin="lower",
                       aspect="auto", norm=TwoSlopeNorm(0.0, -v, v))
        for (i, j), m in np.ndenumerate(mape.to_numpy(float)):
            if np.isfinite(m):
                dark = abs(float(bias.iloc[i, j])) > 0.6 * v
                ax.text(j, i, f"{m:.0f}%\nn={int(count.iloc[i, j])}", ha="center", va="center",
                        fontsize=6, color="white" if dark else "black")
        ax.set_xticks(range(len(bl)), bl, rotation=45, fontsize=7)
        ax.set_yticks(range(len(cl)), cl, fontsize=7)
        ax.set_xlabel("batch size (sequences)")       # GEMM / MoE rows have no context bucket
        ax.set_ylabel("context (tokens per sequence)")
        ax.set_title(f"{title}: colour = bias, text = MAPE", fontsize=10)
        fig.colorbar(im, ax=ax, label="signed mean error (%)")
    fig.suptitle("Error over batch-size and context buckets")
    return png_bytes(fig)


def all_plots(df: pd.DataFrame) -> dict[str, bytes]:
    """Every plot that the table has data for: {file name: PNG bytes}, in a fixed order."""
    out = {"pred_vs_measured.png": pred_vs_measured(df), "error_vs_work.png": error_vs_work(df),
           "step_breakdown.png": step_breakdown(df), "error_heatmap.png": error_heatmap(df)}
    return {k: v for k, v in out.items() if v is not None}

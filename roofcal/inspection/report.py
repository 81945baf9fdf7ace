"""``roofcal residuals``: residual tables, summaries, attribution and plots written as a report.

:func:`residuals` is the API the command wraps: it builds the residual table
(:mod:`roofcal.residuals`, or :mod:`roofcal.inspection.blis_residuals` for BLIS-form coefficients), summarises
it per component and regime, ranks attributions (:mod:`roofcal.attribution`), draws the plots
(:mod:`roofcal.plots`) and writes ``residuals.parquet`` (or ``.csv``), ``attribution.csv``, ``summary.md`` and the PNGs.
Everything is computed before anything is written; each file is written atomically.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from roofcal.inspection.attribution import attribution, attribution_lines, scale_text
from roofcal.inspection.blis_residuals import BLIS_TERMS, BlisCoeffs, blis_step_residuals, read_blis_coeffs
from roofcal.errors import RoofcalError
from roofcal.physics.hardware import load_gpu
from roofcal.inspection.residuals import (
    KERNEL,
    STEP,
    STAT_COLUMNS,
    error_table,
    finish_table,
    kernel_residuals,
    step_residuals,
    worst_rows,
)

REGIME_TABLES = (("phase", ["phase"], False), ("batch size", ["batch_bucket"], False),
                 ("context", ["context_bucket"], False), ("roofline bound", ["bound"], False),
                 ("deployment (GPU / model / TP)", ["gpu", "model", "tp"], True))

PLOT_TITLES = {"pred_vs_measured.png": "Predicted against measured (log–log)",
               "error_vs_work.png": "Relative error against amount of work",
               "step_breakdown.png": "Steps: component shares next to the measured time",
               "error_heatmap.png": "Error over batch size and context"}

def _md_table(df: pd.DataFrame, columns=None) -> str:
    from roofcal.tables import table
    columns = list(columns or df.columns)
    recs = []
    for rec in df[columns].to_dict("records"):
        recs.append({k: (None if isinstance(v, float) and math.isnan(v) and k not in STAT_COLUMNS
                         else v) for k, v in rec.items()})
    return table(recs, columns)

def _fmt_frame(df: pd.DataFrame) -> pd.DataFrame:
    """Display copy: TP and counts as integers, missing labels as '—'."""
    df = df.copy()
    for c in df.columns:
        if c == "tp":
            df[c] = df[c].map(lambda v: f"{v:g}" if isinstance(v, float) and not math.isnan(v)
                              else ("—" if v is None or isinstance(v, float) else str(v)))
        elif df[c].dtype == object:
            df[c] = df[c].map(lambda v: "—" if v is None or (isinstance(v, float) and math.isnan(v)) else v)
    return df

def _fmt_attr(a: pd.DataFrame) -> pd.DataFrame:
    """Display copy of attribution rows: gradient in scientific notation, scale as text."""
    a = a.copy()
    a["grad"] = a["grad"].map("{:+.2e}".format)
    a["scale"] = a["scale"].map(lambda v: scale_text(v)[1:])
    return a

def blis_table(attr: pd.DataFrame, blis: dict) -> pd.DataFrame:
    """Every β of BLIS's formula with the 1-D attribution on all steps (scale NaN for zero terms)."""
    a = attr[(attr["kind"] == STEP) & (attr["level"] == "all")].set_index("component")
    rows = []
    for name, (sym, value) in blis.items():
        r = a.loc[name] if name in a.index else None
        scale = float(r["scale"]) if r is not None else math.nan
        rows.append({"component": name, "β": sym, "value": f"{value:.4g}",
                     "share %": float(r["share %"]) if r is not None else 0.0,
                     "scale": scale_text(scale)[1:] if r is not None else None,
                     "implied β": f"{value * scale:.4g}" if r is not None else None,
                     "removed %": float(r["removed %"]) if r is not None else 0.0})
    t = pd.DataFrame(rows)
    return t.sort_values(["removed %", "share %"], ascending=False, kind="stable")

def render_summary(df: pd.DataFrame, attr: pd.DataFrame, header: list[str], plots: list[str],
                   worst: int = 20, top: int = 12, blis: dict | None = None) -> str:
    """The Markdown report (deterministic for equal inputs). Percentages are of |relative error|
    except bias (signed mean); ``loss share`` is the share of the squared log error."""
    kinds = [k for k in (STEP, KERNEL) if (df["kind"] == k).any()]
    out = ["# roofcal residuals", ""] + header + [""]
    out += ["Errors are relative, `predicted / measured − 1`: MAPE is the mean of |error|, bias the "
            "signed mean, p50/p90/p99 percentiles of |error| (all %). `loss share` is a group's share "
            "of Σ log(predicted/measured)² of its kind (the fitting loss); tables are sorted by it.", ""]
    out += ["## Overall", "", _md_table(_fmt_frame(error_table(df, []))), ""]
    out += ["## Attribution", "",
            "Per regime, the component whose time, scaled alone, would remove most of the regime's "
            "squared log error (1-D optimum of the loss in the scale, from JAX gradients), ranked by "
            "the share of the total loss removed:", ""]
    lines = attribution_lines(attr, top, blis)
    out += lines if lines else ["(no error to attribute)"]
    out += [""]
    if blis is not None and not attr.empty:
        out += ["### BLIS coefficients on all steps", "",
                "Each β with its term's share of the predicted step time and the scale that alone "
                "would best fit all steps, searched in [1/64, 64] (a β far from its implied value "
                "is compensating elsewhere; a zero β cannot be scaled):", "",
                _md_table(blis_table(attr, blis)), ""]
    out += ["## Per op / component", "", _md_table(_fmt_frame(error_table(df, ["key"]))), ""]
    for kind in kinds:
        level = "all" if kind == STEP else "key"
        a = attr[(attr["kind"] == kind) & (attr["level"] == level)] if not attr.empty else attr
        if a.empty:
            continue
        a = a.sort_values(["removed %", "regime", "component"], ascending=[False, True, True],
                          kind="stable")
        what = "all steps" if kind == STEP else "each kernel kind/variant"
        more = f" (top {top} of {len(a)}; all in attribution.csv)" if len(a) > top else ""
        out += [f"### Components of {kind} rows ({what})", "",
                "`share %`: mean share of the prediction; `grad`: ∂loss/∂log(scale) at scale 1; "
                "`scale`: the 1-D optimum; `removed %`: of the regime's loss" + more + ".", "",
                _md_table(_fmt_attr(a.head(top)), ["regime", "component", "share %", "grad",
                                                   "scale", "removed %", "mape before %",
                                                   "mape after %"]), ""]
    out += ["## Per regime", "",
            "Batch buckets are inclusive ranges of sequences (tokens `m` for GEMM and MoE kernels); "
            "context buckets are [low, high) ranges of the mean KV length per sequence.", ""]
    for title, by, fill in REGIME_TABLES:
        t = error_table(df, by, fill)
        if t.empty:
            continue
        out += [f"### By {title}", "", _md_table(_fmt_frame(t)), ""]
    for kind in kinds:
        w = worst_rows(df, kind, worst)
        out += [f"## {len(w)} worst {kind} rows", "", _md_table(w), ""]
    if plots:
        out += ["## Plots", ""]
        out += [f"![{PLOT_TITLES.get(p, p)}]({p})" for p in plots] + [""]
    return "\n".join(out)

def terminal_text(summary: str) -> str:
    """The summary without image embeds (for stdout)."""
    text = summary.split("\n## Plots\n")[0]
    return "\n".join(ln for ln in text.splitlines() if not ln.startswith("![")).rstrip() + "\n"

@dataclass
class Residuals:
    """A residual report: the table (one row per measurement), attribution, Markdown summary and
    PNG plots ({file name: bytes}); ``files`` lists what was written (empty without out_dir)."""

    table: pd.DataFrame
    attribution: pd.DataFrame
    summary: str
    plots: dict = field(default_factory=dict)
    files: list = field(default_factory=list)
    notes: list = field(default_factory=list)

def _resolve(coeffs, gpu, blis):
    """(Coefficients or None, GPUSpec or None, BlisCoeffs or None) from the user's arguments."""
    from roofcal.model import coeffs as coeff_io
    if coeffs is None and blis is None:
        raise RoofcalError("residuals: give --coeffs FILE (roofcal) or --blis FILE (BLIS)")
    spec = load_gpu(gpu) if gpu is not None else None
    c = None
    if coeffs is not None:
        c = coeff_io.load(coeffs) if isinstance(coeffs, (str, Path)) else coeffs
        spec = spec or load_gpu(c.gpu)
        c.check_gpu(spec)
    b = None
    if blis is not None:
        b = blis if isinstance(blis, BlisCoeffs) else read_blis_coeffs(blis)
    return c, spec, b

def _load_data(data, spec, model, tp):
    from roofcal.measurements import datasets
    if isinstance(data, datasets.Measurements):
        return data
    items = [data] if data is None or isinstance(data, (str, Path)) else list(data)
    paths = []
    for it in items:
        if it is None or str(it) == "bundled":
            if spec is None:
                raise RoofcalError("residuals: bundled data needs a GPU (give --gpu or --coeffs)")
            paths += datasets.bundled_paths(spec.name)
        else:
            paths.append(Path(it))
    return datasets.load(paths, gpu=spec, model=model, tp=tp)

def _filter_steps(steps: list, model, tp) -> list:
    if model is not None:
        from roofcal.physics.config import load_model
        name = load_model(model).name
        steps = [d for d in steps if d.model.name == name]
    if tp is not None:
        steps = [d for d in steps if d.tp == int(tp)]
    return steps

def _kernel_residuals_by_set(ops, c, spec, kernels, notes) -> pd.DataFrame:
    """:func:`kernel_residuals` of per-op rows, each kernel set's rows with the file's set of
    that name (``kernels`` None) or all with set ``kernels``; with several sets, each row's
    ``key`` is prefixed by its set."""
    from roofcal.model import coeffs as coeff_io
    ops = ops.reset_index(drop=True)
    sets = ops["kernels"].astype(str).to_numpy() if "kernels" in ops else np.full(len(ops), "", object)
    if kernels is not None:
        c = coeff_io.with_kernels(c, kernels)
    names = sorted(set(sets.tolist()) - {""}) or [""]
    frames = []
    for name in names:                     # the shared rows (NCCL: set "") go with the first set
        sel = np.flatnonzero((sets == name) | ((sets == "") & (name == names[0])))
        use = c
        if kernels is None and name:
            near = coeff_io.nearest_kernel_set(c.kernel_sets, name, c.kernels)
            use = coeff_io.with_kernels(c, near)
            if near != name:
                notes.append(f"per-op rows of kernel set '{name}' predicted with the file's '{near}', "
                             f"the nearest older set of its framework (it has {', '.join(c.kernel_sets)})")
        part = kernel_residuals(ops.iloc[sel], use.params, spec)    # in the order of sel
        if len(names) > 1:
            part["key"] = name + " " + part["key"]
        frames.append(part.assign(_row=sel))
    out = pd.concat(frames, ignore_index=True).sort_values("_row", kind="stable")
    return out.drop(columns="_row").reset_index(drop=True)


def _stack_groups(c, stack, steps, provenance, notes, kernels=None) -> list[tuple[list, dict]]:
    """[(steps, params)]: the measured steps grouped by the serving stack that scores them —
    ``stack`` for all when given, else each step file's own stack (the one fitted on it), else
    the file's default stack; one note per file says which."""
    from roofcal.model import coeffs as coeff_io
    if stack is not None:
        cs = coeff_io.resolve_stack(c, stack, required=True, kernels=kernels)
        notes.append(f"steps scored with serving stack '{cs.stack or 'none'}' (--stack)")
        return [(steps, cs.params)]
    sha = {p["path"]: p["sha256"] for p in provenance}
    groups: dict = {}
    for d in steps:
        own = coeff_io.stack_fitted_on(c, sha.get(d.source))
        groups.setdefault(own or c.stack, []).append(d)
        how = "the stack fitted on them" if own else "the file's default stack"
        note = f"{d.source}: scored with serving stack '{own or c.stack}' ({how}; --stack to choose)"
        if note not in notes:
            notes.append(note)
    return [(ds, coeff_io.resolve_stack(c, name, required=True, kernels=kernels).params)
            for name, ds in groups.items()]


def residuals(coeffs=None, data=None, out_dir=None, *, gpu=None, model=None, tp=None, blis=None,
              plots: bool = True, worst: int = 20, top: int = 12, stack: str | None = None,
              kernels: str | None = None, table_format: str = "parquet") -> Residuals:
    """Inspect the residuals of a coefficient file on measurements; write the report to ``out_dir``.

    ``coeffs``: a roofcal coefficient file (path or :class:`~roofcal.coeffs.Coefficients`); its GPU
    is used unless ``gpu`` is given (a mismatch is refused). ``blis``: a BLIS ``defaults.yaml`` or
    BLIS-form YAML (path or :class:`BlisCoeffs`): steps are then predicted by BLIS's
    trained-physics formula, components β·basis (per-op rows need ``coeffs`` too, else are skipped).
    ``data``: None or ``"bundled"`` (the bundled measurements of the GPU), a path, a list of
    paths, or a :class:`~roofcal.datasets.Measurements`. ``model`` / ``tp`` name the deployment of
    step JSONL rows without one, and keep only steps of that model / TP. ``stack``: the serving
    stack that scores the measured steps (default: each file's own — the stack fitted on it —
    else the file's default; the notes say which). ``kernels``: the kernel set that predicts
    everything (default: per-op rows their own set when the file has it — the ``kernels`` column
    of a bundled table — else the nearest older set of their framework, else the file's default;
    steps their stack's set). Rows the tables hold but roofcal does not price are named in the
    notes, with their counts.

    Writes ``residuals.parquet`` (one row per measurement; ``table_format="csv"``:
    ``residuals.csv``, about ten times larger), ``attribution.csv``, ``summary.md`` and the PNG
    plots, each atomically and only after everything was computed: bad input raises
    :class:`RoofcalError` with nothing written. Times in µs throughout.
    """
    if table_format not in TABLE_FORMATS:
        raise RoofcalError(f"residuals: table format {table_format!r} is not one of {', '.join(TABLE_FORMATS)}")
    if out_dir is not None:                  # the report's own files, refused before any work
        from roofcal.io import check_output
        for name in (f"residuals.{table_format}", "attribution.csv", "summary.md"):
            check_output(Path(out_dir) / name, "residuals report")
    c, spec, b = _resolve(coeffs, gpu, blis)
    m = _load_data(data, spec, model, tp)
    steps = _filter_steps(m.steps, model, tp)
    notes = []
    if m.left_out:                           # rows read but not priced, by reason (as fit prints them)
        notes.append("left out, not priced: " + "; ".join(f"{n:,} rows: {k}" for k, n in m.left_out.items()))
    if m.steps and not steps:
        notes.append(f"{sum(len(d) for d in m.steps)} steps skipped: none match --model/--tp")
    frames = []
    if m.ops is not None and len(m.ops):
        if c is not None:
            frames.append(_kernel_residuals_by_set(m.ops, c, spec, kernels, notes))
        else:
            notes.append(f"{len(m.ops)} per-op rows skipped: BLIS predicts whole steps only "
                         "(give --coeffs too to inspect them)")
    if steps and b is not None:
        frames.append(blis_step_residuals(steps, b))
    elif steps:
        frames += [step_residuals(ds, params)
                   for ds, params in _stack_groups(c, stack, steps, m.provenance, notes, kernels)]
    elif b is not None:
        raise RoofcalError("residuals: --blis needs step measurements, and the data has none"
                           + (" matching --model/--tp" if m.steps else ""))
    if not any(len(f) for f in frames):
        raise RoofcalError("residuals: no measurements match" + (" --model/--tp" if m.steps else ""))
    df = finish_table(frames)
    blis_map = None
    if b is not None:
        from roofcal.blis.basis import effective_beta
        eff = np.asarray(effective_beta(list(b.beta)).beta, np.float64)
        blis_map = {name: (sym, float(eff[i])) for name, sym, i, _ in BLIS_TERMS}
    attr = attribution(df, blis_map)
    pngs = {}
    if plots:
        from roofcal.inspection import plots as P
        pngs = P.all_plots(df)
    header = _header(c, b, m, df, notes)
    summary = render_summary(df, attr, header, list(pngs), worst, top, blis_map)
    res = Residuals(df, attr, summary, pngs, [], notes)
    if out_dir is not None:
        res.files = write_report(res, out_dir, table_format)
    return res

def _header(c, b, m, df, notes) -> list[str]:
    lines = []
    if c is not None:
        from roofcal.resources import display
        src = display(Path(c.source)) if Path(c.source).exists() else c.source
        lines.append(f"- coefficients: `{src}` (GPU {c.gpu}"
                     + ("" if c.calibrated else ", not calibrated") + ")")
    if b is not None:
        lines.append(f"- BLIS coefficients: `{b.source}`: β = [{', '.join(f'{x:g}' for x in b.beta)}]"
                     f", α = [{', '.join(f'{x:g}' for x in b.alpha)}] µs (α are request-level "
                     "overheads and do not enter step time); basis evaluated with BLIS hardware "
                     + (f"entry {b.hardware_name or 'of the file'}" if b.hardware is not None
                        else "entries of data/blis/hardware_config.json"))
    for p in m.provenance:
        lines.append(f"- data: `{p['path']}` ({p['kind']}, {p['rows']} rows)")
    counts = df["kind"].value_counts()
    lines.append(f"- inspected: {int(counts.get(KERNEL, 0))} kernel rows, "
                 f"{int(counts.get(STEP, 0))} steps")
    lines += [f"- note: {n}" for n in notes]
    return lines

#: how ``residuals.*``, the per-row table, may be written (the first is the default)
TABLE_FORMATS = ("parquet", "csv")


def parquet_bytes(df: pd.DataFrame) -> bytes:
    """A DataFrame as roofcal writes every Parquet table: no index, zstd, the same bytes for the
    same table (pyarrow writes no time stamp)."""
    import io
    buf = io.BytesIO()
    df.to_parquet(buf, index=False, engine="pyarrow", compression="zstd")
    return buf.getvalue()


def write_report(res: Residuals, out_dir, table_format: str = "parquet") -> list[Path]:
    """Write the per-row table (``residuals.parquet``, or ``residuals.csv`` as every roofcal CSV:
    :func:`roofcal.io.csv_text`), ``attribution.csv``, the summary and the plots into ``out_dir``,
    all of them or none (:func:`roofcal.io.write_files_atomic`); returns the paths."""
    from roofcal.io import csv_text, write_files_atomic
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise RoofcalError(f"{out}: exists and is not a folder")
    table = parquet_bytes(res.table) if table_format == "parquet" else csv_text(res.table)
    files = [(out / f"residuals.{table_format}", table), (out / "attribution.csv", csv_text(res.attribution))]
    files += [(out / name, data) for name, data in res.plots.items()]
    files.append((out / "summary.md", res.summary))
    write_files_atomic(dict(files))          # all of them or none
    return [p for p, _ in files]

"""Benchmarks of GPU transfer: zero-shot bootstraps and the few-shot learning curve.

* :func:`zero_shot`: bootstrap one GPU's fit to the other with every rule of
  :mod:`roofcal.bootstrap` and report the per-op MAPE (%) on all of the other GPU's bundled
  per-op rows, next to the neutral roofline and the GPU's own fit (its surfaces alone: the own
  fit's measured-shape curves pass through its training rows, which are among these).
* :func:`learning_curve`: per kernel kind/variant of the new GPU, hold out 20 % of the rows
  (seeded), then refit on 30, 100, 300 and 1000 rows drawn at random (seeded) or spread over the
  box of shapes (:func:`draw_rows`, as ``roofcal gpu plan`` takes them) from the rest with
  priors centred on the bootstrapped file (strength κ pseudo-rows), and report held-out MAPE (%).
  Each point is one ``roofcal fit --prior`` of the kernels (its L-BFGS iterations, from the
  bootstrapped values); rows are padded to one size per kind, so every point of a kind reuses one
  compiled program.
* :func:`report`: both, as (title, Markdown table) pairs for ``roofcal bench``.

Everything is deterministic for a given seed.

Prior strength of few-shot refits, A100 from the H100 fit (rule ``sm``), held-out per-op MAPE %
averaged over the 7 A100 kinds/variants and over seeds 0, 1, 2 (``κ`` in pseudo-rows; ``3/0.3``
= surface terms 3, intercepts/latency/sharpness 0.3; "no prior" = ``roofcal fit`` from scratch;
400 L-BFGS iterations per degree stage, as ``roofcal fit``):

=========  =====  =====  =====  =====  =====  =====  ========
rows       0.1    0.3    1      3      10     3/0.3  no prior
=========  =====  =====  =====  =====  =====  =====  ========
0 (zero)   20.5   20.5   20.5   20.5   20.5   20.5   —
30         135.0  18.1   16.0   15.5   16.0   14.3   37652
100        20.7   13.2   11.8   12.2   13.4   11.7   31.2
300         9.7    9.8   10.4   11.0   12.2   10.6   9.0
1000        8.7    9.1    9.7   10.5   12.0   10.1   7.2
mean       43.5   12.6   12.0   12.3   13.4   11.7   —
=========  =====  =====  =====  =====  =====  =====  ========

κ = 1 (``--prior-weight 1``) is the best single weight over 30–1000 rows (κ ≤ 0.1 lets 30 rows
pull a degree-4 surface anywhere; κ ≥ 10 keeps the eager all-reduce at the H100 host's launch
cost); separate weights (3 on surface terms, 0.3 on the scalars) are slightly better at 30 rows.
From about 300 rows per kernel a fit from scratch is as good or better: the transferred
surfaces then only hold the optimiser in the reference GPU's basin.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from roofcal.model import correction as K
from roofcal.measurements import datasets
from roofcal.transfer.bootstrap import DEFAULT_RULE, RULES, bootstrap
from roofcal.model.coeffs import Coefficients, roundtrip
from roofcal.calibration.fit import (ANCHOR, FEW_SHOT_KAPPA, FitSettings, add_curves, fit_kernels,
                                     MAIN_ROWS_PER_TERM, WARM_ROWS_PER_TERM, kernel_data, split_rows,
                                     with_default_variants)
from roofcal.model import curves
from roofcal.physics.hardware import GPUSpec, load_gpu
from roofcal.physics.kernels import groups
from roofcal.metrics import mape
from roofcal.model.predict import predict_table
from roofcal.tables import table

SIZES = (30, 100, 300, 1000)


# --------------------------------------------------------------------------------------------
# data

microbench_table = datasets.microbench_table


def per_op_mape(table_: pd.DataFrame, params: dict, gpu: GPUSpec) -> dict:
    """{kind/variant: MAPE %} of ``params`` on every row of ``table_``."""
    pred = predict_table(table_, params, gpu)
    return {K.op_key(op, dt): mape(pred["predicted_us"].values[idx], pred["latency_us"].values[idx])
            for _, op, dt, idx in groups(pred)}


# --------------------------------------------------------------------------------------------
# zero shot

def zero_shot(ref: Coefficients, new_own: Coefficients | None, ref_gpu: GPUSpec, new_gpu: GPUSpec,
              table_: pd.DataFrame | None = None, rules=RULES) -> pd.DataFrame:
    """Per-op MAPE (%) on ``new_gpu``'s bundled rows: one row per method (neutral roofline, each
    bootstrap rule, the new GPU's own fit when given), one column per kind/variant, plus
    ``mean (shared)``: the mean over the kinds/variants the reference has."""
    table_ = microbench_table(new_gpu.name) if table_ is None else table_
    rows = [{"method": "neutral roofline", **per_op_mape(table_, K.neutral_params(), new_gpu)}]
    for rule in rules:
        c = roundtrip(bootstrap(ref, ref_gpu, new_gpu, rule))
        rows.append({"method": f"bootstrap: {rule}", **per_op_mape(table_, c.params, new_gpu)})
    if new_own is not None:      # its surfaces: its measured shapes' curves pass through these rows
        own = {**new_own.params, "ops": curves.surfaces(new_own.params["ops"])}
        rows.append({"method": f"own fit ({new_gpu.name}), surfaces alone",
                     **per_op_mape(table_, own, new_gpu)})
    df = pd.DataFrame(rows).set_index("method")
    shared = [c for c in df.columns if c in ref.params["ops"]]
    df["mean (shared)"] = df[shared].mean(axis=1)
    return df


# --------------------------------------------------------------------------------------------
# few shot

def heldout_split(table_: pd.DataFrame, seed: int) -> np.ndarray:
    """The 20 % held-out mask, stratified by kind/variant (as :func:`roofcal.fit.split_rows`)."""
    return split_rows((table_["op"] + "/" + table_["dtype"]).to_numpy(), 0.2, seed)


def sample_rows(table_: pd.DataFrame, pool: np.ndarray, n: int, seed: int) -> dict:
    """{kind/variant: row indices}: ``n`` rows (or all there are) drawn from ``pool`` (seeded)."""
    rng = np.random.default_rng(seed)
    out = {}
    for _, op, dt, idx in groups(table_):
        cand = idx[pool[idx]]
        out[K.op_key(op, dt)] = np.sort(rng.choice(cand, size=min(n, len(cand)), replace=False))
    return out


def refit(table_: pd.DataFrame, rows: dict, prior: Coefficients | None, gpu: GPUSpec, kappa: float,
          iters: int = FitSettings.kernel_iters, size: int = max(SIZES)) -> dict:
    """Raw params after fitting each kind/variant on its ``rows`` with priors centred on ``prior``
    (κ = ``kappa`` pseudo-rows, or (surface terms, scalars)) and ``iters`` L-BFGS iterations per
    degree stage, as ``roofcal fit --prior`` does; without a prior, from scratch with the default
    physical prior.

    Each kind/variant's rows are topped up to ``size`` with copies of its first row, held out
    (weight 0), so :func:`roofcal.fit.kernel_data` pads nothing more and every sample size of a
    kind shares one compiled objective.
    """
    terms, scalars = kappa if isinstance(kappa, tuple) else (kappa, kappa)
    settings = FitSettings(kernel_iters=iters, prior_terms=terms, prior_scalars=scalars,
                           progress=False)
    prior_ops = dict(prior.params["ops"]) if prior is not None else {}
    take, held = [], []
    for idx in (i for i in rows.values() if len(i)):
        fill = max(0, size - len(idx))
        take.append(np.concatenate([idx, np.repeat(idx[:1], fill)]).astype(int))
        held.append(np.arange(len(idx) + fill) >= len(idx))
    if not take:
        return prior_ops
    sub = table_.iloc[np.concatenate(take)].reset_index(drop=True)
    held = np.concatenate(held)
    data = kernel_data(sub, gpu, held, settings)
    fitted = fit_kernels(data, settings, prior=with_default_variants(prior_ops, data),
                         init=prior_ops or None)
    add_curves(fitted, sub, ~held, gpu)                              # as roofcal fit does
    return {**prior_ops, **fitted}


def draw_rows(table_: pd.DataFrame, pool: np.ndarray, n: int, seed: int, draw: str,
              gpu: GPUSpec) -> dict:
    """{kind/variant: row indices}: ``n`` rows per kind/variant from ``pool``, drawn at random
    (``draw`` = ``"random"``, :func:`sample_rows`) or spread over the box of shapes, farthest
    first (``"spread"``, :func:`roofcal.transfer.design.spread_rows`, as ``roofcal gpu plan``)."""
    if draw == "random":
        return sample_rows(table_, pool, n, seed)
    if draw == "spread":
        from roofcal.transfer.design import spread_rows
        return spread_rows(table_, gpu, n, seed, pool)
    raise ValueError(f"unknown draw {draw!r}")


def learning_curve(ref: Coefficients, ref_gpu: GPUSpec, new_gpu: GPUSpec,
                   table_: pd.DataFrame | None = None, sizes=SIZES, kappas=(FEW_SHOT_KAPPA,),
                   seed: int = 0, scratch: bool = True, rule: str = DEFAULT_RULE,
                   draw: str = "random") -> pd.DataFrame:
    """Held-out per-op MAPE (%) of ``new_gpu`` after zero shot and after refits on ``sizes`` rows
    (drawn as :func:`draw_rows` ``draw`` says).

    Columns: ``rows`` (0 = zero shot), ``kappa`` (NaN for zero shot; ``scratch`` = no prior,
    the default physical one), then one column per kind/variant.
    """
    table_ = microbench_table(new_gpu.name) if table_ is None else table_
    test = heldout_split(table_, seed)
    held = table_[test]
    prior = roundtrip(bootstrap(ref, ref_gpu, new_gpu, rule))
    step = {"step": K.neutral_step_params()}
    rows = [{"rows": 0, "prior κ": "zero shot", **per_op_mape(held, prior.params, new_gpu)}]
    for n in sizes:
        sample = draw_rows(table_, ~test, n, seed + n, draw, new_gpu)
        for kappa in kappas:
            ops = refit(table_, sample, prior, new_gpu, kappa)
            label = "/".join(f"{k:g}" for k in kappa) if isinstance(kappa, tuple) else f"{kappa:g}"
            rows.append({"rows": n, "prior κ": label,
                         **per_op_mape(held, {"ops": ops, **step}, new_gpu)})
        if scratch:
            ops = refit(table_, sample, None, new_gpu, 0.01)
            rows.append({"rows": n, "prior κ": "no prior",
                         **per_op_mape(held, {"ops": ops, **step}, new_gpu)})
    df = pd.DataFrame(rows)
    keys = [c for c in df.columns if "/" in c]
    df["mean"] = df[keys].mean(axis=1)
    return df


# --------------------------------------------------------------------------------------------
# report

def markdown(df: pd.DataFrame, index: str | None = None) -> str:
    """A DataFrame as a Markdown table (2 decimals)."""
    d = df.reset_index() if index else df
    return table(d.to_dict("records"), [str(c) for c in d.columns])


def report(h100: Coefficients, a100: Coefficients, seed: int = 0) -> list[tuple[str, str]]:
    """(title, Markdown) sections: zero shot both ways (every rule), then the A100 learning curve,
    on the kernel kinds a TP deployment runs (:func:`roofcal.bench.gpus.tp_kinds`)."""
    from roofcal.bench.gpus import tp_kinds
    from roofcal.model.coeffs import with_kernels
    from roofcal.transfer.bands import common_kernels
    H, A = load_gpu("h100_sxm"), load_gpu("a100_sxm")
    ks = common_kernels(h100, a100)               # one kernel library on both GPUs
    h100, a100 = with_kernels(h100, ks), with_kernels(a100, ks)
    a_tab, h_tab = tp_kinds(microbench_table(A.name, ks)), tp_kinds(microbench_table(H.name, ks))
    out = [
        ("Zero-shot transfer: A100 from the H100 fit (per-op MAPE % on all A100 rows)",
         markdown(zero_shot(h100, a100, H, A, a_tab), "method")),
        ("Zero-shot transfer: H100 from the A100 fit (per-op MAPE % on all H100 rows; variants "
         "the A100 lacks fall back to bf16)", markdown(zero_shot(a100, h100, A, H, h_tab), "method")),
        (f"Few-shot learning curve: held-out A100 per-op MAPE % (roofcal fit --prior: bootstrap "
         f"'{DEFAULT_RULE}' from H100, κ = {FEW_SHOT_KAPPA:g} pseudo-rows, held (terms / rows)² "
         f"harder on a degree whose terms outnumber the rows, surfaces anchored to the prior's "
         f"over the box of shapes ({ANCHOR:g} pseudo-row per term and row), started at the "
         f"prior's surface below {WARM_ROWS_PER_TERM:g} rows per term, a main fit centred on the "
         f"prior from {MAIN_ROWS_PER_TERM:g}, between them whichever of the two, by continuation "
         f"in degree, predicts a fifth of the rows set aside the closer, "
         f"{FitSettings.kernel_iters} L-BFGS iterations per degree stage; 'no prior' = fit "
         f"from scratch; the all-reduce tables have 55 training rows, so their curve stops there)",
         markdown(learning_curve(h100, H, A, a_tab, seed=seed))),
    ]
    return out

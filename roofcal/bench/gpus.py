"""Leave one GPU out: how well a GPU nobody measured is predicted from the GPUs that were.

For each GPU with per-op tables of one kernel library (A100, H100 and L40S under vLLM 0.14.0), the
others are fitted on all their rows and carried to it with ``roofcal gpu bootstrap`` (rule
``sm``); every row of the left-out GPU is then predicted, and the per-op MAPE (%) is reported per
kernel kind/variant beside the neutral roofline:

* ``from <gpu>``: the bootstrap from one source fit, as ``gpu bootstrap --from`` makes it;
* ``geometric mean of the others``: the geometric mean of those single-source predictions, the
  simplest pooling of several GPUs (a benchmark figure: the bootstrap takes one source);
* few shot: the bootstrap from each source refitted on 30, 100 and 300 of the left-out GPU's rows
  per kernel (:func:`roofcal.bench.transfer.learning_curve`, 20 % held out, seed 0), drawn at
  random and spread over the box of shapes (:mod:`roofcal.transfer.design`, ``gpu plan``).

Every GPU is fitted here on its vLLM 0.14.0 and NCCL tables as ``roofcal fit`` would (seed 0,
20 % held out; rows timed faster than the GPU's fastest tensor peak left out as they are read,
:func:`roofcal.measurements.datasets.load`): the A100's and H100's bundled tables, the L40S's in
``../shared/data/microbench/l40s`` (Apache-2.0, not bundled). Without those the benchmark covers
the A100 and H100 alone.

``python -m roofcal.bench.gpus [--out FILE] [--few-shot] [--write-expectations]``: the last
rewrites ``coeffs/zero_shot.yaml`` (:mod:`roofcal.transfer.expectation`), the measured zero-shot
error per pair of GPUs that ``gpu bootstrap`` quotes, and its few-shot error on 300 spread rows
(so it runs the few-shot refits too). Deterministic for a given seed.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from roofcal import resources
from roofcal.bench import emit
from roofcal.measurements import datasets
from roofcal.metrics import mape
from roofcal.model import correction as K
from roofcal.model.coeffs import roundtrip, with_kernels
from roofcal.model.predict import predict_table
from roofcal.physics.hardware import load_gpu
from roofcal.physics.kernels import groups
from roofcal.transfer.bootstrap import DEFAULT_RULE, bootstrap

#: the kernel library every GPU's tables share
KERNELS = "vllm-0.14.0"
#: per-op tables beside the project (not bundled), by GPU
SHARED_TABLES = {"l40s": resources.ROOT.parent / "shared" / "data" / "microbench" / "l40s"}


def table_paths(gpu: str) -> list[Path]:
    """The ``KERNELS`` and NCCL tables of a GPU: bundled, else beside the project ([] if absent)."""
    if gpu in datasets.BUNDLED:
        return [p for p in datasets.bundled_paths(gpu)
                if p.name in (KERNELS,) or p.name.startswith("nccl-")]
    root = SHARED_TABLES.get(gpu)
    if root is None or not (root / KERNELS).is_dir():
        return []
    return [root / KERNELS] + sorted(root.glob("nccl-*"))


def gpus_with_tables() -> list[str]:
    """The GPUs this benchmark can leave out, sorted."""
    return sorted(g for g in {*datasets.BUNDLED, *SHARED_TABLES} if table_paths(g))


def fitted(gpu: str, table: pd.DataFrame, seed: int = 0):
    """A GPU's kernel fit on its rows of ``KERNELS`` and NCCL (``roofcal fit``'s settings)."""
    spec = load_gpu(gpu)
    from roofcal.calibration.fit import FitSettings, fit
    res = fit(spec, table, [], FitSettings(seed=seed, progress=False))
    return with_kernels(res.coeffs, KERNELS)


def tp_kinds(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of the kinds a TP deployment runs (the NCCL all-gather, reduce-scatter and
    all-to-all of data- and expert-parallel deployments are not part of this benchmark yet)."""
    from roofcal.physics.components.comm import COLLECTIVES
    return table[~table["op"].isin(COLLECTIVES)].reset_index(drop=True)


def per_kind(table: pd.DataFrame, pred: np.ndarray) -> dict:
    """{kind/variant: MAPE %} of predictions ``pred`` of every row of ``table``."""
    y = table["latency_us"].to_numpy()
    return {K.op_key(op, dt): mape(pred[idx], y[idx]) for _, op, dt, idx in groups(table)}


def zero_shot(tables: dict, fits: dict) -> pd.DataFrame:
    """Rows (left-out GPU, method) × columns kind/variant, plus ``mean`` over the GPU's kinds."""
    rows = []
    for target, tab in tables.items():
        spec = load_gpu(target)
        preds = {"neutral roofline": predict_table(tab, K.neutral_params(), spec)["predicted_us"].to_numpy()}
        for src, c in fits.items():
            if src == target:
                continue
            b = roundtrip(bootstrap(c, load_gpu(src), spec, DEFAULT_RULE))
            preds[f"from {src}"] = predict_table(tab, b.params, spec)["predicted_us"].to_numpy()
        single = [v for k, v in preds.items() if k.startswith("from ")]
        if len(single) > 1:
            preds["geometric mean of the others"] = np.exp(np.mean(np.log(single), axis=0))
        for method, p in preds.items():
            kinds = per_kind(tab, p)
            rows.append({"left out": target, "method": method, **kinds,
                         "mean": float(np.mean(list(kinds.values())))})
    df = pd.DataFrame(rows)
    kinds = sorted(c for c in df.columns if "/" in c)
    return df[["left out", "method", "mean", *kinds]]


#: how the few-shot rows are drawn (:func:`roofcal.bench.transfer.draw_rows`)
DRAWS = ("random", "spread")


def few_shot(tables: dict, fits: dict, sizes=(30, 100, 300), seed: int = 0,
             draws=DRAWS) -> pd.DataFrame:
    """Held-out per-op MAPE (%) of each left-out GPU refitted on ``sizes`` rows per kernel with
    the bootstrap from each other GPU as prior (:func:`roofcal.bench.transfer.learning_curve`),
    the rows drawn at random and spread over the box of shapes (``roofcal gpu plan``)."""
    from roofcal.bench.transfer import learning_curve
    out = []
    for target, tab in tables.items():
        for src, c in fits.items():
            if src == target:
                continue
            for draw in draws:
                df = learning_curve(c, load_gpu(src), load_gpu(target), tab, sizes=sizes,
                                    seed=seed, scratch=False, draw=draw)
                if draw != draws[0]:
                    df = df[df["rows"] > 0]                 # the zero shot once
                df.insert(0, "left out", target)
                df.insert(1, "prior", f"bootstrap from {src}")
                df.insert(2, "rows drawn", np.where(df["rows"] > 0, draw, "—"))
                out.append(df.drop(columns=["prior κ"]))
    return pd.concat(out, ignore_index=True)


def expectations_doc(zs: pd.DataFrame, fs: pd.DataFrame | None = None) -> dict:
    """The zero-shot document (:data:`roofcal.transfer.expectation.SCHEMA`) of a
    :func:`zero_shot` table: per (source, left-out GPU) pair, the MAPE per kind/variant; with a
    :func:`few_shot` table, each pair's mean held-out MAPE refitted on its most rows spread over
    the box of shapes (``few_shot``: rows, draw, mean)."""
    from roofcal.transfer.expectation import SCHEMA
    pairs = []
    for r in zs.to_dict("records"):
        if not r["method"].startswith("from "):
            continue
        src, dst = load_gpu(r["method"][5:]), load_gpu(r["left out"])
        kinds = {k: round(float(v), 1) for k, v in r.items() if "/" in k and np.isfinite(v)}
        pair = {"from": src.name, "to": dst.name, "from_memory": src.memory_kind,
                "to_memory": dst.memory_kind, "mean": round(float(r["mean"]), 1), "kinds": kinds}
        if fs is not None:
            mine = fs[(fs["left out"] == r["left out"]) & (fs["prior"] == f"bootstrap from {src.name}")
                      & (fs["rows drawn"] == "spread")]
            if len(mine):
                top = mine[mine["rows"] == mine["rows"].max()].iloc[0]
                pair["few_shot"] = {"rows": int(top["rows"]), "draw": "spread",
                                    "mean": round(float(top["mean"]), 1)}
        pairs.append(pair)
    return {"schema": SCHEMA, "kernels": KERNELS, "rule": DEFAULT_RULE,
            "method": "per-op MAPE % on every row of the target GPU's tables, the source GPU "
                      "fitted on all its rows and bootstrapped (python -m roofcal.bench.gpus)",
            "pairs": pairs}


def markdown(df: pd.DataFrame) -> str:
    from roofcal.tables import table
    cols = [str(c) for c in df.columns]
    recs = [{k: ("—" if isinstance(v, float) and not np.isfinite(v) else
                 f"{v:.1f}" if isinstance(v, float) else v) for k, v in r.items()}
            for r in df.to_dict("records")]
    return table(recs, cols)


def run(out: str | None = None, few: bool = False, seed: int = 0, expectations: bool = False) -> str:
    """The benchmark as Markdown (printed; written to ``out`` when given)."""
    gpus = gpus_with_tables()
    tables = {g: tp_kinds(datasets.load(table_paths(g), gpu=load_gpu(g)).ops) for g in gpus}
    fits = {g: fitted(g, tables[g], seed) for g in gpus}
    zs = zero_shot(tables, fits)
    few = few or expectations              # the file holds each pair's few-shot error too
    fs = few_shot(tables, fits, seed=seed) if few else None
    if expectations:
        from roofcal.transfer.expectation import DEFAULT_PATH, write
        write(expectations_doc(zs, fs), DEFAULT_PATH)
    text = [f"### Leave one GPU out, zero shot: per-op MAPE % on every row of the left-out GPU "
            f"({KERNELS} and NCCL tables; each other GPU fitted on all its rows and bootstrapped, "
            f"rule '{DEFAULT_RULE}'; 'mean': over the left-out GPU's kinds/variants)", "",
            markdown(zs), ""]
    if few:
        text += [f"### Leave one GPU out, few shot: held-out per-op MAPE % (20 % of the left-out "
                 f"GPU's rows held out, seed {seed}; refitted on 30 / 100 / 300 rows per kernel "
                 f"with the bootstrap as prior, as roofcal fit --prior; the rows drawn at random "
                 f"from the rest, or spread over the box of shapes as roofcal gpu plan takes "
                 f"them)", "", markdown(fs), ""]
    return emit("\n".join(text), out)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m roofcal.bench.gpus", description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="also write the Markdown tables to this file")
    ap.add_argument("--few-shot", action="store_true", help="also the few-shot refits (minutes)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--write-expectations", action="store_true",
                    help="rewrite coeffs/zero_shot.yaml, the errors gpu bootstrap quotes "
                         "(runs the few-shot refits too)")
    a = ap.parse_args(argv)
    run(a.out, a.few_shot, a.seed, a.write_expectations)


if __name__ == "__main__":
    main()

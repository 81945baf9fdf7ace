"""Workload-level validation: BLIS replays of measured serving runs against what was measured.

In: experiments (:func:`roofcal.measurements.workload.read_experiments`), :class:`~.run.BlisSettings`,
and the coefficients to replay with — BLIS's own ``defaults.yaml``, one ``defaults.yaml`` per
deployment (what ``roofcal export blis --out-dir`` writes), or α/β flags.
Out: :class:`Validation` — one row per (experiment, scope) with measured and simulated mean E2E,
TTFT and ITL (ms) and the signed error 100 · (sim − measured) / measured (%); the MAPE over the
summary rows of the runs that are not overloaded (failure rate < 10 %: reported, not scored —
inference-sim's validation rule) and how many of them have all three within 10 %.
ITL on both sides is (E2E − TTFT) / (generated tokens − 1). Beside the means, the 1st percentile
of E2E (``e2e_p1``, not scored): the fastest requests, which on a run that overloads are the ones
served before its queue built — whether the simulated server is too fast already there, or only
once it saturates.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Sequence

import pandas as pd

from roofcal.blis.run import BlisSettings, SimResult, run_experiments
from roofcal.measurements.workload import Experiment

METRICS = ("e2e", "ttft", "itl")
#: a run counts as reproduced when E2E, TTFT and ITL are all within this many % of measurement
WITHIN_PCT = 10.0
COLUMNS = (["experiment", "scope", "model", "tp", "overload"]
           + [f"measured_{m}_ms" for m in METRICS] + [f"sim_{m}_ms" for m in METRICS]
           + [f"err_{m}_pct" for m in METRICS]
           + ["measured_e2e_p1_ms", "sim_e2e_p1_ms", "err_e2e_p1_pct"]
           + ["sim_duration_s", "wall_s", "replay", "sim_completed"])


@dataclass(frozen=True, eq=False)
class Validation:
    """``table``: one row per (experiment, scope), columns :data:`COLUMNS`; ``mape``: {e2e, ttft,
    itl} mean |err| (%) over the summary rows of non-overload runs (NaN if there are none);
    ``within``: how many of those have all three |err| ≤ 10 %; ``results``: the BLIS replays, in
    experiment order; ``wall_s``: wall-clock time of it all."""

    table: pd.DataFrame
    mape: dict[str, float]
    within: int
    results: tuple[SimResult, ...]
    replay: str
    wall_s: float

    @property
    def scored(self) -> int:
        """How many runs the MAPE is over."""
        s = self.table[(self.table["scope"] == "summary") & ~self.table["overload"]]
        return len(s)


def _err(sim: float, meas: float) -> float:
    if not (math.isfinite(sim) and math.isfinite(meas)) or meas == 0:
        return float("nan")
    return 100.0 * (sim - meas) / meas


def validation_table(exps: Sequence[Experiment], results: Sequence[SimResult]) -> pd.DataFrame:
    """The per-(experiment, scope) comparison table of :class:`Validation`."""
    rows = []
    for exp, res in zip(exps, results):
        for scope in exp.scopes:
            meas, sim = exp.truth[scope], res.scopes[scope]
            row = {"experiment": exp.name, "scope": scope, "model": exp.model_id, "tp": exp.tp,
                   "overload": exp.overload}
            for m in METRICS:
                row[f"measured_{m}_ms"] = getattr(meas, f"{m}_ms")
                row[f"sim_{m}_ms"] = getattr(sim, f"{m}_ms")
            for m in METRICS:
                row[f"err_{m}_pct"] = _err(row[f"sim_{m}_ms"], row[f"measured_{m}_ms"])
            row.update(measured_e2e_p1_ms=meas.e2e_p1_ms, sim_e2e_p1_ms=sim.e2e_p1_ms,
                       err_e2e_p1_pct=_err(sim.e2e_p1_ms, meas.e2e_p1_ms))
            row.update(sim_duration_s=res.sim_duration_s, wall_s=res.wall_s, replay=res.replay,
                       sim_completed=sim.completed)
            rows.append(row)
    return pd.DataFrame(rows, columns=COLUMNS)


def _scored(table: pd.DataFrame) -> pd.DataFrame:
    return table[(table["scope"] == "summary") & ~table["overload"].astype(bool)]


def mape(table: pd.DataFrame) -> dict[str, float]:
    """{e2e, ttft, itl}: mean |err_*_pct| over the summary rows of non-overload runs."""
    s = _scored(table)
    return {m: float(s[f"err_{m}_pct"].abs().mean()) if len(s) else float("nan") for m in METRICS}


def within_10_count(table: pd.DataFrame) -> int:
    """Non-overload runs whose E2E, TTFT and ITL errors are all within ±10 %."""
    s = _scored(table)
    ok = pd.concat([s[f"err_{m}_pct"].abs() <= WITHIN_PCT for m in METRICS], axis=1).all(axis=1)
    return int(ok.sum())


def validate(exps: Sequence[Experiment], settings: BlisSettings, alpha=None, beta=None, progress: bool = True,
             keep: str | os.PathLike | None = None, defaults=None) -> Validation:
    """Replay every experiment in BLIS (:func:`~.run.run_experiments`; ``alpha``, ``beta`` and
    ``defaults`` one value or {run: value}) and compare with measurement."""
    exps = list(exps)
    t0 = time.perf_counter()
    results = run_experiments(exps, settings, alpha, beta, progress=progress, keep=keep, defaults=defaults)
    return validation_of(exps, results, settings, time.perf_counter() - t0)


def validation_of(exps: Sequence[Experiment], results: Sequence[SimResult], settings: BlisSettings,
                  wall_s: float) -> Validation:
    """The :class:`Validation` of replays already run (``results``, in the order of ``exps``)."""
    table = validation_table(exps, results)
    return Validation(table=table, mape=mape(table), within=within_10_count(table), results=tuple(results),
                      replay=settings.description, wall_s=wall_s)


def summary_line(v: Validation) -> str:
    """MAPE and the count of runs with all three within 10 %, one line."""
    m = v.mape
    return (f"MAPE over {v.scored} non-overload runs: E2E {m['e2e']:.1f} %, TTFT {m['ttft']:.1f} %, "
            f"ITL {m['itl']:.1f} %; all three within 10 % on {v.within} of {v.scored}")


def validation_text(v: Validation) -> str:
    """Markdown: the summary rows, the MAPE line, then the per-stage rows."""
    from roofcal.tables import table

    def rows(frame):
        out = []
        for r in frame.to_dict("records"):
            row = {"experiment": r["experiment"] + (" (overload)" if r["overload"] else ""),
                   "scope": r["scope"], "TP": r["tp"]}
            for m, label in zip(METRICS, ("E2E", "TTFT", "ITL")):
                row[f"{label} meas"] = r[f"measured_{m}_ms"]
                row[f"{label} sim"] = r[f"sim_{m}_ms"]
                row[f"{label} err %"] = r[f"err_{m}_pct"]
            row.update({"E2E p1 err %": r["err_e2e_p1_pct"], "sim s": r["sim_duration_s"], "BLIS s": r["wall_s"]})
            out.append(row)
        return out

    t = v.table
    summary = t[t["scope"] == "summary"]
    stages = t[t["scope"] != "summary"]
    metric_cols = [f"{label} {what}" for label in ("E2E", "TTFT", "ITL") for what in ("meas", "sim", "err %")]
    head = ["experiment", "TP", *metric_cols, "E2E p1 err %", "sim s", "BLIS s"]
    lines = [f"BLIS replay, {v.replay}: measured vs simulated means in ms "
             f"(err = 100·(sim − meas)/meas, signed; ITL = (E2E − TTFT)/(generated − 1); E2E p1: the fastest "
             f"1 % of requests, not scored; sim s = simulated duration)",
             "", table(rows(summary), head), "",
             summary_line(v) + f"  ({len(summary)} runs, {v.wall_s:.0f} s wall)"]
    if len(stages):
        lines += ["", "Per stage:", "", table(rows(stages), ["experiment", "scope", *metric_cols, "E2E p1 err %"])]
    return "\n".join(lines)


def write_validation_csv(v: Validation, path: str | os.PathLike) -> None:
    """Write :attr:`Validation.table` as CSV, atomically."""
    from roofcal.io import write_csv_atomic
    write_csv_atomic(v.table, path)

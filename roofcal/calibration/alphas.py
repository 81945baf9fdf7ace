"""BLIS's alphas from a server's own request journeys (``roofcal traces read`` tables).

BLIS adds three per-request times to what its steps cost (``docs/blis-latency-models.md`` §1.7):
α0 before a request reaches the scheduler's queue, α1 once after its last token (E2E only), and
α2 per output token on top of the step that produced it (TTFT and every ITL). From vLLM's
journey tracing (:mod:`roofcal.measurements.traces`), per request:

* α0 = QUEUED − ARRIVED (``queueing_us``: API ingestion, tokenisation, hand-off to the core);
* α1 = DEPARTED − FINISHED (the API's work after the core finished: detokenisation, response);
* α2 = the mean time per output token after the first, ``tpot_us``, less the mean *cycle time*
  of the steps that produced those tokens (first-token step, finished step], from the step
  context table: what a token costs beyond its step. Journey events are the scheduler's, so
  streaming work in the API process is not in it; without a context table α2 is not measured.

Each alpha is the mean over the finished requests that have the events it needs (aborted ones
left out); α2 below 0 (a token cheaper than its step: timing noise) is reported and used as 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from roofcal.errors import RoofcalError

#: request-table columns every alpha needs
REQUEST_NEEDS = ("source", "finish_status", "queueing_us", "tpot_us", "finished_ns", "departed_ns",
                 "first_token_step", "finished_step")
#: context-table columns α2 needs
CONTEXT_NEEDS = ("source", "step_id", "cycle_us")


@dataclass(frozen=True)
class Alphas:
    """BLIS's alphas in µs (``queueing_us`` α0, ``post_decode_us`` α1, ``output_token_us`` α2;
    None when not measured), how many requests each rests on, and α2 before clipping at 0."""

    queueing_us: float | None
    post_decode_us: float | None
    output_token_us: float | None
    counts: dict
    output_token_raw_us: float | None = None

    def as_dict(self) -> dict:
        return {"queueing_us": self.queueing_us, "post_decode_us": self.post_decode_us,
                "output_token_us": self.output_token_us}


def _read(path, needs, what: str) -> pd.DataFrame:
    try:
        df = pd.read_csv(path)
    except FileNotFoundError:
        raise RoofcalError(f"{path}: no such file")
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise RoofcalError(f"{path}: not a {what} CSV ({str(e).splitlines()[0]})")
    missing = [c for c in needs if c not in df.columns]
    if missing:
        raise RoofcalError(f"{path}: missing column '{missing[0]}' (a {what} CSV of 'roofcal traces read')")
    return df


def mean_cycle(context: pd.DataFrame, source, after, upto) -> np.ndarray:
    """Mean measured ``cycle_us`` over the steps with ids in (``after``, ``upto``] of trace
    ``source`` (arrays, one entry per request; NaN where none was measured). Vectorised with
    cumulative sums over each source's steps sorted by id."""
    out = np.full(len(after), np.nan)
    src = np.asarray(source, object)
    for s, ctx in context.groupby("source", sort=True):
        ctx = ctx.sort_values("step_id", kind="stable")
        ids = ctx["step_id"].to_numpy(np.int64)
        cyc = ctx["cycle_us"].to_numpy(np.float64)
        ok = np.isfinite(cyc)
        total = np.concatenate([[0.0], np.cumsum(np.where(ok, cyc, 0.0))])
        count = np.concatenate([[0], np.cumsum(ok)])
        mine = np.flatnonzero(src == s)
        lo = np.searchsorted(ids, np.asarray(after, np.float64)[mine], side="right")
        hi = np.searchsorted(ids, np.asarray(upto, np.float64)[mine], side="right")
        n = count[hi] - count[lo]
        out[mine] = np.where(n > 0, (total[hi] - total[lo]) / np.maximum(n, 1), np.nan)
    return out


def alphas_from_tables(requests: pd.DataFrame, context: pd.DataFrame | None = None) -> Alphas:
    """:class:`Alphas` from a requests table and (for α2) a step-context table."""
    fin = requests[requests["finish_status"].astype(str).str.lower() != "aborted"]
    q = fin["queueing_us"].to_numpy(np.float64)
    post = (fin["departed_ns"].to_numpy(np.float64) - fin["finished_ns"].to_numpy(np.float64)) / 1e3
    q, post = q[np.isfinite(q)], post[np.isfinite(post) & (post >= 0)]
    counts = {"requests": int(len(requests)), "finished": int(len(fin)), "queueing": int(len(q)),
              "post_decode": int(len(post)), "output_token": 0}
    a2 = raw = None
    if context is not None:
        cyc = mean_cycle(context, fin["source"].to_numpy(), fin["first_token_step"].to_numpy(np.float64),
                         fin["finished_step"].to_numpy(np.float64))
        d = fin["tpot_us"].to_numpy(np.float64) - cyc
        d = d[np.isfinite(d)]
        counts["output_token"] = int(len(d))
        if len(d):
            raw = float(np.mean(d))
            a2 = max(raw, 0.0)
    return Alphas(float(np.mean(q)) if len(q) else None, float(np.mean(post)) if len(post) else None,
                  a2, counts, raw)


def alphas_from_files(requests, context=None) -> Alphas:
    """:func:`alphas_from_tables` of CSV files (``requests``: one path or a list; ``context``
    likewise or None), each checked for the columns it needs."""
    rq = [requests] if isinstance(requests, (str, Path)) else list(requests)
    ct = [] if context is None else ([context] if isinstance(context, (str, Path)) else list(context))
    r = pd.concat([_read(p, REQUEST_NEEDS, "requests") for p in rq], ignore_index=True)
    c = pd.concat([_read(p, CONTEXT_NEEDS, "step context") for p in ct], ignore_index=True) if ct else None
    return alphas_from_tables(r, c)


def with_alphas(c, name: str, alphas: Alphas, files: list):
    """Coefficients ``c`` with stack ``name``'s alphas replaced by the measured ones (those not
    measured kept), their provenance (``files``: the tables read) added to its source."""
    from dataclasses import replace
    from roofcal.io import sha256_file
    from roofcal.model import coeffs as coeff_io
    if name not in c.stacks:
        raise RoofcalError(f"no serving stack {name!r} to give the measured alphas to")
    st = c.stacks[name]
    new = {k: (v if v is not None else st.alphas_us.get(k, 0.0)) for k, v in alphas.as_dict().items()}
    src = {**st.source, "alphas": {
        "rule": "alpha0 = mean QUEUED-ARRIVED, alpha1 = mean DEPARTED-FINISHED, alpha2 = mean "
                "tpot less the mean cycle of the request's decode steps (roofcal/calibration/alphas.py)",
        "measured": [k for k, v in alphas.as_dict().items() if v is not None],
        "requests": alphas.counts,
        "data": [{"path": str(p), "sha256": sha256_file(p)} for p in files]}}
    return coeff_io.add_stack(c, name, replace(st, alphas_us=new, source=src), default=(c.stack == name))

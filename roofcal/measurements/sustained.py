"""Sustained load against bursts: one GPU's layer GEMMs timed back to back while its SM clock and
power were sampled (what ``roofcal probe`` writes, and ``data/sustained/h100_sxm``).

A measurement folder holds:

* ``burst_*.csv`` — per-op rows (:mod:`roofcal.measurements.ops`' CSV: ``gpu, op, dtype, m, n,
  k, latency_us``, optional ``mode``: ``cold`` rows rotate weight copies beyond the L2, as inside
  a model): the model's GEMMs timed in bursts, as per-op tables are;
* ``sustained*.json`` — phases, each a "step" of those GEMMs over every layer (``ms``: the token
  counts of its GEMM stacks; else the digits after ``m`` in the phase's name) replayed back to
  back (``duty`` 1) or with as long an idle gap after each step (``duty`` 0.5): per 5-s window
  (``windows``: ``t`` s from the phase's start, ``n`` steps, ``step_ms`` their median) and
  ``flops`` per step; ``t_start`` (Unix s) when known, else the phases ran one after the other;
* ``smi_trace*.csv`` beside each JSON (``sustained2.json`` ↔ ``smi_trace2.csv``) — nvidia-smi's
  ``timestamp, clocks.sm, clocks.mem, power.draw, temperature.gpu`` every 200 ms (UTC).

:func:`read_sustained` reads a folder into :class:`Phase` records: the step time a phase holds
after :data:`SETTLE_S` (the power limiter and the die temperature settle within seconds), its
first steps, and the median SM clock and power of its samples over the same stretch.
"""

from __future__ import annotations

import csv
import json
import math
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from roofcal.errors import RoofcalError

#: seconds after a phase's start before its step time, clock and power count as sustained
SETTLE_S = 5.0
#: seconds before a phase's end whose samples are left out (the next phase's capture begins)
TAIL_S = 1.0


@dataclass(frozen=True)
class Phase:
    """One phase of a sustained measurement: a step of GEMM stacks at ``tokens`` (one entry per
    stack, e.g. (2048, 256)), busy ``duty`` of the time; ``step_ms`` its median step time after
    :data:`SETTLE_S`, ``first_ms`` the median of its first steps (NaN when not recorded);
    ``sm_clock_mhz`` and ``power_w`` the medians of nvidia-smi's samples over the same stretch
    (NaN without a trace; ``power.draw`` is a 1-s average, so with idle gaps it averages them in);
    ``busy_clock_mhz`` the median of the samples below 97 % of the highest clock seen (inside the
    busy stretches when the phase has idle gaps); ``flops`` per step; ``source`` the file."""

    name: str
    tokens: tuple
    duty: float
    step_ms: float
    first_ms: float
    sm_clock_mhz: float
    power_w: float
    samples: int
    flops: float
    source: str
    busy_clock_mhz: float = math.nan


@dataclass(frozen=True)
class Sustained:
    """A sustained measurement: its ``phases``, the per-op burst table (``burst``, a path), the
    model's GEMM shapes ``gemms`` ((n, k) per layer, in table order), ``layers``, the ``gpu`` named
    in the table, the idle power at the maximum clock (``idle_w``: the median of samples at the
    highest clock drawing under a quarter of the limit, NaN without them) and the highest SM clock
    sampled (``max_clock_mhz``)."""

    path: Path
    phases: tuple
    burst: Path
    gemms: tuple
    layers: int
    gpu: str
    idle_w: float
    max_clock_mhz: float


def _trace(path: Path) -> np.ndarray:
    """(time s since epoch, SM MHz, power W) rows of an nvidia-smi CSV trace."""
    rows = []
    try:
        with open(path, newline="", encoding="utf-8") as f:
            for i, row in enumerate(csv.reader(f), 1):
                if not row or row[0].startswith("timestamp"):
                    continue
                try:
                    t = datetime.strptime(row[0].strip(), "%Y/%m/%d %H:%M:%S.%f").replace(tzinfo=timezone.utc)
                    sm = float(row[1].split()[0])
                    pw = float(row[3].split()[0])
                except (ValueError, IndexError):
                    raise RoofcalError(f"{path}: line {i}: expected 'timestamp, clocks.sm MHz, clocks.mem MHz, "
                                       f"power.draw W, temperature' (nvidia-smi --format=csv,noheader)") from None
                rows.append((t.timestamp(), sm, pw))
    except FileNotFoundError:
        raise RoofcalError(f"{path}: no such nvidia-smi trace") from None
    if not rows:
        raise RoofcalError(f"{path}: no samples")
    return np.array(rows, np.float64)


def _tokens(name: str, d: dict, path: Path) -> tuple:
    if "ms" in d:
        ms = d["ms"]
    else:
        m = re.search(r"m(\d+)", name)
        if not m:
            raise RoofcalError(f"{path}: phase '{name}': no 'ms' field and no token count in its name")
        ms = [int(m.group(1))]
    if not isinstance(ms, list) or not ms or not all(isinstance(x, int) and x > 0 for x in ms):
        raise RoofcalError(f"{path}: phase '{name}': field 'ms' must list positive token counts")
    return tuple(ms)


def _phase_duration_s(d: dict) -> float:
    """A phase's length (s): its last window's start plus that window's steps."""
    w = d["windows"][-1]
    return float(w["t"]) + float(w["n"]) * float(w["step_ms"]) / 1e3 / max(float(d.get("duty", 1.0)), 1e-3)


def _phases(path: Path, trace: np.ndarray | None) -> list[Phase]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise RoofcalError(f"{path}: not a sustained-measurement JSON ({err})") from None
    if not isinstance(doc, dict) or not doc:
        raise RoofcalError(f"{path}: expected a mapping of phases")
    out = []
    busy = None
    if trace is not None:                        # the first busy sample: where chained phases start
        hot = np.flatnonzero(trace[:, 2] > 0.5 * trace[:, 2].max())
        busy = trace[hot[0], 0] if len(hot) else trace[0, 0]
    start = busy
    for name, d in doc.items():
        if not isinstance(d, dict) or not d.get("windows"):
            raise RoofcalError(f"{path}: phase '{name}': field 'windows' missing or empty")
        win = d["windows"]
        for i, w in enumerate(win):
            for key in ("t", "n", "step_ms"):
                v = w.get(key) if isinstance(w, dict) else None
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                    raise RoofcalError(f"{path}: phase '{name}': field 'windows[{i}].{key}' must be a number ≥ 0")
        t = np.array([w["t"] for w in win], np.float64)
        ms = np.array([w["step_ms"] for w in win], np.float64)
        n = np.array([w["n"] for w in win], np.float64)
        settled = (t >= SETTLE_S) & (n > 1)
        if not settled.any():
            settled = n > 0
        step = float(np.median(np.repeat(ms[settled], n[settled].astype(int))))
        first = d.get("first5")
        first_ms = float(np.median(first)) if isinstance(first, list) and first else math.nan
        t0 = float(d["t_start"]) if "t_start" in d else start
        duration = _phase_duration_s(d)
        clock = power = busy_clock = math.nan
        count = 0
        if trace is not None and t0 is not None:
            sel = (trace[:, 0] >= t0 + SETTLE_S) & (trace[:, 0] <= t0 + duration - TAIL_S)
            count = int(sel.sum())
            if count:
                clock, power = float(np.median(trace[sel, 1])), float(np.median(trace[sel, 2]))
                slow = sel & (trace[:, 1] < 0.97 * trace[:, 1].max())
                busy_clock = float(np.median(trace[slow, 1])) if slow.any() else clock
        out.append(Phase(str(name), _tokens(name, d, path), float(d.get("duty", 1.0)), step, first_ms, clock, power,
                         count, float(d.get("flops", math.nan)), path.name, busy_clock))
        if start is not None:
            start = t0 + duration
    return out


def read_sustained(folder) -> Sustained:
    """Read a sustained-measurement folder (module docstring)."""
    import pandas as pd
    folder = Path(folder)
    if not folder.is_dir():
        raise RoofcalError(f"{folder}: no such sustained-measurement folder")
    bursts = sorted(folder.glob("burst_*.csv"))
    if len(bursts) != 1:
        raise RoofcalError(f"{folder}: expected one burst_*.csv (per-op rows timed in bursts), found {len(bursts)}")
    df = pd.read_csv(bursts[0])
    for col in ("gpu", "op", "dtype", "m", "n", "k", "latency_us"):
        if col not in df.columns:
            raise RoofcalError(f"{bursts[0]}: column '{col}' missing")
    if "mode" in df.columns:
        df = df[df["mode"] == "cold"]
    first = df[df["m"] == df["m"].min()]
    gemms = tuple((int(n), int(k)) for n, k in zip(first["n"], first["k"]))
    phases, traces = [], []
    for js in sorted(folder.glob("sustained*.json")):
        tr_path = folder / js.name.replace("sustained", "smi_trace").replace(".json", ".csv")
        tr = _trace(tr_path) if tr_path.is_file() else None
        if tr is not None:
            traces.append(tr)
        phases += _phases(js, tr)
    if not phases:
        raise RoofcalError(f"{folder}: no sustained*.json phases")
    per_layer = 2.0 * sum(n * k for n, k in gemms)
    ph = next((p for p in phases if math.isfinite(p.flops)), None)
    layers = int(round(ph.flops / (per_layer * sum(ph.tokens)))) if ph else 1
    idle = top = math.nan
    if traces:
        all_ = np.concatenate(traces)
        top = float(all_[:, 1].max())
        quiet = (all_[:, 1] >= top) & (all_[:, 2] < 0.25 * all_[:, 2].max())
        idle = float(np.median(all_[quiet, 2])) if quiet.any() else math.nan
    return Sustained(folder, tuple(phases), bursts[0], gemms, layers, str(df["gpu"].iloc[0]), idle, top)

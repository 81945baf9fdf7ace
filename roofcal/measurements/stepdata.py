"""Whole-step measurements: step JSONL with ``duration_us`` and/or ``cycle_us``, and the bundled
splitwise table.

A :class:`StepData` is one deployment (model, GPU, TP) with its steps as a
:class:`~roofcal.physics.steps.StepBatch`, the measured times (``measured_us`` from
``duration_us``, ``cycle_us``; NaN where a step lacks one), each step's phase and a
*configuration* label (steps sharing one are held out together).

The splitwise table (Llama-2-70B on H100, TP 4 and 8) gives for each run ``prompt_time``, one
prefill iteration of ``batch_size`` prompts of ``prompt_size`` tokens, and ``token_time``, the mean
decode iteration while KV grows from ``prompt_size`` to ``prompt_size + token_size``. Step time is
affine in context, so the mean decode iteration is represented as one step at the mean context
``prompt_size + (token_size − 1)/2``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from roofcal.physics.config import ModelSpec, Parallel, check_tp, load_model
from roofcal.errors import RoofcalError
from roofcal.physics.steps import StepBatch, batch_steps, given_by, group_by_deployment, read_steps, uniform_steps

SPLITWISE_COLUMNS = {"model", "hardware", "prompt_size", "batch_size", "token_size",
                     "tensor_parallel", "prompt_time", "token_time"}
SPLITWISE_MODELS = {"llama2-70b": "llama-2-70b-hf"}
SPLITWISE_GPUS = {"h100-80gb": "h100_sxm", "a100-80gb": "a100_sxm"}


@dataclass
class StepData:
    """Measured steps of one deployment. Arrays have one entry per step."""

    model: ModelSpec
    gpu: str
    tp: int
    batch: StepBatch
    measured_us: np.ndarray
    phase: np.ndarray          # "prefill" / "decode" / "mixed"
    config: np.ndarray         # configuration label (hold-out group)
    source: str
    cycle_us: np.ndarray | None = None   # start to next start, µs (None: not measured)

    def __len__(self) -> int:
        return len(self.measured_us)

    @property
    def cycles(self) -> np.ndarray:
        """Measured cycle times, µs (NaN where not measured)."""
        return np.full(len(self), np.nan) if self.cycle_us is None else self.cycle_us

    def take(self, idx) -> "StepData":
        idx = np.asarray(idx)
        return StepData(self.model, self.gpu, self.tp, self.batch.take(idx), self.measured_us[idx],
                        self.phase[idx], self.config[idx], self.source,
                        None if self.cycle_us is None else self.cycle_us[idx])

    def describe(self) -> pd.DataFrame:
        """Per-step summary columns used by reports: phase, batch size, tokens, mean context."""
        b = self.batch
        n_pf = b.prefill_mask.sum(1)
        n_dc = b.decode_mask.sum(1)
        ctx = np.where(n_dc > 0, (b.decode_mask * b.decode_ctx).sum(1) / np.maximum(n_dc, 1), 0.0)
        new = (b.prefill_mask * b.prefill_new).sum(1)
        return pd.DataFrame({"model": self.model.name, "gpu": self.gpu, "tp": self.tp,
                             "phase": self.phase, "config": self.config, "batch_size": n_pf + n_dc,
                             "prefill_tokens": new, "decode_context": ctx,
                             "measured_us": self.measured_us, "cycle_us": self.cycles,
                             "source": self.source})


def read_splitwise(path: str | Path, source: str | None = None) -> list[StepData]:
    """Load a splitwise-sim profiling CSV as one :class:`StepData` per TP degree."""
    path = Path(path)
    source = source or str(path)
    try:
        df = pd.read_csv(path)
    except FileNotFoundError:
        raise RoofcalError(f"{path}: no such file")
    missing = SPLITWISE_COLUMNS - set(df.columns)
    if missing:
        raise RoofcalError(f"{path}: missing column '{sorted(missing)[0]}'")
    out = []
    for (mname, hw, tp), g in df.groupby(["model", "hardware", "tensor_parallel"], sort=True):
        if mname not in SPLITWISE_MODELS or hw not in SPLITWISE_GPUS:
            raise RoofcalError(f"{path}: unknown model/hardware {mname!r}/{hw!r}")
        model = load_model(SPLITWISE_MODELS[mname])
        check_tp(model, int(tp), f"{path}: tensor_parallel")
        for col in ("prompt_time", "token_time"):
            v = g[col].to_numpy(float)
            if not np.all(np.isfinite(v) & (v > 0)):
                raise RoofcalError(f"{path}: field '{col}' must be positive and finite")
        n = len(g)
        B = g["batch_size"].to_numpy(float)
        s = g["prompt_size"].to_numpy(float)
        gen = g["token_size"].to_numpy(float)
        zeros = np.zeros(n)
        batch = uniform_steps(np.concatenate([B, zeros]), np.concatenate([s, zeros + 1]),
                              np.zeros(2 * n), np.concatenate([zeros, B]),
                              np.concatenate([zeros, s + (gen - 1.0) / 2.0]))
        measured = np.concatenate([g["prompt_time"].to_numpy(float),
                                   g["token_time"].to_numpy(float)]) * 1000.0
        cfg = [f"tp{int(tp)}/p{int(a)}/b{int(b)}/g{int(c)}" for a, b, c in zip(s, B, gen)]
        out.append(StepData(model, SPLITWISE_GPUS[hw], int(tp), batch, measured,
                            np.array(["prefill"] * n + ["decode"] * n), np.array(cfg * 2), source))
    return out


def read_step_jsonl(path: str | Path, model=None, gpu=None, tp=None,
                    source: str | None = None) -> list[StepData]:
    """Load measured steps (rows need ``duration_us`` or ``cycle_us``), grouped by deployment."""
    steps = read_steps(path)
    for i, s in enumerate(steps):
        if s.duration_us is None and s.cycle_us is None:
            raise RoofcalError(f"{path}: step {i + 1} has neither 'duration_us' nor 'cycle_us' to fit")
    groups = group_by_deployment(steps, model, gpu, tp, str(path))
    out = []
    for (m, g, t, layout), idx in groups.items():
        if layout != Parallel():
            raise RoofcalError(f"{given_by(steps, idx, 'layout', str(path))}: a data- or "
                               f"expert-parallel step is predicted (roofcal predict), not fitted: "
                               f"fit the kernels, or TP steps")
        spec = load_model(m)
        check_tp(spec, int(t), given_by(steps, idx, "tp", str(path)))
        sel = [steps[i] for i in idx]
        from roofcal.physics.hardware import load_gpu
        nan = lambda v: np.nan if v is None else v
        cycles = np.array([nan(s.cycle_us) for s in sel], np.float64)
        out.append(StepData(spec, load_gpu(g).name, int(t), batch_steps(sel),
                            np.array([nan(s.duration_us) for s in sel], np.float64),
                            np.array([s.phase for s in sel]),
                            np.array([f"{source or path}#{i + 1}" for i in idx]),
                            source or str(path), cycles if np.isfinite(cycles).any() else None))
    return out

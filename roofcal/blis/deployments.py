"""Per-deployment export: BLIS coefficients for one deployment and the load it will serve.

BLIS's coefficients are global to a run of BLIS, and a real server's first-token delay follows
its own cycle (:mod:`roofcal.model.serving`), so roofcal exports one set per deployment (model,
TP, GPU):

* **betas** distilled for that deployment alone — steps sampled over its server's limits
  (:mod:`roofcal.blis.sampling`) and, when its runs are given, the steps of their steady states,
  half the weight each — predicted by the calibrated native model (:mod:`roofcal.blis.fit`);
* **alphas** from the serving stack when it was calibrated on request-level data (else kept from
  the input ``defaults.yaml``), with α0 = the stack's API ingestion + the cycles until a token
  leaves × *this deployment's* mean cycle (:func:`roofcal.model.serving.blis_alpha0`): the cycle
  of its runs' steady states (request-weighted over the stages the model does not predict to
  saturate — a saturated stage's queue BLIS simulates itself), or without runs a **nominal**
  cycle, the native step of :data:`NOMINAL_DECODES` decodes at :data:`NOMINAL_CONTEXT` tokens.

:func:`write_defaults` writes each set into its own copy of BLIS's ``defaults.yaml`` (only the
coefficient lines change, with a provenance comment), all files or none; :func:`usage` says which
file — or which ``--alpha-coeffs``/``--beta-coeffs`` flags — go with which ``blis`` command.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Sequence

import numpy as np

from roofcal import resources
from roofcal.blis.defaults_yaml import check_written, read_defaults_coefficients, read_text_exact, replace_coefficients
from roofcal.blis.fit import BlisFitSettings, Deployment, build_rows, fit_blis, resolve_deployment
from roofcal.blis.form import blis_flags, source_note, validate_export_coeffs
from roofcal.blis.hardware_json import hardware_for_gpu
from roofcal.blis.sampling import SamplerSettings
from roofcal.errors import RoofcalError
from roofcal.io import write_files_atomic
from roofcal.model.coeffs import ALPHAS, Coefficients, round_sig

#: the nominal load of a deployment exported without runs: decodes in a step, and their context
NOMINAL_DECODES = 32
NOMINAL_CONTEXT = 1024
#: the server limits of a deployment exported without runs: max_num_seqs and the token budget
NOMINAL_MAX_NUM_SEQS = 256
NOMINAL_BUDGET = 8192


@dataclass(frozen=True, eq=False)
class Target:
    """What to export for: a ``deployment`` (model config, TP), the name BLIS's ``--model`` takes,
    and the runs it will serve (may be empty: nominal load); ``left_out``: names of the
    deployment's runs not used, because they overloaded (their load is no steady state)."""

    deployment: Deployment
    blis_model: str
    experiments: tuple = ()
    name: str = ""            # file stem; default ``<model>-tp<T>``
    left_out: tuple = ()

    @property
    def stem(self) -> str:
        """File stem of its ``defaults.yaml``: ``name``, else ``<model>-tp<T>`` (``-dp<N>``, ``-ep``
        and the MoE comm backend after it where given)."""
        if self.name:
            return self.name
        m = self.deployment.model
        name = Path(m).parent.name if m.endswith("config.json") else Path(m).name
        return f"{name.lower()}-{self.deployment.label.replace(' ', '-')}"


def targets_for_experiments(exps, model_configs, per_run: bool = False) -> list[Target]:
    """One :class:`Target` per deployment of ``exps`` (model config, TP), its runs in input order;
    with ``per_run`` one per run (the deployment at that run's load, named after the run)."""
    from roofcal.blis.run import model_config_folder
    groups: dict[tuple, list] = {}
    ids: dict[tuple, str] = {}
    for e in exps:
        key = (str(model_config_folder(e, model_configs) / "config.json"), int(e.tp)) + ((e.name,) if per_run else ())
        groups.setdefault(key, []).append(e)
        ids.setdefault(key, e.model_id)
    return [Target(Deployment(k[0], k[1]), ids[k], tuple(v), k[2] if per_run else "") for k, v in groups.items()]


def targets_for_deployments(deps: Sequence[Deployment]) -> list[Target]:
    """Targets without runs (nominal load); BLIS's ``--model`` is the name given."""
    return [Target(d, d.model) for d in deps]


@dataclass(frozen=True, eq=False)
class DeploymentExport:
    """BLIS coefficients for the deployments of ``targets`` — one deployment (the per-deployment
    export) or several sharing one file (a global export) — and how they were made.
    ``first_token``: the first-token delay's parts (µs, :func:`roofcal.model.serving.first_token_parts`)
    and the cycle α0 carries; ``metrics``: the distillation's scores (:func:`roofcal.blis.fit.fit_blis`)."""

    targets: tuple
    hardware: str
    alpha: tuple
    beta: tuple
    alpha_source: str
    first_token: dict = field(default_factory=dict)
    metrics: dict = field(default_factory=dict)
    provenance: dict = field(default_factory=dict)
    #: per target, the KV blocks BLIS is told (``--total-kv-blocks``) where its own sizing would
    #: not hold (a data-parallel deployment: :func:`blis_kv_blocks`), else None
    kv_blocks: tuple = ()

    @property
    def target(self) -> Target:
        """The one target of a per-deployment export."""
        if len(self.targets) != 1:
            raise RoofcalError("a global export has several deployments")
        return self.targets[0]

    @property
    def flags(self) -> str:
        return blis_flags(self.alpha, self.beta)

    def covers(self, exp) -> bool:
        """Whether ``exp`` is one of the targets' runs, or — for targets of a deployment rather
        than of a run — of one of their deployments (BLIS model id, TP)."""
        return any(any(e.name == exp.name for e in t.experiments)
                   or (not t.name and t.blis_model == exp.model_id and int(t.deployment.tp) == int(exp.tp))
                   for t in self.targets)

    def distill_mape(self) -> float | None:
        """Held-out MAPE (%) of BLIS's form against the native model on the sampled steps."""
        return self.metrics.get("heldout", {}).get("distill", {}).get("all", {}).get("blis_mape")


#: relative weight of the sources of a per-deployment distillation when its runs are given: the
#: generic samples, the runs' steady-state steps (``measured``, weighted by occupancy) and the
#: deployment's limit steps (``saturated``: :func:`mixes`), more than the steady-state ones — at
#: the knee a few % of step time move latency by a factor. The samples cover steps neither does
#: (first prefills, odd batches); at 0.05–0.1 they still hold those within a few % while the
#: BLIS basis spends itself on the steps the server runs — on Mixtral-8x7B TP 2, whose native
#: decode reads only the experts a small batch touches (which BLIS's basis cannot express), the
#: weighted error on its own steps was 3.8 % at 0.2, 2.1 % at 0.1. Scanned on the bundled runs
#: (export vs native on the light / saturated mix, Llama-2-7B, Llama-2-70B, Mixtral): 0.1 / 0.45 /
#: 0.45 gave 2.8/3.5, 1.8/3.0, 39/4.0 %; 0.05 / 0.35 / 0.6 gives 2.8/3.5, 1.8/2.8, 40/2.9 %;
#: heavier saturated weights no better (again with the 2026-11-24 file: 0.05 / 0.2 / 0.75,
#: 0.05 / 0.1 / 0.85 and 0.1 / 0.2 / 0.7 leave Llama-2-7B's saturated mix at 3.3 % and take
#: Mixtral's from 2.5 to 3.7–5.5 %: the 7B's mixed steps are 3–6 % short in BLIS's additive basis,
#: where decode compute is hidden behind the weights in decode-only steps but not in mixed ones).
SOURCE_WEIGHTS = (("distill", 0.05), ("measured", 0.35), ("saturated", 0.6))
#: without runs: the generic samples and the limit steps at the nominal load
NOMINAL_SOURCE_WEIGHTS = (("distill", 0.55), ("saturated", 0.45))
#: floor of a steady-state step's weight, relative to the most frequent one (keeps every
#: occupancy in the fit)
WEIGHT_FLOOR = 1e-3


def occupancy_weights(decodes: np.ndarray, mixed: np.ndarray, states: Sequence[dict],
                      requests: Sequence[float]) -> np.ndarray:
    """How often a server runs each step (relative): a step with ``decodes`` running decodes is
    weighted by the Poisson probability of that many under each stage's mean (the concurrency of
    an M/G/∞ system), times the stage's share of mixed steps (``f``) or decode-only steps
    (1 − f), summed over the stages weighted by their ``requests``; floored at
    :data:`WEIGHT_FLOOR` of the largest."""
    from math import lgamma, log
    k = np.asarray(decodes, np.float64)
    lgk = np.array([lgamma(x + 1.0) for x in k])
    out = np.zeros(len(k))
    for st, n in zip(states, requests):
        lam = max(float(st["running"]), 1e-9)
        pmf = np.exp(k * log(lam) - lam - lgk)
        f = float(np.clip(st["mixed_fraction"], 0.0, 1.0))
        out += n * pmf * np.where(mixed, f, 1.0 - f)
    out = out / out.max() if out.max() > 0 else np.ones(len(k))
    return np.maximum(out, WEIGHT_FLOOR)


def workload_steps(coeffs: Coefficients, exps, config: str, tp: int, seed: int = 42) -> tuple[list, list]:
    """The steps of the runs' steady states (:func:`roofcal.model.serving.step_grid`, the empty
    step dropped) with the native model's times as targets — the batch mix the export must get
    right — as :class:`~roofcal.measurements.stepdata.StepData` per run, and each step's weight
    (:func:`occupancy_weights` at the stack's steady state of each stage)."""
    import jax.numpy as jnp

    from roofcal.measurements.stepdata import StepData
    from roofcal.model.combine import step_breakdown
    from roofcal.model.serving import loads_of, run_state, step_grid
    from roofcal.physics.config import load_model
    from roofcal.physics.hardware import load_gpu
    gpu = load_gpu(coeffs.gpu)
    spec = load_model(config)
    alphas = jnp.asarray(_stack_alphas(coeffs), jnp.float32)
    out, weights = [], []
    for e in exps:
        loads = loads_of(e, seed)
        grid = step_grid(loads[0])                # the stages of a run share their prompts
        grid = grid.take(np.arange(1, grid.num_steps))
        pred = np.asarray(step_breakdown(coeffs.params, spec, gpu, int(tp), grid)["total"], np.float64)
        mixed = np.asarray(grid.prefill_mask).sum(1) > 0
        phase = np.where(mixed, "mixed", "decode")
        out.append(StepData(spec, gpu.name, int(tp), grid, pred, phase,
                            np.array([f"{e.name}#{k}" for k in range(len(pred))]), f"{e.name} (steady-state steps)"))
        states = [run_state(coeffs.params, spec, gpu, int(tp), [ld], [step_grid(ld)], alphas) for ld in loads]
        weights.append(occupancy_weights(np.asarray(grid.decode_mask).sum(1), mixed,
                                         [{"running": float(m["running"]), "mixed_fraction": float(m["mixed_fraction"])}
                                          for m in states], [ld.requests for ld in loads]))
    return out, weights


def mixes(coeffs: Coefficients, target: Target, seed: int = 42) -> dict:
    """The step mixes an export is checked on, as :class:`~roofcal.measurements.stepdata.StepData`
    with the native model's times as targets: ``light`` — 1–16 decodes and lone prefills at the
    workload's context — and ``saturated`` — the deployment at its limit: as many decodes as
    max_num_seqs and the KV cache allow (at half, once and twice the workload's context), alone
    and with the rest of the token budget prefilling, in one chunk or two, over the prefixes its
    requests bring (none — a first use — and the workload's cached prefix; without runs none,
    1,024 and 4,096 tokens). The workload (context = prompt + output/2, prompt and cached prefix,
    max_num_seqs, token budget) is its runs' (request-weighted), else nominal: a 1,024-token
    prompt and context, max_num_seqs 256, a budget of 8,192 tokens."""
    from roofcal.measurements.stepdata import StepData
    from roofcal.model.combine import step_breakdown
    from roofcal.model.domain import context_limit
    from roofcal.model.serving import loads_of
    from roofcal.physics.capacity import capacity
    from roofcal.physics.hardware import load_gpu
    from roofcal.physics.steps import Step, batch_steps
    gpu = load_gpu(coeffs.gpu)
    spec = target.deployment.spec()
    tp, ranks = int(target.deployment.tp), target.deployment.ranks
    if target.experiments:
        loads = [ld for e in target.experiments for ld in loads_of(e, seed)]
        w = np.array([ld.requests for ld in loads])
        mean = lambda f: float(np.dot(w, [f(ld) for ld in loads]) / w.sum())
        ctx, prompt, cached = mean(lambda ld: ld.prompt + ld.output / 2), mean(lambda ld: ld.prompt), \
            mean(lambda ld: ld.cached)
        seqs = max(e.max_num_seqs for e in target.experiments)
        budget = max(e.max_num_batched_tokens for e in target.experiments)
        limit = min((e.max_model_len or 10 ** 9) for e in target.experiments)
        kv = min((e.server.kv_blocks or 10 ** 12) for e in target.experiments)
    else:
        ctx = prompt = float(NOMINAL_CONTEXT)
        cached, seqs, budget, limit, kv = 0.0, NOMINAL_MAX_NUM_SEQS, NOMINAL_BUDGET, 10 ** 9, 10 ** 12
    p, pc = int(round(prompt)), int(round(cached))
    prefixes = sorted({0, pc} if target.experiments else {0, 1024, 4096})
    limit = min(limit, context_limit(spec) or limit) - 1
    kv = min(kv, capacity(spec, gpu, tp, max_num_batched_tokens=budget, max_num_seqs=seqs).kv_blocks)
    # a data-parallel deployment's step holds all its ranks' sequences (:class:`Deployment`)
    seqs, budget, kv = ranks * seqs, ranks * budget, ranks * kv
    light, sat = [], []
    for c in sorted({max(16, min(int(round(ctx * x)), limit - 1)) for x in (0.5, 1.0, 2.0)}):
        light += [Step(decode=(c,) * d) for d in (1, 2, 4, 8, 16) if d <= seqs]
        d = int(min(seqs, kv // math.ceil((c + 1) / 16)))
        if d < 2:
            continue
        sat.append(Step(decode=(c,) * d))
        new = max(1, budget - (d - 1))
        for pre in prefixes:
            if pre + new <= limit:
                sat.append(Step(prefill=((new, pre),), decode=(c,) * (d - 1)))
        half = max(1, new // 2)
        if pc + half <= limit:
            sat.append(Step(prefill=((half, pc), (new - half, pc)), decode=(c,) * (d - 1)))
    light += [Step(prefill=((min(p, budget), 0),)), Step(prefill=((max(1, p - pc), pc),), decode=(int(ctx),) * 4)]
    out = {}
    for name, steps in (("light", light), ("saturated", sat)):
        if not steps:
            continue
        batch = batch_steps(steps)
        pred = np.asarray(step_breakdown(coeffs.params, spec, gpu, tp, batch)["total"], np.float64)
        phase = np.array(["decode" if not s.prefill else ("prefill" if not s.decode else "mixed") for s in steps])
        out[name] = StepData(spec, gpu.name, tp, batch, pred, phase,
                             np.array([f"{name}#{i}" for i in range(len(steps))]), f"{target.stem} ({name} mix)")
    return out


def mix_errors(exp: "DeploymentExport", coeffs: Coefficients, mix: dict, hw) -> dict:
    """Export-vs-native MAPE (%) of BLIS's integer step time on each mix of :func:`mixes`."""
    from roofcal.blis.basis import blis_step_time
    from roofcal.blis.fit import build_rows
    from roofcal.physics.hardware import load_gpu
    out = {}
    for name, d in mix.items():
        rows = build_rows(None, load_gpu(coeffs.gpu), [], BlisFitSettings(samples=0), [d], hw,
                          measured_split=(0.0, 0))
        r = rows["measured"]
        got = np.asarray(blis_step_time(r.basis, list(exp.beta)), np.float64)
        out[name] = float(np.mean(np.abs(got / r.target_us - 1.0)) * 100.0)
    return out


def _stack_alphas(coeffs: Coefficients) -> list[float]:
    st = coeffs.stacks.get(coeffs.stack) if coeffs.stack is not None else None
    return [float(st.alphas_us[n]) for n in ALPHAS] if st is not None else [0.0, 0.0, 0.0]


def stack_first_token_cycles(coeffs: Coefficients) -> float:
    """Cycles between a step and its tokens at the client recorded by the file's stack (0: none)."""
    st = coeffs.stacks.get(coeffs.stack) if coeffs.stack is not None else None
    return float(((st.source if st is not None else {}).get("first_token") or {}).get("cycles", 0.0))


def deployment_cycle(coeffs: Coefficients, target: Target, api_us: float, alphas, cycles: float,
                     seed: int = 42) -> dict:
    """The first-token delay of ``target`` at its runs' loads, or its nominal cycle without runs.

    The cycle α0 carries is the one that minimises the squared relative TTFT error over the runs
    as the steady state predicts them: each run's request-weighted mean cycle over its stages
    (those the steady state does not saturate — a saturated stage's queue BLIS simulates, and
    its TTFT the steady state cannot give; all of them if every one saturates), weighted by
    1 / (the run's predicted TTFT)² (each run counts alike, as in a MAPE over runs). Returns
    {``api_us``, ``cycle_us``, ``cycle_delay_us``, the parts of the first token's delay,
    ``load``: how the load was chosen}."""
    import jax.numpy as jnp

    from roofcal.model.combine import step_breakdown
    from roofcal.model.serving import first_token_parts, loads_of, run_state, step_grid
    from roofcal.physics.hardware import load_gpu
    from roofcal.physics.steps import Step, batch_steps
    gpu = load_gpu(coeffs.gpu)
    spec = target.deployment.spec()
    tp = int(target.deployment.tp)
    if not target.experiments:
        t = step_breakdown(coeffs.params, spec, gpu, tp,
                           batch_steps([Step(decode=(NOMINAL_CONTEXT,) * NOMINAL_DECODES)]))["total"]
        cyc = float(np.asarray(t)[0])
        return {"api_us": float(api_us), "cycle_us": cyc, "cycle_delay_us": cycles * cyc,
                "load": f"nominal: a step of {NOMINAL_DECODES} decodes at {NOMINAL_CONTEXT} tokens"}
    from roofcal.tables import count
    runs, stages_out, runs_out = [], 0, []
    for e in target.experiments:
        loads = loads_of(e, seed)
        states = [run_state(coeffs.params, spec, gpu, tp, [ld], [step_grid(ld)], jnp.asarray(alphas, jnp.float32),
                            cycles) for ld in loads]
        free = [ld for ld, m in zip(loads, states) if float(m["running"]) < ld.max_seqs - 0.5]
        if free:
            runs.append(first_token_parts(coeffs.params, spec, gpu, tp, free, alphas, cycles))
            stages_out += len(loads) - len(free)
        else:
            runs_out.append(e.name)
    total = len(target.experiments) + len(target.left_out)
    saturate = not runs
    if saturate:                               # every stage saturates: take them all
        runs = [first_token_parts(coeffs.params, spec, gpu, tp, loads_of(e, seed), alphas, cycles)
                for e in target.experiments]
        runs_out = []
    how = (f"{len(runs)} of {total} runs" if len(runs) < total else count(total, "runs")) \
        + f", {'its' if len(runs) == 1 else 'their'} stages' steady state" \
        + (" (every stage saturates)" if saturate else "") \
        + (", weighted by 1/TTFT²" if len(runs) > 1 else "")
    if target.left_out:
        how += f"; left out, overloaded when measured: {', '.join(target.left_out)}"
    if runs_out:
        how += f"; left out, every stage saturates in the steady state: {', '.join(runs_out)}"
    if stages_out:
        how += f"; {count(stages_out, 'saturated stages')} of the others left out"
    w = np.array([1.0 / r["ttft_us"] ** 2 for r in runs])
    w = w / w.sum()
    parts = {k: float(np.dot(w, [r[k] for r in runs])) for k in runs[0]}
    return {**parts, "cycle_us": parts["step_us"], "cycle_delay_us": cycles * parts["step_us"], "load": how}


@dataclass(frozen=True)
class Clock:
    """The clock an export is distilled at: ``compute_scale`` (how much longer compute-bound
    time runs than in the per-op bursts; 1 at the boost clock), the request-weighted mean over
    the ``stages`` it was taken from — (run, rate req/s, :class:`~roofcal.model.operating.
    OperatingPoint`) — and how it was chosen (``how``)."""

    compute_scale: float
    how: str
    stages: tuple = ()
    cycles: tuple = ()           # per stage, then the limit steps (rate NaN): (name, rate req/s, cycle µs at the
                                 # boost clock, at the clock that stream allows)

    def text(self) -> str:
        return self.how

    def cycles_text(self) -> str:
        """Each stage's steady-state cycle at the boost clock and at its own, side by side."""
        return "; ".join(f"{rate:g} req/s {b / 1e3:.1f} -> {c / 1e3:.1f} ms" if math.isfinite(rate)
                         else f"its limit steps {b / 1e3:.1f} -> {c / 1e3:.1f} ms (mean)" for _, rate, b, c in self.cycles)


def operating_clock(coeffs: Coefficients, targets: Sequence[Target], clock: str = "sustained",
                    seed: int = 42) -> Clock:
    """The operating point of the targets' load (:data:`roofcal.model.operating.CLOCKS`): with
    ``sustained``, each stage of their runs at the clock its steady-state stream allows the GPU
    under its power limit (:func:`roofcal.model.serving.operating_points`; without runs, the
    deployment's limit steps of :func:`mixes` as one stream), their compute scales averaged with
    the stages' requests as weights; with ``burst``, the per-op tables' boost clock."""
    import jax.numpy as jnp

    from roofcal.model.operating import operating_point, power_of
    from roofcal.model.serving import loads_of, operating_points, step_grid
    from roofcal.physics.hardware import load_gpu
    gpu = load_gpu(coeffs.gpu)
    pm = power_of(coeffs, gpu)
    if clock == "burst":
        return Clock(1.0, "burst clock (as the per-op tables were timed; --clock burst)")
    if pm is None:
        return Clock(1.0, f"burst clock (datasheet {gpu.name} gives no power limit)")
    from roofcal.model.combine import at_compute_scale, step_breakdown
    from roofcal.model.serving import run_state
    stages, weights, cycles = [], [], []
    alphas = jnp.asarray(_stack_alphas(coeffs), jnp.float32)
    ftc = stack_first_token_cycles(coeffs)
    for t in targets:
        spec, tp = t.deployment.spec(), int(t.deployment.tp)
        sat = mixes(coeffs, t, seed).get("saturated")
        limit = []
        if sat is not None:                  # the deployment at its limit, after its stages
            op = operating_point(pm, coeffs.params, spec, gpu, tp, sat.batch)
            mean = lambda p: float(np.mean(np.asarray(step_breakdown(p, spec, gpu, tp, sat.batch)["total"])))  # noqa: E731
            limit = [(t.stem, math.nan, mean(coeffs.params), mean(at_compute_scale(coeffs.params, op.compute_scale)))]
            if not t.experiments:            # without runs, its limit steps set the clock
                stages.append((t.stem, math.nan, op))
                weights.append(1.0)
        if not t.experiments:
            cycles += limit
            continue
        for e in t.experiments:
            loads = loads_of(e, seed)
            grids = [step_grid(ld) for ld in loads]
            ops = operating_points(pm, coeffs.params, spec, gpu, tp, loads, grids, alphas, ftc)
            stages += [(e.name, ld.rate, op) for ld, op in zip(loads, ops)]
            weights += [ld.requests for ld in loads]
            for ld, g, op in zip(loads, grids, ops):
                cyc = [float(run_state(p, spec, gpu, tp, [ld], [g], alphas, ftc)["step_us"])
                       for p in (coeffs.params, at_compute_scale(coeffs.params, op.compute_scale))]
                cycles.append((e.name, ld.rate, *cyc))
        cycles += limit
    if not stages:
        return Clock(1.0, "burst clock (no load to take a clock from)")
    w = np.asarray(weights, np.float64)
    scale = float(np.dot(w, [op.compute_scale for _, _, op in stages]) / w.sum())
    busiest = max(stages, key=lambda st: st[2].demand_w)
    if scale <= 1.0 + 1e-9:
        how = (f"boost clock: every stage within the {pm.limit_w:,.0f} W limit (the busiest, {busiest[0]}"
               + (f" at {busiest[1]:g} req/s" if math.isfinite(busiest[1]) else "")
               + f", draws {busiest[2].demand_w:,.0f} W)")
        return Clock(1.0, how, tuple(stages), tuple(cycles))
    limited = sum(op.limited for _, _, op in stages)
    how = (f"sustained: compute-bound time x{scale:.3f} (request-weighted over {len(stages)} stage(s), "
           f"{limited} power-limited; the busiest: {busiest[2].text()})")
    return Clock(scale, how, tuple(stages), tuple(cycles))


def export_deployment(coeffs: Coefficients, targets: "Target | Sequence[Target]",
                      defaults_path=resources.BLIS_DEFAULTS, hardware_config=resources.BLIS_HARDWARE,
                      settings: BlisFitSettings | None = None, seed: int = 42,
                      clock: str = "sustained") -> DeploymentExport:
    """BLIS coefficients for one target (module docstring) — or, given several, one set they all
    share: betas distilled over all their deployments, α0 from their cycles weighted by their
    runs' requests (equally without runs). ``settings``: the distillation (its sampler follows the
    targets' runs: their token budgets, max_num_seqs and context). ``clock``: the native model
    is taken at the operating point of the targets' load (:func:`operating_clock`; BLIS has no
    power state, so the betas carry the clock)."""
    from roofcal.blis.distill import stack_alphas_calibrated
    from roofcal.model.combine import at_compute_scale
    from roofcal.physics.hardware import load_gpu
    targets = (targets,) if isinstance(targets, Target) else tuple(targets)
    gpu = load_gpu(coeffs.gpu)
    op_clock = operating_clock(coeffs, targets, clock, seed)
    if op_clock.compute_scale != 1.0:
        coeffs = Coefficients(**{**coeffs.__dict__, "params": at_compute_scale(coeffs.params, op_clock.compute_scale)})
    hw_name, hw = hardware_for_gpu(hardware_config, gpu, None)
    alpha0, input_beta = read_defaults_coefficients(defaults_path)
    validate_export_coeffs(alpha0, input_beta, f"{defaults_path}: trained_physics_coefficients")
    settings = settings or BlisFitSettings()
    exps = [e for t in targets for e in t.experiments]
    for e in exps:
        if e.server.gpu != gpu.name:
            raise RoofcalError(f"{e.path}: run on GPU '{e.server.gpu}', but {coeffs.source} is for '{gpu.name}'")
    if exps:
        sampler = SamplerSettings(token_budgets=tuple(sorted({e.max_num_batched_tokens for e in exps})),
                                  max_num_seqs=max(e.max_num_seqs for e in exps),
                                  max_context=max((e.max_model_len or SamplerSettings().max_context) for e in exps))
        settings = BlisFitSettings(seed=settings.seed, holdout=settings.holdout, samples=settings.samples,
                                   iters=settings.iters, prior_rows=settings.prior_rows, sampler=sampler)
    resolved = [resolve_deployment(t.deployment, hw) for t in targets]
    steps, weights, sources, checks = [], [], [], []
    for t in targets:
        d, w = workload_steps(coeffs, t.experiments, t.deployment.model, t.deployment.tp, seed)
        steps += d
        weights += w
        sources += ["measured"] * len(d)
        mix = mixes(coeffs, t, seed)
        checks.append(mix)
        if "saturated" in mix:
            steps.append(mix["saturated"])
            weights.append(np.ones(len(mix["saturated"])))
            sources.append("saturated")
    settings = replace(settings, source_weights=SOURCE_WEIGHTS if exps else NOMINAL_SOURCE_WEIGHTS)
    rows = build_rows(coeffs.params, gpu, resolved, settings, steps, hw, dataset_weights=weights,
                      dataset_sources=sources)
    fit = fit_blis([rows[k] for k in ("distill", "measured") if k in rows], input_beta, settings)
    st = coeffs.stacks.get(coeffs.stack) if coeffs.stack is not None else None
    first: dict = {}
    if st is not None and stack_alphas_calibrated(st):
        alphas = [float(st.alphas_us[n]) for n in ALPHAS]
        how = "calibrated on serving runs" if str(st.source.get("kind", "")).startswith("workload") \
            else "measured from request journeys"
        cycles = stack_first_token_cycles(coeffs)
        if cycles:
            from roofcal.model.serving import blis_alpha0
            parts = [deployment_cycle(coeffs, t, alphas[0], alphas, cycles, seed) for t in targets]
            w = np.array([sum(e.num_requests for e in t.experiments) or 1 for t in targets], np.float64)
            first = parts[0] if len(parts) == 1 else {
                "api_us": alphas[0], "cycle_us": float(np.dot(w, [p["cycle_us"] for p in parts]) / w.sum()),
                "load": "request-weighted over " + ", ".join(f"{t.stem} ({p['cycle_us']:.0f} us)"
                                                             for t, p in zip(targets, parts))}
            first["cycle_delay_us"] = cycles * first["cycle_us"]
            whose = "this deployment's" if len(targets) == 1 else "the deployments' mean"
            how += (f"; alpha0 = API {alphas[0]:.0f} us + {cycles:g} x {whose} cycle "
                    f"{first['cycle_us']:.0f} us ({first['load']})")
            alphas[0] = blis_alpha0(alphas[0], first["cycle_us"], cycles)
        alpha, alpha_source = tuple(round_sig(a) for a in alphas), f"from serving stack '{coeffs.stack}' ({how})"
    else:
        alpha = tuple(float(a) for a in alpha0)
        alpha_source = f"kept from {resources.display(Path(defaults_path))} (the stack has no request-level data)"
    validate_export_coeffs(alpha, fit.beta, str(coeffs.source))
    provenance = {"coeffs": coeffs.source, "stack": coeffs.stack, "kernels": coeffs.kernels,
                  "runs": [e.name for e in exps],
                  "rows": fit.n_rows, "fit": settings.record()}
    out = DeploymentExport(targets, hw_name, alpha, tuple(fit.beta), alpha_source, first, fit.metrics, provenance,
                           tuple(blis_kv_blocks(t, gpu) for t in targets))
    # the export against the native model where the server is light and where it saturates
    errs: dict = {}
    for mix in checks:
        for name, v in mix_errors(out, coeffs, mix, hw).items():
            errs.setdefault(name, []).append(v)
    out.metrics["mixes"] = {k: float(np.mean(v)) for k, v in errs.items()}
    out.metrics["clock"] = {"compute_scale": op_clock.compute_scale, "how": op_clock.how,
                            "cycles": op_clock.cycles_text()}
    out.provenance["clock"] = {"mode": clock, "compute_scale": round_sig(op_clock.compute_scale, 6)}
    return out


def export_deployments(coeffs: Coefficients, targets: Sequence[Target], defaults_path=resources.BLIS_DEFAULTS,
                       hardware_config=resources.BLIS_HARDWARE, settings: BlisFitSettings | None = None,
                       seed: int = 42, clock: str = "sustained") -> list[DeploymentExport]:
    """:func:`export_deployment` for every target on its own, in order."""
    return [export_deployment(coeffs, t, defaults_path, hardware_config, settings, seed, clock) for t in targets]


def comment(ex: DeploymentExport, coeffs_path=None) -> str:
    """The provenance line written above the coefficients of a deployment's ``defaults.yaml``."""
    from roofcal import __version__
    from roofcal.io import sha256_file
    src = ""
    if coeffs_path is not None and Path(coeffs_path).is_file():
        src = " " + source_note(resources.display(Path(coeffs_path)), sha256_file(coeffs_path),
                                ex.provenance.get("kernels"))
    d = ex.distill_mape()
    deps = ", ".join(f"{t.blis_model} {t.deployment.title}" for t in ex.targets)
    only = " only" if len(ex.targets) == 1 else ""
    scale = ex.metrics.get("clock", {}).get("compute_scale", 1.0)
    at = (f" at a power-limited clock (compute-bound time x{scale:.3f}, sustained load)" if scale != 1.0 else "")
    return (f"roofcal {__version__}: for {deps} on {ex.hardware}{only}{src};"
            + (f" betas distilled for it{at} (held-out {d:.1f}% vs the native model);" if d is not None else "")
            + f" alphas {ex.alpha_source}")


def defaults_paths(exports: Sequence[DeploymentExport], out_dir) -> list[Path]:
    """``<out_dir>/<model>-tp<T>.yaml`` per export (refusing two deployments with one name)."""
    paths = [Path(out_dir) / f"{'+'.join(t.stem for t in ex.targets)}.yaml" for ex in exports]
    if len(set(paths)) != len(paths):
        dup = next(p for p in paths if paths.count(p) > 1)
        raise RoofcalError(f"{dup}: two deployments would write the same file")
    return paths


def write_defaults_file(ex: DeploymentExport, defaults_path, out, coeffs_path=None) -> Path:
    """Write one export as ``out`` (atomically); every other byte of ``defaults_path`` is kept."""
    text = read_text_exact(Path(defaults_path), "BLIS defaults file")
    new = replace_coefficients(text, ex.alpha, ex.beta, comment(ex, coeffs_path), str(defaults_path))
    check_written(new, ex.alpha, ex.beta, str(out))
    write_files_atomic({Path(out): new})
    return Path(out)


def write_defaults(exports: Sequence[DeploymentExport], defaults_path, out_dir,
                   coeffs_path=None) -> list[Path]:
    """Write one ``defaults.yaml`` per export into ``out_dir`` (:func:`defaults_paths`), all or
    none; every other byte of ``defaults_path`` is kept."""
    text = read_text_exact(Path(defaults_path), "BLIS defaults file")
    paths = defaults_paths(exports, out_dir)
    files = {}
    for ex, p in zip(exports, paths):
        new = replace_coefficients(text, ex.alpha, ex.beta, comment(ex, coeffs_path), str(defaults_path))
        check_written(new, ex.alpha, ex.beta, str(p))
        files[p] = new
    write_files_atomic(files)
    return paths


def config_folder(target: Target) -> Path:
    """The folder holding the target's ``config.json`` (BLIS's ``--model-config-folder``)."""
    from roofcal.physics.config import resolve_config_path
    return Path(resolve_config_path(target.deployment.model)).resolve().parent


#: the load of the printed ``blis run`` commands: BLIS's own ``distribution`` workload (prompts and
#: outputs of 512 ± 256 tokens), 100 requests at one a second — a concrete load that runs in well
#: under a second; a run's own load is its TraceV2 (``roofcal workload trace``)
USAGE_LOAD = ("--num-requests", "100", "--rate", "1", "--seed", "42")


def blis_kv_blocks(target: Target, gpu) -> int | None:
    """The KV blocks of a data-parallel deployment, all its ranks' (each sized as vLLM sizes it,
    :func:`roofcal.physics.capacity.capacity`, at its share of the server limits), for BLIS's
    ``--total-kv-blocks``: BLIS's own sizing counts one TP group's GPUs holding every expert
    (Mixtral TP 1, DP 4: "weights 86.99 GiB … exceeds 72 GiB", where each GPU holds a quarter of
    the experts). None for a TP deployment, whose KV BLIS sizes itself."""
    from roofcal.physics.capacity import capacity
    d = target.deployment
    if d.ranks == 1:
        return None
    seqs, budget = server_limits(target)
    spec = d.spec()
    return d.ranks * capacity(spec, gpu, int(d.tp), max_num_batched_tokens=budget // d.ranks,
                              max_num_seqs=seqs // d.ranks).kv_blocks


def server_limits(target: Target) -> tuple[int, int]:
    """(max_num_seqs, token budget) of the server the target's export was distilled for: the
    largest of its runs', else the nominal 256 and 8,192 (:func:`mixes`); for a data-parallel
    deployment, all its ranks' together (BLIS's one scheduler)."""
    r = target.deployment.ranks               # BLIS schedules all ranks as one (:class:`Deployment`)
    if target.experiments:
        return (r * max(int(e.max_num_seqs) for e in target.experiments),
                r * max(int(e.max_num_batched_tokens) for e in target.experiments))
    return r * NOMINAL_MAX_NUM_SEQS, r * NOMINAL_BUDGET


def trace_prefix(path: os.PathLike, export: DeploymentExport, target: Target) -> Path:
    """Where the printed ``blis run`` writes its requests as a TraceV2 (``<prefix>.yaml`` and
    ``.csv``) for the printed ``blis replay``: beside the defaults file, ``<its stem>-workload``
    (``<its stem>-<target>-workload`` for a file of several deployments). Absolute."""
    p = Path(path).resolve()
    stem = p.stem if len(export.targets) == 1 else f"{p.stem}-{target.stem}"
    return p.with_name(f"{stem}-workload")


def usage(exports: Sequence[DeploymentExport], paths: Sequence[os.PathLike] | None = None,
          hardware_config=resources.BLIS_HARDWARE, defaults=resources.BLIS_DEFAULTS,
          blis: os.PathLike | None = None) -> str:
    """Which file (or flags) go with which ``blis`` command, one block per export, each command
    complete as printed (absolute paths, the server's limits, a load: :data:`USAGE_LOAD`): a
    written defaults file has no hardware table or model configs beside it, so
    ``--hardware-config`` and ``--model-config-folder`` are given.

    With ``paths`` (the written files): a ``blis run`` that writes its requests as a TraceV2
    (:func:`trace_prefix`) and a ``blis replay`` of that trace. Always: the coefficients as
    ``--alpha-coeffs``/``--beta-coeffs`` over ``defaults`` (BLIS reads its other settings from a
    defaults file, ``./defaults.yaml`` unless ``--defaults-filepath`` names one, and fails
    without it). ``blis``: the binary's path (None: ``blis``, with a line saying so). A
    data-parallel deployment's commands carry BLIS's ``--dp`` flags, and its limits and KV blocks
    (``--total-kv-blocks``, :func:`blis_kv_blocks`) summed over its ranks."""
    import shlex
    lines = []
    hw_path = Path(hardware_config).resolve()
    dflt = Path(defaults).resolve()
    exe = str(Path(blis).resolve()) if blis is not None else "blis"
    for i, ex in enumerate(exports):
        ft = ex.first_token
        a0 = (f"alpha0 {ex.alpha[0]:,.0f} us = API {ft['api_us']:,.0f} + first-token cycle {ft['cycle_delay_us']:,.0f}"
              if ft else f"alpha0 {ex.alpha[0]:,.0f} us")
        d = ex.distill_mape()
        deps = ", ".join(f"{t.blis_model} {t.deployment.title}" for t in ex.targets)
        m = ex.metrics.get("mixes", {})
        lines.append(f"{deps} on {ex.hardware}: {a0}"
                     + (f"; betas held-out {d:.1f} % vs native" if d is not None else "")
                     + (f"; vs native on its light / saturated steps {m.get('light', float('nan')):.1f} / "
                        f"{m.get('saturated', float('nan')):.1f} %" if m else "")
                     + (f"; load: {ft['load']}" if ft.get("load") else ""))
        if ex.metrics.get("clock"):
            lines.append(f"  clock: {ex.metrics['clock']['how']}")
            if ex.metrics["clock"].get("cycles"):
                lines.append(f"  cycle per stage, boost -> its own clock: {ex.metrics['clock']['cycles']}")
        for j, t in enumerate(ex.targets):
            seqs, budget = server_limits(t)
            base = ["--model", t.blis_model, "--tp", str(t.deployment.tp), *t.deployment.blis_flags(),
                    "--hardware", ex.hardware,
                    "--latency-model", "trained-physics", "--model-config-folder", str(config_folder(t)),
                    "--hardware-config", str(hw_path)]
            limits = ["--max-num-seqs", str(seqs), "--max-num-batched-tokens", str(budget)]
            kv = ex.kv_blocks[j] if j < len(ex.kv_blocks) else None
            if kv is not None:
                limits += ["--total-kv-blocks", str(kv)]
                lines.append(f"  BLIS schedules the {t.deployment.ranks} data-parallel ranks as one: the limits and "
                             "KV blocks below are all ranks' together (vLLM's are per rank)")
            if paths is not None:
                own = ["--defaults-filepath", str(Path(paths[i]).resolve())]
                prefix = str(trace_prefix(paths[i], ex, t))
                lines.append("  " + shlex.join([exe, "run", *base, *own, *limits, *USAGE_LOAD,
                                                "--trace-output", prefix]))
                lines.append("  " + shlex.join([exe, "replay", *base, *own, *limits, "--trace-header",
                                                f"{prefix}.yaml", "--trace-data", f"{prefix}.csv"])
                             + "   # the requests the run above wrote")
                lines.append("  or, the same coefficients as flags over any defaults.yaml (BLIS reads its other settings "
                             "from one; here --defaults):")
            else:
                lines.append("  the coefficients as flags over --defaults (BLIS reads its other settings from a "
                             "defaults.yaml):")
            lines.append("  " + shlex.join([exe, "run", *base, "--defaults-filepath", str(dflt), *limits,
                                            *ex.flags.split(), *USAGE_LOAD]))
    if blis is None:
        lines.append("(blis: the BLIS binary; --blis PATH or $ROOFCAL_BLIS prints its full path)")
    return "\n".join(lines)

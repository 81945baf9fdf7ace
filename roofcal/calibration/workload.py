"""Workload calibration: fit a serving stack (and BLIS's alphas) so that BLIS, fed roofcal's
exported coefficients, reproduces the mean TTFT, ITL and E2E measured on real serving runs.

In: experiment folders (:mod:`roofcal.measurements.workload`), a coefficient file whose kernel
corrections stay fixed, and a BLIS binary (:mod:`roofcal.blis.run`).
Out: a :class:`~roofcal.model.coeffs.Stack` with its provenance and the BLIS errors of every
iterate.

The serving stack's parameters θ (physical units, all ≥ 0) are:

==================  ==========================================================================
``step_us``         CPU per step: scheduling, input preparation, sampling, output processing
``decode_seq_us``   CPU per decoding sequence in the step
``prefill_seq_us``  CPU per prefilling sequence in the step
``layer_us``        GPU launch gaps per layer
``overlap``         soft-max sharpness of CPU and GPU work (1 = serial, large = fully hidden)
``queueing_us``     α0: API ingestion before a request is queued (per request)
``post_decode_us``  α1: once per finished request
``output_token_us`` α2: output processing per generated token (metrics only, not the clock)
==================  ==========================================================================

Loop (Gauss–Newton with the simulator refreshing the model's blind spots):

1. Levenberg–Marquardt on log(predicted / measured) of every run's mean E2E, TTFT and ITL, the
   prediction being the steady state of :mod:`roofcal.model.serving` over roofcal's own step
   times (JAX, so the Jacobian is exact), times a per-run, per-metric correction ``exp(δ)``
   (0 at first), plus a weak Gaussian prior on log θ around plausible values (vidur's measured
   CPU overheads of vLLM, see ``PRIOR``).
2. Export the stack exactly as ``roofcal export blis --out-dir`` does, one coefficient set per
   deployment (:func:`roofcal.blis.deployments.export_deployment`: betas distilled for it, α0
   from its own first-token delay); replay every run through its faithful trace in BLIS with its
   deployment's set.
3. δ ← log(BLIS / steady state) at the current θ, capped at ×/÷ 1.5: what queueing bursts,
   chunking and BLIS's basis do that the steady state does not (a run on a queueing cliff would
   otherwise dominate); back to 1, with a trust region around the θ where δ was measured. The
   iterate with the lowest BLIS loss — the mean squared log-ratio of BLIS's to the measured mean
   E2E, TTFT and ITL over the fitted runs, the three metrics alike — is kept, and said which it
   is: it need not be the one with the lowest E2E MAPE alone.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from roofcal import resources
from roofcal.calibration import WORKLOAD_DEFAULTS
from roofcal.errors import RoofcalError
from roofcal.model import coeffs as coeff_io
from roofcal.model import correction as K
from roofcal.model.coeffs import ALPHAS, Coefficients, Stack
from roofcal.model.combine import step_breakdown
from roofcal.model import serving

#: the serving stack's parameters, in θ order (see the module docstring)
THETA = ("step_us", "decode_seq_us", "prefill_seq_us", "layer_us", "overlap",
         "queueing_us", "post_decode_us", "output_token_us")
#: prior centre (physical units; ``overlap`` is the sharpness q) and width (natural-log units).
#: CPU per step and per sequence from vidur's profile of vLLM on A100 (schedule + prepare inputs
#: + sampler + process outputs ≈ 1.8 ms at batch 8, +≈ 35 µs per added sequence; microsoft/vidur,
#: MIT, ../shared/data/steps/vidur-cpu-overheads); launch gaps of a few µs per kernel; BLIS's
#: bundled alphas set the order of magnitude of the request-level terms.
PRIOR = {"step_us": (1500.0, 1.5), "decode_seq_us": (30.0, 1.5), "prefill_seq_us": (300.0, 1.5),
         "layer_us": (10.0, 1.5), "overlap": (2.0, 1.5), "queueing_us": (3000.0, 1.5),
         "post_decode_us": (300.0, 1.5), "output_token_us": (30.0, 1.5)}
METRICS = ("e2e", "ttft", "itl")
#: ``source.kind`` of a stack fitted here (its alphas were fitted on request-level data, so an
#: export writes them: :func:`roofcal.blis.distill.stack_alphas_calibrated`)
SOURCE_KIND = "workload calibration: mean E2E, TTFT, ITL of serving runs, BLIS in the loop"
#: largest factor between BLIS and the steady state that the loop carries as a correction
DELTA_CAP = 1.5


@dataclass(frozen=True)
class WorkloadSettings:
    """Settings of a workload calibration; all recorded in the stack's provenance."""

    refreshes: int = WORKLOAD_DEFAULTS["refreshes"]   # BLIS runs of every experiment (outer iterations)
    lm_iters: int = 40            # Levenberg–Marquardt iterations per refresh
    prior_weight: float = 0.05    # pseudo-runs holding each log θ at its prior centre
    samples: int = WORKLOAD_DEFAULTS["samples"]       # distillation steps per deployment
    seed: int = 0
    trust: float = 1.0            # pseudo-runs holding θ near the last BLIS refresh (after the first)
    first_token_cycles: float = WORKLOAD_DEFAULTS["first_token_cycles"]   # cycles from a step to its tokens at the client
    export: str = "per-deployment"   # how BLIS gets the stack (EXPORTS)
    clock: str = "sustained"         # the GPU's clock under each stage's load (roofcal.model.operating.CLOCKS)

    def record(self) -> dict:
        return {"refreshes": self.refreshes, "lm_iters": self.lm_iters, "trust": self.trust,
                "first_token_cycles": self.first_token_cycles, "export": self.export, "clock": self.clock,
                "prior_weight": self.prior_weight, "distill_samples": self.samples, "seed": self.seed,
                "loss": "mean squared log-ratio of mean E2E, TTFT, ITL per run + Gaussian prior on log θ"}


# --------------------------------------------------------------------------------------------
# θ ↔ stack

def theta_to_physical(theta) -> dict:
    """Raw θ (log values; softplus for ``overlap``) → {name: physical value}."""
    out = {}
    for i, n in enumerate(THETA):
        out[n] = 1.0 + jax.nn.softplus(theta[i]) if n == "overlap" else jnp.exp(theta[i])
    return out


def physical_to_theta(values: dict) -> np.ndarray:
    return np.array([K.softplus_inv(max(values[n] - 1.0, 1e-6)) if n == "overlap"
                     else math.log(max(values[n], 1e-9)) for n in THETA], np.float64)


def step_params(theta) -> dict:
    """The raw step pytree of a stack with parameters θ (other overheads 0, kernel scales 1)."""
    v = theta_to_physical(theta)
    base = K.neutral_step_params()
    o = list(base["overheads"])
    for name in ("step_us", "decode_seq_us", "prefill_seq_us", "layer_us"):
        o[K.STEP_OVERHEADS.index(name)] = jnp.log(v[name])
    return {**base, "overheads": jnp.stack(o).astype(jnp.float32),
            "overlap": jnp.asarray(theta[THETA.index("overlap")], jnp.float32)}


def alphas_of(theta) -> jnp.ndarray:
    v = theta_to_physical(theta)
    return jnp.stack([v[n] for n in ALPHAS])


def stack_of(theta, source: dict) -> Stack:
    v = {k: float(x) for k, x in theta_to_physical(jnp.asarray(theta, jnp.float32)).items()}
    return Stack(jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float32), step_params(jnp.asarray(theta, jnp.float32))),
                 {n: v[n] for n in ALPHAS}, source)


# --------------------------------------------------------------------------------------------
# the differentiable prediction of a run

@dataclass(frozen=True, eq=False)
class Case:
    """One experiment as the steady-state model sees it: deployment, stage loads
    (:func:`roofcal.model.serving.loads_of`), their step grids, and the measured means (µs, order
    of ``METRICS``)."""

    name: str
    model: object              # ModelSpec
    tp: int
    loads: tuple
    grids: tuple               # StepBatch per load
    measured_us: np.ndarray    # (3,)


def case_of(exp, model_spec, seed: int = 42) -> Case:
    m = exp.truth["summary"]
    loads = serving.loads_of(exp, seed)
    return Case(exp.name, model_spec, int(exp.tp), loads, tuple(serving.step_grid(ld) for ld in loads),
                np.array([m.e2e_ms, m.ttft_ms, m.itl_ms], np.float64) * 1000.0)


def run_state(theta, ops: dict, gpu, case: Case, first_token_cycles: float = 0.0, scales=None) -> dict:
    """Steady-state means of a run (µs) under stack θ (:func:`roofcal.model.serving.run_state`),
    its stages at compute scales ``scales`` (None: the burst clock)."""
    return serving.run_state({"ops": ops, "step": step_params(theta)}, case.model, gpu, case.tp,
                             case.loads, case.grids, alphas_of(theta), first_token_cycles, scales)


def predict_case(theta, ops: dict, gpu, case: Case, first_token_cycles: float = 0.0, scales=None) -> jnp.ndarray:
    """Steady-state (E2E, TTFT, ITL) means of a run, µs, shape (3,)."""
    m = run_state(theta, ops, gpu, case, first_token_cycles, scales)
    return jnp.stack([m["e2e_us"], m["ttft_us"], m["itl_us"]])


def case_scales(power, theta, ops: dict, gpu, cases, first_token_cycles: float = 0.0) -> np.ndarray:
    """(runs, stages) compute scales: each stage's operating point under stack θ
    (:func:`roofcal.model.serving.operating_points`); all 1 without a power model. Stages beyond
    a run's own are padded with 1."""
    n = max(len(c.loads) for c in cases)
    out = np.ones((len(cases), n))
    if power is None:
        return out
    params = {"ops": ops, "step": step_params(jnp.asarray(theta, jnp.float32))}
    for i, c in enumerate(cases):
        ops_ = serving.operating_points(power, params, c.model, gpu, c.tp, c.loads, c.grids,
                                        alphas_of(jnp.asarray(theta, jnp.float32)), first_token_cycles)
        out[i, :len(ops_)] = [op.compute_scale for op in ops_]
    return out


def stack_theta(st: Stack) -> np.ndarray:
    """θ of a stack in a coefficient file (its overheads, overlap and alphas)."""
    from roofcal.model.coeffs import step_to_dict
    d = step_to_dict(st.params)
    o = d["overheads_us"]
    return physical_to_theta({"step_us": o["step_us"], "decode_seq_us": o["decode_seq_us"],
                              "prefill_seq_us": o["prefill_seq_us"], "layer_us": o["layer_us"],
                              "overlap": d["overlap_sharpness"],
                              **{n: max(float(st.alphas_us[n]), 1e-6) for n in ALPHAS}})


def _residual_fn(ops, gpu, cases, settings):
    """Residuals ``res(θ, δ, anchor, w_trust, scales)`` of the fit and their Jacobian in θ,
    compiled once for every refresh: per run log(model · e^δ / measured) of E2E, TTFT, ITL (δ:
    (runs, 3)), its stages at compute scales ``scales`` ((runs, stages), :func:`case_scales`,
    held through a refresh); the prior; and a trust region of ``w_trust²`` pseudo-runs around
    ``anchor`` (the θ where δ was measured: δ is only valid near it; 0 before the first BLIS
    refresh)."""
    centre = physical_to_theta({n: PRIOR[n][0] for n in THETA})
    sd = np.array([PRIOR[n][1] for n in THETA])
    w = math.sqrt(settings.prior_weight)

    def residuals(theta, delta, anchor, w_trust, scales):
        r = [jnp.log(predict_case(theta, ops, gpu, c, settings.first_token_cycles, scales[i])) + delta[i]
             - jnp.log(c.measured_us)
             for i, c in enumerate(cases)]
        return jnp.concatenate(r + [w * (theta - centre) / sd, w_trust * (theta - anchor) / sd])
    return jax.jit(residuals), jax.jit(jax.jacfwd(residuals))


def levenberg_marquardt(res, jac, theta0: np.ndarray, iters: int) -> np.ndarray:
    """Minimise ½‖res(θ)‖² from θ0 by Levenberg–Marquardt (adaptive damping, steps accepted
    only when the loss falls)."""
    theta = np.asarray(theta0, np.float64)
    r = np.asarray(res(jnp.asarray(theta, jnp.float32)), np.float64)
    lam = 1e-2
    for _ in range(iters):
        J = np.asarray(jac(jnp.asarray(theta, jnp.float32)), np.float64)
        g, H = J.T @ r, J.T @ J
        while True:
            step = np.linalg.solve(H + lam * (np.diag(np.diag(H)) + 1e-9 * np.eye(len(theta))), -g)
            cand = theta + np.clip(step, -2.0, 2.0)
            rc = np.asarray(res(jnp.asarray(cand, jnp.float32)), np.float64)
            if np.all(np.isfinite(rc)) and rc @ rc < r @ r:
                theta, r, lam = cand, rc, max(lam / 3.0, 1e-7)
                break
            lam *= 4.0
            if lam > 1e8:
                return theta
        if np.linalg.norm(step) < 1e-5:
            break
    return theta


# --------------------------------------------------------------------------------------------
# the loop with BLIS

@dataclass
class Iterate:
    """One refresh: θ (physical), the per-deployment exports, BLIS's and the steady state's means."""

    theta: dict
    exports: tuple               # DeploymentExport per deployment
    blis_ms: np.ndarray          # (runs, 3)
    model_ms: np.ndarray         # (runs, 3)
    loss: float                  # mean squared log-ratio of BLIS vs measured
    mape: dict
    within: int                  # runs with E2E, TTFT and ITL all within 10 %
    results: tuple = ()          # the BLIS replays (SimResult per fitted run)


@dataclass
class WorkloadCalibration:
    stack: Stack
    best: Iterate
    history: list = field(default_factory=list)
    seconds: float = 0.0

    @property
    def kept(self) -> int:
        """The refresh (1-based) whose iterate is kept: the lowest BLIS loss."""
        return next(i for i, it in enumerate(self.history, 1) if it is self.best)

    def kept_text(self) -> str:
        """Which iterate is kept and why, on one line."""
        it = self.best
        return (f"kept: refresh {self.kept} of {len(self.history)}, BLIS MAPE E2E {it.mape['e2e']:.1f} % "
                f"TTFT {it.mape['ttft']:.1f} % ITL {it.mape['itl']:.1f} % (loss {it.loss:.4f}): the lowest BLIS loss, "
                "the mean squared log-ratio of BLIS to measured E2E, TTFT and ITL over the fitted runs "
                "(not E2E alone)")


def _blis_means(results) -> np.ndarray:
    return np.array([[r.scopes["summary"].e2e_ms, r.scopes["summary"].ttft_ms, r.scopes["summary"].itl_ms]
                     for r in results], np.float64)


def _mape(pred_ms: np.ndarray, meas_ms: np.ndarray) -> dict:
    e = np.abs(pred_ms / meas_ms - 1.0) * 100.0
    return {m: float(np.mean(e[:, i])) for i, m in enumerate(METRICS)}


def within_10(pred_ms: np.ndarray, meas_ms: np.ndarray) -> int:
    """Runs (rows) whose E2E, TTFT and ITL are all within 10 % of the measurement."""
    return int(np.sum(np.all(np.abs(pred_ms / meas_ms - 1.0) <= 0.10, axis=1)))


#: how a coefficient file is exported for serving runs: one set per deployment (its runs'
#: loads), per run (the deployment at that run's load), or one global set
EXPORTS = ("per-deployment", "per-run", "global")


def export_targets(exps, model_configs, per_run: bool = False):
    """Export targets for ``exps``: per deployment, its runs that are not overloaded (all of them
    when every one is), whose loads set its first-token cycle and distillation steps; with
    ``per_run``, one target per run."""
    from roofcal.blis.deployments import Target, targets_for_experiments
    if per_run:
        return targets_for_experiments(exps, model_configs, per_run=True)
    out = []
    for t in targets_for_experiments(exps, model_configs):
        scored = tuple(e for e in t.experiments if not e.overload)
        out.append(Target(t.deployment, t.blis_model, scored or t.experiments,
                          left_out=tuple(e.name for e in t.experiments if e.overload) if scored else ()))
    return out


def export_for(coeffs: Coefficients, exps, blis_settings, samples: int = 800, seed: int = 0,
               export: str = "per-deployment", clock: str = "sustained") -> list:
    """``roofcal export blis`` of ``coeffs`` (its current stack) for ``exps`` as ``export``
    (:data:`EXPORTS`) says, at the ``clock`` of their load (:data:`roofcal.model.operating.CLOCKS`):
    a list of :class:`~roofcal.blis.deployments.DeploymentExport`."""
    from roofcal.blis.deployments import export_deployment, export_deployments
    from roofcal.blis.fit import BlisFitSettings
    if export not in EXPORTS:
        raise RoofcalError(f"export must be one of {', '.join(EXPORTS)}, got {export!r}")
    fit = BlisFitSettings(seed=seed, samples=samples)
    targets = export_targets(exps, blis_settings.model_configs, per_run=export == "per-run")
    if export == "global":
        return [export_deployment(coeffs, targets, blis_settings.defaults, blis_settings.hardware_config, fit,
                                  blis_settings.seed, clock)]
    return export_deployments(coeffs, targets, blis_settings.defaults, blis_settings.hardware_config, fit,
                              blis_settings.seed, clock)


def export_of(exports, exp):
    """The export among ``exports`` for ``exp``'s deployment."""
    for ex in exports:
        if _same_deployment(ex, exp):
            return ex
    raise RoofcalError(f"{exp.path}: no exported coefficients for {exp.model} TP{exp.tp}")


def run_coefficients(exports, exps) -> tuple[dict, dict]:
    """({run: alpha}, {run: beta}): each run replayed with its deployment's export."""
    pick = {e.name: export_of(exports, e) for e in exps}
    return {n: x.alpha for n, x in pick.items()}, {n: x.beta for n, x in pick.items()}


def calibrate(exps, coeffs: Coefficients, blis_settings, settings: WorkloadSettings = WorkloadSettings(),
              name: str = "vllm", progress: bool = True, log=print) -> WorkloadCalibration:
    """Fit a serving stack named ``name`` to the non-overload experiments ``exps`` with BLIS in the
    loop (module docstring); ``coeffs``' kernel corrections stay as they are."""
    from roofcal.blis.run import model_config_folder, run_experiments
    from roofcal.io import file_record
    from roofcal.physics.config import check_tp, load_model
    from roofcal.physics.hardware import load_gpu
    t0 = time.time()
    exps = [e for e in exps if not e.overload]
    if not exps:
        raise RoofcalError("workload calibrate: no experiment below the overload failure rate (10 %) to fit")
    gpu = load_gpu(coeffs.gpu)
    cases = []
    for e in exps:
        if e.server.gpu != gpu.name:
            raise RoofcalError(f"{e.path}: run on GPU '{e.server.gpu}', but {coeffs.source} is for '{gpu.name}'")
        spec = load_model(model_config_folder(e, blis_settings.model_configs) / "config.json")
        check_tp(spec, int(e.tp), where=f"{e.path}: tensor_parallelism")
        cases.append(case_of(e, spec, blis_settings.seed))
    meas_ms = np.stack([c.measured_us for c in cases]) / 1000.0
    ops = coeffs.params["ops"]
    from roofcal.model.operating import power_of
    power = power_of(coeffs, gpu) if settings.clock == "sustained" else None
    theta = physical_to_theta({n: PRIOR[n][0] for n in THETA})
    delta = [np.zeros(3) for _ in cases]
    history, best = [], None
    ftc = settings.first_token_cycles
    model_fn = jax.jit(lambda th, sc: jnp.stack([predict_case(th, ops, gpu, c, ftc, sc[i]) for i, c in enumerate(cases)]))
    cycle_fn = jax.jit(lambda th, sc: jnp.stack([run_state(th, ops, gpu, c, ftc, sc[i])["step_us"]
                                                 for i, c in enumerate(cases)]))
    res, jac = _residual_fn(ops, gpu, cases, settings)
    scales = case_scales(power, theta, ops, gpu, cases, ftc)
    for k in range(settings.refreshes):
        sc = jnp.asarray(scales, jnp.float32)
        args = (jnp.asarray(np.stack(delta), jnp.float32), jnp.asarray(theta, jnp.float32),
                jnp.float32(math.sqrt(settings.trust) if k > 0 else 0.0), sc)
        theta = levenberg_marquardt(lambda th: res(th, *args), lambda th: jac(th, *args), theta,
                                    settings.lm_iters)
        scales = case_scales(power, theta, ops, gpu, cases, ftc)     # the clock the new stack's load implies
        sc = jnp.asarray(scales, jnp.float32)
        model_ms = np.asarray(model_fn(jnp.asarray(theta, jnp.float32), sc), np.float64) / 1000.0
        src = {"kind": SOURCE_KIND, "kernels": coeffs.kernels, "first_token": {"cycles": ftc}}
        c = coeff_io.add_stack(coeffs, name, stack_of(theta, src), default=True)
        exports = export_for(c, exps, blis_settings, settings.samples, settings.seed, settings.export,
                             settings.clock)
        alpha, beta = run_coefficients(exports, exps)
        results = run_experiments(exps, blis_settings, alpha, beta, progress=progress)
        blis_ms = _blis_means(results)
        loss = float(np.mean(np.log(blis_ms / meas_ms) ** 2))
        it = Iterate({n: float(v) for n, v in theta_to_physical(jnp.asarray(theta)).items()},
                     tuple(exports), blis_ms, model_ms, loss, _mape(blis_ms, meas_ms),
                     within_10(blis_ms, meas_ms), tuple(results))
        history.append(it)
        if best is None or loss < best[0].loss:
            best = (it, theta.copy(), scales.copy())
        if progress:
            sm = _mape(model_ms, meas_ms)
            log(f"roofcal: refresh {k + 1}/{settings.refreshes}: BLIS MAPE E2E {it.mape['e2e']:.1f} % "
                f"TTFT {it.mape['ttft']:.1f} % ITL {it.mape['itl']:.1f} %, all three within 10 % on "
                f"{it.within}/{len(exps)} runs  (steady state {sm['e2e']:.1f} / {sm['ttft']:.1f} / "
                f"{sm['itl']:.1f} %)  [{time.time() - t0:.0f} s]")
            for e, b, m in zip(exps, blis_ms, meas_ms):
                err = 100.0 * (b / m - 1.0)
                log(f"    {e.name}: E2E {err[0]:+.1f} %  TTFT {err[1]:+.1f} %  ITL {err[2]:+.1f} %")
        # what BLIS adds to the steady state, capped at ×/÷ DELTA_CAP: beyond that a run sits on a
        # queueing cliff (e.g. concurrency at max_num_seqs) the steady state cannot follow, and
        # the uncapped ratio would drag every parameter towards that one run
        delta = [np.clip(np.log(b / m), -math.log(DELTA_CAP), math.log(DELTA_CAP))
                 for b, m in zip(blis_ms, model_ms)]
    it, theta, scales = best
    cyc = np.asarray(cycle_fn(jnp.asarray(theta, jnp.float32), jnp.asarray(scales, jnp.float32)), np.float64)
    source = {
        "kind": SOURCE_KIND,
        "experiments": [{"name": e.name, **_truth_record(e)} for e in exps],
        "deployments": _deployment_records(exps, blis_settings.model_configs),
        "kernels": coeffs.kernels,
        "kernels_from": {"file": coeffs.source, "gpu": coeffs.gpu},
        "blis": {**file_record(blis_settings.blis), "replay": blis_settings.replay},
        "settings": settings.record(),
        "blis_mape_pct": {k: round(v, 2) for k, v in it.mape.items()},
        "blis_within_10pct": f"{it.within}/{len(exps)}",
    }
    if ftc:
        source["first_token"] = {"cycles": ftc, "mean_cycle_us": round(float(np.mean(cyc)), 1),
                                 "note": "export blis --out-dir gives each deployment alpha0 + cycles x its "
                                         "own steady-state cycle; one global file takes mean_cycle_us, the "
                                         "calibration runs' mean"}
    cal = WorkloadCalibration(stack_of(theta, source), it, history, time.time() - t0)
    if progress:
        log(f"roofcal: {cal.kept_text()}")
    return cal


def _deployment_records(exps, model_configs) -> list[dict]:
    """{model, tp} of each deployment of ``exps``, the model as a bundled name when the run's
    config is the bundled one of that name, else the path of its config (what ``export blis``
    distils for by default, :func:`roofcal.blis.distill.default_deployments`)."""
    from roofcal.blis.deployments import targets_for_experiments
    from roofcal.physics.config import resolve_config_path
    out = []
    for t in targets_for_experiments(exps, model_configs):
        path = Path(t.deployment.model).resolve()
        name = path.parent.name.lower()
        try:
            bundled = Path(resolve_config_path(name)).resolve() == path
        except RoofcalError:
            bundled = False
        rec = {"model": name if bundled else resources.display(path), "tp": int(t.deployment.tp)}
        if rec not in out:
            out.append(rec)
    return out


def _truth_record(exp) -> dict:
    """Provenance of a run's ground truth: the file it was read from, with its hash."""
    from roofcal.io import file_record
    if exp.kind == "trace":
        from roofcal.measurements.tracev2 import SERVER_FILE
        return file_record(exp.path / SERVER_FILE)
    return file_record(exp.path / "results" / "summary_lifecycle_metrics.json")


@dataclass
class CalibrationReport:
    """What :func:`calibrate_file` did: the calibration, the written file, a BLIS validation of
    every run with the per-deployment exports (held-out models included), and a text summary."""

    calibration: WorkloadCalibration
    coeffs: Coefficients
    validation: object
    text: str
    seconds: float


def _matches(exp, models: Sequence[str]) -> bool:
    m = exp.model.lower()
    return any(h.lower() in (m, m.rsplit("/", 1)[-1]) for h in models)


def calibrate_file(coeffs_path, exps, blis_settings, settings: WorkloadSettings = WorkloadSettings(),
                   out=None, name: str = "vllm", holdout: Sequence[str] | None = None,
                   overload: bool = True, kernels: str | None = None) -> CalibrationReport:
    """``roofcal workload calibrate``: fit stack ``name`` on ``exps`` (minus the ``holdout`` models),
    add it to the coefficient file as its default stack and write it to ``out`` (atomically; not
    written when None). The report compares every experiment's BLIS replay with measurement, each
    with its deployment's export (the fitted runs' from the chosen refresh; held-out runs, and
    overload runs unless ``overload`` is False, replayed once more, held-out deployments
    exported fresh from the fitted stack). The kernels are the file's set ``kernels`` (default:
    the one its default stack was calibrated with, else the file's default), recorded in the
    stack's source."""
    from roofcal.blis.run import run_experiments
    from roofcal.blis.validate import validation_of, validation_text
    t0 = time.time()
    coeffs = coeff_io.resolve_kernels(coeff_io.load(coeffs_path), kernels)
    holdout = list(holdout or [])
    unknown = [h for h in holdout if not any(_matches(e, [h]) for e in exps)]
    if unknown:
        raise RoofcalError(f"--holdout {unknown[0]}: no experiment of that model")
    fit_exps = [e for e in exps if not _matches(e, holdout)]
    cal = calibrate(fit_exps, coeffs, blis_settings, settings, name)
    src = dict(cal.stack.source)
    src["held_out_models"] = holdout
    stack = Stack(cal.stack.params, cal.stack.alphas_us, src)
    c = coeff_io.add_stack(coeffs, name, stack, default=True)
    c = coeff_io.roundtrip(c)
    fitted = {r.experiment: r for r in cal.best.results}
    rest = [e for e in exps if e.name not in fitted and (overload or not e.overload)]
    exports = list(cal.best.exports)
    missing = [e for e in rest if not any(_same_deployment(x, e) for x in exports)]
    if missing:
        exports += export_for(c, missing, blis_settings, settings.samples, settings.seed, settings.export,
                              settings.clock)
    alpha, beta = run_coefficients(exports, rest)
    more = {r.experiment: r for r in run_experiments(rest, blis_settings, alpha, beta, progress=True)}
    shown = [e for e in exps if e.name in fitted or e.name in more]
    results = [fitted.get(e.name) or more[e.name] for e in shown]
    v = validation_of(shown, results, blis_settings, sum(r.wall_s for r in results))
    if out is not None:                   # the file keeps its default kernel set; the stack records its own
        coeff_io.save(c, out)
    lines = [f"serving stack '{name}' (BLIS loss {cal.best.loss:.4f} on {sum(not e.overload for e in fit_exps)} runs, "
             f"refresh {cal.kept} of {len(cal.history)}"
             + (f"; held out: {', '.join(holdout)}" if holdout else "") + "):",
             f"  {cal.kept_text()}"]
    lines += [f"  {k} = {v_:.4g}" for k, v_ in cal.best.theta.items()]
    from roofcal.blis.deployments import usage
    lines += ["", "per-deployment exports (roofcal export blis --out-dir):",
              usage(exports, hardware_config=blis_settings.hardware_config, defaults=blis_settings.defaults,
                    blis=blis_settings.blis), "",
              validation_text(v)]
    return CalibrationReport(cal, c, v, "\n".join(lines), time.time() - t0)


def _same_deployment(export, exp) -> bool:
    return export.covers(exp)


def leave_one_model_out(coeffs_path, exps, blis_settings, settings: WorkloadSettings = WorkloadSettings(),
                        name: str = "vllm", kernels: str | None = None):
    """Leave-one-model-out: for each model, calibrate on the others' runs and replay the held-out
    model's runs in BLIS with its deployment's export (betas distilled for it by the native
    model, α0 from its own first-token delay). Returns (table of the held-out runs' summary rows,
    MAPE over the non-overload ones, runs with all three within 10 %, reports)."""
    import pandas as pd
    from roofcal.blis.validate import mape, within_10_count
    models = sorted({e.model for e in exps})
    if len(models) < 2:
        raise RoofcalError("leave-one-model-out needs runs of at least two models")
    rows, reports = [], []
    for m in models:
        rep = calibrate_file(coeffs_path, exps, blis_settings, settings, None, name, holdout=[m], overload=False,
                             kernels=kernels)
        t = rep.validation.table
        rows.append(t[(t["model"] == m.lower()) & (t["scope"] == "summary")])
        reports.append(rep)
    table = pd.concat(rows, ignore_index=True)
    return table, mape(table), within_10_count(table), reports


def saturation_rows(coeffs: Coefficients, exps, model_configs, seed: int = 42, clock: str = "sustained") -> list[dict]:
    """Per run: the offered rate (its busiest stage), the rate its deployment sustains for the
    run's requests (:func:`roofcal.model.serving.saturation` of the busiest stage's load, KV
    blocks from the run's server description or ``roofcal capacity``), what limits it, and
    whether the run is predicted to overload, and the predicted cycle there (``cycle_ms``). For a
    run that overloaded, ``cadence_rate``: the rate its measured cadence allows, the same running
    requests at the measured ITL instead of the predicted cycle, D / ((output − 1) · ITL) in
    requests/s (a server at full load finishes D requests every (output − 1) cycles); ``step_rate``:
    the same at the median gap between tokens (``step_ms``), a step without the stalls of
    preempted requests that the mean ITL carries. None for the others, whose ITL is not a full
    load's. ``clock``: the saturated stream at the clock the GPU's power limit allows
    (``sustained``, its operating point in ``clock``) or at the per-op tables' (``burst``)."""
    from roofcal.model.operating import power_of
    from roofcal.blis.run import model_config_folder
    from roofcal.physics.capacity import capacity
    from roofcal.physics.config import load_model
    from roofcal.physics.hardware import load_gpu
    gpu = load_gpu(coeffs.gpu)
    power = power_of(coeffs, gpu) if clock == "sustained" else None
    rows = []
    for e in exps:
        spec = load_model(model_config_folder(e, model_configs) / "config.json")
        kv = e.server.kv_blocks or capacity(spec, gpu, int(e.tp), max_num_batched_tokens=e.max_num_batched_tokens,
                                            max_num_seqs=e.max_num_seqs).kv_blocks
        loads = serving.loads_of(e, seed)
        busiest = max(loads, key=lambda ld: ld.rate)
        s = serving.saturation(coeffs.params, spec, gpu, int(e.tp), busiest, kv, power=power)
        itl_us = e.truth["summary"].itl_ms * 1000.0
        step_us = e.truth["summary"].token_gap_p50_ms * 1000.0     # NaN when the client did not report it
        full_load = e.overload and itl_us > 0

        def allows(cycle_us: float) -> float | None:
            return s.running / (max(busiest.output - 1.0, 1.0) * cycle_us) * 1e6 \
                if full_load and cycle_us > 0 else None
        rows.append({"experiment": e.name, "offered_rate": busiest.rate, "saturation_rate": s.rate,
                     "limit": s.limit, "running_at_limit": s.running, "predicted_overload": busiest.rate > s.rate,
                     "measured_overload": e.overload, "cycle_ms": s.cycle_us / 1e3,
                     "clock": _clock_cell(s.operating),
                     "cadence_rate": allows(itl_us),
                     "step_ms": step_us / 1e3 if full_load and step_us > 0 else None,
                     "step_rate": allows(step_us)})
    return rows


def _clock_cell(op) -> str:
    """A short text of an operating point for a table cell."""
    if op is None or not op.limit_w:
        return "burst"
    if not math.isfinite(op.demand_w):
        return "burst"
    if not op.limited:
        return f"boost ({op.demand_w:,.0f} W)"
    return (f"{op.clock_mhz:,.0f} MHz" if math.isfinite(op.clock_mhz) else f"{op.ratio:.2f}x") + \
        f" (x{op.compute_scale:.3f})"

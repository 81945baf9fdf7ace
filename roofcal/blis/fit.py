"""Fitting BLIS's trained-physics β coefficients (BLIS's own basis, one global set).

BLIS's step time is ``Σ_j β_j · basis_j`` (:mod:`roofcal.blis.basis`), linear in β once the split
forms are used, which is what roofcal always fits and writes: all 11 values (β1a/β1b and β2a/β2b
split, β_EP explicit). Targets, in µs per step, come from two sources:

* **distillation** — steps sampled by :mod:`roofcal.blis.sampling` for the user's deployments and
  predicted by the calibrated native model (:func:`roofcal.model.step_breakdown`);
* **measured** — whole-step measurements (step JSONL, splitwise), mapped to BLIS requests by
  :func:`roofcal.blis.sampling.blis_requests_from_steps`.

Objective: :func:`roofcal.metrics.log_ratio_sq` of the *float* (untruncated) BLIS step time
against the targets — each source weighted by ``source_weights`` (equal by default) and, within
a source, each row by its own weight (1 unless given: e.g. how often a deployment runs that step)
— plus a Gaussian prior of ``prior_rows`` pseudo-rows pulling each β towards the input
``defaults.yaml`` value. The prior is scaled per coefficient by how much a unit of it moves a
step's relative time, so it only decides directions the data cannot (e.g. β5 per layer and β7
per step are both constant within one deployment), and a β whose basis is zero on every row (β8
for dense models, β_EP without DP) keeps its input value.

Every β stays inside physical bounds (:data:`BETA_BOUNDS`, with the reasons): without them a
single deployment's fit lets one term carry another's cost — on Mixtral-8x7B TP 2 alone the
prefill-compute coefficient went to 0 and the prefill KV-write one to 1,250 (KV traffic at
1/1,250 of HBM bandwidth), both terms being ∝ prefill tokens. The start is the exact bounded
least-squares solution of the linearised (relative-error) problem with the same prior
(:func:`scipy.optimize.lsq_linear`), refined by L-BFGS-B on the exact loss in float64, keeping
whichever is better.

Held-out rows (a seeded 20% of sampled steps; whole configurations of measured steps, as
:func:`roofcal.metrics.split_groups` holds them out in ``roofcal fit``) are scored with BLIS's integer
step time, next to the native model's error and the input defaults' error.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Sequence

import numpy as np

from roofcal.blis.basis import (
    BASIS_TERMS,
    BlisConstants,
    BlisHardware,
    basis_for_constants,
    blis_constants,
    blis_step_time,
    effective_beta,
)
from roofcal.blis import FIT_DEFAULTS
from roofcal.blis.config import BlisModel, blis_model_from_dict, read_config_json
from roofcal.blis.sampling import (
    SamplerSettings,
    blis_requests_from_steps,
    deployment_seed,
    kv_capacity_tokens,
    sample_steps,
)
from roofcal.model.coeffs import round_sig
from roofcal.physics.config import ModelSpec, Parallel, check_tp, load_model, resolve_config_path, served
from roofcal.errors import RoofcalError
from roofcal.physics.hardware import GPUSpec, load_gpu
from roofcal.metrics import error_summary, split_groups
from roofcal.model.combine import step_breakdown
from roofcal.measurements.stepdata import StepData
from roofcal.physics.steps import StepBatch

#: The basis term each β index multiplies in the 11-value (fully split) form (BLIS index order).
BETA_BASIS = (
    "t_pf_compute_us",
    "t_dc_compute_us",
    "t_weight_us",
    "t_tp_allreduce_us",
    "num_layers",
    "batch_size",
    "constant",
    "interleaved_moe_layers",
    "t_pf_kv_us",
    "t_dc_kv_us",
    "t_moe_dispatch_us",
)

#: Readable names of the 11 β values, in BLIS index order (units: – = dimensionless).
BETA_NAMES = (
    "beta1a_prefill_compute",
    "beta2a_decode_compute",
    "beta3_weight_loading",
    "beta4_tp_allreduce",
    "beta5_per_layer_us",
    "beta6_per_request_us",
    "beta7_per_step_us",
    "beta8_per_interleaved_moe_layer_us",
    "beta1b_prefill_kv",
    "beta2b_decode_kv",
    "beta_ep_moe_dispatch",
)


#: Physical bounds of each β (BLIS index order), [low, high]. Compute terms divide FLOPs by the
#: datasheet peak and byte terms bytes by HBM bandwidth, so a coefficient is 1 / efficiency; BLIS
#: adds terms that overlap on the GPU, so a hidden term may go to 0 (decode compute under weight
#: loading), but none may run faster than its unit allows by more than the overlap of the others:
#:
#: * β1a, β2a compute ≤ 10 (≥ 10 % of peak; BLIS's causal attention counts 3× the FLOPs);
#: * β3 weights in [0.5, 4]: weights stream at 25–100 % of HBM bandwidth (below 1 only where another
#:   term covers part of the same time);
#: * β4 TP all-reduce ≤ 50: its basis divides by HBM, not NVLink bandwidth (≈ 7.4× faster
#:   nominally), and small messages are latency-bound (≈ 5–10 µs per call, tens of basis units);
#: * β1b, β2b KV ≤ 4: KV reads and writes at ≥ 25 % of HBM bandwidth — the bound that keeps the
#:   prefill KV term from carrying the prefill compute;
#: * β5 per layer ≤ 200 µs, β6 per request ≤ 1 ms, β7 per step ≤ 20 ms, β8 per MoE layer ≤ 2 ms:
#:   launch gaps and CPU work of a step (vLLM's CPU side is ≈ 1–3 ms per step, vidur);
#: * β_EP dispatch ≤ 50, as β4.
BETA_BOUNDS = (
    (0.0, 10.0), (0.0, 10.0), (0.5, 4.0), (0.0, 50.0), (0.0, 200.0), (0.0, 1000.0),
    (0.0, 20000.0), (0.0, 2000.0), (0.0, 4.0), (0.0, 4.0), (0.0, 50.0),
)


@dataclass(frozen=True)
class Deployment:
    """A model (bundled name or config path, as :attr:`roofcal.config.ModelSpec.ref` gives it) served
    at tensor-parallel degree ``tp``, and beyond TP as ``parallel`` says (data-parallel ranks,
    expert parallelism, MoE comm backend; default: TP alone).

    BLIS simulates a data-parallel deployment as one scheduler over the batch of all its ranks
    (with ``--dp 2`` and ``--max-num-seqs 4`` its batch stays 4 and each step's time halves,
    measured with the bundled binary), where vLLM runs a scheduler per rank: so a deployment's
    server limits and KV cache are :meth:`ranks` times one rank's."""

    model: str
    tp: int
    parallel: Parallel = field(default=Parallel())

    @property
    def ranks(self) -> int:
        """Data-parallel ranks (1 for a TP deployment)."""
        return int(self.parallel.dp)

    @property
    def label(self) -> str:
        """``tp<T>``, with ``dp<N>``, ``ep`` and a non-default MoE comm backend where given."""
        p = self.parallel
        if p == Parallel():
            return f"tp{self.tp}"
        return f"tp{self.tp} dp{p.dp}" + (" ep" if p.ep else "") \
            + ("" if p.moe_comm == Parallel().moe_comm else f" {p.moe_comm}")

    @property
    def title(self) -> str:
        """How printed lines name it (:meth:`roofcal.physics.config.Parallel.title`)."""
        return self.parallel.title(self.tp)

    def served(self, spec: ModelSpec) -> ModelSpec:
        """``spec`` as this deployment serves it (:func:`roofcal.physics.config.served`)."""
        return served(spec, self.parallel, where=f"--model {self.model} --tp {self.tp} --dp {self.parallel.dp}")

    def spec(self) -> ModelSpec:
        """Its model loaded and laid out as it is served (:meth:`served`)."""
        return self.served(load_model(self.model))

    def record(self) -> dict:
        """``{model, tp}`` for a file's ``deployments`` list, with ``dp``, ``ep`` and ``moe_comm``
        where the layout goes beyond TP (:func:`deployments_from_records` reads it back)."""
        p = self.parallel
        out = {"model": self.model, "tp": int(self.tp)}
        return out if p == Parallel() else {**out, "dp": p.dp, "ep": p.ep, "moe_comm": p.moe_comm}

    def blis_flags(self) -> list[str]:
        """BLIS's flags for the layout beyond TP (none for a TP deployment)."""
        p = self.parallel
        if p == Parallel():
            return []
        return ["--dp", str(p.dp)] + (["--enable-expert-parallel"] if p.ep else []) \
            + ["--moe-comm-backend", p.moe_comm]


@dataclass(frozen=True)
class BlisFitSettings:
    """Settings of a BLIS-form fit; all recorded in the output's provenance."""

    seed: int = FIT_DEFAULTS["seed"]
    holdout: float = FIT_DEFAULTS["holdout"]  # fraction of sampled steps (and of measured configurations) held out
    samples: int = FIT_DEFAULTS["samples"]  # distillation steps per deployment (0: no distillation)
    iters: int = FIT_DEFAULTS["iters"]  # L-BFGS iterations
    prior_rows: float = 1e-3  # κ: pseudo-rows holding each β at its input value (a tie-breaker)
    sampler: SamplerSettings = SamplerSettings()
    source_weights: tuple = (("distill", 1.0), ("measured", 1.0))  # relative weight of each source

    def record(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k != "sampler"}
        d["sampler"] = self.sampler.record()
        d["source_weights"] = dict(self.source_weights)
        d["loss"] = "weighted mean squared log-ratio of the float BLIS step time + Gaussian prior (kappa pseudo-rows) at the input betas"
        d["optimizer"] = "bounded least squares start, then L-BFGS-B within BETA_BOUNDS, float64"
        return d


# --------------------------------------------------------------------------------------------
# deployments


@dataclass(frozen=True, eq=False)
class ResolvedDeployment:
    """A deployment with everything the fit needs: roofcal's and BLIS's model readings, BLIS's
    constants for the hardware entry, and (for sampling) the context limit and KV capacity."""

    deployment: Deployment
    spec: ModelSpec
    blis_model: BlisModel
    constants: BlisConstants
    max_context: int  # tokens: max_position_embeddings (or the sampler's cap when absent)


def resolve_deployment(dep: Deployment, hw: BlisHardware, where: str = "",
                       spec: ModelSpec | None = None) -> ResolvedDeployment:
    """Load the model both ways and apply BLIS's deployment rules (TP divides heads and KV heads,
    positive shapes and peaks); refusals name the deployment.

    ``spec``: the model already loaded (e.g. a step file's; ``dep.model`` is then its
    :attr:`~roofcal.config.ModelSpec.ref`), else ``dep.model`` is loaded. BLIS's reading comes from
    the config file the spec was loaded from, read once for BLIS's model and the context limit."""
    prefix = where or f"--model {dep.model} --tp {dep.tp}"
    try:
        spec = spec if spec is not None else load_model(dep.model)
        check_tp(spec, int(dep.tp), where=prefix)
        spec = dep.served(spec)
        path = spec.config_path or resolve_config_path(spec.ref)
        cfg = read_config_json(path)
        blis_model = blis_model_from_dict(cfg, spec.name, path)
        constants = blis_constants(blis_model, hw, int(dep.tp), dep.ranks,
                                   dep.parallel.moe_comm if dep.ranks > 1 else "")
    except RoofcalError as err:
        msg = str(err)
        raise RoofcalError(msg if msg.startswith(prefix) else f"{prefix}: {msg}") from None
    raw = cfg.get("max_position_embeddings")
    ok = isinstance(raw, int) and not isinstance(raw, bool) and raw > 1
    return ResolvedDeployment(dep, spec, blis_model, constants, raw if ok else SamplerSettings().max_context)


# --------------------------------------------------------------------------------------------
# rows


@dataclass(frozen=True, eq=False)
class Rows:
    """Steps of one source ready to fit or score; arrays of shape (N,).

    ``basis``: BLIS basis terms (:data:`roofcal.blis.basis.BASIS_TERMS`, float64);
    ``target_us``: what to fit (native prediction or measurement); ``native_us``: the native
    model's prediction (None without a native model); ``test``: held-out rows.
    """

    source: str
    basis: dict
    target_us: np.ndarray
    native_us: np.ndarray | None
    phase: np.ndarray
    label: np.ndarray
    test: np.ndarray
    weight: np.ndarray | None = None   # per-row weight within the source (None: 1 each)

    def __len__(self) -> int:
        return len(self.target_us)

    @property
    def weights(self) -> np.ndarray:
        return np.ones(len(self)) if self.weight is None else np.asarray(self.weight, np.float64)


def concat_rows(parts: Sequence[Rows]) -> Rows:
    """Rows of one source from several deployments, in order."""
    native = None if any(p.native_us is None for p in parts) else np.concatenate([p.native_us for p in parts])
    return Rows(
        parts[0].source,
        {k: np.concatenate([np.asarray(p.basis[k], np.float64) for p in parts]) for k in BASIS_TERMS},
        np.concatenate([p.target_us for p in parts]),
        native,
        np.concatenate([p.phase for p in parts]),
        np.concatenate([p.label for p in parts]),
        np.concatenate([p.test for p in parts]),
        None if all(p.weight is None for p in parts) else np.concatenate([p.weights for p in parts]),
    )


def _concat_batches(batches: Sequence[StepBatch]) -> StepBatch:
    """Stack the steps of several batches, zero-padding chunk and decode columns to the widest."""
    P = max(b.prefill_new.shape[1] for b in batches)
    D = max(b.decode_ctx.shape[1] for b in batches)
    pad = lambda a, w: np.pad(np.asarray(a, np.float32), ((0, 0), (0, w - a.shape[1])))
    return StepBatch(*(np.concatenate([pad(getattr(b, name), width) for b in batches])
                       for name, width in (("prefill_new", P), ("prefill_cached", P), ("prefill_mask", P),
                                           ("decode_ctx", D), ("decode_mask", D))))


def native_times(params: dict, jobs: Sequence[tuple[ModelSpec, GPUSpec, int, StepBatch]]) -> list[np.ndarray]:
    """Native step times (µs, float64) of each (model, GPU, TP, steps) job, in order.

    Jobs of one deployment run as a single batch, so each deployment compiles the model once."""
    groups: dict[tuple, list[int]] = {}
    for i, (spec, gpu, tp, _) in enumerate(jobs):
        groups.setdefault((spec, gpu, int(tp)), []).append(i)
    out: list = [None] * len(jobs)
    for (spec, gpu, tp), idx in groups.items():
        batches = [jobs[i][3] for i in idx]
        total = np.asarray(step_breakdown(params, spec, gpu, tp, _concat_batches(batches))["total"], np.float64)
        for i, part in zip(idx, np.split(total, np.cumsum([b.num_steps for b in batches])[:-1])):
            out[i] = part
    return out


def _basis_np(constants: BlisConstants, requests) -> dict:
    return {k: np.asarray(v, np.float64) for k, v in basis_for_constants(constants, requests).items()}


def build_rows(params: dict | None, gpu: GPUSpec | None, deployments: Sequence[ResolvedDeployment],
               settings: BlisFitSettings, datasets: Sequence[StepData] = (), hw: BlisHardware | None = None,
               measured_split: tuple[float, int] | None = None,
               dataset_weights: Sequence[np.ndarray] | None = None,
               dataset_sources: Sequence[str] | None = None) -> dict[str, Rows]:
    """{'distill': rows, 'measured': rows} (sources without steps left out).

    Distillation: ``settings.samples`` steps sampled per deployment, ``settings.holdout`` of them
    held out (sample and held-out rows depend only on (``settings.seed``, model, TP)), targets =
    native predictions with ``params`` on ``gpu``.
    Measured: ``datasets`` with their BLIS requests (:func:`blis_requests_from_steps`) on ``hw``,
    configurations held out as ``roofcal fit`` holds them out with ``measured_split`` = (holdout,
    seed) (e.g. the coefficient file's, so its held-out configurations stay held out; default
    ``settings``'); steps without any request are dropped; native predictions only when
    ``params`` is given; ``dataset_weights``: a weight per step of each dataset (default 1);
    ``dataset_sources``: the source each dataset's rows count under (default ``measured``; e.g.
    a deployment's saturated steps, weighted on their own)."""
    holdout, seed = measured_split if measured_split is not None else (settings.holdout, settings.seed)
    pending, jobs = [], []
    for r in deployments:
        name, tp, ranks = r.spec.name, int(r.deployment.tp), r.deployment.ranks
        # a data-parallel deployment's batch is all its ranks': each rank's limits and KV cache
        capacity = ranks * kv_capacity_tokens(r.spec, gpu, tp, settings.sampler.gpu_memory_utilization)
        sampler = settings.sampler if ranks == 1 else replace(
            settings.sampler, max_num_seqs=ranks * settings.sampler.max_num_seqs,
            token_budgets=tuple(ranks * b for b in settings.sampler.token_budgets))
        key = name if ranks == 1 else f"{name} {r.deployment.label}"
        sample = sample_steps(deployment_seed(settings.seed, key, tp), settings.samples, r.max_context,
                              capacity, sampler)
        n = len(sample)
        test = np.zeros(n, bool)
        pick = deployment_seed(settings.seed, key, tp, stream=1).permutation(n)
        test[pick[: int(round(settings.holdout * n))]] = True
        pending.append(("distill", _basis_np(r.constants, sample.requests), None, sample.phase,
                        np.full(n, f"{name} {r.deployment.label}"), test, np.ones(n, bool), None))
        jobs.append((r.spec, gpu, tp, sample.steps))
    for i, d in enumerate(datasets):
        r = resolve_deployment(Deployment(d.model.ref, d.tp, d.model.parallel), hw,
                               where=f"{d.source}: {d.model.name} tp {d.tp}", spec=d.model)
        requests = blis_requests_from_steps(d.batch, d.source)
        source = "measured" if dataset_sources is None else dataset_sources[i]
        pending.append((source, _basis_np(r.constants, requests), np.asarray(d.measured_us, np.float64),
                        np.asarray(d.phase), np.full(len(d), f"{d.model.name} tp{d.tp}"),
                        split_groups(d.config, holdout, seed + 1), requests.mask.any(1),
                        None if dataset_weights is None else np.asarray(dataset_weights[i], np.float64)))
        jobs.append((d.model, load_gpu(d.gpu), d.tp, d.batch))
    native = native_times(params, jobs) if params is not None else [None] * len(jobs)
    parts: dict[str, list[Rows]] = {}
    for (source, basis, measured, phase, label, test, keep, weight), pred in zip(pending, native):
        target = pred if source == "distill" else measured
        parts.setdefault(source, []).append(_take(Rows(source, basis, target, pred, phase, label, test, weight), keep))
    return {source: concat_rows(p) for source, p in parts.items()}


def _take(rows: Rows, sel: np.ndarray) -> Rows:
    return Rows(rows.source, {k: v[sel] for k, v in rows.basis.items()}, rows.target_us[sel],
                None if rows.native_us is None else rows.native_us[sel], rows.phase[sel], rows.label[sel],
                rows.test[sel], None if rows.weight is None else rows.weight[sel])


# --------------------------------------------------------------------------------------------
# the fit


def design_matrix(basis: dict) -> np.ndarray:
    """(N, 11) matrix X with BLIS's float step time (fully split form) = X @ β."""
    return np.stack([np.asarray(basis[name], np.float64) for name in BETA_BASIS], axis=1)


@dataclass(frozen=True)
class BetaFit:
    """Fitted β (11 values, BLIS order), the indices kept at their input value (no data), the
    training objective and the training rows used."""

    beta: tuple[float, ...]
    kept: tuple[int, ...]
    objective: float
    n_train: int


def _objective(beta, X, y, w, center, strength):
    """(loss, gradient) of the weighted mean squared log-ratio of X·β to y plus the prior."""
    p = np.maximum(X @ beta, 1e-12)
    r = np.log(p / y)
    loss = float(np.sum(w * r * r) + np.sum(strength * (beta - center) ** 2))
    grad = 2.0 * (X.T @ (w * r / p)) + 2.0 * strength * (beta - center)
    return loss, grad


def fit_betas(rows: Sequence[Rows], input_beta: Sequence[float], iters: int = 300,
              prior_rows: float = 1e-3, source_weights: dict | None = None) -> BetaFit:
    """Fit the 11 β on the training rows of ``rows`` (see the module docstring).

    ``input_beta``: the input defaults' β (any BLIS length ≥ 7; resolved to 11 values as BLIS does);
    ``source_weights``: {source: relative weight} (default: equal). Fitted values lie within
    :data:`BETA_BOUNDS`, rounded to 9 significant digits; values contributing less than 1e-7 of
    a step's time are set to exactly 0 (where the bound allows); kept values are the input's."""
    from scipy.optimize import lsq_linear, minimize

    center = np.asarray(effective_beta(input_beta).beta, np.float64)
    train = [_take(r, ~r.test) for r in rows if len(r) and (~r.test).any()]
    if not train:
        raise RoofcalError("blis fit: no training steps (give --coeffs to distil, or --steps with measurements)")
    sw = dict(source_weights or {})
    X = np.concatenate([design_matrix(r.basis) for r in train])
    y = np.concatenate([r.target_us for r in train])
    w = np.concatenate([sw.get(r.source, 1.0) * r.weights / max(r.weights.sum(), 1e-300) for r in train])
    if not np.all(np.isfinite(y) & (y > 0)) or not np.all(np.isfinite(X)):
        raise RoofcalError("blis fit: step times to fit must be positive and finite")
    if not (np.all(np.isfinite(w)) and np.all(w >= 0) and w.sum() > 0):
        raise RoofcalError("blis fit: row and source weights must be finite, ≥ 0 and not all 0")
    w = w / w.sum()
    rel = X / y[:, None]
    m = np.sqrt((w[:, None] * rel**2).sum(0))  # relative effect of a unit of each β
    free = m > 0
    lo, hi = (np.array(b, np.float64) for b in zip(*BETA_BOUNDS))
    target = np.clip(center, lo, hi)            # the prior's centre, inside the bounds
    strength = prior_rows * m**2 / len(y)
    # bounded least squares of the linearised problem (relative error) with the prior; columns of
    # kept betas are all zero (no data, no prior), so they drop out
    A = np.concatenate([np.sqrt(w)[:, None] * rel, np.diag(np.sqrt(strength))])
    b = np.concatenate([np.sqrt(w), np.sqrt(strength) * target])
    start = center.copy()
    start[free] = lsq_linear(A[:, free], b, bounds=(lo[free], hi[free]), method="bvls").x
    Xf = X[:, free]

    def f(beta_free):
        return _objective(beta_free, Xf, y, w, target[free], strength[free])

    res = minimize(f, start[free], jac=True, method="L-BFGS-B", bounds=list(zip(lo[free], hi[free])),
                   options={"maxiter": iters})

    def finish(beta_free):
        beta = center.copy()
        beta[free] = beta_free
        beta = np.where(free & (beta * m < 1e-7) & (lo <= 0), 0.0, beta)
        rounded = np.clip([round_sig(v) for v in beta], lo, hi)
        beta = np.where(free, rounded, center)  # kept values stay exact
        return beta, f(beta[free])[0]

    candidates = [finish(start[free]), finish(res.x)]
    beta, value = min(candidates, key=lambda c: (not np.isfinite(c[1]), c[1]))
    return BetaFit(tuple(float(v) for v in beta), tuple(int(i) for i in np.flatnonzero(~free)), value, len(y))


# --------------------------------------------------------------------------------------------
# scores


def _summary(pred: np.ndarray, target: np.ndarray, prefix: str) -> dict:
    s = error_summary(pred, target)
    return {f"{prefix}_mape": round(s["mape"], 4), f"{prefix}_p90": round(s["p90"], 4),
            f"{prefix}_bias": round(s["bias"], 4)}


def score_rows(rows: Rows, beta: Sequence[float], input_beta: Sequence[float]) -> dict:
    """{'train'|'heldout': {group: scores}} for one source: groups ``all``, each phase, each
    deployment. Scores: n, and MAPE / p90 / bias (%) of BLIS's integer step time with the fitted β
    (``blis_*``) and with the input β (``input_*``), and of the native model (``native_*``) when
    it is not itself the target."""
    got = np.asarray(blis_step_time(rows.basis, list(beta)), np.float64)
    before = np.asarray(blis_step_time(rows.basis, list(input_beta)), np.float64)
    out: dict = {"train": {}, "heldout": {}}
    for split, sel in (("train", ~rows.test), ("heldout", rows.test)):
        groups = [("all", sel)]
        groups += [(p, sel & (rows.phase == p)) for p in ("prefill", "decode", "mixed")]
        groups += [(lab, sel & (rows.label == lab)) for lab in sorted(set(rows.label.tolist()))]
        for name, g in groups:
            if not g.any():
                continue
            entry: dict = {"n": int(g.sum())}
            if rows.native_us is not None and rows.source != "distill":
                entry.update(_summary(rows.native_us[g], rows.target_us[g], "native"))
            entry.update(_summary(got[g], rows.target_us[g], "blis"))
            entry.update(_summary(before[g], rows.target_us[g], "input"))
            out[split][name] = entry
    return out


@dataclass(frozen=True)
class BlisFitResult:
    """A fitted β with its scores: ``metrics`` = {'train'|'heldout': {source: {group: scores}}}."""

    beta: tuple[float, ...]
    kept: tuple[int, ...]
    objective: float
    n_rows: dict
    metrics: dict = field(default_factory=dict)


def fit_blis(rows: Sequence[Rows], input_beta: Sequence[float], settings: BlisFitSettings = BlisFitSettings()) -> BlisFitResult:
    """Fit β on ``rows`` (one :class:`Rows` per source) and score every source."""
    rows = [r for r in rows if len(r)]
    fit = fit_betas(rows, input_beta, settings.iters, settings.prior_rows, dict(settings.source_weights))
    metrics: dict = {"train": {}, "heldout": {}}
    for r in rows:
        s = score_rows(r, fit.beta, input_beta)
        for split in metrics:
            metrics[split][r.source] = s[split]
    n_rows = {r.source: {"train": int((~r.test).sum()), "heldout": int(r.test.sum())} for r in rows}
    return BlisFitResult(fit.beta, fit.kept, fit.objective, n_rows, metrics)


def deployments_from_records(records, where: str) -> list[Deployment]:
    """``[{model, tp}, ...]`` (a coefficient file's ``fit.deployments``; with ``dp``, ``ep`` and
    ``moe_comm`` where given: :meth:`Deployment.record`) → deployments."""
    if not isinstance(records, list):
        raise RoofcalError(f"{where}: expected a list of {{model, tp}}")
    out = []
    for i, r in enumerate(records):
        model = r.get("model") if isinstance(r, dict) else None
        tp = r.get("tp") if isinstance(r, dict) else None
        if not isinstance(model, str) or isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
            raise RoofcalError(f"{where}[{i}]: expected {{model: <name>, tp: <integer ≥ 1>}}, got {r!r}")
        dp, ep, comm = r.get("dp", 1), r.get("ep", False), r.get("moe_comm", Parallel().moe_comm)
        if isinstance(dp, bool) or not isinstance(dp, int) or dp < 1 or not isinstance(ep, bool) \
                or not isinstance(comm, str):
            raise RoofcalError(f"{where}[{i}]: expected dp an integer ≥ 1, ep true or false and moe_comm "
                               f"a backend name, got {r!r}")
        out.append(Deployment(model, tp, Parallel(dp, ep, comm)))
    return out


__all__ = [
    "BETA_BASIS", "BETA_BOUNDS", "BETA_NAMES", "BetaFit", "BlisFitResult", "BlisFitSettings", "Deployment",
    "ResolvedDeployment", "Rows", "concat_rows",
    "deployments_from_records", "design_matrix", "fit_betas", "fit_blis", "resolve_deployment", "score_rows",
]

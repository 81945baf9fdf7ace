"""A server under steady load: step times → mean TTFT, ITL and E2E, and what a request waits for
its first token.

The mean-field picture of a vLLM server (or BLIS's replay of one) fed open-loop arrivals at
``rate`` requests/s, each a ``prompt`` of which ``cached`` tokens hit the prefix cache and
``output`` generated tokens, under a per-step token budget ``budget`` (chunked prefill):

* every step decodes one token for each of the ``D`` running requests; by Little's law
  ``D = rate · (output − 1) · τ`` with ``τ`` the mean step (cycle) time;
* the scheduler fills the budget with decodes first, so a prompt's ``new = prompt − cached``
  tokens take ``k = ⌈new / (budget − D)⌉`` chunked steps (1 when the prompt fits); a fraction
  ``f = rate · k · τ`` of steps prefill (beyond 1, several prompts share a step, up to what the
  budget left after the decodes holds);
* ``τ = (1 − f) · t_decode(D) + f · t_mixed(D)``, solved by damped fixed-point iteration;
* **the first token** reaches the client after (:func:`first_token_parts`)::

      API ingestion           α0
      waiting for a step      τ / 2      (the residual of the step running when it is queued)
      its prefill             k · t_mixed(D)   (chunked, over its cached prefix)
      output processing       α2
      the cycle until its output leaves   c · τ

  where ``c`` (``first_token_cycles``) is how many cycles after its step a token reaches the
  client: vLLM processes a step's outputs while the next step runs, so a token leaves about one
  cycle after the step that computed it (first and last token alike: TTFT and E2E shift, ITL
  does not). Then ``ITL = τ + α2`` and ``E2E = TTFT + (output − 1) · ITL + α1`` (BLIS's alphas,
  docs/blis-latency-models.md §1.7).

BLIS simulates the wait, the prefill and the decode steps itself; what it cannot follow is the
last term — it has no per-request term proportional to the step time — so a BLIS replay of a
deployment takes α0 + c·τ as its queueing delay (:func:`blis_alpha0`), τ at that deployment's
load.

It is differentiable in the step times and alphas, which is what calibration needs: the Jacobian
of the measured means with respect to a serving stack's parameters
(:mod:`roofcal.calibration.workload`). What it leaves out — queueing bursts, max_num_seqs,
preemption — BLIS itself measures, and the calibration carries as a correction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from roofcal.physics.steps import Step, StepBatch, batch_steps

#: fixed-point iterations of the mean step time (damped by half; converges well within this)
ITERATIONS = 60


@dataclass(frozen=True)
class Load:
    """One stage of steady load on one deployment: ``rate`` requests/s for ``duration`` s, each a
    ``prompt`` (mean tokens; ``cached`` of them in the prefix cache) and ``output`` generated
    tokens; at most ``max_seqs`` requests run at once and a step computes at most ``budget``
    tokens."""

    rate: float
    duration: float
    prompt: float
    cached: float
    output: float
    max_seqs: int
    budget: int = 2048

    @property
    def requests(self) -> float:
        return self.rate * self.duration

    @property
    def new_tokens(self) -> int:
        """Prompt tokens a request computes (≥ 1)."""
        return max(1, int(round(self.prompt - self.cached)))


def loads_of(exp, seed: int = 42) -> tuple[Load, ...]:
    """The stages of an experiment (:class:`roofcal.measurements.workload.Experiment`) as the
    server saw them: per stage the rate, the mean prompt, its mean cached prefix
    (:meth:`~roofcal.measurements.requests.Requests.cached_tokens`: a pool prompt's whole blocks
    after its first use) and the mean generated tokens of the requests as sent."""
    req = exp.requests(seed)
    prompt, cached = req.prompt_tokens, req.cached_tokens()
    out = []
    for i, s in enumerate(exp.stages):
        sel = req.stage == i
        out.append(Load(rate=float(s.rate), duration=float(s.duration),
                        prompt=float(prompt[sel].mean()), cached=float(cached[sel].mean()),
                        output=float(req.output_tokens[sel].mean()), max_seqs=int(exp.max_num_seqs),
                        budget=int(exp.max_num_batched_tokens)))
    return tuple(out)


def chunk_tokens(load: Load, d: int) -> int:
    """Prompt tokens one chunk computes with ``d`` decodes running (the budget left after them)."""
    return max(1, min(load.new_tokens, load.budget - d))


def step_grid(load: Load) -> StepBatch:
    """The steps whose times the steady state needs: for D = 0 … ``max_seqs`` running decodes
    (context ``prompt + output/2``), a decode-only step and the same step with one prefill chunk
    (:func:`chunk_tokens` new tokens after the cached prefix). Shape: 2·(max_seqs + 1) steps,
    decode-only first."""
    ctx = int(round(load.prompt + load.output / 2))
    cached = int(round(load.cached))
    decode = [Step(decode=(ctx,) * d) for d in range(load.max_seqs + 1)]
    mixed = [Step(prefill=((chunk_tokens(load, d), cached),), decode=(ctx,) * d)
             for d in range(load.max_seqs + 1)]
    return batch_steps(decode + mixed)


def _chunk_sizes(load: Load) -> np.ndarray:
    """Tokens of one chunk with D = 0 … max_seqs decodes running."""
    return np.array([chunk_tokens(load, d) for d in range(load.max_seqs + 1)], np.float32)


def _chunks(load: Load) -> np.ndarray:
    """Chunked steps a prompt takes with D = 0 … max_seqs decodes running."""
    return np.array([math.ceil(load.new_tokens / chunk_tokens(load, d)) for d in range(load.max_seqs + 1)],
                    np.float32)


def steady_state(t_decode, t_mixed, load: Load, alphas, first_token_cycles: float = 0.0) -> dict:
    """Mean TTFT, ITL, E2E (µs), cycle ``step_us``, running requests ``running`` (D), the prefill
    chunks per step ``mixed_fraction`` (f: below 1 the share of steps that prefill; above 1 — a
    large budget and short prompts — several prompts per step, each costing what one chunk adds
    to a decode step, up to the budget) and the first-token
    delay's parts (``api_us``, ``wait_us``, ``prefill_us``, ``output_us``, ``cycle_delay_us``)
    of one stage.

    ``t_decode`` / ``t_mixed``: step times (µs) for D = 0 … max_seqs (:func:`step_grid`);
    ``alphas``: (α0 API ingestion, α1 post-decode, α2 per output token) in µs;
    ``first_token_cycles``: cycles between a step and its tokens reaching the client."""
    rate = load.rate * 1e-6                                     # requests/µs
    out = _steady_state(t_decode, t_mixed, _chunks(load), _chunk_sizes(load),   # NumPy: no program
                        rate, rate * (load.output - 1), load.budget, load.output - 1,
                        alphas[0], alphas[1], alphas[2], first_token_cycles, load.max_seqs)
    return {**out, "api_us": alphas[0], "output_us": alphas[2]}  # as given, not through float32


@partial(jax.jit, static_argnames=("max_seqs",))
def _steady_state(t_decode, t_mixed, chunks, ctok, rate, rate_out, budget, out1, a0, a1, a2,
                  first_token_cycles, max_seqs: int) -> dict:
    """:func:`steady_state` as one compiled program per grid size, the stage's numbers as its
    arguments (Python numbers weakly typed, as they were as constants): ``rate`` requests/µs,
    ``rate_out`` = rate · (output − 1) and ``out1`` = output − 1, computed in Python as before.
    Run op by op, every stage of an export compiled its own fixed-point loop (84 for the 3
    deployments' runs, ≈ 1.5 s warm)."""
    grid = jnp.arange(max_seqs + 1, dtype=jnp.float32)

    def prefills(d, tau):
        """Chunks per step: a share of steps below 1; several prompts in a step above, as many as
        the token budget left after the decodes holds."""
        f = rate * jnp.interp(d, grid, chunks) * tau
        return jnp.clip(f, 0.0, jnp.maximum(1.0, (budget - d) / jnp.interp(d, grid, ctok)))

    def mean_step(tau):
        d = jnp.clip(rate_out * tau, 0.0, float(max_seqs))
        f = prefills(d, tau)
        return (1 - f) * jnp.interp(d, grid, t_decode) + f * jnp.interp(d, grid, t_mixed)

    # start from a busy step: τ = 0 (no step ever runs) is a spurious fixed point
    tau = jax.lax.fori_loop(0, ITERATIONS, lambda _, t: 0.5 * t + 0.5 * mean_step(t), t_mixed[1])
    d = jnp.clip(rate_out * tau, 0.0, float(max_seqs))
    mixed = prefills(d, tau)
    parts = {"api_us": a0, "wait_us": 0.5 * tau,
             "prefill_us": jnp.interp(d, grid, chunks) * jnp.interp(d, grid, t_mixed),
             "output_us": a2, "cycle_delay_us": first_token_cycles * tau}
    ttft = sum(parts.values())
    itl = tau + a2
    return {"ttft_us": ttft, "itl_us": itl, "e2e_us": ttft + out1 * itl + a1,
            "step_us": tau, "running": d, "mixed_fraction": mixed, **parts}


#: keys of :func:`steady_state` averaged by :func:`run_means`
MEAN_KEYS = ("ttft_us", "itl_us", "e2e_us", "step_us", "running", "mixed_fraction", "api_us", "wait_us",
             "prefill_us", "output_us", "cycle_delay_us")


def run_means(stages: list[dict], loads: list[Load]) -> dict:
    """Means over a run's stages, weighted by their requests (as a run's per-request means are)."""
    w = np.array([ld.requests for ld in loads], np.float64)
    w = w / w.sum()
    keys = [k for k in MEAN_KEYS if all(k in s for s in stages)]
    return {k: sum(wi * s[k] for wi, s in zip(w, stages)) for k in keys}


def run_state(params: dict, model, gpu, tp: int, loads, grids, alphas, first_token_cycles: float = 0.0,
              scales=None) -> dict:
    """Steady-state means of a run (:func:`run_means` of :func:`steady_state` per stage) with
    the native model's step times (``params``: ``{"ops", "step"}``, :func:`roofcal.model.combine.step_breakdown`);
    ``scales``: each stage's compute scale (its operating point, :func:`operating_points`; None:
    ``params`` as given)."""
    from roofcal.model.combine import at_compute_scale, step_breakdown
    stages = []
    for i, (ld, grid) in enumerate(zip(loads, grids)):
        p = params if scales is None else at_compute_scale(params, scales[i])
        t = step_breakdown(p, model, gpu, tp, grid)["total"]
        n = ld.max_seqs + 1
        stages.append(steady_state(t[:n], t[n:], ld, alphas, first_token_cycles))
    return run_means(stages, list(loads))


def stream_weights(load: Load, running: float, prefills: float) -> np.ndarray:
    """How often each step of :func:`step_grid` runs in a stage at ``running`` decodes (shared
    linearly between the two neighbouring counts) with ``prefills`` chunks per step (the mixed
    step's weight; beyond 1, each chunk a mixed step's worth): shape (2·(max_seqs + 1),)."""
    n = load.max_seqs + 1
    d = min(max(float(running), 0.0), float(load.max_seqs))
    lo = int(math.floor(d))
    hi = min(lo + 1, load.max_seqs)
    a = d - lo
    f = max(float(prefills), 0.0)
    w = np.zeros(2 * n)
    for base, share in ((0, max(1.0 - f, 0.0)), (n, f)):
        w[base + lo] += share * (1.0 - a)
        w[base + hi] += share * a
    return w


def operating_points(power, params: dict, model, gpu, tp: int, loads, grids, alphas,
                     first_token_cycles: float = 0.0, iterations: int = 2) -> list:
    """Each stage's :class:`~roofcal.model.operating.OperatingPoint`: the clock a power-limited
    GPU holds for the stream of its steady state (decode-only and mixed steps at its running
    requests, as often as the steady state runs them), found by iterating steady state → stream →
    clock → step times (``power``: a :class:`~roofcal.physics.power.PowerModel`; None: the burst
    clock for every stage)."""
    from roofcal.model.combine import at_compute_scale
    from roofcal.model.operating import burst, operating_point
    out = []
    for ld, grid in zip(loads, grids):
        op = burst(power)
        if power is not None:
            for _ in range(iterations):
                m = run_state(at_compute_scale(params, op.compute_scale), model, gpu, tp, [ld], [grid], alphas,
                              first_token_cycles)
                w = stream_weights(ld, float(m["running"]), float(m["mixed_fraction"]))
                op = operating_point(power, params, model, gpu, tp, grid, w)
        out.append(op)
    return out


def first_token_parts(params: dict, model, gpu, tp: int, loads, alphas,
                      first_token_cycles: float) -> dict:
    """What a request waits for its first token on a deployment at ``loads`` (µs, request-weighted
    over the loads): ``api_us``, ``wait_us``, ``prefill_us``, ``output_us``, ``cycle_delay_us``,
    their sum ``ttft_us`` and the mean cycle ``step_us`` (module docstring)."""
    grids = [step_grid(ld) for ld in loads]
    m = run_state(params, model, gpu, tp, loads, grids, jnp.asarray(alphas, jnp.float32), first_token_cycles)
    return {k: float(m[k]) for k in ("api_us", "wait_us", "prefill_us", "output_us", "cycle_delay_us",
                                     "ttft_us", "step_us")}


def blis_alpha0(api_us: float, cycle_us: float, first_token_cycles: float) -> float:
    """BLIS's α0 for a deployment (µs): API ingestion plus the cycles until a token leaves —
    the part of the first-token delay BLIS does not simulate. α0 only delays a request's entry
    into the queue, so with open-loop arrivals it adds exactly to TTFT and E2E."""
    return float(api_us) + float(first_token_cycles) * float(cycle_us)


@dataclass(frozen=True)
class Saturation:
    """Where a deployment saturates for a workload: the largest request rate it sustains
    (``rate``, requests/s), what limits it (``limit``: ``max_num_seqs``, ``kv_cache`` or
    ``token_budget``), the running requests there (``running``), the prefill chunks per step
    (``prefills``), the cycle (``cycle_us``), the requests whose KV fits at once (``kv_limit``,
    mean context; ∞ without a KV size) and the clock the GPU holds there (``operating``, an
    :class:`~roofcal.model.operating.OperatingPoint`)."""

    rate: float
    limit: str
    running: float
    cycle_us: float
    kv_limit: float
    prefills: float = 0.0
    operating: object = None


def _saturation_at(t_dec, t_mix, load: Load, kv_limit: float):
    """(rate req/s, limit, running, prefills per step, cycle µs) of the limit for step times
    ``t_dec`` / ``t_mix`` (µs, D = 0 … max_seqs)."""
    out1 = max(load.output - 1.0, 1.0)
    d_max = float(min(load.max_seqs, kv_limit))
    limit = "max_num_seqs" if load.max_seqs <= kv_limit else "kv_cache"
    # every request brings new prompt tokens and (output − 1) decodes: at D running decodes a step
    # carries D·new/(output − 1) prompt tokens, so the budget holds D ≤ budget·(output − 1)/(new + output − 1)
    d_budget = load.budget * out1 / (load.new_tokens + out1)
    if d_budget < d_max:
        d_max, limit = d_budget, "token_budget"
    d_grid = np.arange(load.max_seqs + 1, dtype=np.float64)
    k = float(np.interp(d_max, d_grid, _chunks(load)))
    f = k * d_max / out1                              # prefill chunks per step
    td, tm = float(np.interp(d_max, d_grid, t_dec)), float(np.interp(d_max, d_grid, t_mix))
    tau = td + f * (tm - td)
    return d_max / (out1 * tau) * 1e6, limit, d_max, f, tau


def saturation(params: dict, model, gpu, tp: int, load: Load, kv_blocks: int | None = None,
               block: int = 16, power=None, iterations: int = 2) -> Saturation:
    """The largest rate the steady state sustains for ``load``'s requests (its ``rate`` is not
    used): concurrency D = λ·(output − 1)·τ(D) grows with λ until it reaches the smallest of
    ``max_seqs``, the requests whose KV blocks fit (``kv_blocks`` ÷ ⌈(prompt + output/2) /
    block⌉, the mean context) and what the token budget holds (every step carries D decodes and
    D·new/(output − 1) prompt tokens); there τ = t_decode(D) + f·(t_mixed(D) − t_decode(D)) with f
    = k·D/(output − 1) prefill chunks per step (k chunks per prompt; f > 1: several prompts in a
    step), so λ* = D / ((output − 1)·τ). Step times from the native model (µs), at the clock the
    GPU holds for that stream when ``power`` (a :class:`~roofcal.physics.power.PowerModel`) is
    given, else at the burst clock."""
    from roofcal.model.combine import at_compute_scale, step_breakdown
    from roofcal.model.operating import burst, operating_point
    grid = step_grid(load)
    n = load.max_seqs + 1
    kv_limit = math.inf
    if kv_blocks:
        kv_limit = kv_blocks / math.ceil((load.prompt + load.output / 2.0) / block)
    op = burst(power)
    for i in range(1 + (iterations if power is not None else 0)):
        t = np.asarray(step_breakdown(at_compute_scale(params, op.compute_scale if power is not None else None),
                                      model, gpu, tp, grid)["total"], np.float64)
        rate, limit, d, f, tau = _saturation_at(t[:n], t[n:], load, kv_limit)
        if i < iterations and power is not None:
            op = operating_point(power, params, model, gpu, tp, grid, stream_weights(load, d, f))
    return Saturation(rate, limit, d, tau, kv_limit, f, op)

"""A server under steady load: step times → mean TTFT, ITL and E2E of a constant-rate stage.

The mean-field picture of a vLLM server (or BLIS's replay of one) fed Poisson arrivals at
``rate`` requests/s, each with a ``prompt`` of which ``cached`` tokens hit the prefix cache and
``output`` generated tokens, every prompt fitting one step's token budget:

* every step decodes one token for each of the ``D`` running requests; by Little's law
  ``D = rate · (output − 1) · τ`` with ``τ`` the mean step (cycle) time;
* a fraction ``f = rate · τ`` of steps also prefills one arriving prompt (≤ 1);
* ``τ = (1 − f) · t_decode(D) + f · t_mixed(D)``, solved by damped fixed-point iteration;
* a request waits ``α0`` (API ingestion) and half a step (the residual of the step running when
  it is queued), then its prefill step ``t_mixed(D)``; then ``output − 1`` decode steps, with
  ``α2`` of output processing per token and ``α1`` once at the end (BLIS's alphas,
  docs/blis-latency-models.md §1.7)::

      TTFT = α0 + τ/2 + t_mixed(D) + α2 + c·τ
      ITL  = τ + α2
      E2E  = TTFT + (output − 1) · ITL + α1

  where ``c`` (``first_token_cycles``, default 0) is how many cycles after its step a token
  reaches the client: vLLM processes a step's outputs while the next step runs, so a token leaves
  about one cycle after the step that computed it (first and last token alike: TTFT and E2E
  shift, ITL does not).

It is differentiable in the step times and alphas, which is what calibration needs: the Jacobian
of the measured means with respect to a serving stack's parameters
(:mod:`roofcal.calibration.workload`). What it leaves out — queueing bursts, chunked prompts,
preemption — is measured by running BLIS itself and carried as a correction.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from roofcal.physics.steps import Step, StepBatch, batch_steps

#: fixed-point iterations of the mean step time (damped by half; converges well within this)
ITERATIONS = 60


@dataclass(frozen=True)
class Load:
    """One stage of constant-rate load on one deployment: ``rate`` requests/s for ``duration`` s,
    each a ``prompt`` (tokens; ``cached`` of them in the prefix cache) and ``output`` generated
    tokens; at most ``max_seqs`` requests run at once."""

    rate: float
    duration: float
    prompt: int
    cached: int
    output: int
    max_seqs: int

    @property
    def requests(self) -> float:
        return self.rate * self.duration


def step_grid(load: Load) -> StepBatch:
    """The steps whose times the steady state needs: for D = 0 … ``max_seqs`` running decodes
    (context ``prompt + output/2``), a decode-only step and the same step with one prefill chunk
    (``prompt − cached`` new tokens after ``cached``). Shape: 2·(max_seqs + 1) steps, decode-only
    first."""
    ctx = load.prompt + load.output // 2
    chunk = ((load.prompt - load.cached, load.cached),)
    decode = [Step(decode=(ctx,) * d) for d in range(load.max_seqs + 1)]
    mixed = [Step(prefill=chunk, decode=(ctx,) * d) for d in range(load.max_seqs + 1)]
    return batch_steps(decode + mixed)


def steady_state(t_decode, t_mixed, load: Load, alphas, first_token_cycles: float = 0.0) -> dict:
    """Mean TTFT, ITL, E2E (µs), cycle ``step_us`` and running requests ``D`` of one stage.

    ``t_decode`` / ``t_mixed``: step times (µs) for D = 0 … max_seqs (:func:`step_grid`);
    ``alphas``: (α0 queueing, α1 post-decode, α2 per output token) in µs;
    ``first_token_cycles``: cycles between a step and its tokens reaching the client."""
    grid = jnp.arange(load.max_seqs + 1, dtype=jnp.float32)
    rate = load.rate * 1e-6                                     # requests/µs

    def mean_step(tau):
        d = jnp.clip(rate * (load.output - 1) * tau, 0.0, float(load.max_seqs))
        f = jnp.clip(rate * tau, 0.0, 1.0)
        return (1 - f) * jnp.interp(d, grid, t_decode) + f * jnp.interp(d, grid, t_mixed)

    # start from a busy step: τ = 0 (no step ever runs) is a spurious fixed point
    tau = jax.lax.fori_loop(0, ITERATIONS, lambda _, t: 0.5 * t + 0.5 * mean_step(t), t_mixed[1])
    d = jnp.clip(rate * (load.output - 1) * tau, 0.0, float(load.max_seqs))
    a0, a1, a2 = alphas[0], alphas[1], alphas[2]
    ttft = a0 + 0.5 * tau + jnp.interp(d, grid, t_mixed) + a2 + first_token_cycles * tau
    itl = tau + a2
    return {"ttft_us": ttft, "itl_us": itl, "e2e_us": ttft + (load.output - 1) * itl + a1,
            "step_us": tau, "running": d}


def run_means(stages: list[dict], loads: list[Load]) -> dict:
    """Means over a run's stages, weighted by their requests (as a run's per-request means are)."""
    w = np.array([ld.requests for ld in loads], np.float64)
    w = w / w.sum()
    keys = [k for k in ("ttft_us", "itl_us", "e2e_us", "step_us") if all(k in s for s in stages)]
    return {k: sum(wi * s[k] for wi, s in zip(w, stages)) for k in keys}

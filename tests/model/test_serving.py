"""The steady-state serving model against hand-solved cases."""

import jax.numpy as jnp
import numpy as np
import pytest

from pathlib import Path

from roofcal.model.serving import Load, blis_alpha0, chunk_tokens, loads_of, run_means, steady_state, step_grid

RUNS = Path(__file__).resolve().parents[2].parent / "shared" / "workload" / "default_args"


def test_constant_steps_give_the_textbook_means():
    # every step 10 ms whatever the batch: τ = 10 ms; TTFT = α0 + τ/2 + τ + α2;
    # E2E = TTFT + (output − 1)(τ + α2) + α1
    load = Load(rate=5.0, duration=600, prompt=591, cached=560, output=247, max_seqs=128)
    t = jnp.full(129, 10_000.0)
    out = steady_state(t, t, load, jnp.array([3000.0, 500.0, 40.0]))
    ttft = 3000 + 5000 + 10_000 + 40
    assert float(out["step_us"]) == pytest.approx(10_000, rel=1e-6)
    assert float(out["ttft_us"]) == pytest.approx(ttft, rel=1e-6)
    assert float(out["itl_us"]) == pytest.approx(10_040, rel=1e-6)
    assert float(out["e2e_us"]) == pytest.approx(ttft + 246 * 10_040 + 500, rel=1e-6)
    # Little's law: running decodes = rate × decode time = 5/s × 246 × 10 ms = 12.3
    assert float(out["running"]) == pytest.approx(12.3, rel=1e-6)


@pytest.mark.slow
def test_linear_steps_solve_the_fixed_point_by_hand():
    # t_decode(D) = a + b·D, t_mixed = t_decode + p. With D = λ(O−1)τ and f = λτ:
    # τ = a + bλ(O−1)τ + λτp  →  τ = a / (1 − bλ(O−1) − λp)
    a, b, p = 5000.0, 100.0, 8000.0                                   # µs, µs per decode, µs
    lam, out_len = 10.0, 101
    load = Load(rate=lam, duration=60, prompt=600, cached=0, output=out_len, max_seqs=128)
    d = jnp.arange(129.0)
    res = steady_state(a + b * d, a + b * d + p, load, jnp.zeros(3))
    lam_us = lam * 1e-6
    tau = a / (1 - b * lam_us * (out_len - 1) - lam_us * p)
    assert float(res["step_us"]) == pytest.approx(tau, rel=1e-5)
    assert float(res["running"]) == pytest.approx(lam_us * (out_len - 1) * tau, rel=1e-5)


def test_step_grid_holds_decode_then_mixed_steps():
    load = Load(rate=1.0, duration=1, prompt=600, cached=592, output=200, max_seqs=3)
    g = step_grid(load)
    assert g.decode_ctx.shape[0] == 8                       # 2 × (3 + 1) steps
    assert np.asarray(g.decode_mask).sum(axis=1).tolist() == [0, 1, 2, 3, 0, 1, 2, 3]
    assert set(np.asarray(g.decode_ctx)[np.asarray(g.decode_mask) > 0].tolist()) == {700}
    assert np.asarray(g.prefill_new).sum(axis=1).tolist() == [0, 0, 0, 0, 8, 8, 8, 8]


def test_run_means_weight_stages_by_requests():
    loads = [Load(5.0, 600, 600, 0, 10, 4), Load(10.0, 600, 600, 0, 10, 4)]      # 3000 and 6000 requests
    stages = [{"ttft_us": 30.0, "itl_us": 3.0, "e2e_us": 300.0}, {"ttft_us": 60.0, "itl_us": 6.0, "e2e_us": 600.0}]
    m = run_means(stages, loads)
    assert m["ttft_us"] == pytest.approx(50.0) and m["e2e_us"] == pytest.approx(500.0)


def test_first_token_cycles_shift_ttft_and_e2e_not_itl():
    # flat step times: τ = 10,000 µs whatever the batch; 2 req/s, 11 output tokens, 4 slots
    ld = Load(2.0, 600, 600, 0, 11, 4)
    t = np.full(5, 10_000.0, np.float32)
    a = np.array([1000.0, 500.0, 20.0], np.float32)
    base = steady_state(t, t, ld, a)
    late = steady_state(t, t, ld, a, first_token_cycles=1.0)
    assert float(base["step_us"]) == pytest.approx(10_000.0)
    # TTFT = α0 + τ/2 + t_mixed + α2 (+ one τ): 1000 + 5000 + 10000 + 20 = 16,020 → 26,020 µs
    assert float(base["ttft_us"]) == pytest.approx(16_020.0)
    assert float(late["ttft_us"]) == pytest.approx(26_020.0)
    assert float(late["itl_us"]) == float(base["itl_us"]) == pytest.approx(10_020.0)
    assert float(late["e2e_us"]) - float(base["e2e_us"]) == pytest.approx(10_000.0)
    # the first token's delay, part by part: API, half a step of waiting, the prefill step, α2,
    # and the cycle until its output leaves
    parts = [float(late[k]) for k in ("api_us", "wait_us", "prefill_us", "output_us", "cycle_delay_us")]
    assert parts == pytest.approx([1000.0, 5000.0, 10_000.0, 20.0, 10_000.0])
    assert sum(parts) == pytest.approx(float(late["ttft_us"]))
    # BLIS simulates the wait and the prefill; its α0 carries the API time and the cycle
    assert blis_alpha0(1000.0, float(late["step_us"]), 1.0) == pytest.approx(11_000.0)


def test_chunked_prefill_takes_several_steps_of_the_budget_left_by_decodes():
    # 5,000 new tokens under a 2,048-token budget: with 48 decodes running a chunk holds 2,000
    # tokens, so the prompt takes 3 steps — each a mixed step of the grid — before its first token
    ld = Load(rate=1.0, duration=60, prompt=5000, cached=0, output=11, max_seqs=64, budget=2048)
    assert chunk_tokens(ld, 48) == 2000 and chunk_tokens(ld, 0) == 2048 and chunk_tokens(ld, 2047) == 1
    g = step_grid(ld)
    assert np.asarray(g.prefill_new)[65 + 48].tolist()[0] == 2000
    t = np.full(65, 10_000.0, np.float32)
    res = steady_state(t, t, ld, np.zeros(3, np.float32))
    assert float(res["prefill_us"]) == pytest.approx(3 * 10_000.0)       # ⌈5000 / (2048 − D)⌉, D ≈ 1
    # a prompt over its cached prefix computes only the rest: one step
    small = Load(rate=1.0, duration=60, prompt=5000, cached=4992, output=11, max_seqs=64, budget=2048)
    assert float(steady_state(t, t, small, np.zeros(3, np.float32))["prefill_us"]) == pytest.approx(10_000.0)


@pytest.mark.skipif(not RUNS.is_dir(), reason="experiments not found (../shared beside the project)")
def test_loads_follow_the_rebuilt_schedule():
    from roofcal.measurements.workload import read_experiment
    exp = read_experiment(RUNS / "20260217-155451-llama-2-7b-tp1-codegen")
    loads = loads_of(exp)
    req = exp.requests()
    assert [(ld.rate, ld.duration, ld.max_seqs, ld.budget) for ld in loads] == [(5.0, 600, 128, 2048), (10.0, 600, 128, 2048)]
    # the measured mean prompt; cached: whole blocks of each pool prompt but its last token,
    # after its first use (the first 100 requests of stage 0 use each prompt for the first time)
    assert loads[0].prompt == pytest.approx(req.prompt_tokens[req.stage == 0].mean())
    assert loads[1].cached == pytest.approx(np.mean(((req.prompt_tokens[req.stage == 1] - 1) // 16) * 16))
    assert loads[0].cached < loads[1].cached and loads[0].output == loads[1].output == 247
    # a prompt computes its last partial block: 1–16 tokens, ≈ 8.5 on average
    assert loads[1].new_tokens == round(loads[1].prompt - loads[1].cached) and 7 <= loads[1].new_tokens <= 10


@pytest.mark.slow
def test_saturation_rate_by_hand():
    """Flat steps of τ = 10 ms (a planted model: every kernel 0, overhead 10 ms per step): at
    max_num_seqs D = 64 the rate is D / ((O − 1) τ) = 64 / (100 × 0.010) = 64 req/s; with KV for
    only 32 requests (⌈(600 + 50)/16⌉ = 41 blocks each, 1,312 blocks) it halves, limited by the KV
    cache. With 50-token outputs a step carries k·D/(O−1) = 64/50 = 1.28 prompt chunks (vLLM
    schedules several new prompts in one step while the budget lasts): 8 new tokens each fit, so
    max_num_seqs still binds, at 64 / (50 × 0.010) = 128 req/s. With 600 new tokens and a
    512-token budget the budget binds first: every step carries D decodes and D·600/50 prompt
    tokens, so D = 512·50/650 = 39.38 and the rate is 512 / (650 × 0.010) = 78.77 req/s."""
    import jax.numpy as jnp
    from roofcal.model import correction as K
    from roofcal.model.serving import saturation
    from roofcal.physics.config import load_model
    from roofcal.physics.hardware import load_gpu
    ops = {}                                   # no kernel corrections: the roofline
    step = K.neutral_step_params()
    step["overheads"] = step["overheads"].at[K.STEP_OVERHEADS.index("step_us")].set(jnp.log(10_000.0))
    params = {"ops": ops, "step": step}
    spec, gpu = load_model("llama-2-7b-hf"), load_gpu("h100_sxm")
    # scale the kernels to ~0 so a step is its 10 ms overhead
    params["step"]["scales"] = jnp.full_like(params["step"]["scales"], jnp.log(1e-6))
    ld = Load(rate=1.0, duration=1.0, prompt=600, cached=592, output=101, max_seqs=64, budget=2048)
    s = saturation(params, spec, gpu, 1, ld)
    assert s.limit == "max_num_seqs" and s.running == 64
    assert s.cycle_us == pytest.approx(10_000.0, rel=1e-3) and s.rate == pytest.approx(64.0, rel=1e-3)
    s = saturation(params, spec, gpu, 1, ld, kv_blocks=32 * 41)
    assert s.limit == "kv_cache" and s.running == pytest.approx(32.0) and s.rate == pytest.approx(32.0, rel=1e-3)
    short = Load(rate=1.0, duration=1.0, prompt=600, cached=592, output=51, max_seqs=64, budget=2048)
    s = saturation(params, spec, gpu, 1, short)
    assert s.limit == "max_num_seqs" and s.prefills == pytest.approx(1.28)
    assert s.rate == pytest.approx(128.0, rel=1e-3)
    uncached = Load(rate=1.0, duration=1.0, prompt=600, cached=0, output=51, max_seqs=64, budget=512)
    s = saturation(params, spec, gpu, 1, uncached)
    assert s.limit == "token_budget" and s.running == pytest.approx(512 * 50 / 650)
    assert s.rate == pytest.approx(512 / (650 * 0.010), rel=1e-3)
    assert s.prefills == pytest.approx(2 * s.running / 50)       # 2 chunks of ≤ 472 tokens per prompt


@pytest.mark.slow
@pytest.mark.skipif(not RUNS.is_dir(), reason="experiments not found (../shared beside the project)")
def test_overloaded_runs_are_predicted_to_saturate_below_their_offered_rate():
    from roofcal import resources
    from roofcal.calibration.workload import saturation_rows
    from roofcal.measurements.workload import read_experiments
    from roofcal.model import coeffs as C
    rows = saturation_rows(C.load(resources.COEFFS / "h100_sxm.yaml"), read_experiments([RUNS]),
                           resources.default_model_configs())
    assert [r["predicted_overload"] for r in rows] == [r["measured_overload"] for r in rows]
    # what the measured cadence allows at full load: Llama-2-70B reasoning ran 128 requests of
    # 1,448 generated tokens at ITL (161,729.85 − 118,995.82 ms) / 1,447 = 29.533 ms:
    # 128 / (1,447 · 0.029533 s) = 2.995 requests/s; runs with headroom have none
    by = {r["experiment"]: r for r in rows}
    r70 = by["20260218-065057-llama-2-70b-hf-tp4-reasoning"]
    assert r70["running_at_limit"] == 128 and r70["cadence_rate"] == pytest.approx(2.995, abs=0.002)
    assert all((r["cadence_rate"] is None) != r["measured_overload"] for r in rows)
    # its median gap between tokens, 29.641 ms (the events' p75), allows 128 / (1,447 · 0.029641 s)
    # = 2.984 requests/s: no stalls, the step itself is 11 % over the predicted cycle
    assert r70["step_ms"] == pytest.approx(29.641, abs=1e-3) and r70["step_rate"] == pytest.approx(2.984, abs=0.002)
    # the 7B's step is within 6 % of the predicted cycle; its mean ITL is not (preemption stalls)
    r7 = by["20260217-170634-llama-2-7b-tp1-reasoning"]
    assert abs(r7["step_ms"] / r7["cycle_ms"] - 1) < 0.07 and r7["cadence_rate"] < 0.75 * r7["step_rate"]
    assert all((r["step_rate"] is None) != r["measured_overload"] for r in rows)


def test_stream_weights_by_hand():
    from roofcal.model.serving import stream_weights
    ld = Load(rate=1.0, duration=1.0, prompt=600, cached=0, output=101, max_seqs=4, budget=2048)
    # 2.25 running, a chunk in 40 % of the steps: decode-only steps at 2 and 3 decodes take
    # 0.6 × (0.75, 0.25), the mixed ones 0.4 × (0.75, 0.25)
    w = stream_weights(ld, 2.25, 0.4)
    assert w.tolist() == pytest.approx([0, 0, 0.45, 0.15, 0, 0, 0, 0.3, 0.1, 0])
    w = stream_weights(ld, 4.0, 1.5)                # at max_seqs, 1.5 chunks per step: all mixed
    assert w.tolist() == pytest.approx([0, 0, 0, 0, 0, 0, 0, 0, 0, 1.5])


@pytest.mark.slow
def test_saturation_at_the_power_limited_clock():
    """A prefill-heavy workload (3,000 uncached prompt tokens, 8,192-token budget) keeps the H100
    at its power limit: the sustained clock lowers the rate it sustains; the given runs'
    decode-heavy saturation stays at the boost clock, so its rate is the burst one."""
    from roofcal import resources
    from roofcal.model import coeffs as C
    from roofcal.model.operating import power_of
    from roofcal.model.serving import saturation
    from roofcal.physics.config import load_model
    from roofcal.physics.hardware import load_gpu
    c = C.resolve_stack(C.load(resources.COEFFS / "h100_sxm.yaml"), None, required=True)
    gpu = load_gpu("h100_sxm")
    pm = power_of(c, gpu)
    heavy = Load(rate=1.0, duration=1.0, prompt=3000, cached=0, output=300, max_seqs=256, budget=8192)
    spec = load_model("qwen3-14b")
    burst = saturation(c.params, spec, gpu, 1, heavy, 17_337)
    sust = saturation(c.params, spec, gpu, 1, heavy, 17_337, power=pm)
    assert sust.operating.limited and 1.03 < sust.operating.compute_scale < 1.2
    assert 0.9 * burst.rate < sust.rate < 0.99 * burst.rate and sust.cycle_us > burst.cycle_us
    light = Load(rate=1.0, duration=1.0, prompt=580, cached=576, output=247, max_seqs=128, budget=2048)
    spec7 = load_model("llama-2-7b-hf")
    a = saturation(c.params, spec7, gpu, 1, light, 7463)
    b = saturation(c.params, spec7, gpu, 1, light, 7463, power=pm)
    assert not b.operating.limited and b.rate == a.rate and b.operating.demand_w < 700

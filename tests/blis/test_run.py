"""Replaying experiments in the real BLIS binary (../shared/tools/blis): a tiny workload whose
latencies follow by hand from BLIS's documented trained-physics formula, the open/closed workload
specs, per-stage splitting, validation errors and MAPE, and one-line errors for a missing binary, a
failing BLIS, a timeout and bad CLI input."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from roofcal import resources
from roofcal.blis.run import (
    KNOWN_KV_BLOCKS,
    BlisSettings,
    coefficient_flags,
    find_blis,
    kv_blocks,
    model_config_folder,
    run_experiment,
    run_experiments,
    stage_of,
    workload_spec,
)
from roofcal.blis.validate import validate, validation_text, write_validation_csv
from roofcal.cli.main import main
from roofcal.errors import RoofcalError
from roofcal.measurements.workload import read_experiment

SHARED = Path(__file__).resolve().parents[2].parent / "shared"
RUNS = SHARED / "workload" / "default_args"
BLIS = SHARED / "tools" / "blis"
CODEGEN_7B = "20260217-155451-llama-2-7b-tp1-codegen"
MIXTRAL = "20260218-120914-mixtral-8x7b-v0-1-tp2-codegen"

needs_blis = pytest.mark.skipif(not (BLIS.is_file() and RUNS.is_dir()),
                                reason=f"BLIS binary {BLIS} or experiments {RUNS} not found "
                                       f"(../shared beside the project)")

# Hand-checkable coefficients (docs/blis-latency-models.md §1.5–1.7, trained-physics model):
# with every β zero except β7 (index 6, the per-step constant), a step takes int(β7) µs whatever the
# batch (the formula is truncated toward zero to int64). α0 (QueueingTime) delays a request from
# arrival to queueing; α2 (OutputTokenProcessingTime) is added to TTFT once and to every ITL sample;
# α1 (PostDecodeFixedOverhead) is added once to E2E. α1 and α2 change metrics only, not the clock.
A0, A1, A2 = 2000.0, 300.0, 50.0          # µs
B7 = 1000.7                                # µs → a step of 1000 µs
STEP = int(B7)
BETA = [0.0] * 6 + [B7] + [0.0] * 4
PROMPT, QUESTION, OUT = 100, 50, 10        # tokens: one prefill step (150 ≤ 2048), then 9 decode steps


def tiny_experiment(dest: Path, name: str = "tiny-7b", source: str = CODEGEN_7B,
                    stages=((1.0, 2), (1.0, 2)), truth_e2e_s: float = 0.010) -> Path:
    """A copy of a real experiment's server config with a tiny load (one system prompt, one user,
    10 output tokens, ~1 request/s for 4 s) and synthetic results files."""
    out = dest / name
    (out / "results").mkdir(parents=True)
    shutil.copyfile(RUNS / source / "exp-config.yaml", out / "exp-config.yaml")
    profile = json.loads((RUNS / source / "profile.yaml").read_text())
    profile["data"]["shared_prefix"] = {
        "num_unique_system_prompts": 1, "num_users_per_system_prompt": 1,
        "system_prompt_len": PROMPT, "question_len": QUESTION, "output_len": OUT,
        "enable_multi_turn_chat": False}
    profile["load"]["stages"] = [{"rate": r, "duration": d} for r, d in stages]
    (out / "profile.yaml").write_text(json.dumps(profile))
    results = {"load_summary": {"count": 4},
               "successes": {"count": 4, "latency": {"request_latency": {"mean": truth_e2e_s},
                                                     "time_to_first_token": {"mean": 0.002}},
                             "output_len": {"mean": float(OUT)}},
               "failures": {"count": 0, "request_latency": None, "prompt_len": None}}
    for f in ["summary"] + [f"stage_{i}" for i in range(len(stages))]:
        (out / "results" / f"{f}_lifecycle_metrics.json").write_text(json.dumps(results))
    return out


def settings(**kw) -> BlisSettings:
    base = dict(blis=BLIS, defaults=resources.BLIS_DEFAULTS, hardware_config=resources.BLIS_HARDWARE,
                model_configs=(resources.MODEL_CONFIGS,), prompts="fresh")      # the formula tests
    base.update(kw)
    return BlisSettings(**base)


@needs_blis
@pytest.mark.parametrize("arrivals", ["open", "closed"])
def test_tiny_replay_matches_the_documented_formula(tmp_path, arrivals):
    exp = read_experiment(tiny_experiment(tmp_path))
    r = run_experiment(exp, settings(arrivals=arrivals, prompts="fresh"), alpha=(A0, A1, A2), beta=BETA)

    ttft_us = A0 + STEP + A2                     # queueing, the prefill step, first-token processing
    itl_us = STEP + A2                           # every later token: one decode step + processing
    e2e_us = A0 + OUT * (STEP + A2) + A1         # OUT steps, OUT × α2, α1 once at completion
    assert r.completed == r.injected == len(r.e2e_ms) >= 2
    arrived = np.sort(r.arrived_at)
    assert np.all(np.diff(arrived) * 1e6 > e2e_us)           # requests never overlap: exact formula
    np.testing.assert_allclose(r.ttft_ms, ttft_us / 1000, rtol=0, atol=1e-9)
    np.testing.assert_allclose(r.itl_ms, itl_us / 1000, rtol=0, atol=1e-9)
    np.testing.assert_allclose(r.e2e_ms, e2e_us / 1000, rtol=0, atol=1e-9)
    assert np.all(r.num_prefill_tokens == PROMPT + QUESTION) and np.all(r.num_decode_tokens == OUT)
    s = r.scopes["summary"]
    assert (s.ttft_ms, s.itl_ms, s.e2e_ms) == pytest.approx((ttft_us / 1e3, itl_us / 1e3, e2e_us / 1e3))
    # the clock: the last request is done α0 + OUT steps after it arrived (α1, α2 are metrics only)
    assert r.sim_duration_s == pytest.approx(arrived[-1] + (A0 + OUT * STEP) / 1e6, abs=2e-6)
    # stages by arrival time: [0, 2] s and the rest
    n0 = int((r.arrived_at <= 2.0).sum())
    assert (r.scopes["stage_0"].completed, r.scopes["stage_1"].completed) == (n0, r.completed - n0)
    for st in ("stage_0", "stage_1"):
        if r.scopes[st].completed:
            assert r.scopes[st].e2e_ms == pytest.approx(e2e_us / 1e3)
    assert (r.kv_blocks, r.kv_source) == (KNOWN_KV_BLOCKS[("meta-llama/llama-2-7b-hf", 1)], "vllm-log")
    assert r.arrivals == arrivals and 0.0 <= r.cache_hit_rate <= 1.0 and r.wall_s > 0


@needs_blis
def test_workload_specs_open_and_closed(tmp_path):
    exp = read_experiment(tiny_experiment(tmp_path, stages=((2.0, 3), (1.5, 2))))
    closed = json.loads(workload_spec(exp, "closed"))
    assert closed["num_requests"] == round(2.0 * 3) + round(1.5 * 2)
    assert closed["inference_perf"]["stages"] == [{"rate": 2.0, "duration": 3}, {"rate": 1.5, "duration": 2}]
    assert closed["inference_perf"]["shared_prefix"]["output_len"] == OUT and "clients" not in closed
    opened = yaml.safe_load(workload_spec(exp, "open", BLIS))
    assert opened["num_requests"] == closed["num_requests"]
    assert opened["clients"] and all(c["closed_loop"] is False for c in opened["clients"])
    with pytest.raises(RoofcalError, match="need the BLIS binary"):
        workload_spec(exp, "open")
    with pytest.raises(RoofcalError, match="arrivals"):
        workload_spec(exp, "poisson")


def test_stage_of_cumulative_windows_last_takes_rest():
    assert stage_of(np.array([0.0, 600.0, 600.000001, 1200.0, 1570.0]), [600, 600]).tolist() == [0, 0, 1, 1, 1]
    assert stage_of(np.array([5.0, 9000.0]), [1200]).tolist() == [0, 0]


def test_coefficient_flags():
    assert coefficient_flags(None, None) == []
    flags = coefficient_flags([1, 2.5, 0.1], [0] * 6 + [1e-5])
    assert flags == ["--alpha-coeffs", "1.0,2.5,0.1", "--beta-coeffs", "0.0,0.0,0.0,0.0,0.0,0.0,1e-05"]
    for alpha, beta, msg in [((1, 2, 3), None, "both"), ((1, 2), [0] * 7, "at least 3 alpha"),
                             ((1, 2, 3), [0] * 6, "at least 7 beta"),
                             ((1, 2, -3), [0] * 7, r"alpha coefficient \[2\]"),
                             ((1, 2, 3), [0] * 6 + [math.nan], r"beta coefficient \[6\]")]:
        with pytest.raises(RoofcalError, match=msg):
            coefficient_flags(alpha, beta)


@needs_blis
def test_model_config_folder_case_insensitive(tmp_path):
    exp = read_experiment(RUNS / MIXTRAL)
    assert model_config_folder(exp, [tmp_path, resources.MODEL_CONFIGS]) == resources.MODEL_CONFIGS / "mixtral-8x7b-v0.1"
    shared = SHARED / "workload" / "model_configs"
    assert model_config_folder(exp, [shared]).name == "Mixtral-8x7B-v0.1"
    with pytest.raises(RoofcalError, match="mistralai/Mixtral-8x7B-v0.1"):
        model_config_folder(exp, [tmp_path])


def test_find_blis(tmp_path, monkeypatch):
    monkeypatch.delenv("ROOFCAL_BLIS", raising=False)
    with pytest.raises(RoofcalError, match="no BLIS binary: pass --blis PATH or set ROOFCAL_BLIS"):
        find_blis(None)
    with pytest.raises(RoofcalError, match="not an executable file"):
        find_blis(tmp_path / "missing")
    plain = tmp_path / "plain"
    plain.write_text("")
    with pytest.raises(RoofcalError, match="not an executable file"):
        find_blis(plain)
    plain.chmod(0o755)
    assert find_blis(plain) == plain
    monkeypatch.setenv("ROOFCAL_BLIS", str(plain))
    assert find_blis(None) == plain
    # a relative path comes back absolute: BLIS runs in a temporary working directory
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ROOFCAL_BLIS", "plain")
    assert find_blis(None) == plain and find_blis(None).is_absolute()


@needs_blis
def test_blis_failures_are_one_line(tmp_path):
    exp = read_experiment(tiny_experiment(tmp_path))
    broken = tmp_path / "broken_defaults.yaml"
    broken.write_text("trained_physics_coefficients: [\n")
    with pytest.raises(RoofcalError) as err:                       # BLIS itself refuses the file
        run_experiment(exp, settings(defaults=broken, arrivals="closed"))
    msg = str(err.value)
    assert "\n" not in msg and "BLIS failed on tiny-7b" in msg and "defaults YAML" in msg
    mixtral = read_experiment(tiny_experiment(tmp_path, name="tiny-mixtral", source=MIXTRAL))
    with pytest.raises(RoofcalError, match="probing KV blocks for mistralai/mixtral-8x7b-v0.1 TP2"):
        run_experiment(mixtral, settings(defaults=broken))
    with pytest.raises(RoofcalError, match="cannot run BLIS"):      # the binary vanished
        run_experiment(exp, settings(blis=tmp_path / "gone", arrivals="closed"))
    with pytest.raises(RoofcalError, match="no such BLIS defaults file"):
        run_experiment(exp, settings(defaults=tmp_path / "none.yaml"))


@needs_blis
def test_timeout_kills_blis(tmp_path):
    exp = read_experiment(tiny_experiment(tmp_path))
    slow = tmp_path / "slow-blis"
    slow.write_text("#!/bin/sh\nexec sleep 30\n")
    slow.chmod(0o755)
    with pytest.raises(RoofcalError, match=r"^BLIS timed out after 0\.5 s on tiny-7b$"):
        run_experiment(exp, settings(blis=slow, arrivals="closed", timeout_s=0.5))


@needs_blis
def test_validate_errors_mape_and_order(tmp_path, capsys):
    # measured E2E 10 ms and 16 ms vs simulated 12.8 ms: +28 % and −20 %; TTFT 2 ms vs 3.05 ms
    a = read_experiment(tiny_experiment(tmp_path, name="b-first", truth_e2e_s=0.010))
    b = read_experiment(tiny_experiment(tmp_path, name="a-second", truth_e2e_s=0.016))
    v = validate([a, b], settings(), alpha=(A0, A1, A2), beta=BETA, keep=tmp_path / "keep")
    assert [r.experiment for r in v.results] == ["b-first", "a-second"]        # input order
    s = v.table[v.table["scope"] == "summary"].set_index("experiment")
    assert s.loc["b-first", "err_e2e_pct"] == pytest.approx(28.0)
    assert s.loc["a-second", "err_e2e_pct"] == pytest.approx(-20.0)
    assert s.loc["b-first", "err_ttft_pct"] == pytest.approx(100 * (3.05 - 2.0) / 2.0)
    assert v.mape["e2e"] == pytest.approx(24.0) and v.scored == 2
    assert len(v.table) == 2 * 3 and not v.table["overload"].any()
    assert (tmp_path / "keep" / "b-first" / "metrics.json").is_file()
    assert capsys.readouterr().err.count("roofcal: [") == 2
    text = validation_text(v)
    assert "MAPE over 2 non-overload runs: E2E 24.0 %" in text and "stage_1" in text
    write_validation_csv(v, tmp_path / "v.csv")
    back = pd.read_csv(tmp_path / "v.csv")
    for col in ["experiment", "scope", "model", "tp", "overload", "measured_e2e_ms", "sim_itl_ms",
                "err_ttft_pct", "sim_duration_s", "wall_s"]:
        assert col in back.columns


@needs_blis
def test_cli_validate_runs_and_writes_csv(tmp_path, capsys):
    exp = tiny_experiment(tmp_path)
    out = tmp_path / "res.csv"
    code = main(["workload", "validate", str(exp), "--blis", str(BLIS), "--arrivals", "closed",
                 "--model-configs", str(resources.MODEL_CONFIGS), "--out", str(out), "--workers", "1"])
    assert code == 0 and out.is_file()
    assert "closed-loop arrivals" in capsys.readouterr().out
    assert pd.read_csv(out)["scope"].tolist() == ["summary", "stage_0", "stage_1"]


def test_cli_bad_input_exits_2_with_one_line():
    env = dict(os.environ, ROOFCAL_CACHE="off")
    p = subprocess.run([sys.executable, "-m", "roofcal.cli", "workload", "validate", "/nonexistent"],
                       capture_output=True, text=True, env=env)
    assert p.returncode == 2
    assert p.stderr.strip().count("\n") == 0 and "Traceback" not in p.stderr
    assert p.stderr.startswith("roofcal: error: /nonexistent")


@needs_blis
def test_pool_prompts_replay_one_cached_prompt_per_user(tmp_path):
    # one simulated user: every request is the same prompt (system + question as a prefix, plus
    # ≥ 1 template token), so from the second request on its whole prefix blocks hit the cache
    exp = read_experiment(tiny_experiment(tmp_path, stages=((2.0, 3),)))
    spec = yaml.safe_load(workload_spec(exp, "open", BLIS, prompts="pool"))
    (client,) = spec["clients"]
    assert client["prefix_group"] == client["id"] and client["prefix_length"] == PROMPT + QUESTION
    assert client["input_distribution"] == {"type": "constant", "params": {"value": 1}}
    r = run_experiment(exp, settings(prompts="pool"), alpha=(A0, A1, A2), beta=BETA)
    assert np.all(r.num_prefill_tokens == PROMPT + QUESTION + 1)
    fresh = run_experiment(exp, settings(prompts="fresh"), alpha=(A0, A1, A2), beta=BETA)
    assert r.cache_hit_rate > fresh.cache_hit_rate


@needs_blis
def test_kv_blocks_from_capacity_where_vllm_did_not_log_them():
    from roofcal.physics.capacity import capacity
    from roofcal.physics.config import load_model
    from roofcal.physics.hardware import load_gpu
    exp = read_experiment(RUNS / MIXTRAL)
    cap = capacity(load_model("mixtral-8x7b-v0.1"), load_gpu("h100_sxm"), 2,
                   max_num_batched_tokens=exp.max_num_batched_tokens, max_num_seqs=exp.max_num_seqs)
    assert kv_blocks(exp, settings(kv_blocks="capacity")) == (cap.kv_blocks, "roofcal capacity")
    # Llama-2-7B TP1 keeps the count vLLM logged, whatever the mode
    assert kv_blocks(read_experiment(RUNS / CODEGEN_7B), settings(kv_blocks="capacity")) == (7463, "vllm-log")
    with pytest.raises(RoofcalError, match="kv_blocks must be"):
        settings(kv_blocks="guess")


@needs_blis
def test_per_run_alphas_shift_each_run_by_its_own_alpha0(tmp_path):
    """A first-token delay of one cycle per run (roofcal.calibration.workload.run_alphas): each
    run gets α0 + its cycle; α0 only delays entry into the queue, so TTFT and E2E move by exactly
    that and ITL not at all."""
    from roofcal.calibration.workload import run_alphas
    a = read_experiment(tiny_experiment(tmp_path, "tiny-a"))
    b = read_experiment(tiny_experiment(tmp_path, "tiny-b"))
    per_run = run_alphas((A0, A1, A2), [0.0, 7000.0], ["tiny-a", "tiny-b"], 1.0)
    assert per_run == {"tiny-a": (A0, A1, A2), "tiny-b": (A0 + 7000.0, A1, A2)}
    ra, rb = run_experiments([a, b], settings(prompts="fresh"), per_run, BETA, progress=False)
    sa, sb = ra.scopes["summary"], rb.scopes["summary"]
    assert sb.ttft_ms - sa.ttft_ms == pytest.approx(7.0, abs=1e-6)
    assert sb.e2e_ms - sa.e2e_ms == pytest.approx(7.0, abs=1e-6)
    assert sb.itl_ms == pytest.approx(sa.itl_ms, abs=1e-9)
    with pytest.raises(KeyError):                      # every run needs its alphas
        run_experiments([a, b], settings(), {"tiny-a": (A0, A1, A2)}, BETA, progress=False)

"""Replaying experiments in the real BLIS binary (../shared/tools/blis) through their faithful
traces: a tiny workload whose latencies follow by hand from BLIS's documented trained-physics
formula, BLIS's own expansion for comparison, per-stage splitting by request, per-run defaults
files, validation errors and MAPE, and one-line errors for a missing binary, a failing BLIS, a
timeout and bad CLI input."""

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

from roofcal import resources
from roofcal.blis.run import (
    KNOWN_KV_BLOCKS,
    BlisSettings,
    coefficient_flags,
    expansion_spec,
    find_blis,
    kv_blocks,
    model_config_folder,
    run_experiment,
    run_experiments,
    stage_of,
)
from roofcal.blis.validate import validate, validation_text, write_validation_csv
from roofcal.cli.main import main
from roofcal.errors import RoofcalError
from roofcal.io import yaml_load, yaml_text
from roofcal.measurements.workload import read_experiment

SHARED = Path(__file__).resolve().parents[2].parent / "shared"
RUNS = SHARED / "workload" / "default_args"
BLIS = (SHARED / "tools" / "blis").resolve()        # as roofcal prints it (../shared may be a link)
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
PROMPT, QUESTION, OUT = 100, 50, 10        # tokens: one prefill step (151 ≤ 2048), then 9 decode steps


def tiny_experiment(dest: Path, name: str = "tiny-7b", source: str = CODEGEN_7B,
                    stages=((1.0, 2), (1.0, 2)), truth_e2e_s: float = 0.010) -> Path:
    """A copy of a real experiment's server config with a tiny load — a pool of one prompt
    (100-token system prompt + 50-token question + 1 template token), 10 generated tokens, one
    request a second for 4 s — and synthetic results files."""
    out = dest / name
    (out / "results").mkdir(parents=True)
    shutil.copyfile(RUNS / source / "exp-config.yaml", out / "exp-config.yaml")
    ran = yaml_load((RUNS / source / "results" / "config.yaml").read_text())
    ran["data"]["shared_prefix"] = {"num_groups": 1, "num_prompts_per_group": 1, "system_prompt_len": PROMPT,
                                    "question_len": QUESTION, "output_len": OUT}
    ran["load"]["stages"] = [{"rate": r, "duration": d} for r, d in stages]
    (out / "results" / "config.yaml").write_text(yaml_text(ran))
    n = sum(int(r * d) for r, d in stages)
    results = {"load_summary": {"count": n},
               "successes": {"count": n, "latency": {"request_latency": {"mean": truth_e2e_s, "max": truth_e2e_s,
                                                                         "p1": truth_e2e_s},
                                                     "time_to_first_token": {"mean": 0.002}},
                             "output_len": {"mean": float(OUT)}},
               "failures": {"count": 0, "request_latency": None, "prompt_len": None}}
    for f in ["summary"] + [f"stage_{i}" for i in range(len(stages))]:
        (out / "results" / f"{f}_lifecycle_metrics.json").write_text(json.dumps(results))
    return out


def settings(**kw) -> BlisSettings:
    base = dict(blis=BLIS, defaults=resources.BLIS_DEFAULTS, hardware_config=resources.BLIS_HARDWARE,
                model_configs=(resources.MODEL_CONFIGS,))
    base.update(kw)
    return BlisSettings(**base)


def _formula(r, n_prompt: int):
    """The documented per-request latencies of the tiny run (requests never overlap)."""
    ttft_us = A0 + STEP + A2                     # queueing, the prefill step, first-token processing
    e2e_us = A0 + OUT * (STEP + A2) + A1         # OUT steps, OUT × α2, α1 once at completion
    arrived = np.sort(r.arrived_at)
    assert np.all(np.diff(arrived) * 1e6 > e2e_us)           # requests never overlap: exact formula
    np.testing.assert_allclose(r.ttft_ms, ttft_us / 1000, rtol=0, atol=1e-9)
    np.testing.assert_allclose(r.e2e_ms, e2e_us / 1000, rtol=0, atol=1e-9)
    assert np.all(r.num_prefill_tokens == n_prompt) and np.all(r.num_decode_tokens == OUT)
    # ITL = (E2E − TTFT) / (generated − 1), the measured side's rule: α1 spread over OUT − 1 gaps
    s = r.scopes["summary"]
    itl_us = (e2e_us - ttft_us) / (OUT - 1)
    assert itl_us == pytest.approx(STEP + A2 + A1 / (OUT - 1))
    assert (s.ttft_ms, s.itl_ms, s.e2e_ms) == pytest.approx((ttft_us / 1e3, itl_us / 1e3, e2e_us / 1e3))
    assert s.e2e_p1_ms == pytest.approx(e2e_us / 1e3)            # every request alike
    # the clock: the last request is done α0 + OUT steps after it arrived (α1, α2 are metrics only)
    assert r.sim_duration_s == pytest.approx(arrived[-1] + (A0 + OUT * STEP) / 1e6, abs=2e-6)
    return e2e_us


@needs_blis
def test_tiny_trace_replay_matches_the_documented_formula(tmp_path):
    exp = read_experiment(tiny_experiment(tmp_path))
    r = run_experiment(exp, settings(), alpha=(A0, A1, A2), beta=BETA)
    assert r.completed == r.injected == len(r.e2e_ms) == 4 and r.replay == "trace"
    e2e_us = _formula(r, PROMPT + QUESTION + 1)
    # stages by request: the trace's first two requests are stage 0, the next two stage 1
    assert (r.scopes["stage_0"].completed, r.scopes["stage_1"].completed) == (2, 2)
    assert sorted(r.index.tolist()) == [0, 1, 2, 3]
    for st in ("stage_0", "stage_1"):
        assert r.scopes[st].e2e_ms == pytest.approx(e2e_us / 1e3)
    # the pool prompt: its prefix (150 tokens) hits the cache in 9 whole blocks from the second
    # request on; BLIS counts blocks, of which each request holds ⌈(151 + 10) / 16⌉ = 11
    assert r.cache_hit_rate == pytest.approx(3 * 9 / (4 * 11), abs=1e-12)
    assert (r.kv_blocks, r.kv_source) == (KNOWN_KV_BLOCKS[("meta-llama/llama-2-7b-hf", 1)], "vllm-log")
    assert r.wall_s > 0 and "blis replay" in " ".join(r.command.split()[:2]).replace(str(BLIS), "blis")
    assert "--trace-header tiny-7b.yaml --trace-data tiny-7b.csv" in r.command


@needs_blis
def test_blis_expansion_replay_matches_the_formula_too(tmp_path):
    """BLIS's own closed-loop expansion (kept to compare): fresh questions, the same formula."""
    exp = read_experiment(tiny_experiment(tmp_path))
    # BLIS's expansion is fed profile.yaml as requested, as inference-sim's validation does
    (tmp_path / "tiny-7b" / "profile.yaml").write_text(json.dumps({
        "data": {"type": "shared_prefix", "shared_prefix": {
            "num_unique_system_prompts": 1, "num_users_per_system_prompt": 1, "system_prompt_len": PROMPT,
            "question_len": QUESTION, "output_len": OUT, "enable_multi_turn_chat": False}},
        "load": {"type": "constant", "stages": [{"rate": 1, "duration": 2}, {"rate": 1, "duration": 2}]}}))
    spec = json.loads(expansion_spec(exp))
    assert spec["num_requests"] == 4
    assert spec["inference_perf"]["stages"] == [{"rate": 1.0, "duration": 2}, {"rate": 1.0, "duration": 2}]
    assert spec["inference_perf"]["shared_prefix"]["num_users_per_system_prompt"] == 1
    real = json.loads(expansion_spec(read_experiment(RUNS / CODEGEN_7B)))["inference_perf"]["shared_prefix"]
    assert (real["num_unique_system_prompts"], real["num_users_per_system_prompt"], real["enable_multi_turn_chat"]) \
        == (11, 4, True)
    r = run_experiment(exp, settings(replay="expansion"), alpha=(A0, A1, A2), beta=BETA)
    assert r.replay == "expansion" and r.completed == r.injected >= 2
    _formula(r, PROMPT + QUESTION)
    assert "--workload-spec workload_spec.yaml" in r.command


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
        run_experiment(exp, settings(defaults=broken))
    msg = str(err.value)
    assert "\n" not in msg and "BLIS failed on tiny-7b" in msg and "defaults YAML" in msg
    mixtral = read_experiment(tiny_experiment(tmp_path, name="tiny-mixtral", source=MIXTRAL))
    with pytest.raises(RoofcalError, match="probing KV blocks for mistralai/mixtral-8x7b-v0.1 TP2"):
        run_experiment(mixtral, settings(defaults=broken))
    with pytest.raises(RoofcalError, match="cannot run BLIS"):      # the binary vanished
        run_experiment(exp, settings(blis=tmp_path / "gone"))
    with pytest.raises(RoofcalError, match="no such BLIS defaults file"):
        run_experiment(exp, settings(defaults=tmp_path / "none.yaml"))


@needs_blis
def test_timeout_kills_blis(tmp_path):
    exp = read_experiment(tiny_experiment(tmp_path))
    slow = tmp_path / "slow-blis"
    slow.write_text("#!/bin/sh\nexec sleep 30\n")
    slow.chmod(0o755)
    with pytest.raises(RoofcalError, match=r"^BLIS timed out after 0\.5 s on tiny-7b$"):
        run_experiment(exp, settings(blis=slow, timeout_s=0.5))


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
    # the fastest 1 %: every request takes 12.8 ms, measured p1 10 ms → +28 %, not scored
    assert (s.loc["b-first", "measured_e2e_p1_ms"], s.loc["b-first", "sim_e2e_p1_ms"]) == pytest.approx((10.0, 12.8))
    assert s.loc["b-first", "err_e2e_p1_pct"] == pytest.approx(28.0)
    assert v.mape["e2e"] == pytest.approx(24.0) and v.scored == 2 and v.within == 0
    assert len(v.table) == 2 * 3 and not v.table["overload"].any()
    kept = tmp_path / "keep" / "b-first"
    assert (kept / "metrics.json").is_file() and (kept / "b-first.yaml").is_file() and (kept / "b-first.csv").is_file()
    assert (kept / "cmd.txt").read_text().strip() == v.results[0].command
    assert capsys.readouterr().err.count("roofcal: [") == 2
    text = validation_text(v)
    assert "MAPE over 2 non-overload runs: E2E 24.0 %" in text and "all three within 10 % on 0 of 2" in text
    assert "stage_1" in text
    write_validation_csv(v, tmp_path / "v.csv")
    back = pd.read_csv(tmp_path / "v.csv")
    for col in ["experiment", "scope", "model", "tp", "overload", "measured_e2e_ms", "sim_itl_ms",
                "err_ttft_pct", "err_e2e_p1_pct", "sim_duration_s", "wall_s", "replay"]:
        assert col in back.columns


@needs_blis
def test_kept_command_repeats_the_number_with_blis_alone(tmp_path):
    """The printed command, run again in the kept folder with the BLIS binary alone, gives the
    same metrics."""
    exp = read_experiment(tiny_experiment(tmp_path))
    r = run_experiment(exp, settings(), alpha=(A0, A1, A2), beta=BETA, keep=tmp_path / "keep")
    work = tmp_path / "keep" / "tiny-7b"
    first = json.loads((work / "metrics.json").read_text())
    (work / "metrics.json").unlink()
    p = subprocess.run(r.command, shell=True, cwd=work, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    again = json.loads((work / "metrics.json").read_text())
    assert again["e2e_mean_ms"] == first["e2e_mean_ms"] and again["requests"] == first["requests"]


@needs_blis
def test_cli_validate_runs_writes_csv_and_prints_commands(tmp_path, capsys):
    exp = tiny_experiment(tmp_path)
    out = tmp_path / "res.csv"
    code = main(["workload", "validate", str(exp), "--blis", str(BLIS),
                 "--model-configs", str(resources.MODEL_CONFIGS), "--out", str(out), "--workers", "1"])
    assert code == 0 and out.is_file()
    text = capsys.readouterr().out
    assert "faithful trace" in text and "BLIS command per run" in text
    # its run folder is gone: no command naming its files, but how to keep them
    # (tests/cli/test_printed_commands.py runs what --keep prints)
    assert "rerun with --keep runs/" in text and " replay --model" not in text
    assert pd.read_csv(out)["scope"].tolist() == ["summary", "stage_0", "stage_1"]


def test_cli_bad_input_exits_2_with_one_line():
    env = dict(os.environ, ROOFCAL_CACHE="off")
    p = subprocess.run([sys.executable, "-m", "roofcal.cli", "workload", "validate", "/nonexistent"],
                       capture_output=True, text=True, env=env)
    assert p.returncode == 2
    assert p.stderr.strip().count("\n") == 0 and "Traceback" not in p.stderr
    assert p.stderr.startswith("roofcal: error: /nonexistent")


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
    with pytest.raises(RoofcalError, match="replay must be one of trace, expansion"):
        settings(replay="open")


@needs_blis
def test_per_run_defaults_files_shift_each_run_by_its_own_alpha0(tmp_path):
    """Each run replayed with its own defaults.yaml (as per-deployment exports are used): α0 only
    delays entry into the queue, so TTFT and E2E move by exactly the α0 difference and ITL — the
    same (E2E − TTFT)/(generated − 1) on both — not at all."""
    from roofcal.blis.defaults_yaml import replace_coefficients
    a = read_experiment(tiny_experiment(tmp_path, "tiny-a"))
    b = read_experiment(tiny_experiment(tmp_path, "tiny-b"))
    text = resources.BLIS_DEFAULTS.read_text(encoding="utf-8")
    files = {}
    for name, a0 in (("tiny-a", A0), ("tiny-b", A0 + 7000.0)):
        files[name] = tmp_path / f"{name}.yaml"
        files[name].write_text(replace_coefficients(text, (a0, A1, A2), BETA, "test"), encoding="utf-8")
    ra, rb = run_experiments([a, b], settings(), progress=False, defaults=files)
    sa, sb = ra.scopes["summary"], rb.scopes["summary"]
    assert sb.ttft_ms - sa.ttft_ms == pytest.approx(7.0, abs=1e-6)
    assert sb.e2e_ms - sa.e2e_ms == pytest.approx(7.0, abs=1e-6)
    assert sb.itl_ms == pytest.approx(sa.itl_ms, abs=1e-9)
    assert str(files["tiny-b"].resolve()) in rb.command
    with pytest.raises(RoofcalError, match="no such BLIS defaults file"):
        run_experiments([a], settings(), progress=False, defaults={"tiny-a": tmp_path / "missing.yaml"})

"""Reading real vLLM serving experiments (../shared/workload/default_args): server, what
inference-perf actually ran (results/config.yaml), ground truth by hand on generated tokens,
inference-perf's schedule rebuilt, overload flags, and a one-line refusal naming file and field
for every bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from roofcal.errors import RoofcalError
from roofcal.io import yaml_load, yaml_text
from roofcal.measurements.workload import (
    Measured,
    PromptPool,
    Stage,
    inference_perf_requests,
    read_experiment,
    read_experiments,
    token_gap_ms,
)

WORKLOAD = Path(__file__).resolve().parents[2].parent / "shared" / "workload"
RUNS = WORKLOAD / "default_args"
CODEGEN_7B = "20260217-155451-llama-2-7b-tp1-codegen"
REASONING_7B = "20260217-170634-llama-2-7b-tp1-reasoning"

needs_data = pytest.mark.skipif(not RUNS.is_dir(),
                                reason=f"real experiments not found at {RUNS} (../shared beside the project)")


def copy_experiment(name: str, dest: Path) -> Path:
    """A writable copy of an experiment's input files (the shared tree is read-only)."""
    src, out = RUNS / name, dest / name
    (out / "results").mkdir(parents=True)
    for f in ["exp-config.yaml", "results/config.yaml"] + [f"results/{p.name}" for p in
                                                           (src / "results").glob("*_lifecycle_metrics.json")]:
        shutil.copyfile(src / f, out / f)
    return out


@needs_data
def test_all_nine_experiments_and_overload_flags():
    exps = read_experiments([RUNS])
    assert [e.name for e in exps] == sorted(p.name for p in RUNS.iterdir() if p.is_dir())
    assert len(exps) == 9
    assert {e.name for e in exps if e.overload} == {e.name for e in exps if "reasoning" in e.name}
    assert sum(e.overload for e in exps) == 3
    assert {(e.model_id, e.tp) for e in exps} == {("meta-llama/llama-2-7b-hf", 1),
                                                  ("meta-llama/llama-2-70b-hf", 4),
                                                  ("mistralai/mixtral-8x7b-v0.1", 2)}
    for e in exps:
        assert list(e.truth) == ["summary"] + [f"stage_{i}" for i in range(len(e.stages))]


@needs_data
def test_codegen_7b_fields_and_ground_truth_by_hand():
    e = read_experiment(RUNS / CODEGEN_7B)
    assert e.model == "meta-llama/Llama-2-7b-hf" and e.model_id == "meta-llama/llama-2-7b-hf"
    assert (e.tp, e.max_model_len, e.max_num_batched_tokens, e.max_num_seqs) == (1, 4096, 2048, 128)
    assert e.stages == (Stage(5.0, 600.0), Stage(10.0, 600.0))
    # what ran (results/config.yaml), not what profile.yaml asked for (11 × 4 users)
    assert e.pool == PromptPool(10, 10, 100, 466, 247) and e.pool.size == 100
    assert e.num_requests == 5 * 600 + 10 * 600
    assert e.timeout_s == 300.0 and not e.overload and e.kind == "inference-perf"

    # ITL = (mean E2E − mean TTFT) / (generated − 1), generated = output_len = 247 (ignore_eos),
    # by hand from the file (seconds → ms); the client's re-tokenised mean (195.1) is kept aside
    d = json.loads((RUNS / CODEGEN_7B / "results" / "summary_lifecycle_metrics.json").read_text())
    lat = d["successes"]["latency"]
    e2e, ttft = lat["request_latency"]["mean"], lat["time_to_first_token"]["mean"]
    s = e.truth["summary"]
    assert s.e2e_ms == pytest.approx(e2e * 1000, rel=1e-12)
    assert s.ttft_ms == pytest.approx(ttft * 1000, rel=1e-12)
    assert s.itl_ms == pytest.approx((e2e - ttft) / (247 - 1) * 1000, rel=1e-12)
    # ../shared/workload/README.md: "7B codegen is 8.34 ms, not 10.58"
    assert s.itl_ms == pytest.approx((2080.74 - 27.98) / 246, abs=0.01) and s.itl_ms == pytest.approx(8.34, abs=0.01)
    assert s.generated == 247 and s.client_output_len == pytest.approx(195.1, abs=0.05)
    assert (s.n_success, s.n_failures, s.failure_rate) == (9000, 0, 0.0)
    assert e.truth["stage_0"].n_success == 3000 and e.truth["stage_1"].n_success == 6000
    # the second stage starts once the first has drained (its longest request) + 2 s
    d0 = json.loads((RUNS / CODEGEN_7B / "results" / "stage_0_lifecycle_metrics.json").read_text())
    drain = d0["successes"]["latency"]["request_latency"]["max"]
    assert e.stage_starts_s == pytest.approx((0.0, 600.0 + drain + 2.0))


@needs_data
def test_schedule_is_inference_perfs_open_loop_pool():
    """The rebuilt schedule (inference-perf's ConstantLoadTimer and shared-prefix pool, facts in
    ../shared/workload/README.md): ⌊rate · duration⌋ sends per stage, exponential gaps rescaled so
    the last send is at the stage's end; request n of a stage uses pool prompt n mod 100, whose
    prefix holds all of it but its last token; lengths follow the measured distribution; output
    as generated; the client's 300 s timeout as the deadline; seeded and reproducible."""
    e = read_experiment(RUNS / CODEGEN_7B)
    r = e.requests(42)
    assert len(r) == 9000 and np.all(np.diff(r.request_id) == 1)
    for i, (stage, start) in enumerate(zip(e.stages, e.stage_starts_s)):
        t = r.send_us[r.stage == i] / 1e6
        assert len(t) == int(stage.rate * stage.duration)
        assert np.all(np.diff(t) >= 0) and t[0] > start
        assert t[-1] == pytest.approx(start + stage.duration, abs=1e-6)       # rescaled to the duration
        gaps = np.diff(np.concatenate([[start], t]))
        assert gaps.mean() == pytest.approx(1 / stage.rate, rel=1e-3)
        assert np.std(gaps) / gaps.mean() == pytest.approx(1.0, abs=0.06)    # exponential: CV ≈ 1
        groups = r.prefix_group[r.stage == i]
        assert list(groups[:3]) == ["prompt-00", "prompt-01", "prompt-02"] and groups[100] == "prompt-00"
    assert len(set(r.prefix_group.tolist())) == 100
    assert np.all(r.suffix_len == 1) and np.all(r.output_tokens == 247)
    assert np.all(r.deadline_us == r.send_us + 300_000_000)
    # prompt lengths: the measured mean and range (580–604 tokens)
    assert r.prompt_tokens.mean() == pytest.approx(e.truth["summary"].prompt_len, abs=0.5)
    assert r.prompt_tokens.min() >= 580 and r.prompt_tokens.max() <= 604
    # the prefix cache holds a pool prompt's whole blocks after its first use (100 first uses)
    cached = r.cached_tokens()
    assert (cached == 0).sum() == 100
    assert np.all(cached[100:] == ((r.prompt_tokens[100:] - 1) // 16) * 16)
    again = e.requests(42)
    assert np.array_equal(again.send_us, r.send_us)
    assert not np.array_equal(inference_perf_requests(e, 7).send_us, r.send_us)


@needs_data
def test_reasoning_run_is_overload_by_its_failure_rate():
    e = read_experiment(RUNS / REASONING_7B)
    s = e.truth["summary"]
    assert (s.n_success, s.n_failures) == (732, 4068)
    assert s.failure_rate == pytest.approx(4068 / 4800)
    assert e.overload and len(e.stages) == 1
    # the fastest successful requests (served before the queue built): the client's p1 of E2E,
    # 29.834 s in the results file, read in ms
    assert s.e2e_p1_ms == pytest.approx(29834.29990707982, rel=1e-12)


def test_token_gap_is_the_event_gaps_upper_quantile():
    # two stream events per token: half the event gaps are ~0, so the median token gap is the
    # events' p75 and the token gaps' p80 the events' p90 (seconds in, ms out)
    events = {"median": 0.0001, "p75": 0.0271, "p90": 0.0278}
    assert token_gap_ms(events) == pytest.approx(27.1)
    assert token_gap_ms(events, q=0.8) == pytest.approx(27.8)
    assert np.isnan(token_gap_ms({"median": 0.0001}))


@needs_data
def test_two_stream_events_per_token_in_every_run():
    # the fact token_gap_ms rests on: in every run the lower half of the client's event gaps is
    # under 0.2 ms while the upper quarter is a step (≥ 8 ms)
    for d in sorted(RUNS.iterdir()):
        ev = json.loads((d / "results" / "summary_lifecycle_metrics.json").read_text())
        ev = ev["successes"]["latency"]["inter_token_latency"]
        assert ev["median"] < 2e-4 and ev["p75"] > 8e-3, d.name
    # the 7B reasoning run's median token gap is its events' p75, 27.15 ms; its mean ITL, 36.92 ms,
    # also carries the stalls of preempted requests (its longest event gap is 39.9 s)
    s = read_experiment(RUNS / REASONING_7B).truth["summary"]
    assert s.token_gap_p50_ms == pytest.approx(27.151, abs=1e-3)
    assert s.itl_ms == pytest.approx(36.92, abs=0.01)


def test_measured_failure_rate_edges():
    assert Measured(1, 1, 1, 2, 9, 1).failure_rate == pytest.approx(0.1)
    assert Measured(1, 1, 1, 2, 0, 0).failure_rate == 0.0


@needs_data
def test_overload_runs_timed_out_at_300_s():
    """The failures of the overloaded runs lasted 300.0–301.0 s: the client's default timeout."""
    for name in (REASONING_7B,):
        d = json.loads((RUNS / name / "results" / "summary_lifecycle_metrics.json").read_text())
        lat = d["failures"]["request_latency"]
        assert 300.0 <= lat["min"] and lat["max"] <= 301.0
        assert read_experiment(RUNS / name).timeout_s == 300.0


def _edit_json(path: Path, edit) -> None:
    d = json.loads(path.read_text())
    edit(d)
    path.write_text(json.dumps(d))


def _edit_yaml(path: Path, edit) -> None:
    d = yaml_load(path.read_text())
    edit(d)
    path.write_text(yaml_text(d))


def _edit_config(path: Path, edit) -> None:
    lines = dict(line.split(":", 1) for line in path.read_text().splitlines() if ":" in line)
    edit(lines)
    path.write_text("".join(f"{k}:{v}\n" for k, v in lines.items()))


BAD_RAN = [
    ("unknown pool field", lambda d: d["data"]["shared_prefix"].update(num_topics=3), "data.shared_prefix.num_topics"),
    ("missing pool field", lambda d: d["data"]["shared_prefix"].pop("output_len"), "data.shared_prefix.output_len"),
    ("multi-turn", lambda d: d["data"]["shared_prefix"].update(enable_multi_turn_chat=True),
     "data.shared_prefix.enable_multi_turn_chat"),
    ("float length", lambda d: d["data"]["shared_prefix"].update(question_len=466.5), "data.shared_prefix.question_len"),
    ("a dataset", lambda d: d["data"].update(path="prompts.json"), "data.path"),
    ("a sweep", lambda d: d["load"].update(sweep={"num_stages": 3}), "load.sweep"),
    ("not constant", lambda d: d["load"].update(type="poisson"), "load.type"),
    ("no stages", lambda d: d["load"].update(stages=[]), "load.stages"),
    ("string rate", lambda d: d["load"]["stages"][1].update(rate="10"), "load.stages.1.rate"),
    ("zero duration", lambda d: d["load"]["stages"][0].update(duration=0), "load.stages.0.duration"),
    ("unknown stage field", lambda d: d["load"]["stages"][0].update(ramp=1), "load.stages.0.ramp"),
    ("other data type", lambda d: d["data"].update(type="random"), "data.type"),
    ("no streaming", lambda d: d["api"].update(streaming=False), "api.streaming"),
    ("bad timeout", lambda d: d["load"].update(request_timeout=-1), "load.request_timeout"),
]


@needs_data
@pytest.mark.parametrize("case,edit,field", BAD_RAN, ids=[c[0] for c in BAD_RAN])
def test_bad_ran_config_names_file_and_field(tmp_path, case, edit, field):
    exp = copy_experiment(CODEGEN_7B, tmp_path)
    _edit_yaml(exp / "results" / "config.yaml", edit)
    with pytest.raises(RoofcalError) as err:
        read_experiment(exp)
    msg = str(err.value)
    assert "config.yaml" in msg and f"field '{field}'" in msg and "\n" not in msg


BAD_CONFIGS = [
    ("missing tp", lambda c: c.pop("tensor_parallelism"), "tensor_parallelism"),
    ("float seqs", lambda c: c.update(max_num_seqs=" 1.5"), "max_num_seqs"),
    ("missing model", lambda c: c.pop("model"), "model"),
]


@needs_data
@pytest.mark.parametrize("case,edit,field", BAD_CONFIGS, ids=[c[0] for c in BAD_CONFIGS])
def test_bad_exp_config_names_file_and_field(tmp_path, case, edit, field):
    exp = copy_experiment(CODEGEN_7B, tmp_path)
    _edit_config(exp / "exp-config.yaml", edit)
    with pytest.raises(RoofcalError) as err:
        read_experiment(exp)
    assert "exp-config.yaml" in str(err.value) and f"field '{field}'" in str(err.value)


@needs_data
def test_bad_results_name_file_and_field(tmp_path):
    exp = copy_experiment(CODEGEN_7B, tmp_path)
    _edit_json(exp / "results" / "summary_lifecycle_metrics.json",
               lambda d: d["successes"]["latency"]["time_to_first_token"].pop("mean"))
    with pytest.raises(RoofcalError, match=r"summary_lifecycle_metrics\.json: field "
                                           r"'successes\.latency\.time_to_first_token\.mean'"):
        read_experiment(exp)


@needs_data
def test_bad_inter_token_quantile_names_file_and_field(tmp_path):
    exp = copy_experiment(CODEGEN_7B, tmp_path)
    _edit_json(exp / "results" / "summary_lifecycle_metrics.json",
               lambda d: d["successes"]["latency"]["inter_token_latency"].update(p75="fast"))
    with pytest.raises(RoofcalError, match=r"summary_lifecycle_metrics\.json: field "
                                           r"'successes\.latency\.inter_token_latency\.p75'"):
        read_experiment(exp)
    # without the quantiles the run still reads; it has no median token gap
    _edit_json(exp / "results" / "summary_lifecycle_metrics.json",
               lambda d: d["successes"]["latency"].pop("inter_token_latency"))
    assert np.isnan(read_experiment(exp).truth["summary"].token_gap_p50_ms)


@needs_data
@pytest.mark.parametrize("missing", ["results/stage_1_lifecycle_metrics.json",
                                     "results/summary_lifecycle_metrics.json",
                                     "results/config.yaml", "exp-config.yaml"])
def test_missing_file_is_named(tmp_path, missing):
    exp = copy_experiment(CODEGEN_7B, tmp_path)
    (exp / missing).unlink()
    with pytest.raises(RoofcalError, match=missing.replace(".", r"\.")):
        read_experiment(exp)


@needs_data
def test_read_experiments_folders(tmp_path):
    a = copy_experiment(CODEGEN_7B, tmp_path / "set")
    copy_experiment(REASONING_7B, tmp_path / "set")
    (tmp_path / "set" / "notes").mkdir()                  # not an experiment: skipped
    assert [e.name for e in read_experiments([tmp_path / "set"])] == [CODEGEN_7B, REASONING_7B]
    assert [e.name for e in read_experiments([a])] == [CODEGEN_7B]
    with pytest.raises(RoofcalError, match="given twice"):
        read_experiments([a, tmp_path / "set"])
    with pytest.raises(RoofcalError, match="no such experiment folder"):
        read_experiments([tmp_path / "nope"])
    with pytest.raises(RoofcalError, match="no experiment sub-folders"):
        read_experiments([tmp_path / "set" / "notes"])

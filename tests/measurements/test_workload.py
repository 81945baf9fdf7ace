"""Reading real vLLM serving experiments (../shared/workload/default_args): server, load, ground
truth by hand, overload flags, and a one-line refusal naming file and field for every bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from roofcal.errors import RoofcalError
from roofcal.measurements.workload import (
    Measured,
    SharedPrefix,
    Stage,
    read_experiment,
    read_experiments,
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
    for f in ["exp-config.yaml", "profile.yaml"] + [f"results/{p.name}" for p in
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
    assert e.prefix == SharedPrefix(11, 4, 100, 466, 247, True)
    assert e.num_requests == 5 * 600 + 10 * 600
    assert not e.overload

    # ITL = (mean E2E − mean TTFT) / (mean output_len − 1), from the file by hand (seconds → ms)
    d = json.loads((RUNS / CODEGEN_7B / "results" / "summary_lifecycle_metrics.json").read_text())
    lat = d["successes"]["latency"]
    e2e, ttft = lat["request_latency"]["mean"], lat["time_to_first_token"]["mean"]
    out_len = d["successes"]["output_len"]["mean"]
    s = e.truth["summary"]
    assert s.e2e_ms == pytest.approx(e2e * 1000, rel=1e-12)
    assert s.ttft_ms == pytest.approx(ttft * 1000, rel=1e-12)
    assert s.itl_ms == pytest.approx((e2e - ttft) / (out_len - 1) * 1000, rel=1e-12)
    # the README's rounded figures: (2080.74 − 27.98) / (195.1 − 1) ms ≈ 10.58 ms
    assert s.itl_ms == pytest.approx((2080.74 - 27.98) / (195.1 - 1), abs=0.01)
    assert s.itl_ms == pytest.approx(10.58, abs=0.01)
    assert (s.n_success, s.n_failures, s.failure_rate) == (9000, 0, 0.0)
    assert e.truth["stage_0"].n_success == 3000 and e.truth["stage_1"].n_success == 6000


@needs_data
def test_reasoning_run_is_overload_by_its_failure_rate():
    e = read_experiment(RUNS / REASONING_7B)
    s = e.truth["summary"]
    assert (s.n_success, s.n_failures) == (732, 4068)
    assert s.failure_rate == pytest.approx(4068 / 4800)
    assert e.overload and len(e.stages) == 1


def test_measured_failure_rate_edges():
    assert Measured(1, 1, 1, 2, 9, 1).failure_rate == pytest.approx(0.1)
    assert Measured(1, 1, 1, 2, 0, 0).failure_rate == 0.0


def _edit_json(path: Path, edit) -> None:
    d = json.loads(path.read_text())
    edit(d)
    path.write_text(json.dumps(d))


def _edit_config(path: Path, edit) -> None:
    lines = dict(line.split(":", 1) for line in path.read_text().splitlines() if ":" in line)
    edit(lines)
    path.write_text("".join(f"{k}:{v}\n" for k, v in lines.items()))


BAD_PROFILES = [
    ("unknown prefix field", lambda d: d["data"]["shared_prefix"].update(num_groups=3), "data.shared_prefix.num_groups"),
    ("missing prefix field", lambda d: d["data"]["shared_prefix"].pop("output_len"), "data.shared_prefix.output_len"),
    ("ill-typed flag", lambda d: d["data"]["shared_prefix"].update(enable_multi_turn_chat="yes"),
     "data.shared_prefix.enable_multi_turn_chat"),
    ("float length", lambda d: d["data"]["shared_prefix"].update(question_len=466.5), "data.shared_prefix.question_len"),
    ("unknown load field", lambda d: d["load"].update(sweep=None), "load.sweep"),
    ("not constant", lambda d: d["load"].update(type="poisson"), "load.type"),
    ("no stages", lambda d: d["load"].update(stages=[]), "load.stages"),
    ("string rate", lambda d: d["load"]["stages"][1].update(rate="10"), "load.stages.1.rate"),
    ("zero duration", lambda d: d["load"]["stages"][0].update(duration=0), "load.stages.0.duration"),
    ("unknown stage field", lambda d: d["load"]["stages"][0].update(ramp=1), "load.stages.0.ramp"),
    ("other data type", lambda d: d["data"].update(type="random"), "data.type"),
]


@needs_data
@pytest.mark.parametrize("case,edit,field", BAD_PROFILES, ids=[c[0] for c in BAD_PROFILES])
def test_bad_profile_names_file_and_field(tmp_path, case, edit, field):
    exp = copy_experiment(CODEGEN_7B, tmp_path)
    _edit_json(exp / "profile.yaml", edit)
    with pytest.raises(RoofcalError) as err:
        read_experiment(exp)
    msg = str(err.value)
    assert "profile.yaml" in msg and f"field '{field}'" in msg and "\n" not in msg


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
@pytest.mark.parametrize("missing", ["results/stage_1_lifecycle_metrics.json",
                                     "results/summary_lifecycle_metrics.json",
                                     "profile.yaml", "exp-config.yaml"])
def test_missing_file_is_named(tmp_path, missing):
    exp = copy_experiment(CODEGEN_7B, tmp_path)
    (exp / missing).unlink()
    with pytest.raises(RoofcalError, match=Path(missing).name.replace(".", r"\.")):
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

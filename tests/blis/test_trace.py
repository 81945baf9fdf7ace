"""Serving runs as TraceV2 files (roofcal.blis.trace): the layout BLIS reads, byte-identical for the
same run and seed, written all or nothing; BLIS replays a real run's trace exactly as rebuilt
(every request, every prompt token, the prefix-cache hits the pool implies); and a trace BLIS
itself wrote, with a server description, is an experiment whose replay reproduces it."""

from __future__ import annotations

import csv
import json
import math
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from roofcal import resources
from roofcal.blis.run import BlisSettings, run_experiment
from roofcal.blis.trace import data_text, header_text, trace_paths, write_trace
from roofcal.blis.validate import validate
from roofcal.measurements.tracev2 import COLUMNS
from roofcal.measurements.workload import read_experiment

SHARED = Path(__file__).resolve().parents[2].parent / "shared"
RUNS = SHARED / "workload" / "default_args"
BLIS = (SHARED / "tools" / "blis").resolve()        # as roofcal prints it (../shared may be a link)
CODEGEN_7B = "20260217-155451-llama-2-7b-tp1-codegen"

needs_data = pytest.mark.skipif(not RUNS.is_dir(), reason=f"experiments {RUNS} not found")
needs_blis = pytest.mark.skipif(not (BLIS.is_file() and RUNS.is_dir()), reason=f"BLIS binary {BLIS} not found")


def settings(**kw) -> BlisSettings:
    base = dict(blis=BLIS, defaults=resources.BLIS_DEFAULTS, hardware_config=resources.BLIS_HARDWARE,
                model_configs=(resources.MODEL_CONFIGS,))
    base.update(kw)
    return BlisSettings(**base)


@needs_data
def test_trace_layout_and_byte_identity(tmp_path):
    exp = read_experiment(RUNS / CODEGEN_7B)
    head, data = write_trace(exp, tmp_path / "a" / "run", seed=42)
    assert (head, data) == trace_paths(tmp_path / "a" / "run")
    h = head.read_text()
    assert h.startswith("trace_version: 3\ntime_unit: microseconds\nmode: generated\nwarm_up_requests: 0\n"
                        "workload_seed: 42\n")
    assert 'model: "meta-llama/Llama-2-7b-hf"' in h and "max_num_seqs: 128" in h
    rows = list(csv.reader(data.open()))
    assert tuple(rows[0]) == COLUMNS and len(rows) == 1 + 9000
    first = dict(zip(COLUMNS, rows[1]))
    assert first["client_id"] == "stage_0" and first["prefix_group"] == "prompt-00"
    assert first["input_tokens"] == "1" and first["output_tokens"] == "247" and first["streaming"] == "true"
    assert first["arrival_time_us"] == first["send_time_us"]
    assert int(first["deadline_us"]) == int(first["send_time_us"]) + 300_000_000
    assert first["status"] == "" and first["first_chunk_time_us"] == "0"       # a schedule, not a measurement
    # same run and seed: the same bytes; another seed: another schedule
    again = write_trace(exp, tmp_path / "b" / "run", seed=42)
    assert again[0].read_bytes() == head.read_bytes() and again[1].read_bytes() == data.read_bytes()
    other = data_text(exp, 7)
    assert other != data.read_text() and header_text(exp, 7) != h


@needs_data
def test_trace_is_written_all_or_nothing(tmp_path):
    exp = read_experiment(RUNS / CODEGEN_7B)
    (tmp_path / "run.csv").mkdir()                      # the data file cannot be written
    with pytest.raises(OSError):
        write_trace(exp, tmp_path / "run")
    assert not (tmp_path / "run.yaml").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.csv"]     # no temporary left behind


@pytest.mark.slow
@needs_blis
def test_blis_replays_a_real_runs_trace_as_rebuilt(tmp_path):
    """Every request is injected and completes; BLIS's input tokens are the rebuilt prompts; its
    prefix-cache hit rate is exactly the pool's: from its second use a prompt hits all its whole
    blocks but the one holding its last token (BLIS counts hit blocks over all blocks held,
    output included; nothing is evicted at this load)."""
    exp = read_experiment(RUNS / CODEGEN_7B)
    r = run_experiment(exp, settings(), keep=tmp_path)
    req = exp.requests(42)
    metrics = json.loads((tmp_path / exp.name / "metrics.json").read_text())
    assert r.injected == r.completed == len(req) == 9000 and r.timed_out == 0
    assert metrics["total_input_tokens"] == int(req.prompt_tokens.sum())
    assert metrics["total_output_tokens"] == int(req.output_tokens.sum())
    hit_blocks = (req.cached_tokens() // 16).sum()
    all_blocks = np.ceil((req.prompt_tokens + req.output_tokens) / 16).sum()
    assert r.cache_hit_rate == pytest.approx(hit_blocks / all_blocks, rel=1e-9)
    assert r.scopes["stage_0"].completed == 3000 and r.scopes["stage_1"].completed == 6000
    assert r.sim_duration_s == pytest.approx(req.send_us.max() / 1e6, abs=5.0)


@pytest.mark.slow
@needs_blis
def test_a_trace_blis_wrote_is_an_experiment_that_replays_itself(tmp_path):
    """blis replay --trace-output of a real run's trace (with BLIS's α1 = 0, which its E2E adds
    and its last chunk does not) read back with a server description: ground truth from its own
    timestamps; replayed again with the same coefficients it reproduces itself (E2E, TTFT, ITL
    to the µs)."""
    exp = read_experiment(RUNS / CODEGEN_7B)
    r = run_experiment(exp, settings(), keep=tmp_path / "first")
    work = tmp_path / "first" / exp.name
    alpha = "10000.0,0.0,20.0"
    beta = "1.25,0.0,1.3,0.75,25.0,24.0,500.0,481.9,0.0,0.96,0.75"
    cmd = r.command.replace("--metrics-path metrics.json", "") + f" --alpha-coeffs {alpha} --beta-coeffs {beta}" \
        + f" --trace-output {tmp_path / 'rec' / 'trace'}"
    (tmp_path / "rec").mkdir()
    p = subprocess.run(cmd, shell=True, cwd=work, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    (tmp_path / "rec" / "server.yaml").write_text(
        "model: meta-llama/Llama-2-7b-hf\ntensor_parallelism: 1\ngpu: h100_sxm\nmax_num_seqs: 128\n"
        "max_num_batched_tokens: 2048\nkv_blocks: 7463\nname: recorded-7b\n")
    rec = read_experiment(tmp_path / "rec")
    assert rec.kind == "trace" and rec.name == "recorded-7b" and len(rec.recorded) == 9000
    assert rec.scopes == ("summary",) and not rec.overload
    v = validate([rec], settings(), alpha=[float(x) for x in alpha.split(",")],
                 beta=[float(x) for x in beta.split(",")], progress=False)
    row = v.table.iloc[0]
    for m in ("e2e", "ttft", "itl"):
        assert row[f"sim_{m}_ms"] == pytest.approx(row[f"measured_{m}_ms"], abs=1e-3), m
    assert v.within == 1


@needs_data
def test_workload_trace_cli_writes_every_run(tmp_path, capsys):
    from roofcal.cli.main import main
    src = tmp_path / "runs"
    src.mkdir()
    for name in (CODEGEN_7B, "20260217-170634-llama-2-7b-tp1-reasoning"):
        shutil.copytree(RUNS / name, src / name)
    code = main(["workload", "trace", str(src), "--out", str(tmp_path / "t"), "--blis", str(BLIS)])
    assert code == 0
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == sorted(
        f"{n}.{x}" for n in (CODEGEN_7B, "20260217-170634-llama-2-7b-tp1-reasoning") for x in ("csv", "yaml"))
    out = capsys.readouterr().out
    assert out.count(" replay ") == 2 and f"--trace-header {tmp_path / 't' / CODEGEN_7B}.yaml" in out
    # refused before any work: the output is a file
    (tmp_path / "afile").write_text("")
    assert main(["workload", "trace", str(src), "--out", str(tmp_path / "afile")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "afile: exists and is not a folder" in err

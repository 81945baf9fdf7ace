"""Every command roofcal prints for the user runs as printed: ``export blis``'s ``blis run`` /
``blis replay`` lines and ``workload validate --keep``'s per-run lines, pasted into a shell in
another folder, run the real BLIS binary (../shared/tools/blis) on files that exist after roofcal
exits; no printed line names a file in a folder roofcal removed; outputs that replace an existing
file say so; ``workload calibrate`` says which iterate it keeps."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from roofcal import resources
from roofcal.cli.main import main
from roofcal.io import yaml_load, yaml_text

SHARED = Path(__file__).resolve().parents[2].parent / "shared"
RUNS = SHARED / "workload" / "default_args"
BLIS = (SHARED / "tools" / "blis").resolve()        # as roofcal prints it (../shared may be a link)
CODEGEN_7B = "20260217-155451-llama-2-7b-tp1-codegen"

needs_blis = pytest.mark.skipif(not (BLIS.is_file() and RUNS.is_dir()),
                                reason=f"BLIS binary {BLIS} or experiments {RUNS} not found "
                                       f"(../shared beside the project)")


def blis_lines(text: str) -> list[str]:
    """The printed lines that are BLIS commands (the binary's path first), indentation and any
    ``name:`` label before the command dropped."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if ": cd " in line:                                   # validate's "<run>: cd DIR && blis ..."
            line = line[line.index(": cd ") + 2:]
        if line.startswith((str(BLIS) + " ", "cd ")):
            out.append(line)
    return out


def run_pasted(line: str, cwd: Path) -> dict:
    """Run one printed line in a shell, in ``cwd``; BLIS's metrics JSON from its stdout."""
    p = subprocess.run(["bash", "-c", line], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, (line, p.stderr[-600:])
    if "--metrics-path" in line:                             # validate's command writes them to a file
        args = shlex.split(line, comments=True)
        folder = Path(args[1]) if args[0] == "cd" else cwd
        return json.loads((folder / args[args.index("--metrics-path") + 1]).read_text())
    return json.loads(p.stdout[p.stdout.index("{"):p.stdout.rindex("}") + 1])


def named_files(line: str) -> list[Path]:
    """The files a printed BLIS line reads (absolute, or relative to its ``cd`` folder)."""
    args = shlex.split(line, comments=True)
    here = Path(args[1]) if args[0] == "cd" else Path("/")
    out = []
    for flag in ("--defaults-filepath", "--hardware-config", "--trace-header", "--trace-data"):
        if flag in args:
            out.append(here / args[args.index(flag) + 1])
    out.append(Path(args[args.index("--model-config-folder") + 1]) / "config.json")
    return out


@pytest.mark.slow
@needs_blis
def test_export_blis_prints_a_run_a_replay_and_a_flags_line_that_run_as_printed(tmp_path, capsys, monkeypatch):
    out, elsewhere = tmp_path / "blis", tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.delenv("ROOFCAL_BLIS", raising=False)
    assert main(["export", "blis", "--coeffs", str(resources.COEFFS / "h100_sxm.yaml"),
                 "--defaults", str(resources.BLIS_DEFAULTS), "--model", "llama-2-7b-hf:1", "--samples", "100",
                 "--out-dir", str(out), "--blis", str(BLIS)]) == 0
    text = capsys.readouterr().out
    assert "run|replay" not in text and " ..." not in text and "(blis: the BLIS binary" not in text
    run, replay, flags = blis_lines(text)
    assert shlex.split(run)[1] == "run" and shlex.split(replay, comments=True)[1] == "replay"
    assert "--alpha-coeffs" in flags and shlex.split(flags)[1] == "run"
    for line in (run, flags):                            # a real workload, the server's limits, full paths
        assert "--num-requests" in line and "--max-num-seqs" in line
        assert all(p.is_absolute() and p.is_file() for p in named_files(line)), line
    # the flags variant reads a real defaults.yaml: the input (BLIS fails without one)
    args = shlex.split(flags)
    assert Path(args[args.index("--defaults-filepath") + 1]) == resources.BLIS_DEFAULTS.resolve()
    first = run_pasted(run, elsewhere)                  # writes the trace the replay line reads
    assert all(p.is_file() for p in named_files(replay))
    again = run_pasted(replay, elsewhere)
    as_flags = run_pasted(flags, elsewhere)
    assert first["completed_requests"] == again["completed_requests"] == as_flags["completed_requests"] == 100
    # the same coefficients by file and by flags, the same requests replayed: the same latencies
    assert first["e2e_mean_ms"] == again["e2e_mean_ms"] == as_flags["e2e_mean_ms"]
    assert not list(elsewhere.iterdir())                 # nothing relative to the shell's folder


def _export_stub():
    from roofcal.blis.deployments import DeploymentExport, Target
    from roofcal.blis.fit import Deployment
    t = Target(Deployment(str(resources.MODEL_CONFIGS / "llama-2-7b-hf" / "config.json"), 1), "llama-2-7b-hf")
    return DeploymentExport(targets=(t,), hardware="H100", alpha=(20000.0, 300.0, 30.0),
                            beta=(1.2, 0.0, 1.3, 0.75, 26.0, 27.0, 0.0, 0.0, 0.0, 0.96, 0.75), alpha_source="test")


@needs_blis
def test_usage_without_files_prints_the_flags_over_a_real_defaults_file(tmp_path):
    """What validate (without --keep) and calibrate print: no written file, the coefficients as
    flags over --defaults — a line that runs as printed."""
    from roofcal.blis.deployments import usage
    text = usage([_export_stub()], None, resources.BLIS_HARDWARE, resources.BLIS_DEFAULTS, BLIS)
    (line,) = blis_lines(text)
    assert "--trace-output" not in line and "replay" not in line
    assert run_pasted(line, tmp_path)["completed_requests"] == 100
    # without a binary the commands say `blis`, and a line says how to get its path
    text = usage([_export_stub()], None, resources.BLIS_HARDWARE, resources.BLIS_DEFAULTS, None)
    assert "  blis run --model llama-2-7b-hf" in text and text.endswith("$ROOFCAL_BLIS prints its full path)")


def tiny_experiment(dest: Path, name: str = "tiny-7b") -> Path:
    """A real Llama-2-7B TP1 server with a tiny load: one 151-token prompt, 10 generated tokens,
    one request a second for 3 s (as tests/blis/test_run.py builds it)."""
    out = dest / name
    (out / "results").mkdir(parents=True)
    shutil.copyfile(RUNS / CODEGEN_7B / "exp-config.yaml", out / "exp-config.yaml")
    ran = yaml_load((RUNS / CODEGEN_7B / "results" / "config.yaml").read_text())
    ran["data"]["shared_prefix"] = {"num_groups": 1, "num_prompts_per_group": 1, "system_prompt_len": 100,
                                    "question_len": 50, "output_len": 10}
    ran["load"]["stages"] = [{"rate": 1.0, "duration": 3}]
    (out / "results" / "config.yaml").write_text(yaml_text(ran))
    results = {"load_summary": {"count": 3},
               "successes": {"count": 3, "latency": {"request_latency": {"mean": 0.2, "max": 0.2, "p1": 0.2},
                                                     "time_to_first_token": {"mean": 0.02}},
                             "output_len": {"mean": 10.0}},
               "failures": {"count": 0, "request_latency": None, "prompt_len": None}}
    for f in ("summary", "stage_0"):
        (out / "results" / f"{f}_lifecycle_metrics.json").write_text(json.dumps(results))
    return out


@pytest.mark.slow
@needs_blis
def test_validate_prints_commands_only_for_files_it_keeps(tmp_path, capsys):
    exp = tiny_experiment(tmp_path)
    common = ["workload", "validate", str(exp), "--blis", str(BLIS), "--model-configs", str(resources.MODEL_CONFIGS),
              "--workers", "1"]
    # without --keep the run folders are gone: no command, and how to keep them
    assert main(common) == 0
    text = capsys.readouterr().out
    assert blis_lines(text) == []
    assert "rerun with --keep runs/ to keep the files these commands need" in text
    assert not placeholders(text), placeholders(text)
    # with --keep (and --coeffs: the defaults files written there too) every printed command runs
    keep, elsewhere = tmp_path / "kept", tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert main(common + ["--coeffs", str(resources.COEFFS / "h100_sxm.yaml"), "--samples", "100",
                          "--keep", str(keep)]) == 0
    text = capsys.readouterr().out
    assert not placeholders(text), placeholders(text)
    # the export command that writes the kept defaults files again: into their folder
    (export,) = [ln[ln.index("roofcal export blis"):] for ln in text.splitlines() if "roofcal export blis" in ln]
    args = shlex.split(export)
    assert Path(args[args.index("--out-dir") + 1]) == (keep / "defaults").resolve()
    lines = blis_lines(text)
    per_run = [ln for ln in lines if ln.startswith("cd ")]
    export_run = [ln for ln in lines if not ln.startswith("cd ") and shlex.split(ln)[1] == "run"]
    assert len(per_run) == 1 and len(export_run) == 2 and len(lines) == 4, text
    for line in lines:
        assert all(p.is_file() for p in named_files(line) if "workload" not in p.name), line
    kept = json.loads((keep / "tiny-7b" / "metrics.json").read_text())
    assert run_pasted(per_run[0], elsewhere)["e2e_mean_ms"] == kept["e2e_mean_ms"]
    for line in lines[:3]:                               # the export's run, replay (of that run's trace), flags
        assert run_pasted(line, elsewhere)["completed_requests"] == 100
    assert not list(elsewhere.iterdir())


def test_an_output_that_exists_is_said_to_be_replaced(tmp_path, capsys):
    out = tmp_path / "my_gpu.yaml"
    assert main(["gpu", "show", "a100_sxm", "--yaml", "--out", str(out)]) == 0
    assert "overwrote" not in capsys.readouterr().err
    assert main(["gpu", "show", "a100_sxm", "--yaml", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert f"roofcal: overwrote {out} (the datasheet file (--out); it existed before this run)" in err.splitlines()
    # a bad input still gets its one line alone, and nothing is written
    before = out.read_bytes()
    assert main(["gpu", "show", "no-such-gpu", "--yaml", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("roofcal: error:") and out.read_bytes() == before
    # export hardware --into FILE --out OTHER reads FILE: nothing said of it
    hw = tmp_path / "hw.json"
    assert main(["export", "hardware", "--gpu", "h100_sxm", "--into", str(resources.BLIS_HARDWARE),
                 "--out", str(hw)]) == 0
    assert "overwrote" not in capsys.readouterr().err


def test_bootstrap_suggests_a_prediction_file_of_its_own():
    from roofcal.cli.gpu import next_steps
    _, predict = next_steps("l4", "out/my_coeffs.yaml")        # no bundled kernels of the L4: no fit
    args = shlex.split(predict)
    assert args[args.index("--out") + 1] == "out/my_coeffs-pred.csv"
    assert args[args.index("--steps") + 1] == "out/my_coeffs-steps.jsonl"


#: an upper-case word a printed hint would have the user replace, as a flag's value or a
#: command's argument (``--out-dir DIR``, ``--out FILE2``, ``roofcal gpu template NAME``)
PLACEHOLDER = re.compile(r"(?:--[\w-]+\s+|\broofcal(?:\s+[a-z-]+)+\s+)(?:DIR|FILE\d*|NEW(?:\.yaml)?|PATH|NAME|"
                         r"MODEL|TP|STEPS(?:\.jsonl)?|KERNELS|EXP|REF)(?![\w/.-])")


def placeholders(text: str) -> list[str]:
    """The lines of ``text`` with a placeholder instead of a path, name or number."""
    return [ln for ln in text.splitlines() if PLACEHOLDER.search(ln)]


def test_the_placeholder_pattern_catches_what_it_names():
    for bad in ("roofcal power fit --coeffs FILE --gpu x.yaml --out FILE2", "--out-dir DIR", "--out NEW.yaml",
                "roofcal gpu template NAME --like h100_sxm", "--model MODEL --tp TP --steps STEPS.jsonl",
                "(give --blis PATH or set ROOFCAL_BLIS)", "rerun with --keep DIR to keep"):
        assert placeholders(bad), bad
    for good in ("roofcal gpu template my_gpu --like h100_sxm", "--out-dir /tmp/kept/defaults", "TP 4 on H100",
                 "--out DIR_NAME", "ROOFCAL_BLIS", "--data NAME/x.csv", "80 % interval: TP1", "--tp 4"):
        assert not placeholders(good), good


def run_hints(text: str, cwd: Path) -> list[str]:
    """Run every indented ``roofcal …`` / ``printf …`` line of ``text`` in a shell in ``cwd``, as
    printed; the lines run."""
    import os
    import sys
    lines = [ln.strip() for ln in text.splitlines() if re.match(r"\s+(roofcal|printf) ", ln)]
    env = dict(os.environ, ROOFCAL_CACHE="off", PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    for line in lines:
        p = subprocess.run(["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, (line, p.stderr[-800:])
    return lines


def test_gpu_hints_name_real_files_and_no_placeholder(tmp_path, capsys, monkeypatch):
    """``gpu show --out``, ``gpu template --out`` and ``gpu bootstrap`` print their next commands
    with the files they wrote and read: no placeholder; the datasheet's own hints alike."""
    monkeypatch.chdir(tmp_path)
    assert main(["gpu", "show", "a100_sxm", "--yaml", "--out", "my_gpu.yaml"]) == 0
    text = capsys.readouterr().out
    assert "roofcal gpu template my_gpu --like a100_sxm" in text and "--out my_gpu_coeffs.yaml" in text
    assert not placeholders(text) and not placeholders((tmp_path / "my_gpu.yaml").read_text())
    assert main(["gpu", "template", "my_l4", "--like", "l4", "--out", "my_l4.yaml"]) == 0
    text = capsys.readouterr().out
    assert not placeholders(text) and "--out my_l4_coeffs.yaml" in text, text
    assert main(["gpu", "bootstrap", "--datasheet", "l4", "--from", str(resources.COEFFS / "h100_sxm.yaml"),
                 "--out", "l4_coeffs.yaml"]) == 0
    text = capsys.readouterr().out
    assert not placeholders(text), placeholders(text)
    # the step file, its prediction; no kernels are bundled for the L4: the shapes to time, then
    # the refit on them in words
    hints = [ln.strip() for ln in text.splitlines() if re.match(r"\s+(roofcal|printf) ", ln)]
    assert [h.split()[:3] for h in hints] == [["printf", "'%s\\n'", "'{\"prefill\":"],
                                              ["roofcal", "predict", "--gpu"], ["roofcal", "gpu", "plan"]], hints
    assert "--steps l4_coeffs-steps.jsonl --out l4_coeffs-pred.csv" in hints[1]
    assert hints[2] == "roofcal gpu plan --gpu l4 --out vllm-0.14.0/plan.csv"     # the file's kernel set
    assert "no kernels of l4 are bundled" in text
    assert "roofcal fit --gpu l4 --prior l4_coeffs.yaml --data vllm-0.14.0/plan.csv" in text


def probe_run(tmp_path, capsys, monkeypatch) -> str:
    """``probe run --out probe-h100/`` with its timing path stubbed (no GPU here): the bundled H100
    measurement's overlay written into the folder; what it prints."""
    from roofcal.measurements import probe
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(probe, "run_probe", lambda out, model=None, base=None: probe.write_overlay(
        resources.ROOT / "data" / "sustained" / "h100_sxm", "h100_sxm", Path(out) / "overlay.yaml"))
    (tmp_path / "probe-h100").mkdir()
    assert main(["probe", "run", "--out", "probe-h100/"]) == 0
    return capsys.readouterr().out


def test_probe_run_prints_the_power_fit_of_its_measurement(tmp_path, capsys, monkeypatch):
    """``probe run``'s next command names its overlay and a coefficient file beside the folder."""
    text = probe_run(tmp_path, capsys, monkeypatch)
    assert not placeholders(text), text
    assert text.splitlines()[1:] == [f"  roofcal power fit --coeffs {resources.COEFFS / 'h100_sxm.yaml'} "
                                     "--gpu probe-h100/overlay.yaml --out probe-h100-coeffs.yaml"]


@pytest.mark.slow
def test_probe_runs_next_command_runs_as_printed(tmp_path, capsys, monkeypatch):
    text = probe_run(tmp_path, capsys, monkeypatch)
    assert len(run_hints(text, tmp_path)) == 1
    assert (tmp_path / "probe-h100-coeffs.yaml").is_file()


def test_validate_names_the_export_that_writes_its_files_again(tmp_path):
    """The ``export blis`` command ``workload validate`` prints writes where validate kept its
    files (``--keep``), else into ``blis/`` as the README's: a folder, not ``DIR``."""
    from roofcal.cli.main import build_parser
    from roofcal.cli.workload import export_command
    for how, flag in (("per-deployment", "--out-dir"), ("per-run", "--out-dir"), ("global", "--out")):
        a = build_parser().parse_args(["workload", "validate", str(RUNS), "--coeffs", "c.yaml", "--export", how])
        gone, kept = export_command(a), export_command(a, [tmp_path / "defaults" / "x.yaml"])
        assert not placeholders(gone) and not placeholders(kept), (gone, kept)
        assert shlex.split(gone)[shlex.split(gone).index(flag) + 1] in ("blis/", "blis.yaml")
        want = tmp_path / "defaults" / ("x.yaml" if how == "global" else "")
        assert Path(shlex.split(kept)[shlex.split(kept).index(flag) + 1]) == want.resolve()


def test_calibrate_says_which_iterate_it_keeps_and_why():
    from roofcal.calibration.workload import Iterate, WorkloadCalibration

    def it(loss, e2e):
        return Iterate({}, (), np.ones((1, 3)), np.ones((1, 3)), loss, {"e2e": e2e, "ttft": 9.0, "itl": 3.0}, 1)
    history = [it(0.010, 2.2), it(0.012, 2.0), it(0.011, 2.1)]
    cal = WorkloadCalibration(stack=None, best=history[0], history=history)
    assert cal.kept == 1
    text = cal.kept_text()
    assert text.startswith("kept: refresh 1 of 3, BLIS MAPE E2E 2.2 %") and "the lowest BLIS loss" in text

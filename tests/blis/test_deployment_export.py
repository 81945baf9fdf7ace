"""Per-deployment export (roofcal.blis.deployments, ``roofcal export blis --out-dir``): one
defaults.yaml per deployment — only its coefficient lines changed — with betas distilled for that
deployment inside their physical bounds and α0 = the stack's API time + that deployment's own
cycle at its runs' loads; the usage text says which file goes with which blis command; per-run
files; a nominal load without runs; refusals before any work."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from roofcal.blis.defaults_yaml import read_defaults_coefficients
from roofcal.blis.fit import BETA_BOUNDS
from roofcal.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
DEFAULTS = ROOT / "data" / "blis" / "defaults.yaml"
COEFFS = ROOT / "coeffs" / "h100_sxm.yaml"
RUNS = ROOT.parent / "shared" / "workload" / "default_args"
SEVEN_B = RUNS / "20260217-155451-llama-2-7b-tp1-codegen"
SEVENTY_B = RUNS / "20260217-203421-llama-2-70b-hf-tp4-codegen"
needs_runs = pytest.mark.skipif(not RUNS.is_dir(), reason="experiments not found (../shared beside the project)")


def _changed_lines(a: Path, b: Path) -> list[int]:
    la, lb = a.read_text().splitlines(), b.read_text().splitlines()
    assert len(la) == len(lb)
    return [i for i, (x, y) in enumerate(zip(la, lb)) if x != y]


@pytest.mark.slow
@needs_runs
def test_one_file_per_deployment_with_its_own_alpha0(tmp_path, capsys):
    out = tmp_path / "blis"
    code = main(["export", "blis", "--coeffs", str(COEFFS), "--defaults", str(DEFAULTS), "--out-dir", str(out),
                 "--for", str(SEVEN_B), str(SEVENTY_B), "--samples", "200"])
    assert code == 0
    files = sorted(p.name for p in out.iterdir())
    assert files == ["llama-2-70b-hf-tp4.yaml", "llama-2-7b-hf-tp1.yaml"]
    text = capsys.readouterr().out
    for f in files:
        assert f"--defaults-filepath {out / f}" in text
        changed = _changed_lines(DEFAULTS, out / f)                # only the two coefficient lines
        assert len(changed) == 2
    assert "--model meta-llama/llama-2-7b-hf --tp 1 --hardware H100" in text
    a7, b7 = read_defaults_coefficients(out / "llama-2-7b-hf-tp1.yaml")
    a70, b70 = read_defaults_coefficients(out / "llama-2-70b-hf-tp4.yaml")
    # both carry the stack's API time; each adds one cycle of its own deployment: 70B's is longer
    from roofcal.model import coeffs as C
    c = C.load(COEFFS)
    api = c.stacks[c.stack].alphas_us["queueing_us"]
    assert a7[0] > api and a70[0] - api > 1.5 * (a7[0] - api)
    assert a7[1:] == a70[1:]
    for beta in (b7, b70):
        for v, (lo, hi) in zip(beta, BETA_BOUNDS):
            assert lo <= v <= hi
    assert b7 != b70
    assert "alpha0 = API" in (out / "llama-2-7b-hf-tp1.yaml").read_text()
    # their decode-heavy stages draw less than the H100's 700 W: the betas are at the boost clock
    assert text.count("clock: boost clock: every stage within the 700 W limit") == 2
    assert "power-limited clock" not in (out / "llama-2-7b-hf-tp1.yaml").read_text()


@pytest.mark.slow
@needs_runs
def test_the_load_line_counts_every_run_and_names_the_one_left_out(tmp_path, capsys):
    # Llama-2-7B's three runs: the reasoning run overloaded, so α0's load is the other two, and the
    # line says so instead of "2 run(s)" for a deployment of three
    runs = [RUNS / n for n in ("20260217-155451-llama-2-7b-tp1-codegen", "20260217-170634-llama-2-7b-tp1-reasoning",
                               "20260217-231439-llama-2-7b-tp1-general")]
    out = tmp_path / "blis"
    assert main(["export", "blis", "--coeffs", str(COEFFS), "--defaults", str(DEFAULTS), "--out-dir", str(out),
                 "--for", *map(str, runs), "--samples", "100"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if "load:" in ln)
    assert line.endswith("load: 2 of 3 runs, their stages' steady state, weighted by 1/TTFT²; left out, "
                         "overloaded when measured: 20260217-170634-llama-2-7b-tp1-reasoning"), line
    # one run, not overloaded: nothing left out, and a single run is not "weighted"
    assert main(["export", "blis", "--coeffs", str(COEFFS), "--defaults", str(DEFAULTS), "--out-dir",
                 str(tmp_path / "one"), "--for", str(runs[0]), "--samples", "100"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if "load:" in ln)
    assert line.endswith("load: 1 run, its stages' steady state"), line


@pytest.mark.slow
@needs_runs
def test_per_run_files(tmp_path):
    out = tmp_path / "runs"
    assert main(["export", "blis", "--coeffs", str(COEFFS), "--defaults", str(DEFAULTS), "--out-dir", str(out),
                 "--for", str(SEVEN_B), "--per-run", "--samples", "100"]) == 0
    assert [p.name for p in out.iterdir()] == [f"{SEVEN_B.name}.yaml"]


@pytest.mark.slow
def test_nominal_load_without_runs(tmp_path, capsys):
    out = tmp_path / "nominal"
    assert main(["export", "blis", "--coeffs", str(COEFFS), "--defaults", str(DEFAULTS), "--out-dir", str(out),
                 "--model", "llama-3.1-8b-instruct:1,2", "--samples", "100"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["llama-3.1-8b-instruct-tp1.yaml", "llama-3.1-8b-instruct-tp2.yaml"]
    text = capsys.readouterr().out
    assert "nominal: a step of 32 decodes at 1024 tokens" in text
    # without runs the clock is the deployment's limit steps' (8,192-token budget, prefill-heavy):
    # power-limited on H100, so the betas carry a slower compute-bound time, and say so
    assert text.count("clock: sustained: compute-bound time x1.") == 2
    assert "at a power-limited clock (compute-bound time x1." in (out / "llama-3.1-8b-instruct-tp1.yaml").read_text()
    burst = tmp_path / "burst"
    assert main(["export", "blis", "--coeffs", str(COEFFS), "--defaults", str(DEFAULTS), "--out-dir", str(burst),
                 "--model", "llama-3.1-8b-instruct:1", "--samples", "100", "--clock", "burst"]) == 0
    _, b_sust = read_defaults_coefficients(out / "llama-3.1-8b-instruct-tp1.yaml")
    _, b_burst = read_defaults_coefficients(burst / "llama-3.1-8b-instruct-tp1.yaml")
    assert b_sust[0] > b_burst[0]          # β1a, the prefill compute term, is larger at the lower clock


@pytest.mark.parametrize("extra,message", [
    (["--per-run", "--model", "llama-2-7b-hf:1"], "--per-run needs the runs"),
    (["--out", "x.yaml"], "drop --out"),
    (["--hardware", "H100", "--model", "llama-2-7b-hf:1"], "drop --hardware"),
])
def test_refusals_before_any_work(tmp_path, capsys, extra, message):
    code = main(["export", "blis", "--coeffs", str(COEFFS), "--defaults", str(DEFAULTS), "--out-dir",
                 str(tmp_path / "o"), *extra])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1
    assert not (tmp_path / "o").exists()


def test_for_without_out_dir_and_an_out_dir_that_is_a_file(tmp_path, capsys):
    assert main(["export", "blis", "--coeffs", str(COEFFS), "--defaults", str(DEFAULTS), "--in-place",
                 "--for", str(SEVEN_B)]) == 2
    assert "--for goes with --out-dir DIR" in capsys.readouterr().err
    (tmp_path / "file").write_text("")
    assert main(["export", "blis", "--coeffs", str(COEFFS), "--defaults", str(DEFAULTS), "--out-dir",
                 str(tmp_path / "file"), "--model", "llama-2-7b-hf:1"]) == 2
    assert "exists and is not a folder" in capsys.readouterr().err


@pytest.mark.slow
@needs_runs
def test_what_validate_replays_is_what_export_writes(tmp_path, capsys):
    # the command `workload validate` prints for its exports writes the very coefficients it
    # replayed: per deployment (--out-dir) and one global file for all the runs (--for … --out)
    from roofcal.blis.run import BlisSettings
    from roofcal.calibration.workload import export_for
    from roofcal.measurements.workload import read_experiments
    from roofcal.model import coeffs as coeff_io
    from roofcal import resources
    exps = read_experiments([SEVEN_B, SEVENTY_B])
    bs = BlisSettings(blis=None, defaults=DEFAULTS, hardware_config=resources.BLIS_HARDWARE,
                      model_configs=tuple(resources.default_model_configs()))
    c = coeff_io.resolve_stack(coeff_io.load(COEFFS), None, required=True)
    for how, args in (("per-deployment", ["--out-dir", str(tmp_path / "d")]),
                      ("global", ["--out", str(tmp_path / "g.yaml")])):
        exports = export_for(c, exps, bs, samples=120, export=how)
        assert main(["export", "blis", "--coeffs", str(COEFFS), "--defaults", str(DEFAULTS), "--samples", "120",
                     "--for", str(SEVEN_B), str(SEVENTY_B), *args]) == 0
        written = sorted((tmp_path / "d").iterdir()) if how == "per-deployment" else [tmp_path / "g.yaml"]
        assert len(written) == len(exports)
        for ex in exports:
            path = next(p for p in written if how == "global" or p.stem == ex.targets[0].stem)
            alpha, beta = read_defaults_coefficients(path)
            assert alpha == pytest.approx(ex.alpha, rel=1e-8) and beta == pytest.approx(ex.beta, rel=1e-8)
    out = capsys.readouterr().out
    # the usage names every file BLIS needs (it finds none beside a written defaults file)
    assert "--model-config-folder" in out and "--hardware-config" in out

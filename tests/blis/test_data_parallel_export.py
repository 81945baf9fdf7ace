"""``export blis`` for a data- and expert-parallel deployment: β_EP distilled from the native
DP × EP step, BLIS's ``--dp`` flags printed, and every printed command run in the real BLIS."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest

from roofcal.blis.defaults_yaml import read_defaults_coefficients
from roofcal.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
DEFAULTS = ROOT / "data" / "blis" / "defaults.yaml"
COEFFS = ROOT / "coeffs" / "h100_sxm.yaml"
BLIS = (ROOT.parent / "shared" / "tools" / "blis").resolve()        # as roofcal prints it (../shared may be a link)


def _metrics(stdout: str) -> dict:
    """BLIS's summary JSON (the last top-level object it prints)."""
    start = stdout.rfind("\n{")
    return json.loads(stdout[start:] if start >= 0 else stdout)


@pytest.mark.slow
@pytest.mark.skipif(not BLIS.is_file(), reason="needs ../shared/tools/blis")
def test_a_dp_ep_deployment_exports_beta_ep_and_runs_in_blis_as_printed(tmp_path, capsys):
    out = tmp_path / "dp"
    assert main(["export", "blis", "--coeffs", str(COEFFS), "--defaults", str(DEFAULTS), "--out-dir", str(out),
                 "--model", "mixtral-8x7b-v0.1:1", "--dp", "4", "--enable-expert-parallel", "--samples", "300",
                 "--blis", str(BLIS)]) == 0
    path = out / "mixtral-8x7b-v0.1-tp1-dp4-ep.yaml"
    assert [p.name for p in out.iterdir()] == [path.name]
    _, beta0 = read_defaults_coefficients(DEFAULTS)
    _, beta = read_defaults_coefficients(path)
    # β_EP is fitted on the dispatch and combine (BLIS's default sets it to β4), within its bound
    assert len(beta) == 11 and beta[10] != pytest.approx(beta0[3]) and 0 < beta[10] <= 50
    text = capsys.readouterr().out
    assert "mixtral-8x7b-v0.1 TP1 DP4 EP (allgather_reducescatter) on H100" in text
    assert "held-out" in text and "data-parallel ranks as one" in text
    commands = [ln.strip().split("   # ")[0] for ln in text.splitlines() if ln.strip().startswith(str(BLIS))]
    assert len(commands) == 3                      # run, replay of its trace, the flags variant
    results = []
    for cmd in commands:
        argv = shlex.split(cmd)
        assert argv[argv.index("--dp") + 1] == "4" and "--enable-expert-parallel" in argv
        # all four ranks' limits and KV blocks: BLIS's own KV sizing would refuse the deployment
        assert argv[argv.index("--max-num-seqs") + 1] == "1024"
        assert int(argv[argv.index("--total-kv-blocks") + 1]) > 4 * 10_000
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-500:]
        results.append(_metrics(done.stdout))
    # the run, its replay and the flags over the input defaults give the same latencies
    for key in ("e2e_mean_ms", "ttft_mean_ms", "itl_mean_ms"):
        assert results[0][key] == pytest.approx(results[1][key], rel=1e-9) == pytest.approx(results[2][key], rel=1e-9)
    assert 5.0 < results[0]["itl_mean_ms"] < 50.0


def test_dp_flags_need_the_deployments_they_lay_out(tmp_path, capsys):
    assert main(["export", "blis", "--coeffs", str(COEFFS), "--defaults", str(DEFAULTS), "--out-dir",
                 str(tmp_path / "o"), "--dp", "2"]) == 2
    err = capsys.readouterr().err
    assert "apply to the deployments given by --model NAME:TP" in err and err.count("\n") == 1
    assert main(["export", "blis", "--coeffs", str(COEFFS), "--defaults", str(DEFAULTS), "--out-dir",
                 str(tmp_path / "o"), "--model", "llama-2-7b-hf:1", "--dp", "2", "--enable-expert-parallel"]) == 2
    assert "needs an MoE model" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_a_deployments_layout_is_recorded_and_read_back():
    from roofcal.blis.fit import Deployment, deployments_from_records
    from roofcal.errors import RoofcalError
    from roofcal.physics.config import Parallel
    deps = [Deployment("a", 2), Deployment("b", 1, Parallel(8, True, "deepep_low_latency"))]
    records = [d.record() for d in deps]
    assert records[0] == {"model": "a", "tp": 2}              # a TP deployment's record as before
    assert records[1] == {"model": "b", "tp": 1, "dp": 8, "ep": True, "moe_comm": "deepep_low_latency"}
    assert deployments_from_records(records, "f") == deps
    with pytest.raises(RoofcalError, match=r"f\[0\]: expected dp an integer"):
        deployments_from_records([{"model": "a", "tp": 1, "dp": 0}], "f")

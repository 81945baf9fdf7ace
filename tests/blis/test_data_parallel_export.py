"""``export blis`` for a data- and expert-parallel deployment: β_EP distilled from the native
DP × EP step, BLIS's ``--dp`` flags printed, and every printed command run in the real BLIS; the touched-experts basis of
``roofcal.bench.blis_form``."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import numpy as np
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


def test_the_touched_experts_share_by_hand():
    from roofcal.bench.blis_form import touched_share
    # Mixtral: 8 experts, top-2: one token touches 2 of 8; two tokens 1 - 0.75^2
    np.testing.assert_allclose(touched_share([0, 1, 2, 32], 8, 2), [0.0, 0.25, 0.4375, 1 - 0.75 ** 32])



def test_a_basis_with_touched_experts_only_changes_the_routed_weights():
    import roofcal.blis.fit as F
    from roofcal.bench.blis_form import touched_experts_basis, touched_share
    from roofcal.blis.basis import BlisBatch, BlisHardware, layer_split
    from roofcal.blis.config import load_blis_model
    from roofcal.resources import MODEL_CONFIGS
    model = load_blis_model(MODEL_CONFIGS / "mixtral-8x7b-v0.1" / "config.json", "")
    hw = BlisHardware.from_dict({"TFlopsPeak": 989.0, "BwPeakTBs": 3.35, "mfuPrefill": 0.55, "mfuDecode": 0.3})
    decodes = lambda n: [{"input_len": 512, "progress_index": 600, "num_new_tokens": 1,
                          "num_output_tokens": 200}] * n
    batch = BlisBatch.from_steps([decodes(1), decodes(64)])
    before = (F.blis_constants, F.basis_for_constants)
    c = F.blis_constants(model, hw, 2)
    plain = {k: np.asarray(v) for k, v in F.basis_for_constants(c, batch).items()}
    with touched_experts_basis():
        c2 = F.blis_constants(model, hw, 2)
        touched = {k: np.asarray(v) for k, v in F.basis_for_constants(c2, batch).items()}
    assert (F.blis_constants, F.basis_for_constants) == before          # restored
    for k in plain:
        if k != "t_weight_us":
            np.testing.assert_array_equal(plain[k], touched[k])
    # Mixtral TP 2: 32 MoE layers x 4 resident experts x 3 x 4,096 x 14,336 x 2 B per GPU
    routed = layer_split(model)[0] * 4 * 3 * 4096 * 14336 * 2 / 3.35e6
    saved = routed * (1 - touched_share([1, 64], 8, 2))
    np.testing.assert_allclose(plain["t_weight_us"] - touched["t_weight_us"], saved, rtol=1e-6)

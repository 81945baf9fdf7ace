"""Workload calibration: the pieces that do not need BLIS, checked by hand, and its refusals."""

import math
import subprocess
import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from roofcal.calibration import workload as W
from roofcal.io import yaml_load, yaml_text

SHARED = Path(__file__).resolve().parents[2].parent / "shared"
RUNS = SHARED / "workload" / "default_args"
needs_runs = pytest.mark.skipif(not RUNS.is_dir(), reason=f"experiments {RUNS} not found (../shared beside the project)")


def test_theta_maps_to_physical_values_and_back():
    values = {"step_us": 1800.0, "decode_seq_us": 35.0, "prefill_seq_us": 250.0, "layer_us": 12.0,
              "overlap": 2.5, "queueing_us": 4000.0, "post_decode_us": 600.0, "output_token_us": 25.0}
    theta = W.physical_to_theta(values)
    back = {k: float(v) for k, v in W.theta_to_physical(jnp.asarray(theta)).items()}
    assert back == pytest.approx(values, rel=1e-6)
    st = W.stack_of(theta, {"kind": "test"})
    assert st.alphas_us == pytest.approx({"queueing_us": 4000.0, "post_decode_us": 600.0, "output_token_us": 25.0}, rel=1e-5)
    # the step pytree holds the CPU/GPU overheads where combine expects them; the rest stay off
    from roofcal.model import correction as K
    o = np.exp(np.asarray(st.params["overheads"]))
    assert o[K.STEP_OVERHEADS.index("step_us")] == pytest.approx(1800.0, rel=1e-5)
    assert o[K.STEP_OVERHEADS.index("token_us")] < 1e-6


def test_levenberg_marquardt_recovers_a_known_curve():
    # y = a·exp(b·x) at a = 3, b = −0.7: the minimiser of the squared log residuals is (log 3, −0.7)
    x = np.linspace(0, 4, 20)
    y = 3.0 * np.exp(-0.7 * x)

    def res(th):
        return jnp.log(jnp.exp(th[0]) * jnp.exp(th[1] * jnp.asarray(x))) - jnp.log(jnp.asarray(y))

    import jax
    th = W.levenberg_marquardt(jax.jit(res), jax.jit(jax.jacfwd(res)), np.array([0.0, 0.0]), 50)
    assert th == pytest.approx([math.log(3.0), -0.7], abs=1e-4)


@pytest.mark.slow
@needs_runs
def test_bad_requests_are_one_line_errors(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    run = lambda *a: subprocess.run([sys.executable, "-m", "roofcal.cli", "workload", *a], capture_output=True,
                                    text=True, env=env, cwd=Path(__file__).resolve().parents[2])
    r = run("calibrate", str(RUNS / "20260217-155451-llama-2-7b-tp1-codegen"), "--coeffs", "coeffs/h100_sxm.yaml",
            "--out", str(tmp_path / "x.yaml"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "ROOFCAL_BLIS" in r.stderr
    assert not (tmp_path / "x.yaml").exists()
    blis = SHARED / "tools" / "blis"
    r = run("calibrate", str(RUNS / "20260217-155451-llama-2-7b-tp1-codegen"), "--coeffs", "coeffs/h100_sxm.yaml",
            "--blis", str(blis), "--holdout", "no-such-model", "--out", str(tmp_path / "x.yaml"))
    assert r.returncode == 2 and "--holdout no-such-model: no experiment of that model" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "x.yaml").exists()


@pytest.mark.slow
@pytest.mark.skipif(not (SHARED / "tools" / "blis").is_file() or not RUNS.is_dir(),
                    reason="BLIS binary or experiments not found (../shared beside the project)")
def test_calibrate_writes_a_recorded_stack_that_validate_reproduces(tmp_path):
    # a short real run (Llama-2-7B server, 5 req/s for 20 s) with BLIS in the loop: the fitted
    # stack lands in the file as its default, with its source; replaying the runs with what
    # `export blis --out-dir` writes for the written file gives what the calibration reported
    import json
    import shutil
    import yaml
    from roofcal.blis.run import BlisSettings
    from roofcal.blis.validate import validate
    from roofcal.model import coeffs as coeff_io
    from roofcal import resources
    src = RUNS / "20260217-155451-llama-2-7b-tp1-codegen"
    exp_dir = tmp_path / "short-7b"
    shutil.copytree(src, exp_dir)
    ran = yaml_load((exp_dir / "results" / "config.yaml").read_text())
    ran["load"]["stages"] = [{"rate": 5, "duration": 20}]
    (exp_dir / "results" / "config.yaml").write_text(yaml_text(ran))
    shutil.copyfile(exp_dir / "results" / "stage_0_lifecycle_metrics.json",
                    exp_dir / "results" / "summary_lifecycle_metrics.json")
    (exp_dir / "results" / "stage_1_lifecycle_metrics.json").unlink()
    from roofcal.measurements.workload import read_experiment
    exp = read_experiment(exp_dir)
    bs = BlisSettings(blis=SHARED / "tools" / "blis", defaults=resources.BLIS_DEFAULTS,
                      hardware_config=resources.BLIS_HARDWARE, model_configs=(resources.MODEL_CONFIGS,))
    out = tmp_path / "c.yaml"
    rep = W.calibrate_file(resources.COEFFS / "h100_sxm.yaml", [exp], bs,
                           W.WorkloadSettings(refreshes=1, samples=100, lm_iters=10), out, name="short")
    c = coeff_io.load(out)
    assert c.stack == "short" and {"splitwise", "vllm", "short"} <= set(c.stacks)
    st = c.stacks["short"]
    assert st.source["kind"].startswith("workload") and st.source["experiments"][0]["name"] == "short-7b"
    assert st.source["blis"]["replay"] == "trace" and st.source["first_token"]["cycles"] == 1.0
    assert st.source["settings"]["export"] == "per-deployment"
    for name, v in rep.calibration.best.theta.items():
        assert v > 0 and (name != "overlap" or v >= 1)
    (ex,) = rep.calibration.best.exports
    assert ex.covers(exp) and [e.name for e in ex.target.experiments] == ["short-7b"]
    # α0 = the stack's API time + one cycle of this deployment at this load
    api = st.alphas_us["queueing_us"]
    assert ex.alpha[0] == pytest.approx(api + ex.first_token["cycle_us"], rel=1e-6)
    assert 3000 < ex.first_token["cycle_us"] < 30000
    # the written file, exported again, replays to what the calibration reported
    again = W.export_for(c, [exp], bs, samples=100)
    assert again[0].alpha == pytest.approx(ex.alpha, rel=1e-5) and again[0].beta == pytest.approx(ex.beta, rel=1e-5)
    v = validate([exp], bs, again[0].alpha, again[0].beta, progress=False)
    row = v.table[v.table["scope"] == "summary"].iloc[0]
    first = rep.validation.table[rep.validation.table["scope"] == "summary"].iloc[0]
    assert row["sim_e2e_ms"] == pytest.approx(first["sim_e2e_ms"], rel=1e-3)
    assert row["sim_ttft_ms"] == pytest.approx(first["sim_ttft_ms"], rel=1e-3)

"""What-if: traced datasheet numbers reproduce the model, elasticities match finite differences
and obey the physics, and the ``whatif`` command."""

import json

import numpy as np
import pytest

from roofcal.model import coeffs as coeff_io
from roofcal.transfer import whatif as W
from roofcal.transfer.bootstrap import bootstrap
from roofcal.cli.main import main
from roofcal.physics.config import load_model
from roofcal.errors import RoofcalError
from roofcal.physics.hardware import load_gpu
from roofcal.model.combine import step_breakdown
from roofcal.physics.steps import Step, batch_steps

H100 = load_gpu("h100_sxm")
L7 = load_model("llama-2-7b-hf")
FITTED = coeff_io.load("coeffs/h100_sxm.yaml", H100)
STEPS = [Step(decode=(1,)), Step(decode=(1000,) * 32), Step(prefill=((4096, 0),)),
         Step(prefill=((512, 1024), (256, 0)), decode=(300,) * 8)]
BATCH = batch_steps(STEPS)            # one padded shape, so each program compiles once
RATES = ("bf16_tflops", "hbm_bandwidth_tbs", "interconnect_bandwidth_gbs")
CHANGES = {"hbm_bandwidth_tbs": 4.8, "sm_count": 100, "bf16_tflops": 1200.0}
NEW = H100.replace(**CHANGES)


def neutralised(params):
    """The neutral roofline (efficiency 1, no latency or overhead) in the pytree of ``params``,
    so it reuses the programs compiled for them."""
    import jax.numpy as jnp
    from roofcal.model import correction as K
    ops = {}
    for key, p in params["ops"].items():
        w = jnp.zeros_like(p["eff_c"]).at[0].set(K.logit(K.NEUTRAL_EFFICIENCY))
        ops[key] = {**p, "eff_c": w, "eff_m": w, "latency": jnp.asarray(np.log(1e-9), jnp.float32),
                    "sharpness": jnp.asarray(K.softplus_inv(K.NEUTRAL_SHARPNESS - 1), jnp.float32)}
    return {"ops": ops, "step": K.neutral_step_params()}


def totals(params, theta, gpu=H100, ref=H100, tp=2, rule="sm"):
    return np.asarray(W.step_times(params, theta, L7, gpu, ref, tp, BATCH, rule)["total"], np.float64)


@pytest.mark.slow
def test_traced_datasheet_reproduces_the_model_before_and_after():
    before = totals(FITTED.params, W.theta_of(H100))
    ref = np.asarray(step_breakdown(FITTED.params, L7, H100, 2, BATCH)["total"])
    np.testing.assert_allclose(before, ref, rtol=1e-6)
    # after = a prediction with the coefficients bootstrapped to the changed datasheet
    after = totals(FITTED.params, W.theta_of(NEW), gpu=NEW)
    boot = coeff_io.roundtrip(bootstrap(FITTED, H100, NEW))
    np.testing.assert_allclose(after, np.asarray(step_breakdown(boot.params, L7, NEW, 2, BATCH)["total"]),
                               rtol=2e-5)


@pytest.mark.slow
def test_elasticities_match_finite_differences():
    el = W.elasticities(FITTED.params, L7, H100, 2, BATCH, "sm")
    theta = W.theta_of(H100)
    h = 0.01
    for f in RATES + ("sm_count",):
        up = totals(FITTED.params, {**theta, f: theta[f] * np.exp(h)})
        dn = totals(FITTED.params, {**theta, f: theta[f] * np.exp(-h)})
        fd = (np.log(up) - np.log(dn)) / (2 * h)
        np.testing.assert_allclose(np.asarray(el[f]), fd, atol=3e-3, err_msg=f)
    assert np.any(np.abs(np.asarray(el["sm_count"])) > 1e-3)     # SM count moves the surfaces


@pytest.mark.slow
def test_physics_of_neutral_roofline():
    neutral = neutralised(FITTED.params)
    el = {f: np.asarray(v) for f, v in W.elasticities(neutral, L7, H100, 2, BATCH, "sm").items()}
    # a one-token decode only reads weights (and a tiny KV cache): bandwidth-bound
    assert el["hbm_bandwidth_tbs"][0] == pytest.approx(-1.0, abs=0.03)
    assert abs(el["bf16_tflops"][0]) < 0.01
    # a 4096-token prefill is compute-bound (attention, elementwise and the all-reduce are not)
    assert el["bf16_tflops"][2] < -0.6 and el["hbm_bandwidth_tbs"][2] > -0.3
    # no latencies or overheads: the time is homogeneous of degree -1 in the rates
    np.testing.assert_allclose(sum(el[f] for f in RATES), -1.0, atol=1e-3)
    assert np.all(el["fp8_tflops"] == 0)                 # a BF16 model runs no FP8 kernel


@pytest.mark.slow
def test_fitted_model_has_a_fixed_share(tmp_path):
    df = W.whatif(STEPS, coeffs=FITTED, model="llama-2-7b-hf", gpu="h100_sxm", tp=2,
                  changes=CHANGES)
    ph = W.by_phase(df)
    assert set(ph.phase) == {"decode", "prefill", "mixed"}
    assert ((ph.fixed_share > 0) & (ph.fixed_share < 1)).all()
    dec = ph.set_index("phase").loc["decode"]
    assert dec.after_us < dec.before_us and -1 < dec.d_hbm_bandwidth_tbs < -0.3
    assert df.d_hbm_capacity_gib.eq(0).all() and df.d_fp8_tflops.eq(0).all()
    text = W.describe(ph)
    assert any(line.startswith("decode (2 steps):") and "bandwidth-bound" in line for line in text)


def test_parse_changes_and_refusals():
    assert W.parse_changes(["hbm_bandwidth_tbs=4.8", "sm_count=100"]) == \
        {"hbm_bandwidth_tbs": 4.8, "sm_count": 100}
    for bad, msg in (("hbm=4", "unknown datasheet field 'hbm'"), ("bf16_tflops", "FIELD=VALUE"),
                     ("bf16_tflops=fast", "needs a number"), ("sm_count=1.5", "integer")):
        with pytest.raises(RoofcalError, match=msg):
            W.parse_changes([bad])
    with pytest.raises(RoofcalError, match="sparsity figure"):
        H100.replace(**W.parse_changes(["fp8_tflops=4000"]))


@pytest.mark.slow
def test_cli(tmp_path, capsys):
    steps = tmp_path / "s.jsonl"
    steps.write_text("".join(json.dumps(s.to_json()) + "\n" for s in STEPS))
    out = tmp_path / "w.csv"
    args = ["whatif", "--coeffs", "coeffs/h100_sxm.yaml", "--model", "llama-2-7b-hf", "--gpu",
            "h100_sxm", "--tp", "2", "--steps", str(steps), "--out", str(out), "--set",
            "hbm_bandwidth_tbs=4.8", "sm_count=100", "bf16_tflops=1200"]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "what-if: hbm_bandwidth_tbs=4.8, sm_count=100, bf16_tflops=1200" in text
    assert "bandwidth-bound" in text and "| phase   | bf16_tflops | hbm_bandwidth_tbs |" in text
    assert "elasticity 0 in every phase: fp16_tflops, fp8_tflops, int8_tops, fp4_tflops, hbm_capacity_gib" in text
    first = out.read_bytes()
    assert main(args) == 0 and out.read_bytes() == first          # deterministic
    capsys.readouterr()
    assert main(args[:-3] + ["fp8_tflops=5000"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "sparsity" in err


def test_impossible_values_are_refused_in_one_line(tmp_path, capsys):
    for bad in ("sm_count=inf", "sm_count=nan", "hbm_bandwidth_tbs=nan", "fp8_tflops=-inf"):
        field = bad.split("=")[0]
        with pytest.raises(RoofcalError, match=f"field '{field}' must be a finite number"):
            W.parse_changes([bad])
    # finite but impossible values are refused by the datasheet's own checks
    for change in ({"fp8_tflops": -5.0}, {"hbm_bandwidth_tbs": 0.0}, {"sm_count": -4}):
        field = next(iter(change))
        with pytest.raises(RoofcalError, match=f"field '{field}' must be"):
            W.whatif(STEPS[:1], coeffs=FITTED, model="llama-2-7b-hf", gpu="h100_sxm", tp=2,
                     changes=change)
    steps = tmp_path / "s.jsonl"
    steps.write_text(json.dumps(STEPS[0].to_json()) + "\n")
    base = ["whatif", "--model", "llama-2-7b-hf", "--gpu", "h100_sxm", "--tp", "2", "--steps",
            str(steps), "--set"]
    for bad in ("sm_count=inf", "fp8_tflops=-5", "fp8_tflops=nan"):
        assert main(base + [bad]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and bad.split("=")[0] in err, err
    with pytest.raises(RoofcalError, match="unknown bootstrap rule 'magic'"):
        W.whatif(STEPS[:1], coeffs=FITTED, model="llama-2-7b-hf", gpu="h100_sxm", tp=2,
                 rule="magic")


@pytest.mark.slow
def test_fixed_share_is_latencies_and_overheads_whatever_the_rule():
    df = {rule: W.whatif(STEPS, coeffs=FITTED, model="llama-2-7b-hf", gpu="h100_sxm", tp=2,
                         rule=rule) for rule in ("sm", "duration", None)}
    share = df["sm"]["fixed_share"].to_numpy()
    assert ((share > 0) & (share < 1)).all()
    for rule, d in df.items():       # the same share, up to float32 rounding of the sums
        np.testing.assert_allclose(d["fixed_share"], share, rtol=1e-5, err_msg=str(rule))
    # where the surfaces ignore a common scaling of the rates, Σ rate elasticities = −(1 − share);
    # rule 'duration' moves the surfaces with every rate, so there the sum is not the share
    rate_sum = lambda d: sum(d[f"d_{f}"] for f in W.FIELDS if f != "sm_count").to_numpy()
    for rule in ("sm", None):
        np.testing.assert_allclose(1 + rate_sum(df[rule]), share, atol=2e-3, err_msg=str(rule))
    assert np.max(np.abs(1 + rate_sum(df["duration"]) - share)) > 0.01
    # the per-phase share is the time-weighted mean of the steps'
    ph = W.by_phase(df["sm"]).set_index("phase")
    g = df["sm"][df["sm"].phase == "decode"]
    assert ph.loc["decode", "fixed_share"] == pytest.approx(
        float(np.sum(g.before_us * g.fixed_share) / g.before_us.sum()))
    # the neutral roofline has no latencies or overheads
    neutral = W.whatif_batch(neutralised(FITTED.params), L7, H100, 2, BATCH, {})
    assert np.all(neutral["fixed_share"].to_numpy() < 1e-3)


@pytest.mark.slow
def test_before_comes_from_the_same_pass_as_the_elasticities():
    out, el = W.sensitivity(FITTED.params, L7, H100, 2, BATCH, "sm")
    np.testing.assert_allclose(np.asarray(out["total"]), totals(FITTED.params, W.theta_of(H100)),
                               rtol=1e-6)
    df = W.whatif_batch(FITTED.params, L7, H100, 2, BATCH, {})
    np.testing.assert_array_equal(df["before_us"].to_numpy(), np.asarray(out["total"], np.float64))
    np.testing.assert_allclose(df["after_us"], df["before_us"], rtol=1e-6)   # no change
    for f in RATES:
        np.testing.assert_array_equal(df[f"d_{f}"], np.asarray(el[f], np.float64))

"""Zero-shot bootstrap to a new GPU: exact surface shifts, planted datasheet changes, the bundled
A100 <- H100 transfer, files, refusals and the ``gpu`` commands."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from roofcal.io import yaml_load, yaml_text
from roofcal.model import coeffs as coeff_io
from roofcal.model import correction as K
from roofcal.transfer.bootstrap import DEFAULT_RULE, RULES, bootstrap, shift_polynomial
from roofcal.cli.main import main
from roofcal.errors import RoofcalError
from roofcal.physics.hardware import load_gpu
from roofcal.model.predict import predict_table
from roofcal.measurements.ops import read_ops

H100, A100 = load_gpu("h100_sxm"), load_gpu("a100_sxm")
REF = coeff_io.load("coeffs/h100_sxm.yaml", H100)


def gemm_rows(shapes, gpu="h100_sxm"):
    import pandas as pd
    df = pd.DataFrame(shapes, columns=["m", "n", "k"]).astype(float)
    df["gpu"], df["op"], df["dtype"], df["latency_us"], df["source"] = gpu, "gemm", "bf16", 1.0, "t"
    df["skew"] = 0.0
    return df


def test_shift_polynomial_is_exact():
    rng = np.random.default_rng(0)
    for n_desc, deg in ((3, 4), (5, 2), (8, 3)):
        w = rng.normal(size=len(K.exponents(n_desc, deg)))
        d = rng.normal(scale=0.4, size=n_desc)
        u = rng.normal(size=(20, n_desc))
        f = lambda x: np.asarray(K.features(jnp.asarray(x, jnp.float32), -1e9, 1e9, deg), np.float64)
        np.testing.assert_allclose(f(u) @ shift_polynomial(w, d), f(u + d) @ w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("rule", RULES)
def test_same_datasheet_is_identity(rule):
    c = bootstrap(REF, H100, H100, rule)
    df = gemm_rows([(1, 4096, 4096), (64, 8192, 1024), (4096, 4096, 4096)])
    a = predict_table(df, REF.params, H100)["predicted_us"].to_numpy()
    b = predict_table(df, c.params, H100)["predicted_us"].to_numpy()
    np.testing.assert_allclose(a, b, rtol=1e-5)


@pytest.mark.parametrize("rule", ["shape", "sm"])
def test_planted_double_bandwidth(rule):
    # the fitted GEMM surfaces with a near-hard roofline (q = 32) on a GPU identical to H100 but
    # with 2x HBM bandwidth: memory-bound calls halve (beyond the latency), compute-bound ones stay
    p = {**REF.params["ops"]["gemm/bf16"], "sharpness": jnp.asarray(K.softplus_inv(31.0))}
    ref = coeff_io.Coefficients(**{**REF.__dict__, "params": {**REF.params, "ops": {"gemm/bf16": p}}})
    fast = H100.replace(hbm_bandwidth_tbs=2 * H100.hbm_bandwidth_tbs)
    c = bootstrap(ref, H100, fast, rule)
    df = gemm_rows([(1, 16384, 16384), (2, 8192, 28672), (8192, 8192, 8192), (4096, 16384, 8192)])
    lat = math.exp(float(p["latency"]))
    before = predict_table(df, ref.params, H100)["predicted_us"].to_numpy() - lat
    after = predict_table(df.assign(gpu=fast.name), c.params, fast)["predicted_us"].to_numpy() - lat
    np.testing.assert_allclose(after[:2] / before[:2], 0.5, rtol=1e-3)
    np.testing.assert_allclose(after[2:] / before[2:], 1.0, rtol=1e-3)


def test_sm_rule_reads_the_reference_at_equal_waves():
    many = H100.replace(sm_count=2 * H100.sm_count)
    c = bootstrap(REF, H100, many, "sm")
    p_new, p_ref = c.params["ops"]["gemm/bf16"], REF.params["ops"]["gemm/bf16"]
    m, n, k = np.array([256.0, 512.0]), np.array([4096.0, 2048.0]), np.array([4096.0, 8192.0])
    r = 0.5 ** 0.5                       # SM_ref / SM_new = 1/2, split over m and n
    e_new = K.efficiencies(p_new, "gemm", (m, n, k, 0.0 * m))
    e_ref = K.efficiencies(p_ref, "gemm", (r * (1 + m) - 1, r * (1 + n) - 1, k, 0.0 * m))
    for a, b in zip(e_new, e_ref):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4)


@pytest.mark.slow
def test_a100_from_h100_beats_the_roofline():
    df = read_ops("data/microbench/a100_sxm/vllm-0.14.0")
    rng = np.random.default_rng(0)
    idx = [rng.choice(i, min(len(i), 300), replace=False)
           for i in df.groupby(["op", "dtype"]).indices.values()]
    df = df.iloc[np.sort(np.concatenate(idx))].reset_index(drop=True)
    boot = coeff_io.roundtrip(bootstrap(REF, H100, A100))
    err = lambda params: (predict_table(df, params, A100).assign(
        e=lambda d: (d.predicted_us / d.latency_us - 1).abs() * 100).groupby("op").e.mean())
    b, n = err(boot.params), err(K.neutral_params())
    assert np.isfinite(b).all()
    assert (b < n).all() and b.mean() < 30.0, (b.to_dict(), n.to_dict())


@pytest.mark.slow
def test_file_states_assumptions_and_is_byte_identical(tmp_path):
    outs = [tmp_path / "a.yaml", tmp_path / "b.yaml"]
    for out in outs:
        assert main(["gpu", "bootstrap", "--datasheet", "a100", "--from", "coeffs/h100_sxm.yaml",
                     "--out", str(out)]) == 0
    assert outs[0].read_bytes() == outs[1].read_bytes()
    doc = yaml_load(outs[0].read_text())
    assert doc["calibrated"] is False and doc["gpu"]["name"] == "a100_sxm"
    assert doc["fit"]["bootstrap"]["rule"] == DEFAULT_RULE
    assert any("latencies" in n for n in doc["notes"]) and any("datasheet" in n for n in doc["notes"])
    c = coeff_io.load(outs[0], A100)                   # usable as a --prior for a100_sxm
    assert set(c.params["ops"]) == set(REF.params["ops"])


@pytest.mark.slow
def test_refusals(tmp_path, capsys):
    with pytest.raises(RoofcalError, match=r"fitted for GPU 'h100_sxm', not 'a100_sxm' \(the "
                                           r"reference datasheet\)"):
        bootstrap(REF, A100, H100)
    with pytest.raises(RoofcalError, match="different version of the 'h100_sxm' datasheet"):
        bootstrap(REF, H100.replace(bf16_tflops=1000.0), A100)
    with pytest.raises(RoofcalError, match="unknown bootstrap rule"):
        bootstrap(REF, H100, A100, "magic")
    # a reference fitted for a GPU that is not bundled needs its datasheet
    other = coeff_io.Coefficients(**{**REF.__dict__, "gpu": "my_gpu"})
    coeff_io.save(other, tmp_path / "other.yaml")
    assert main(["gpu", "bootstrap", "--datasheet", "a100", "--from", str(tmp_path / "other.yaml"),
                 "--out", str(tmp_path / "x.yaml")]) == 2
    assert "give its datasheet with --from-datasheet" in capsys.readouterr().err
    assert main(["gpu", "bootstrap", "--datasheet", "a100", "--from", "coeffs/h100_sxm.yaml",
                 "--from-datasheet", "a100", "--out", str(tmp_path / "x.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not 'a100_sxm' (the reference datasheet)" in err
    assert not (tmp_path / "x.yaml").exists()


def _sheet(tmp_path, **over):
    d = yaml_load(open("roofcal/physics/hardware/l40s.yaml").read())
    d.update(over)
    p = tmp_path / "new.yaml"
    p.write_text(yaml_text(d))
    return p


def test_gpu_show_and_list(capsys, tmp_path):
    assert main(["gpu", "show", "h100"]) == 0
    out = capsys.readouterr().out
    assert "hbm_bandwidth_tbs: 3.35 TB/s" in out and "sm_count: 132 SMs" in out
    assert "sources:" in out and "nvidia.com" in out and "balance point" in out
    assert main(["gpu", "list"]) == 0
    out = capsys.readouterr().out
    for name in ("h100_sxm", "a100_sxm", "l40s", "b200"):
        assert name in out
    assert out.count("https://") >= 8
    assert main(["gpu", "show", str(_sheet(tmp_path, name="my_gpu"))]) == 0
    assert "my_gpu" in capsys.readouterr().out


@pytest.mark.parametrize("over, message", [
    ({"dense_tflops": {"bf16": 362.05, "fp8": 1466.0}}, "sparsity figure"),
    ({"sparse_tflops": {"bf16": 733}}, "sparsity figure"),
    ({"hbm_bandwidth_tbs": None}, "field 'hbm_bandwidth_tbs' is blank"),
])
def test_bad_datasheets_refused(tmp_path, capsys, over, message):
    path = _sheet(tmp_path, **over)
    assert main(["gpu", "show", str(path)]) == 2
    assert main(["gpu", "bootstrap", "--datasheet", str(path), "--from", "coeffs/h100_sxm.yaml",
                 "--out", str(tmp_path / "o.yaml")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and all(message in e and "new.yaml" in e for e in err)
    assert not (tmp_path / "o.yaml").exists()


@pytest.mark.slow
def test_few_shot_refit_moves_only_as_far_as_the_data_supports():
    # the eager all-reduce's launch cost is a host property (about 20 µs on the H100 host, 43 on the
    # A100 one): 30 measured rows fix it; a very strong prior keeps the transferred value
    from roofcal.bench.transfer import heldout_split, per_op_mape, refit, sample_rows
    df = read_ops("data/microbench/a100_sxm/vllm-0.14.0/custom_allreduce_perf.parquet")
    test = heldout_split(df, 0)
    prior = coeff_io.roundtrip(bootstrap(REF, H100, A100))
    held, step = df[test], {"step": K.neutral_step_params()}
    mape = lambda ops: per_op_mape(held, {"ops": ops, **step}, A100)
    # (the surfaces: a refit also draws the measured shapes' curves from its rows, roofcal.model.curves)
    from roofcal.model.curves import surfaces
    zero = mape(prior.params["ops"])
    stiff = mape(surfaces(refit(df, sample_rows(df, ~test, 30, 1), prior, A100, 1e5, iters=100, size=32)))
    zero_surface = mape(surfaces(prior.params["ops"]))
    for key in ("allreduce/custom", "allreduce/custom_eager"):
        assert abs(stiff[key] - zero_surface[key]) < 1.0, key
    # which 30 rows are drawn matters (one draw of three leaves the eager error at half): the median
    few = np.median([mape(refit(df, sample_rows(df, ~test, 30, s), prior, A100, 1.0, iters=100, size=32))
                     ["allreduce/custom_eager"] for s in (1, 2, 3)])
    assert few < 0.5 * zero["allreduce/custom_eager"], (few, zero)


def test_rates_are_the_models_for_every_gpu_kind_and_variant():
    from roofcal.transfer.bootstrap import op_rates
    from roofcal.physics.hardware import bundled_gpus
    from roofcal.model.combine import op_peak_and_bandwidth
    from roofcal.physics.kernels import DTYPES
    for gpu in bundled_gpus():
        for kind, variants in DTYPES.items():
            for variant in variants + ("int8", "fp16"):
                peak, bw = op_peak_and_bandwidth(gpu, kind, variant)
                assert op_rates(gpu, kind, variant) == (peak, bw, gpu.sm_count), (gpu.name, kind,
                                                                                   variant)


@pytest.mark.slow
@pytest.mark.parametrize("rule", ["sm", "duration"])
def test_range_shifted_below_shape_zero_reads_the_reference_at_its_upper_bound(rule):
    # a GEMM surface fitted on a narrow range of m and n near shape 0, carried to a GPU with 1/16
    # of the SMs and bandwidth: the whole shifted range lies below shape 0, so every shape reads
    # the reference at its upper bound; the file, the what-if and the definition agree
    from roofcal.transfer import whatif as W
    from roofcal.transfer.bootstrap import op_rates
    from roofcal.physics.components import ideal_times
    from roofcal.physics.kernels import row_work
    k = K.OP_KINDS["gemm"]
    floor = -np.asarray(k.center, np.float32) / np.asarray(k.scale, np.float32)
    p = dict(REF.params["ops"]["gemm/bf16"])
    p["lo"] = jnp.asarray(np.asarray(p["lo"]), jnp.float32).at[:2].set(floor[:2] + 0.05)
    p["hi"] = jnp.asarray(np.asarray(p["hi"]), jnp.float32).at[:2].set(floor[:2] + 0.1)
    ref = coeff_io.Coefficients(**{**REF.__dict__, "params": {**REF.params, "ops": {"gemm/bf16": p}}})
    small = H100.replace(sm_count=H100.sm_count // 16,
                         hbm_bandwidth_tbs=H100.hbm_bandwidth_tbs / 16)
    boot = coeff_io.roundtrip(bootstrap(ref, H100, small, rule)).params["ops"]["gemm/bf16"]
    assert np.all(np.asarray(boot["lo"]) <= np.asarray(boot["hi"]))
    m, n, kk = np.array([1.0, 64.0, 4096.0]), np.array([4096.0, 1024.0, 8192.0]), np.full(3, 4096.0)
    work = row_work("gemm", "bf16", {"m": m, "n": n, "k": kk})
    new = op_rates(small, "gemm", "bf16")
    tc, tm = ideal_times(work, new[0], new[1])
    from_file = np.asarray(K.op_time(boot, "gemm", work.shape, tc, tm))
    whatif = np.asarray(W.op_time(p, "gemm", work, new, op_rates(H100, "gemm", "bf16"), rule))
    np.testing.assert_allclose(from_file, whatif, rtol=1e-4)
    if rule == "sm":                   # eff_new(x) = eff_ref(x·2^Δ), Δ = log2(SM_ref/SM_new)/2
        r = (H100.sm_count / small.sm_count) ** 0.5
        e_ref = K.efficiencies(p, "gemm", (r * (1 + m) - 1, r * (1 + n) - 1, kk, 0.0))
        for a, b in zip(K.efficiencies(boot, "gemm", (m, n, kk, 0.0)), e_ref):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4)


@pytest.mark.slow
def test_bootstrap_file_returns_what_it_wrote(tmp_path):
    from roofcal.transfer.bootstrap import bootstrap_file
    out = tmp_path / "a100.yaml"
    c = bootstrap_file("coeffs/h100_sxm.yaml", "a100", out)
    back = coeff_io.load(out, A100)
    assert c.source == str(out) and c.gpu == back.gpu and c.notes == back.notes
    assert coeff_io.to_yaml(c) == out.read_text(encoding="utf-8")
    import jax
    for key in back.params["ops"]:                      # every leaf, measured shapes' curves too
        a, b = c.params["ops"][key], back.params["ops"][key]
        assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b), key
        for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))

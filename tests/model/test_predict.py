"""Prediction: API and CLI behaviour, monotonicity and TP-scaling properties, bad input."""

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from roofcal.physics.config import load_model
from roofcal.model.correction import neutral_params
from roofcal.physics.hardware import load_gpu
from roofcal.model.combine import step_breakdown
from roofcal.model.predict import FRONT, predict
from roofcal.physics.steps import Step, batch_steps

H100 = load_gpu("h100_sxm")
L70 = load_model("llama-2-70b-hf")


def total(step, tp=4, model=L70, params=None):
    # fixed padding: one compiled program serves every hypothesis example
    batch = batch_steps([step], pad_prefill=8, pad_decode=16)
    out = step_breakdown(params or neutral_params(), model, H100, tp, batch)
    return float(out["total"][0])


def test_breakdown_sums_to_prediction():
    df = predict([Step(prefill=((512, 0),), decode=(100, 200))], model="llama-2-70b-hf",
                 gpu="h100_sxm", tp=4)
    # components: every µs column but the leading ones (measured, predicted, interval, GPU side)
    comp = [c for c in df.columns if c.endswith("_us") and c not in FRONT]
    assert "predicted_gpu_us" in df.columns and "predicted_gpu_us" not in comp
    assert df[comp].sum(axis=1)[0] == pytest.approx(df.predicted_us[0], rel=1e-5)
    assert df.flops[0] > 0 and df.bytes[0] > 0 and df.phase[0] == "mixed"


def test_neutral_decode_is_weight_bandwidth_bound():
    # one decode token: time ≈ weight bytes / HBM bandwidth (34.36 GB / 3.35 TB/s ≈ 10.26 ms)
    t = total(Step(decode=(10,)))
    assert t == pytest.approx(34_356_592_640 / 3.35e6, rel=0.02)


chunks = st.lists(st.tuples(st.integers(1, 4096), st.integers(0, 8192)), max_size=4)
ctxs = st.lists(st.integers(0, 32768), max_size=8)


@settings(max_examples=40, deadline=None)
@given(chunks, ctxs, st.integers(1, 2048), st.integers(1, 4096))
def test_more_tokens_or_context_never_faster(pf, dc, extra_tokens, extra_ctx):
    base = Step(prefill=tuple(pf), decode=tuple(dc))
    t0 = total(base)
    more_ctx = Step(prefill=tuple(pf), decode=tuple(c + extra_ctx for c in dc))
    more_new = Step(prefill=tuple(pf) + ((extra_tokens, 0),), decode=tuple(dc))
    more_dec = Step(prefill=tuple(pf), decode=tuple(dc) + (extra_ctx,))
    for s in (more_ctx, more_new, more_dec):
        assert total(s) >= t0 * (1 - 1e-6)


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 64), st.integers(1, 8192))
def test_tp_splits_gemm_and_attention_work(batch, ctx):
    # FLOPs of the TP-split kernels halve from TP 4 to TP 8; all-reduce volume grows by (7/8)/(3/4)
    step = batch_steps([Step(decode=(ctx,) * batch)], pad_decode=64)
    o4 = step_breakdown(neutral_params(), L70, H100, 4, step)
    o8 = step_breakdown(neutral_params(), L70, H100, 8, step)
    from roofcal.physics.decompose import step_ops
    from roofcal.physics.steps import step_totals
    t = step_totals(step)
    ops4, ops8 = step_ops(L70, 4, t), step_ops(L70, 8, t)
    for name in ("qkv_proj", "o_proj", "mlp_up", "mlp_down", "attn_decode"):
        assert float(ops8[name].work.flops[0]) == pytest.approx(float(ops4[name].work.flops[0]) / 2)
    assert float(ops8["allreduce"].work.bytes[0]) == pytest.approx(
        float(ops4["allreduce"].work.bytes[0]) * (7 / 8) / (3 / 4))
    assert float(o8["mlp_up"][0]) < float(o4["mlp_up"][0])


def run_cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "roofcal.cli", *args], capture_output=True,
                          text=True, cwd=cwd)


def write(tmp_path, lines):
    p = tmp_path / "steps.jsonl"
    p.write_text("\n".join(lines) + "\n")
    return p


def test_cli_writes_csv(tmp_path):
    p = write(tmp_path, ['{"prefill": [[128, 0]], "decode": [64, 64]}', '{"decode": [1000]}'])
    out = tmp_path / "pred.csv"
    r = run_cli("predict", "--model", "llama-2-7b-hf", "--gpu", "h100_sxm", "--tp", "1",
                "--steps", str(p), "--out", str(out))
    assert r.returncode == 0, r.stderr
    import pandas as pd
    df = pd.read_csv(out)
    assert list(df.step) == [1, 2] and (df.predicted_us > 0).all()


@pytest.mark.parametrize("lines, args, message", [
    (['{"decode": [1]}', '{"decode": [1,}'], [], "line 2"),
    (['{"decode": [-3]}'], [], "decode\\[0\\]"),
    (['{"decode": [1], "foo": 1}'], [], "unknown field 'foo'"),
    (['{"decode": [1]}'], ["--tp", "3"], "TP 3 does not divide"),
    (['{"decode": [1]}'], ["--gpu", "h900"], "unknown GPU 'h900'"),
    (['{"decode": [1], "duration_us": 0}'], [], "duration_us"),
])
@pytest.mark.slow
def test_cli_bad_input_one_line_no_output(tmp_path, lines, args, message):
    p = write(tmp_path, lines)
    out = tmp_path / "pred.csv"
    base = {"--model": "llama-2-70b-hf", "--gpu": "h100_sxm", "--tp": "4"}
    for k, v in zip(args[::2], args[1::2]):
        base[k] = v
    argv = ["predict", "--steps", str(p), "--out", str(out)] + [x for kv in base.items() for x in kv]
    r = run_cli(*argv)
    assert r.returncode == 2
    import re
    assert re.search(message, r.stderr), r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert not out.exists() and not list(tmp_path.glob(".pred.csv*"))


def test_cli_missing_steps_file(tmp_path):
    r = run_cli("predict", "--steps", str(tmp_path / "nope.jsonl"), "--model", "llama-2-7b-hf",
                "--gpu", "h100_sxm", "--tp", "1", "--out", str(tmp_path / "o.csv"))
    assert r.returncode == 2 and "no such steps file" in r.stderr


def test_per_row_deployment_overrides_cli(tmp_path):
    df = predict([Step(decode=(10,)), Step(decode=(10,), model="llama-2-7b-hf", tp=1)],
                 model="llama-2-70b-hf", gpu="h100_sxm", tp=4)
    assert list(df.model) == ["llama-2-70b-hf", "llama-2-7b-hf"]
    assert df.predicted_us[1] < df.predicted_us[0]


CALIBRATED = None


def calibrated():
    global CALIBRATED
    if CALIBRATED is None:
        from roofcal.model import coeffs as coeff_io
        CALIBRATED = coeff_io.load("coeffs/h100_sxm.yaml", "h100_sxm").params
    return CALIBRATED


@settings(max_examples=30, deadline=None)
@given(chunks, ctxs, st.integers(1, 2048), st.integers(1, 4096))
def test_calibrated_model_is_monotone_within_one_percent(pf, dc, extra_tokens, extra_ctx):
    # fitted efficiency surfaces are not monotone by construction (nor are the measured kernels:
    # H100 bf16 GEMM 4096x4096x768 takes 54.7 us, x1024 takes 50.2 us), so a 1 % tolerance
    base = Step(prefill=tuple(pf), decode=tuple(dc))
    t0 = total(base, params=calibrated())
    for s in (Step(prefill=tuple(pf), decode=tuple(c + extra_ctx for c in dc)),
              Step(prefill=tuple(pf) + ((extra_tokens, 0),), decode=tuple(dc)),
              Step(prefill=tuple(pf), decode=tuple(dc) + (extra_ctx,))):
        assert total(s, params=calibrated()) >= t0 * 0.99


def test_surface_column_is_the_prediction_without_the_curves():
    """``predict_table(surface=True)``: a kernel with measured shapes' curves priced by its
    surface alone (what the fit's 'surface alone' bands take); the prediction itself is that
    times the curve's factor."""
    import numpy as np
    import pandas as pd
    from roofcal.model import coeffs as C, curves
    from roofcal.model.correction import neutral_step_params
    from roofcal.model.predict import predict_table
    from roofcal.resources import COEFFS
    c = C.load(COEFFS / "a100_sxm.yaml")
    ops = c.kernel_sets[c.kernels].ops
    rows = pd.DataFrame([
        {"gpu": "a100_sxm", "op": "gemm", "dtype": "bf16", "m": 512, "n": 4096, "k": 4096, "latency_us": 1.0},
        {"gpu": "a100_sxm", "op": "gemm", "dtype": "bf16", "m": 512, "n": 4096, "k": 12345, "latency_us": 1.0}])
    got = predict_table(rows, {"ops": ops, "step": neutral_step_params()}, load_gpu("a100_sxm"), surface=True)
    alone = predict_table(rows, {"ops": curves.surfaces(ops), "step": neutral_step_params()}, load_gpu("a100_sxm"))
    assert np.array_equal(got["surface_us"].to_numpy(), alone["predicted_us"].to_numpy())
    factor, found = curves.row_factors(ops["gemm/bf16"]["curves"], "gemm", rows)
    assert found.tolist() == [True, False] and factor[0] != 1.0      # n = 4096, k = 12,345: no curve
    assert np.allclose(got["predicted_us"].to_numpy(), got["surface_us"].to_numpy() * factor, rtol=1e-6)
    assert "surface_us" not in predict_table(rows, {"ops": ops, "step": neutral_step_params()}, load_gpu("a100_sxm"))


def test_ideal_times_once_per_table_match_row_times():
    """``ideal_times``: every row's ideal times, computed once for a table (the fit shares them
    between its features, curves and metrics). Hand-checked A100 GEMM 512 × 4096 × 4096 bf16:
    2·512·4096·4096 FLOP / 312 TFLOP/s = 55.06 µs; (512·4096 + 4096² + 512·4096)·2 B / 2.039 TB/s
    = 20.57 µs; z_m = (log2(513) − 7) / 4 = 0.5007. Rows of several kinds, in any order, give
    what ``row_times`` gives each kind's rows, and ``take`` keeps rows in the order asked."""
    import numpy as np
    import pandas as pd
    from roofcal.model.predict import ideal_times, row_times
    rows = pd.DataFrame([
        {"gpu": "a100_sxm", "op": "gemm", "dtype": "bf16", "m": 512, "n": 4096, "k": 4096},
        {"gpu": "a100_sxm", "op": "attn_decode", "dtype": "bf16", "batch": 8, "context": 1024,
         "heads": 32, "kv_heads": 8, "head_dim": 128},
        {"gpu": "a100_sxm", "op": "gemm", "dtype": "bf16", "m": 1, "n": 4096, "k": 4096}])
    gpu = load_gpu("a100_sxm")
    it = ideal_times(gpu, rows)
    assert it.tc[0] == pytest.approx(55.06, abs=0.01) and it.tm[0] == pytest.approx(20.57, abs=0.01)
    assert it.z[0, 0] == pytest.approx(0.5007, abs=1e-4)
    for op, idx in (("gemm", np.array([0, 2])), ("attn_decode", np.array([1]))):
        want = row_times(gpu, op, "bf16", rows, idx)
        for got, w in zip(it.rows(op, idx), want):
            assert got.shape == w.shape and np.array_equal(got, w)
    sub = it.take(np.array([2, 0]))
    assert np.array_equal(sub.tc, it.tc[[2, 0]]) and sub.z.shape == (2, it.z.shape[1])
    from roofcal.errors import RoofcalError
    with pytest.raises(RoofcalError, match="rows are for GPU 'a100_sxm'"):
        ideal_times(load_gpu("h100_sxm"), rows.assign(source="t.csv"))


@pytest.mark.slow
def test_step_files_of_one_deployment_share_a_program_and_keep_their_values():
    """`predict` computes a batch padded (``step_arrays``): step files of 2 and 7 steps, with 1 and
    6 decode slots, compile one program between them, and give the values of the batch as given
    up to float32 rounding of sums over slots."""
    from roofcal.model import coeffs as C
    from roofcal.model.predict import step_arrays, step_outputs
    c = C.resolve_stack(C.load("coeffs/h100_sxm.yaml"), None, required=True)
    short = [Step(prefill=((2048, 0),)), Step(decode=(512,))]
    long = short * 3 + [Step(prefill=((512, 1536),), decode=(100, 2000, 3000, 10, 20, 30))]
    before = step_outputs.programs()
    a = step_arrays(c, L70, H100, 4, batch_steps(short))[0]["total"]
    b = step_arrays(c, L70, H100, 4, batch_steps(long))[0]["total"]
    assert step_outputs.programs() - before <= 1
    assert a.shape == (2,) and b.shape == (7,)
    as_given = np.asarray(step_outputs(c.params, L70, H100, 4, batch_steps(long))[0]["total"])
    np.testing.assert_allclose(b, as_given, rtol=1e-6)
    np.testing.assert_allclose(b[:2], a, rtol=1e-6)
    assert 1_000 < a[1] < 100_000          # one decode token of a 70B at TP 4: ms


@pytest.mark.slow
def test_kernel_groups_run_in_blocks_of_one_program_and_keep_their_values(monkeypatch):
    """``predict_table`` computes a kernel group in blocks of ``op_rows`` rows: one block of 256
    up to 256 rows, else blocks of 4,096 (the last padded). Groups of 300, 900 and 9,000 rows
    share the 4,096-row program, and a row's value is the same in each: it does not depend on the
    table around it. (Computed alone, unpadded, it may differ in its last bit: XLA's code for
    another row count sums in another order.)"""
    import pandas as pd
    from roofcal.model import coeffs as C
    from roofcal.model import correction as K
    from roofcal.model import curves
    from roofcal.model.predict import ideal_times, predict_table
    from roofcal.physics.kernels import op_rows
    assert [op_rows(n) for n in (1, 256, 257, 1024, 5000, 16_385, 65_537)] == \
        [256, 256, 4_096, 4_096, 4_096, 4_096, 4_096]
    c = C.load("coeffs/a100_sxm.yaml")
    ops = c.kernel_sets[c.kernels].ops
    params = {"ops": ops, "step": K.neutral_step_params()}
    gpu = load_gpu("a100_sxm")
    rng = np.random.default_rng(0)
    big = pd.DataFrame({"gpu": "a100_sxm", "op": "gemm", "dtype": "bf16",
                        "m": rng.integers(1, 8192, 9_000), "n": 4096, "k": 4096})
    a, b = big.iloc[-300:].reset_index(drop=True), big.iloc[:900]
    rows_seen, jitted = [], K.op_time_z
    monkeypatch.setattr(K, "op_time_z", lambda p, z, tc, tm, res: rows_seen.append(len(tc)) or jitted(p, z, tc, tm, res))
    pa, pb, pbig = (predict_table(t, params, gpu, surface=True)["surface_us"].to_numpy() for t in (a, b, big))
    assert rows_seen == [4_096] * 5                                  # 1 + 1 + 3 blocks, one program
    monkeypatch.undo()
    it = ideal_times(gpu, b)
    z_tc_tm = it.rows("gemm", np.arange(len(b)))
    alone = np.asarray(K.op_time_z(curves.surface_only(ops["gemm/bf16"]), *z_tc_tm[2:], *z_tc_tm[:2], it.res))
    assert pb.shape == (900,)
    np.testing.assert_allclose(pb, alone, rtol=1e-6)
    assert np.array_equal(pbig[:900], pb) and np.array_equal(pbig[-300:], pa) and np.all(pa > 0)


def test_surfaces_already_computed_are_taken_and_a_group_missing_one_is_computed(monkeypatch):
    """``predict_table(surfaces=…)``: a group whose rows all have their surface time takes it (no
    program runs) and gives the same table as computing it; a group with one NaN is computed."""
    import pandas as pd
    from roofcal.model import coeffs as C
    from roofcal.model import correction as K
    from roofcal.model.predict import predict_table
    c = C.load("coeffs/a100_sxm.yaml")
    params = {"ops": c.kernel_sets[c.kernels].ops, "step": K.neutral_step_params()}
    gpu = load_gpu("a100_sxm")
    df = pd.DataFrame({"gpu": "a100_sxm", "op": ["gemm"] * 3 + ["allreduce"] * 2,
                       "dtype": ["bf16"] * 3 + ["custom"] * 2, "m": [16, 256, 4096, np.nan, np.nan],
                       "n": [4096] * 3 + [np.nan] * 2, "k": [4096] * 3 + [np.nan] * 2,
                       "bytes": [np.nan] * 3 + [1e6, 1e8], "num_gpus": [np.nan] * 3 + [8, 8],
                       "latency_us": [20.0, 60.0, 500.0, 15.0, 400.0]})
    fresh = predict_table(df, params, gpu, surface=True)
    runs, jitted = [], K.op_time_z
    monkeypatch.setattr(K, "op_time_z", lambda p, z, tc, tm, res: runs.append(1) or jitted(p, z, tc, tm, res))
    known = fresh["surface_us"].to_numpy().copy()
    pd.testing.assert_frame_equal(predict_table(df, params, gpu, surface=True, surfaces=known), fresh)
    assert runs == []
    known[4] = np.nan                                       # the all-reduce group: computed again
    pd.testing.assert_frame_equal(predict_table(df, params, gpu, surface=True, surfaces=known), fresh)
    assert runs == [1]


def test_predict_ops_takes_each_rows_own_kernel_set():
    from roofcal.model.predict import predict_ops
    table = "data/microbench/h100_sxm/vllm-0.24.0/custom_allreduce_perf.parquet"
    own = predict_ops(table, coeffs="coeffs/h100_sxm.yaml")
    v024 = predict_ops(table, coeffs="coeffs/h100_sxm.yaml", kernels="vllm-0.24.0")
    v014 = predict_ops(table, coeffs="coeffs/h100_sxm.yaml", kernels="vllm-0.14.0")
    assert (own["predicted_us"].to_numpy() == v024["predicted_us"].to_numpy()).all()
    assert not (own["predicted_us"].to_numpy() == v014["predicted_us"].to_numpy()).all()

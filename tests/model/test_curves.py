"""Measured-shape curves: hand-checked interpolation, the file block, and the shipped file on the
measured vLLM 0.14 MoE table (Mixtral's expert shape at TP 2)."""

import math

import numpy as np
import pandas as pd
import pytest

from roofcal.errors import RoofcalError
from roofcal.io import yaml_load, yaml_text
from roofcal.measurements import datasets
from roofcal.model import coeffs as CI
from roofcal.model import correction as K
from roofcal.model import curves
from roofcal.model.predict import predict, predict_table
from roofcal.physics.hardware import load_gpu
from roofcal.physics.steps import Step

MIXTRAL = (4096.0, 14336.0, 2.0, 8.0, 2.0, 1.0, 0.0)      # hidden, inter, topk, experts, tp, ep, skew


def test_fit_curves_is_the_mean_log_ratio_per_shape_and_axis_value():
    rows = pd.DataFrame({"tokens": [4, 1, 4, 1, 2], "hidden": [4096, 4096, 4096, 2048, 2048],
                         "inter": 14336, "topk": 2, "experts": 8, "tp": 2, "ep": 1})
    measured = np.array([110.0, 50.0, 121.0, 30.0, 40.0])
    surface = np.array([100.0, 50.0, 100.0, 20.0, 40.0])
    c = curves.fit_curves("moe", rows, measured, surface)
    assert list(c) == [(2048.0, 14336.0, 2.0, 8.0, 2.0, 1.0, 0.0), MIXTRAL]      # skew absent: 0
    at, rs = c[MIXTRAL]
    np.testing.assert_array_equal(at, [1.0, 4.0])
    # two rows at 4 tokens: ln 1.1 and ln 1.21 average to ln 1.1·√1.1 = 1.5·ln 1.1 = 0.142965,
    # kept at the file's 4 decimals (what the file will hold): 0.143
    np.testing.assert_array_equal(rs, [0.0, 0.143])
    assert abs(1.5 * math.log(1.1) - 0.143) < 0.5e-4
    np.testing.assert_array_equal(c[(2048.0, 14336.0, 2.0, 8.0, 2.0, 1.0, 0.0)][1], [0.4055, 0.0])  # ln 1.5
    assert len(curves.fit_curves("elementwise", rows, measured, surface)) == 0     # no axis
    # λ: the two rows at 4 tokens price each other (the others are alone at their shape's ends):
    # |1.1·1.21^−λ − 1| + |1.21·1.1^−λ − 1| is least at λ = 0.5, where the first term is 0
    assert c.shrink == 0.5


def test_shrinkage_is_chosen_by_leave_one_out_on_the_rows_by_hand():
    x = np.array([1.0, 3.0, 7.0])                        # log2(1 + x) = 1, 2, 3: evenly spaced
    one = np.zeros(3, int)
    # the middle row is its neighbours' mean: trusted fully; the end rows have no prediction
    want, got = curves.leave_one_out(x, [0.0, 0.1, 0.2], one)
    np.testing.assert_allclose(want, [0.1])
    np.testing.assert_allclose(got, [0.1])
    assert curves.shrinkage(want, got) == 1.0
    # a middle row off its neighbours' line: they predict 0.1 where it is 0.02 / 0.05 / 0.09 —
    # the error Σ |exp(r − 0.1·λ) − 1| is least at the median λ (slopes alike), 0.5
    r = np.array([0.1, 0.02, 0.1, 0.1, 0.05, 0.1, 0.1, 0.09, 0.1])
    want, got = curves.leave_one_out(np.tile(x, 3), r, np.repeat([0, 1, 2], 3))
    np.testing.assert_allclose(got, [0.1, 0.1, 0.1])
    np.testing.assert_allclose(want, [0.02, 0.05, 0.09])
    assert curves.shrinkage(want, got) == 0.5
    # pure noise: a row's neighbours say nothing about it (the spike's are 0 and 0; the next row's
    # average the spike it does not have): λ = 0
    assert curves.shrinkage(*curves.leave_one_out([1.0, 3.0, 7.0, 15.0], [0.0, 0.2, 0.0, 0.0], np.zeros(4, int))) == 0.0
    # a repeat prices its twin, ends included: two rows at 1 (0.1, 0.3) predict each other
    want, got = curves.leave_one_out([1.0, 1.0, 3.0], [0.1, 0.3, 0.0], np.zeros(3, int))
    np.testing.assert_allclose(want, [0.1, 0.3])
    np.testing.assert_allclose(got, [0.3, 0.1])
    # an artifact: a row alone at its value, 2.2× above the line through its neighbours (in time),
    # is left out of its curve; one 1.6× off, or at an end, or with a repeat, is kept
    r5 = np.log([1.0, 2.2, 1.0, 1.6, 1.0, 1.0, 3.0])
    x5 = [1.0, 3.0, 7.0, 15.0, 31.0, 31.0, 63.0]
    assert curves.artifacts(x5, r5, np.zeros(7, int)).tolist() == [False, True, False, False, False, False, False]
    c5 = curves.fit_curves("gemm", pd.DataFrame({"m": x5, "n": 4096, "k": 4096}), 100.0 * np.exp(r5), np.full(7, 100.0))
    np.testing.assert_array_equal(c5[(4096.0, 4096.0)][0], [1.0, 7.0, 15.0, 31.0, 63.0])
    # fitted from rows: the gemm kernel's shapes are (n, k), its axis m
    rows = pd.DataFrame({"m": [1, 3, 7] * 3, "n": [4096] * 3 + [8192] * 3 + [1024] * 3, "k": 4096})
    c = curves.fit_curves("gemm", rows, 100.0 * np.exp(r), np.full(9, 100.0))
    assert list(c) == [(1024.0, 4096.0), (4096.0, 4096.0), (8192.0, 4096.0)] and c.shrink == 0.5
    # applied: exp(λ·r) — halfway in the log-ratio at a measured point
    assert float(curves.factor(c, "gemm", (3.0, 4096.0, 4096.0, 0.0))) == pytest.approx(math.exp(0.5 * 0.02), rel=1e-6)
    f, found = curves.row_factors(c, "gemm", rows.iloc[[1]])
    assert found.tolist() == [True] and f[0] == pytest.approx(math.exp(0.5 * 0.02), rel=1e-12)


def test_factor_interpolates_in_log2_of_one_plus_the_axis_and_holds_the_ends():
    c = {MIXTRAL: (np.array([1.0, 3.0]), np.array([0.0, math.log(1.2)]))}   # log2(1+x): 1 and 2
    f = lambda x: float(curves.factor(c, "moe", (x,) + MIXTRAL))
    assert f(1.0) == pytest.approx(1.0)
    assert f(2 ** 1.5 - 1) == pytest.approx(math.sqrt(1.2), rel=1e-6)          # halfway: √1.2
    assert f(0.0) == pytest.approx(1.0) and f(1000.0) == pytest.approx(1.2)   # held at the ends
    other = (8.0,) + MIXTRAL[:4] + (4.0,) + MIXTRAL[5:]                         # TP 4: not measured
    assert curves.factor(c, "moe", other) == 1.0
    assert curves.factor(c, "gemm", (8.0, 4096.0, 4096.0, 0.0)) == 1.0          # no gemm curves here
    arrays = (np.array([2.0]), np.array([4096.0])) + MIXTRAL[1:]                # a per-op table's
    assert curves.factor(c, "moe", arrays) == 1.0                               # rows: row_factors
    rows = pd.DataFrame({"tokens": [2 ** 1.5 - 1, 5.0], "hidden": [4096, 2048], "inter": 14336,
                         "topk": 2, "experts": 8, "tp": 2, "ep": 1, "skew": 0.0})
    factors, measured = curves.row_factors(c, "moe", rows)
    np.testing.assert_allclose(factors, [math.sqrt(1.2), 1.0], rtol=1e-9)
    assert measured.tolist() == [True, False]
    assert curves.measured(c, "moe", (2.0,) + MIXTRAL) and not curves.measured(c, "moe", other)


LLAMA = (32.0, 8.0, 128.0)                     # heads, kv_heads, head_dim of a decode-attention shape


def test_attention_curves_blend_the_measured_batch_sizes_continuously():
    # curves at 1 and 3 sequences (log2(1 + x): 1 and 2, one apart; weights 1 − d/1.5)
    c = {LLAMA + (1.0,): (np.array([1.0, 3.0]), np.array([0.0, math.log(1.2)])),
         LLAMA + (3.0,): (np.array([1.0, 3.0]), np.array([math.log(1.1), math.log(1.1)]))}
    f = lambda seqs, ctx: float(curves.factor(c, "attn_decode", (seqs, ctx) + LLAMA))
    # at a measured batch its own curve weighs 1, its neighbour 1/3: ln 1.1 / 4 at one sequence
    assert f(1.0, 1.0) == pytest.approx(1.1 ** 0.25, rel=1e-6)
    # halfway between (log2(1 + x) = 1.5) both weigh 2/3: the mean of the two curves
    half = 2 ** 1.5 - 1
    assert f(half, 1.0) == pytest.approx(math.sqrt(1.1), rel=1e-6)
    assert f(half, 3.0) == pytest.approx(math.sqrt(1.2 * 1.1), rel=1e-6)
    # beyond the measured batches held at the last one's blend
    assert f(100.0, 3.0) == pytest.approx(f(3.0, 3.0), rel=1e-9)
    assert f(3.0, 3.0) == pytest.approx(math.exp((math.log(1.1) + math.log(1.2) / 3) * 0.75), rel=1e-6)
    # continuous in the batch size, as a step's array of sequence counts gives it
    many = np.asarray(curves.factor(c, "attn_decode", (np.array([1.99, 2.0, 2.01]), 3.0) + LLAMA))
    assert np.ptp(many) < 0.002
    assert curves.factor(c, "attn_decode", (2.0, 3.0, 16.0, 8.0, 128.0)) == 1.0    # not measured
    assert curves.measured(c, "attn_decode", (7.0, 3.0) + LLAMA)
    # a per-op table names the sequences 'batch' (and a prefill chunk's length 'seq')
    rows = pd.DataFrame({"batch": [half, 1.0], "context": [3.0, 1.0], "heads": [32, 16],
                         "kv_heads": 8, "head_dim": 128})
    factors, found = curves.row_factors(c, "attn_decode", rows)
    np.testing.assert_allclose(factors, [math.sqrt(1.2 * 1.1), 1.0], rtol=1e-9)
    assert found.tolist() == [True, False]


def test_a_prefill_chunk_over_a_cached_prefix_takes_its_curve_by_its_uncached_share():
    c = {LLAMA + (1.0,): (np.array([1.0, 1000.0]), np.array([math.log(1.5), math.log(1.5)]))}
    f = lambda n, cached: float(curves.factor(c, "attn_prefill", (1.0, n, cached) + LLAMA))
    assert f(38.0, 0.0) == pytest.approx(1.5, rel=1e-6)          # an uncached chunk: the whole curve
    # one new token over 762 cached keys (its equivalent uncached chunk n = 38.55): 762 of its 763
    # pairs are against the prefix, so 1/763 of the log-ratio
    n = 0.5 * (math.sqrt(9.0 + 8.0 * 762) - 1.0)
    assert f(n, 762.0) == pytest.approx(1.5 ** (1 / 763), rel=1e-6)
    rows = pd.DataFrame({"batch": 1.0, "seq": [1.0, 38.0], "cached": [762.0, 0.0], "heads": 32,
                         "kv_heads": 8, "head_dim": 128})                  # a table's columns
    np.testing.assert_allclose(curves.row_factors(c, "attn_prefill", rows)[0], [1.5 ** (1 / 763), 1.5],
                               rtol=1e-9)


def test_attention_curves_shrink_by_leave_one_out_over_the_blend_by_hand():
    # one shape at 1 and 3 sequences, contexts 1, 3, 7 (log2(1 + x) = 1, 2, 3)
    x = np.tile([1.0, 3.0, 7.0], 2)
    r = np.array([0.0, 0.1, 0.2, 0.3, 0.3, 0.3])
    shape, group, seqs = np.repeat([0, 1], 3), np.zeros(6, int), np.repeat([1.0, 3.0], 3)
    want, got = curves.leave_one_out_across(x, r, shape, group, seqs)
    np.testing.assert_allclose(want, r)
    # a middle row: its own neighbours' line (0.1 / 0.3) weighs 1, the other batch's curve 1/3;
    # an end row has no own price, so the other batch's curve alone prices it
    np.testing.assert_allclose(got, [0.3, (0.1 + 0.3 / 3) * 0.75, 0.3, 0.0, (0.3 + 0.1 / 3) * 0.75, 0.2])
    rows = pd.DataFrame({"batch": seqs, "context": x, "heads": 32, "kv_heads": 8, "head_dim": 128})
    c = curves.fit_curves("attn_decode", rows, 100.0 * np.exp(r), np.full(6, 100.0))
    assert list(c) == [LLAMA + (1.0,), LLAMA + (3.0,)]
    assert c.shrink == curves.shrinkage(want, got)


def test_file_block_lines_written_once_per_content():
    """A curve set's lines are written once and reused for the same content (a fit writes each set
    twice: its metrics' round trip, its file), by kind and content: a set read back from its own
    block gives the same block, another λ or value other lines, and a caller changing the block it
    got does not change the next one."""
    c = curves.Curves({MIXTRAL: (np.array([1.0, 2.0]), np.array([0.012345, -0.5]))}, 0.5)
    first = curves.to_dict("moe", c)
    first["curves"][0]["log_ratio"] = "9"
    again = curves.to_dict("moe", c)
    assert again["curves"][0] == {"shape": "4096 14336 2 8 2 1 0", "at": "1 2", "log_ratio": "0.0123 -0.5"}
    back = curves.from_dict("moe", again, "f.yaml: field 'ops.moe/bf16.measured_shapes")
    assert back is not c and curves.to_dict("moe", back) == again
    other = curves.Curves({MIXTRAL: (np.array([1.0, 2.0]), np.array([0.0124, -0.5]))}, 0.5)
    assert curves.to_dict("moe", other)["curves"][0]["log_ratio"] == "0.0124 -0.5"
    assert curves.to_dict("moe", curves.Curves(dict(c), 0.25))["shrink"] == 0.25


def test_file_block_round_trips_and_bad_blocks_are_one_line_errors():
    c = {MIXTRAL: (np.array([1.0, 2.0, 2 ** 30]), np.array([0.012345, -0.5, -0.00001]))}
    d = yaml_load(yaml_text(curves.to_dict("moe", c)))
    assert d["curves"][0] == {"shape": "4096 14336 2 8 2 1 0", "at": "1 2 1073741824",
                              "log_ratio": "0.0123 -0.5 0"}
    back = curves.from_dict("moe", d, "f.yaml: field 'ops.moe/bf16.measured_shapes")
    np.testing.assert_array_equal(back[MIXTRAL][0], [1.0, 2.0, 2 ** 30])
    np.testing.assert_array_equal(back[MIXTRAL][1], [0.0123, -0.5, 0.0])
    assert d["shrink"] == 1.0 and back.shrink == 1.0                 # a plain mapping: λ = 1
    half = curves.from_dict("moe", {**d, "shrink": 0.35}, "f.yaml: field 'ops.moe/bf16.measured_shapes")
    assert half.shrink == 0.35 and curves.to_dict("moe", half)["shrink"] == 0.35
    older = {k: v for k, v in d.items() if k != "shrink"}            # written before λ: fitted as 1
    assert curves.from_dict("moe", older, "f.yaml: field 'ops.moe/bf16.measured_shapes").shrink == 1.0
    where = "f.yaml: field 'ops.moe/bf16.measured_shapes"
    bad = [({**d, "axis": "bytes"}, "must have axis tokens"),
           ({**d, "shrink": 1.5}, "shrink' must be a number in [0, 1]"),
           ({**d, "shrink": True}, "shrink' must be a number in [0, 1]"),
           ({**d, "extra": 1}, "must be a mapping of axis, shape, shrink and curves"),
           ({**d, "curves": [{**d["curves"][0], "at": "1 x 3"}]}, "curves[0].at' must be a line of finite numbers"),
           ({**d, "curves": [{**d["curves"][0], "at": "3 2 1"}]}, "ascending"),
           ({**d, "curves": [{**d["curves"][0], "shape": "4096 14336"}]}, "must give 7 values")]
    for block, msg in bad:
        with pytest.raises(RoofcalError, match="measured_shapes") as e:
            curves.from_dict("moe", block, where)
        assert msg in str(e.value) and "\n" not in str(e.value)
    # many curves are read in one pass; the bad one is still named, and a one-number line (which
    # YAML reads as a number) is a line too
    three = [d["curves"][0], {**d["curves"][0], "shape": "4096 14336 2 8 4 1 0"},
             {**d["curves"][0], "shape": "4096 14336 2 8 8 1 0", "at": 16, "log_ratio": -0.25}]
    many = curves.from_dict("moe", {**d, "curves": three}, where)
    assert len(many) == 3 and many[MIXTRAL[:4] + (8.0, 1.0, 0.0)][0].tolist() == [16.0]
    for i, change, msg in [(1, {"at": "1 inf 3"}, "curves[1].at' must be a line of finite numbers"),
                           (1, {"at": "1 3 2"}, "curves[1]' must give ascending"),
                           (2, {"log_ratio": "0 1"}, "curves[2]' must give ascending 'at' values and one"),
                           (2, {"shape": "4096 14336 2 8 -8 1 0"}, "curves[2].shape' must be a line of "
                                                                  "finite numbers ≥ 0")]:
        block = {**d, "curves": [c if j != i else {**c, **change} for j, c in enumerate(three)]}
        with pytest.raises(RoofcalError) as e:
            curves.from_dict("moe", block, where)
        assert msg in str(e.value), (change, str(e.value))
    with pytest.raises(RoofcalError, match="only for moe, allreduce, gemm, attn_prefill, attn_decode, allgather, reducescatter, alltoall kernels"):
        curves.from_dict("elementwise", d, "f.yaml: field 'ops.elementwise/bf16.measured_shapes")


@pytest.fixture(scope="module")
def mixtral_rows():
    """vLLM 0.14's bf16 MoE rows of Mixtral's expert shape at TP 2, balanced routing."""
    m = datasets.load(datasets.bundled_paths("h100_sxm"), gpu="h100_sxm")
    t = m.ops
    sel = (t.op == "moe") & (t.dtype == "bf16") & (t.kernels == "vllm-0.14.0") & (t.hidden == 4096) \
        & (t.inter == 14336) & (t.tp == 2) & (t.ep == 1) & (t["skew"] == 0)
    return t[sel].reset_index(drop=True)


@pytest.mark.slow
def test_shipped_file_reproduces_a_measured_shape_and_steps_use_it(mixtral_rows):
    gpu = load_gpu("h100_sxm")
    c = CI.with_kernels(CI.load("coeffs/h100_sxm.yaml", gpu), "vllm-0.14.0")
    p = c.params["ops"]["moe/bf16"]
    assert MIXTRAL in p["curves"]
    at, rs = p["curves"][MIXTRAL]
    rows = mixtral_rows[mixtral_rows.tokens.isin(at)]
    assert len(rows) >= 20                       # the table's token grid, less the held-out rows
    pred = predict_table(rows, c.params, gpu)
    surface = predict_table(rows, {**c.params, "ops": {"moe/bf16": curves.surface_only(p)}}, gpu)
    assert np.abs(surface.predicted_us / rows.latency_us - 1).max() > 0.05   # the surface alone is off
    # every measured point of the shape is priced surface · (measured / surface)^λ, to the file's
    # precision (1e-4 in log); λ of the MoE kernels is near 1 (measured shapes trusted)
    lam = p["curves"].shrink
    assert 0.7 <= lam <= 1.0
    want = surface.predicted_us.values * (rows.latency_us.values / surface.predicted_us.values) ** lam
    np.testing.assert_allclose(pred.predicted_us, want, rtol=2e-4)
    # a decode step of Mixtral at TP 2 charges each of its 32 MoE layers the measured kernel at
    # its token count (a measured point of the curve: 96 or more tokens, a loaded server's decode)
    n = int(min(x for x in at if x >= 96))
    measured = float(want[(rows.tokens == n).to_numpy()][0])
    step = predict([Step(decode=(1024,) * n)], model="mistralai/Mixtral-8x7B-v0.1", gpu="h100_sxm",
                   tp=2, coeffs=c, stack="none", kernels="vllm-0.14.0")  # kernels as in isolation
    assert float(step.moe_us.iloc[0]) == pytest.approx(32 * measured, rel=2e-4)


def test_a_shape_without_a_curve_gets_the_surfaces_band():
    # the same kernel at a routing skew no table measured: priced by the surface alone, so its
    # 80 % band is the one of the held-out rows predicted by the surface alone ('surface')
    from roofcal.model import intervals as IV
    gpu = load_gpu("h100_sxm")
    c = CI.with_kernels(CI.load("coeffs/h100_sxm.yaml", gpu), "vllm-0.14.0")
    rows = pd.DataFrame({"gpu": "h100_sxm", "op": "moe", "dtype": "bf16", "tokens": [96.0, 96.0],
                         "hidden": 4096, "inter": 14336, "topk": 2, "experts": 8, "tp": 2, "ep": 1,
                         "skew": [0.0, 0.3], "latency_us": 1.0, "source": "t"})
    pred = predict_table(rows, c.params, gpu, bands=c.op_bands)
    bands = c.op_bands["moe/bf16"]
    reg = IV.regime(pred.ideal_compute_us.values, pred.ideal_memory_us.values)
    assert reg.tolist() == ["memory", "memory"]
    assert pred.p90_us[0] / pred.predicted_us[0] == pytest.approx(bands["memory"].p90, rel=1e-9)
    assert pred.p90_us[1] / pred.predicted_us[1] == pytest.approx(bands[IV.SURFACE].p90, rel=1e-9)
    assert pred.p10_us[1] / pred.predicted_us[1] == pytest.approx(bands[IV.SURFACE].p10, rel=1e-9)
    assert bands[IV.SURFACE].p90 - bands[IV.SURFACE].p10 > 1.5 * (bands["all"].p90 - bands["all"].p10)


@pytest.mark.slow
def test_a_steps_attention_is_the_per_op_price_of_its_blended_shape():
    # Llama-2-70B at TP 4 decodes with 16 query and 2 KV heads of 128 per GPU: a shape vLLM 0.14's
    # decode table measured; 48 sequences is between its measured 32 and 64, so both curves blend
    # (Llama-2-7B's 32 KV heads it did not measure: that model's attention is its surface's)
    gpu = load_gpu("h100_sxm")
    c = CI.with_kernels(CI.load("coeffs/h100_sxm.yaml", gpu), "vllm-0.14.0")
    p = c.params["ops"]["attn_decode/bf16"]
    assert curves.measured(p["curves"], "attn_decode", (48.0, 1023.0, 16.0, 2.0, 128.0))
    assert not curves.measured(p["curves"], "attn_decode", (48.0, 1023.0, 32.0, 32.0, 128.0))
    rows = pd.DataFrame({"gpu": "h100_sxm", "op": "attn_decode", "dtype": "bf16", "batch": [48.0],
                         "context": 1023.0, "heads": 16, "kv_heads": 2, "head_dim": 128,
                         "latency_us": 1.0, "source": "t"})
    # a served step runs on a cold L2: the per-op price it takes is the cold one
    per_op = float(predict_table(rows, c.params, gpu, warm=False).predicted_us.iloc[0])
    surface = float(predict_table(rows, {**c.params, "ops": {"attn_decode/bf16": curves.surface_only(p)}},
                                  gpu, warm=False).predicted_us.iloc[0])
    warm = float(predict_table(rows, c.params, gpu).predicted_us.iloc[0])
    assert warm < per_op                                      # 48 · 1,023 keys · 2 heads: 25 MB
    assert abs(per_op / surface - 1) > 0.005                  # the curves move this shape
    step = predict([Step(decode=(1023,) * 48)], model="meta-llama/Llama-2-70b-hf", gpu="h100_sxm", tp=4,
                   coeffs=c, stack="none", kernels="vllm-0.14.0")
    assert float(step.attn_decode_us.iloc[0]) == pytest.approx(80 * per_op, rel=1e-4)


def test_stored_log_ratios_are_pythons_round_to_the_bit():
    """:func:`curves.stored` rounds in arrays but gives exactly ``round(x, 4)``: values a hair
    above a tie (0.00005 is 5.0000000000000002e-05 in binary: ``round`` goes up, rint of its
    scaled 0.5 would go to 0), negative zero, and a million ordinary ones."""
    from roofcal.model import curves
    ties = np.array([0.00005, 0.00015, -0.00025, 1.23445, 2.00005, -0.0, -0.00004])
    assert list(curves.stored(ties)) == [0.0001, 0.0001, -0.0003, 1.2345, 2.0, 0.0, 0.0]
    zeros = curves.stored(ties)[-2:]
    assert not np.signbit(zeros).any()                # no -0.0 in a file
    x = np.concatenate([np.random.default_rng(0).normal(0, 0.3, 1_000_000),
                        np.arange(-20_000, 20_000) / 1e4 + 0.00005, ties])
    want = np.array([round(float(r), 4) + 0.0 for r in x])
    assert curves.stored(x).tobytes() == want.tobytes()


def test_curve_lines_are_written_number_by_number():
    """A curve block's lines come from one pass over all of a kernel's numbers; each is the
    number's ``repr``, or its integer when whole (below 2⁵³): hand-checked, and line for line as a
    loop over the numbers writes them, on the shipped file's vLLM 0.24 GEMM bf16 curves."""
    vals = [4096.0, -0.0, 2.5, float("inf"), float("nan"), 2.0 ** 53, 1e300, np.float32(0.1), -3.0]
    assert curves._text(vals) == "4096 0 2.5 inf nan 9007199254740992.0 1e+300 0.10000000149011612 -3"
    assert curves._texts([[], [1.0], [0.5, 2.0]]) == ["", "1", "0.5 2"]
    one = lambda v: " ".join(str(int(x)) if float(x).is_integer() and abs(x) < 2 ** 53 else repr(float(x))
                             for x in v)
    cv = CI.load("coeffs/h100_sxm.yaml").kernel_sets["vllm-0.24.0"].ops["gemm/bf16"]["curves"]
    curves._LINES.clear()
    block = curves.to_dict("gemm", cv)["curves"]
    want = [(one(k), one(a), one(curves.stored(r))) for k, (a, r) in sorted(cv.items())]
    assert [(b["shape"], b["at"], b["log_ratio"]) for b in block] == want and len(want) > 100


def test_curve_lines_this_process_wrote_read_back_as_the_numbers_they_were_written_from():
    """``from_dict`` of lines ``to_dict`` wrote hands back the curves those lines were written
    from (rounded as stored) instead of parsing them again: the same keys, positions and
    log-ratios as parsing gives, on every curve set of the shipped file (both kernel sets);
    lines changed by one digit are parsed."""
    from roofcal.model.coeffs import as_read
    c = CI.load("coeffs/h100_sxm.yaml")
    sets = [(k, p["curves"]) for ks in c.kernel_sets.values() for k, p in ks.ops.items() if "curves" in p]
    assert len(sets) >= 20
    for key, cv in sets:
        kind = key.split("/")[0]
        curves._LINES.clear()
        curves._READ.clear()
        block = as_read(curves.to_dict(kind, cv))
        known = curves.from_dict(kind, block, "test")
        assert known is next(iter(curves._READ.values()))
        curves._READ.clear()
        parsed = curves.from_dict(kind, block, "test")
        assert known == parsed and list(known) == list(parsed)          # digests: λ, keys, values
        for shape in list(parsed)[:50]:
            assert all(np.array_equal(a, b) for a, b in zip(known[shape], parsed[shape]))
    curves.to_dict(kind, cv)
    block = as_read(curves.to_dict(kind, cv))
    first = block["curves"][0]
    first["log_ratio"] = "9" + first["log_ratio"].lstrip("-")
    changed = curves.from_dict(kind, block, "test")
    assert changed != cv and changed[next(iter(changed))][1][0] >= 9.0


def test_a_surface_reads_back_once_rounded_and_same_surface_sees_one_bit():
    """``coeffs.op_as_read`` rounds a kernel's surface as its file does (its ranges to 6
    significant digits), and a second pass changes nothing — on a fresh surface and on every
    kernel of the shipped file — which is what lets a fit's metrics reuse the prices it fitted
    the curves with. ``curves.same_surface`` ignores the curves and catches one bit."""
    rng = np.random.default_rng(0)
    c = CI.load("coeffs/h100_sxm.yaml")
    shipped = curves.surface_only(c.kernel_sets["vllm-0.24.0"].ops["gemm/bf16"])
    wiggle = lambda a: np.asarray(a) * (1 + 1e-4 * rng.normal(size=np.shape(a)))   # noqa: E731
    fresh = {**shipped, **K.on_device({k: wiggle(shipped[k]) for k in ("eff_c", "lo", "hi")})}
    once = CI.op_as_read("gemm/bf16", fresh)
    assert not curves.same_surface(once, fresh)                       # the ranges were rounded
    np.testing.assert_allclose(np.asarray(once["hi"]), np.asarray(fresh["hi"]), rtol=1e-5)
    assert curves.same_surface(CI.op_as_read("gemm/bf16", once), once)
    for ks in c.kernel_sets.values():
        for key, p in ks.ops.items():
            again = CI.op_as_read(key, p)
            assert curves.same_surface(again, p) and ("curves" in again) == ("curves" in p), key
    p = c.kernel_sets["vllm-0.24.0"].ops["gemm/bf16"]
    assert curves.same_surface(p, curves.surface_only(p))
    w = np.asarray(p["eff_m"]).copy()
    w[3] = np.nextafter(w[3], np.float32(np.inf))
    assert not curves.same_surface(p, {**p, "eff_m": w})

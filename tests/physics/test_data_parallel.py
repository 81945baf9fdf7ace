"""A data- and expert-parallel deployment's step (``ModelSpec.parallel``), checked by hand:
the busiest rank's share, the routed experts over all dp·TP GPUs, the dispatch and combine
between ranks, and the plain TP step unchanged at dp = 1."""

from __future__ import annotations

import numpy as np
import pytest

from roofcal.errors import RoofcalError
from roofcal.model.predict import predict
from roofcal.physics.config import Parallel, load_model, served
from roofcal.physics.decompose import busiest_rank, step_ops, weight_bytes_per_gpu
from roofcal.physics.steps import Step, StepTotals

MIXTRAL = load_model("mixtral-8x7b-v0.1")            # hidden 4,096, 8 experts of 14,336, top-2

#: 2 prefill chunks of 100 new tokens and 8 decode sequences at context 1,000
TOTALS = StepTotals(*(np.array([v], np.float32) for v in
                      (2, 8, 200, 0, 2 * 100 * 101 / 2, 8 * 1001, 208)))


def _val(x) -> float:
    return float(np.asarray(x).ravel()[0])


def test_the_busiest_rank_takes_the_ceiling_of_each_phase():
    r = busiest_rank(TOTALS, 4)
    # ⌈2/4⌉ = 1 chunk (100 tokens, 5,050 pairs), ⌈8/4⌉ = 2 decodes (2,002 keys)
    got = [_val(getattr(r, f)) for f in ("n_prefill", "n_decode", "prefill_tokens", "prefill_cached_tokens",
                                         "pairs", "decode_kv_tokens", "tokens")]
    assert got == [1, 2, 100, 0, 5050, 2002, 102]
    assert busiest_rank(TOTALS, 1) is TOTALS


def test_dp_1_is_the_tp_step_call_for_call():
    plain = step_ops(MIXTRAL, 2, TOTALS)
    again = step_ops(served(MIXTRAL, Parallel(1)), 2, TOTALS)
    assert list(plain) == list(again)
    for name in plain:
        assert _val(plain[name].work.flops) == _val(again[name].work.flops)
        assert _val(plain[name].work.bytes) == _val(again[name].work.bytes)


def test_expert_parallel_ranks_by_hand():
    ops = step_ops(served(MIXTRAL, Parallel(4, True)), 1, TOTALS)
    d, inter = 4096, 14336
    # attention and projections on the busiest rank's 102 tokens
    assert _val(ops["qkv_proj"].work.flops) == pytest.approx(2 * 102 * 6144 * d, rel=1e-6)
    # routed experts: all 208 tokens, ⌈208·2/4⌉ = 104 pairs on this GPU's 8/4 = 2 whole experts
    assert _val(ops["moe"].work.flops) == pytest.approx(104 * 2 * d * inter * 3, rel=1e-6)
    assert _val(ops["moe"].work.bytes) == pytest.approx(
        2 * 3 * d * inter * 2 + 208 * d * 2 * 2 + 104 * (2 * d + 3 * inter) * 2, rel=1e-6)
    # all-gather family: every rank's 208 tokens gathered and reduce-scattered, 3/4 sent
    assert ops["moe_dispatch"].kind == "allgather" and ops["moe_combine"].kind == "reducescatter"
    assert _val(ops["moe_dispatch"].work.bytes) == pytest.approx(0.75 * 208 * d * 2)
    assert ops["moe_dispatch"].count == MIXTRAL.num_moe_layers == 32
    assert "allreduce" not in ops                       # TP 1 within a rank


def test_an_all_to_all_sends_each_rank_token_to_its_top_k_experts():
    ops = step_ops(served(MIXTRAL, Parallel(4, True, "deepep_low_latency")), 1, TOTALS)
    assert ops["moe_dispatch"].kind == ops["moe_combine"].kind == "alltoall"
    # 102 tokens · top-2 · 4,096 · 2 bytes, 3/4 of it to the other GPUs
    assert _val(ops["moe_combine"].work.bytes) == pytest.approx(0.75 * 102 * 2 * 4096 * 2)


def test_without_expert_parallelism_every_ffn_is_split_over_dp_tp():
    ops = step_ops(served(MIXTRAL, Parallel(2)), 2, TOTALS)
    moe = ops["moe"].work.shape
    assert (_val(moe[0]), _val(moe[5]), _val(moe[6])) == (208, 4, 1)      # tokens, tp, ep
    # weights: attention on every rank at TP 2, the experts over all 4 GPUs
    assert weight_bytes_per_gpu(served(MIXTRAL, Parallel(2)), 2) < weight_bytes_per_gpu(MIXTRAL, 2)
    assert weight_bytes_per_gpu(served(MIXTRAL, Parallel(2)), 2) == weight_bytes_per_gpu(served(MIXTRAL, Parallel(2, True)), 2)


@pytest.mark.parametrize("kw, says", [
    (dict(dp=0), "positive integer"),
    (dict(dp=2, moe_comm="bogus"), "unknown MoE comm backend 'bogus'"),
    (dict(dp=2, moe_comm="pplx"), "only with expert parallelism"),
])
def test_bad_layouts_are_refused(kw, says):
    with pytest.raises(RoofcalError, match=says):
        served(MIXTRAL, Parallel(**kw))
    with pytest.raises(RoofcalError, match="needs an MoE model"):
        served(load_model("llama-2-7b-hf"), Parallel(2, True))


@pytest.mark.slow
def test_predict_times_the_deployment_on_its_busiest_rank():
    steps = [Step(decode=tuple([1000] * 64)), Step(decode=tuple([1000] * 256))]
    kw = dict(model="mixtral-8x7b-v0.1", gpu="h100_sxm", coeffs="coeffs/h100_sxm.yaml")
    tp2 = predict(steps, tp=2, **kw)
    dp4 = predict(steps, tp=2, parallel=Parallel(4, True), **kw)
    assert "dp" not in tp2.columns and list(dp4["dp"]) == [4, 4] and dp4["ep"].all()
    # four ranks share the 256 decodes: each rank's attention is a quarter of the TP 2 step's
    att = dp4["attn_decode_us"] / tp2["attn_decode_us"]
    assert 0.2 < att.iloc[1] < 0.35
    assert (dp4["moe_dispatch_us"] > 0).all() and (dp4["moe_combine_us"] > 0).all()
    assert (dp4["predicted_us"] < tp2["predicted_us"]).all()


def test_each_gpu_of_a_dp_deployment_holds_its_share_of_the_experts():
    from roofcal.physics.capacity import weights_bytes_per_gpu
    experts = 32 * 8 * 3 * 4096 * 14336 * 2            # Mixtral's routed experts, bf16 bytes
    whole = weights_bytes_per_gpu(MIXTRAL, 1)
    assert whole - weights_bytes_per_gpu(served(MIXTRAL, Parallel(4, True)), 1) == pytest.approx(0.75 * experts, abs=1)
    # DP 2 × TP 2: every expert over 4 GPUs, attention over the rank's 2
    assert weights_bytes_per_gpu(served(MIXTRAL, Parallel(2)), 2) == pytest.approx(
        weights_bytes_per_gpu(MIXTRAL, 2) - experts / 2 + experts / 4, abs=1)


def test_capacity_reports_one_rank(capsys):
    from roofcal.cli.main import main
    assert main(["capacity", "--model", "mixtral-8x7b-v0.1", "--gpu", "h100_sxm", "--tp", "1"]) == 2
    assert "--dp N --enable-expert-parallel" in capsys.readouterr().err      # 87 GiB of weights
    assert main(["capacity", "--model", "mixtral-8x7b-v0.1", "--gpu", "h100_sxm", "--tp", "1", "--dp", "4",
                 "--enable-expert-parallel"]) == 0
    out = capsys.readouterr().out
    assert "| 4  | True |" in out and "per data-parallel rank" in out


def test_a_step_of_all_ranks_fits_when_each_rank_does():
    from roofcal.model.domain import fits_memory
    from roofcal.physics.hardware import load_gpu
    from roofcal.physics.steps import batch_steps
    gpu = load_gpu("h100_sxm")
    batch = batch_steps([Step(decode=tuple([1000] * 512)), Step(decode=tuple([1000] * 1100))])
    # 4 ranks of max_num_seqs 256: 512 sequences fit (128 a rank), 1,100 do not (275 on the busiest)
    assert list(fits_memory(served(MIXTRAL, Parallel(4, True)), gpu, 1, batch)) == [True, False]


@pytest.mark.slow
def test_saturation_of_a_dp_deployment_counts_every_rank(capsys):
    from roofcal.cli.main import main
    base = ["workload", "saturation", "--coeffs", "coeffs/h100_sxm.yaml", "--model", "mixtral-8x7b-v0.1",
            "--prompt", "1000", "--output", "200", "--clock", "burst"]
    assert main([*base, "--tp", "1", "--dp", "4", "--enable-expert-parallel"]) == 0
    out = capsys.readouterr().out
    # four ranks of max_num_seqs 256 each: 1,024 running at the limit, the rate also per GPU
    assert "TP1 DP4 EP (allgather_reducescatter)" in out and "(1024 running" in out and "per GPU)" in out


@pytest.mark.slow
def test_whatif_of_a_dp_deployment_starts_from_its_prediction():
    from roofcal.transfer.whatif import whatif
    steps = [Step(decode=tuple([1000] * 256))]
    kw = dict(model="mixtral-8x7b-v0.1", gpu="h100_sxm", tp=1, coeffs="coeffs/h100_sxm.yaml",
              parallel=Parallel(4, True))
    before = whatif(steps, changes={}, rule=None, **kw)["before_us"].iloc[0]
    assert before == pytest.approx(predict(steps, **kw)["predicted_us"].iloc[0], rel=1e-5)
    # a faster link shortens only the dispatch and combine
    faster = whatif(steps, changes={"interconnect_bandwidth_gbs": 900.0}, rule=None, **kw)
    assert 0 < before - faster["after_us"].iloc[0] < 0.2 * before


def test_a_step_row_names_its_own_layout():
    from roofcal.physics.steps import group_by_deployment, layout_of, step_from_dict
    row = {"decode": [64], "model": "mixtral-8x7b-v0.1", "tp": 1, "dp": 4, "ep": True,
           "moe_comm": "deepep_low_latency"}
    s = step_from_dict(row)
    assert layout_of(s) == Parallel(4, True, "deepep_low_latency")
    assert step_from_dict(s.to_json()) == s                           # the row round-trips
    plain = step_from_dict({"decode": [64]})
    assert layout_of(plain, Parallel(2, True)) == Parallel(2, True)   # the command line's
    assert layout_of(step_from_dict({"decode": [64], "ep": False}), Parallel(2, True)) == Parallel(2, False)
    groups = group_by_deployment([s, plain], "mixtral-8x7b-v0.1", "h100_sxm", 1)
    assert sorted(groups.values()) == [[0], [1]]
    for bad, says in (({"dp": 0}, "field 'dp' must be an integer ≥ 1"),
                      ({"ep": 1}, "field 'ep' must be true or false"),
                      ({"moe_comm": 3}, "field 'moe_comm' must be a string")):
        with pytest.raises(RoofcalError, match=says):
            step_from_dict({"decode": [64], **bad}, "steps.jsonl: line 1")


@pytest.mark.slow
def test_rows_with_their_own_layout_predict_as_the_options_do(tmp_path):
    rows = [{"decode": [1000] * 64, "tp": 2},
            {"decode": [1000] * 64, "tp": 1, "dp": 4, "ep": True, "moe_comm": "deepep_low_latency"}]
    path = tmp_path / "steps.jsonl"
    path.write_text("".join(__import__("json").dumps(r) + "\n" for r in rows))
    kw = dict(model="mixtral-8x7b-v0.1", gpu="h100_sxm", coeffs="coeffs/h100_sxm.yaml")
    both = predict(str(path), **kw)
    assert list(both["dp"]) == [1, 4] and list(both["ep"]) == [False, True]
    assert list(both["moe_comm"]) == ["allgather_reducescatter", "deepep_low_latency"]
    step = [Step(decode=tuple([1000] * 64))]
    tp2 = predict(step, tp=2, **kw)
    dp4 = predict(step, tp=1, parallel=Parallel(4, True, "deepep_low_latency"), **kw)
    np.testing.assert_allclose(both["predicted_us"], [tp2["predicted_us"][0], dp4["predicted_us"][0]],
                               rtol=1e-6)

"""Kernel sets: per-op rows of each kernel library fitted as their own set, shared tables once,
kernels a set has no rows of borrowed, and the set a prediction uses chosen by stack or option."""

import numpy as np
import pandas as pd
import pytest

from roofcal.calibration.fit import FitSettings, fit, row_labels, split_rows
from roofcal.errors import RoofcalError
from roofcal.io import yaml_load, yaml_text
from roofcal.measurements.datasets import microbench_table
from roofcal.measurements.ops import kernel_set_of, kernel_set_order, read_ops
from roofcal.model import coeffs as coeff_io
from roofcal.physics.hardware import load_gpu

H100 = load_gpu("h100_sxm")
FAST = FitSettings(progress=False, kernel_iters=60, degree=(("gemm", 1), ("allreduce", 1)))
OLD, NEW = "vllm-0.14.0", "vllm-0.24.0"


def test_kernel_set_of_a_path_and_their_order():
    assert kernel_set_of("data/microbench/h100_sxm/vllm-0.24.0/gemm_perf.parquet") == NEW
    assert kernel_set_of("data/microbench/h100_sxm/nccl-2.27.3/nccl_perf.parquet") == ""   # shared
    assert kernel_set_of("my_kernels.csv") == ""
    # numeric, not lexical: 0.9 < 0.14 < 0.24
    assert sorted(["vllm-0.24.0", "vllm-0.9.2", "vllm-0.14.0"], key=kernel_set_order) == \
        ["vllm-0.9.2", "vllm-0.14.0", "vllm-0.24.0"]


def test_the_024_tables_leave_out_what_vllm_never_runs_in_a_graph():
    # 0.24's block-FP8 GEMM rows were timed eagerly (a 55–151 µs host floor): not read
    gemm = read_ops(f"data/microbench/h100_sxm/{NEW}/gemm_perf.parquet")
    assert set(gemm["dtype"]) == {"bf16", "fp8"} and (gemm["kernels"] == NEW).all()
    assert len(gemm) == 2 * 35_742
    raw = pd.read_parquet(f"data/microbench/h100_sxm/{NEW}/gemm_perf.parquet")
    assert (raw["gemm_dtype"] == "fp8_block").sum() == 35_704
    # MXFP4 MoE rows are not int4 Marlin: not read
    moe = read_ops(f"data/microbench/h100_sxm/{NEW}/moe_perf.parquet")
    assert (moe["dtype"] == "int4").sum() == 1_053


@pytest.mark.parametrize("table, fa4", [("generation_attention_perf", 800), ("context_attention_perf", 578)])
def test_the_024_attention_tables_leave_out_the_fa4_rows(table, fa4):
    # FA4 rows are all at head dim 512 (bf16 KV), where no FA3 row is: not read
    raw = pd.read_parquet(f"data/microbench/h100_sxm/{NEW}/{table}.parquet")
    raw = raw[raw["window_size"] == 0]
    fa4_rows = raw["kernel_source"] == "vllm_flash_attn_fa4"
    assert fa4_rows.sum() == fa4
    assert set(raw.loc[fa4_rows, "head_dim"]) == {512} and (raw.loc[~fa4_rows, "head_dim"] <= 256).all()
    rows = read_ops(f"data/microbench/h100_sxm/{NEW}/{table}.parquet")
    fa3 = raw["kernel_source"] == "vllm_flash_attn_fa3"
    assert len(rows) == fa3.sum() == len(raw) - fa4
    assert (rows["dtype"] == "bf16").sum() == (rows["dtype"] == "fp8").sum()


def test_a_new_set_does_not_reshuffle_another_sets_split():
    t = microbench_table("h100_sxm")
    old = t[t["kernels"].isin([OLD, ""])].reset_index(drop=True)
    alone = split_rows(row_labels(old), 0.2, 0)
    both = split_rows(row_labels(t), 0.2, 0)
    keep = t["kernels"].isin([OLD, ""]).to_numpy()
    assert (both[keep] == alone).all()
    assert 0.19 < both.mean() < 0.21


@pytest.fixture(scope="module")
def two_sets():
    """A small two-set fit: the all-reduce tables of both vLLM versions, NCCL (shared) and 0.14's
    block-FP8 GEMM (a kernel 0.24 has no rows of)."""
    t = microbench_table("h100_sxm")
    ar = t[(t["op"] == "allreduce")]
    fp8b = t[(t["kernels"] == OLD) & (t["op"] == "gemm") & (t["dtype"] == "fp8_block")].iloc[:300]
    table = pd.concat([ar, fp8b], ignore_index=True)
    return fit(H100, table, [], FAST), table


@pytest.mark.slow
def test_each_set_is_fitted_on_its_own_rows_and_shares_nccl(two_sets):
    res, table = two_sets
    c = res.coeffs
    assert list(c.kernel_sets) == [OLD, NEW] and c.kernels == NEW == c.default_kernels   # newest
    old, new = c.kernel_sets[OLD], c.kernel_sets[NEW]
    # the two custom all-reduce tables differ, and so do their fits; NCCL is one fit in both
    assert not np.allclose(old.ops["allreduce/custom"]["eff_m"], new.ops["allreduce/custom"]["eff_m"])
    for leaf in ("eff_c", "eff_m", "latency", "sharpness"):
        assert np.array_equal(old.ops["allreduce/nccl"][leaf], new.ops["allreduce/nccl"][leaf])
    # 0.24 has no block-FP8 GEMM rows: it borrows 0.14's, and says so
    assert new.borrowed == {"gemm/fp8_block": OLD} and not old.borrowed
    assert np.array_equal(new.ops["gemm/fp8_block"]["eff_c"], old.ops["gemm/fp8_block"]["eff_c"])
    # metrics per set, on that set's rows (NCCL in both; no metrics for a borrowed kernel)
    n_nccl = int((table["dtype"] == "nccl").sum())
    assert old.metrics["heldout"]["allreduce/nccl"]["n"] + old.metrics["train"]["allreduce/nccl"]["n"] == n_nccl
    assert "gemm/fp8_block" not in new.metrics["heldout"] and "gemm/fp8_block" in old.metrics["heldout"]
    assert set(old.intervals["ops"]) >= {"allreduce", "gemm/fp8_block"}   # few all-reduce rows: per kind
    assert new.data == []                                   # no provenance given to this fit


@pytest.mark.slow
def test_sets_round_trip_through_the_file(two_sets, tmp_path):
    c = two_sets[0].coeffs
    path = tmp_path / "c.yaml"
    coeff_io.save(c, path)
    doc = yaml_load(path.read_text())
    assert doc["schema"] == "roofcal-coeffs/3" and doc["kernels"] == NEW
    assert list(doc["kernel_sets"]) == [OLD, NEW]
    assert doc["kernel_sets"][NEW]["borrowed"] == {"gemm/fp8_block": OLD}
    back = coeff_io.load(path)
    assert back.kernels == NEW and back.all_metrics == c.all_metrics
    old = coeff_io.with_kernels(back, OLD)
    assert old.kernels == OLD and old.default_kernels == NEW
    coeff_io.save(old, tmp_path / "again.yaml")                # the active set is not the default
    assert (tmp_path / "again.yaml").read_text() == path.read_text()
    with pytest.raises(RoofcalError, match="no kernel set 'vllm-9.9.9' \\(it has: vllm-0.14.0, vllm-0.24.0\\)"):
        coeff_io.with_kernels(back, "vllm-9.9.9")


def test_a_stack_brings_the_set_it_was_calibrated_with():
    c = coeff_io.load("coeffs/h100_sxm.yaml")
    # the shipped vllm stack was calibrated with 0.14's kernels (the serving runs fit them);
    # the file's default set is the newest, which the splitwise stack was fitted with
    assert c.default_kernels == NEW and c.stack == "vllm"
    assert c.stacks["vllm"].source["kernels"] == OLD and c.kernels == OLD
    assert coeff_io.with_stack(c, "splitwise").kernels == NEW
    assert coeff_io.with_stack(c, "none").kernels == NEW
    assert coeff_io.resolve_stack(c, None, kernels=NEW).kernels == NEW          # --kernels wins
    assert coeff_io.resolve_stack(c, "splitwise", kernels=OLD).kernels == OLD
    # a stack borrowed by another GPU's file whose sets lack its own takes that file's default
    a = coeff_io.load("coeffs/a100_sxm.yaml")
    assert list(a.kernel_sets) == [OLD] and a.kernels == OLD


def test_an_older_file_reads_as_one_set_named_after_its_data(tmp_path):
    c = coeff_io.load("coeffs/a100_sxm.yaml")
    doc = yaml_load(open("coeffs/a100_sxm.yaml").read())
    ks = doc.pop("kernel_sets")[doc.pop("kernels")]
    doc.update(schema="roofcal-coeffs/2", ops=ks["ops"], intervals=ks["intervals"])
    doc["metrics"] = {s: {**ks["metrics"][s], **doc["metrics"].get(s, {})} for s in ("train", "heldout")}
    p = tmp_path / "old.yaml"
    p.write_text(yaml_text(doc, sort_keys=False))
    back = coeff_io.load(p)
    assert list(back.kernel_sets) == [OLD]                     # from data/microbench/.../vllm-0.14.0/
    assert back.kernel_set.metrics == c.kernel_set.metrics and back.kernel_set.data == c.kernel_set.data
    assert back.op_bands == c.op_bands


def test_a_file_from_before_the_two_stage_flag_predicts_as_it_was_fitted(tmp_path):
    # an all-reduce surface written without the two_stage descriptor reads with that descriptor
    # pinned at 0 and its terms at 0: on one-stage rows it is the same surface as the file's own,
    # on two-stage rows it no longer sees the flag
    from roofcal.model.predict import predict_table
    doc = yaml_load(open("coeffs/a100_sxm.yaml").read())
    for op in doc["kernel_sets"][OLD]["ops"].values():
        if "two_stage" in op["range"]:
            del op["range"]["two_stage"]
            for name in ("compute_efficiency", "memory_efficiency"):
                op[name] = {t: v for t, v in op[name].items() if "two_stage" not in t}
    p = tmp_path / "before.yaml"
    p.write_text(yaml_text(doc, sort_keys=False))
    before, now = coeff_io.load(p), coeff_io.load("coeffs/a100_sxm.yaml")
    ar = before.params["ops"]["allreduce/custom"]
    assert float(ar["lo"][3]) == float(ar["hi"][3]) == 0.0
    assert float(np.abs(np.asarray(ar["eff_c"])).min()) == 0.0
    rows = pd.DataFrame({"op": "allreduce", "dtype": "custom", "gpu": "a100_sxm",
                         "num_gpus": [2, 8, 8], "bytes": [2 ** 20, 2 ** 17, 2 ** 20], "latency_us": 1.0})
    gpu = load_gpu("a100_sxm")
    a = predict_table(rows, before.params, gpu).predicted_us.to_numpy()
    b = predict_table(rows, now.params, gpu).predicted_us.to_numpy()
    np.testing.assert_allclose(a[:2], b[:2], rtol=1e-6)          # one stage: 2 GPUs; 8 GPUs, 128 KiB
    assert abs(a[2] / b[2] - 1) > 1e-3                            # two stages: 8 GPUs, 1 MiB


@pytest.mark.slow
def test_a_file_from_before_whole_fp8_tiles_warns_and_keeps_its_other_gemms(tmp_path):
    # a GEMM surface written without tile_config reads with it pinned at 0: bf16 (whose work did
    # not change) predicts as the file's own; the FP8 GEMM's work now counts whole CUTLASS tiles,
    # which its surface was not fitted to, so reading it warns, naming the field
    from roofcal.errors import RoofcalWarning
    from roofcal.model.predict import predict_table
    doc = yaml_load(open("coeffs/h100_sxm.yaml").read())
    for ks in doc["kernel_sets"].values():
        for key, op in ks["ops"].items():
            if key.startswith("gemm/"):
                del op["range"]["tile_config"]
                for name in ("compute_efficiency", "memory_efficiency"):
                    op[name] = {t: v for t, v in op[name].items() if "tile_config" not in t}
    p = tmp_path / "before.yaml"
    p.write_text(yaml_text(doc, sort_keys=False))
    with pytest.warns(RoofcalWarning) as said:
        before = coeff_io.load(p)
    assert [str(w.message).split(" was fitted")[0] for w in said] == \
        [f"{p}: field 'kernel_sets.{s}.ops.gemm/fp8'" for s in (OLD, "vllm-0.24.0")]
    now = coeff_io.load("coeffs/h100_sxm.yaml")
    rows = pd.DataFrame({"op": "gemm", "dtype": "bf16", "gpu": "h100_sxm", "m": [1, 300, 4097],
                         "n": 8192, "k": 8192, "latency_us": 1.0})
    gpu = load_gpu("h100_sxm")
    a = predict_table(rows, before.params, gpu).predicted_us.to_numpy()
    b = predict_table(rows, now.params, gpu).predicted_us.to_numpy()
    np.testing.assert_allclose(a, b, rtol=1e-6)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        coeff_io.load("coeffs/a100_sxm.yaml")                 # no FP8 GEMM: nothing to say


@pytest.mark.slow
def test_the_steps_are_fitted_as_soon_as_their_sets_kernels_are(monkeypatch):
    """With whole steps, the step set's kernels (its own, the shared NCCL, the block-FP8 GEMM it
    borrows from 0.14) are fitted first and the steps as soon as those are done, while 0.14's
    all-reduces are still to come; the steps get exactly the step set's kernels."""
    import roofcal.calibration.fit as F
    from roofcal.measurements.stepdata import read_splitwise
    t = microbench_table("h100_sxm")
    table = pd.concat([t[t["op"] == "allreduce"], t[(t["kernels"] == OLD) & (t["op"] == "gemm")
                                                     & (t["dtype"] == "fp8_block")].iloc[:300]],
                      ignore_index=True)
    done, seen = [], {}
    fitted = F.fitted_kernels

    def recording(*a, **k):
        for key, p in fitted(*a, **k):
            done.append(key)
            yield key, p

    def steps_at(datasets, ops, *a, **k):
        seen.update(done=list(done), ops=sorted(ops))
        return {"ops": ops, "step": F.K.neutral_step_params()}
    monkeypatch.setattr(F, "kernel_workers", lambda: 1)      # fits end in the order they start
    monkeypatch.setattr(F, "fitted_kernels", recording)
    monkeypatch.setattr(F, "fit_steps", steps_at)
    res = fit(H100, table, read_splitwise("data/steps/splitwise/llama2-70b_h100-80gb_tp4_tp8.csv"), FAST)
    first = {(NEW, "allreduce/custom"), (NEW, "allreduce/custom_eager"), ("", "allreduce/nccl"),
             (OLD, "gemm/fp8_block")}
    assert set(seen["done"]) == first and len(done) == 6
    assert set(done[4:]) == {(OLD, "allreduce/custom"), (OLD, "allreduce/custom_eager")}
    assert seen["ops"] == ["allreduce/custom", "allreduce/custom_eager", "allreduce/nccl", "gemm/fp8_block"]
    assert res.coeffs.kernels == NEW and res.coeffs.kernel_sets[NEW].borrowed == {"gemm/fp8_block": OLD}

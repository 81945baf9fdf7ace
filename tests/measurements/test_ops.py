"""Per-op tables as a collector writes them: device names, kernel sets from the table's own
columns, the collector's folder layout, and the rows roofcal does not price, counted by name."""

import shutil
from pathlib import Path

import pandas as pd
import pytest

from roofcal.errors import RoofcalError
from roofcal.measurements import datasets
from roofcal.measurements.ops import read_ops, table_kernel_set
from roofcal.physics.hardware import bundled_gpus, gpu_key, load_gpu

ROOT = Path(__file__).resolve().parents[2]
H100_024 = ROOT / "data" / "microbench" / "h100_sxm" / "vllm-0.24.0"
L40S = ROOT.parent / "shared" / "data" / "microbench" / "l40s"
needs_l40s = pytest.mark.skipif(not L40S.is_dir(), reason="../shared/data/microbench/l40s absent")


def test_the_names_nvidia_smi_reports_are_aliases():
    assert load_gpu("NVIDIA L40S").name == "l40s"
    assert load_gpu("NVIDIA H100 80GB HBM3").name == "h100_sxm"
    assert load_gpu("NVIDIA A100-SXM4-80GB").name == "a100_sxm"
    assert load_gpu("NVIDIA H200").name == "h200_sxm"
    assert load_gpu("NVIDIA B200").name == "b200"
    assert gpu_key("NVIDIA H100 80GB HBM3") == gpu_key("nvidia-h100-80gb-hbm3")
    for spec in bundled_gpus():          # every datasheet's first alias is an nvidia-smi name
        assert spec.aliases[0].startswith("NVIDIA "), spec.name
        assert load_gpu(spec.aliases[0]) == spec


def test_kernel_set_from_the_tables_columns():
    t = pd.DataFrame({"framework": ["VLLM"] * 2, "version": ["0.24.0"] * 2, "m": [1, 2]})
    assert table_kernel_set(t) == "vllm-0.24.0"
    assert table_kernel_set(t.assign(framework=["vLLM", "VLLM"])) is None      # not one framework
    assert table_kernel_set(t.drop(columns="version")) is None
    assert table_kernel_set(t.assign(kernel_source="NCCL", framework="TRTLLM")) == ""


def test_the_collectors_layout_and_any_folder_name_read_the_same_kernels(tmp_path):
    src = H100_024 / "custom_allreduce_perf.parquet"
    for where in ("allreduce/vllm/0.24.0", "renamed"):     # the collector's layout; any folder
        dst = tmp_path / where / src.name
        dst.parent.mkdir(parents=True)
        shutil.copy(src, dst)
        df = read_ops(dst)
        assert set(df["kernels"]) == {"vllm-0.24.0"}
        assert len(df) == 138 and set(df["gpu"]) == {"h100_sxm"}
    # the NCCL table is shared by every kernel set, wherever it lies
    nccl = tmp_path / "nccl" / "nccl_perf.parquet"
    nccl.parent.mkdir()
    shutil.copy(ROOT / "data/microbench/h100_sxm/nccl-2.27.3/nccl_perf.parquet", nccl)
    assert set(read_ops(nccl)["kernels"]) == {""}


def test_rows_not_priced_are_counted_by_name():
    df = read_ops(H100_024 / "gemm_perf.parquet")
    # FP8 block-scaled GEMMs of 0.24 were timed outside CUDA graphs: 4,736 + 23,850 + 7,118 rows
    assert df.attrs["left_out"] == {"vllm-0.24.0 GEMMs of dtype fp8_block (timed outside CUDA graphs)": 35704}
    assert not (df["dtype"] == "fp8_block").any()
    m = datasets.load([H100_024 / "moe_perf.parquet", H100_024 / "context_attention_perf.parquet"],
                      gpu="h100_sxm")
    # 972 + 1,944 MXFP4 MoE rows; 578 prefill rows at head dim 512, all FlashAttention 4 (module
    # docstring of ops);
    # 23,936 prefill rows of a sliding window (window_size > 0, counted in the parquet)
    assert m.left_out == {"moe of dtype w4a16_mxfp4 (not priced)": 2916,
                          "attention at head dim 512 (no mapped model runs it)": 578,
                          "sliding-window attention": 23936}


@needs_l40s
def test_a_table_named_as_nvidia_smi_names_its_gpu_is_read():
    m = datasets.load([L40S / "vllm-0.24.0" / "moe_perf.parquet"], gpu=load_gpu("l40s"))
    assert set(m.ops["gpu"]) == {"l40s"} and set(m.ops["kernels"]) == {"vllm-0.24.0"}
    assert m.left_out == {"moe of dtype w4a16_mxfp4 (not priced)": 1944}
    assert len(m.ops) == 48317 - 1944
    with pytest.raises(RoofcalError, match="rows are for GPU 'l40s', not 'h100_sxm'"):
        datasets.load([L40S / "vllm-0.24.0" / "moe_perf.parquet"], gpu="h100_sxm")


@needs_l40s
def test_a_users_datasheet_takes_rows_named_by_its_alias(tmp_path):
    from roofcal.physics.hardware import datasheet_yaml
    spec = load_gpu("l40s")
    text = datasheet_yaml(spec).replace("name: l40s", "name: my_l40s", 1)
    p = tmp_path / "my_l40s.yaml"
    p.write_text(text)
    mine = load_gpu(str(p))
    assert mine.name == "my_l40s" and "NVIDIA L40S" in mine.aliases
    m = datasets.load([L40S / "nccl-2.27.3"], gpu=mine)
    assert set(m.ops["gpu"]) == {"my_l40s"}


def test_nccl_tables_give_every_collective_and_count_the_int8_rows():
    table = next((ROOT / "data" / "microbench" / "a100_sxm").glob("nccl-*"))
    m = datasets.load([table], gpu="a100_sxm")
    counts = m.ops.groupby("op").size().to_dict()
    # 504 rows: 4 collectives × 3 GPU counts × 21 sizes × (half, int8); the bf16 half is read
    assert counts == {"allreduce": 63, "allgather": 63, "reducescatter": 63, "alltoall": 63}
    assert set(m.ops["dtype"]) == {"nccl"} and set(m.ops["kernels"]) == {""}
    assert m.left_out == {"NCCL collectives of int8 (the bf16 rows are read)": 252}
    ag = m.ops[(m.ops.op == "allgather") & (m.ops.num_gpus == 2)].sort_values("bytes")
    assert ag["bytes"].iloc[0] == 2 * 256          # message_size in bf16 elements → bytes


def test_two_kernels_at_one_shape_keep_the_dtypes_main_kernel(tmp_path):
    # the H100's vLLM 0.24 FP8-block MoE is two kernels split by shape (FlashInfer's CUTLASS
    # experts at EP > 1, Triton at EP 1): both kept, nothing reported
    moe = pd.read_parquet(H100_024 / "moe_perf.parquet")
    block = moe[moe.moe_dtype == "fp8_block"]
    assert block.groupby(block.moe_ep_size > 1).kernel_source.nunique().tolist() == [1, 1]
    assert not any("another kernel" in k for k in read_ops(H100_024 / "moe_perf.parquet").attrs["left_out"])
    # a table timing a second kernel at 40 of the main kernel's shapes: those 40 rows left out
    bf16 = moe[moe.moe_dtype == "bfloat16"].head(200)
    alt = bf16.head(40).assign(kernel_source="some_other_kernel", latency=bf16.head(40).latency * 3)
    path = tmp_path / "vllm-0.24.0" / "moe_perf.parquet"
    path.parent.mkdir()
    pd.concat([bf16, alt]).to_parquet(path)
    df = read_ops(path)
    assert len(df) == 200 and df.attrs["left_out"] == {
        "kernel some_other_kernel at shapes another kernel also timed (the dtype's most-timed kernel kept)": 40}
    assert (df.latency_us.to_numpy() == bf16.latency.to_numpy() * 1000).all()


def test_a_folders_table_of_another_kind_is_left_out_by_name(tmp_path):
    folder = tmp_path / "vllm-0.24.0"
    folder.mkdir()
    shutil.copy(H100_024 / "custom_allreduce_perf.parquet", folder)
    mla = pd.DataFrame({"framework": ["VLLM"] * 3, "version": ["0.24.0"] * 3, "op_name": ["mla_context"] * 3,
                        "kv_lora_rank": [512] * 3, "isl": [128, 256, 512], "latency": [0.1, 0.2, 0.4]})
    mla.to_parquet(folder / "mla_context_attention_perf.parquet")
    m = datasets.load([folder], gpu=load_gpu("h100_sxm"))
    assert len(m.ops) == 138
    (label, rows), = [(k, n) for k, n in m.left_out.items() if "mla_context" in k]
    assert rows == 3 and "not a per-op table roofcal reads" in label
    assert any("mla_context" in k for k in read_ops(folder).attrs["left_out"])
    with pytest.raises(RoofcalError, match="not a recognised aiconfigurator table"):
        datasets.load([folder / "mla_context_attention_perf.parquet"])      # named on its own
    (folder / "custom_allreduce_perf.parquet").unlink()
    with pytest.raises(RoofcalError, match="no measurements found .*mla_context"):
        datasets.load([folder])


def test_fa4_rows_at_the_head_dims_models_use_are_read(tmp_path):
    # a GPU whose vLLM times FA4 at every head dim keeps them; head dim 512 is left out by any kernel
    raw = pd.read_parquet(H100_024 / "generation_attention_perf.parquet")
    raw = raw[raw.window_size == 0].head(300).assign(kernel_source="vllm_flash_attn_fa4")
    raw.loc[raw.index[:10], "head_dim"] = 512
    path = tmp_path / "vllm-0.24.0" / "generation_attention_perf.parquet"
    path.parent.mkdir()
    raw.to_parquet(path)
    df = read_ops(path)
    assert len(df) == 290 and df.attrs["left_out"] == {"attention at head dim 512 (no mapped model runs it)": 10}


def test_a_row_faster_than_the_fastest_tensor_peak_is_left_out_and_counted(tmp_path):
    """A bf16 GEMM m = n = k = 4,096 is 2·4,096³ = 137.4 GFLOP; the H100's fastest dense peak is
    its FP8 one, 1,979 TFLOPS = 1.979e9 FLOP/µs, so no kernel computes it in under 69.4 µs. A row
    at 50 µs is left out with its kind and count; at 100 µs (bf16 peak: 139 µs, not reached
    either, but FP8 could) it is kept, whether the datasheet is given or named."""
    from roofcal.physics.kernels import fastest_peak
    h100 = load_gpu("h100_sxm")
    assert fastest_peak(h100) == pytest.approx(1.979e9, rel=1e-3)
    rows = pd.DataFrame({"gpu": "h100_sxm", "op": "gemm", "dtype": "bf16", "m": 4096, "n": 4096,
                         "k": 4096, "latency_us": [50.0, 100.0, 200.0]})
    rows.to_csv(tmp_path / "g.csv", index=False)
    m = datasets.load([tmp_path / "g.csv"], gpu=h100)
    assert m.ops["latency_us"].tolist() == [100.0, 200.0]
    assert m.left_out == {"gemm/bf16 faster than the GPU's fastest tensor peak allows": 1}
    assert datasets.load([tmp_path / "g.csv"], gpu="h100_sxm").left_out == m.left_out
    # a GPU with FP4 tensor cores: its FP4 peak bounds every kernel (B200: 9,000 TFLOPS dense)
    assert fastest_peak(load_gpu("b200")) == pytest.approx(9.0e9)


@needs_l40s
@pytest.mark.slow
def test_the_l40s_fp8_kv_prefill_rows_that_beat_its_fp8_peak_are_left_out():
    """The L40S's vLLM 0.14 FP8-KV prefill table (FlashInfer) times hundreds of shapes in less
    than their FLOPs take at its FP8 peak (733 TFLOPS): at 64 heads over 1 KV head, 16,384 tokens
    (4.4 TFLOP causal, ≥ 6.0 ms at that peak) it measures 0.92 ms, against 27.2 ms in bf16. Those
    rows, and no row of the bundled A100 and H100 tables, are left out."""
    l40s = load_gpu("l40s")
    m = datasets.load([L40S / "vllm-0.14.0" / "context_attention_perf.parquet"], gpu=l40s)
    n = m.left_out["attn_prefill/fp8 faster than the GPU's fastest tensor peak allows"]
    assert 700 < n < 900
    assert len(m.left_out) == 1                          # no bf16 row, no other reason
    assert not ((m.ops["dtype"] == "fp8") & (m.ops["heads"] == 64) & (m.ops["kv_heads"] == 1)
                & (m.ops["seq"] == 16384) & (m.ops["batch"] == 1)).any()
    for gpu in ("a100_sxm", "h100_sxm"):
        left = datasets.load(datasets.bundled_paths(gpu), gpu=load_gpu(gpu)).left_out
        assert not any("peak" in k for k in left), gpu

"""Hand-checked work of single kernels and whole layers."""

from pathlib import Path

import numpy as np
import pytest

from roofcal.physics import components as C
from roofcal.physics.config import load_model
from roofcal.physics.decompose import step_ops, weight_bytes_per_gpu
from roofcal.physics.steps import Step, batch_steps, step_totals


def totals(steps):
    return step_totals(batch_steps(steps))


def gemm_flops(ops, names):
    return sum(float(ops[n].work.flops[0]) for n in names)


def test_gemm_counts():
    w = C.gemm(1, 12288, 4096)
    assert float(w.flops) == 2 * 12288 * 4096
    assert float(w.bytes) == 4096 * 2 + 4096 * 12288 * 2 + 12288 * 2
    assert float(C.gemm(0, 12288, 4096).bytes) == 0.0          # not launched


def test_llama2_7b_layer_flops_and_weights():
    # per token per layer: QKV 2·4096·12288 + O 2·4096² + gate/up 2·4096·22016 + down 2·11008·4096
    # = 100,663,296 + 33,554,432 + 180,355,072 + 90,177,536 = 404,750,336 = 2 × 202,375,168 params
    m = load_model("llama-2-7b-hf")
    ops = step_ops(m, 1, totals([Step(prefill=((100, 0),))]))
    per_layer = gemm_flops(ops, ["qkv_proj", "o_proj", "mlp_up", "mlp_down"]) / 100
    assert per_layer == 404_750_336
    # weights read by one layer's GEMMs: 202,375,168 params × 2 bytes
    wbytes = sum(float(ops[n].work.bytes[0]) for n in ["qkv_proj", "o_proj", "mlp_up", "mlp_down"])
    act = 100 * (4096 * 2 + 12288 * 2) + 100 * (4096 * 2 + 4096 * 2) \
        + 100 * (4096 * 2 + 22016 * 2) + 100 * (11008 * 2 + 4096 * 2)
    assert wbytes - act == 202_375_168 * 2
    assert all(ops[n].count == 32 for n in ["qkv_proj", "o_proj", "mlp_up", "mlp_down"])
    # one 128-token chunk: pairs 128·129/2 = 8256, FLOPs 2·32 heads·(128+128)·8256
    a = step_ops(m, 1, totals([Step(prefill=((128, 0),))]))["attn_prefill"].work
    assert float(a.flops[0]) == 135_266_304
    assert weight_bytes_per_gpu(m, 1) == (32 * 202_375_168 + 32000 * 4096) * 2


def test_llama2_70b_tp4_split():
    # per GPU: 16 heads, 2 KV heads, gate/up 2·7168, down k = 7168
    m = load_model("llama-2-70b-hf")
    ops = step_ops(m, 4, totals([Step(decode=(1000,))]))
    assert ops["qkv_proj"].work.shape[1] == 16 * 128 + 2 * 2 * 128
    # 2·8192·2560 + 2·2048·8192 + 2·8192·14336 + 2·7168·8192 = 427,819,008 per token-layer
    assert gemm_flops(ops, ["qkv_proj", "o_proj", "mlp_up", "mlp_down"]) == 427_819_008
    # = 2 × 855,638,016 layer params / 4
    assert 427_819_008 * 4 == 2 * 855_638_016
    assert weight_bytes_per_gpu(m, 4) == 80 * 855_638_016 / 4 * 2 + 8000 * 8192 * 2
    # decode KV read: 1001 keys × 2 KV heads × (128 + 128) × 2 bytes, + the new token's write
    att = ops["attn_decode"].work
    assert float(att.bytes[0]) == (1001 + 1) * 2 * 256 * 2 + 16 * 256 * 2
    # two all-reduces per layer of 1 token × 8192 × 2 bytes; ring volume 2·3/4 of that
    ar = ops["allreduce"]
    assert ar.count == 160 and float(ar.work.bytes[0]) == 2 * 0.75 * 8192 * 2


def test_chunked_prefill_pairs_and_cache_read():
    # chunk of 256 new tokens over 1024 cached: pairs = 256·1024 + 256·257/2
    t = totals([Step(prefill=((256, 1024),))])
    assert float(t.pairs[0]) == 256 * 1024 + 256 * 257 / 2
    w = C.prefill_attention(1.0, 256.0, float(t.pairs[0]), 1024.0, 32, 8, 128, 128, 8 * 256)
    assert float(w.bytes) == 256 * 32 * 256 * 2 + (1024 + 512) * 2048 * 2
    # its efficiency is looked up at the uncached chunk of the same pairs: n(n+1)/2 = 295,040
    # → n = (√(8·295,040 + 1) − 1)/2 = 767.67 tokens; the cached length rides along unchanged
    assert float(w.shape[1]) == pytest.approx(767.67, abs=0.01)
    assert float(w.shape[2]) == 1024.0


def test_cached_prefix_equivalent_chunk():
    # one new token over 762 cached keys does the work of a 38.6-token uncached chunk
    w = C.prefill_attention(1.0, 1.0, 762.0 + 1.0, 762.0, 16, 2, 128, 128, 2 * 256)
    assert float(w.shape[1]) == pytest.approx((6105 ** 0.5 - 1) / 2)    # 38.57
    # without a cache the equivalent chunk is the mean chunk: 3 chunks of 100 tokens
    w = C.prefill_attention(3.0, 300.0, 3 * 100 * 101 / 2, 0.0, 16, 2, 128, 128, 2 * 256)
    assert float(w.shape[1]) == pytest.approx(100.0)


def test_mixtral_active_experts():
    assert float(C.expected_active_experts(1.0, 2, 8)) == pytest.approx(2.0)
    assert float(C.expected_active_experts(2.0, 2, 8)) == pytest.approx(3.5)       # 8·(1−0.75²)
    assert float(C.expected_active_experts(16.0, 2, 8)) == pytest.approx(8 * (1 - 0.75 ** 16))
    assert float(C.expected_active_experts(1e6, 2, 8)) == pytest.approx(8.0)
    # one token at TP 1: FLOPs 2 experts · 2·4096·14336·3 (the router is a GEMM of its own)
    w = C.moe(1.0, 4096, 14336, 2, 8)
    assert float(w.flops) == 2 * 2 * 4096 * 14336 * 3
    assert float(w.bytes) == pytest.approx(2 * 3 * 4096 * 14336 * 2 + 4096 * 2 * 2
                                           + 2 * (2 * 4096 + 3 * 14336) * 2)


@pytest.mark.slow
def test_power_law_routing_sums_over_the_experts_bound():
    from roofcal.physics.components.moe import MAX_EXPERTS, experts_bound, routing
    # the next power of two at or above the largest count, never under 8 nor over 1,024
    assert [experts_bound(np.array(e)) for e in ([8.0], [9.0, 2.0], [256.0], [257.0], [2000.0], [])] \
        == [8, 16, 256, 512, MAX_EXPERTS, 8]
    # Mixtral rows (8 experts, top-2) at skew 0.8 and 0, 1 and 100 tokens: summed over 8 or
    # 1,024 experts, the same values to the bit (the terms past 8 are exact zeros)
    t, k, e, s = (np.array(v, np.float32) for v in ([1, 100, 1, 100], [2] * 4, [8] * 4, [0.8, 0.8, 0, 0]))
    short, full = routing(t, k, e, 1.0, s, 8), routing(t, k, e, 1.0, s, MAX_EXPERTS)
    assert all(np.asarray(a).tobytes() == np.asarray(b).tobytes() for a, b in zip(short, full))
    # by hand at skew 0.8: w = (1, 2^-0.8, …, 8^-0.8), q_i = min(1, 2·w_i/Σw); 1 token → Σq = 2 pairs
    assert float(short[0][0]) == pytest.approx(2.0, rel=1e-6)
    # balanced (skew 0): ⌈100·2⌉ = 200 pairs on min(8, 200) = 8 experts; a skew given as the
    # number 0 (a step's routing) takes that branch without the power law
    assert (float(short[0][3]), float(short[1][3])) == (200.0, 8.0)
    assert tuple(float(x) for x in routing(100.0, 2.0, 8.0)) == (200.0, 8.0)


def test_mixtral_step_uses_moe_not_dense_mlp():
    m = load_model("mixtral-8x7b-v0.1")
    ops = step_ops(m, 2, totals([Step(decode=(10, 20, 30))]))
    assert "moe" in ops and "mlp_up" not in ops and ops["moe"].count == 32
    assert float(ops["moe"].work.shape[0][0]) == 3      # tokens


def test_allreduce_volume_and_single_gpu():
    w = C.allreduce(8.0, 16 * 2 ** 20)
    assert float(w.bytes) == 2 * 7 / 8 * 16 * 2 ** 20
    assert float(C.allreduce(1.0, 1e6).bytes) == 0.0
    assert "allreduce" not in step_ops(load_model("llama-2-7b-hf"), 1, totals([Step(decode=(5,))]))


def test_collectives_send_all_but_their_own_share_of_the_buffer():
    mib = 2 ** 20
    # 8 GPUs, 64 MiB: each GPU sends 7/8 of the buffer (56 MiB); only the reduce-scatter adds
    for name in C.COLLECTIVES:
        w = C.collective(name, 8.0, 64 * mib)
        assert float(w.bytes) == 56 * mib
        assert float(w.flops) == (28 * mib if name == "reducescatter" else 0.0)
        assert [float(x) for x in w.shape] == [8.0, 64 * mib]
    assert float(C.collective("alltoall", 1.0, 64 * mib).bytes) == 0.0
    # hand check of the docstring: 56 MiB over a 450 GB/s link = 130.5 µs
    assert abs(56 * mib / 450e3 - 130.5) < 0.1
    with pytest.raises(ValueError, match="unknown collective"):
        C.collective("broadcast", 2.0, 1.0)


@pytest.mark.skipif(not (Path(__file__).resolve().parents[2].parent / "shared").is_dir(),
                    reason="../shared not beside the project")
def test_measured_collectives_move_what_the_component_says():
    # H100 NCCL table, 8 GPUs, 256 Mi bf16 elements (512 MiB): all-gather, reduce-scatter and
    # all-to-all each send 7/8 of the buffer, so they take about the same time, at a bus
    # bandwidth below the 450 GB/s NVLink 4 of the datasheet and above half of it
    import pandas as pd
    root = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "microbench" / "h100_sxm"
    df = pd.read_parquet(next(root.glob("nccl-*/nccl_perf.parquet")))
    big = df[(df.num_gpus == 8) & (df.message_size == 2 ** 28) & (df.nccl_dtype == "half")]
    for op in ("all_gather", "reduce_scatter", "alltoall"):
        t_us = big[big.op_name == op].latency.min() * 1000.0
        rate = float(C.collective("allgather", 8.0, 2.0 * 2 ** 28).bytes) / t_us / 1e3   # GB/s
        assert 225.0 < rate < 450.0, (op, rate)


def test_allreduce_two_stage_follows_vllms_custom_kernel_choice():
    from roofcal.physics.components.comm import two_stage
    kib = 2 ** 10
    # one stage: 2 GPUs at any size, 4 GPUs below 512 KiB, 8 GPUs below 256 KiB
    cases = [(2, 4096 * kib, 0), (4, 256 * kib, 0), (4, 512 * kib, 1), (8, 128 * kib, 0),
             (8, 256 * kib, 1), (8, 1, 0)]
    for g, b, want in cases:
        assert float(two_stage(float(g), float(b))) == want, (g, b)
    assert float(C.allreduce(8.0, 256 * kib).shape[3]) == 1.0


@pytest.mark.skipif(not (Path(__file__).resolve().parents[2].parent / "shared").is_dir(),
                    reason="../shared not beside the project")
def test_measured_custom_allreduce_steps_where_the_kernel_switches():
    # H100, vLLM 0.14: the latency jumps where two_stage turns on, and not on 2 GPUs
    import pandas as pd
    t = pd.read_parquet(Path(__file__).resolve().parents[2].parent / "shared" / "data" / "microbench"
                        / "h100_sxm" / "vllm-0.14.0" / "custom_allreduce_perf.parquet")
    t = t[t.backend == "vllm_graph"]
    lat = t.groupby(["num_gpus", "message_size"]).latency.mean()      # ms; size in bf16 elements
    jump = lambda g, kib: lat[(g, kib * 1024)] / lat[(g, kib * 512)]   # 2·kib KiB against kib KiB
    # 8 GPUs 14.7 / 7.7 µs, 4 GPUs 11.4 / 7.1 µs; 2 GPUs (always one stage) 6.3 / 5.1 µs
    assert jump(8, 128) > 1.8 and jump(4, 256) > 1.5 and jump(2, 256) < 1.3


def test_cutlass_fp8_gemm_counts_whole_tiles():
    from roofcal.physics.components.gemm import cutlass_fp8_tiles
    # m ≤ 16 → 16-row tile (configuration 4), (16, 64] → 64 (3), (64, 128] → 128 (2), beyond →
    # blocks of 256 (0 where m fills its last one, 1 where not); n in tiles of 64 where m ≤ 64
    # (operands swapped), else 128
    cases = [(1, 12288, 16, 12288, 4), (16, 100, 16, 128, 4), (17, 100, 64, 128, 3),
             (100, 1000, 128, 1024, 2), (128, 8192, 128, 8192, 2), (129, 8192, 256, 8192, 1),
             (256, 8192, 256, 8192, 0), (257, 8192, 512, 8192, 1), (4097, 4096, 4352, 4096, 1)]
    for m, n, mt, nt, config in cases:
        assert [float(x) for x in cutlass_fp8_tiles(float(m), float(n))] == [mt, nt, config], m
    w = C.gemm(257.0, 8192, 8192, 1.0, 1.0, 2.0, tiled=True)
    assert float(w.flops) == 2 * 512 * 8192 * 8192 and float(w.shape[3]) == 1.0
    # bytes stay the real ones: x 257·8192·1 + W 8192²·1 + y 257·8192·2
    assert float(w.bytes) == 257 * 8192 + 8192 ** 2 + 257 * 8192 * 2
    assert float(C.gemm(0.0, 8192, 8192, tiled=True).flops) == 0.0
    plain = C.gemm(257.0, 8192, 8192)                               # cuBLAS: exact count
    assert float(plain.flops) == 2 * 257 * 8192 * 8192 and plain.shape[3] == 0.0


@pytest.mark.skipif(not (Path(__file__).resolve().parents[2].parent / "shared").is_dir(),
                    reason="../shared not beside the project")
def test_measured_fp8_gemm_steps_where_a_tile_block_starts():
    # H100, vLLM 0.24 CUTLASS FP8, n = k = 8192: m = 257 computes a second 256-row block
    import pandas as pd
    t = pd.read_parquet(Path(__file__).resolve().parents[2].parent / "shared" / "data" / "microbench"
                        / "h100_sxm" / "vllm-0.24.0" / "gemm_perf.parquet")
    t = t[(t.gemm_dtype == "fp8") & (t.n == 8192) & (t.k == 8192)].groupby("m").latency.mean()
    # 37.7 → 80.0 µs (256 → 257) and 57.5 → 112.7 µs (512 → 513); bf16 (cuBLAS) does not step
    assert t[257] / t[256] > 1.8 and t[513] / t[512] > 1.8 and t[4097] / t[4096] > 1.1
    # inside one block the time does not grow with m (129 … 256 rows cost one block)
    assert t[256] <= t[129]


def test_elementwise_docstring_example():
    w = C.elementwise(1.0, 4096, 11008, 4096, 4096)
    assert float(w.bytes) == (10 * 4096 + 3 * 11008 + 2 * (4096 + 4096)) * 2 == 180_736


def test_step_ideal_times_use_each_kernels_own_peak_and_bandwidth():
    from roofcal.model.correction import neutral_params
    from roofcal.physics.hardware import load_gpu
    from roofcal.model.combine import step_breakdown
    g = load_gpu("h100_sxm")
    m = load_model("llama-2-70b-hf")
    b = batch_steps([Step(decode=(1000,) * 8)])
    out = step_breakdown(neutral_params(), m, g, 4, b)
    ops = step_ops(m, 4, step_totals(b))
    ar = ops["allreduce"].count * float(ops["allreduce"].work.bytes[0])
    # all-reduce bytes cross NVLink (450 GB/s), everything else HBM (3.35 TB/s)
    want = (float(out["bytes"][0]) - ar) / 3.35e6 + ar / 450e3
    assert float(out["ideal_memory"][0]) == pytest.approx(want, rel=1e-5)
    assert float(out["ideal_compute"][0]) == pytest.approx(float(out["flops"][0]) / 989.4e6, rel=1e-3)

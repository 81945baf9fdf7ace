"""KV-cache capacity as vLLM computes it (roofcal.physics.capacity): every expected number is worked
out here by hand from the bundled config.json values, with the formula written out."""

import argparse
import math

import numpy as np
import pytest

from roofcal.blis.sampling import kv_capacity_tokens
from roofcal.errors import RoofcalError
from roofcal.physics.capacity import (
    GIB,
    capacity,
    fits,
    kv_bytes_per_token_per_gpu,
    max_batch,
    weights_bytes_per_gpu,
)
from roofcal.physics.config import load_model
from roofcal.physics.hardware import load_gpu
from roofcal.physics.steps import Step, batch_steps, step_totals

H100 = load_gpu("h100_sxm")
#: the bundled serving runs' vLLM server (exp-config.yaml): the profiling run of the 7,463-block log
LOG_SERVER = dict(max_num_batched_tokens=2048, max_num_seqs=128)


# ------------------------------------------------------------------------------------------
# weights per GPU


def test_weights_dense_llama_2_7b_tp1():
    d, L, I, V = 4096, 32, 11008, 32000                      # config.json
    layer = 4 * d * d + 3 * d * I + 2 * d                    # QKV+O (MHA), gate/up/down, 2 RMSNorms
    params = L * layer + 2 * V * d + d                       # + embedding + LM head + final norm
    assert params == 6_738_415_616                           # Llama-2-7B's published parameter count
    assert weights_bytes_per_gpu(load_model("llama-2-7b-hf"), 1) == 2 * params  # fp16
    assert 2 * params / GIB == pytest.approx(12.55, abs=0.005)  # vLLM logs "took 12.55 GiB"


def test_weights_gqa_llama_3_1_70b_tp4():
    d, L, H, kvh, hd, I, V, tp = 8192, 80, 64, 8, 128, 28672, 128256, 4
    qkv = d * (H // tp * hd + kvh // tp * 2 * hd)            # 16 query heads, 2 KV heads per GPU
    o = H // tp * hd * d
    mlp = 3 * d * I // tp
    layer = qkv + o + mlp + 2 * d                            # norms replicated
    vocab = (V // tp) * d * 2                                # 128256 is a multiple of 64: no padding
    params = L * layer + vocab + d
    assert weights_bytes_per_gpu(load_model("llama-3.1-70b-instruct"), tp) == 2 * params
    assert 2 * params == 35_278_831_616


def test_weights_moe_mixtral_tp2():
    d, L, H, kvh, hd, I_e, E, V, tp = 4096, 32, 32, 8, 128, 14336, 8, 32000, 2
    attn = d * (H // tp * hd + kvh // tp * 2 * hd) + H // tp * hd * d
    experts = E * 3 * d * I_e // tp                          # every expert's width split by TP
    router = d * E                                           # replicated, unquantised
    params = L * (attn + experts + router + 2 * d) + V // tp * d * 2 + d
    assert weights_bytes_per_gpu(load_model("mixtral-8x7b-v0.1"), tp) == 2 * params
    # whole model at TP 1 is Mixtral's 46.7 B parameters
    assert weights_bytes_per_gpu(load_model("mixtral-8x7b-v0.1"), 1) / 2 == pytest.approx(46.70e9, rel=1e-3)


def test_weights_mla_deepseek_v2_lite_tp1():
    d, L, H, nope, rope, v, lora, V = 2048, 27, 16, 128, 64, 128, 512, 102400
    I, I_e, E, shared, dense_layers = 10944, 1408, 64, 2 * 1408, 1   # first_k_dense_replace = 1
    attn = (d * H * (nope + rope)            # q_proj (q_lora_rank null)
            + d * (lora + rope)              # kv_a_proj_with_mqa, replicated
            + lora * H * (nope + v)          # kv_b_proj
            + H * v * d                      # o_proj
            + lora)                          # kv_a_layernorm
    moe = E * 3 * d * I_e + 3 * d * shared + d * E
    params = L * (attn + 2 * d) + dense_layers * 3 * d * I + (L - dense_layers) * moe + 2 * V * d + d
    assert weights_bytes_per_gpu(load_model("deepseek-v2-lite"), 1) == 2 * params
    assert params == pytest.approx(15.7e9, rel=2e-3)           # DeepSeek-V2-Lite: 15.7 B total


# ------------------------------------------------------------------------------------------
# KV bytes per token


def test_kv_bytes_gqa_mla_fp8_and_replication():
    assert kv_bytes_per_token_per_gpu(load_model("llama-2-7b-hf"), 1) == 32 * 32 * 256 * 2   # 512 KiB
    assert kv_bytes_per_token_per_gpu(load_model("llama-2-7b-hf"), 1, "fp8") == 32 * 32 * 256
    # MLA: L · (kv_lora_rank + qk_rope_head_dim) · 2, the same on every TP rank
    mla = load_model("deepseek-v2-lite")
    assert kv_bytes_per_token_per_gpu(mla, 1) == kv_bytes_per_token_per_gpu(mla, 4) == 27 * (512 + 64) * 2
    # GQA: 8 KV heads split by TP 4 (2 per GPU), one per GPU at TP 8
    l70 = load_model("llama-3.1-70b-instruct")
    assert kv_bytes_per_token_per_gpu(l70, 4) == 80 * 2 * 256 * 2
    assert kv_bytes_per_token_per_gpu(l70, 8) == 80 * 1 * 256 * 2
    # 4 KV heads at TP 8: replicated, one per GPU, so no fewer bytes than at TP 4
    q3 = load_model("qwen3-30b-a3b")
    assert kv_bytes_per_token_per_gpu(q3, 8) == kv_bytes_per_token_per_gpu(q3, 4) == 48 * 1 * 256 * 2
    assert "replicated" in " ".join(capacity(q3, H100, 8).notes)


def test_fp8_kv_halves_bytes_and_doubles_blocks():
    spec = load_model("llama-2-70b-hf")
    a, b = capacity(spec, H100, 4), capacity(spec, H100, 4, kv_dtype="fp8")
    assert 2 * b.kv_bytes_per_token_per_gpu == a.kv_bytes_per_token_per_gpu
    assert b.weights_bytes_per_gpu == a.weights_bytes_per_gpu
    assert b.kv_blocks in (2 * a.kv_blocks, 2 * a.kv_blocks + 1)


# ------------------------------------------------------------------------------------------
# KV blocks


def test_llama_2_7b_tp1_h100_matches_vllm_log_7463_blocks():
    cap = capacity(load_model("llama-2-7b-hf"), H100, 1, **LOG_SERVER)
    # by hand: 0.9 · 0.99 · 80 GiB − 13,476,831,232 B weights − reservation, over 16 · 524,288 B
    reserved = 2048 * 2 * (2 * 4096 + 2 * 11008 + 11008) + 128 * 32000 * 4 * 2 + 0.2 * GIB
    assert cap.reserved_bytes == pytest.approx(reserved)
    blocks = math.floor((0.9 * 0.99 * 80 * GIB - 13_476_831_232 - reserved) / (16 * 524_288))
    assert cap.kv_blocks == blocks
    assert cap.kv_tokens == 16 * blocks and cap.block_size == 16
    assert abs(cap.kv_blocks / 7463 - 1) < 0.02
    # vLLM's default profiling run (8192 tokens, 256 sequences) is also within 2 %
    assert abs(capacity(load_model("llama-2-7b-hf"), H100, 1).kv_blocks / 7463 - 1) < 0.02


def test_block_size_and_utilization_scale_as_vllm():
    spec = load_model("llama-2-7b-hf")
    a = capacity(spec, H100, 1)
    b = capacity(spec, H100, 1, block_size=32)
    assert b.kv_blocks == a.kv_blocks // 2 and abs(b.kv_tokens - a.kv_tokens) < 32
    c = capacity(spec, H100, 1, gpu_memory_utilization=0.5)
    assert c.available_bytes == pytest.approx(a.available_bytes - 0.4 * 0.99 * 80 * GIB)


def test_sampler_uses_the_same_definition():
    for model, tp in (("llama-2-7b-hf", 1), ("llama-2-70b-hf", 4), ("mixtral-8x7b-v0.1", 2)):
        spec = load_model(model)
        assert kv_capacity_tokens(spec, H100, tp) == capacity(spec, H100, tp).kv_tokens


# ------------------------------------------------------------------------------------------
# batch and fits


def test_max_batch_rounds_each_sequence_to_blocks():
    cap = capacity(load_model("llama-2-7b-hf"), H100, 1)
    assert max_batch(cap, 4096) == cap.kv_blocks // 256
    assert max_batch(cap, 4097) == cap.kv_blocks // 257
    assert max_batch(cap, 1) == cap.kv_blocks
    with pytest.raises(RoofcalError, match="context"):
        max_batch(cap, 0)


def test_fits_counts_whole_blocks_per_sequence_and_max_num_seqs():
    from roofcal.physics.capacity import kv_blocks_needed, sequences
    cap = capacity(load_model("llama-2-7b-hf"), H100, 1)
    steps = [Step(((100, 0), (50, 200)), (10, 20)),      # ⌈100/16⌉ + ⌈250/16⌉ + ⌈11/16⌉ + ⌈21/16⌉ = 7 + 16 + 1 + 2
             Step((), tuple([4000] * 40)),               # 40 · ⌈4001/16⌉ = 40 · 251 = 10,040 > 7,467 blocks
             Step((), (0,) * 200)]                       # 200 one-token decodes: 200 blocks (not 200/16)
    b = batch_steps(steps)
    assert kv_blocks_needed(b, 16).tolist() == [26, 10_040, 200]
    assert sequences(b).tolist() == [4, 40, 200]
    assert fits(cap, b).tolist() == [True, False, True]
    # one-token decodes at the block limit: whole blocks, not tokens, run out
    n = cap.kv_blocks + 1
    many = batch_steps([Step((), (0,) * min(n, 300))])
    assert kv_blocks_needed(many, 16).tolist() == [min(n, 300)]
    # more sequences than max_num_seqs (256 by default; here 128) do not run as one step
    small = capacity(load_model("llama-2-7b-hf"), H100, 1, max_num_seqs=128)
    assert small.max_num_seqs == 128
    assert fits(small, batch_steps([Step((), (10,) * 128), Step((), (10,) * 129)])).tolist() == [True, False]


# ------------------------------------------------------------------------------------------
# bad input


@pytest.mark.parametrize("kwargs, match", [
    (dict(tp=3), "does not divide"),                              # 32 heads
    (dict(tp=0), "positive integer"),
    (dict(gpu_memory_utilization=0.0), r"\(0, 1\]"),
    (dict(gpu_memory_utilization=1.2), r"\(0, 1\]"),
    (dict(block_size=0), "block-size"),
    (dict(kv_dtype="int3"), "kv-dtype"),
    (dict(model="llama-2-70b-hf"), "does not fit"),               # 129 GB of weights on one GPU
])
def test_bad_input_is_one_line_roofcal_error(kwargs, match):
    args = dict(model="llama-2-7b-hf", tp=1)
    args.update(kwargs)
    spec = load_model(args.pop("model"))
    with pytest.raises(RoofcalError, match=match) as e:
        capacity(spec, H100, **args)
    assert "\n" not in str(e.value)
    assert capacity(load_model("llama-2-7b-hf"), H100, 1, gpu_memory_utilization=1.0).kv_blocks > 0


def test_cli_capacity_prints_a_table(capsys):
    from roofcal.cli import capacity as cli
    p = argparse.ArgumentParser()
    cli.register(p.add_subparsers())
    a = p.parse_args(["capacity", "--model", "llama-2-7b-hf", "--gpu", "h100_sxm", "--tp", "1",
                      "--max-num-batched-tokens", "2048", "--max-num-seqs", "128", "--context", "4096"])
    a.func(a)
    out = capsys.readouterr().out
    cap = capacity(load_model("llama-2-7b-hf"), H100, 1, **LOG_SERVER)
    assert "524288" in out and str(cap.kv_blocks) in out and str(cap.kv_tokens) in out
    assert f"| {max_batch(cap, 4096)} " in out and "12.55" in out


def test_assumptions_name_the_memory_share_applied():
    # the notes listed 0.99 × 80 GiB but not the 0.9 vLLM takes of it; now every factor applied
    # is named, and the KV cache's GiB is the arithmetic of the notes
    from roofcal.cli.capacity import capacity_text
    spec = load_model("llama-2-7b-hf")
    for util in (0.9, 0.75):
        cap = capacity(spec, H100, 1, gpu_memory_utilization=util)
        notes = "\n".join(cap.notes)
        usable = util * 0.99 * 80
        assert f"of which vLLM takes gpu_memory_utilization {util:g}: {usable:.2f} GiB" in notes
        assert f"= {cap.available_bytes / GIB:.2f} GiB, in blocks of 16 tokens" in notes
    text = capacity_text("llama-2-7b-hf", "h100_sxm", 1, gpu_memory_utilization=0.75)
    assert "gpu_memory_utilization 0.75" in text

"""Quantised checkpoints: modules left unquantised, the router GEMM, FP8 activations.

Every expected number is derived by hand from the bundled configs (Llama-4-Scout FP8-dynamic:
hidden 5120, 40 heads / 8 KV heads of 128, 48 layers all MoE, 16 experts of 8192, top-1, one
shared expert of 8192, vocabulary 202,048; compressed-tensors W8A8: FP8 per-channel weights,
dynamic per-token FP8 activations; ``ignore`` lists every language layer's q/k/v/o_proj and
feed_forward.router, and lm_head).
"""

import pytest

from roofcal.physics import components as C
from roofcal.physics.capacity import weights_bytes_per_gpu
from roofcal.physics.config import load_model, parse_config
from roofcal.physics.decompose import step_ops, weight_bytes_per_gpu
from roofcal.physics.steps import Step, batch_steps, step_totals

SCOUT = "llama-4-scout-17b-16e-instruct-fp8-dynamic"


def ops_of(model, tp, step):
    return step_ops(model, tp, step_totals(batch_steps([step])))


def f(x):
    return float(x[0]) if getattr(x, "shape", ()) else float(x)


# ------------------------------------------------------------------------------------------
# parsing: which modules run unquantised, and how activations are quantised


def test_scout_ignore_list_and_activation_scheme():
    m = load_model(SCOUT)
    assert m.weight_dtype == "fp8" and m.weight_bytes == 1.0
    # q/k/v/o_proj and the router of all 48 language layers are in `ignore`; experts and the
    # shared expert are not
    assert m.unquantized == ("qkv_proj", "o_proj", "router")
    assert m.act_quant == "token"


def test_bf16_models_have_nothing_unquantised_or_quantised():
    for name in ("llama-2-70b-hf", "mixtral-8x7b-v0.1", "deepseek-v2-lite", "qwen3-30b-a3b"):
        m = load_model(name)
        assert (m.unquantized, m.act_quant) == ((), ""), name
        assert not any(m.is_quantized(c) for c in ("qkv_proj", "moe", "router")), name


def test_block_fp8_is_per_token_group_and_its_router_unquantised():
    glm = load_model("glm-5.2-fp8")                # quant_method fp8, weight_block_size [128, 128]
    assert glm.act_quant == "group"
    assert glm.unquantized == ("router",)          # vLLM builds GLM / DeepSeek gates unquantised


BASE = {"model_type": "qwen3_moe", "num_hidden_layers": 4, "hidden_size": 256,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
        "intermediate_size": 512, "moe_intermediate_size": 128, "num_experts": 8,
        "num_experts_per_tok": 2, "vocab_size": 1000}


def ct(ignore, strategy="token"):
    """A compressed-tensors W8A8 FP8 config with ``ignore``."""
    return {"quant_method": "compressed-tensors", "ignore": ignore, "config_groups": {"group_0": {
        "weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
        "input_activations": {"num_bits": 8, "type": "float", "strategy": strategy,
                              "dynamic": True}, "targets": ["Linear"]}}}


def test_regex_ignore_entries():
    # "re:" entries are regexes matched from the start of the module name (vLLM re.match)
    m = parse_config({**BASE, "quantization_config": ct(["re:.*self_attn.*", "lm_head"])}, "c.json")
    assert m.unquantized == ("qkv_proj", "o_proj")
    # qwen3_moe's router is quantised unless ignored (vLLM passes quant_config to its gate)
    assert not {"router", "moe"} & set(m.unquantized)
    m = parse_config({**BASE, "quantization_config": ct(["re:.*mlp.gate$"])}, "c.json")
    assert m.unquantized == ("router",)            # mlp.gate, not mlp.gate_proj nor experts
    m = parse_config({**BASE, "quantization_config": ct(["re:.*o_proj"])}, "c.json")
    assert m.unquantized == ("o_proj",)
    # not anchored at the end but at the start: "self_attn" alone matches no module name
    m = parse_config({**BASE, "quantization_config": ct(["re:self_attn"])}, "c.json")
    assert m.unquantized == ()


def test_exact_ignore_entries_need_every_layer_and_every_shard():
    names = [f"model.layers.{i}.self_attn.{p}_proj" for i in range(4) for p in "qkv"]
    m = parse_config({**BASE, "quantization_config": ct(names)}, "c.json")
    assert m.unquantized == ("qkv_proj",)
    # layer 3 missing → QKV stays quantised in the step (one variant per component)
    m = parse_config({**BASE, "quantization_config": ct(names[:-3])}, "c.json")
    assert m.unquantized == ()
    # q and k but not v: vLLM refuses mixed shards; roofcal keeps the fused GEMM quantised
    m = parse_config({**BASE, "quantization_config": ct([n for n in names if "v_proj" not in n])},
                     "c.json")
    assert m.unquantized == ()
    # a multimodal wrapper's names (language_model.model.layers.i...) are recognised too
    mm = [n.replace("model.layers", "language_model.model.layers") for n in names]
    assert parse_config({**BASE, "quantization_config": ct(mm)}, "c.json").unquantized == ("qkv_proj",)


def test_modules_to_not_convert_is_a_substring_for_awq_and_exact_for_fp8():
    awq = parse_config({**BASE, "quantization_config": {"quant_method": "awq", "bits": 4,
                                                        "modules_to_not_convert": ["self_attn"]}},
                       "a.json")
    assert awq.unquantized == ("qkv_proj", "o_proj") and awq.act_quant == ""   # weight-only
    fp8 = parse_config({**BASE, "quantization_config": {"quant_method": "fp8",
                                                        "modules_to_not_convert": ["self_attn"]}},
                       "f.json")
    assert fp8.unquantized == ()                   # fp8: equal names only
    assert fp8.act_quant == "tensor"


# ------------------------------------------------------------------------------------------
# the step: Scout FP8 at TP 2, 64 decodes


@pytest.fixture(scope="module")
def scout_ops():
    return ops_of(load_model(SCOUT), 2, Step(decode=(1000,) * 64))


def test_scout_ignored_projections_are_bf16_gemms(scout_ops):
    # per GPU: 20 heads, 4 KV heads of 128 → QKV n = 2560 + 512 + 512 = 3584, O k = 2560
    qkv, o = scout_ops["qkv_proj"], scout_ops["o_proj"]
    assert (qkv.kind, qkv.variant, o.variant) == ("gemm", "bf16", "bf16")
    assert [f(x) for x in qkv.work.shape] == [64, 3584, 5120, 0]
    # bytes: x 64·5120·2 + W 5120·3584·2 + y 64·3584·2 = 655,360 + 36,700,160 + 458,752
    assert f(qkv.work.bytes) == 37_814_272
    # O: 64·2560·2 + 2560·5120·2 + 64·5120·2 = 327,680 + 26,214,400 + 655,360
    assert f(o.work.bytes) == 27_197_440
    assert qkv.count == o.count == 48


def test_scout_router_is_its_own_bf16_gemm(scout_ops):
    r = scout_ops["router"]
    assert (r.kind, r.variant, r.count) == ("gemm", "bf16", 48)
    # replicated: m = 64 tokens, n = 16 experts, k = 5120 → 2·64·16·5120 FLOPs;
    # bytes 64·5120·2 + 5120·16·2 + 64·16·2 = 655,360 + 163,840 + 2,048
    assert f(r.work.flops) == 10_485_760
    assert f(r.work.bytes) == 821_248
    # the MoE call keeps only the experts' FLOPs: 64 pairs · 2·5120·4096·3
    assert f(scout_ops["moe"].work.flops) == 64 * 2 * 5120 * 4096 * 3
    assert scout_ops["moe"].variant == "fp8"


def test_scout_shared_expert_reads_fp8_activations(scout_ops):
    up, down = scout_ops["shared_up"], scout_ops["shared_down"]
    assert up.variant == down.variant == "fp8"
    # gate/up n = 2·4096, k = 5120: x 64·5120·1 + W 5120·8192·1 + y 64·8192·2
    assert f(up.work.bytes) == 327_680 + 41_943_040 + 1_048_576
    # down n = 5120, k = 4096: x 64·4096·1 + W 4096·5120·1 + y 64·5120·2
    assert f(down.work.bytes) == 262_144 + 20_971_520 + 655_360
    # a CUTLASS FP8 GEMM: 64 tokens fill the 64-row tile of configuration 3 exactly, n = 5120
    # whole 64-col tiles
    assert f(down.work.flops) == 2 * 64 * 5120 * 4096 and f(down.work.shape[3]) == 3


def test_scout_elementwise_has_no_quantisation_term(scout_ops):
    # the FP8 GEMM rows the correction is fitted on time vLLM's linear layer with its input
    # quantisation, so the step adds no kernel of its own for it: per token and layer
    # 10·5120 + 3·4096 (shared-expert activation, 8192/2) + 2·(2560 + 512) = 69,632 elements
    e = scout_ops["elementwise"]
    assert f(e.work.bytes) == 64 * 69_632 * 2


def test_glm_block_fp8_quantises_every_gemm_input_but_the_router():
    glm = load_model("glm-5.2-fp8")
    ops = ops_of(glm, 8, Step(decode=(100,)))
    assert ops["router"].variant == "bf16" and ops["qkv_proj"].variant == "fp8_block"
    # the GEMM reads 1-byte activations: QKV bytes at m = 1 = 6144·1 + W + n·2
    qkv = ops["qkv_proj"].work
    n, k = (f(x) for x in qkv.shape[1:3])
    assert f(qkv.bytes) == k * 1 + k * n * 1 + n * 2


# ------------------------------------------------------------------------------------------
# unquantised models: unchanged GEMMs, the router split out of the MoE call


def test_mixtral_router_split_keeps_total_flops():
    m = load_model("mixtral-8x7b-v0.1")
    ops = ops_of(m, 2, Step(decode=(10, 20, 30)))
    r, moe = ops["router"], ops["moe"]
    assert (r.variant, r.count, [f(x) for x in r.work.shape]) == ("bf16", 32, [3, 8, 4096, 0])
    # 3 tokens, top-2, balanced at TP 2: 6 pairs · 2·4096·7168·3 = 1,056,964,608 in the MoE call;
    # the router's 2·3·4096·8 = 196,608 FLOPs, which the MoE call used to count, are now its own
    assert f(moe.work.flops) == 6 * 2 * 4096 * 7168 * 3 == 1_056_964_608
    assert f(r.work.flops) == 2 * 3 * 4096 * 8 == 196_608
    # the router's bytes are new: x 3·4096·2 + W 4096·8·2 + logits 3·8·2
    assert f(r.work.bytes) == 24_576 + 65_536 + 48
    assert f(ops["elementwise"].work.bytes) == f(C.elementwise(3.0, 4096.0, 0.0, 16 * 128, 4 * 128).bytes)


def test_dense_bf16_step_unchanged_by_quantisation_support():
    # Llama-2-70B TP 4, one decode: every GEMM bf16 with 2-byte inputs and weights, as before
    m = load_model("llama-2-70b-hf")
    ops = ops_of(m, 4, Step(decode=(1000,)))
    assert "router" not in ops
    assert {c.variant for c in ops.values() if c.kind == "gemm"} == {"bf16"}
    up = ops["mlp_up"].work                        # gate + up: n = 2·28672/4 = 14336
    assert f(up.bytes) == 8192 * 2 + 8192 * 14336 * 2 + 14336 * 2


# ------------------------------------------------------------------------------------------
# weights per GPU


def test_scout_weights_ignored_projections_in_bf16():
    m, tp = load_model(SCOUT), 2
    d, L, E, I, V = 5120, 48, 16, 8192, 202048
    qkv, o = d * (20 * 128 + 4 * 256), 20 * 128 * d           # 18,350,080 + 13,107,200 per layer
    experts, shared = E * 3 * d * I // tp, 3 * d * I // tp
    fp8 = L * (experts + shared)                              # 1 byte per weight
    bf16 = L * (qkv + o) + V // tp * d * 2 + L * d * E + L * 2 * d + d   # 2 bytes
    assert weights_bytes_per_gpu(m, tp) == fp8 + 2 * bf16
    # 1,509,949,440 bytes more than with FP8 QKV / O
    assert L * (qkv + o) == 1_509_949_440
    assert weight_bytes_per_gpu(m, tp) == fp8 + 2 * L * (qkv + o) + V // tp * d * 2

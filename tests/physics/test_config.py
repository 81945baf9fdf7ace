"""Model config parsing: every bundled config, each model family's fields, and refusals."""

import json

import pytest

from roofcal.physics.config import bundled_models, check_tp, load_model, parse_config
from roofcal.errors import RoofcalError


def test_every_bundled_config_parses():
    names = bundled_models()
    assert len(names) == 18
    for name in names:
        m = load_model(name)
        assert m.num_layers > 0 and m.hidden > 0 and m.head_dim > 0


def test_large_moe_models_served_with_data_and_expert_parallelism():
    # (layers, dense layers, routed experts, top-k, shared width, GEMM format, MLA), from their configs
    want = {"deepseek-v3": (61, 3, 256, 8, 2048, "fp8_block", True),
            "kimi-k2-instruct": (61, 1, 384, 8, 2048, "fp8_block", True),
            "llama-4-maverick-17b-128e-instruct": (48, 24, 128, 1, 8192, "bf16", False),
            "qwen3-235b-a22b": (94, 0, 128, 8, 0, "bf16", False)}
    for name, fields in want.items():
        m = load_model(name)
        assert (m.num_layers, m.num_dense_layers, m.num_experts, m.experts_per_tok, m.shared_intermediate,
                m.weight_dtype, m.is_mla) == fields, name


def test_llama2_7b_fields():
    m = load_model("llama-2-7b-hf")
    assert (m.num_layers, m.hidden, m.num_heads, m.num_kv_heads, m.head_dim) == (32, 4096, 32, 32, 128)
    assert (m.intermediate, m.vocab_size, m.gated_mlp, m.act_bytes) == (11008, 32000, True, 2.0)
    assert not m.is_moe and m.num_dense_layers == 32


def test_gqa_and_head_dim_override():
    assert load_model("llama-3.1-70b-instruct").num_kv_heads == 8
    nemo = load_model("mistral-nemo-instruct-2407")          # head_dim 128 although 5120/32 = 160
    assert nemo.head_dim == 128
    assert load_model("qwen3-30b-a3b").head_dim == 128        # 2048/32 = 64 but head_dim given


def test_moe_layouts():
    mix = load_model("mixtral-8x7b-v0.1")
    assert (mix.num_experts, mix.experts_per_tok, mix.moe_intermediate, mix.num_moe_layers) == (8, 2, 14336, 32)
    ds = load_model("deepseek-v2-lite")                       # first_k_dense_replace = 1, 2 shared
    assert (ds.num_moe_layers, ds.num_dense_layers, ds.shared_intermediate) == (26, 1, 2 * 1408)
    assert ds.intermediate == 10944
    scout = load_model("llama-4-scout-17b-16e-instruct-fp8-dynamic")
    # interleave step 1 → every layer MoE (HF/vLLM semantics), one shared expert of 8192
    assert (scout.num_moe_layers, scout.moe_intermediate, scout.shared_intermediate) == (48, 8192, 8192)
    assert (scout.weight_bytes, scout.weight_dtype) == (1.0, "fp8")   # compressed-tensors 8-bit
    glm = load_model("glm-5.2-fp8")
    assert (glm.num_moe_layers, glm.weight_dtype) == (75, "fp8_block")


def test_interleave_step_two_is_every_other_layer():
    cfg = {"model_type": "llama4_text", "num_hidden_layers": 48, "hidden_size": 5120,
           "num_attention_heads": 40, "num_key_value_heads": 8, "intermediate_size": 8192,
           "intermediate_size_mlp": 16384, "vocab_size": 202048, "num_local_experts": 128,
           "num_experts_per_tok": 1, "interleave_moe_layer_step": 2}
    m = parse_config(cfg, "maverick.json")
    assert (m.num_moe_layers, m.num_dense_layers, m.intermediate) == (24, 24, 16384)


def test_mla_kv_is_the_latent():
    ds = load_model("deepseek-v2-lite")
    assert ds.is_mla and ds.kv_elems_per_token_layer == 512 + 64
    assert (ds.head_dim, ds.v_dim) == (192, 128)


def test_text_config_nesting_takes_precedence():
    raw = {"model_type": "x", "num_hidden_layers": 2, "text_config": {
        "num_hidden_layers": 48, "hidden_size": 5120, "num_attention_heads": 40,
        "intermediate_size": 8192, "vocab_size": 1000}}
    assert parse_config(raw, "c.json").num_layers == 48


def test_gpt2_style_fields_and_plain_mlp():
    gpt2 = {"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12, "n_inner": None,
            "vocab_size": 50257, "activation_function": "gelu_new", "tie_word_embeddings": True}
    m = parse_config(gpt2, "gpt2/config.json")
    assert (m.num_layers, m.hidden, m.num_heads, m.head_dim, m.intermediate) == (12, 768, 12, 64, 3072)
    assert m.gated_mlp is False and m.mlp_matrices == 2 and m.tie_word_embeddings
    bloom = {"model_type": "bloom", "n_layer": 24, "n_embed": 1024, "n_head": 16,
             "vocab_size": 250880}
    b = parse_config(bloom, "bloom/config.json")
    assert (b.hidden, b.intermediate, b.gated_mlp) == (1024, 4096, False)


def test_quantization_bits():
    base = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
            "intermediate_size": 128, "vocab_size": 10}
    awq = parse_config({**base, "quantization_config": {"quant_method": "awq", "bits": 4}}, "a.json")
    assert (awq.weight_bytes, awq.weight_dtype) == (0.5, "int4")
    fp8 = parse_config({**base, "quantization_config": {"quant_method": "fp8"}}, "f.json")
    assert (fp8.weight_bytes, fp8.weight_dtype) == (1.0, "fp8")
    named = parse_config(base, "x.json", name="llama-w4a16")
    assert named.weight_bytes == 0.5


@pytest.mark.parametrize("patch, field", [
    ({"n_layer": 30}, "num_hidden_layers"),                       # contradicts num_hidden_layers
    ({"torch_dtype": "float12"}, "torch_dtype"),
    ({"num_key_value_heads": 3}, "num_key_value_heads"),
    ({"hidden_size": None}, "hidden_size"),
    ({"num_local_experts": 8, "num_experts_per_tok": 9}, "num_experts_per_tok"),
    ({"num_hidden_layers": 2.5}, "num_hidden_layers"),
    ({"quantization_config": {"quant_method": "gptq", "bits": 3}}, "quantization_config"),
])
def test_bad_fields_are_named(patch, field):
    raw = json.load(open("model_configs/llama-2-7b-hf/config.json"))
    raw.update(patch)
    with pytest.raises(RoofcalError, match=field) as e:
        parse_config(raw, "bad/config.json")
    assert "bad/config.json" in str(e.value) and "\n" not in str(e.value)


def test_invalid_json_names_file(tmp_path):
    p = tmp_path / "config.json"
    p.write_text('{"num_hidden_layers": 2,,}')
    with pytest.raises(RoofcalError, match=r"config.json: invalid JSON at line 1"):
        load_model(p)


def test_unknown_model_lists_bundled():
    with pytest.raises(RoofcalError, match="llama-2-7b-hf"):
        load_model("no-such-model")


def test_tp_rules():
    m = load_model("qwen2.5-7b-instruct")      # 28 heads, 4 KV heads
    check_tp(m, 4)
    with pytest.raises(RoofcalError, match="num_attention_heads=28"):
        check_tp(m, 8)
    check_tp(load_model("llama-2-70b-hf"), 8)  # 8 KV heads split one per GPU
    with pytest.raises(RoofcalError, match="positive"):
        check_tp(m, 0)


def test_a_model_remembers_its_config_for_reloading(tmp_path):
    assert load_model("llama-2-7b-hf").ref == "llama-2-7b-hf"
    folder = tmp_path / "my-llama"
    folder.mkdir()
    (folder / "config.json").write_text(open("model_configs/llama-2-7b-hf/config.json").read())
    m = load_model(folder)
    assert m.ref == str((folder / "config.json").resolve())
    assert load_model(m.ref) == m and m.name == "my-llama"

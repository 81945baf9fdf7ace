"""One vLLM step of a model at TP degree ``tp`` → the kernel calls it is made of.

For every layer vLLM runs: the QKV projection, attention (one prefill and one decode call), the
output projection, an all-reduce (TP > 1), the MLP (dense GEMMs, or the fused MoE kernel plus any
shared expert) and a second all-reduce; around them memory-bound elementwise kernels. The LM head
runs once per step on the sequences that sample. All GEMMs of a step see every token (prefill and
decode tokens are fused), so ``m`` is the step's token count.

Per-GPU sizes follow Megatron-style TP as in vLLM: QKV / gate-up column-split, O / down row-split,
KV heads split (replicated when fewer than TP), MLA latent KV replicated, vocabulary split.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from roofcal.physics import components as C
from roofcal.physics.config import ModelSpec, kv_heads_per_gpu
from roofcal.physics.steps import StepTotals


class OpCall(NamedTuple):
    """A kernel of the step: its correction key (``kind``, ``variant``), work and calls per step."""

    kind: str
    variant: str
    work: C.Work
    count: float


def attention_dims(model: ModelSpec, tp: int) -> dict:
    """Per-GPU attention sizes: heads, kv heads, qk / v head dims, KV elements per token-layer."""
    heads = model.num_heads // tp
    if model.is_mla:
        # decode and prefill both read the replicated latent cache (kv_lora_rank + rope dims)
        return dict(heads=heads, kv_heads=1, qk_dim=model.head_dim, v_dim=model.v_dim,
                    kv_elems=model.kv_elems_per_token_layer)
    kvh = kv_heads_per_gpu(model, tp)
    return dict(heads=heads, kv_heads=kvh, qk_dim=model.head_dim, v_dim=model.v_dim,
                kv_elems=kvh * (model.head_dim + model.v_dim))


def gemm_variant(model: ModelSpec) -> str:
    return model.weight_dtype


def kv_variant(model: ModelSpec) -> str:
    return "fp8" if model.kv_bytes == 1.0 else "bf16"


def step_ops(model: ModelSpec, tp: int, t: StepTotals) -> dict[str, OpCall]:
    """The kernel calls of one step, keyed by component name (the breakdown's columns)."""
    L, d = model.num_layers, model.hidden
    ab, wb = model.act_bytes, model.weight_bytes
    a = attention_dims(model, tp)
    tokens = t.tokens
    gv = gemm_variant(model)
    q_width = a["heads"] * a["qk_dim"]
    kv_width = a["kv_heads"] * a["qk_dim"]
    qkv_n = q_width + kv_width + a["kv_heads"] * a["v_dim"]
    ops = {
        "qkv_proj": OpCall("gemm", gv, C.gemm(tokens, qkv_n, d, ab, wb, ab), L),
        "attn_prefill": OpCall("attn_prefill", kv_variant(model), C.prefill_attention(
            t.n_prefill, t.prefill_tokens, t.pairs, t.prefill_cached_tokens, a["heads"],
            a["kv_heads"], a["qk_dim"], a["v_dim"], a["kv_elems"], ab, model.kv_bytes), L),
        "attn_decode": OpCall("attn_decode", kv_variant(model), C.decode_attention(
            t.n_decode, t.decode_kv_tokens, a["heads"], a["kv_heads"], a["qk_dim"], a["v_dim"],
            a["kv_elems"], ab, model.kv_bytes), L),
        "o_proj": OpCall("gemm", gv, C.gemm(tokens, d, a["heads"] * a["v_dim"], ab, wb, ab), L),
    }
    def mlp(prefix: str, width: float, layers: int) -> None:
        """A TP-split MLP: (gate+)up column-split, down row-split, ``width`` per GPU."""
        up = (model.mlp_matrices - 1) * width
        ops[f"{prefix}_up"] = OpCall("gemm", gv, C.gemm(tokens, up, d, ab, wb, ab), layers)
        ops[f"{prefix}_down"] = OpCall("gemm", gv, C.gemm(tokens, d, width, ab, wb, ab), layers)

    if model.num_dense_layers:
        mlp("mlp", model.intermediate / tp, model.num_dense_layers)
    if model.is_moe:
        ops["moe"] = OpCall("moe", gv, C.moe(tokens, d, model.moe_intermediate,
                                              model.experts_per_tok, model.num_experts, tp, 1.0,
                                              wb, ab, model.mlp_matrices), model.num_moe_layers)
        if model.shared_intermediate:
            mlp("shared", model.shared_intermediate / tp, model.num_moe_layers)
    # the LM head runs in the activation dtype (vLLM keeps it unquantised)
    ops["lm_head"] = OpCall("gemm", "bf16", C.gemm(t.n_prefill + t.n_decode,
                                                   math.ceil(model.vocab_size / tp), d, ab, ab, 4.0), 1)
    if tp > 1:
        ops["allreduce"] = OpCall("allreduce", "custom", C.allreduce(
            float(tp), tokens * d * ab), 2 * L)
    mean_inter = (model.num_dense_layers * model.intermediate
                  + model.num_moe_layers * model.shared_intermediate) / (L * tp)
    ops["elementwise"] = OpCall("elementwise", "bf16", C.elementwise(
        tokens, float(d), mean_inter, q_width, kv_width, ab, model.gated_mlp), L)
    return ops


def weight_bytes_per_gpu(model: ModelSpec, tp: int) -> float:
    """Bytes of weights one GPU holds for the transformer layers and LM head (embedding excluded).

    Example: Llama-2-7B at TP 1: per layer 4·4096² (QKV, O) + 3·4096·11008 (MLP) = 202,375,168
    parameters, ×32 layers + 32000·4096 LM head = 6,607,077,376 parameters = 13.2 GB in fp16.
    """
    a = attention_dims(model, tp)
    d = model.hidden
    attn = d * (a["heads"] * a["qk_dim"] + a["kv_heads"] * (a["qk_dim"] + a["v_dim"])) \
        + a["heads"] * a["v_dim"] * d
    dense = model.mlp_matrices * d * model.intermediate / tp
    moe = model.num_experts * model.mlp_matrices * d * model.moe_intermediate / tp \
        + model.mlp_matrices * d * model.shared_intermediate / tp
    layers = model.num_layers * attn + model.num_dense_layers * dense + model.num_moe_layers * moe
    lm_head = math.ceil(model.vocab_size / tp) * d
    return layers * model.weight_bytes + lm_head * model.act_bytes

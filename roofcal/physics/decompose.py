"""One vLLM step of a model at TP degree ``tp`` → the kernel calls it is made of.

For every layer vLLM runs: the QKV projection, attention (one prefill and one decode call), the
output projection, an all-reduce (TP > 1), the MLP (dense GEMMs, or the router GEMM, the fused MoE
kernel and any shared expert) and a second all-reduce; around them memory-bound elementwise
kernels. The LM head runs once per step on the sequences that sample. All GEMMs of a step see
every token (prefill and decode tokens are fused), so ``m`` is the step's token count.

Per-GPU sizes follow Megatron-style TP as in vLLM: QKV / gate-up column-split, O / down row-split,
KV heads split (replicated when fewer than TP), MLA latent KV replicated, vocabulary split, router
replicated.

Data- and expert-parallel deployments (``model.parallel``, :class:`~roofcal.physics.config.Parallel`):
a step row is the whole deployment's batch, its sequences dealt out evenly over the ``dp`` ranks;
the step lasts as long as the busiest rank's (:func:`busiest_rank`: ⌈n/dp⌉ of the n prefill and
of the n decode sequences, each its phase's mean), because every MoE layer waits for all ranks.
Attention, the dense projections, the router, shared experts, the LM head and the TP all-reduce
run on that rank's tokens; the routed experts on the tokens of all ranks, split over all dp·TP
GPUs (whole experts with expert parallelism, else each expert's FFN), after a dispatch and before
a combine between ranks (:func:`moe_exchange`). At ``dp = 1`` without expert parallelism the step
is the TP step, call for call.

Quantised checkpoints (:func:`linear_format`): a GEMM runs in the weight format (variant
``weight_dtype``, ``weight_bytes`` per weight) unless the checkpoint leaves it unquantised
(``ModelSpec.unquantized``, from ``quantization_config.ignore`` and the like): then it is a bf16
GEMM with 2-byte weights. A W8A8 GEMM reads its input as FP8 (1 byte per element), which a
quantisation kernel wrote from the bf16 activations just before. That kernel is not a call of
its own here: the per-op FP8 GEMM rows the GEMM correction is fitted on time vLLM's whole
linear-layer forward (aiconfigurator's collector calls the layer: input quantisation, then the
GEMM), so the fitted FP8 GEMM time holds it — at m = 32 an FP8 GEMM row takes 14–32 µs where
bf16 takes 6.5 µs. The fused MoE kernel likewise quantises its own inputs inside the call.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax.numpy as jnp

from roofcal.physics import components as C
from roofcal.physics.config import ACT_QUANT_BYTES, ModelSpec, Parallel, kv_heads_per_gpu
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


def linear_format(model: ModelSpec, component: str) -> tuple[str, float, float]:
    """(GEMM variant, bytes per weight, bytes per input element) of a linear ``component``.

    Quantised (:meth:`ModelSpec.is_quantized`): the weight format, and input bytes 1 when
    activations are quantised to FP8 (W8A8, ``act_quant``), else the activation dtype's.
    Unquantised (bf16 checkpoint, or a module the checkpoint ignores): the activation dtype for
    all three, e.g. Llama-4-Scout FP8's QKV / O / router → ("bf16", 2.0, 2.0).
    """
    if not model.is_quantized(component):
        return model.plain_dtype, model.act_bytes, model.act_bytes
    act_in = ACT_QUANT_BYTES if model.act_quant else model.act_bytes
    return model.weight_dtype, model.weight_bytes, act_in


def kv_variant(model: ModelSpec) -> str:
    return "fp8" if model.kv_bytes == 1.0 else "bf16"


def busiest_rank(t: StepTotals, dp: int) -> StepTotals:
    """The totals of the busiest of ``dp`` data-parallel ranks when a step's sequences are dealt
    out evenly: ⌈n/dp⌉ of its n prefill sequences and ⌈n/dp⌉ of its n decode sequences, each
    carrying its phase's mean tokens, pairs and context. ``dp = 1``: ``t`` itself.

    Example: 8 decode sequences over 1,000 keys each and 2 prefill chunks of 100 new tokens on
    4 ranks: the busiest holds 2 decode sequences (2,000 keys) and 1 chunk (100 tokens).
    """
    if dp == 1:
        return t
    def share(n):
        return jnp.where(n > 0, jnp.ceil(n / dp) / jnp.maximum(n, 1.0), 0.0)
    fp, fd = share(t.n_prefill), share(t.n_decode)
    n_pf, n_dc = jnp.ceil(t.n_prefill / dp), jnp.ceil(t.n_decode / dp)
    pf_tok = t.prefill_tokens * fp
    return StepTotals(n_pf, n_dc, pf_tok, t.prefill_cached_tokens * fp, t.pairs * fp,
                      t.decode_kv_tokens * fd, pf_tok + n_dc)


def moe_exchange(model: ModelSpec, tp: int, all_tokens, rank_tokens) -> dict[str, OpCall]:
    """The calls that move an MoE layer's tokens between data-parallel ranks and back (one of
    each per MoE layer; none at ``dp = 1``, where every GPU of the rank already holds them).

    All-gather family (``naive``, ``allgather_reducescatter``): each of the rank's GPUs gathers
    the hidden states of every rank's tokens over its ``dp``-GPU group (buffer
    ``all_tokens``·hidden·act_bytes), and reduce-scatters the layer's outputs back (the same
    buffer). All-to-all family (expert parallelism): each GPU sends each of its rank's tokens to
    the ``top-k`` experts' GPUs of the dp·TP group and receives the outputs back, two all-to-alls
    of ``rank_tokens``·top-k·hidden·act_bytes (its own share stays). Priced from the NCCL tables
    (kinds ``allgather``, ``reducescatter``, ``alltoall``; DeepEP's and pplx's own kernels are not
    measured here).

    Example: DeepSeek-V3 (hidden 7,168, top-8) on 8 ranks of 1 GPU, 64 decode tokens per rank,
    an all-to-all: buffer 64·8·7,168·2 = 7,340,032 bytes, each GPU sends 7/8 of it.
    """
    par, d, ab = model.parallel, model.hidden, model.act_bytes
    if par.dp == 1:
        return {}
    if par.alltoall:
        buf = rank_tokens * model.experts_per_tok * d * ab
        g = float(par.dp * tp)
        return {"moe_dispatch": OpCall("alltoall", "nccl", C.collective("alltoall", g, buf),
                                       model.num_moe_layers),
                "moe_combine": OpCall("alltoall", "nccl", C.collective("alltoall", g, buf),
                                      model.num_moe_layers)}
    buf = all_tokens * d * ab
    g = float(par.dp)
    return {"moe_dispatch": OpCall("allgather", "nccl", C.collective("allgather", g, buf),
                                   model.num_moe_layers),
            "moe_combine": OpCall("reducescatter", "nccl", C.collective("reducescatter", g, buf),
                                  model.num_moe_layers)}


def step_ops(model: ModelSpec, tp: int, t: StepTotals) -> dict[str, OpCall]:
    """The kernel calls of one step, keyed by component name (the breakdown's columns); a data-
    parallel deployment's (``model.parallel``) are its busiest rank's (module docstring)."""
    par: Parallel = model.parallel
    all_tokens = t.tokens
    t = busiest_rank(t, par.dp)
    L, d = model.num_layers, model.hidden
    ab = model.act_bytes
    a = attention_dims(model, tp)
    tokens = t.tokens
    q_width = a["heads"] * a["qk_dim"]
    kv_width = a["kv_heads"] * a["qk_dim"]
    qkv_n = q_width + kv_width + a["kv_heads"] * a["v_dim"]

    def linear(name: str, n, k, layers) -> OpCall:
        """A GEMM of ``tokens`` × k · k × n in the format of component ``name``."""
        variant, w_bytes, in_bytes = linear_format(model, name)
        return OpCall("gemm", variant, C.gemm(tokens, n, k, in_bytes, w_bytes, ab, tiled=variant == "fp8"),
                      layers)

    ops = {
        "qkv_proj": linear("qkv_proj", qkv_n, d, L),
        "attn_prefill": OpCall("attn_prefill", kv_variant(model), C.prefill_attention(
            t.n_prefill, t.prefill_tokens, t.pairs, t.prefill_cached_tokens, a["heads"],
            a["kv_heads"], a["qk_dim"], a["v_dim"], a["kv_elems"], ab, model.kv_bytes), L),
        "attn_decode": OpCall("attn_decode", kv_variant(model), C.decode_attention(
            t.n_decode, t.decode_kv_tokens, a["heads"], a["kv_heads"], a["qk_dim"], a["v_dim"],
            a["kv_elems"], ab, model.kv_bytes), L),
        "o_proj": linear("o_proj", d, a["heads"] * a["v_dim"], L),
    }
    def mlp(prefix: str, width: float, layers: int) -> None:
        """A TP-split MLP: (gate+)up column-split, down row-split, ``width`` per GPU."""
        up = (model.mlp_matrices - 1) * width
        ops[f"{prefix}_up"] = linear(f"{prefix}_up", up, d, layers)
        ops[f"{prefix}_down"] = linear(f"{prefix}_down", d, width, layers)

    if model.num_dense_layers:
        mlp("mlp", model.intermediate / tp, model.num_dense_layers)
    if model.is_moe:
        # the router: tokens × hidden · hidden × experts, replicated on every GPU (vLLM's
        # ReplicatedLinear), logits written in the activation dtype
        ops["router"] = linear("router", model.num_experts, d, model.num_moe_layers)
        mv, mwb, _ = linear_format(model, "moe")
        # the routed experts over all dp·TP GPUs: whole experts (ep), else each FFN split
        group = par.dp * tp
        moe_tp, moe_ep = (1.0, float(group)) if par.ep else (group, 1.0)
        ops["moe"] = OpCall("moe", mv, C.moe(all_tokens, d, model.moe_intermediate,
                                              model.experts_per_tok, model.num_experts, moe_tp,
                                              moe_ep, mwb, ab, model.mlp_matrices),
                            model.num_moe_layers)
        ops.update(moe_exchange(model, tp, all_tokens, tokens))
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
    Each linear layer in its own format (:func:`linear_format`): the QKV / O projections a
    quantised checkpoint ignores take 2 bytes per weight. A data-parallel deployment
    (``model.parallel``) holds the attention, dense and shared-expert weights on every rank, and
    splits the routed experts over all its dp·TP GPUs.
    """
    a = attention_dims(model, tp)
    d, m = model.hidden, model.mlp_matrices
    wb = {c: linear_format(model, c)[1] for c in ("qkv_proj", "o_proj", "mlp_up", "mlp_down",
                                                 "shared_up", "shared_down", "moe")}
    qkv = d * (a["heads"] * a["qk_dim"] + a["kv_heads"] * (a["qk_dim"] + a["v_dim"]))
    o = a["heads"] * a["v_dim"] * d
    attn = qkv * wb["qkv_proj"] + o * wb["o_proj"]
    dense = ((m - 1) * wb["mlp_up"] + wb["mlp_down"]) * d * model.intermediate / tp
    # the routed experts are split over all dp·TP GPUs of a data-parallel deployment: whole
    # experts with expert parallelism (E/(dp·TP) each), else every expert's FFN
    moe = model.num_experts * m * d * model.moe_intermediate / (tp * model.parallel.dp) * wb["moe"] \
        + ((m - 1) * wb["shared_up"] + wb["shared_down"]) * d * model.shared_intermediate / tp
    layers = model.num_layers * attn + model.num_dense_layers * dense + model.num_moe_layers * moe
    lm_head = math.ceil(model.vocab_size / tp) * d
    return layers + lm_head * model.act_bytes

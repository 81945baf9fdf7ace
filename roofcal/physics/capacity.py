"""GPU memory capacity of a vLLM deployment: weights per GPU, KV bytes per token, KV blocks, batch.

vLLM sizes its KV cache once, at start-up, by profiling (facts from vLLM's ``Worker`` /
``MemoryProfilingResult``, memory-profiling PRs #2031, #10511 and #12126 of vllm-project/vllm)::

    requested  = gpu_memory_utilization × total GPU memory          (total as CUDA reports it)
    available  = requested − weights − PyTorch activation peak − non-torch memory
    KV blocks  = floor(available / (block_size × KV bytes per token per GPU))

Every term is per GPU (each TP rank holds its shard of the weights and its own KV cache of the same
number of blocks). This module computes each term from a :class:`ModelSpec`, a :class:`GPUSpec` and
the TP degree. The assumptions (constants below) and why:

* **Total memory as CUDA reports it** (:data:`CUDA_VISIBLE_FRACTION`): ``torch.cuda.mem_get_info``
  reports less than the datasheet's capacity (the driver keeps some). vLLM logs ``total_gpu_memory
  79.22GiB`` on an H100 80 GB (PRs #10511, #12126): 0.990 of 80 GiB; an A100 80 GB reports
  79.15 GiB (0.989). roofcal takes 0.99 × the datasheet's ``hbm_capacity_gib``.
* **Non-torch memory** (:data:`NON_TORCH_GIB`): memory taken outside PyTorch's allocator while
  loading and profiling (CUDA context growth, cuBLAS workspaces): 0.16 GiB (PR #12126 log, H100)
  and 0.20 GiB (PR #14447 log); roofcal reserves 0.2 GiB. At TP > 1 NCCL / custom all-reduce
  buffers can add more (one PR #10511 log showed 3.58 GiB at TP 2 in an older vLLM); not modelled.
* **PyTorch activation peak** (:func:`activation_peak_bytes`): the profiling run is one forward pass
  of ``max_num_batched_tokens`` tokens followed by a sampler run over ``max_num_seqs`` requests.
  Its peak is estimated as the tensors alive at the widest point of a layer (residual and hidden
  state, plus the MLP's gate/up output and activation output, or the fused-MoE intermediate
  caches, or the QKV / attention outputs) plus the sampler's FP32 logits and probabilities over
  the whole vocabulary.
* CUDA graphs are captured after the KV cache is allocated and are not deducted (vLLM's default).

**The check.** The only vLLM log at hand: Llama-2-7B, TP 1, H100, ``max_num_batched_tokens``
2048, ``max_num_seqs`` 128 (the bundled serving runs' server) → 7,463 GPU blocks of 16 tokens
(BLIS ``testdata/trained_physics_iter29.json``, inference-sim/inference-sim). Here: requested
0.9 × 0.99 × 80 = 71.28 GiB; weights 6,738,415,616 parameters × 2 B = 12.552 GiB (vLLM logs
"12.55 GiB"); activation peak 2048 × 2 B × (2·4096 + 2·11008 + 11008) = 0.157 GiB + sampler
128 × 32000 × 4 B × 2 = 0.031 GiB; non-torch 0.2 GiB; available 58.34 GiB; KV per token
32 layers × 2 × 4096 × 2 B = 512 KiB, a block 8 MiB → 7,467 blocks (+0.05 %). The whole reservation
beyond weights (0.39 GiB) matters little: with none at all the count is 7,517 (+0.7 %), and the
log implies 0.42 GiB. What the 2 % check really tests is the weights (embeddings included) and the
CUDA-visible total: the nominal 80 GiB alone would give 7,609 blocks (+2.0 %).

**Weights per GPU** follow vLLM's layer sharding: QKV / gate-up column-parallel and O / down
row-parallel (split by TP); KV heads split by TP and replicated when fewer than TP; the embedding
and the LM head vocab-parallel (vocabulary padded to a multiple of 64, then split; a tied LM head
is the embedding); routed experts split by TP (each expert's intermediate width sharded, vLLM's
default without expert parallelism); shared experts split; MoE router, norms and MLA's latent
down-projections replicated. Linear layers in the weight dtype, except those a quantised
checkpoint leaves unquantised (``quantization_config.ignore`` and the like, ``ModelSpec.unquantized``:
Llama-4-Scout FP8's QKV and O); embeddings, LM head, router and norms unquantised (activation
dtype). Quantisation scales and per-head q/k norms are ignored (< 0.1 %).

**KV bytes per token per GPU**: GQA / MHA / MQA: layers × KV heads per GPU × (K + V head dims) ×
KV bytes; MLA: layers × (kv_lora_rank + qk_rope_head_dim) × KV bytes, the latent replicated on
every rank. FP8 KV (``kv_dtype="fp8"``) stores 1 byte per element.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from roofcal.errors import RoofcalError
from roofcal.physics.config import DTYPE_BYTES, ModelSpec, check_tp, kv_heads_per_gpu
from roofcal.physics.hardware import GPUSpec

GIB = 2**30
#: share of the datasheet capacity CUDA reports as total memory (H100 80 GB: 79.22 GiB)
CUDA_VISIBLE_FRACTION = 0.99
#: memory vLLM's profiler finds taken outside PyTorch (CUDA context, cuBLAS workspaces), GiB
NON_TORCH_GIB = 0.2
#: vLLM pads the vocabulary of its vocab-parallel embedding and LM head to a multiple of this
VOCAB_PADDING = 64
#: bytes per element of the sampler's logits and probabilities (FP32)
SAMPLER_BYTES = 4.0
#: ``kv_dtype`` names vLLM accepts (besides ``auto`` = the model's dtype) → bytes per element
KV_DTYPES = {"fp8": 1.0, "fp8_e4m3": 1.0, "fp8_e5m2": 1.0, "fp8_inc": 1.0,
             "bfloat16": 2.0, "bf16": 2.0, "float16": 2.0, "fp16": 2.0, "half": 2.0,
             "float32": 4.0, "fp32": 4.0}
#: weight dtype names → bytes per linear-layer weight (4-bit formats: 0.5)
WEIGHT_DTYPES = {**DTYPE_BYTES, "fp8_block": 1.0, "int4": 0.5, "w4a16": 0.5, "awq": 0.5, "gptq": 0.5}


@dataclass(frozen=True)
class Capacity:
    """What one GPU of a TP group holds, as vLLM would size it.

    Bytes are per GPU. ``kv_tokens = kv_blocks × block_size`` tokens fit in the KV cache (summed
    over all sequences of a step, each rounded up to whole blocks). ``available_bytes`` is the memory
    left for the KV cache, ``reserved_bytes`` the activation peak plus non-torch memory deducted
    besides the weights. ``notes`` say what was assumed.
    """

    weights_bytes_per_gpu: int
    kv_bytes_per_token_per_gpu: int
    kv_blocks: int
    kv_tokens: int
    block_size: int
    notes: tuple[str, ...] = ()
    available_bytes: float = 0.0
    reserved_bytes: float = 0.0
    total_bytes: float = 0.0
    max_num_seqs: int = 256          # vLLM's limit on sequences in one step


# --------------------------------------------------------------------------------------------
# byte widths


def kv_dtype_bytes(model: ModelSpec, kv_dtype: str = "auto") -> float:
    """Bytes per KV-cache element: ``auto`` → the model's (its ``torch_dtype``); ``fp8`` → 1."""
    name = str(kv_dtype).lower()
    if name == "auto":
        return float(model.kv_bytes)
    if name not in KV_DTYPES:
        raise RoofcalError(f"--kv-dtype: unknown KV-cache dtype {kv_dtype!r} (auto, "
                           f"{', '.join(sorted(KV_DTYPES))})")
    return KV_DTYPES[name]


def weight_dtype_bytes(model: ModelSpec, weight_dtype: str | None = None) -> float:
    """Bytes per linear-layer weight: ``None`` → the model's (config / quantization_config)."""
    if weight_dtype is None:
        return float(model.weight_bytes)
    name = str(weight_dtype).lower()
    if name not in WEIGHT_DTYPES:
        raise RoofcalError(f"--weight-dtype: unknown weight dtype {weight_dtype!r} "
                           f"({', '.join(sorted(WEIGHT_DTYPES))})")
    return WEIGHT_DTYPES[name]


@lru_cache(maxsize=64)
def _raw_int(config_path: str, name: str) -> int:
    """An integer field of a config file (0 when absent or null); for fields ModelSpec lacks."""
    if not config_path:
        return 0
    try:
        with open(config_path, encoding="utf-8") as f:
            raw = json.load(f)
    except (OSError, ValueError):
        return 0
    raw = {**raw, **raw.get("text_config", {})} if isinstance(raw.get("text_config"), dict) else raw
    v = raw.get(name)
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0


def q_lora_rank(model: ModelSpec) -> int:
    """MLA query low-rank width (``q_lora_rank``; 0 = a direct query projection, as DeepSeek-V2-Lite).
    Not kept in :class:`ModelSpec`, so read from the model's config file."""
    return _raw_int(model.config_path, "q_lora_rank") if model.is_mla else 0


# --------------------------------------------------------------------------------------------
# parameters per GPU


def vocab_rows_per_gpu(model: ModelSpec, tp: int) -> int:
    """Rows of the vocab-parallel embedding (and LM head) one GPU holds: the vocabulary padded to a
    multiple of 64, split by TP. Llama-2: 32000 (already a multiple of 64) / 4 = 8000."""
    padded = math.ceil(model.vocab_size / VOCAB_PADDING) * VOCAB_PADDING
    return math.ceil(padded / tp)


def attention_params_per_gpu(model: ModelSpec, tp: int) -> tuple[int, int]:
    """(linear, replicated) attention parameters of one layer on one GPU.

    GQA: QKV ``d × (H/tp·qk + kvh·(qk + v))`` with kvh = KV heads per GPU (replicated below TP),
    O ``H/tp·v × d``. MLA: query ``d × H/tp·qk`` (or ``d × q_lora`` replicated + ``q_lora × H/tp·qk``),
    latent down-projection ``d × (kv_lora + rope)`` replicated, up-projection
    ``kv_lora × H/tp·(nope + v)``, O ``H/tp·v × d``; replicated norms of the latents (second item).
    Llama-2-7B TP 1: 4 · 4096² = 67,108,864 linear.
    """
    d, h = model.hidden, model.num_heads // tp
    qk, v = model.head_dim, model.v_dim
    if not model.is_mla:
        kvh = kv_heads_per_gpu(model, tp)
        return d * (h * qk + kvh * (qk + v)) + h * v * d, 0
    rope, lora, ql = model.qk_rope_head_dim, model.kv_lora_rank, q_lora_rank(model)
    nope = qk - rope
    q = d * ql + ql * h * qk if ql else d * h * qk
    linear = q + d * (lora + rope) + lora * h * (nope + v) + h * v * d
    return linear, lora + ql          # kv_a / q_a layernorms, unquantised


def weights_bytes_per_gpu(model: ModelSpec, tp: int, weight_dtype: str | None = None) -> int:
    """Bytes of all weights one GPU holds, embedding and LM head included (what vLLM logs as
    "model weights take … GiB").

    Linear layers (attention, dense MLP ``m·d·I/tp``, routed experts ``E·m·d·I_moe/tp``, shared
    experts ``m·d·I_shared/tp``) in the weight dtype, or in the activation dtype when the checkpoint
    leaves them unquantised (``ModelSpec.unquantized``); embedding and LM head ``rows/GPU × d``,
    router ``d × E``, RMSNorms (2 per layer + final) in the activation dtype. A data-parallel
    deployment (``model.parallel``) splits the routed experts over all its dp·TP GPUs.
    Llama-2-7B TP 1 (fp16): 32 × (67,108,864 + 3·4096·11008 + 2·4096) + 2 · 32000·4096 + 4096 =
    6,738,415,616 parameters → 13,476,831,232 bytes (12.55 GiB).
    """
    check_tp(model, tp)
    d, m = model.hidden, model.mlp_matrices
    wb, ab = weight_dtype_bytes(model, weight_dtype), float(model.act_bytes)
    attn_linear, attn_norms = attention_params_per_gpu(model, tp)
    o_proj = model.num_heads // tp * model.v_dim * d
    dense_mlp = m * d * model.intermediate / tp
    # routed experts split over all dp·TP GPUs of a data-parallel deployment (``model.parallel``)
    dp = model.parallel.dp
    experts_split = tp * dp
    moe_linear = (model.num_experts * m * d * model.moe_intermediate
                  + dp * m * d * model.shared_intermediate) / experts_split
    router = d * model.num_experts
    linear = (model.num_layers * attn_linear + model.num_dense_layers * dense_mlp
              + model.num_moe_layers * moe_linear)
    # linear layers the checkpoint leaves unquantised move from the weight to the activation dtype
    parts = {"qkv_proj": model.num_layers * (attn_linear - o_proj), "o_proj": model.num_layers * o_proj,
             "mlp_up": model.num_dense_layers * (m - 1) * d * model.intermediate / tp,
             "mlp_down": model.num_dense_layers * d * model.intermediate / tp,
             "shared_up": model.num_moe_layers * (m - 1) * d * model.shared_intermediate / tp,
             "shared_down": model.num_moe_layers * d * model.shared_intermediate / tp,
             "moe": model.num_moe_layers * model.num_experts * m * d * model.moe_intermediate / experts_split}
    unquantized = sum(v for c, v in parts.items() if c in model.unquantized)
    vocab = vocab_rows_per_gpu(model, tp) * d * (1 if model.tie_word_embeddings else 2)
    plain = (vocab + model.num_moe_layers * router + model.num_layers * (2 * d + attn_norms) + d)
    return int(round((linear - unquantized) * wb + (plain + unquantized) * ab))


def kv_bytes_per_token_per_gpu(model: ModelSpec, tp: int, kv_dtype: str = "auto") -> int:
    """KV-cache bytes one token takes on one GPU, all layers.

    GQA: L · kvh · (qk + v) · bytes (kvh = KV heads per GPU; replicated when fewer than TP);
    MLA: L · (kv_lora_rank + qk_rope_head_dim) · bytes on every rank.
    Llama-2-7B fp16: 32 · 32 · 256 · 2 = 524,288 (512 KiB); FP8: 262,144.
    """
    check_tp(model, tp)
    if model.is_mla:
        elems = model.kv_lora_rank + model.qk_rope_head_dim
    else:
        elems = kv_heads_per_gpu(model, tp) * (model.head_dim + model.v_dim)
    return int(round(model.num_layers * elems * kv_dtype_bytes(model, kv_dtype)))


def activation_peak_bytes(model: ModelSpec, tp: int, max_num_batched_tokens: int = 8192,
                          max_num_seqs: int = 256) -> float:
    """Estimated PyTorch peak of vLLM's profiling run beyond the weights, bytes per GPU.

    Forward pass of N = ``max_num_batched_tokens`` tokens: N · act bytes · (2d + widest
    intermediate), the widest of the dense MLP ((m−1)·I/tp gate/up + I/tp activation), the fused-MoE
    caches (top_k · ((m−1)·I_moe/tp + I_moe/tp + d)) and attention (QKV + output per GPU); plus the
    sampler: ``max_num_seqs`` · vocab · 4 B · 2 (FP32 logits and probabilities).
    Llama-2-7B TP 1, N 2048, 128 seqs: 2048·2·(8192 + 33024) + 128·32000·8 = 201,555,968 B.
    """
    d, m, h = model.hidden, model.mlp_matrices, model.num_heads // tp
    widths = [model.intermediate * m / tp if model.num_dense_layers else 0.0]
    if model.is_moe:
        widths.append(model.experts_per_tok * (model.moe_intermediate * m / tp + d))
        widths.append(model.shared_intermediate * m / tp)
    kvh = 1 if model.is_mla else kv_heads_per_gpu(model, tp)
    widths.append(h * model.head_dim + kvh * (model.head_dim + model.v_dim) + h * model.v_dim)
    forward = max_num_batched_tokens * model.act_bytes * (2 * d + max(widths))
    sampler = max_num_seqs * model.vocab_size * SAMPLER_BYTES * 2
    return float(forward + sampler)


# --------------------------------------------------------------------------------------------
# capacity


def _check_settings(gpu_memory_utilization, block_size, max_num_batched_tokens, max_num_seqs) -> None:
    u = gpu_memory_utilization
    if isinstance(u, bool) or not isinstance(u, (int, float)) or not (0.0 < u <= 1.0):
        raise RoofcalError(f"--gpu-memory-utilization must be in (0, 1], got {u!r}")
    for name, v in (("--block-size", block_size), ("--max-num-batched-tokens", max_num_batched_tokens),
                    ("--max-num-seqs", max_num_seqs)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise RoofcalError(f"{name} must be a positive integer, got {v!r}")


def capacity(model: ModelSpec, gpu: GPUSpec, tp: int, kv_dtype: str = "auto",
             gpu_memory_utilization: float = 0.9, block_size: int = 16, weight_dtype: str | None = None,
             *, max_num_batched_tokens: int = 8192, max_num_seqs: int = 256) -> Capacity:
    """KV-cache capacity of ``model`` on ``gpu`` at TP ``tp`` as vLLM computes it (module docstring).

    ``max_num_batched_tokens`` / ``max_num_seqs`` size the profiling run (defaults: ``vllm serve``'s
    on a ≥ 70 GiB GPU; the bundled serving runs used 2048 / 128). Refuses (one-line
    :class:`RoofcalError`) a TP that does not divide the heads, a utilization outside (0, 1], and a
    deployment whose weights and activations leave no room for one KV block (vLLM would not start).
    """
    check_tp(model, tp)
    _check_settings(gpu_memory_utilization, block_size, max_num_batched_tokens, max_num_seqs)
    total = CUDA_VISIBLE_FRACTION * gpu.hbm_capacity_gib * GIB
    requested = gpu_memory_utilization * total
    weights = weights_bytes_per_gpu(model, tp, weight_dtype)
    reserved = activation_peak_bytes(model, tp, max_num_batched_tokens, max_num_seqs) + NON_TORCH_GIB * GIB
    per_token = kv_bytes_per_token_per_gpu(model, tp, kv_dtype)
    available = requested - weights - reserved
    if weights >= requested:
        raise RoofcalError(
            f"{model.name} at TP {tp} does not fit on {gpu.name}: weights take {weights / GIB:.1f} GiB "
            f"per GPU of {requested / GIB:.1f} GiB usable; raise --tp"
            + (" (or spread the experts: --dp N --enable-expert-parallel)" if model.is_moe else ""))
    blocks = int(available // (block_size * per_token)) if available > 0 else 0
    if blocks < 1:
        # say what to change: the profiling run's size when the activations are the larger share
        fix = (f"lower --max-num-batched-tokens ({max_num_batched_tokens}) or --max-num-seqs "
               f"({max_num_seqs}), whose profiling run takes them, or raise --tp"
               if reserved >= requested - weights and reserved > weights
               else "raise --tp or --gpu-memory-utilization")
        raise RoofcalError(
            f"{model.name} at TP {tp} does not fit on {gpu.name}: weights {weights / GIB:.1f} GiB and "
            f"activations {reserved / GIB:.1f} GiB per GPU leave no KV cache of {requested / GIB:.1f} "
            f"GiB usable; {fix}")
    notes = [
        f"total memory {CUDA_VISIBLE_FRACTION:g} × {gpu.hbm_capacity_gib:g} GiB (as CUDA reports it), of "
        f"which vLLM takes gpu_memory_utilization {gpu_memory_utilization:g}: {requested / GIB:.2f} GiB",
        f"reserved {reserved / GIB:.2f} GiB: activation peak of a {max_num_batched_tokens}-token, "
        f"{max_num_seqs}-sequence profiling run + {NON_TORCH_GIB:g} GiB non-torch",
        f"KV cache: {requested / GIB:.2f} − {weights / GIB:.2f} (weights) − {reserved / GIB:.2f} (reserved) "
        f"= {available / GIB:.2f} GiB, in blocks of {block_size} tokens",
    ]
    if model.is_mla:
        notes.append("MLA latent KV cache replicated on every TP rank")
    elif model.num_kv_heads < tp:
        notes.append(f"{model.num_kv_heads} KV heads replicated across TP {tp} (1 per GPU)")
    if tp > 1:
        notes.append("NCCL / custom all-reduce buffers at TP > 1 not deducted")
    return Capacity(weights_bytes_per_gpu=int(weights), kv_bytes_per_token_per_gpu=int(per_token),
                    kv_blocks=blocks, kv_tokens=blocks * block_size, block_size=int(block_size),
                    notes=tuple(notes), available_bytes=float(available), reserved_bytes=float(reserved),
                    total_bytes=float(total), max_num_seqs=int(max_num_seqs))


def max_batch(cap: Capacity, context: int) -> int:
    """Sequences of ``context`` tokens (prompt + generated) the KV cache holds at once: each takes
    ceil(context / block_size) blocks. 7,467 blocks of 16, context 4096 → 7467 // 256 = 29."""
    if isinstance(context, bool) or not isinstance(context, (int, np.integer)) or context < 1:
        raise RoofcalError(f"--context must be a positive integer, got {context!r}")
    return int(cap.kv_blocks // math.ceil(context / cap.block_size))


def kv_blocks_needed(batch, block_size: int = 16) -> np.ndarray:
    """KV blocks each step of a :class:`~roofcal.physics.steps.StepBatch` holds: every sequence
    rounded up to whole blocks — ⌈(cached + new) / block⌉ per prefill chunk, ⌈(context + 1) /
    block⌉ per decode (masks count as multiplicities). 100,000 one-token decodes hold 100,000
    blocks, not 100,000 / 16 × 2. Computed in the batch's own dtype (float32: token counts and
    block counts exact below 2^24) and summed per step in float64."""
    pm, dm = np.asarray(batch.prefill_mask), np.asarray(batch.decode_mask)
    pf = np.ceil((np.asarray(batch.prefill_cached) + np.asarray(batch.prefill_new)) / block_size)
    dc = np.ceil((np.asarray(batch.decode_ctx) + 1) / block_size)
    return (pm * pf).sum(1, dtype=np.float64) + (dm * dc).sum(1, dtype=np.float64)


def sequences(batch) -> np.ndarray:
    """Sequences in each step of a batch (prefill chunks + decodes)."""
    return np.asarray(batch.prefill_mask).sum(1, dtype=np.float64) + \
        np.asarray(batch.decode_mask).sum(1, dtype=np.float64)


def fits(cap: Capacity, batch, ranks: int = 1) -> np.ndarray:
    """Whether vLLM could run each step of ``batch`` (a :class:`~roofcal.physics.steps.StepBatch`)
    at once: its sequences' whole KV blocks (:func:`kv_blocks_needed`) fit the cache and it runs
    at most ``cap.max_num_seqs`` sequences (bool array). A step of ``ranks`` data-parallel ranks,
    each with ``cap``'s cache and limits, holds all their sequences: its blocks fit their caches
    together and its busiest rank (⌈n/ranks⌉ sequences) stays within ``cap.max_num_seqs``."""
    return (kv_blocks_needed(batch, cap.block_size) <= ranks * cap.kv_blocks) \
        & (np.ceil(sequences(batch) / ranks) <= cap.max_num_seqs)

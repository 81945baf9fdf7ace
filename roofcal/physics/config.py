"""HuggingFace ``config.json`` → :class:`ModelSpec`, the typed description every component reads.

Only what the step time depends on is kept: layer count and widths, attention layout (MHA / GQA /
MQA / MLA), MLP form (gated SwiGLU with 3 matrices or plain GELU with 2), mixture-of-experts layout,
vocabulary (LM head) and the byte widths of weights, activations and KV cache.

Field names differ between model families; each quantity is read from its known aliases (for
example ``num_hidden_layers`` / ``n_layer`` / ``num_layers``). Two aliases given with different
values are a contradiction and refused. Multimodal configs keep the language model under
``text_config``, whose fields take precedence over the root's.

Conventions chosen where configs are ambiguous (each documented in docs/model.md):

* Layer ``i`` (0-based) of a model with ``interleave_moe_layer_step = s`` is MoE iff
  ``(i + 1) % s == 0`` (HuggingFace / vLLM Llama-4), so ``s = 1`` makes every layer MoE.
* ``first_k_dense_replace = f`` makes the first ``f`` layers dense (DeepSeek, GLM).
* Llama-4 MoE layers carry one shared expert of width ``intermediate_size``; DeepSeek-style models
  ``n_shared_experts × moe_intermediate_size``; Qwen-MoE ``shared_expert_intermediate_size``.
* A quantised checkpoint's ``quantization_config.ignore`` (compressed-tensors; ``ignored_layers`` /
  ``modules_to_not_convert`` / ``exclude_modules`` for other quantisers) names modules vLLM runs
  unquantised; they are mapped to step components in :func:`_unquantized` (Llama-4-Scout FP8:
  QKV, O and the router run in bf16). W8A8 checkpoints quantise each GEMM input to FP8 first
  (:func:`_act_quant`); the GEMM then reads 1-byte inputs.
"""

from __future__ import annotations

import fnmatch
import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from roofcal import resources
from roofcal.errors import RoofcalError
from roofcal.io import read_json_object

#: bytes per element of each dtype name found in configs
DTYPE_BYTES = {
    "float32": 4.0, "fp32": 4.0, "float": 4.0,
    "float16": 2.0, "fp16": 2.0, "half": 2.0, "bfloat16": 2.0, "bf16": 2.0,
    "float8": 1.0, "fp8": 1.0, "float8_e4m3fn": 1.0, "int8": 1.0, "uint8": 1.0,
}

#: model types whose MLP is a plain two-matrix (up, down) GELU/ReLU MLP
NON_GATED_MODEL_TYPES = {
    "gpt2", "gpt_neox", "gptj", "gpt_bigcode", "bloom", "opt", "falcon", "phi", "mpt", "starcoder2",
}


#: vLLM's MoE dispatch/combine backends (``VLLM_ALL2ALL_BACKEND``; BLIS ``--moe-comm-backend``), by
#: how they move tokens: the all-gather family gathers every rank's tokens to every GPU and
#: reduce-scatters the outputs back; the all-to-all family sends each token only to the GPUs of
#: its experts (expert parallelism only)
MOE_COMM_ALLGATHER = ("naive", "allgather_reducescatter")
MOE_COMM_ALLTOALL = ("pplx", "deepep_high_throughput", "deepep_low_latency", "mori",
                     "flashinfer_all2allv")
MOE_COMM_BACKENDS = MOE_COMM_ALLGATHER + MOE_COMM_ALLTOALL


@dataclass(frozen=True)
class Parallel:
    """How a deployment spreads a model beyond tensor parallelism (vLLM's and BLIS's flags).

    ``dp`` data-parallel ranks (``--data-parallel-size``, BLIS ``--dp``), each of TP GPUs with its
    own batch and KV cache; ``ep`` (``--enable-expert-parallel``): the MoE layers' experts are
    split whole over all dp·TP GPUs, else each expert's FFN is split over them; ``moe_comm``
    (:data:`MOE_COMM_BACKENDS`): how an MoE layer moves tokens between the ranks. The default is
    a plain TP deployment (one rank, no expert parallelism).
    """

    dp: int = 1
    ep: bool = False
    moe_comm: str = "allgather_reducescatter"

    @property
    def alltoall(self) -> bool:
        """True when the MoE dispatch and combine are all-to-alls (:data:`MOE_COMM_ALLTOALL`)."""
        return self.moe_comm in MOE_COMM_ALLTOALL

    def title(self, tp: int) -> str:
        """How printed lines name a deployment at TP ``tp`` with this layout: ``TP<T>``, with
        ``DP<N> EP (<backend>)`` beyond plain TP."""
        if self == Parallel():
            return f"TP{tp}"
        return f"TP{tp} DP{self.dp}" + (" EP" if self.ep else "") + f" ({self.moe_comm})"


@dataclass(frozen=True)
class ModelSpec:
    """Shapes and byte widths of a decoder-only transformer.

    Attributes are per model (not per GPU); divide by TP where a component splits them.
    ``weight_bytes`` is bytes per weight parameter (1 for FP8, 0.5 for 4-bit), ``act_bytes`` per
    activation element, ``kv_bytes`` per KV-cache element.
    """

    name: str
    num_layers: int
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate: int                 # FFN width of dense layers
    vocab_size: int
    gated_mlp: bool = True            # SwiGLU-style (gate, up, down) vs (up, down)
    tie_word_embeddings: bool = False
    act_bytes: float = 2.0
    weight_bytes: float = 2.0
    kv_bytes: float = 2.0
    weight_dtype: str = "bf16"        # GEMM variant of the projections: bf16, fp8, fp8_block, int4
    # mixture of experts
    num_experts: int = 0
    experts_per_tok: int = 0
    moe_intermediate: int = 0         # width of one routed expert
    shared_intermediate: int = 0      # total width of the shared expert(s) in an MoE layer
    num_moe_layers: int = 0
    # attention variants
    v_head_dim: int = 0               # value head size when it differs (MLA); 0 → head_dim
    kv_lora_rank: int = 0             # MLA latent KV width (elements per token per layer)
    qk_rope_head_dim: int = 0         # MLA decoupled rope key width
    # quantized checkpoints: which GEMMs vLLM runs unquantised, and how activations are quantised
    unquantized: tuple[str, ...] = ()  # components of UNQUANTIZABLE left in the activation dtype
    act_quant: str = ""               # FP8 activation scales: "" (none), "tensor", "token", "group"
    config_path: str = field(default="", compare=False)   # where it was read from
    # the deployment's layout beyond TP (:func:`served`), carried with the model so every step
    # function sees it; a plain TP deployment by default
    parallel: Parallel = Parallel()

    @property
    def ref(self) -> str:
        """How to load this model again: its bundled name, else its config file's path."""
        bundled = resources.MODEL_CONFIGS / self.name / "config.json"
        if not self.config_path or Path(self.config_path) == bundled.resolve():
            return self.name
        return self.config_path

    @property
    def is_moe(self) -> bool:
        return self.num_experts >= 2 and self.num_moe_layers > 0

    @property
    def num_dense_layers(self) -> int:
        return self.num_layers - self.num_moe_layers

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def v_dim(self) -> int:
        return self.v_head_dim or self.head_dim

    @property
    def kv_elems_per_token_layer(self) -> int:
        """KV-cache elements stored per token per layer (whole model, before TP split)."""
        if self.is_mla:
            return self.kv_lora_rank + self.qk_rope_head_dim
        return self.num_kv_heads * (self.head_dim + self.v_dim)

    @property
    def mlp_matrices(self) -> int:
        return 3 if self.gated_mlp else 2

    @property
    def plain_dtype(self) -> str:
        """GEMM variant of an unquantised linear layer: the activation dtype (bf16, else fp32)."""
        return "bf16" if self.act_bytes == 2.0 else "fp32"

    def is_quantized(self, component: str) -> bool:
        """Whether the linear layers of ``component`` (a name of :data:`UNQUANTIZABLE`) run in the
        weight format (``weight_dtype``, ``weight_bytes``) rather than unquantised."""
        return self.weight_dtype != self.plain_dtype and component not in self.unquantized

    def with_kv_bytes(self, kv_bytes: float) -> "ModelSpec":
        return replace(self, kv_bytes=float(kv_bytes))


# --------------------------------------------------------------------------------------------
# parsing helpers


def _merge_text_config(raw: dict) -> dict:
    merged = dict(raw)
    text = raw.get("text_config")
    if isinstance(text, dict):
        merged.update(text)
    return merged


def _pick(cfg: dict, path, names, default=None, kind=int):
    """First present alias in ``names``; refuse two aliases with different values."""
    found = [(n, cfg[n]) for n in names if n in cfg and cfg[n] is not None]
    if not found:
        return default
    name, value = found[0]
    for other, v in found[1:]:
        if v != value:
            raise RoofcalError(f"{path}: contradictory fields '{name}'={value} and '{other}'={v}")
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
            raise RoofcalError(f"{path}: field '{name}' must be an integer, got {value!r}")
        value = int(value)
        if value < 0:
            raise RoofcalError(f"{path}: field '{name}' must be non-negative, got {value}")
    return value


def _require(value, path, name):
    if value is None:
        raise RoofcalError(f"{path}: missing field '{name}'")
    if value <= 0:
        raise RoofcalError(f"{path}: field '{name}' must be positive, got {value}")
    return value


def _dtype_bytes(cfg: dict, path) -> float:
    name = _pick(cfg, path, ["torch_dtype", "dtype"], default="bfloat16", kind=str)
    if not isinstance(name, str) or name.lower() not in DTYPE_BYTES:
        raise RoofcalError(f"{path}: field 'torch_dtype' has unknown dtype {name!r}")
    return DTYPE_BYTES[name.lower()]


def _weight_format(cfg: dict, path, name: str, act_bytes: float) -> tuple[float, str]:
    """(bytes per weight, GEMM variant) from ``quantization_config`` or the model name."""
    q = cfg.get("quantization_config")
    if isinstance(q, dict):
        method = str(q.get("quant_method", "")).lower()
        bits = q.get("bits", q.get("w_bit", q.get("weight_bits")))
        if bits is None and method == "compressed-tensors":
            groups = q.get("config_groups") or {}
            for key in sorted(groups):
                w = (groups[key] or {}).get("weights") or {}
                if "num_bits" in w:
                    bits = w["num_bits"]
                    break
        if bits is None and method in ("fp8", "fbgemm_fp8", "modelopt"):
            bits = 8
        if bits is None:
            raise RoofcalError(f"{path}: field 'quantization_config' gives no weight bit width "
                               f"(quant_method {method!r})")
        try:
            bits = float(bits)
        except (TypeError, ValueError):
            raise RoofcalError(f"{path}: field 'quantization_config.bits' is not a number: {bits!r}")
        if bits not in (4.0, 8.0, 16.0):
            raise RoofcalError(f"{path}: field 'quantization_config' has unsupported {bits:g}-bit weights")
        if bits == 16.0:
            return 2.0, "bf16"
        if bits == 4.0:
            return 0.5, "int4"
        return 1.0, ("fp8_block" if q.get("weight_block_size") else "fp8")
    lowered = name.lower()
    m = re.search(r"w(4|8)a(4|8|16)", lowered)
    if m:
        bits = int(m.group(1))
        return bits / 8.0, ("fp8" if bits == 8 else "int4")
    if "fp8" in lowered:
        return 1.0, "fp8"
    return act_bytes, ("bf16" if act_bytes == 2.0 else "fp32")


# --------------------------------------------------------------------------------------------
# quantised checkpoints: activation quantisation and the modules left unquantised

#: activation dtypes of W8A8 schemes: the bytes per element a quantised GEMM reads its input in
ACT_QUANT_BYTES = 1.0


def _act_quant(q, weight_dtype: str) -> str:
    """How vLLM quantises the activations of each quantised GEMM: "" (not: weight-only), or the
    FP8 scale granularity "tensor", "token" or "group". Only 8-bit weights with 8-bit
    activations (W8A8) quantise activations; weight-only formats (int4, W8A16) feed the GEMM
    its bf16 input. A W8A8 GEMM reads 1-byte inputs (:func:`roofcal.physics.decompose.linear_format`).

    * compressed-tensors: ``config_groups.*.input_activations`` (``num_bits`` 8) with its
      ``strategy`` (``token`` for the Llama-4-Scout FP8-dynamic checkpoint); no
      ``input_activations`` is weight-only;
    * ``fp8`` (vLLM ``Fp8Config``): ``weight_block_size`` → per-token groups (1×128 for
      DeepSeek-style block FP8); otherwise one scale per tensor;
    * ``fbgemm_fp8``: per token; ``modelopt``: per tensor;
    * no ``quantization_config`` but an FP8 / W8A8 name: per token.
    """
    if weight_dtype not in ("fp8", "fp8_block"):
        return ""
    if not isinstance(q, dict):
        return "token"
    method = str(q.get("quant_method", "")).lower()
    if method == "compressed-tensors":
        groups = q.get("config_groups") or {}
        for key in sorted(groups):
            g = groups[key] or {}
            if "num_bits" not in (g.get("weights") or {}):
                continue
            a = g.get("input_activations")
            if not isinstance(a, dict) or a.get("num_bits") != 8:
                return ""
            strategy = str(a.get("strategy", "tensor")).lower()
            return strategy if strategy in ("token", "group") else "tensor"
        return ""
    if method == "fp8":
        return "group" if q.get("weight_block_size") else "tensor"
    if method == "fbgemm_fp8":
        return "token"
    if method == "modelopt":
        return "tensor"
    return ""


#: roofcal's linear layers that a checkpoint may leave unquantised (components of
#: :func:`roofcal.physics.decompose.step_ops`; ``moe`` = the routed experts)
UNQUANTIZABLE = ("qkv_proj", "o_proj", "mlp_up", "mlp_down", "shared_up", "shared_down", "router",
                 "moe")

#: MoE architectures whose router vLLM builds unquantised whatever the checkpoint says (vLLM 0.14:
#: ``ReplicatedLinear(..., quant_config=None)`` in llama4.py, mixtral.py, deepseek_v2.py; an FP32
#: ``nn.Linear`` in glm4_moe.py). Others (qwen3_moe.py) quantise it unless the config ignores it.
PLAIN_ROUTER_MODEL_TYPES = ("llama4", "mixtral", "deepseek", "glm")

#: where decoder layer ``i`` lives in checkpoints (``language_model.`` for multimodal wrappers)
_LAYER_PREFIXES = ("model.layers.{i}", "language_model.model.layers.{i}",
                   "model.language_model.layers.{i}", "transformer.h.{i}", "gpt_neox.layers.{i}",
                   "model.decoder.layers.{i}")
_ATTN = ("self_attn", "attn", "attention", "self_attention")
_FFN = ("mlp", "feed_forward", "block_sparse_moe")
_SHARED = ("shared_expert", "shared_experts")


def _module_sets(component: str, mla: bool, gated: bool) -> list[tuple[str, ...]]:
    """Alternative sets of checkpoint module names (relative to one layer; ``{a}`` attention,
    ``{f}`` feed-forward, ``{s}`` shared-expert module) that make up ``component``."""
    if component == "qkv_proj":
        if mla:
            return [("{a}.q_proj", "{a}.kv_a_proj_with_mqa", "{a}.kv_b_proj"),
                    ("{a}.q_a_proj", "{a}.q_b_proj", "{a}.kv_a_proj_with_mqa", "{a}.kv_b_proj")]
        return [("{a}.q_proj", "{a}.k_proj", "{a}.v_proj"), ("{a}.qkv_proj",),
                ("{a}.query_key_value",), ("{a}.c_attn",), ("{a}.Wqkv",)]
    if component == "o_proj":
        return [("{a}.o_proj",), ("{a}.dense",), ("{a}.c_proj",), ("{a}.out_proj",)]
    if component == "mlp_up":
        if gated:
            return [("{f}.gate_proj", "{f}.up_proj"), ("{f}.gate_up_proj",)]
        return [("{f}.up_proj",), ("{f}.fc1",), ("{f}.c_fc",), ("{f}.dense_h_to_4h",)]
    if component == "mlp_down":
        return [("{f}.down_proj",), ("{f}.fc2",), ("{f}.c_proj",), ("{f}.dense_4h_to_h",)]
    if component == "shared_up":
        return [("{f}.{s}.gate_proj", "{f}.{s}.up_proj"), ("{f}.{s}.gate_up_proj",)]
    if component == "shared_down":
        return [("{f}.{s}.down_proj",)]
    if component == "router":
        return [("{f}.gate",), ("{f}.router",)]
    return [("{f}.experts",)]                                         # moe


def _ignore_rule(q) -> Callable[[str], bool] | None:
    """A predicate on checkpoint module names: is this module left unquantised? ``None`` when the
    ``quantization_config`` lists none. vLLM's matching (0.14), per key:

    * ``ignore`` (compressed-tensors): equal, or ``re:<pattern>`` matching from the start of the
      name (``re.match``), e.g. ``re:.*self_attn.*``;
    * ``ignored_layers`` (fp8), and ``modules_to_not_convert`` when ``quant_method`` is fp8:
      equal;
    * ``modules_to_not_convert`` (awq, gptq, bitsandbytes, …): a substring of the name;
    * ``exclude_modules`` (modelopt): equal, a substring, or an ``fnmatch`` wildcard.
    """
    if not isinstance(q, dict):
        return None
    method = str(q.get("quant_method", "")).lower()
    exact, regex, substr, wild = set(), [], [], []
    for key in ("ignore", "ignored_layers", "modules_to_not_convert", "exclude_modules"):
        entries = q.get(key)
        if not isinstance(entries, list):
            continue
        for e in entries:
            if not isinstance(e, str) or not e:
                continue
            if key == "ignore" and e.startswith("re:"):
                regex.append(re.compile(e[3:]))
            elif key == "ignore" or key == "ignored_layers" or method == "fp8":
                exact.add(e)
            elif key == "modules_to_not_convert":
                substr.append(e)
            else:                                              # exclude_modules
                exact.add(e)
                substr.append(e)
                wild.append(e)
    if not (exact or regex or substr or wild):
        return None

    def ignored(module: str) -> bool:
        return (module in exact or any(r.match(module) for r in regex)
                or any(e in module for e in substr)
                or any(fnmatch.fnmatchcase(module, w) for w in wild))
    return ignored


def _unquantized(q, model_type: str, num_layers: int, moe_layers: list[int], mla: bool,
                 gated: bool, is_moe: bool) -> tuple[str, ...]:
    """Components of :data:`UNQUANTIZABLE` that vLLM runs unquantised in a quantised checkpoint.

    A component is unquantised when, under one naming convention (layer prefix × attention /
    feed-forward module names, e.g. ``language_model.model.layers.{i}.self_attn.q_proj``), every
    module making it is ignored (:func:`_ignore_rule`) in every layer that has it: attention in
    all layers, the dense MLP in the dense layers, router / experts / shared expert in the MoE
    layers. A component ignored in only some layers stays quantised (a step gives each component
    one format). The router is also unquantised for :data:`PLAIN_ROUTER_MODEL_TYPES`. (The LM
    head is always unquantised: vLLM quantises linear layers only.)
    """
    rule = _ignore_rule(q)
    out = []
    dense_layers = [i for i in range(num_layers) if i not in set(moe_layers)]
    for comp in UNQUANTIZABLE:
        if comp in ("router", "moe", "shared_up", "shared_down"):
            layers = moe_layers if is_moe else []
        elif comp in ("mlp_up", "mlp_down"):
            layers = dense_layers
        else:
            layers = list(range(num_layers))
        plain = comp == "router" and is_moe and model_type.startswith(PLAIN_ROUTER_MODEL_TYPES)
        if not plain and rule is not None and layers:
            plain = any(
                all(rule(prefix.format(i=i) + "." + name.format(a=a, f=f, s=s))
                    for i in layers for name in names)
                for names in _module_sets(comp, mla, gated) for prefix in _LAYER_PREFIXES
                for a in _ATTN for f in _FFN for s in _SHARED)
        if plain:
            out.append(comp)
    return tuple(out)


def _moe_layers(cfg: dict, path, num_layers: int, num_experts: int) -> list[int]:
    """Indices (0-based) of the MoE layers (see module docstring for the conventions)."""
    if num_experts < 2:
        return []
    step = _pick(cfg, path, ["interleave_moe_layer_step"], default=0)
    first_dense = _pick(cfg, path, ["first_k_dense_replace"], default=0)
    sparse_step = _pick(cfg, path, ["decoder_sparse_step", "moe_layer_freq"], default=1)
    only_dense = cfg.get("mlp_only_layers") or []
    if first_dense > num_layers:
        raise RoofcalError(f"{path}: field 'first_k_dense_replace'={first_dense} exceeds "
                           f"num_hidden_layers={num_layers}")
    layers = range(num_layers)
    if step > 0:
        moe = [i for i in layers if (i + 1) % step == 0]
    else:
        moe = [i for i in layers if i >= first_dense and (i + 1) % max(sparse_step, 1) == 0]
    return [i for i in moe if i not in set(only_dense)]


def parse_config(raw: dict, path: str | Path = "<config>", name: str | None = None) -> ModelSpec:
    """Build a :class:`ModelSpec` from a parsed ``config.json`` dict; ``path`` names it in errors."""
    if not isinstance(raw, dict):
        raise RoofcalError(f"{path}: a model config must be a JSON object")
    cfg = _merge_text_config(raw)
    name = name or Path(str(path)).parent.name or "model"

    layers = _require(_pick(cfg, path, ["num_hidden_layers", "n_layer", "num_layers"]), path,
                      "num_hidden_layers")
    hidden = _require(_pick(cfg, path, ["hidden_size", "n_embd", "n_embed", "d_model"]), path,
                      "hidden_size")
    heads = _require(_pick(cfg, path, ["num_attention_heads", "n_head", "num_heads"]), path,
                     "num_attention_heads")
    kv_heads = _pick(cfg, path, ["num_key_value_heads", "num_kv_heads", "multi_query_group_num",
                                 "n_head_kv"], default=None)
    if kv_heads is None:
        kv_heads = 1 if cfg.get("multi_query") is True else heads
    _require(kv_heads, path, "num_key_value_heads")
    if kv_heads > heads or heads % kv_heads:
        raise RoofcalError(f"{path}: field 'num_key_value_heads'={kv_heads} must divide "
                           f"num_attention_heads={heads}")
    head_dim = _pick(cfg, path, ["head_dim"], default=None)
    if head_dim is None:
        if hidden % heads:
            raise RoofcalError(f"{path}: field 'head_dim' is missing and hidden_size={hidden} is "
                               f"not divisible by num_attention_heads={heads}")
        head_dim = hidden // heads
    _require(head_dim, path, "head_dim")

    model_type = str(cfg.get("model_type", "")).lower()
    act = str(cfg.get("hidden_act", cfg.get("activation_function", cfg.get("hidden_activation",
                                                                            "silu")))).lower()
    gated = model_type not in NON_GATED_MODEL_TYPES and not (
        model_type == "" and act.startswith(("gelu", "relu")))
    inter = _pick(cfg, path, ["intermediate_size", "ffn_hidden_size", "n_inner", "ffn_dim"],
                  default=None)
    if inter is None:
        if gated:
            raise RoofcalError(f"{path}: missing field 'intermediate_size'")
        inter = 4 * hidden                 # GPT-2 / BLOOM convention when n_inner is null
    _require(inter, path, "intermediate_size")
    vocab = _require(_pick(cfg, path, ["vocab_size", "padded_vocab_size"]), path, "vocab_size")

    act_bytes = _dtype_bytes(cfg, path)
    weight_bytes, weight_dtype = _weight_format(cfg, path, name, act_bytes)

    # mixture of experts: the first alias with >= 2 experts
    experts = 0
    for key in ["num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts",
                "num_routed_experts"]:
        v = _pick(cfg, path, [key], default=0)
        if v >= 2:
            experts = v
            break
    topk = _pick(cfg, path, ["num_experts_per_tok", "moe_topk", "top_k"], default=0)
    moe_inter = shared = n_moe = 0
    moe_layers: list[int] = []
    dense_inter = inter
    if experts >= 2:
        if topk < 1 or topk > experts:
            raise RoofcalError(f"{path}: field 'num_experts_per_tok'={topk} must be in [1, {experts}]")
        moe_layers = _moe_layers(cfg, path, layers, experts)
        n_moe = len(moe_layers)
        if model_type.startswith("llama4"):
            moe_inter = inter
            dense_inter = _pick(cfg, path, ["intermediate_size_mlp"], default=inter)
            shared = inter                 # one shared expert per MoE layer
        else:
            moe_inter = _pick(cfg, path, ["moe_intermediate_size"], default=inter)
            dense_inter = _pick(cfg, path, ["intermediate_size_mlp"], default=inter)
            shared = _pick(cfg, path, ["shared_expert_intermediate_size"], default=0)
            if not shared:
                shared = _pick(cfg, path, ["n_shared_experts", "num_shared_experts"], default=0) * moe_inter
        _require(moe_inter, path, "moe_intermediate_size")
    elif topk and experts == 1:
        raise RoofcalError(f"{path}: field 'num_experts_per_tok' given for a model with one expert")

    kv_lora = _pick(cfg, path, ["kv_lora_rank"], default=0)
    rope_dim = _pick(cfg, path, ["qk_rope_head_dim"], default=0)
    v_head = _pick(cfg, path, ["v_head_dim"], default=0)
    if kv_lora:                            # MLA: query/key head = no-rope part + rope part
        nope = _pick(cfg, path, ["qk_nope_head_dim"], default=None)
        qk = _pick(cfg, path, ["qk_head_dim"], default=None)
        if qk is None and nope is not None:
            qk = nope + rope_dim
        head_dim = qk or head_dim
    tie = bool(cfg.get("tie_word_embeddings", False))

    q = cfg.get("quantization_config")
    act_quant = _act_quant(q, weight_dtype)
    unquantized: tuple[str, ...] = ()
    if weight_dtype != ("bf16" if act_bytes == 2.0 else "fp32"):
        unquantized = _unquantized(q, model_type, layers, moe_layers, kv_lora > 0, gated,
                                   experts >= 2 and n_moe > 0)

    return ModelSpec(
        name=name, num_layers=layers, hidden=hidden, num_heads=heads, num_kv_heads=kv_heads,
        head_dim=head_dim, intermediate=dense_inter, vocab_size=vocab, gated_mlp=gated,
        tie_word_embeddings=tie, act_bytes=act_bytes, weight_bytes=weight_bytes,
        kv_bytes=act_bytes, weight_dtype=weight_dtype, num_experts=experts,
        experts_per_tok=topk if experts >= 2 else 0, moe_intermediate=moe_inter,
        shared_intermediate=shared, num_moe_layers=n_moe, v_head_dim=v_head if v_head != head_dim else 0,
        kv_lora_rank=kv_lora, qk_rope_head_dim=rope_dim if kv_lora else 0,
        unquantized=unquantized, act_quant=act_quant,
    )


def bundled_models() -> list[str]:
    """Names of the bundled model configs (folders of ``model_configs/``)."""
    return sorted(p.parent.name for p in resources.MODEL_CONFIGS.glob("*/config.json"))


def resolve_config_path(model: str | Path) -> Path:
    """A bundled model name, a folder holding ``config.json``, or a path to a JSON file."""
    p = Path(model)
    if p.is_file():
        return p
    if p.is_dir() and (p / "config.json").is_file():
        return p / "config.json"
    key = str(model).split("/")[-1].lower()
    bundled = resources.MODEL_CONFIGS / key / "config.json"
    if bundled.is_file():
        return bundled
    raise RoofcalError(f"model {str(model)!r}: no such config file or bundled model "
                       f"(bundled: {', '.join(bundled_models())})")


def load_model(model: str | Path) -> ModelSpec:
    """Load a :class:`ModelSpec` by bundled name (``llama-2-7b-hf``) or path."""
    path = resolve_config_path(model)
    raw = read_json_object(path, "model config file")
    name = path.parent.name if path.name == "config.json" else path.stem
    spec = parse_config(raw, resources.display(path), name=name)
    return replace(spec, config_path=str(path.resolve()))


def check_tp(model: ModelSpec, tp: int, where: str = "--tp") -> None:
    """Refuse a TP degree that does not divide the attention heads (vLLM's own rule).

    KV heads fewer than TP are replicated by vLLM, so only ``num_kv_heads % tp`` with
    ``num_kv_heads > tp`` is refused.
    """
    if not isinstance(tp, (int,)) or tp < 1:
        raise RoofcalError(f"{where}: tensor-parallel degree must be a positive integer, got {tp!r}")
    if model.num_heads % tp:
        raise RoofcalError(f"{where}: TP {tp} does not divide {model.name}'s "
                           f"num_attention_heads={model.num_heads}")
    if model.num_kv_heads >= tp and model.num_kv_heads % tp:
        raise RoofcalError(f"{where}: TP {tp} does not divide {model.name}'s "
                           f"num_key_value_heads={model.num_kv_heads}")


def served(model: ModelSpec, parallel: Parallel, where: str = "--dp") -> ModelSpec:
    """``model`` as a deployment laid out as ``parallel`` serves it (``model`` itself when that
    is already its layout: a plain TP deployment by default).

    Refused, naming ``where``: ``dp`` not a positive integer; expert parallelism or an
    all-to-all backend on a dense model; an all-to-all backend without expert parallelism
    (vLLM runs those backends only for expert-parallel MoE layers); an unknown backend.
    """
    dp, ep, moe_comm = parallel.dp, parallel.ep, parallel.moe_comm
    if isinstance(dp, bool) or not isinstance(dp, int) or dp < 1:
        raise RoofcalError(f"{where}: data-parallel size must be a positive integer, got {dp!r}")
    if moe_comm not in MOE_COMM_BACKENDS:
        raise RoofcalError(f"{where}: unknown MoE comm backend {moe_comm!r} "
                           f"(known: {', '.join(MOE_COMM_BACKENDS)})")
    if ep and not model.is_moe:
        raise RoofcalError(f"{where}: expert parallelism needs an MoE model; {model.name} is dense")
    if moe_comm in MOE_COMM_ALLTOALL and not ep:
        raise RoofcalError(f"{where}: MoE comm backend {moe_comm!r} is an all-to-all, which vLLM "
                           "runs only with expert parallelism (--enable-expert-parallel)")
    layout = Parallel(dp, bool(ep), moe_comm)
    return model if layout == model.parallel else replace(model, parallel=layout)


def kv_heads_per_gpu(model: ModelSpec, tp: int) -> int:
    """KV heads held by one GPU: split by TP, replicated when there are fewer than TP."""
    return max(1, math.ceil(model.num_kv_heads / tp))

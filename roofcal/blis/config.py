"""BLIS's own reading of a HuggingFace ``config.json`` (BLIS ``latency.ParseHFConfig`` +
``GetModelConfigFromHF`` + the CLI's weight-precision fallback), kept apart from roofcal's parser.

The result, :class:`BlisModel`, mirrors BLIS's ``sim.ModelConfig`` field by field, so the
trained-physics basis functions in :mod:`roofcal.blis.basis` see exactly what BLIS sees. Rules
(docs/blis-latency-models.md §3.3):

* a ``text_config`` object (multimodal checkpoints) is merged shallowly over the root;
* ``num_key_value_heads`` → ``num_kv_heads`` → ``multi_query_group_num`` → ``num_attention_heads``;
* ``intermediate_size`` → ``ffn_hidden_size``;
* ``torch_dtype`` → ``dtype``, mapped to bytes/param (unknown dtypes are refused, as BLIS does);
* experts: the first value ≥ 2 among ``num_experts``, ``moe_num_experts``, ``n_routed_experts``,
  ``num_local_experts``, ``num_routed_experts``;
* shared-expert FFN: ``shared_expert_intermediate_size``, else ``n_shared_experts`` ×
  (``moe_intermediate_size`` or ``intermediate_size``);
* weight bytes/param from ``quantization_config`` (``bits``/8, ``fp8`` → 1, compressed-tensors
  ``num_bits``/8), else from the lowercased model name (``wXaY`` → X/8, ``fp8`` → 1), else 0
  (meaning "same as ``bytes_per_param``").
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from roofcal.errors import RoofcalError, where
from roofcal.io import read_json_object

#: torch dtype name → bytes per element, as BLIS maps it. Anything else maps to 0 and is refused.
DTYPE_BYTES: Mapping[str, float] = {
    "float32": 4.0,
    "float16": 2.0,
    "bfloat16": 2.0,
    "int8": 1.0,
    "uint8": 1.0,
    "fp8": 1.0,
    "int4": 1.0,
    "nf4": 1.0,
}

#: Config keys that may hold the routed-expert count, in BLIS's lookup order.
EXPERT_COUNT_KEYS = (
    "num_experts",
    "moe_num_experts",
    "n_routed_experts",
    "num_local_experts",
    "num_routed_experts",
)

#: BLIS's ``MoEMinExperts``: a model is MoE iff it has at least this many routed experts.
MOE_MIN_EXPERTS = 2

_WXAY = re.compile(r"w(\d+)a(\d+)")


@dataclass(frozen=True)
class BlisModel:
    """BLIS's parsed model config (Go ``sim.ModelConfig``); sizes in elements, dtypes in bytes.

    ``weight_bytes_per_param`` = 0 means "not quantized: use ``bytes_per_param``".
    ``num_local_experts`` = 0 for dense models. ``head_dim`` is the explicit config value (0 if
    absent); BLIS ignores it for step time (it uses ``hidden // heads``).
    """

    num_layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    bytes_per_param: float
    weight_bytes_per_param: float = 0.0
    num_local_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate: int = 0
    shared_expert_ffn: int = 0
    interleave_moe_layer_step: int = 0
    dense_intermediate: int = 0
    head_dim: int = 0
    first_k_dense_replace: int = 0
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    vocab_size: int = 0
    hidden_act: str = ""
    name: str = ""

    @property
    def is_moe(self) -> bool:
        """True iff BLIS treats the model as MoE (≥ 2 routed experts)."""
        return self.num_local_experts >= MOE_MIN_EXPERTS


# --------------------------------------------------------------------------------------------
# field readers


def _number(cfg: Mapping[str, Any], key: str, path: Path) -> float | None:
    """The numeric value of ``key`` (None if absent or null); refuses strings, bools, lists."""
    value = cfg.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RoofcalError(f"{where(path, key)}: expected a number, got {value!r}")
    return float(value)


def _int(cfg: Mapping[str, Any], key: str, path: Path) -> int | None:
    """The integer value of ``key`` (None if absent or null); refuses non-integral numbers."""
    value = _number(cfg, key, path)
    if value is None:
        return None
    if value != int(value):
        raise RoofcalError(f"{where(path, key)}: expected an integer, got {cfg[key]!r}")
    return int(value)


def _first_positive(cfg: Mapping[str, Any], keys: tuple[str, ...], path: Path) -> int:
    """The first of ``keys`` holding an integer > 0, else 0."""
    for key in keys:
        value = _int(cfg, key, path)
        if value is not None and value > 0:
            return value
    return 0


def _required(cfg: Mapping[str, Any], keys: tuple[str, ...], path: Path) -> int:
    """Like :func:`_first_positive` but refuses a config where none of ``keys`` is > 0."""
    value = _first_positive(cfg, keys, path)
    if value <= 0:
        alts = f" (nor {', '.join(repr(k) for k in keys[1:])})" if len(keys) > 1 else ""
        raise RoofcalError(f"{where(path, keys[0])}: missing or not > 0{alts}; BLIS requires it")
    return value


def _bytes_per_param(cfg: Mapping[str, Any], path: Path) -> float:
    """Activation bytes/param from ``torch_dtype`` (falling back to ``dtype``)."""
    key = "torch_dtype" if cfg.get("torch_dtype") is not None else "dtype"
    name = cfg.get(key)
    if name is None:
        raise RoofcalError(f"{where(path, 'torch_dtype')}: missing (and no 'dtype'); BLIS needs it")
    nbytes = DTYPE_BYTES.get(name) if isinstance(name, str) else None
    if not nbytes:
        raise RoofcalError(
            f"{where(path, key)}: unsupported dtype {name!r}; BLIS maps only "
            f"{', '.join(DTYPE_BYTES)} and rejects the rest (BytesPerParam 0)"
        )
    return nbytes


def _expert_count(cfg: Mapping[str, Any], path: Path) -> int:
    """The first expert-count field ≥ 2 (BLIS's ``MoEMinExperts``), else 0 (dense)."""
    for key in EXPERT_COUNT_KEYS:
        value = _int(cfg, key, path)
        if value is not None and value >= MOE_MIN_EXPERTS:
            return value
    return 0


def _shared_expert_ffn(cfg: Mapping[str, Any], path: Path) -> int:
    """Total shared-expert FFN width: explicit size, else ``n_shared_experts`` × expert width."""
    explicit = _first_positive(cfg, ("shared_expert_intermediate_size",), path)
    if explicit:
        return explicit
    n_shared = _first_positive(cfg, ("n_shared_experts",), path)
    if not n_shared:
        return 0
    return n_shared * _first_positive(cfg, ("moe_intermediate_size", "intermediate_size"), path)


def _bits_value(value: Any) -> float | None:
    """A ``bits`` entry as a number (numbers and numeric strings), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            return None
    return None


def quantized_weight_bytes(quant: Any) -> float:
    """Weight bytes/param from a ``quantization_config`` object; 0.0 when it says nothing.

    ``bits``/8 first, then ``quant_method == "fp8"`` → 1.0, then (compressed-tensors) the first
    ``config_groups.<group>.weights.num_bits``/8 in sorted group order.
    """
    if not isinstance(quant, Mapping):
        return 0.0
    bits = _bits_value(quant.get("bits"))
    if bits is not None and bits > 0:
        return bits / 8.0
    method = quant.get("quant_method")
    if method == "fp8":
        return 1.0
    if method == "compressed-tensors":
        groups = quant.get("config_groups")
        if isinstance(groups, Mapping):
            for key in sorted(groups):
                group = groups[key]
                weights = group.get("weights") if isinstance(group, Mapping) else None
                nbits = _bits_value(weights.get("num_bits")) if isinstance(weights, Mapping) else None
                if nbits is not None and nbits > 0:
                    return nbits / 8.0
    return 0.0


def weight_bytes_from_model_name(model_name: str) -> float:
    """BLIS's name fallback: ``wXaY`` → X/8 bytes/param, ``fp8`` → 1.0, else 0.0 (unknown)."""
    name = model_name.lower()
    match = _WXAY.search(name)
    if match and int(match.group(1)) > 0:
        return int(match.group(1)) / 8.0
    if "fp8" in name:
        return 1.0
    return 0.0


# --------------------------------------------------------------------------------------------
# public entry points


def read_config_json(config_path: str | Path) -> dict[str, Any]:
    """The config.json object with any ``text_config`` object merged (shallowly) over the root."""
    path = Path(config_path)
    raw = read_json_object(path, "model config file")
    text = raw.get("text_config")
    return {**raw, **text} if isinstance(text, dict) else raw


def blis_model_from_dict(cfg: Mapping[str, Any], model_name: str = "", path: str | Path = "config.json") -> BlisModel:
    """Parse an (already text_config-merged) config mapping the way BLIS does.

    ``model_name`` is lowercased (BLIS lowercases ``--model``) and used only for the
    weight-precision fallback; ``path`` only names the source in error messages.
    """
    path = Path(path)
    heads = _required(cfg, ("num_attention_heads",), path)
    kv_heads = _first_positive(cfg, ("num_key_value_heads", "num_kv_heads", "multi_query_group_num"), path)
    name = model_name.lower()
    weight_bytes = quantized_weight_bytes(cfg.get("quantization_config"))
    if weight_bytes == 0.0:
        weight_bytes = weight_bytes_from_model_name(name)
    act = cfg.get("hidden_act")
    return BlisModel(
        num_layers=_required(cfg, ("num_hidden_layers",), path),
        hidden=_required(cfg, ("hidden_size",), path),
        heads=heads,
        kv_heads=kv_heads or heads,
        intermediate=_required(cfg, ("intermediate_size", "ffn_hidden_size"), path),
        bytes_per_param=_bytes_per_param(cfg, path),
        weight_bytes_per_param=weight_bytes,
        num_local_experts=_expert_count(cfg, path),
        num_experts_per_tok=_first_positive(cfg, ("num_experts_per_tok",), path),
        moe_intermediate=_first_positive(cfg, ("moe_intermediate_size",), path),
        shared_expert_ffn=_shared_expert_ffn(cfg, path),
        interleave_moe_layer_step=_first_positive(cfg, ("interleave_moe_layer_step",), path),
        dense_intermediate=_first_positive(cfg, ("intermediate_size_mlp",), path),
        head_dim=_first_positive(cfg, ("head_dim",), path),
        first_k_dense_replace=_first_positive(cfg, ("first_k_dense_replace",), path),
        kv_lora_rank=_first_positive(cfg, ("kv_lora_rank",), path),
        qk_rope_head_dim=_first_positive(cfg, ("qk_rope_head_dim",), path),
        vocab_size=_first_positive(cfg, ("vocab_size",), path),
        hidden_act=act if isinstance(act, str) else "",
        name=name,
    )


def load_blis_model(config_path: str | Path, model_name: str = "") -> BlisModel:
    """Read ``config_path`` (a HuggingFace config.json) into a :class:`BlisModel`, as BLIS would
    for ``--model model_name``. Raises :class:`RoofcalError` naming the file and field."""
    return blis_model_from_dict(read_config_json(config_path), model_name, config_path)

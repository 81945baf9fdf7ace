"""BLIS trained-physics basis functions and step-time formula (docs/blis-latency-models.md §1).

Pipeline, all float64 (BLIS is float64, and the result is truncated to an integer µs):

* :func:`blis_constants` folds model, hardware, TP/DP and MoE comm backend into per-token
  coefficients (:class:`BlisConstants`, §1.3);
* :class:`BlisBatch` holds a batch of steps as padded ``(n_steps, max_reqs)`` arrays;
* :func:`blis_basis` gives each basis term per step (shape ``(n_steps,)``, §1.4);
* :func:`blis_step_time` / :func:`blis_step_time_float` apply the β vector (§1.5).

The array code is plain ``jax.numpy`` with no Python loops over steps or requests, so
:func:`basis_from_arrays` can be wrapped in ``jax.jit`` with the constants static. Public
functions switch on ``jax_enable_x64`` locally; the returned arrays are float64 / int64.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from roofcal.blis.config import BlisModel
from roofcal.errors import RoofcalError

#: KV-cache bytes per element: BLIS hard-codes FP16 whatever the model or KV dtype.
KV_BYTES = 2.0

#: MoE comm backends by volume family (§1.4 T_moe_dispatch). ``""`` = vLLM default (all-gather).
ALLGATHER_BACKENDS = ("", "naive", "allgather_reducescatter")
ALL2ALL_BACKENDS = ("pplx", "deepep_high_throughput", "deepep_low_latency", "mori", "flashinfer_all2allv")

#: Basis-term names, in the order of the 11-β formula's terms.
BASIS_TERMS = (
    "t_pf_compute_us",
    "t_pf_kv_us",
    "t_dc_compute_us",
    "t_dc_kv_us",
    "t_weight_us",
    "t_tp_allreduce_us",
    "t_moe_dispatch_us",
    "num_layers",
    "batch_size",
    "constant",
    "interleaved_moe_layers",
)

#: Number of β values BLIS keeps; extra ones are silently dropped.
N_BETA = 11
MIN_BETA = 7
MIN_ALPHA = 3
MAX_INT64 = np.iinfo(np.int64).max


# --------------------------------------------------------------------------------------------
# hardware


#: BlisHardware attribute → BLIS ``HardwareCalib`` JSON key.
_HW_KEYS = {
    "tflops_peak": "TFlopsPeak",
    "bw_peak_tbs": "BwPeakTBs",
    "tflops_fp8": "TFlopsFP8",
    "mfu_prefill": "mfuPrefill",
    "mfu_decode": "mfuDecode",
    "memory_gib": "MemoryGiB",
}


@dataclass(frozen=True)
class BlisHardware:
    """BLIS ``HardwareCalib``: peak rates in 1e12 FLOP/s (``tflops_*``) and 1e12 B/s
    (``bw_peak_tbs``), MFUs dimensionless (unused by trained-physics), memory in GiB.

    Attribute ↔ JSON key: tflops_peak ↔ TFlopsPeak, tflops_fp8 ↔ TFlopsFP8 (0 = no FP8),
    bw_peak_tbs ↔ BwPeakTBs, mfu_prefill ↔ mfuPrefill, mfu_decode ↔ mfuDecode, memory_gib ↔ MemoryGiB.
    """

    tflops_peak: float
    bw_peak_tbs: float
    tflops_fp8: float = 0.0
    mfu_prefill: float = 0.0
    mfu_decode: float = 0.0
    memory_gib: float = 0.0

    @classmethod
    def from_dict(cls, entry: Mapping[str, Any], source: str = "hardware entry") -> "BlisHardware":
        """Decode like Go's ``encoding/json``: unknown keys ignored, missing keys 0; a non-number
        value raises :class:`RoofcalError` naming ``source`` and the key."""
        if not isinstance(entry, Mapping):
            raise RoofcalError(f"{source}: expected a JSON object, got {type(entry).__name__}")
        values = {}
        for attr, key in _HW_KEYS.items():
            value = entry.get(key, 0.0)
            if value is None:
                value = 0.0
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise RoofcalError(f"{source}: field '{key}': expected a number, got {value!r}")
            values[attr] = float(value)
        return cls(**values)


# --------------------------------------------------------------------------------------------
# deployment constants


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class BlisConstants:
    """Per-deployment constants of BLIS's ``TrainedPhysicsModel`` as per-token coefficients.

    FLOPs per token are divided by ``flops_peak_us`` (FLOP/µs) and bytes by ``bw_us`` (B/µs) in
    :func:`basis_from_arrays`. Each field is a float, or an array of shape ``(n_steps,)`` when
    steps of different deployments are evaluated together (:func:`stack_constants`). A JAX pytree.
    """

    flops_per_token: float  # FLOP/token: projections + routed/shared MoE FFN + dense FFN
    attn_flops_per_ctx: float  # FLOP per (query token × context token): (L/dp)·4·(H/tp)·dH
    kv_bytes_per_token: float  # B per KV token written/read: L·2·(dKV/(tp·dp))·2
    weight_bytes: float  # B per step, independent of the batch
    tp_bytes_per_token: float  # B per token of TP all-reduce (attention + dense FFN + MoE reduce)
    dispatch_bytes_per_token: float  # B per token of MoE dispatch/combine (dp > 1 only)
    flops_peak_us: float  # FLOP/µs (FP8 rate when weights are exactly 1 B/param)
    bw_us: float  # HBM B/µs
    num_layers: float
    interleaved_moe_layers: float  # nMoE if interleaved MoE, else 0


def layer_split(model: BlisModel) -> tuple[int, int]:
    """(MoE layers, dense layers) by BLIS's rule: ``nMoE = L // (step+1)`` when interleaved."""
    if not model.is_moe:
        return 0, model.num_layers
    step = model.interleave_moe_layer_step
    n_moe = model.num_layers // (step + 1) if step > 0 else model.num_layers
    return n_moe, model.num_layers - n_moe


def blis_constants(model: BlisModel, hw: BlisHardware, tp: int, dp: int = 1, moe_comm_backend: str = "") -> BlisConstants:
    """Fold model, hardware and parallelism into :class:`BlisConstants` (validated first)."""
    validate_blis_deployment(model, hw, tp, dp, moe_comm_backend)
    L, d, H = model.num_layers, model.hidden, model.heads
    dH = d // H  # explicit head_dim is ignored for step time
    dkv = model.kv_heads * dH
    n_moe, n_dense = layer_split(model)
    ff_moe = model.moe_intermediate or model.intermediate
    ff_dense = model.dense_intermediate or model.intermediate
    ff_shared = model.shared_expert_ffn if model.is_moe else 0
    k_eff = max(1, model.num_experts_per_tok)
    dp = max(1, dp)
    tpdp = tp * dp
    group = tp * dp if model.is_moe else tp
    weight_bpp = model.weight_bytes_per_param if model.weight_bytes_per_param > 0 else model.bytes_per_param
    act_bpp = model.bytes_per_param
    fp8 = weight_bpp == 1.0 and hw.tflops_fp8 > 0
    flops_peak_us = (hw.tflops_fp8 if fp8 else hw.tflops_peak) * 1e6
    bw_us = hw.bw_peak_tbs * 1e6

    flops = L * 2 * d * (2 * d + 2 * dkv) / tpdp  # Q,O (2d²) + K,V (2·d·dKV), 2 FLOP/MAC
    flops += n_moe * (k_eff / group) * 6 * d * ff_moe  # routed experts, 3 matrices
    flops += n_moe * 6 * d * ff_shared / tpdp  # shared experts
    flops += n_dense * 6 * d * ff_dense / tpdp

    weights = L * d * (2 * d + 2 * dkv) * weight_bpp / tp
    weights += n_moe * (model.num_local_experts / group) * 3 * d * ff_moe * weight_bpp
    weights += n_moe * 3 * d * ff_shared * weight_bpp / tp
    weights += n_dense * 3 * d * ff_dense * weight_bpp / tp

    allreduce_units = 0.0
    if tp > 1:
        allreduce_units = L / dp + n_dense / dp
        if model.is_moe and dp == 1:
            allreduce_units += n_moe
    tp_bytes = allreduce_units * d * act_bpp * 2 * (tp - 1) / tp

    dispatch = 0.0
    if model.is_moe and dp > 1:
        frac = (group - 1) / group * 2 / dp  # per global token: (T/dp)·(g−1)/g·2
        top_k = k_eff if moe_comm_backend in ALL2ALL_BACKENDS else 1
        dispatch = n_moe * top_k * frac * d * act_bpp

    interleaved = model.is_moe and model.interleave_moe_layer_step > 0
    return BlisConstants(
        flops_per_token=flops,
        attn_flops_per_ctx=L / dp * 4 * (H // tp) * dH,
        kv_bytes_per_token=L * 2 * (dkv / tpdp) * KV_BYTES,
        weight_bytes=weights,
        tp_bytes_per_token=tp_bytes,
        dispatch_bytes_per_token=dispatch,
        flops_peak_us=flops_peak_us,
        bw_us=bw_us,
        num_layers=float(L),
        interleaved_moe_layers=float(n_moe if interleaved else 0),
    )


def stack_constants(constants: Sequence[BlisConstants]) -> BlisConstants:
    """One :class:`BlisConstants` whose fields are float64 arrays of shape ``(len(constants),)``:
    row i holds ``constants[i]`` (e.g. one row per step of a mixed-deployment batch)."""
    names = [f.name for f in fields(BlisConstants)]
    return BlisConstants(**{n: np.array([getattr(c, n) for c in constants], dtype=np.float64) for n in names})


# --------------------------------------------------------------------------------------------
# batches


_REQUEST_KEYS = ("input_len", "progress_index", "num_new_tokens", "num_output_tokens")


@dataclass(frozen=True, eq=False)
class BlisBatch:
    """Steps as padded int64 arrays of shape ``(n_steps, max_reqs)``; ``mask`` marks real requests.

    Per request (tokens): ``input_len`` = prompt length, ``progress_index`` = tokens processed so
    far (prompt + generated), ``num_new_tokens`` = tokens computed this step,
    ``num_output_tokens`` = the request's total output length (BLIS ``len(OutputTokens)``).
    """

    input_len: np.ndarray
    progress_index: np.ndarray
    num_new_tokens: np.ndarray
    num_output_tokens: np.ndarray
    mask: np.ndarray

    @property
    def n_steps(self) -> int:
        return int(self.mask.shape[0])

    @classmethod
    def from_steps(cls, steps: Sequence[Sequence[Mapping[str, Any]]], source: str = "steps") -> "BlisBatch":
        """Build from a list of steps, each a list of request dicts with the four keys above
        (the goldens' ``batch`` format). A bad entry raises :class:`RoofcalError` naming it."""
        n = len(steps)
        width = max((len(step) for step in steps), default=0)
        arrays = {key: np.zeros((n, width), dtype=np.int64) for key in _REQUEST_KEYS}
        mask = np.zeros((n, width), dtype=bool)
        for i, step in enumerate(steps):
            for j, req in enumerate(step):
                for key in _REQUEST_KEYS:
                    value = req.get(key) if isinstance(req, Mapping) else None
                    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or value < 0:
                        raise RoofcalError(
                            f"{source}[{i}][{j}]: field '{key}': expected a non-negative integer, got {value!r}"
                        )
                    arrays[key][i, j] = int(value)
                mask[i, j] = True
        return cls(mask=mask, **arrays)

    @classmethod
    def concat(cls, batches: Sequence["BlisBatch"]) -> "BlisBatch":
        """Stack the steps of several batches (padding to the widest)."""
        width = max((b.mask.shape[1] for b in batches), default=0)

        def pad(a: np.ndarray) -> np.ndarray:
            return np.pad(a, ((0, 0), (0, width - a.shape[1])))

        names = [f.name for f in fields(cls)]
        return cls(**{name: np.concatenate([pad(getattr(b, name)) for b in batches]) for name in names})


# --------------------------------------------------------------------------------------------
# basis functions


def basis_from_arrays(c: BlisConstants, input_len, progress_index, num_new_tokens, num_output_tokens, mask) -> dict[str, jnp.ndarray]:
    """Basis terms per step from ``(n_steps, max_reqs)`` arrays; each output has shape ``(n_steps,)``.

    Pure ``jax.numpy``, jit-able with ``c`` static; call it with ``jax_enable_x64`` on. A request is
    prefill if ``progress_index < input_len`` (chunk t = num_new_tokens, context S = input_len,
    attention ∝ t·(S + t/2)); otherwise decode if it has output tokens (context = progress_index);
    every request counts in ``batch_size``. Empty steps get all terms 0.
    """
    f64 = jnp.float64
    mask = jnp.asarray(mask, bool)
    S = jnp.asarray(input_len, f64)
    progress = jnp.asarray(progress_index, f64)
    t = jnp.asarray(num_new_tokens, f64)
    prefill = mask & (progress < S)
    decode = mask & ~prefill & (jnp.asarray(num_output_tokens) > 0)

    t_pf = jnp.sum(jnp.where(prefill, t, 0.0), axis=-1)  # prefill tokens
    attn_pf = jnp.sum(jnp.where(prefill, t * (S + t / 2), 0.0), axis=-1)  # Σ t·(S + t/2)
    t_dc = jnp.sum(decode, axis=-1).astype(f64)  # decode tokens (1 each)
    ctx_dc = jnp.sum(jnp.where(decode, progress, 0.0), axis=-1)  # Σ context of decodes
    n_req = jnp.sum(mask, axis=-1).astype(f64)
    nonempty = (n_req > 0).astype(f64)
    tokens = t_pf + t_dc

    pf_compute = (c.flops_per_token * t_pf + c.attn_flops_per_ctx * attn_pf) / c.flops_peak_us
    dc_compute = (c.flops_per_token * t_dc + c.attn_flops_per_ctx * ctx_dc) / c.flops_peak_us
    return {
        "t_pf_compute_us": jnp.where(t_pf > 0, pf_compute, 0.0),
        "t_pf_kv_us": jnp.where(t_pf > 0, c.kv_bytes_per_token * t_pf / c.bw_us, 0.0),
        "t_dc_compute_us": jnp.where(t_dc > 0, dc_compute, 0.0),
        "t_dc_kv_us": jnp.where(t_dc > 0, c.kv_bytes_per_token * (ctx_dc + t_dc) / c.bw_us, 0.0),
        "t_weight_us": nonempty * (c.weight_bytes / c.bw_us),
        "t_tp_allreduce_us": c.tp_bytes_per_token * tokens / c.bw_us,
        "t_moe_dispatch_us": c.dispatch_bytes_per_token * tokens / c.bw_us,
        "num_layers": nonempty * c.num_layers,
        "batch_size": n_req,
        "constant": nonempty,
        "interleaved_moe_layers": nonempty * c.interleaved_moe_layers,
    }


_basis_jit = jax.jit(basis_from_arrays)


def basis_for_constants(c: BlisConstants, batch: BlisBatch) -> dict[str, jnp.ndarray]:
    """:func:`basis_from_arrays` on a :class:`BlisBatch`, jitted, float64 (shape ``(n_steps,)``)."""
    with jax.enable_x64(True):
        c64 = jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float64), c)
        return _basis_jit(
            c64, batch.input_len, batch.progress_index, batch.num_new_tokens, batch.num_output_tokens, batch.mask
        )


def blis_basis(model: BlisModel, hw: BlisHardware, tp: int, dp: int, moe_comm_backend: str, batch: BlisBatch) -> dict[str, jnp.ndarray]:
    """Every trained-physics basis term per step (float64, shape ``(n_steps,)``).

    Times in µs (``t_*_us``); ``num_layers``, ``batch_size``, ``constant`` and
    ``interleaved_moe_layers`` are counts. These are the values BLIS multiplies by each β.
    Refuses (:class:`RoofcalError`) deployments BLIS refuses (:func:`validate_blis_deployment`).
    """
    return basis_for_constants(blis_constants(model, hw, tp, dp, moe_comm_backend), batch)


# --------------------------------------------------------------------------------------------
# step time


@dataclass(frozen=True)
class EffectiveBeta:
    """A β vector in BLIS's 11-slot order with its length semantics resolved.

    ``beta`` = [β1a, β2a, β3, β4, β5, β6, β7, β8, β1b, β2b, β_EP] (β8 = 0 for 7 values, β_EP = β4
    for < 11); ``prefill_split`` (≥ 9 values) and ``decode_split`` (≥ 10) select the split forms
    over ``β·max(compute, kv)``.
    """

    beta: Any
    prefill_split: bool
    decode_split: bool


def effective_beta(beta) -> EffectiveBeta:
    """Resolve a user β vector (length ≥ 7; values past the 11th are dropped) as BLIS does.

    Concrete input gives a numpy float64 vector; a traced JAX array (inside ``jit``/``grad``)
    stays traced, so the β vector can be a fitted parameter.
    """
    xp = jnp if isinstance(beta, jax.core.Tracer) else np
    with jax.enable_x64(True):
        b = xp.asarray(beta, dtype=xp.float64)
        if b.ndim != 1 or b.shape[0] < MIN_BETA:
            n = b.shape[0] if b.ndim == 1 else b.size
            raise RoofcalError(
                f"trained-physics model: BetaCoeffs requires at least {MIN_BETA} elements, got {n} "
                "(expected β₁-β₇, optionally β₈)"
            )
        n = min(int(b.shape[0]), N_BETA)
        b = b[:n]
        if n < 8:
            b = xp.concatenate([b, xp.zeros(1)])  # β8 = 0
        if n < 11:
            b = xp.concatenate([b, xp.zeros(10 - b.shape[0]), b[3:4]])  # β1b, β2b unused; β_EP = β4
        return EffectiveBeta(b, prefill_split=n >= 9, decode_split=n >= 10)


def combine_basis(basis: Mapping[str, Any], beta, prefill_split, decode_split) -> jnp.ndarray:
    """Σ β·basis per step (µs, float64). ``beta`` is an effective 11-vector of shape ``(11,)`` or
    ``(n_steps, 11)``; the split flags are bools or per-step bool arrays. Call with x64 on."""
    b = jnp.asarray(beta, jnp.float64)
    B = [b[..., i] for i in range(N_BETA)]
    pfc, pfkv = basis["t_pf_compute_us"], basis["t_pf_kv_us"]
    dcc, dckv = basis["t_dc_compute_us"], basis["t_dc_kv_us"]
    prefill = jnp.where(prefill_split, B[0] * pfc + B[8] * pfkv, B[0] * jnp.maximum(pfc, pfkv))
    decode = jnp.where(decode_split, B[1] * dcc + B[9] * dckv, B[1] * jnp.maximum(dcc, dckv))
    return (
        prefill
        + decode
        + B[2] * basis["t_weight_us"]
        + B[3] * basis["t_tp_allreduce_us"]
        + B[10] * basis["t_moe_dispatch_us"]
        + B[4] * basis["num_layers"]
        + B[5] * basis["batch_size"]
        + B[6] * basis["constant"]
        + B[7] * basis["interleaved_moe_layers"]
    )


def truncate_step_time(total, batch_size) -> jnp.ndarray:
    """BLIS's int64 conversion: truncate toward zero, NaN (or ≥ 2⁶³) → MaxInt64, floor at 1,
    and 1 µs for an empty step (``batch_size == 0``). Call with x64 on."""
    total = jnp.asarray(total, jnp.float64)
    overflow = jnp.isnan(total) | (total >= 2.0**63)
    safe = jnp.where(overflow, 0.0, jnp.clip(total, -(2.0**62), None))
    steps = jnp.maximum(jnp.trunc(safe).astype(jnp.int64), 1)
    steps = jnp.where(overflow, MAX_INT64, steps)
    return jnp.where(jnp.asarray(batch_size) > 0, steps, 1)


_combine_jit = jax.jit(combine_basis)
_truncate_jit = jax.jit(truncate_step_time)


def _basis64(basis: Mapping[str, Any]) -> dict[str, Any]:
    """The basis terms as float64 arrays (only the names in :data:`BASIS_TERMS`)."""
    return {name: jnp.asarray(basis[name], jnp.float64) for name in BASIS_TERMS}


def blis_step_time_float(basis: Mapping[str, Any], beta) -> jnp.ndarray:
    """Untruncated step time per step (µs, float64, shape ``(n_steps,)``), for fitting.

    Uses the β-length semantics of :func:`effective_beta`; an empty step gives 0.
    """
    eff = effective_beta(beta)
    with jax.enable_x64(True):
        return _combine_jit(_basis64(basis), eff.beta, eff.prefill_split, eff.decode_split)


def blis_step_time(basis: Mapping[str, Any], beta) -> jnp.ndarray:
    """BLIS ``StepTime`` per step: int64 µs, ≥ 1 (see :func:`truncate_step_time`)."""
    total = blis_step_time_float(basis, beta)
    with jax.enable_x64(True):
        return _truncate_jit(total, jnp.asarray(basis["batch_size"], jnp.float64))


# --------------------------------------------------------------------------------------------
# validation


def _check_values(values: Sequence[float], label: str, prefix: str) -> None:
    """BLIS's per-element NaN / Inf / negative checks."""
    for i, value in enumerate(values):
        value = float(value)
        if math.isnan(value):
            raise RoofcalError(f"{prefix}: {label}[{i}] is NaN")
        if math.isinf(value):
            raise RoofcalError(f"{prefix}: {label}[{i}] is Inf")
        if value < 0:
            raise RoofcalError(f"{prefix}: {label}[{i}] must be non-negative, got {value:f}")


def validate_blis_coeffs(alpha: Sequence[float], beta: Sequence[float]) -> None:
    """Refuse coefficient vectors BLIS refuses: ≥ 3 alphas and ≥ 7 betas, all finite and ≥ 0.

    There is no upper bound on the β count (BLIS silently keeps the first 11).
    """
    alpha, beta = list(np.ravel(np.asarray(alpha, dtype=float))), list(np.ravel(np.asarray(beta, dtype=float)))
    if len(alpha) < MIN_ALPHA:
        raise RoofcalError(f"latency model: AlphaCoeffs requires at least {MIN_ALPHA} elements, got {len(alpha)}")
    _check_values(alpha, "AlphaCoeffs", "latency model")
    if len(beta) < MIN_BETA:
        raise RoofcalError(
            f"trained-physics model: BetaCoeffs requires at least {MIN_BETA} elements, got {len(beta)} "
            "(expected β₁-β₇, optionally β₈)"
        )
    _check_values(beta, "BetaCoeffs", "trained-physics model")


def _positive(value: float) -> bool:
    return math.isfinite(value) and value > 0


def validate_blis_deployment(model: BlisModel, hw: BlisHardware, tp: int, dp: int = 1, moe_comm_backend: str = "") -> None:
    """Refuse deployments BLIS refuses (``NewModelHardwareConfig`` then ``NewTrainedPhysicsModel``):
    DP ≥ 1 and DP > 1 only for MoE; known comm backend; TP > 0 dividing heads and KV heads;
    positive shape, dtype and peak rates; MoE needs experts per token."""
    if dp < 1:
        raise RoofcalError(f"NewModelHardwareConfig: DP must be >= 1, got {dp}")
    if dp > 1 and not model.is_moe:
        raise RoofcalError(f"NewModelHardwareConfig: DP={dp} requires a MoE model; dense models support only DP=1")
    p = "trained-physics model"
    if moe_comm_backend not in ALLGATHER_BACKENDS + ALL2ALL_BACKENDS:
        valid = " ".join(b for b in ALLGATHER_BACKENDS + ALL2ALL_BACKENDS if b)
        raise RoofcalError(f'{p}: unknown MoE comm backend "{moe_comm_backend}" (valid: [{valid}])')
    if tp <= 0:
        raise RoofcalError(f"{p}: TP must be > 0, got {tp}")
    for label, value in (
        ("NumLayers", model.num_layers),
        ("NumHeads", model.heads),
        ("HiddenDim", model.hidden),
        ("IntermediateDim", model.intermediate),
    ):
        if value <= 0:
            raise RoofcalError(f"{p}: {label} must be > 0, got {value}")
    if model.heads % tp:
        raise RoofcalError(f"{p}: NumHeads ({model.heads}) must be divisible by TP ({tp})")
    if model.kv_heads <= 0 or model.kv_heads % tp:
        raise RoofcalError(f"{p}: NumKVHeads ({model.kv_heads}) must be divisible by TP ({tp})")
    if not _positive(hw.tflops_peak):
        raise RoofcalError(f"{p}: TFlopsPeak must be a valid positive number, got {hw.tflops_peak}")
    if not _positive(hw.bw_peak_tbs):
        raise RoofcalError(f"{p}: BwPeakTBs must be a valid positive number, got {hw.bw_peak_tbs}")
    if not _positive(model.bytes_per_param):
        raise RoofcalError(f"{p}: BytesPerParam must be a valid positive number, got {model.bytes_per_param}")
    if model.is_moe and model.num_experts_per_tok <= 0:
        raise RoofcalError(f"{p}: NumExpertsPerTok must be > 0 for a MoE model, got {model.num_experts_per_tok}")

"""The learned correction layer: from ideal (roofline) times to predicted kernel times.

For a kernel with ideal compute time ``tc = FLOPs / peak`` and ideal memory time
``tm = bytes / bandwidth`` (µs), the predicted time is::

    t = latency + smax_q(tc / eff_c(z), tm / eff_m(z)),   smax_q(a, b) = (a^q + b^q)^(1/q)

* ``eff_c``, ``eff_m`` ∈ (0, 1): achieved fraction of the compute / memory peak. Each is a logistic
  function of a polynomial (degree 4 for GEMM, decode attention and MoE, 3 for prefill attention
  and all-reduce: :data:`OP_KINDS`) in the kernel's standardized log-shape
  ``z_j = (log2(1 + x_j) − c_j) / s_j`` (for a GEMM ``x = (m, n, k)``). Small kernels run far
  below peak (low occupancy, tile and wave quantization) and the surface learns where and how fast
  efficiency rises with the amount of work. Outside the shapes seen in fitting ``z`` is clamped to
  the fitted range, so efficiency stays flat instead of extrapolating a polynomial.
* ``latency`` > 0 µs: fixed cost of a call (launch, prologue, synchronisation).
* ``q`` ≥ 1: soft-max sharpness; q = 1 adds compute and memory time, q → ∞ takes the larger.

At step level — the *serving stack* — in µs: overheads per step, per layer, per prefill sequence,
per decode sequence, per token, and per all-reduce per peer GPU (synchronisation that grows with
TP − 1; with the per-layer launch gaps paid on the GPU, the rest is CPU-side work); ``overlap``
≥ 1, the soft-max sharpness combining the GPU's work and the CPU's (1 = serial sum); ``scales``
> 0, how much slower (> 1) or faster each kernel group (GEMM, attention, MoE, all-reduce,
elementwise) runs inside whole steps of a serving stack than in isolation; and ``mix`` ≥ 1, the
soft-max sharpness combining the prefill and decode attention calls of a mixed step (1 = they run
one after the other).

All parameters are stored unconstrained ("raw") for optimisation and mapped into their valid
ranges by construction: sigmoid (efficiencies), exp (latencies and overheads, which span µs to
tens of ms, so the optimiser moves them by relative steps), 1 + softplus (sharpness). The
coefficient file stores the physical values.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import lru_cache

import jax
import jax.numpy as jnp
import numpy as np

from roofcal.physics.components.comm import COLLECTIVES
from roofcal.programs import LIGHT, stored


@dataclass(frozen=True)
class OpKind:
    """A kernel family: its shape descriptors, their standardisation and the surface degree.

    ``center`` / ``scale`` are in log2(1 + x) units and fixed in code, so a fitted surface means
    the same thing on every machine. ``link`` marks communication (memory time over the GPU link
    rather than HBM). ``sharpness``: (q, pseudo-rows) holding the soft max's sharpness at q where
    the physics fixes it and the data cannot (None: a weak prior at 3).
    """

    name: str
    descriptors: tuple[str, ...]
    center: tuple[float, ...]
    scale: tuple[float, ...]
    degree: int
    default_variant: str
    link: bool = False
    sharpness: tuple[float, float] | None = None


OP_KINDS: dict[str, OpKind] = {k.name: k for k in [
    OpKind("gemm", ("m", "n", "k", "tile_config"), (7, 11, 11, 0), (4, 3, 3, 1), 4, "bf16"),
    OpKind("attn_prefill", ("seqs", "seq_len", "cached", "heads", "kv_heads", "head_dim"),
           (3, 10, 0, 4, 2, 7), (3, 3, 4, 2, 2, 1), 3, "bf16"),
    OpKind("attn_decode", ("seqs", "context", "heads", "kv_heads", "head_dim"),
           (5, 10, 4, 2, 7), (3, 4, 2, 2, 1), 4, "bf16"),
    OpKind("allreduce", ("num_gpus", "bytes", "above_8mib", "two_stage"), (2, 20, 0, 0), (1, 6, 1, 1), 3, "custom",
           link=True),
    # MoE: a fused kernel streams the active experts' weights while it computes, so compute and
    # memory time overlap (q = 4 held): left free, q fits to ≈ 1 (serial) with the same held-out
    # error, and a memory-bound decode then grows with its tokens where the measured kernel is flat
    # (Mixtral TP 2, 16–256 tokens: 487–533 µs); degree 4 (degree 3 was 9.6 % held-out, bf16)
    OpKind("moe", ("tokens", "hidden", "inter", "topk", "experts", "tp", "ep", "skew"),
           (7, 12, 11, 3, 6, 1, 1, 0), (4, 1, 2, 1, 2, 1, 2, 1), 4, "bf16", sharpness=(4.0, 1000.0)),
    OpKind("elementwise", ("tokens", "hidden"), (8, 12), (4, 1), 1, "bf16"),
    # the collectives of data- and expert-parallel deployments, timed by nccl-tests (NCCL's
    # protocols switch with the size: one surface over GPUs and size, degree 4)
    *(OpKind(c, ("num_gpus", "bytes"), (2, 20), (1, 6), 4, "nccl", link=True) for c in COLLECTIVES),
]}

#: physically neutral defaults (used without a coefficient file): roofline at peak, no latency
NEUTRAL_EFFICIENCY = 1.0 - 1e-5
NEUTRAL_SHARPNESS = 32.0
STEP_OVERHEADS = ("step_us", "layer_us", "prefill_seq_us", "decode_seq_us", "token_us",
                  "allreduce_peer_us")
#: overheads paid on the GPU inside the forward pass (launch gaps per layer, all-reduce
#: synchronisation); the others are CPU-side work of the serving stack (scheduling, input
#: preparation, sampling, output processing), which may overlap the GPU's work
GPU_OVERHEADS = ("layer_us", "allreduce_peer_us")
CPU_OVERHEADS = tuple(n for n in STEP_OVERHEADS if n not in GPU_OVERHEADS)
#: kernel groups with a step-level scale, and the breakdown components in each
STEP_SCALES = {
    "gemm": ("qkv_proj", "o_proj", "router", "mlp_up", "mlp_down", "shared_up", "shared_down", "lm_head"),
    "attention": ("attn_prefill", "attn_decode"),
    "moe": ("moe",),
    "allreduce": ("allreduce",),
    "elementwise": ("elementwise",),
}


# --------------------------------------------------------------------------------------------
# constrained ↔ raw maps (float64-safe numpy versions for files, jnp versions for the model)

def softplus_inv(y: float) -> float:
    """x with softplus(x) = y (y > 0)."""
    y = float(y)
    return y + math.log(-math.expm1(-y)) if y < 30 else y


def logit(p: float) -> float:
    p = min(max(float(p), 1e-12), 1 - 1e-12)
    return math.log(p / (1 - p))


def softplus(x):
    return jax.nn.softplus(x)


# --------------------------------------------------------------------------------------------
# efficiency surface

@lru_cache(maxsize=None)
def exponents(n_desc: int, degree: int) -> np.ndarray:
    """Monomial exponents (terms × descriptors) of a full polynomial, constant term first."""
    rows = [(0,) * n_desc]
    for d in range(1, degree + 1):
        for combo in itertools.combinations_with_replacement(range(n_desc), d):
            e = [0] * n_desc
            for j in combo:
                e[j] += 1
            rows.append(tuple(e))
    return np.array(rows, dtype=np.int32)


def degree_of(n_desc: int, n_terms: int) -> int:
    """The polynomial degree whose term count over ``n_desc`` descriptors is ``n_terms``."""
    for deg in range(0, 8):
        if len(exponents(n_desc, deg)) == n_terms:
            return deg
    raise ValueError(f"{n_terms} terms is no full polynomial in {n_desc} variables")


def term_names(kind: str, degree: int) -> list[str]:
    """Readable monomial names, e.g. ``1``, ``m``, ``m*k``, ``n^2``."""
    desc = OP_KINDS[kind].descriptors
    names = []
    for row in exponents(len(desc), degree):
        parts = [d if e == 1 else f"{d}^{e}" for d, e in zip(desc, row) if e]
        names.append("*".join(parts) or "1")
    return names


def standardize(kind: str, shape) -> jnp.ndarray:
    """Descriptor arrays → standardized log-shape ``z`` of shape (..., n_desc)."""
    k = OP_KINDS[kind]
    cols = [(jnp.log2(1.0 + jnp.asarray(x, jnp.float32)) - c) / s
            for x, c, s in zip(shape, k.center, k.scale)]
    cols = jnp.broadcast_arrays(*cols)
    return jnp.stack(cols, axis=-1)


@lru_cache(maxsize=None)
def _recursion(n_desc: int, degree: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """For each degree d ≥ 1: (parent term index, descriptor index) of its terms, in the order of
    :func:`exponents`, so term = parent term × z[descriptor] (one multiply per term)."""
    rows = [tuple(r) for r in exponents(n_desc, degree)]
    index = {r: i for i, r in enumerate(rows)}
    levels = []
    for d in range(1, degree + 1):
        parents, last = [], []
        for r in rows:
            if sum(r) != d:
                continue
            j = max(i for i, e in enumerate(r) if e)          # highest descriptor present
            parent = list(r)
            parent[j] -= 1
            parents.append(index[tuple(parent)])
            last.append(j)
        levels.append((np.array(parents), np.array(last)))
    return levels


@stored(static_argnames=("degree",))
def features(z, lo, hi, degree: int) -> jnp.ndarray:
    """Polynomial features (..., terms) of ``z`` clamped to [lo, hi], in :func:`exponents` order."""
    zc = jnp.clip(z, lo, hi)
    terms = [jnp.ones(z.shape[:-1] + (1,), z.dtype)]
    for parents, last in _recursion(z.shape[-1], degree):
        prev = jnp.concatenate(terms, axis=-1)
        terms.append(prev[..., parents] * zc[..., last])
    return jnp.concatenate(terms, axis=-1)


# --------------------------------------------------------------------------------------------
# one kernel

#: kinds whose memory traffic a warm L2 serves in a per-op table (:mod:`roofcal.physics.cache`):
#: every kind that reads device memory (the all-reduce's bytes cross the link)
CACHED_KINDS = ("gemm", "attn_prefill", "attn_decode", "moe", "elementwise")
#: raw ``l2_saving`` of the neutral correction: sigmoid(−30) ≈ 1e-13, no saving
NEUTRAL_L2_SAVING = -30.0


def neutral_op_params(kind: str, degree: int | None = None) -> dict:
    """Raw parameters of the neutral correction: efficiency ≈ 1, no latency, near-hard max, no
    warm-L2 saving."""
    k = OP_KINDS[kind]
    deg = k.degree if degree is None else degree
    n = len(exponents(len(k.descriptors), deg))
    w = np.zeros(n, np.float32)
    w[0] = logit(NEUTRAL_EFFICIENCY)
    return on_device({
        "eff_c": w, "eff_m": w.copy(), "latency": math.log(1e-9),
        "sharpness": softplus_inv(NEUTRAL_SHARPNESS - 1.0),
        "lo": np.full(len(k.descriptors), -4.0), "hi": np.full(len(k.descriptors), 4.0),
        **({"l2_saving": np.float32(NEUTRAL_L2_SAVING)} if kind in CACHED_KINDS else {}),
    })


def on_device(tree):
    """``tree`` with every leaf a float32 JAX array, built on the host and put on the device:
    ``jnp.asarray``, ``jnp.full`` or ``.at[].set`` would each trace and load (or compile) a small
    XLA program per shape, ≈ 5–10 ms apiece from the disk cache, ≈ 20 ms to compile (a fit's first
    use of every kernel kind: 19 of them)."""
    return jax.tree_util.tree_map(lambda x: jax.device_put(np.asarray(x, np.float32)), tree)


def smax(a, b, q):
    """Soft maximum (a^q + b^q)^(1/q) of non-negative times, stable for large q; ≈0 when both 0.

    Ratios are floored at 1e-30 so the gradient with respect to q stays finite at a = 0. The
    powers are written as exp(q·log r): XLA's CPU backend computes ``r ** q`` at ≈ 6 ns an element,
    exp and log at ≈ 1 (the fit's loss and gradient over 10,000 rows: 0.31 → 0.08 ms).
    """
    mx = jnp.maximum(jnp.maximum(a, b), 1e-30)
    ra, rb = jnp.maximum(a / mx, 1e-30), jnp.maximum(b / mx, 1e-30)
    return mx * jnp.exp(jnp.log(jnp.exp(q * jnp.log(ra)) + jnp.exp(q * jnp.log(rb))) / q)


def _is_constant(x) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating))


@lru_cache(maxsize=None)
def _fold_index(n_desc: int, degree: int, varying: tuple[int, ...]) -> np.ndarray:
    """For every term of the full polynomial, the index of its monomial in the varying
    descriptors among ``exponents(len(varying), degree)``."""
    reduced = {tuple(r): i for i, r in enumerate(exponents(len(varying), degree))}
    return np.array([reduced[tuple(row[list(varying)])] for row in exponents(n_desc, degree)])


def efficiencies(p: dict, kind: str, shape):
    """(compute efficiency, memory efficiency) in (0, 1) for descriptor arrays ``shape``.

    Descriptors given as Python numbers (a GEMM's n and k inside a model, head counts) are the same
    for every row, so they are folded into the coefficients once: the surface becomes a polynomial
    in the varying descriptors alone (a GEMM in a step: 5 terms instead of 35). Exact, and the hot
    path of step prediction.
    """
    k = OP_KINDS[kind]
    const = [j for j, x in enumerate(shape) if _is_constant(x)]
    if not const:
        return efficiencies_z(p, standardize(kind, shape))
    varying = tuple(j for j in range(len(shape)) if j not in const)
    deg = degree_of(len(shape), p["eff_c"].shape[0])
    lo, hi = jax.lax.stop_gradient(p["lo"]), jax.lax.stop_gradient(p["hi"])
    zc = jnp.stack([jnp.clip((math.log2(1.0 + float(shape[j])) - k.center[j]) / k.scale[j],
                             lo[j], hi[j]) for j in const])
    e = exponents(len(shape), deg)[:, const]                           # (terms, constants)
    factor = jnp.prod(zc[None, :] ** jnp.asarray(e, jnp.float32), axis=1)
    idx = jnp.asarray(_fold_index(len(shape), deg, varying))
    n_red = len(exponents(len(varying), deg))
    fold = lambda w: jnp.zeros(n_red, w.dtype).at[idx].add(w * factor)
    if not varying:
        one = jnp.ones(())
        return jax.nn.sigmoid(fold(p["eff_c"])[0] * one), jax.nn.sigmoid(fold(p["eff_m"])[0] * one)
    v = np.array(varying)
    z = standardize(kind, shape)[..., v]
    f = features(z, lo[v], hi[v], deg)
    return jax.nn.sigmoid(f @ fold(p["eff_c"])), jax.nn.sigmoid(f @ fold(p["eff_m"]))


def efficiencies_z(p: dict, z):
    """(compute efficiency, memory efficiency) for standardized shapes ``z`` (..., n_desc)."""
    deg = degree_of(z.shape[-1], p["eff_c"].shape[0])
    f = features(z, jax.lax.stop_gradient(p["lo"]), jax.lax.stop_gradient(p["hi"]), deg)
    return jax.nn.sigmoid(f @ p["eff_c"]), jax.nn.sigmoid(f @ p["eff_m"])


@jax.custom_vjp
def product(w, x_t, x):
    """``w @ x_t`` — ``w`` (K, T) parameters, ``x_t`` (T, M) data — differentiated in ``w`` alone,
    its gradient taken as ``g @ x`` from ``x`` = ``x_t``ᵀ held as its own array: XLA's CPU backend
    (jax 0.10.2) contracts two matrices over their long minor axis ≈ 2.5× slower than a plain
    product (a GEMM's 10,000 rows × 70 terms: 121 against 52 µs)."""
    return w @ x_t


def _product_fwd(w, x_t, x):
    return w @ x_t, x


def _product_bwd(x, g):
    return g @ x, None, None


product.defvjp(_product_fwd, _product_bwd)


def op_time_from_features(p: dict, f_t, tc, tm, f=None, res=None):
    """Corrected time (µs) of N rows from their precomputed features, held transposed: ``f_t``
    (terms, N) — the fit's hot path, where XLA's CPU backend takes the two surfaces' products
    faster from that layout (GEMM, 10,000 rows × 70 terms: a loss and its gradient 0.41 → 0.32
    ms) — and, for their gradient, ``f`` (N, terms) the same features rows first
    (:func:`product`; None: the gradient from ``f_t``)."""
    w = jnp.stack([p["eff_c"], p["eff_m"]])
    z = w @ f_t if f is None else product(w, f_t, f)
    return corrected_time(p, jax.nn.sigmoid(z[0]), jax.nn.sigmoid(z[1]), tc, tm, res)


#: the largest warm-L2 saving: an L2 at most 10× as fast as device memory (the L40S's kernels fit
#: 4–6×, the H100's up to 2×; left free, the L40S's block-FP8 MoE ran to 50×, a stand-in for
#: whatever else makes its small calls fast, not an L2)
L2_SAVING_MAX = 0.9


def l2_saving(p: dict):
    """The share of device-memory time a kernel saves on bytes a warm L2 holds (0 when its
    parameters have none): :data:`L2_SAVING_MAX` · sigmoid of the raw ``l2_saving``; the L2
    reads 1 / (1 − it) times as fast as device memory."""
    return L2_SAVING_MAX * jax.nn.sigmoid(p["l2_saving"]) if "l2_saving" in p else 0.0


def l2_saving_raw(g: float) -> float:
    """The raw parameter of a saving ``g`` in [0, :data:`L2_SAVING_MAX`) (the neutral one for 0)."""
    return logit(g / L2_SAVING_MAX) if g > 1e-6 else NEUTRAL_L2_SAVING


def warm_memory_time(p: dict, tm, res):
    """Ideal memory time (µs) of calls whose share ``res`` of the working set a warm L2 holds
    (:func:`roofcal.physics.cache.resident_fraction`): tm · (1 − res · saving); ``res`` None: a
    cold cache, ``tm`` as it is (whole steps)."""
    if res is None or "l2_saving" not in p:
        return tm
    return tm * (1.0 - res * l2_saving(p))


def corrected_time(p: dict, ec, em, tc, tm, res=None):
    """Corrected time (µs) of calls with ideal times ``tc``, ``tm`` (µs) at efficiencies ``ec``,
    ``em``: latency + smax(tc/ec, tm'/em), tm' the memory time with the warm L2's share ``res``
    (:func:`warm_memory_time`; None: cold, as in a served step); exactly 0 (with finite
    gradients) for calls with no work."""
    active = tc + tm > 0
    tc, tm = jnp.where(active, tc, 1.0), jnp.where(active, tm, 1.0)
    tm = warm_memory_time(p, tm, res)
    q = 1.0 + softplus(p["sharpness"])
    t = jnp.exp(p["latency"]) + smax(tc / ec, tm / em, q)
    return jnp.where(active, t, 0.0)


def op_time(p: dict, kind: str, shape, tc, tm):
    """Corrected time (µs) of kernel calls with ideal times ``tc``, ``tm`` (µs); 0 where no work."""
    ec, em = efficiencies(p, kind, shape)
    return corrected_time(p, ec, em, tc, tm)


@stored(options=LIGHT)
def op_time_z(p: dict, z, tc, tm, res):
    """:func:`op_time` from standardized shapes ``z`` of calls timed on a warm L2 holding their
    share ``res`` of the working set (compiled :data:`~roofcal.programs.LIGHT`: a program per
    kind and block size, run a few dozen times a fit)."""
    ec, em = efficiencies_z(p, z)
    return corrected_time(p, ec, em, tc, tm, res)


# --------------------------------------------------------------------------------------------
# step level

def neutral_step_params() -> dict:
    """No overheads, kernels as in isolation; prefill and decode attention of a mixed step add up."""
    return on_device({"overheads": np.full(len(STEP_OVERHEADS), math.log(1e-9)),
                      "scales": np.zeros(len(STEP_SCALES)), "mix": softplus_inv(1e-9)})


def step_scales(p: dict) -> dict:
    """{kernel group: scale} (exp of the raw log-scales)."""
    return dict(zip(STEP_SCALES, jnp.exp(p["scales"])))


def step_overheads(p: dict) -> jnp.ndarray:
    """Overheads in µs, in the order of ``STEP_OVERHEADS``."""
    return jnp.exp(p["overheads"])


def mix_sharpness(p: dict):
    return 1.0 + softplus(p["mix"])


def overlap_sharpness(p: dict):
    """q ≥ 1 of the CPU–GPU soft max; 1 (serial sum) when the stack has no ``overlap`` entry."""
    return 1.0 + softplus(p["overlap"]) if "overlap" in p else 1.0


def overlap(gpu, cpu, p: dict):
    """Cycle time (µs) of a step whose GPU work takes ``gpu`` µs and whose CPU-side work takes
    ``cpu`` µs: their soft max with sharpness ``overlap`` — q = 1 runs them one after the other
    (gpu + cpu), q → ∞ hides the shorter completely (max). Exactly ``gpu + cpu`` without an
    ``overlap`` entry."""
    if "overlap" not in p:
        return gpu + cpu
    return smax(gpu, cpu, overlap_sharpness(p))


def op_key(kind: str, variant: str) -> str:
    return f"{kind}/{variant}"


def lookup(ops: dict, kind: str, variant: str) -> tuple[str, dict]:
    """Parameters for (kind, variant): exact, else the kind's default variant, else neutral."""
    for key in (op_key(kind, variant), op_key(kind, OP_KINDS[kind].default_variant)):
        if key in ops:
            return key, ops[key]
    return op_key(kind, variant), neutral_op_params(kind)


def neutral_params() -> dict:
    """The parameter pytree used without a coefficient file."""
    return {"ops": {}, "step": neutral_step_params()}

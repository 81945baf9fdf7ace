"""Zero-shot transfer of a fitted correction layer to a GPU known only by its datasheet.

What the datasheet replaces: the peaks (BF16/FP16/FP8/INT8, FLOP/µs) and bandwidths (HBM and
link, bytes/µs) that turn each kernel's FLOPs and bytes into ideal times ``tc`` and ``tm``. What
transfers: how far below those peaks a kernel runs (the efficiency surfaces), its fixed cost per
call (launch latency, µs), the soft-max sharpness, and the step level (host-side overheads in µs
and the kernel-group scales of the serving stack).

The efficiency surfaces are functions of kernel *shape*. A transfer rule says at which shape of
the reference GPU a kernel of the new GPU should read its efficiency: ``eff_new(x) =
eff_ref(x · 2^Δ)`` with a log2 shift Δ per shape descriptor. In the standardized log-shape ``z``
of :mod:`roofcal.model.correction` this is the exact re-expansion of each surface polynomial,
``P'(u) = P(u + Δ/scale)``, with the clamp range moved by ``−Δ/scale``, so a bootstrapped file is an
ordinary coefficient file. Rules (``r`` = reference GPU, ``n`` = new GPU; balance ``B`` = peak /
HBM bandwidth of the kernel's dtype in FLOP/byte):

==============  ================================================================================
``shape``       no shift: efficiency is a property of the shape (tiles, waves, pipeline depth)
``balance``     work relative to the GPU's own balance point: the descriptor proportional to the
                arithmetic intensity (GEMM ``m``, prefill ``seq_len``, MoE ``tokens``) is scaled by
                ``B_r/B_n``, so a kernel sits as far from the ridge of the roofline as on ``r``
``sm``          work per SM: the descriptors that set the CTA grid (GEMM ``m``·``n``, prefill
                ``seqs``·``heads``, decode ``seqs``·``kv_heads``, MoE and elementwise ``tokens``)
                are scaled by ``SM_r/SM_n`` in all (split evenly), so the same number of waves
``balance_sm``  both shifts
``duration``    equal ideal duration: the compute surface is read where the reference's ideal
                compute time is the same (FLOP-proportional descriptor scaled by ``peak_r/peak_n``),
                the memory surface likewise with ``bw_r/bw_n`` (ramp-up and tail effects are fixed
                times); the shared clamp range follows the memory shift
==============  ================================================================================

Measured on the bundled aiconfigurator tables (vLLM 0.14.0 + NCCL), per-op MAPE % of every row,
the bootstrapped file read back from YAML (``roofcal.bench.transfer.zero_shot``); the neutral
roofline is 54–79 %, the GPU's own fit 5–10 %:

=====================  ======  ====== ======  ====== ======  ======  ======  =====
A100 ← H100            ar cus  ar eag ar nccl  decode prefil  gemm    moe     mean
=====================  ======  ====== ======  ====== ======  ======  ======  =====
shape                  12.6    33.8   14.9    27.7   17.0    19.7    23.9    21.4
balance                12.6    33.8   14.9    27.7   10.0    19.4    24.3    20.4
sm                     12.6    33.8   14.9    27.3   14.9    19.6    23.3    20.9
balance_sm             12.6    33.8   14.9    27.3   10.3    19.7    25.4    20.6
duration               13.7    35.3   26.1    25.0   16.3    20.6    31.5    24.1
own A100 fit           5.8     4.6    5.3     6.7    4.6     7.5     9.9     6.3
H100 ← A100 (bf16)
shape                  15.0    71.5   21.9    45.8   16.2    17.9    17.9    29.4
balance                15.0    71.5   21.9    45.8   19.3    16.9    20.8    30.2
sm                     15.0    71.5   21.9    41.3   15.5    16.1    18.6    28.6
balance_sm             15.0    71.5   21.9    41.3   20.0    20.3    22.1    30.3
duration               19.2    71.9   39.2    59.0   17.9    24.7    21.3    36.2
own H100 fit           3.9     6.2    4.4     4.7    6.4     5.6     9.4     5.8
=====================  ======  ====== ======  ====== ======  ======  ======  =====

``sm`` has the lowest mean over both directions (24.7 %; shape 25.4, balance 25.3, balance_sm
25.5, duration 30.2) and is the default; the rules differ by about one point, mostly on attention
(``balance`` is best for A100 prefill, worst for H100 prefill). H100 variants the A100 fit
lacks (fp8, fp8_block, int4) fall back to its bf16 surfaces (at the FP8 peak for fp8): 19–75 %
(gemm/fp8 68 %). What no datasheet rule captures: large memory-bound kernels run 1.8–2.0× slower
on A100 than on H100 against a bandwidth ratio of 1.64 (achieved bandwidth also follows the SM
clock, which the datasheets do not give), and the eager all-reduce's launch cost is a property
of the host (about twice as long on the A100 machine).

**MoE variants across architectures.** vLLM picks a reduced-precision MoE kernel by compute
capability (on vLLM 0.24: FlashInfer's CUTLASS experts for per-tensor FP8 on the H100, Triton on
the L40S), while its bf16 fused MoE is one Triton kernel on the A100, H100 and L40S. A reduced-
precision MoE variant's surface is therefore a property of a kernel the new GPU may not run: on the
H100 (vLLM 0.24) per-tensor FP8 MoE runs 2.2× *slower* than bf16 on the same shapes, also at the
largest token counts, where on the L40S it runs 0.57× (median over shapes). Where the two datasheets
give different compute capabilities, a bootstrap carries each reduced-precision MoE variant from
the kind's default variant (bf16), priced at the variant's own bytes and peak
(:data:`FROM_DEFAULT_ACROSS_ARCH`); within one architecture, or where either datasheet does not say,
each variant keeps its own surface. Measured from the shipped H100 file to the L40S, per-op MAPE %:
vLLM 0.24 FP8 MoE 251.6 → 22.7, FP8-block 28.0 → 18.6, int4 47.1 → 36.5; vLLM 0.14 FP8 52.9 → 40.0;
leaving a GPU out, the L40S's fit to the H100 47.1 → 36.5. GEMM and attention keep their variants:
the same carry makes FP8 GEMMs 27–31 → 59–72 % and the FP8-KV decode attention of the H100 from
the L40S 21.5 → 35.9 %.
"""

from __future__ import annotations

import itertools
import math
from functools import lru_cache

import jax.numpy as jnp
import numpy as np

from roofcal.model import correction as K
from roofcal.model.coeffs import Coefficients
from roofcal.errors import RoofcalError
from roofcal.physics.components.comm import COLLECTIVES
from roofcal.physics.hardware import GPUSpec
from roofcal.physics.hardware.datasheet import PER_US
from roofcal.model.combine import op_rate_fields

from roofcal.transfer import DEFAULT_RULE, RULES      # defined there for the command line

#: descriptor proportional to a kernel's arithmetic intensity (FLOP per byte)
INTENSITY = {"gemm": "m", "attn_prefill": "seq_len", "moe": "tokens"}
#: descriptors whose product sets the CTA grid of a kernel
GRID = {"gemm": ("m", "n"), "attn_prefill": ("seqs", "heads"), "attn_decode": ("seqs", "kv_heads"),
        "moe": ("tokens",), "elementwise": ("tokens",)}
#: kinds whose reduced-precision variants a bootstrap between architectures carries from the
#: kind's default variant (module docstring)
FROM_DEFAULT_ACROSS_ARCH = ("moe",)
#: (descriptor ∝ FLOPs, descriptor ∝ bytes) of a kernel, for the ``duration`` rule
WORK = {"gemm": ("m", "n"), "attn_prefill": ("seqs", "seqs"), "attn_decode": ("seqs", "seqs"),
        "allreduce": (None, "bytes"), "moe": ("tokens", "tokens"),
        "elementwise": ("tokens", "tokens"), **{c: (None, "bytes") for c in COLLECTIVES}}


# --------------------------------------------------------------------------------------------
# shifts (generic over floats and traced jax scalars, so roofcal.transfer.whatif differentiates them)

def _onehot(kind: str, names, value):
    """A shift vector (descriptors,) with ``value`` on each descriptor in ``names``."""
    desc = K.OP_KINDS[kind].descriptors
    mask = np.array([float(d in tuple(n for n in names if n)) for d in desc])
    return jnp.asarray(mask, jnp.float32) * value


def shifts(rule: str, kind: str, ref: tuple, new: tuple):
    """(compute shift, memory shift), each (descriptors,) in log2 units: ``eff_new(x) =
    eff_ref(x·2^Δ)``. ``ref`` / ``new`` are (peak FLOP/µs, bytes/µs, SMs) of the kernel's dtype
    and memory (HBM, or the link for communication)."""
    if rule not in RULES:                     # the one check of a rule (bootstrap and whatif)
        raise RoofcalError(f"unknown bootstrap rule {rule!r} (known: {', '.join(RULES)})")
    (pr, br, sr), (pn, bn, sn) = ref, new
    zero = _onehot(kind, (), 0.0)
    if rule == "shape":
        return zero, zero
    if rule == "duration":
        wc, wm = WORK.get(kind, (None, None))
        return _onehot(kind, (wc,), jnp.log2(pr / pn)), _onehot(kind, (wm,), jnp.log2(br / bn))
    d = zero
    if rule in ("balance", "balance_sm") and not K.OP_KINDS[kind].link:
        d = d + _onehot(kind, (INTENSITY.get(kind),), jnp.log2((pr / br) / (pn / bn)))
    if rule in ("sm", "balance_sm") and GRID.get(kind):
        grid = GRID[kind]
        d = d + _onehot(kind, grid, jnp.log2(sr / sn) / len(grid))
    return d, d


def op_rates(gpu: GPUSpec, kind: str, variant: str, theta: dict | None = None) -> tuple:
    """(peak FLOP/µs, bytes/µs, SMs) that bound a kernel on ``gpu`` (fields
    :func:`roofcal.model.combine.op_rate_fields`).

    ``theta`` ({datasheet field: number}, e.g. traced by :mod:`roofcal.transfer.whatif`) replaces the
    datasheet's numbers; ``gpu`` still decides which fields apply.
    """
    peak, bw = op_rate_fields(gpu, kind, variant)
    if theta is None:
        theta = {f: float(getattr(gpu, f)) for f in (peak, bw, "sm_count")}
    return theta[peak] * PER_US[peak], theta[bw] * PER_US[bw], theta["sm_count"]


@lru_cache(maxsize=None)
def shape_zero(kind: str) -> tuple:
    """Standardized ``z`` of shape 0 per descriptor, as the float32 nearest above it whose shape
    (in a file's float64 arithmetic) is not below 0, so a range written from it reads back."""
    k = K.OP_KINDS[kind]
    out = []
    for c, s in zip(k.center, k.scale):
        z = np.float32(-c / s)
        while float(z) * s + c < 0:
            z = np.nextafter(z, np.float32(np.inf))
        out.append(float(z))
    return tuple(out)


def shifted_range(kind: str, lo, hi, dc, dm, xp=np) -> tuple:
    """(compute shift, memory shift, low, high) in standardized units ``z`` of a surface read at
    ``x·2^Δ`` (``dc``, ``dm`` in log2 units), with the clamp range ``[lo, hi]`` moved by the memory
    shift. No shape lies below shape 0, and a file cannot hold a range below it, so a lower bound
    below it is raised to it (nothing changes); where the whole range moves below it, every shape
    reads the reference at its upper bound, and the shifts are reduced so that the file does
    exactly that. Generic over numpy (:func:`shift_op`) and traced jax (:mod:`roofcal.transfer.whatif`)."""
    scale = np.asarray(K.OP_KINDS[kind].scale, np.float64)
    floor = np.asarray(shape_zero(kind), np.float64)
    zc, zm = dc / scale, dm / scale
    excess = xp.maximum(zm - (hi - floor), 0.0)
    zc, zm = zc - excess, zm - excess
    return zc, zm, xp.maximum(lo - zm, floor), hi - zm


# --------------------------------------------------------------------------------------------
# exact re-expansion of a shifted surface

@lru_cache(maxsize=None)
def _expansion(n_desc: int, degree: int):
    """For P'(u) = P(u + d): list of (target term, source term, binomial, power of d per desc)."""
    rows = [tuple(r) for r in K.exponents(n_desc, degree)]
    index = {r: i for i, r in enumerate(rows)}
    out = []
    for i, e in enumerate(rows):
        for a in itertools.product(*(range(x + 1) for x in e)):
            coef = math.prod(math.comb(x, y) for x, y in zip(e, a))
            out.append((index[a], i, coef, tuple(x - y for x, y in zip(e, a))))
    return out


def shift_polynomial(w, dz) -> np.ndarray:
    """Coefficients (terms,) of u ↦ P(u + dz) for a full polynomial ``w`` over len(dz) variables
    (terms in :func:`roofcal.model.correction.exponents` order); float64."""
    w, dz = np.asarray(w, np.float64), np.asarray(dz, np.float64)
    out = np.zeros_like(w)
    for tgt, src, coef, powers in _expansion(len(dz), K.degree_of(len(dz), len(w))):
        out[tgt] += w[src] * coef * math.prod(d ** p for d, p in zip(dz, powers))
    return out


def shift_op(p: dict, kind: str, dc, dm) -> dict:
    """Raw op params whose surfaces read the original ones at ``x·2^Δ`` (Δ in log2 units of the
    descriptors; compute ``dc``, memory ``dm``). The clamp range moves with ``dm`` (see
    :func:`shifted_range`)."""
    f64 = lambda a: np.asarray(a, np.float64)
    zc, zm, lo, hi = shifted_range(kind, f64(p["lo"]), f64(p["hi"]), f64(dc), f64(dm))
    # with a shared range that follows dm, the compute surface reads P_c(u + zc) at u = clamp(z)
    return {**p,
            "eff_c": jnp.asarray(shift_polynomial(p["eff_c"], zc), jnp.float32),
            "eff_m": jnp.asarray(shift_polynomial(p["eff_m"], zm), jnp.float32),
            "lo": jnp.asarray(lo, jnp.float32), "hi": jnp.asarray(hi, jnp.float32)}


# --------------------------------------------------------------------------------------------
# the whole file

def describe_rule(rule: str, ref_gpu: GPUSpec, new_gpu: GPUSpec) -> str:
    """One sentence on how ``rule`` moves the surfaces between these two GPUs."""
    br, bn = ref_gpu.balance_flops_per_byte, new_gpu.balance_flops_per_byte
    sm = f"SM_ref/SM_new = {ref_gpu.sm_count}/{new_gpu.sm_count}"
    text = {
        "shape": "efficiency surfaces unchanged as functions of kernel shape",
        "balance": f"intensity descriptors (gemm m, attn_prefill seq_len, moe tokens) scaled by "
                   f"the ratio of balance points B_ref/B_new (BF16: {br:.1f}/{bn:.1f} FLOP/B)",
        "sm": f"CTA-grid descriptors (gemm m*n, attn_prefill seqs*heads, attn_decode "
              f"seqs*kv_heads, moe and elementwise tokens) scaled by {sm} (equal waves per SM)",
        "balance_sm": f"intensity descriptors scaled by B_ref/B_new (BF16: {br:.1f}/{bn:.1f} "
                      f"FLOP/B) and CTA-grid descriptors by {sm}",
        "duration": "compute surfaces read at equal ideal compute time (peak ratio), memory "
                    "surfaces at equal ideal memory time (bandwidth ratio)",
    }
    return text[rule]


def other_architecture(ref_gpu: GPUSpec, new_gpu: GPUSpec) -> bool:
    """True where both datasheets give a compute capability and they differ (vLLM then runs
    other kernels for some dtypes); False where they agree or either is unknown."""
    a, b = ref_gpu.compute_capability, new_gpu.compute_capability
    return bool(a and b and a != b)


def carried_from(ops: dict, key: str, ref_gpu: GPUSpec, new_gpu: GPUSpec) -> str:
    """The reference op whose surfaces carry ``key`` (kind/variant) to ``new_gpu``: the kind's
    default variant for a reduced-precision variant of :data:`FROM_DEFAULT_ACROSS_ARCH` between
    architectures (module docstring), else ``key`` itself."""
    kind, variant = key.split("/")
    default = K.op_key(kind, K.OP_KINDS[kind].default_variant)
    if (kind in FROM_DEFAULT_ACROSS_ARCH and key != default and default in ops
            and other_architecture(ref_gpu, new_gpu)):
        return default
    return key


def bootstrap_notes(rule: str, ref: Coefficients, ref_gpu: GPUSpec, new_gpu: GPUSpec) -> list:
    """The assumptions a bootstrapped file states (its ``notes``)."""
    from roofcal.transfer.expectation import expectation, load as load_zero_shot
    return [
        f"zero-shot bootstrap for {new_gpu.name} from {ref.source} (fitted on {ref_gpu.name}), "
        f"rule '{rule}'; not calibrated on {new_gpu.name}: expect per-op errors as "
        f"{expectation(ref_gpu, new_gpu, load_zero_shot())} (coeffs/zero_shot.yaml); "
        f"a few-shot fit on measured kernels with this file as the prior refines it "
        f"(roofcal gpu plan --gpu <the datasheet> lists which shapes to time; then roofcal fit "
        f"--gpu <the datasheet> --prior <this file> --data <kernels>)",
        f"replaced by the {new_gpu.name} datasheet: dense peaks (BF16 {new_gpu.bf16_tflops:g} "
        f"TFLOP/s vs {ref_gpu.bf16_tflops:g}), HBM bandwidth ({new_gpu.hbm_bandwidth_tbs:g} TB/s "
        f"vs {ref_gpu.hbm_bandwidth_tbs:g}) and link bandwidth "
        f"({new_gpu.interconnect_bandwidth_gbs:g} GB/s vs {ref_gpu.interconnect_bandwidth_gbs:g}), "
        f"i.e. every ideal compute and memory time",
        f"efficiency surfaces: {describe_rule(rule, ref_gpu, new_gpu)}",
        f"warm-L2 savings (per-op tables only): the L2-to-memory speed ratio times "
        f"{l2_speed_ratio(ref_gpu, new_gpu):.3g} (SMs x boost clock over memory bandwidth, "
        f"roofcal.transfer.bootstrap.l2_speed_ratio)",
        "carried unchanged: per-call latencies (launch and prologue, µs), soft-max sharpness, "
        "the measured shapes' curves (relative to the surfaces they move with), "
        "step overheads (host side, µs), kernel-group scales and the prefill-decode mix",
        "kernel kinds/variants absent from the reference fall back as roofcal.model.correction.lookup "
        "does (the kind's default variant, else neutral); variants whose dtype the new GPU lacks "
        "(e.g. fp8 without FP8 tensor cores) are kept and run at the BF16 peak",
        *([f"another architecture (compute capability {ref_gpu.compute_capability} -> "
           f"{new_gpu.compute_capability}): reduced-precision MoE variants carried from the bf16 "
           f"MoE surface at their own bytes and peaks (vLLM runs other MoE kernels per "
           f"architecture; roofcal.transfer.bootstrap)"] if other_architecture(ref_gpu, new_gpu) else []),
    ]


def l2_speed_ratio(ref_gpu: GPUSpec, new_gpu: GPUSpec) -> float:
    """How many times faster, relative to its device memory, the new GPU's L2 is than the
    reference's: ρ_new / ρ_ref with ρ = L2 bandwidth / device-memory bandwidth, the L2's bandwidth
    taken to follow SMs × SM clock (each SM's L2 requests per clock alike across these
    generations; the boost clock where both datasheets give it, else SMs alone):
    (SM_n · f_n) / (SM_r · f_r) · (bw_r / bw_n). Hand check, H100 SXM → L40S:
    (142 · 2,520) / (132 · 1,980) · 3.35 / 0.864 = 1.369 · 3.877 = 5.31."""
    clocks = new_gpu.boost_clock_mhz / ref_gpu.boost_clock_mhz \
        if new_gpu.boost_clock_mhz and ref_gpu.boost_clock_mhz else 1.0
    return (new_gpu.sm_count / ref_gpu.sm_count) * clocks \
        * (ref_gpu.hbm_bandwidth_tbs / new_gpu.hbm_bandwidth_tbs)


def carry_l2(p: dict, ratio: float) -> dict:
    """An op's warm-L2 saving g carried to a GPU whose L2 is ``ratio`` times as fast relative to
    its device memory (:func:`l2_speed_ratio`): ρ = 1 / (1 − g) times ``ratio``, at least 1 (an
    L2 no slower than device memory), and g' = 1 − 1 / ρ', at most
    :data:`~roofcal.model.correction.L2_SAVING_MAX`. An op without a saving stays so."""
    if "l2_saving" not in p:
        return p
    g = float(K.l2_saving(p))
    if g <= 1e-6:
        return p
    rho = max(1.0, ratio / (1.0 - g))
    new = min(1.0 - 1.0 / rho, 0.999 * K.L2_SAVING_MAX)
    return {**p, "l2_saving": jnp.asarray(K.l2_saving_raw(new), jnp.float32)}


def check_reference(ref: Coefficients, ref_gpu: GPUSpec) -> None:
    """Refuse a reference file that was not fitted for ``ref_gpu`` (name and datasheet hash)."""
    ref.check_gpu(ref_gpu, where="the reference datasheet")


def bootstrap(ref: Coefficients, ref_gpu: GPUSpec, new_gpu: GPUSpec,
              rule: str = DEFAULT_RULE, transfer_bands=None) -> Coefficients:
    """Carry ``ref`` (fitted on ``ref_gpu``) to ``new_gpu``: an uncalibrated coefficient set.

    Its prediction bands are ``ref``'s widened by the measured zero-shot transfer error
    (``transfer_bands``: a transfer-bands file, default the shipped one, False for no bands; see
    :mod:`roofcal.transfer.bands`). Pure: the same inputs give the same output. See the module
    docstring for what transfers.
    """
    check_reference(ref, ref_gpu)
    from roofcal.model.coeffs import KernelSet
    sets = {}
    for name, ks in ref.kernel_sets.items():          # every kernel library carries across
        ops = {}
        for key in sorted(ks.ops):
            kind, variant = key.split("/")
            dc, dm = shifts(rule, kind, op_rates(ref_gpu, kind, variant),
                            op_rates(new_gpu, kind, variant))
            src = ks.ops[carried_from(ks.ops, key, ref_gpu, new_gpu)]
            ops[key] = carry_l2(shift_op(src, kind, np.asarray(dc), np.asarray(dm)),
                                l2_speed_ratio(ref_gpu, new_gpu))
        sets[name] = KernelSet(ops, intervals=zero_shot_intervals(ks, transfer_bands),
                               borrowed=dict(ks.borrowed))
    params = {"step": dict(ref.params["step"])}
    fit = {"bootstrap": {
        "rule": rule, "from": ref.source, "from_gpu": ref_gpu.name,
        "from_datasheet_sha256": ref.datasheet_sha256, "from_calibrated": bool(ref.calibrated),
        "ratios_new_over_ref": {
            "bf16_tflops": round(new_gpu.bf16_tflops / ref_gpu.bf16_tflops, 6),
            "hbm_bandwidth_tbs": round(new_gpu.hbm_bandwidth_tbs / ref_gpu.hbm_bandwidth_tbs, 6),
            "interconnect_bandwidth_gbs": round(new_gpu.interconnect_bandwidth_gbs
                                                / ref_gpu.interconnect_bandwidth_gbs, 6),
            "sm_count": round(new_gpu.sm_count / ref_gpu.sm_count, 6),
            "balance_flops_per_byte": round(new_gpu.balance_flops_per_byte
                                            / ref_gpu.balance_flops_per_byte, 6)}}}
    from roofcal.model.coeffs import Stack
    stacks = {name: Stack(st.params, dict(st.alphas_us),
                          {"carried_from_gpu": ref_gpu.name, "zero_shot": True, **st.source},
                          dict(st.intervals))
              for name, st in ref.stacks.items()}      # serving stacks carry across, marked so
    return Coefficients(new_gpu.name, new_gpu.sha256(), params, calibrated=False,
                        notes=bootstrap_notes(rule, ref, ref_gpu, new_gpu), data=[], fit=fit,
                        metrics={}, source=f"<bootstrap of {ref.source}>", stacks=stacks,
                        stack=ref.stack, kernel_sets=sets, kernels=ref.kernels)


def zero_shot_intervals(ref, path=None) -> dict:
    """The ``intervals`` of a bootstrap of ``ref`` (a kernel set, or coefficients: their active
    set): its bands joined with the measured transfer bands
    (:func:`roofcal.calibration.conformal.widen`), with both sources."""
    from roofcal.calibration.conformal import widen
    from roofcal.transfer import bands as TB
    if path is False:
        return {}
    path = TB.DEFAULT_PATH if path is None else path
    src = {"zero_shot": "the reference file's bands widened by the measured zero-shot transfer "
                        "error of their kernel kind", **TB.source(path)}
    bands = ref.intervals or {}
    if bands.get("source"):
        src["reference"] = dict(bands["source"])
    return {"ops": widen(bands.get("ops", {}), TB.load(path)), "source": src}


def bootstrap_file(ref_path, new_gpu, out, ref_datasheet=None, rule: str = DEFAULT_RULE) -> Coefficients:
    """``roofcal gpu bootstrap``: read the reference file, bootstrap, write ``out`` atomically.

    ``ref_datasheet``: the reference GPU (bundled name or .yaml); default the file's own GPU.
    """
    from pathlib import Path
    from roofcal.model import coeffs as coeff_io
    from roofcal.physics.hardware import load_gpu
    from roofcal.resources import display
    new = load_gpu(new_gpu)
    ref = coeff_io.load(ref_path)
    ref.source = display(Path(ref_path))
    if ref_datasheet is None:
        try:
            ref_gpu = load_gpu(ref.gpu)
        except RoofcalError:
            raise RoofcalError(f"{ref.source}: fitted for GPU '{ref.gpu}', which is not bundled; "
                               f"give its datasheet with --from-datasheet FILE.yaml")
    else:
        ref_gpu = load_gpu(ref_datasheet)
    c = bootstrap(ref, ref_gpu, new, rule)
    coeff_io.save(c, out)
    c = coeff_io.roundtrip(c)                      # as the file reads back
    c.source = str(out)
    return c

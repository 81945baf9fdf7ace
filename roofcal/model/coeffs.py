"""Coefficient files: the fitted correction layer as documented YAML (schema ``roofcal-coeffs/3``).

Layout (every value in physical units)::

    schema: roofcal-coeffs/3
    roofcal_version: 0.1.0
    gpu: {name: h100_sxm, datasheet_sha256: …}   # the datasheet it was fitted for
    calibrated: true                               # false for a zero-shot bootstrap
    notes: [...]                                   # assumptions, e.g. of a bootstrap
    data: [{path, sha256, kind, rows}, ...]        # measurement provenance
    fit: {...}                                     # settings: seed, loss, steps, split, ...
    metrics: {heldout: {...}, train: {...}}        # whole-step MAPE etc. per phase (the fitted stack)
    kernels: vllm-0.24.0                           # the kernel set used by default
    kernel_sets:                                   # kernel corrections per kernel library (vLLM version)
      vllm-0.24.0:
        data: [path, ...]                          # the per-op files of this set (``data`` above)
        borrowed: {gemm/fp8_block: vllm-0.14.0}    # kernels this set has no rows of, from another set
        metrics: {heldout: {...}, train: {...}}    # per-op MAPE etc. per kernel
        ops:
          gemm/bf16:                               # kernel kind / variant (dtype or backend)
            latency_us: 2.3                        # fixed cost per call, µs ≥ 0
            sharpness: 2.9                         # soft-max q ≥ 1
            range: {m: [1, 8192], n: [...], ...}   # shapes seen in fitting; clamped outside
            compute_efficiency: {"1": 1.2, m: 0.4, ...}   # logit-polynomial terms (see correction.py)
            memory_efficiency: {...}
        intervals:                                 # 80 % prediction bands (roofcal/model/intervals.py)
          level: 0.8
          source: {...}                            # which residuals, how
          ops: {gemm/bf16: {all: {p10, p90, n}, compute: ..., memory: ...}, allreduce/nccl: {all: ...}}
        power:                                     # optional: the GPU at its power limit, fitted on a
          source: {...}                            # sustained load with these kernels (roofcal/physics/power.py)
          idle_w: 130.6                            # W at the boost clock, idle
          compute_w: 1723                          # W of tensor work at the dense peak, boost clock
          memory_w: 306                            # W of memory traffic at the datasheet bandwidth
          voltage_exponent: 3.0                    # dynamic power ∝ clock^γ, 1 ≤ γ ≤ 3
          clock_elasticity: 0.33                   # compute-bound time ∝ clock^−β, 0 < β ≤ 1
          window_ms: 380                           # the limiter's averaging window, ms
          metrics: {phase: {step_ms: [measured, predicted], sm_clock_mhz: [...], power_w: [...]}}
    stack: splitwise                               # the serving stack used by default (null: none)
    stacks:                                        # named serving stacks: what a step costs beyond its kernels
      splitwise:
        source: {kind: steps, kernels: vllm-0.24.0, data: [...], ...}   # where this layer came from
        overheads_us: {step_us, layer_us, prefill_seq_us, decode_seq_us, token_us, allreduce_peer_us}
        kernel_scales: {gemm, attention, moe, allreduce, elementwise}   # in-step / isolated, > 0
        mix_sharpness: 1.0                         # prefill–decode attention soft max, ≥ 1
        overlap_sharpness: 1.0                     # CPU–GPU soft max, ≥ 1 (1 = serial sum)
        alphas_us: {queueing_us, post_decode_us, output_token_us}   # BLIS's α0, α1, α2 (µs)
        intervals: {prefill: {p10, p90, n}, decode: ...}   # measured/predicted band of held-out steps

**Kernel sets.** Kernels change with the library that runs them (vLLM 0.24's FP8 MoE is a
different kernel from 0.14's), so a file keeps one set of kernel corrections per kernel library,
named after the folder of its measurements (:func:`roofcal.measurements.ops.kernel_set_of`).
One set is active at a time (:func:`with_kernels`): ``params["ops"]`` and ``intervals`` are its
corrections and bands. A serving stack records the set it was calibrated with
(``source.kernels``), and :func:`resolve_kernels` picks it when the user names none.

Loading validates everything and refuses files for another GPU or schema version. Older files
read as one kernel set (named after their per-op data's folder, else ``unversioned``); a
``roofcal-coeffs/1`` file's single ``step`` block reads as one stack named ``schema-1``; a kernel
surface written before one of its descriptors existed reads with that descriptor pinned
(:data:`ADDED_DESCRIPTORS`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NamedTuple

import jax
import numpy as np

from roofcal import __version__
from roofcal.model import correction as K
from roofcal.model import curves
from roofcal.model import intervals as IV
from roofcal.errors import RoofcalError, RoofcalWarning
from roofcal.physics.hardware import GPUSpec, load_gpu
from roofcal.io import parse_yaml, read_text, remembered, top_level_entries, write_text_atomic, yaml_text

SCHEMA = "roofcal-coeffs/3"
#: schema versions this roofcal reads
READS = ("roofcal-coeffs/1", "roofcal-coeffs/2", SCHEMA)
#: BLIS's alphas, in its order: α0 API ingestion before queueing (µs per request), α1 once per
#: completed request, α2 per output token (metrics only, see docs/blis-latency-models.md §1.7)
ALPHAS = ("queueing_us", "post_decode_us", "output_token_us")
#: ``--stack`` value for kernels only: no serving stack (no overheads, kernels as in isolation)
NO_STACK = "none"
#: the name of the kernel set of measurements outside a ``<framework>-<version>`` folder
UNVERSIONED = "unversioned"


@dataclass
class Stack:
    """A serving stack's step layer: what one step costs beyond its kernels (CPU work, launch
    gaps, overlap, in-step kernel scales; raw parameters as :mod:`roofcal.model.correction`
    keeps them), BLIS's alphas in µs (:data:`ALPHAS`), and where it came from."""

    params: dict
    alphas_us: dict = field(default_factory=lambda: {n: 0.0 for n in ALPHAS})
    source: dict = field(default_factory=dict)
    intervals: dict = field(default_factory=dict)   # phase → Band of held-out steps


@dataclass
class KernelSet:
    """The kernel corrections of one kernel library: raw parameters per kernel (as
    :mod:`roofcal.model.correction` keeps them), the per-op files they were fitted on, their
    per-kernel metrics, their 80 % bands (``{"ops": {kernel or kind: {stratum: Band}},
    "source": {...}}``), the kernels taken from another set for want of rows
    (``{kernel: set name}``) and, when fitted on a sustained load, the GPU's power model
    relative to these kernels (``{"model": PowerModel, "source": …, "metrics": …}``, empty:
    none)."""

    ops: dict
    data: list = field(default_factory=list)
    metrics: dict = field(default_factory=dict)
    intervals: dict = field(default_factory=dict)
    borrowed: dict = field(default_factory=dict)
    power: dict = field(default_factory=dict)       # {"model": PowerModel, "source": {...}, "metrics": {...}}


@dataclass
class Coefficients:
    """A fitted (or bootstrapped) correction layer for one GPU, with its provenance.

    ``kernel_sets`` hold the kernel corrections; ``params["ops"]`` and ``intervals`` mirror the
    active one (``kernels``), as ``params["step"]`` mirrors the active stack; a stack brings the
    set it was calibrated with (:func:`with_stack`), else the file's ``default_kernels``. Given explicitly
    (other objects than the active set's), ``params["ops"]`` and ``intervals`` replace the active
    set's; without kernel sets they become one set, ``unversioned``. ``metrics`` are the
    whole-step ones; :attr:`all_metrics` adds the active set's per-op ones.
    """

    gpu: str
    datasheet_sha256: str
    params: dict
    calibrated: bool = True
    notes: list = field(default_factory=list)
    data: list = field(default_factory=list)
    fit: dict = field(default_factory=dict)
    metrics: dict = field(default_factory=dict)
    source: str = "<memory>"
    stacks: dict = field(default_factory=dict)      # name → Stack
    stack: str | None = None                        # the stack in params["step"] (None: no stack)
    intervals: dict | None = None                   # the active set's bands (mirror)
    kernel_sets: dict = field(default_factory=dict)  # name → KernelSet
    kernels: str | None = None                      # the active kernel set
    default_kernels: str | None = None              # the file's default kernel set (``kernels:``)

    def __post_init__(self):
        if not self.kernel_sets:
            self.kernel_sets = {UNVERSIONED: KernelSet(dict(self.params.get("ops", {})),
                                                       intervals=dict(self.intervals or {}))}
            self.kernels = UNVERSIONED
        if self.kernels not in self.kernel_sets:
            self.kernels = newest_kernel_set(self.kernel_sets)
        if self.default_kernels not in self.kernel_sets:
            self.default_kernels = self.kernels
        ks = self.kernel_sets[self.kernels]
        ops = self.params.get("ops", ks.ops)
        bands = ks.intervals if self.intervals is None else self.intervals
        if ops is not ks.ops or bands is not ks.intervals:
            ks = replace(ks, ops=ops, intervals=bands)
            self.kernel_sets = {**self.kernel_sets, self.kernels: ks}
        self.params = {**self.params, "ops": ks.ops}
        self.intervals = ks.intervals

    @property
    def all_metrics(self) -> dict:
        """{'train'|'heldout': {...}}: the active kernel set's per-op metrics and the whole-step
        ones."""
        ks = self.kernel_sets[self.kernels].metrics
        return {split: {**ks.get(split, {}), **self.metrics.get(split, {})}
                for split in ("train", "heldout")}

    @property
    def power(self):
        """The active kernel set's fitted :class:`~roofcal.physics.power.PowerModel` (None: not
        fitted; :func:`roofcal.model.operating.power_of` then takes the datasheet's defaults)."""
        return self.kernel_sets[self.kernels].power.get("model")

    @property
    def op_bands(self) -> dict:
        """{kernel or kind: {stratum: Band}} of the per-op prediction bands (empty: none)."""
        return self.intervals.get("ops", {})

    @property
    def kernel_set(self) -> KernelSet:
        """The active kernel set."""
        return self.kernel_sets[self.kernels]

    @property
    def stack_bands(self) -> dict:
        """{phase: Band} of the current stack's whole-step bands (empty: none)."""
        st = self.stacks.get(self.stack) if self.stack else None
        return st.intervals if st is not None else {}

    @classmethod
    def neutral(cls, gpu: GPUSpec) -> "Coefficients":
        """Physically neutral defaults: roofline at datasheet peak, no latency or overhead."""
        return cls(gpu.name, gpu.sha256(), K.neutral_params(), calibrated=False,
                   notes=["neutral defaults: efficiency 1, latency 0, no overheads (roofline)"])

    def check_gpu(self, gpu: GPUSpec, where: str = "--gpu") -> None:
        """Refuse to use these coefficients for a different GPU or another version of its
        datasheet (their efficiencies are relative to the datasheet's peaks)."""
        if gpu.name != self.gpu:
            raise RoofcalError(f"{self.source}: coefficients were fitted for GPU '{self.gpu}', not "
                               f"'{gpu.name}' ({where}); carry them to it with 'roofcal gpu bootstrap "
                               f"--datasheet {gpu.name} --from {self.source} --out {gpu.name}_coeffs.yaml' (a datasheet "
                               f"file in place of the name for a GPU that is not bundled)")
        if gpu.sha256() != self.datasheet_sha256:
            raise RoofcalError(f"{self.source}: fitted for a different version of the '{gpu.name}' "
                               f"datasheet (hash {self.datasheet_sha256[:12]}, now "
                               f"{gpu.sha256()[:12]}); refit or bootstrap")


# --------------------------------------------------------------------------------------------
# params ↔ file dict

def round_sig(x, digits: int = 9) -> float:
    """A float rounded to ``digits`` significant digits (stable, readable YAML)."""
    x = float(x)
    return float(f"{x:.{digits}g}") if math.isfinite(x) else x


def _z_to_x(kind: str, j: int, z: float) -> float:
    k = K.OP_KINDS[kind]
    return 2.0 ** (z * k.scale[j] + k.center[j]) - 1.0


def _x_to_z(kind: str, j: int, x: float) -> float:
    k = K.OP_KINDS[kind]
    return (math.log2(1.0 + x) - k.center[j]) / k.scale[j]


def op_to_dict(key: str, p: dict) -> dict:
    kind = key.split("/")[0]
    k = K.OP_KINDS[kind]
    n_terms = int(np.asarray(p["eff_c"]).shape[0])
    names = K.term_names(kind, K.degree_of(len(k.descriptors), n_terms))
    lo, hi = np.asarray(p["lo"], np.float64), np.asarray(p["hi"], np.float64)
    return {
        "latency_us": round_sig(math.exp(float(p["latency"]))),
        "sharpness": round_sig(1.0 + np.logaddexp(0.0, float(p["sharpness"]))),
        "range": {d: [round_sig(_z_to_x(kind, j, lo[j]), 6), round_sig(_z_to_x(kind, j, hi[j]), 6)]
                  for j, d in enumerate(k.descriptors)},
        "compute_efficiency": {n: round_sig(v) for n, v in zip(names, np.asarray(p["eff_c"]))},
        "memory_efficiency": {n: round_sig(v) for n, v in zip(names, np.asarray(p["eff_m"]))},
        **({"l2_saving": round_sig(saving, 6)} if (saving := float(K.l2_saving(p))) > L2_SAVING_WRITTEN else {}),
        **({"measured_shapes": curves.to_dict(kind, p["curves"])} if p.get("curves") else {}),
    }


#: a warm-L2 saving at or below this is not written (no saving: the file as before the field); a
#: saving is written to 6 significant digits, which its float32 parameter reads back to exactly
L2_SAVING_WRITTEN = 1e-6



def step_to_dict(step: dict) -> dict:
    """A stack's raw step parameters → physical values for the file."""
    o = np.exp(np.asarray(step["overheads"], np.float64))
    q = 1.0 + np.logaddexp(0.0, float(step["overlap"])) if "overlap" in step else 1.0
    return {
        "overheads_us": {n: round_sig(v) for n, v in zip(K.STEP_OVERHEADS, o)},
        "kernel_scales": {n: round_sig(math.exp(float(v)))
                          for n, v in zip(K.STEP_SCALES, np.asarray(step["scales"]))},
        "mix_sharpness": round_sig(1.0 + np.logaddexp(0.0, float(step["mix"]))),
        "overlap_sharpness": round_sig(q),
    }


def stack_to_dict(st: Stack) -> dict:
    d = {"source": dict(st.source), **step_to_dict(st.params),
         "alphas_us": {n: round_sig(float(st.alphas_us.get(n, 0.0))) for n in ALPHAS}}
    if st.intervals:
        d["intervals"] = IV.phase_bands_to_dict(st.intervals)
    return d


def intervals_to_dict(iv: dict) -> dict:
    """The ``intervals`` block of a file (empty dict: none)."""
    if not iv:
        return {}
    return {"level": IV.LEVEL, "source": dict(iv.get("source", {})),
            "ops": IV.bands_to_dict(iv.get("ops", {}))}


def intervals_from_dict(d, src: str, where: str = "intervals") -> dict:
    if d is None:
        return {}
    if not isinstance(d, dict):
        raise RoofcalError(f"{src}: field '{where}' must be a mapping")
    if d.get("level") != IV.LEVEL:
        raise RoofcalError(f"{src}: field '{where}.level' must be {IV.LEVEL}, got {d.get('level')!r}")
    if not isinstance(d.get("source", {}), dict):
        raise RoofcalError(f"{src}: field '{where}.source' must be a mapping")
    return {"source": dict(d.get("source", {})),
            "ops": IV.bands_from_dict(d.get("ops", {}), f"{src}: field '{where}.ops")}


def params_to_dict(params: dict) -> dict:
    return {"ops": {key: op_to_dict(key, params["ops"][key]) for key in sorted(params["ops"])}}


def _finite(v, where: str, minimum: float | None = None) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise RoofcalError(f"{where} must be a finite number, got {v!r}")
    if minimum is not None and v < minimum:
        raise RoofcalError(f"{where} must be ≥ {minimum:g}, got {v!r}")
    return float(v)


#: the fields of a kernel entry (``ops.<kind>/<variant>``)
OP_FIELDS = ("latency_us", "sharpness", "range", "compute_efficiency", "memory_efficiency")
#: fields an op may have: the curves of its measured shapes (:mod:`roofcal.model.curves`)
OPTIONAL_OP_FIELDS = ("measured_shapes", "l2_saving")
#: the top-level fields of a coefficient file per schema
TOP_FIELDS = {
    "roofcal-coeffs/1": ("schema", "roofcal_version", "gpu", "calibrated", "notes", "data", "fit", "metrics",
                         "ops", "step", "intervals"),
    "roofcal-coeffs/2": ("schema", "roofcal_version", "gpu", "calibrated", "notes", "data", "fit", "metrics",
                         "ops", "stack", "stacks", "intervals"),
    SCHEMA: ("schema", "roofcal_version", "gpu", "calibrated", "notes", "data", "fit", "metrics", "kernels",
             "kernel_sets", "stack", "stacks"),
}
#: the fields of a kernel set (``kernel_sets.<name>``)
KERNEL_SET_FIELDS = ("data", "borrowed", "metrics", "ops", "intervals", "power")
#: the fields of a kernel set's ``power`` block: the fitted parameters of
#: :class:`roofcal.physics.power.PowerModel` (the limit and boost clock come from the datasheet,
#: recorded in ``source``), its provenance and per-phase metrics
POWER_PARAMS = ("idle_w", "compute_w", "memory_w", "voltage_exponent", "clock_elasticity", "window_ms")
POWER_BLOCK_FIELDS = ("source",) + POWER_PARAMS + ("metrics",)
#: the fields of a serving stack (``stacks.<name>``)
STACK_FIELDS = ("alphas_us", "intervals", "kernel_scales", "mix_sharpness", "overheads_us", "overlap_sharpness",
                "source")
#: the fields of ``gpu``
GPU_FIELDS = ("name", "datasheet_sha256")


def _known_fields(d: dict, known, src: str, where: str, what: str) -> None:
    """Refuse a mapping with a field outside ``known``: ``<src>: field '<where><field>' is not a
    <what> field (<known>)``, naming the first unknown one (``where``: its path, with the dot)."""
    extra = sorted(set(d) - set(known), key=str)
    if extra:
        raise RoofcalError(f"{src}: field '{where}{extra[0]}' is not a {what} field ({', '.join(known)})")


def _section(d, src: str, where: str, known, what: str) -> None:
    """Refuse ``d``, the value of field ``where``, unless it is a mapping of ``known`` fields."""
    if not isinstance(d, dict):
        raise RoofcalError(f"{src}: field '{where}' must be a mapping")
    _known_fields(d, known, src, f"{where}.", what)


def _field_types(d: dict, src: str, prefix: str, types) -> None:
    """Refuse a field of ``d`` named in ``types`` ((name, type), …) that is present with
    another type (``prefix``: the path of ``d``, with the dot)."""
    for key, typ in types:
        if not isinstance(d.get(key, typ()), typ):
            raise RoofcalError(f"{src}: field '{prefix}{key}' must be a {typ.__name__}")


#: shape descriptors added to a kernel kind after files were written, with the value every row of
#: such a file had: a file without one reads with its range [value, value], so the new terms see
#: a constant and drop out, and the file predicts as it did (``allreduce/two_stage``: files written
#: before it fitted one smooth surface through vLLM's one- and two-stage custom all-reduce;
#: ``gemm/tile_config``: through all of the FP8 GEMM's CUTLASS configurations)
ADDED_DESCRIPTORS = {"allreduce": {"two_stage": 0.0}, "gemm": {"tile_config": 0.0}}
#: kernels whose ideal work changed with a descriptor of :data:`ADDED_DESCRIPTORS`: a file written
#: before it predicts them differently than it was fitted, so reading one warns
#: (:func:`_warn_if_work_changed`, for each kernel set)
#: (``gemm/fp8``: FLOPs count vLLM's CUTLASS FP8 tiles whole since ``tile_config``, see
#: :func:`roofcal.physics.components.gemm.cutlass_fp8_tiles`; the other variants are unchanged)
WORK_CHANGED = {"gemm/fp8": ("tile_config", "FP8 GEMMs counted whole CUTLASS tiles of work")}


def _warn_if_work_changed(key: str, d: dict, src: str, field_: str) -> None:
    """A :class:`RoofcalWarning` when ``d``, a valid op ``key`` of a file, is a
    :data:`WORK_CHANGED` kernel whose surface predates its descriptor."""
    changed = WORK_CHANGED.get(key)
    if changed is not None and changed[0] not in d["range"]:
        import warnings
        warnings.warn(RoofcalWarning(
            f"{src}: field '{field_}' was fitted before {changed[1]}; its predictions of "
            f"that kernel are off until the file is refitted (roofcal fit)"), stacklevel=4)


def _with_added_descriptors(kind: str, d: dict) -> dict:
    """``d`` (an op's fields) with the descriptors of :data:`ADDED_DESCRIPTORS` it predates filled
    in: their range pinned and their terms at 0. Unchanged when the range names them all."""
    added = ADDED_DESCRIPTORS.get(kind, {})
    rng = d.get("range")
    if not added or not isinstance(rng, dict) or not set(added) - set(rng):
        return d
    k = K.OP_KINDS[kind]
    old = [n for n in k.descriptors if n in rng or n not in added]
    if set(rng) != set(old):
        return d                                            # not an older file: the checks say why
    out = dict(d, range={n: rng[n] if n in rng else [added[n], added[n]] for n in k.descriptors})
    for name in ("compute_efficiency", "memory_efficiency"):
        terms = d.get(name)
        if not isinstance(terms, dict):
            continue
        try:
            deg = K.degree_of(len(old), len(terms))
        except ValueError:
            continue                                        # reported by the checks
        new = K.term_names(kind, deg)
        without = (K.exponents(len(k.descriptors), deg)[:, [k.descriptors.index(a) for a in added]] == 0).all(1)
        if [t for t, older in zip(new, without) if older] == list(terms):
            out[name] = {t: terms.get(t, 0.0) for t in new}    # else the checks name the terms wanted
    return out


def op_from_dict(key: str, d: dict, src: str) -> dict:
    kind = key.split("/")[0]
    if kind not in K.OP_KINDS or key.count("/") != 1:
        raise RoofcalError(f"{src}: field 'ops.{key}' is not a known kernel kind "
                           f"({', '.join(K.OP_KINDS)}) / variant")
    if not isinstance(d, dict):
        raise RoofcalError(f"{src}: field 'ops.{key}' must be a mapping")
    k = K.OP_KINDS[kind]
    where = f"{src}: field 'ops.{key}"
    d = _with_added_descriptors(kind, d)
    for f_ in OP_FIELDS:
        if f_ not in d:
            raise RoofcalError(f"{where}.{f_}' is missing")
    _known_fields(d, OP_FIELDS + OPTIONAL_OP_FIELDS, src, f"ops.{key}.", "kernel")
    lat = _finite(d["latency_us"], f"{where}.latency_us'", 0.0)
    q = _finite(d["sharpness"], f"{where}.sharpness'", 1.0)
    rng = d["range"]
    if not isinstance(rng, dict) or set(rng) != set(k.descriptors):
        raise RoofcalError(f"{where}.range' must give [low, high] for {', '.join(k.descriptors)}")
    lo, hi = [], []
    for j, name in enumerate(k.descriptors):
        pair = rng[name]
        if not isinstance(pair, list) or len(pair) != 2:
            raise RoofcalError(f"{where}.range.{name}' must be [low, high]")
        a = _finite(pair[0], f"{where}.range.{name}[0]'", 0.0)
        b = _finite(pair[1], f"{where}.range.{name}[1]'", a)
        lo.append(_x_to_z(kind, j, a))
        hi.append(_x_to_z(kind, j, b))
    ws = []
    for name in ("compute_efficiency", "memory_efficiency"):
        terms = d[name]
        if not isinstance(terms, dict):
            raise RoofcalError(f"{where}.{name}' must map polynomial terms to coefficients")
        try:
            deg = K.degree_of(len(k.descriptors), len(terms))
        except ValueError:
            raise RoofcalError(f"{where}.{name}' has {len(terms)} terms, not a full polynomial")
        expected = K.term_names(kind, deg)
        if list(terms) != expected:
            raise RoofcalError(f"{where}.{name}' terms must be, in order: {', '.join(expected)}")
        ws.append([_finite(terms[t], f"{where}.{name}.{t}'") for t in expected])
    f32 = lambda x: jax.device_put(np.asarray(x, np.float32))   # rounded on the host: no XLA program
    out = {
        "eff_c": f32(ws[0]), "eff_m": f32(ws[1]), "latency": f32(math.log(max(lat, 1e-9))),
        "sharpness": f32(K.softplus_inv(max(q - 1.0, 1e-9))), "lo": f32(lo), "hi": f32(hi),
    }
    if kind in K.CACHED_KINDS:
        g = _finite(d.get("l2_saving", 0.0), f"{where}.l2_saving'", 0.0)
        if g >= K.L2_SAVING_MAX:
            raise RoofcalError(f"{where}.l2_saving' must be < {K.L2_SAVING_MAX:g} (the share of "
                               f"memory time a warm L2 saves), got {g!r}")
        out["l2_saving"] = f32(K.l2_saving_raw(g) if g > L2_SAVING_WRITTEN else K.NEUTRAL_L2_SAVING)
    elif "l2_saving" in d:
        raise RoofcalError(f"{where}.l2_saving' is for kinds that read device memory "
                           f"({', '.join(K.CACHED_KINDS)})")
    if "measured_shapes" in d:
        out["curves"] = curves.from_dict(kind, d["measured_shapes"], f"{where}.measured_shapes")
    return out


def step_from_dict(step, src: str, where: str = "step") -> dict:
    """The raw step parameters of a stack block (``where`` names it in errors)."""
    if not isinstance(step, dict):
        raise RoofcalError(f"{src}: field '{where}' must be a mapping")
    ov = step.get("overheads_us")
    if not isinstance(ov, dict) or set(ov) != set(K.STEP_OVERHEADS):
        raise RoofcalError(f"{src}: field '{where}.overheads_us' must give {', '.join(K.STEP_OVERHEADS)}")
    o = [_finite(ov[n], f"{src}: field '{where}.overheads_us.{n}'", 0.0) for n in K.STEP_OVERHEADS]
    sc = step.get("kernel_scales")
    if not isinstance(sc, dict) or set(sc) != set(K.STEP_SCALES):
        raise RoofcalError(f"{src}: field '{where}.kernel_scales' must give {', '.join(K.STEP_SCALES)}")
    scales = []
    for n in K.STEP_SCALES:
        v = _finite(sc[n], f"{src}: field '{where}.kernel_scales.{n}'", 0.0)
        if v <= 0:
            raise RoofcalError(f"{src}: field '{where}.kernel_scales.{n}' must be > 0, got {v!r}")
        scales.append(math.log(v))
    mix = _finite(step.get("mix_sharpness"), f"{src}: field '{where}.mix_sharpness'", 1.0)
    out = {"overheads": np.asarray([math.log(max(x, 1e-9)) for x in o]), "scales": np.asarray(scales),
           "mix": K.softplus_inv(max(mix - 1.0, 1e-9))}
    q = _finite(step.get("overlap_sharpness", 1.0), f"{src}: field '{where}.overlap_sharpness'", 1.0)
    if q > 1.0:
        out["overlap"] = K.softplus_inv(q - 1.0)
    return K.on_device(out)                  # float32, built on the host: no XLA program


def stack_from_dict(d, src: str, name: str) -> Stack:
    where = f"stacks.{name}"
    _section(d, src, where, STACK_FIELDS, "stack")
    al = d.get("alphas_us", {n: 0.0 for n in ALPHAS})
    if not isinstance(al, dict) or set(al) != set(ALPHAS):
        raise RoofcalError(f"{src}: field '{where}.alphas_us' must give {', '.join(ALPHAS)}")
    alphas = {n: _finite(al[n], f"{src}: field '{where}.alphas_us.{n}'", 0.0) for n in ALPHAS}
    source = d.get("source", {})
    if not isinstance(source, dict):
        raise RoofcalError(f"{src}: field '{where}.source' must be a mapping")
    bands = IV.phase_bands_from_dict(d["intervals"], f"{src}: field '{where}.intervals") \
        if "intervals" in d else {}
    return Stack(step_from_dict(d, src, where), alphas, source, bands)


def ops_from_dict(ops, src: str, where: str = "ops") -> dict:
    """Raw kernel corrections of an ``ops`` block."""
    if ops is None:
        return {}
    if not isinstance(ops, dict):
        raise RoofcalError(f"{src}: field '{where}' must be a mapping")
    prefix = where[:-len("ops")] if where.endswith("ops") else ""
    out = {}
    for key, v in ops.items():
        try:
            out[key] = op_from_dict(key, v, src)
        except RoofcalError as err:
            raise RoofcalError(str(err).replace("field 'ops.", f"field '{prefix}ops.", 1)) from None
        _warn_if_work_changed(key, v, src, f"{where}.{key}")
    return out


def kernel_set_to_dict(ks: KernelSet) -> dict:
    d = {"data": list(ks.data)}
    if ks.borrowed:
        d["borrowed"] = dict(sorted(ks.borrowed.items()))
    d["metrics"] = dict(ks.metrics)
    d.update(params_to_dict({"ops": ks.ops}))
    if ks.intervals:
        d["intervals"] = intervals_to_dict(ks.intervals)
    if ks.power:
        pm = ks.power["model"]
        d["power"] = {"source": dict(ks.power.get("source", {})),
                      **{n: round_sig(getattr(pm, n), 6) for n in POWER_PARAMS},
                      "metrics": dict(ks.power.get("metrics", {}))}
    return d


def power_from_dict(d, src: str, where: str) -> dict:
    """A kernel set's ``power`` block → {"model": PowerModel, "source", "metrics"} (empty dict
    for none). The limit and boost clock are the ones it was fitted with (``source``)."""
    from roofcal.physics.power import BOUNDS, PowerModel
    if d is None:
        return {}
    _section(d, src, where, POWER_BLOCK_FIELDS, "power-block")
    _field_types(d, src, f"{where}.", (("source", dict), ("metrics", dict)))
    vals = {}
    for n in POWER_PARAMS:
        if n not in d:
            raise RoofcalError(f"{src}: field '{where}.{n}' is missing")
        lo, hi = BOUNDS[n]
        v = _finite(d[n], f"{src}: field '{where}.{n}'", lo)
        if v > hi:
            raise RoofcalError(f"{src}: field '{where}.{n}' must be ≤ {hi:g}, got {v!r}")
        vals[n] = v
    source = dict(d.get("source", {}))
    limit, boost = source.get("limit_w"), source.get("boost_clock_mhz")
    for key, v in (("limit_w", limit), ("boost_clock_mhz", boost)):
        _finite(v, f"{src}: field '{where}.source.{key}'", 0.0)
    return {"model": PowerModel(**vals, limit_w=float(limit), boost_mhz=float(boost)), "source": source,
            "metrics": dict(d.get("metrics", {}))}


def kernel_set_from_dict(d, src: str, name: str) -> KernelSet:
    where = f"kernel_sets.{name}"
    _section(d, src, where, KERNEL_SET_FIELDS, "kernel-set")
    _field_types(d, src, f"{where}.", (("data", list), ("metrics", dict), ("borrowed", dict)))
    ops = ops_from_dict(d.get("ops"), src, f"{where}.ops")
    for key, other in d.get("borrowed", {}).items():
        if key not in ops or not isinstance(other, str):
            raise RoofcalError(f"{src}: field '{where}.borrowed.{key}' must name the set a kernel of "
                               f"'{where}.ops' was taken from")
    return KernelSet(ops, list(d.get("data", [])), dict(d.get("metrics", {})),
                     intervals_from_dict(d.get("intervals"), src, f"{where}.intervals"),
                     dict(d.get("borrowed", {})), power_from_dict(d.get("power"), src, f"{where}.power"))


def kernel_sets_from_dict(d: dict, src: str) -> tuple[dict, str]:
    """({name: KernelSet}, default name) of a file. Schema 1 and 2 files hold one set (``ops``,
    ``intervals`` at the top), named after the folder of their per-op data."""
    if d.get("schema") != SCHEMA:
        from roofcal.measurements.ops import kernel_set_of
        files = [r["path"] for r in d.get("data") or [] if isinstance(r, dict)
                 and isinstance(r.get("path"), str) and not str(r.get("kind", "")).startswith("steps")]
        names = {kernel_set_of(f) for f in files} - {""}
        name = names.pop() if len(names) == 1 else UNVERSIONED
        return {name: KernelSet(ops_from_dict(d.get("ops"), src), files,
                                _metrics_part(d.get("metrics", {}), per_op=True),
                                intervals_from_dict(d.get("intervals"), src))}, name
    raw = d.get("kernel_sets")
    if not isinstance(raw, dict) or not raw:
        raise RoofcalError(f"{src}: field 'kernel_sets' must map kernel-set names to kernel sets")
    sets = {str(k): kernel_set_from_dict(v, src, str(k)) for k, v in raw.items()}
    default = d.get("kernels")
    if default not in sets:
        raise RoofcalError(f"{src}: field 'kernels' names {default!r}, which is not in 'kernel_sets' "
                           f"({', '.join(sets)})")
    return sets, default


def _metrics_part(m, per_op: bool) -> dict:
    """The per-op part (keys ``<kind>/<variant>``, ``per_op``; older files keep them at the top)
    or the whole-step part of a file's top-level metrics."""
    if not isinstance(m, dict):
        return {}
    return {split: {k: v for k, v in (m.get(split) or {}).items() if (k.split("/")[0] in K.OP_KINDS) == per_op}
            for split in ("train", "heldout")}


def newest_kernel_set(sets) -> str:
    """The newest of some kernel-set names (framework, then version numerically)."""
    from roofcal.measurements.ops import kernel_set_order
    return max(sets, key=kernel_set_order)


def nearest_kernel_set(sets, name: str, default: str) -> str:
    """The kernel set of ``sets`` that stands in for rows of set ``name``: ``name`` itself; else
    the newest of its framework not newer than it (vLLM 0.25 rows → ``vllm-0.24.0``); else the
    oldest of its framework; else ``default``."""
    from roofcal.measurements.ops import kernel_set_order
    if name in sets:
        return name
    key = kernel_set_order(name)
    same = sorted((s for s in sets if kernel_set_order(s)[0] == key[0]), key=kernel_set_order)
    older = [s for s in same if kernel_set_order(s) <= key]
    return older[-1] if older else same[0] if same else default


def with_kernels(c: "Coefficients", name: str) -> "Coefficients":
    """``c`` predicting with kernel set ``name`` (one of ``c.kernel_sets``)."""
    if name not in c.kernel_sets:
        raise RoofcalError(f"{c.source}: no kernel set {name!r} (it has: {', '.join(c.kernel_sets)})")
    params = {k: v for k, v in c.params.items() if k != "ops"}
    return Coefficients(**{**c.__dict__, "params": params, "intervals": None, "kernels": name})


def resolve_kernels(c: "Coefficients", spec: str | None) -> "Coefficients":
    """``c`` with the kernel set a ``--kernels`` value names; None → as it is (the set its
    active serving stack brought, :func:`with_stack`)."""
    return c if spec is None else with_kernels(c, spec)


def stacks_from_dict(d: dict, src: str) -> tuple[dict, str | None]:
    """({name: Stack}, default name) of a file; schema 1's ``step`` block is stack ``schema-1``."""
    if d.get("schema") == "roofcal-coeffs/1":
        return {"schema-1": Stack(step_from_dict(d.get("step"), src), source={"kind": "schema-1 file"})}, "schema-1"
    raw = d.get("stacks", {})
    if not isinstance(raw, dict):
        raise RoofcalError(f"{src}: field 'stacks' must map stack names to stacks")
    stacks = {str(k): stack_from_dict(v, src, str(k)) for k, v in raw.items()}
    default = d.get("stack")
    if default is not None and default not in stacks:
        raise RoofcalError(f"{src}: field 'stack' names {default!r}, which is not in 'stacks' "
                           f"({', '.join(stacks) or 'none'})")
    return stacks, default


def with_stack(c: "Coefficients", name: str | None) -> "Coefficients":
    """``c`` predicting with serving stack ``name`` (one of ``c.stacks``; :data:`NO_STACK` or
    None for kernels only) and the kernel set it was calibrated with (``source.kernels``, when
    the file has it; else the file's default)."""
    if name in (None, NO_STACK):
        out = Coefficients(**{**c.__dict__, "params": {**c.params, "step": K.neutral_step_params()},
                              "stack": None})
        return with_kernels(out, c.default_kernels)
    if name not in c.stacks:
        raise RoofcalError(f"{c.source}: no serving stack {name!r} (it has: "
                           f"{', '.join(c.stacks) or 'none'}; '{NO_STACK}' = kernels only)")
    out = Coefficients(**{**c.__dict__, "params": {**c.params, "step": c.stacks[name].params},
                          "stack": name})
    own = c.stacks[name].source.get("kernels")
    return with_kernels(out, own if own in c.kernel_sets else c.default_kernels)


def add_stack(c: "Coefficients", name: str, stack: Stack, default: bool = False) -> "Coefficients":
    """``c`` with ``stack`` added as ``name`` (replacing one of that name); the default if
    ``default`` or if ``c`` had none."""
    stacks = {**c.stacks, name: stack}
    out = Coefficients(**{**c.__dict__, "stacks": stacks})
    return with_stack(out, name if default or c.stack is None or c.stack == name else c.stack)


def resolve_stack(c: "Coefficients", spec: str | None, required: bool = False,
                  kernels: str | None = None) -> "Coefficients":
    """``c`` with the stack a ``--stack`` value names: None → the file's default; ``none`` →
    kernels only; ``NAME`` → one of the file's stacks; ``FILE:NAME`` → a stack borrowed from
    another coefficient file (any GPU), recorded in its source as borrowed. With ``required``
    (whole steps, an export), a file without any stack is refused unless ``spec`` says what to
    use, so no step goes without its overheads by accident. Then the kernel set ``kernels``
    (a ``--kernels`` value; None: the stack's own, :func:`resolve_kernels`)."""
    return resolve_kernels(_resolve_stack(c, spec, required), kernels)


def _resolve_stack(c: "Coefficients", spec: str | None, required: bool) -> "Coefficients":
    if spec is None:
        if required and c.stack is None:
            from roofcal.resources import REFERENCE_COEFFS, here
            h100 = here(REFERENCE_COEFFS)
            raise RoofcalError(f"{c.source}: has no serving stack; pass --stack {NO_STACK} (kernels only) "
                               f"or borrow one, as --stack {h100}:vllm (the H100's)")
        return c
    if spec == NO_STACK or spec in c.stacks:
        return with_stack(c, spec)
    if ":" in spec:
        path, name = spec.rsplit(":", 1)
        other = load(path)
        if name not in other.stacks:
            raise RoofcalError(f"{path}: no serving stack {name!r} (it has: {', '.join(other.stacks) or 'none'})")
        st = other.stacks[name]
        borrowed = Stack(st.params, dict(st.alphas_us),
                         {"borrowed_from": {"file": str(path), "sha256": _sha(path), "gpu": other.gpu,
                                            "stack": name}, **st.source}, dict(st.intervals))
        return add_stack(c, name, borrowed, default=True)
    return with_stack(c, spec)        # raises: names the stacks there are


def stack_fitted_on(c: "Coefficients", sha256: str | None) -> str | None:
    """The name of the stack of ``c`` fitted on the measurement file with that hash (its
    ``source.data`` lists it), or None."""
    if not sha256:
        return None
    for name, st in c.stacks.items():
        for rec in st.source.get("data") or []:
            if isinstance(rec, dict) and rec.get("sha256") == sha256:
                return name
    return None


class StacksOf(NamedTuple):
    """A coefficient file's GPU, serving stacks and default stack (:func:`read_stacks`)."""

    gpu: str
    stacks: dict
    stack: str | None


#: the top-level fields :func:`read_stacks` reads (``step``: schema 1's one stack)
STACKS_READ = ("schema", "gpu", "stack", "stacks", "step")


def read_stacks(path: str | Path) -> StacksOf:
    """What :func:`carry_stacks` takes of a coefficient file, read from its :data:`STACKS_READ`
    alone (:func:`roofcal.io.top_level_entries`) — the shipped H100 file 1.6 → 0.05 s: its 12,000
    curves are not parsed — and from the whole file (:func:`load`) where its layout is not the one
    roofcal writes. The entries read are checked as :func:`load` checks them, the others not."""
    path = Path(path)
    src = str(path)
    part = top_level_entries(read_text(path, "coefficient file"), STACKS_READ)
    try:
        doc = None if part is None else parse_yaml(part, src)
    except RoofcalError:
        doc = None                                    # the whole file's error names its own line
    if not isinstance(doc, dict) or doc.get("schema") not in READS:
        c = load(path)                                # read whole: fails as a whole file fails
        return StacksOf(c.gpu, c.stacks, c.stack)
    g = _gpu_field(doc, src)
    stacks, default = stacks_from_dict(doc, src)
    return StacksOf(g["name"], stacks, default)


def carry_stacks(new: "Coefficients", old: "Coefficients | StacksOf") -> "Coefficients":
    """``new`` (just fitted) with the stacks of ``old`` (the file it replaces) that the fit did not
    produce itself — calibrated on serving runs or borrowed — kept, and ``old``'s default stack
    kept as default when it is one of them. A refit of the kernels then does not drop a serving
    stack calibrated with another command."""
    if old.gpu != new.gpu:
        return new
    out = new
    for name, st in old.stacks.items():
        foreign = str(st.source.get("kind", "")).startswith("workload") or "borrowed_from" in st.source
        if name not in new.stacks and foreign:
            out = add_stack(out, name, st)
    if old.stack in out.stacks and old.stack not in new.stacks:
        out = with_stack(out, old.stack)
    return out


def _sha(path) -> str:
    from roofcal.io import sha256_file
    return sha256_file(path)


# --------------------------------------------------------------------------------------------
# files

def to_doc(c: Coefficients) -> dict:
    """The document a coefficient file holds (plain dicts, lists, strings and numbers)."""
    return {
        "schema": SCHEMA,
        "roofcal_version": __version__,
        "gpu": {"name": c.gpu, "datasheet_sha256": c.datasheet_sha256},
        "calibrated": bool(c.calibrated),
        "notes": list(c.notes),
        "data": list(c.data),
        "fit": dict(c.fit),
        "metrics": dict(c.metrics),
        "kernels": c.default_kernels,
        "kernel_sets": {name: kernel_set_to_dict(c.kernel_sets[name])
                        for name in sorted(c.kernel_sets, key=_set_order)},
        "stack": c.stack,
        "stacks": {name: stack_to_dict(st) for name, st in c.stacks.items()},
    }


def to_yaml(c: Coefficients) -> str:
    """The YAML text of a coefficient file (deterministic for equal inputs)."""
    doc = to_doc(c)
    header = (f"# roofcal coefficient file (schema {SCHEMA}); see roofcal/model/coeffs.py and the\n"
              "# README. Efficiencies are sigmoid(sum of term coefficients x standardized log-shape\n"
              "# monomials); latencies and overheads in microseconds; 'kernel_sets' are kernel corrections\n"
              "# per kernel library, 'stacks' serving stacks.\n")
    return header + yaml_text(doc, sort_keys=False, allow_unicode=True, width=100)


def _set_order(name):
    from roofcal.measurements.ops import kernel_set_order
    return kernel_set_order(name)


def save(c: Coefficients, path: str | Path) -> None:
    """Write atomically."""
    write_text_atomic(path, to_yaml(c))


def load(path: str | Path, gpu: GPUSpec | str | None = None) -> Coefficients:
    """Read and validate a coefficient file; with ``gpu``, also refuse one fitted for another GPU.

    A large file read before in this process with the same text is not parsed and built again
    (:func:`roofcal.io.remembered`; the shipped H100 file: 1.6 s the first time, 0.02 s after):
    its coefficients are handed out as a deep copy, so a caller may change what it gets (curves
    and JAX arrays, immutable, are shared)."""
    path = Path(path)
    c = remembered(read_text(path, "coefficient file"), lambda t: _from_text(t, str(path)),
                   f"coefficients of {path}", _copy_sharing_arrays)
    if gpu is not None:
        c.check_gpu(load_gpu(gpu))
    return c


def _copy_sharing_arrays(c: Coefficients) -> Coefficients:
    """A deep copy of ``c`` whose JAX arrays (immutable) are ``c``'s own, not copied (each copy
    is a compiled program per shape)."""
    import copy
    parts = [c.params] + [ks.ops for ks in c.kernel_sets.values()] + [st.params for st in c.stacks.values()]
    return copy.deepcopy(c, {id(x): x for x in jax.tree_util.tree_leaves(parts) if isinstance(x, jax.Array)})


def _gpu_field(doc: dict, src: str) -> dict:
    """A coefficient file's ``gpu`` field, checked: its name and datasheet hash, nothing else."""
    g = doc.get("gpu")
    if not isinstance(g, dict) or not isinstance(g.get("name"), str) \
            or not isinstance(g.get("datasheet_sha256"), str):
        raise RoofcalError(f"{src}: field 'gpu' must give name and datasheet_sha256")
    _known_fields(g, GPU_FIELDS, src, "gpu.", "gpu")
    return g


def _from_text(text: str, src: str) -> Coefficients:
    """The validated coefficients of a file's ``text`` (``src``: its path, for errors)."""
    doc = parse_yaml(text, src)
    if not isinstance(doc, dict):
        raise RoofcalError(f"{src}: not a roofcal coefficient file")
    schema = doc.get("schema")
    if schema not in READS:
        raise RoofcalError(f"{src}: field 'schema' is {schema!r}; this roofcal reads {', '.join(map(repr, READS))}")
    _known_fields(doc, TOP_FIELDS[schema], src, "", "coefficient-file")
    g = _gpu_field(doc, src)
    _field_types(doc, src, "", (("notes", list), ("data", list), ("fit", dict), ("metrics", dict)))
    if not isinstance(doc.get("calibrated", True), bool):
        raise RoofcalError(f"{src}: field 'calibrated' must be true or false")
    sets, kernels = kernel_sets_from_dict(doc, src)
    c = Coefficients(g["name"], g["datasheet_sha256"], {"step": K.neutral_step_params()},
                     default_kernels=kernels,
                     calibrated=doc.get("calibrated", True), notes=doc.get("notes", []),
                     data=doc.get("data", []), fit=doc.get("fit", {}),
                     metrics=_metrics_part(doc.get("metrics", {}), per_op=False), source=src,
                     kernel_sets=sets, kernels=kernels)
    stacks, default = stacks_from_dict(doc, src)
    return with_stack(Coefficients(**{**c.__dict__, "stacks": stacks}), default)


def as_read(doc):
    """``doc`` as its YAML text reads back: a copy with tuples as lists. Every other value of a
    :func:`to_doc` document reads back as written (a float's text is its shortest round-trip
    form), so this is ``yaml_load(to_yaml(c))`` without the 3.8 MB of text (≈ 3 s)."""
    if isinstance(doc, dict):
        return {k: as_read(v) for k, v in doc.items()}
    if isinstance(doc, (list, tuple)):
        return [as_read(v) for v in doc]
    return doc


def op_as_read(key: str, p: dict) -> dict:
    """Kernel ``key``'s raw parameters ``p`` as its entry in a file reads back (rounded to file
    precision, as :func:`roundtrip` rounds them; a second pass changes nothing)."""
    return op_from_dict(key, as_read(op_to_dict(key, p)), f"ops.{key}")


def roundtrip(c: Coefficients) -> Coefficients:
    """``c`` as it will read back from its file (parameters rounded to file precision)."""
    doc = as_read(to_doc(c))
    stacks, default = stacks_from_dict(doc, c.source)
    sets, kernels = kernel_sets_from_dict(doc, c.source)
    params = {k: v for k, v in c.params.items() if k != "ops"}
    c2 = Coefficients(**{**c.__dict__, "params": params, "intervals": None, "stacks": stacks,
                         "kernel_sets": sets, "kernels": kernels, "default_kernels": kernels})
    out = with_stack(c2, default)
    return with_kernels(out, c.kernels) if c.kernels in sets else out

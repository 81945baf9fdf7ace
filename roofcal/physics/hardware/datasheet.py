"""GPU datasheets: the YAML schema, its validation, and :class:`GPUSpec`.

Schema ``roofcal-datasheet/1``. The units are in the field names and are the same whatever the
GPU: every peak dense (no sparsity), every bandwidth in one direction, capacities in binary units.

==============================  ===============================================================================  ========
field                           meaning and unit                                                                 required
==============================  ===============================================================================  ========
``name``                        identifier used on the command line (``h100_sxm``)                               yes
``display_name``, ``aliases``   human name; other names accepted by :func:`load_gpu` (first: nvidia-smi's)       no
``sources``                     list of citations for the figures                                                yes
``dense_tflops.bf16``           dense BF16 tensor-core peak, 1e12 FLOP/s (FP32 accumulate where two given)       yes
``dense_tflops.fp16/fp8/int8``  dense peaks of other input types, likewise (int8: 1e12 op/s; fp8, int8 0: none)  no
``dense_tflops.fp4``            dense FP4 peak (NVFP4, MXFP4 inputs), 1e12 FLOP/s; 0: no FP4 tensor cores        no
``hbm_bandwidth_tbs``           device-memory bandwidth, HBM or GDDR alike, 1e12 bytes/s (TB/s)                  yes
``hbm_capacity_gib``            device memory, GiB = 2^30 bytes (a vendor's "80 GB" of HBM: 80)                  yes
``interconnect``                link kind, a label (nvlink4, pcie5, ...)                                         yes
``interconnect_bandwidth_gbs``  per-GPU link bandwidth, ONE direction, 1e9 bytes/s (half the total)              yes
``sm_count``                    streaming multiprocessors enabled on this product                                yes
``power_limit_w``               the board's default power limit (TDP), W                                         no
``boost_clock_mhz``             the maximum SM clock (nvidia-smi's ``clocks.max.sm``), MHz                       no
``l2_cache_mib``                last-level (L2) cache, MiB = 2^20 bytes (the vendor's "MB")                      no
``memory_kind``                 device memory: hbm2, hbm2e, hbm3, hbm3e, gddr6, gddr6x, gddr7                    no
``compute_capability``          CUDA compute capability, "major.minor" (8.0, 8.9, 9.0)                           no
==============================  ===============================================================================  ========

Where a vendor gives two tensor-core figures for one input type (FP16 or FP8 with FP16 and with
FP32 accumulate, as GeForce and some workstation sheets do), the FP32-accumulate one is the
datasheet's: PyTorch's and vLLM's GEMMs accumulate in FP32. A link quoted "bidirectional" or
"total" (NVLink 900 GB/s, PCIe Gen5 x16 128 GB/s) is written halved (450, 64). The ``hbm_*``
fields keep their names on GDDR memory (``memory_kind`` says which). :data:`FIELD_NOTES` says
all this beside each field of a written datasheet (:func:`datasheet_yaml`, and
:func:`template_yaml`, a new GPU's blank one: ``roofcal gpu template NAME``).

An optional field left out (or left blank) takes the default :data:`OMITTED` gives; reading a
user's datasheet file warns once per such field, one line naming the file, the field, the default
and what it changes (:func:`omitted`; the bundled datasheets cite their gaps in ``sources``).
``display_name`` (default: the name) and ``notes`` change no figure and take no warning.

The two power fields describe a busy GPU, not a burst: under a back-to-back load the board sits
at its power limit and lowers its SM clock (:mod:`roofcal.physics.power`). Without
``power_limit_w`` no power cap is modelled (a sustained load runs as a burst does); without
``boost_clock_mhz`` the clock is reported as a fraction of the maximum. They are not part of
:meth:`GPUSpec.sha256`: the kernel corrections are relative to the peaks, not to the power; a
coefficient file's ``power`` block records the power fields it was fitted with instead.

The last three describe what transfer between GPUs needs and the peaks do not say: a working set
within the L2 is served from it (a kernel timed again and again on the same buffers, as the per-op
tables are, reads it at L2 speed: on the L40S, 96 MiB of L2 over 864 GB/s of GDDR6, decode
attention over 32–96 MB of KV runs at 1.3–2× the memory bandwidth), the memory technology, and
the architecture whose kernels vLLM picks (FlashAttention 3 and CUTLASS 3 on 9.0, FlashAttention 2
and Triton on 8.9). The L2 sets the warm share of a per-op table's rows
(:mod:`roofcal.physics.cache`), which only the pricing of table rows reads (fits, residuals); a
served step is priced on a cold L2, so no step prediction or export depends on these fields and
they are not part of :meth:`GPUSpec.sha256` (a file fitted before them still matches); the memory
kind picks the zero-shot error a bootstrap quotes (:mod:`roofcal.transfer.expectation`).

Sparsity figures are refused: any key mentioning sparsity, and any 8-bit peak above twice the BF16
peak or FP4 peak above four times it (every NVIDIA generation doubles per halving of precision; one
more doubling means a sparse figure).

The FP4 peak (Blackwell's fifth-generation tensor cores: the B200 9,000 TFLOP/s dense, four times
its BF16) prices no kernel yet: roofcal has no FP4 kernel variant, and a per-op table's NVFP4 rows
are left out by name and count. It bounds what any kernel on the GPU can compute (a per-op row
timed faster than the fastest peak is left out, :func:`roofcal.physics.kernels.faster_than_peak`),
and it is part of :meth:`GPUSpec.sha256` only where the GPU has one, so a datasheet without FP4
hashes as it did before the field.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from roofcal.errors import RoofcalError
from roofcal.io import read_yaml, sha256_text

SCHEMA = "roofcal-datasheet/1"
DTYPES = ("bf16", "fp16", "fp8", "int8", "fp4")
#: dense peaks a datasheet may give as 0: the GPU has no such tensor cores (the same as leaving
#: them out, without the warning)
NONE_AT_ZERO = ("fp8", "int8", "fp4")
REQUIRED = ("name", "sources", "dense_tflops", "hbm_bandwidth_tbs", "hbm_capacity_gib",
            "interconnect", "interconnect_bandwidth_gbs", "sm_count")
OPTIONAL = ("schema", "display_name", "aliases", "notes", "power_limit_w", "boost_clock_mhz",
            "l2_cache_mib", "memory_kind", "compute_capability")
#: optional fields of a busy GPU's power state: not part of the hash (see the module docstring)
POWER_FIELDS = ("power_limit_w", "boost_clock_mhz")
#: optional fields that describe the GPU for transfer: not part of the hash (module docstring)
TRANSFER_FIELDS = ("l2_cache_mib", "memory_kind", "compute_capability")
#: the memory kinds a datasheet may name
MEMORY_KINDS = ("hbm2", "hbm2e", "hbm3", "hbm3e", "gddr6", "gddr6x", "gddr7")
#: datasheet fields a what-if or bootstrap may change, with their units
NUMERIC_FIELDS = {
    "bf16_tflops": "1e12 FLOP/s", "fp16_tflops": "1e12 FLOP/s", "fp8_tflops": "1e12 FLOP/s",
    "int8_tops": "1e12 op/s", "fp4_tflops": "1e12 FLOP/s",
    "hbm_bandwidth_tbs": "1e12 B/s", "interconnect_bandwidth_gbs": "1e9 B/s",
    "hbm_capacity_gib": "GiB", "sm_count": "SMs", "power_limit_w": "W", "boost_clock_mhz": "MHz",
}
#: every numeric field's unit: the above and the transfer fields (no what-if changes those yet)
UNITS = {**NUMERIC_FIELDS, "l2_cache_mib": "MiB"}
#: rate field → factor from its unit to FLOP/µs or bytes/µs
PER_US = {"bf16_tflops": 1e6, "fp16_tflops": 1e6, "fp8_tflops": 1e6, "int8_tops": 1e6,
          "fp4_tflops": 1e6,
          "hbm_bandwidth_tbs": 1e6, "interconnect_bandwidth_gbs": 1e3}
#: GEMM input dtypes with a dense peak of their own (any other, e.g. 4-bit W4A16, runs at BF16;
#: no kernel variant is FP4 yet, module docstring)
PEAK_FIELD = {"bf16": "bf16_tflops", "fp16": "fp16_tflops", "fp8": "fp8_tflops",
              "fp8_block": "fp8_tflops", "int8": "int8_tops", "fp4": "fp4_tflops"}

#: every key of a datasheet file (the dense peaks as ``dense_tflops.<dtype>``) → (unit, meaning):
#: the comment beside it in a written datasheet (:func:`datasheet_yaml`, :func:`template_yaml`)
FIELD_NOTES = {
    "schema": ("", "the schema of this file"),
    "name": ("", "identifier used on the command line (letters, digits, _ . -)"),
    "display_name": ("", "human name (default: the name)"),
    "aliases": ("", "other names, first the one nvidia-smi reports (a per-op table's device)"),
    "sources": ("", "citations, one string each: the spec sheet (URL) and the figures it gives"),
    "dense_tflops": ("", "dense tensor-core peaks by input type: no sparsity; FP32 accumulate "
                         "where the vendor gives two"),
    "dense_tflops.bf16": ("1e12 FLOP/s", "dense BF16 peak (TFLOPS)"),
    "dense_tflops.fp16": ("1e12 FLOP/s", "dense FP16 peak (TFLOPS)"),
    "dense_tflops.fp8": ("1e12 FLOP/s", "dense FP8 peak (TFLOPS); 0: no FP8 tensor cores"),
    "dense_tflops.int8": ("1e12 op/s", "dense INT8 peak (TOPS); 0: no INT8 tensor cores"),
    "dense_tflops.fp4": ("1e12 FLOP/s", "dense FP4 peak (TFLOPS), NVFP4 / MXFP4 inputs; 0: no FP4 "
                                        "tensor cores"),
    "hbm_bandwidth_tbs": ("1e12 B/s", "device-memory bandwidth (TB/s), HBM or GDDR alike: 864 GB/s is 0.864"),
    "hbm_capacity_gib": ("GiB", "device memory, GiB of 2^30 bytes: a vendor's \"80 GB\" of HBM is 80"),
    "interconnect": ("", "link kind, a label (nvlink3, nvlink4, nvlink5, pcie4, pcie5)"),
    "interconnect_bandwidth_gbs": ("1e9 B/s", "link bandwidth per GPU (GB/s), ONE direction: half a "
                                              "\"bidirectional\" or \"total\" figure (NVLink 900 GB/s: "
                                              "450; PCIe Gen5 x16: 64)"),
    "sm_count": ("SMs", "streaming multiprocessors enabled on this product (not the full die)"),
    "power_limit_w": ("W", "the board's default power limit (TDP)"),
    "boost_clock_mhz": ("MHz", "the maximum SM clock (nvidia-smi's clocks.max.sm)"),
    "l2_cache_mib": ("MiB", "the L2 cache, MiB of 2^20 bytes (the vendor's \"MB\")"),
    "memory_kind": ("", "device memory: " + ", ".join(MEMORY_KINDS)),
    "compute_capability": ("", "CUDA compute capability, \"major.minor\", quoted (\"8.9\")"),
}


def field_note(key: str) -> str:
    """``unit: meaning`` of a datasheet key (:data:`FIELD_NOTES`), or the meaning alone."""
    unit, meaning = FIELD_NOTES[key]
    return f"{unit}: {meaning}" if unit else meaning


#: optional keys a datasheet may leave out (or blank) → (what it is taken as, what that changes):
#: the warning :func:`omitted` gives for each
OMITTED = {
    "aliases": ("none", "per-op tables are this GPU's only where their device is its name; give "
                        "the name nvidia-smi reports as the first alias"),
    "dense_tflops.fp16": ("the BF16 peak", "FP16 GEMMs run at it"),
    "dense_tflops.fp8": ("0 (no FP8 tensor cores)", "FP8 GEMMs run at the BF16 peak"),
    "dense_tflops.int8": ("0 (no INT8 tensor cores)", "INT8 GEMMs run at the BF16 peak"),
    "dense_tflops.fp4": ("0 (no FP4 tensor cores)", "no kernel is priced in FP4; per-op rows are "
                         "checked against the fastest of the other peaks"),
    "power_limit_w": ("0 (unknown)", "no power cap is modelled, so a sustained load (predict "
                      "--clock sustained, workload saturation, the BLIS export) runs at the boost "
                      "clock as a burst does"),
    "boost_clock_mhz": ("0 (unknown)", "a prediction's clock is known only as a share of the "
                        "maximum (compute_scale; its sm_clock_mhz column is NaN), and a bootstrap "
                        "scales the warm-L2 saving by SM counts alone"),
    "l2_cache_mib": ("0 (unknown)", "per-op table rows are priced on a cold L2 (fits, residuals); "
                     "no step prediction reads it"),
    "memory_kind": ("unknown", "a bootstrap quotes the zero-shot error measured between any two "
                    "GPUs, not between GPUs of its memory kind"),
    "compute_capability": ("unknown", "a bootstrap carries every kernel variant's own surface, as "
                           "between GPUs of one architecture"),
}


@dataclass(frozen=True)
class GPUSpec:
    """One GPU's datasheet. Rates in the units of the field names; see the module docstring."""

    name: str
    bf16_tflops: float
    hbm_bandwidth_tbs: float
    hbm_capacity_gib: float
    interconnect: str
    interconnect_bandwidth_gbs: float
    sm_count: int
    fp16_tflops: float = 0.0
    fp8_tflops: float = 0.0            # 0 = no FP8 tensor cores
    int8_tops: float = 0.0
    fp4_tflops: float = 0.0            # 0 = no FP4 tensor cores
    power_limit_w: float = 0.0         # 0 = unknown: no power cap modelled
    boost_clock_mhz: float = 0.0       # 0 = unknown: clocks reported as a fraction of the maximum
    l2_cache_mib: float = 0.0          # 0 = unknown
    memory_kind: str = ""              # "" = unknown; else one of MEMORY_KINDS
    compute_capability: str = ""       # "" = unknown; "9.0"
    display_name: str = ""
    sources: tuple[str, ...] = ()
    aliases: tuple[str, ...] = field(default=(), compare=False)

    def peak_field(self, dtype: str) -> str:
        """The field of the dense peak a GEMM input dtype runs at: its own (:data:`PEAK_FIELD`)
        when this GPU has it, else BF16 (no FP8 tensor cores; 4-bit weights are dequantised to
        BF16 on the tensor cores, W4A16)."""
        f = PEAK_FIELD.get(dtype)
        return f if f and getattr(self, f) else "bf16_tflops"

    def peak_flops_per_us(self, dtype: str) -> float:
        """Dense peak for a GEMM input dtype in FLOP/µs (field :meth:`peak_field`)."""
        f = self.peak_field(dtype)
        return getattr(self, f) * PER_US[f]

    @property
    def hbm_bytes_per_us(self) -> float:
        return self.hbm_bandwidth_tbs * PER_US["hbm_bandwidth_tbs"]

    @property
    def link_bytes_per_us(self) -> float:
        return self.interconnect_bandwidth_gbs * PER_US["interconnect_bandwidth_gbs"]

    @property
    def balance_flops_per_byte(self) -> float:
        """BF16 ridge point of the roofline: FLOPs per HBM byte at which compute and memory tie."""
        return self.bf16_tflops / self.hbm_bandwidth_tbs

    def canonical(self) -> dict:
        """The figures that define the GPU (no names or citations), for hashing."""
        d = asdict(self)
        for k in ("display_name", "sources", "aliases") + POWER_FIELDS + TRANSFER_FIELDS:
            d.pop(k)
        if not d["fp4_tflops"]:               # no FP4: hashed as before the field (module docstring)
            d.pop("fp4_tflops")
        return d

    def sha256(self) -> str:
        """Hash of :meth:`canonical`; coefficient files record it to detect a changed datasheet."""
        return sha256_text(json.dumps(self.canonical(), sort_keys=True))

    def replace(self, **changes) -> "GPUSpec":
        """A copy with some numeric fields changed (what-if analysis); validated like a file."""
        d = asdict(self)
        d.update(changes)
        spec = GPUSpec(**d)
        _check_numbers(spec, f"datasheet {self.name} (modified)")
        return spec


def _positive(value, path, key) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value <= 0:
        raise RoofcalError(f"{path}: field '{key}' must be a positive number, got {value!r}")
    return float(value)


def _optional_positive(raw: dict, key: str, path) -> float:
    """An optional positive field of ``raw`` (0.0 when absent)."""
    return 0.0 if raw.get(key) is None else _positive(raw[key], path, key)


def _memory_kind(value, path) -> str:
    if value is None:
        return ""
    if not isinstance(value, str) or value.lower() not in MEMORY_KINDS:
        raise RoofcalError(f"{path}: field 'memory_kind' must be one of {', '.join(MEMORY_KINDS)}, "
                           f"got {value!r}")
    return value.lower()


def _compute_capability(value, path) -> str:
    import re
    if value is None:
        return ""
    text = str(value)
    if isinstance(value, bool) or not re.fullmatch(r"\d{1,2}\.\d", text):
        raise RoofcalError(f"{path}: field 'compute_capability' must be 'major.minor' (e.g. '9.0'), "
                           f"got {value!r}")
    return text


def _check_numbers(spec: GPUSpec, path) -> None:
    for key in ("bf16_tflops", "hbm_bandwidth_tbs", "hbm_capacity_gib", "interconnect_bandwidth_gbs",
                "sm_count"):
        _positive(getattr(spec, key), path, key)
    for key in POWER_FIELDS:
        v = getattr(spec, key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise RoofcalError(f"{path}: field '{key}' must be a positive number (0 or absent: unknown), "
                               f"got {v!r}")
    bf16 = spec.bf16_tflops
    for key, limit in (("fp16_tflops", 1.05), ("fp8_tflops", 2.05), ("int8_tops", 2.05),
                       ("fp4_tflops", 4.1)):
        v = getattr(spec, key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise RoofcalError(f"{path}: field '{key}' must be a finite number ≥ 0 (0 = no such "
                               f"tensor cores), got {v!r}")
        if v and v > limit * bf16:
            raise RoofcalError(
                f"{path}: field 'dense_tflops.{key.split('_')[0]}'={v:g} is {v / bf16:.1f}x the BF16 "
                f"peak; that is a sparsity figure, give the dense one")


def parse_datasheet(raw: dict, path: str | Path = "<datasheet>") -> GPUSpec:
    """Validate a datasheet mapping and build a :class:`GPUSpec`."""
    if not isinstance(raw, dict):
        raise RoofcalError(f"{path}: a datasheet must be a YAML mapping")
    schema = raw.get("schema", SCHEMA)
    if schema != SCHEMA:
        raise RoofcalError(f"{path}: field 'schema' is {schema!r}, expected {SCHEMA!r}")
    for key in raw:
        if "sparse" in str(key).lower() or "sparsity" in str(key).lower():
            raise RoofcalError(f"{path}: field '{key}' is a sparsity figure; roofcal needs dense peaks")
        if key not in REQUIRED and key not in OPTIONAL:
            raise RoofcalError(f"{path}: unknown field '{key}'")
    for key in REQUIRED:
        if key not in raw:
            raise RoofcalError(f"{path}: missing field '{key}' ({field_note(key)})")
    blank = []                        # in the order of a template (roofcal gpu template)
    for k in REQUIRED:
        if raw[k] is None or (k == "sources" and raw[k] == []):
            blank.append(k)
        elif k == "dense_tflops" and isinstance(raw[k], dict) and "bf16" in raw[k] and raw[k]["bf16"] is None:
            blank.append("dense_tflops.bf16")
    if len(blank) == 1:
        raise RoofcalError(f"{path}: field '{blank[0]}' is blank ({field_note(blank[0])})")
    if blank:
        raise RoofcalError(f"{path}: {len(blank)} required fields are blank: {', '.join(blank)} "
                           f"(their units: roofcal gpu template my_gpu)")
    peaks = raw["dense_tflops"]
    if not isinstance(peaks, dict):
        raise RoofcalError(f"{path}: field 'dense_tflops' must map dtype to TFLOP/s")
    for key, value in peaks.items():
        if "sparse" in str(key).lower():
            raise RoofcalError(f"{path}: field 'dense_tflops.{key}' is a sparsity figure; "
                               f"roofcal needs dense peaks")
        if key not in DTYPES:
            raise RoofcalError(f"{path}: unknown field 'dense_tflops.{key}' (known: {', '.join(DTYPES)})")
        if value is not None and not (key in NONE_AT_ZERO and value == 0 and not isinstance(value, bool)):
            _positive(value, path, f"dense_tflops.{key}")
    if peaks.get("bf16") is None:
        what = "field 'dense_tflops.bf16' is blank" if "bf16" in peaks else "missing field 'dense_tflops.bf16'"
        raise RoofcalError(f"{path}: {what} ({field_note('dense_tflops.bf16')})")
    sources = raw["sources"]
    if isinstance(sources, str):
        sources = [sources]
    if not sources or not all(isinstance(s, str) and s.strip() for s in sources):
        raise RoofcalError(f"{path}: field 'sources' must cite at least one spec sheet")
    sm = raw["sm_count"]
    if isinstance(sm, bool) or not isinstance(sm, int):
        raise RoofcalError(f"{path}: field 'sm_count' must be an integer, got {sm!r}")
    spec = GPUSpec(
        name=str(raw["name"]),
        bf16_tflops=float(peaks["bf16"]),
        fp16_tflops=float(peaks.get("fp16") or peaks["bf16"]),
        fp8_tflops=float(peaks.get("fp8") or 0.0),
        int8_tops=float(peaks.get("int8") or 0.0),
        fp4_tflops=float(peaks.get("fp4") or 0.0),
        hbm_bandwidth_tbs=_positive(raw["hbm_bandwidth_tbs"], path, "hbm_bandwidth_tbs"),
        hbm_capacity_gib=_positive(raw["hbm_capacity_gib"], path, "hbm_capacity_gib"),
        interconnect=str(raw["interconnect"]),
        interconnect_bandwidth_gbs=_positive(raw["interconnect_bandwidth_gbs"], path,
                                             "interconnect_bandwidth_gbs"),
        sm_count=sm,
        power_limit_w=_optional_positive(raw, "power_limit_w", path),
        boost_clock_mhz=_optional_positive(raw, "boost_clock_mhz", path),
        l2_cache_mib=_optional_positive(raw, "l2_cache_mib", path),
        memory_kind=_memory_kind(raw.get("memory_kind"), path),
        compute_capability=_compute_capability(raw.get("compute_capability"), path),
        display_name=str(raw["name"] if raw.get("display_name") is None else raw["display_name"]),
        sources=tuple(sources),
        aliases=tuple(str(a) for a in raw.get("aliases") or ()),
    )
    _check_numbers(spec, path)
    return spec


#: schema of a datasheet overlay (what ``roofcal probe`` writes): a ``base`` datasheet (a bundled
#: name or a path, relative to the overlay's folder) with the power fields measured on the GPU, the
#: folder of the sustained-load measurement (``sustained``) and what else was measured (``measured``,
#: ``notes``: informational)
OVERLAY_SCHEMA = "roofcal-datasheet-overlay/1"
OVERLAY_FIELDS = ("schema", "base", "sustained", "measured", "notes") + POWER_FIELDS


def parse_overlay(raw: dict, path: str | Path) -> GPUSpec:
    """The base datasheet of an overlay with its power fields replaced (its name and hash are
    the base's: the same coefficient files apply)."""
    from roofcal.physics.hardware import load_gpu
    for key in raw:
        if key not in OVERLAY_FIELDS:
            raise RoofcalError(f"{path}: unknown field '{key}' (a datasheet overlay has {', '.join(OVERLAY_FIELDS)})")
    base = raw.get("base")
    if not isinstance(base, str) or not base:
        raise RoofcalError(f"{path}: missing field 'base' (the datasheet this overlay measures)")
    near = Path(path).parent / base
    spec = load_gpu(str(near) if base.endswith((".yaml", ".yml")) and near.is_file() else base)
    changes = {k: _positive(raw[k], path, k) for k in POWER_FIELDS if raw.get(k) is not None}
    d = asdict(spec)
    d.update(changes)
    return GPUSpec(**d)


def overlay_sustained(path: str | Path) -> Path | None:
    """The sustained-load measurement folder an overlay names (relative to it), else None (also
    for a plain datasheet)."""
    try:
        raw = read_yaml(path, "datasheet file")
    except RoofcalError:
        return None
    if not isinstance(raw, dict) or raw.get("schema") != OVERLAY_SCHEMA or not raw.get("sustained"):
        return None
    folder = Path(path).parent / str(raw["sustained"])
    return folder if folder.is_dir() else None


def omitted(raw: dict) -> list[str]:
    """The keys of :data:`OMITTED` that a datasheet mapping leaves out or blank, in that order
    (``aliases``: also an empty list)."""
    peaks = raw.get("dense_tflops") if isinstance(raw.get("dense_tflops"), dict) else {}
    out = []
    for key in OMITTED:
        value = peaks.get(key.split(".", 1)[1]) if key.startswith("dense_tflops.") else raw.get(key)
        if value is None or (key == "aliases" and not value):
            out.append(key)
    return out


def omitted_warning(path, key: str) -> str:
    """The one line that says an optional ``key`` was left out of datasheet ``path``: its default
    and what that changes (:data:`OMITTED`)."""
    default, effect = OMITTED[key]
    say = " (write 0 where the GPU has none)" if key.split(".")[-1] in NONE_AT_ZERO else ""
    return f"{path}: optional field '{key}' not given, taken as {default}: {effect}{say}"


def read_datasheet(path: str | Path) -> GPUSpec:
    """Read and validate one datasheet YAML file, or a datasheet overlay (:data:`OVERLAY_SCHEMA`).
    A user's file (not a bundled one) warns once per optional field it leaves out
    (:func:`omitted_warning`, a :class:`~roofcal.errors.RoofcalWarning`)."""
    raw = read_yaml(path, "datasheet file")
    if isinstance(raw, dict) and raw.get("schema") == OVERLAY_SCHEMA:
        return parse_overlay(raw, path)
    spec = parse_datasheet(raw, path)
    if Path(path).resolve().parent != Path(__file__).resolve().parent:
        import warnings

        from roofcal.errors import RoofcalWarning
        for key in omitted(raw):      # one line each; Python shows a given line once per process
            warnings.warn(RoofcalWarning(omitted_warning(path, key)), stacklevel=2)
    return spec


# --------------------------------------------------------------------------------------------
# the inverse of parse_datasheet: a GPUSpec written back as the datasheet it was read from

#: keys written first, in this order (the rest follow in GPUSpec's field order)
FRONT_KEYS = ("schema", "name", "display_name", "aliases", "sources", "dense_tflops")


def datasheet_dict(spec: GPUSpec) -> dict:
    """The datasheet mapping that :func:`parse_datasheet` reads back to ``spec``, aliases
    included: ``parse_datasheet(datasheet_dict(s)) == s`` for every parsed ``s``.

    Derived from :class:`GPUSpec`'s fields, not a list of keys: every field is written under its
    own name, except the dense peaks, which nest under ``dense_tflops`` by dtype (the inverse of
    :data:`PEAK_FIELD` over :data:`DTYPES`); a field at its default (no aliases, an optional
    figure left out) is not written, except the peaks of :data:`NONE_AT_ZERO`, written as 0 where
    the GPU has no such tensor cores (said, not left out)."""
    from dataclasses import MISSING, fields
    nested = {PEAK_FIELD[d]: d for d in DTYPES}
    body: dict = {"schema": SCHEMA}
    for f in fields(GPUSpec):
        value = getattr(spec, f.name)
        if f.name in nested:
            if value or nested[f.name] in NONE_AT_ZERO:
                body.setdefault("dense_tflops", {})[nested[f.name]] = value
            continue
        default = f.default_factory() if f.default_factory is not MISSING else f.default
        if default is not MISSING and value == default:
            continue
        body[f.name] = list(value) if isinstance(value, tuple) else value
    return {**{k: body[k] for k in FRONT_KEYS if k in body},
            **{k: v for k, v in body.items() if k not in FRONT_KEYS}}


def _commented(lines: list[tuple[str, str]]) -> list[str]:
    """(YAML line, comment) pairs as lines with the comments in one column (none where empty)."""
    col = max((len(ln) for ln, c in lines if c and len(ln) <= 40), default=0) + 2
    return [f"{ln.ljust(col)}# {c}".rstrip() if c else ln for ln, c in lines]


def datasheet_yaml(spec: GPUSpec, header: str = "") -> str:
    """:func:`datasheet_dict` as YAML text, each field's unit and meaning beside it
    (:data:`FIELD_NOTES`); ``header``: comment lines to put first."""
    from roofcal.io import yaml_text
    text = yaml_text(datasheet_dict(spec), sort_keys=False, allow_unicode=True,
                     default_flow_style=False, width=1 << 20)
    out = [f"# {ln}" if ln else "#" for ln in header.splitlines()]
    out += [f"# {SCHEMA}: every peak dense (no sparsity), every link bandwidth one direction; each "
            f"field's unit and meaning beside it"]
    pairs, parent = [], ""
    for line in text.splitlines():
        if line.startswith("- "):                          # an item of aliases or sources
            pairs.append((line, ""))
            continue
        key = line.strip().split(":", 1)[0]
        if not line.startswith(" "):
            parent = key
        key = f"{parent}.{key}" if line.startswith(" ") else key
        pairs.append((line, field_note(key) if key in FIELD_NOTES else ""))
    return "\n".join(out + _commented(pairs)) + "\n"


#: a name :func:`template_yaml` writes as it is (no YAML quoting needed, one word on a command line)
NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.-]*"


def _hint(value) -> str:
    """A reference value as a template's hint shows it: as YAML would read it back (strings that
    are not plain words quoted, lists in flow style)."""
    import re
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_hint(v) for v in value) + "]"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{value:g}"
    text = str(value)
    return text if re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]*", text) else json.dumps(text)


def template_yaml(name: str, like: GPUSpec) -> str:
    """A blank datasheet for a new GPU ``name`` (``roofcal gpu template NAME``): every key of the
    schema under a comment giving its unit and meaning (:data:`FIELD_NOTES`) and, for an optional
    one, what a blank takes (:data:`OMITTED`); ``sources`` empty and every figure blank, with the
    datasheet ``like``'s value beside it only as a hint of scale, marked with that GPU's name.
    Read as it is, it is refused at its first blank required field; filled in, it reads as any
    datasheet (a blank optional field: its default, with a warning)."""
    import re
    if not isinstance(name, str) or not re.fullmatch(NAME_PATTERN, name):
        raise RoofcalError(f"gpu template: a GPU name is letters, digits, '_', '.' and '-', got {name!r}")
    ref = datasheet_dict(like)
    peaks = ref.get("dense_tflops", {})
    hint = {k: ref.get(k) for k in FIELD_NOTES} | {f"dense_tflops.{d}": peaks.get(d) for d in DTYPES}
    no_hint = ("schema", "name", "display_name", "sources", "dense_tflops")
    lines = [f"# {SCHEMA}: the datasheet of {name}, a new GPU, to fill in from its vendor's spec sheet.",
             f"# Every figure is blank. Above each field: its unit and meaning; beside it, marked "
             f"'{like.name}:', that GPU's",
             f"# value as a hint of scale only (not {name}'s). A blank required field is refused; a "
             f"blank optional one",
             "# takes the default named, with a warning. Check the filled file: roofcal gpu show FILE"]
    keys = ["schema", "name", "display_name", "aliases", "sources", "dense_tflops",
            *(f"dense_tflops.{d}" for d in DTYPES)]
    keys += [k for k in FIELD_NOTES if k not in keys]
    for key in keys:
        sub = key.startswith("dense_tflops.")
        leaf = key.split(".", 1)[1] if sub else key
        value = {"schema": SCHEMA, "name": name, "aliases": "[]", "sources": "[]"}.get(key, "")
        unit, meaning = FIELD_NOTES[key]
        if key not in ("schema", "dense_tflops"):
            need = "required" if key in REQUIRED or key == "dense_tflops.bf16" else "optional"
            meaning = f"{leaf} ({', '.join(x for x in (need, unit) if x)}): {meaning}"
            if key in OMITTED:
                meaning += f"; if blank: {OMITTED[key][0]}"
            lines.append(f"{'  # ' if sub else '# '}{meaning}")
        line = f"{'  ' if sub else ''}{leaf}: {value}".rstrip()
        shown = hint.get(key)
        if key == "schema" or key == "dense_tflops":
            lines.append(f"{line}  # {meaning}")
        elif key not in no_hint and shown not in (None, "", []):
            lines.append(f"{line.ljust(28)}  # {like.name}: {_hint(shown)}")
        else:
            lines.append(line)
    return "\n".join(lines) + "\n"

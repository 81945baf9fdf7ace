"""GPU datasheets: the YAML schema, its validation, and :class:`GPUSpec`.

Schema ``roofcal-datasheet/1`` (every figure is a dense vendor peak; units are in the field names):

==============================  ==========================================================  ========
field                           meaning                                                     required
==============================  ==========================================================  ========
``name``                        identifier used on the command line (``h100_sxm``)          yes
``display_name``, ``aliases``   human name; other names accepted by :func:`load_gpu`        no
``sources``                     list of citations for the figures                           yes
``dense_tflops.bf16``           dense BF16 tensor-core peak, 1e12 FLOP/s                    yes
``dense_tflops.fp16/fp8/int8``  dense peaks for other dtypes (omit when unsupported)        no
``hbm_bandwidth_tbs``           device-memory bandwidth, 1e12 bytes/s                       yes
``hbm_capacity_gib``            device memory, GiB                                          yes
``interconnect``                link kind (nvlink4, pcie5, ...)                             yes
``interconnect_bandwidth_gbs``  per-GPU link bandwidth, one direction, 1e9 bytes/s          yes
``sm_count``                    streaming multiprocessors                                   yes
``power_limit_w``               the board's default power limit (TDP), W                    no
``boost_clock_mhz``             the maximum SM clock (nvidia-smi's ``clocks.max.sm``), MHz  no
``l2_cache_mib``                last-level (L2) cache, MiB (the vendor's "MB")              no
``memory_kind``                 device memory: hbm2, hbm2e, hbm3, hbm3e, gddr6, gddr7       no
``compute_capability``          CUDA compute capability, "major.minor" (8.0, 8.9, 9.0)      no
==============================  ==========================================================  ========

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

Sparsity figures are refused: any key mentioning sparsity, and any low-precision peak above twice
the BF16 peak (every NVIDIA generation doubles per halving of precision; 4x means a sparse figure).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from roofcal.errors import RoofcalError
from roofcal.io import read_yaml, sha256_text

SCHEMA = "roofcal-datasheet/1"
DTYPES = ("bf16", "fp16", "fp8", "int8")
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
    "int8_tops": "1e12 op/s",
    "hbm_bandwidth_tbs": "1e12 B/s", "interconnect_bandwidth_gbs": "1e9 B/s",
    "hbm_capacity_gib": "GiB", "sm_count": "SMs", "power_limit_w": "W", "boost_clock_mhz": "MHz",
}
#: every numeric field's unit: the above and the transfer fields (no what-if changes those yet)
UNITS = {**NUMERIC_FIELDS, "l2_cache_mib": "MiB"}
#: rate field → factor from its unit to FLOP/µs or bytes/µs
PER_US = {"bf16_tflops": 1e6, "fp16_tflops": 1e6, "fp8_tflops": 1e6, "int8_tops": 1e6,
          "hbm_bandwidth_tbs": 1e6, "interconnect_bandwidth_gbs": 1e3}
#: GEMM input dtypes with a dense peak of their own (any other, e.g. 4-bit W4A16, runs at BF16)
PEAK_FIELD = {"bf16": "bf16_tflops", "fp16": "fp16_tflops", "fp8": "fp8_tflops",
              "fp8_block": "fp8_tflops", "int8": "int8_tops"}


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
    for key, limit in (("fp16_tflops", 1.05), ("fp8_tflops", 2.05), ("int8_tops", 2.05)):
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
        if key not in raw or raw[key] is None:
            raise RoofcalError(f"{path}: missing field '{key}'")
    peaks = raw["dense_tflops"]
    if not isinstance(peaks, dict):
        raise RoofcalError(f"{path}: field 'dense_tflops' must map dtype to TFLOP/s")
    for key, value in peaks.items():
        if "sparse" in str(key).lower():
            raise RoofcalError(f"{path}: field 'dense_tflops.{key}' is a sparsity figure; "
                               f"roofcal needs dense peaks")
        if key not in DTYPES:
            raise RoofcalError(f"{path}: unknown field 'dense_tflops.{key}' (known: {', '.join(DTYPES)})")
        if value is not None:
            _positive(value, path, f"dense_tflops.{key}")
    if peaks.get("bf16") is None:
        raise RoofcalError(f"{path}: missing field 'dense_tflops.bf16'")
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
        display_name=str(raw.get("display_name", raw["name"])),
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


def read_datasheet(path: str | Path) -> GPUSpec:
    """Read and validate one datasheet YAML file, or a datasheet overlay (:data:`OVERLAY_SCHEMA`)."""
    raw = read_yaml(path, "datasheet file")
    if isinstance(raw, dict) and raw.get("schema") == OVERLAY_SCHEMA:
        return parse_overlay(raw, path)
    return parse_datasheet(raw, path)


# --------------------------------------------------------------------------------------------
# the inverse of parse_datasheet: a GPUSpec written back as the datasheet it was read from

#: keys written first, in this order (the rest follow in GPUSpec's field order)
FRONT_KEYS = ("schema", "name", "display_name", "aliases", "sources", "dense_tflops")


def datasheet_dict(spec: GPUSpec) -> dict:
    """The datasheet mapping that :func:`parse_datasheet` reads back to ``spec``, aliases
    included: ``parse_datasheet(datasheet_dict(s)) == s`` for every parsed ``s``.

    Derived from :class:`GPUSpec`'s fields, not a list of keys: every field is written under its
    own name, except the dense peaks, which nest under ``dense_tflops`` by dtype (the inverse of
    :data:`PEAK_FIELD` over :data:`DTYPES`); a field at its default (a peak of 0 = no such tensor
    cores, no aliases, an optional figure left out) is not written."""
    from dataclasses import MISSING, fields
    nested = {PEAK_FIELD[d]: d for d in DTYPES}
    body: dict = {"schema": SCHEMA}
    for f in fields(GPUSpec):
        value = getattr(spec, f.name)
        if f.name in nested:
            if value:
                body.setdefault("dense_tflops", {})[nested[f.name]] = value
            continue
        default = f.default_factory() if f.default_factory is not MISSING else f.default
        if default is not MISSING and value == default:
            continue
        body[f.name] = list(value) if isinstance(value, tuple) else value
    return {**{k: body[k] for k in FRONT_KEYS if k in body},
            **{k: v for k, v in body.items() if k not in FRONT_KEYS}}


def schema_lines() -> list[str]:
    """The field table of this module's docstring (the schema a datasheet follows), line by line."""
    lines = (__doc__ or "").splitlines()
    rules = [i for i, ln in enumerate(lines) if ln.startswith("====")]
    import re
    rows = [[re.sub(r":\w+:`([^`]*)`", r"\1", c).replace("``", "")
             for c in re.split(r"\s{2,}", ln.strip())]
            for ln in (lines[rules[0]:rules[-1] + 1] if len(rules) >= 2 else [])
            if not ln.startswith("====")]
    widths = [max(len(r[i]) for r in rows if i < len(r)) for i in range(max(map(len, rows), default=0))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def datasheet_yaml(spec: GPUSpec, header: str = "") -> str:
    """:func:`datasheet_dict` as YAML text with the schema as a comment on top and each figure's
    unit beside it (:data:`NUMERIC_FIELDS`); ``header``: comment lines to put first."""
    from roofcal.io import yaml_text
    nested = {d: PEAK_FIELD[d] for d in DTYPES}           # dense_tflops' keys → fields
    text = yaml_text(datasheet_dict(spec), sort_keys=False, allow_unicode=True,
                     default_flow_style=False, width=1 << 20)
    out = [f"# {ln}" if ln else "#" for ln in header.splitlines()]
    out += [f"# {SCHEMA}: peaks are dense vendor figures (no sparsity); the fields:"]
    out += [f"#   {ln}" for ln in schema_lines()]
    for line in text.splitlines():
        key = line.strip().split(":", 1)[0]
        field = nested.get(key) if line.startswith(" ") else key
        unit = UNITS.get(field or "")
        out.append(f"{line}  # {unit}" if unit and not line.rstrip().endswith(":") else line)
    return "\n".join(out) + "\n"

"""vLLM's own traces (journey + step tracing, OTLP JSON lines) → roofcal steps and request intervals.

Input: the file an OpenTelemetry collector's ``file`` exporter writes — one OTLP
``ExportTraceServiceRequest`` JSON object per line (``resourceSpans[].scopeSpans[].{scope.name,
spans[]}``, ``span.events[].{timeUnixNano, name, attributes[{key, value}]}``; ``intValue`` is a
JSON string), plain or gzip (``.gz``). Each file is one vLLM run (its step ids and requests are never
joined with another file's); concatenate rotated collector files of one run first (``cat``/``zcat``).

**Parsing and speed.** Each line is decoded by ``msgspec`` into typed structures of the OTLP JSON
mapping (:class:`OtlpExport` → :class:`OtlpResourceSpans` → :class:`OtlpScopeSpans` →
:class:`OtlpSpan` → :class:`OtlpEvent` → :class:`OtlpKeyValue` with an :class:`OtlpAnyValue`):
only the fields roofcal reads are declared, the rest is skipped by the decoder, and ``intValue``
strings arrive as ints. The events are then added straight to per-step and per-request records,
decoding only the attributes roofcal uses (no per-event objects; :func:`iter_events` still yields
:class:`TraceEvent` for other uses). One process, one line at a time (``Decoder.decode_lines``
on blocks was no faster and loses the line of an error). On a 100 MB synthetic rich-step trace and
2 shared cores, ``read_trace`` runs at 57–100 MB/s (median 78–90; the decoding alone at ≈ 300
MB/s), against 21–36 MB/s for the earlier reader (stdlib :mod:`json` walking dicts, 2 worker
processes; 34–45 in one process). Worker processes no longer pay for the blocks they must be
sent. Memory: one line plus the per-step and per-request records produced.

Names (facts from vLLM's tracing, ``vllm/tracing.py`` ``SpanAttributes`` of the inference-sim vLLM
fork, and the tracing summary in the seeds; where they disagree vLLM wins and the seed's spelling is
accepted as an alias): every name this module reads is in :data:`SCOPES`, :data:`EVENTS` and
:data:`ATTRIBUTES` — change them there.

=======================  ======================================================================
scope ``vllm.api``       span ``llm_request``: ``api.ARRIVED``, ``api.HANDOFF_TO_CORE``,
                         ``api.DEPARTED``, ``api.ABORTED``; time ``event.ts.monotonic`` (s)
scope ``vllm.scheduler`` span ``llm_core`` (span attribute ``gen_ai.request.id``):
                         ``journey.QUEUED|SCHEDULED|FIRST_TOKEN|PREEMPTED|FINISHED`` with
                         ``ts.monotonic_ns`` (ns) or ``ts.monotonic`` (s), ``scheduler.step``,
                         ``prefill.done_tokens``/``prefill.total_tokens``, ``decode.done_tokens``,
                         ``num_preemptions``, ``schedule.kind``, ``finish.status``
scope ``vllm.scheduler.  ``step.BATCH_SUMMARY`` (``step.id``, ``step.ts_start_ns``,
step``                   ``step.ts_end_ns``, ``step.duration_us``, ``queue.*``, ``batch.*``,
                         ``kv.*``) and, in rich mode, ``step.REQUEST_SNAPSHOT`` per request
=======================  ======================================================================

API and core spans of one request share the OTLP ``traceId`` and are joined on it (the core
span's ``gen_ai.request.id`` carries a suffix the API span's lacks). All times are monotonic
clocks of the serving host; ``timeUnixNano`` (wall clock) is kept on events but not used.

**Steps.** One :class:`TraceStep` per emitted ``step.BATCH_SUMMARY``: forward time
``duration_us`` (``step.duration_us``), ``cycle_us`` = start of the next step (id + 1) − start of
this one, in µs (``None`` when the next step was not emitted), queue depths, batch counts and KV
usage. Its composition in roofcal's step format comes from, in order of preference:

* ``snapshot`` — the step's ``step.REQUEST_SNAPSHOT`` events. A request with
  ``scheduled_tokens_this_step`` = 1 whose ``num_computed_tokens`` ≥ its prompt is a decode at
  context ``num_computed_tokens``; any other request with scheduled tokens is a prefill chunk
  ``[scheduled, num_computed_tokens]`` (prefix-cache hits are already in ``num_computed_tokens``,
  so they count as cached; a recompute after preemption is a chunk). Convention: a snapshot's
  ``num_computed_tokens`` is the KV length *before* the step (:data:`SNAPSHOT_COMPUTED_IS_BEFORE_STEP`).
* ``journey`` — rebuilt from the requests' journeys. A ``SCHEDULED`` event at step s (prefill
  progress c = ``prefill.done_tokens``, the prefix-cache hit; n = ``decode.done_tokens``) starts a
  run of T = prompt + n tokens to put in KV; the run lasts until ``FINISHED`` (inclusive) or
  ``PREEMPTED`` (exclusive). Its prefill ends at the ``FIRST_TOKEN`` step f (a resumed run: at s).
  Step f holds the chunk ``[T − done, done]``; steps s..f−1 hold chunks whose sizes are only known
  when the request is the step's single unknown chunk (size = ``batch.scheduled_tokens`` − the
  step's known tokens) and every earlier chunk of it is known; steps k > f hold a decode at
  context T + (k − f − 1).
* ``aggregate`` — neither rebuilt composition agrees with the summary; ``prefill``/``decode`` are
  empty and only the ``batch.*`` counts describe the step.

A rebuilt composition is accepted only if its token total equals ``batch.scheduled_tokens`` and
its request count equals ``batch.num_prefill_reqs + batch.num_decode_reqs``.

**Requests.** One :class:`TraceRequest` per journey: monotonic times of ARRIVED, HANDOFF_TO_CORE,
QUEUED, first SCHEDULED, FIRST_TOKEN, FINISHED, DEPARTED; the intervals of BLIS's alphas in µs
(``queueing_us`` = QUEUED − ARRIVED, ``wait_us`` = SCHEDULED − QUEUED, ``ttft_us``, ``e2e_us``,
``tpot_us`` = (FINISHED − FIRST_TOKEN)/(output − 1)); preemption count; prompt/output lengths.

**Input problems** (counts in :class:`TraceSummary`):

* warm-up: the first ``warmup_steps`` step ids of a file (default 10) are flagged ``warmup``;
* preemption-heavy: ``batch.num_preempted`` ≥ ``max_preempted`` (default 5) flags the step;
  flagged and ``aggregate`` steps are left out of the steps JSONL (kept in the context CSV);
* sampled-out steps: gaps in the emitted step ids (their neighbours get no ``cycle_us``);
* truncated lines: bad JSON on the *last* line of a file (a collector killed mid-write, or a
  truncated gzip stream) is a counted warning; bad JSON on any other line is a
  :class:`RoofcalError` naming ``file:line``; so is JSON that does not fit the OTLP structures
  (say a string where an ``AnyValue`` object belongs; the message names the JSON path);
* unknown scopes: their spans are counted and skipped (so are unknown event names);
* missing attributes: a :class:`RoofcalError` naming ``file:line``, the event and the attribute;
* clocks going backwards: a step ending before it starts, or starting before the previous
  emitted step, is counted and dropped; a journey whose times go backwards is counted and its
  negative intervals left empty;
* steps referenced by journeys (``scheduler.step``) but never emitted are counted (distinct ids);
* duplicate step ids in one file: the first is kept, the others counted.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import zlib
from array import array
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

import msgspec

from roofcal.errors import RoofcalError

#: OTLP scope name → role (``api``: API spans, ``core``: journey core spans, ``step``: step tracing)
SCOPES = {"vllm.api": "api", "vllm.scheduler": "core", "vllm.scheduler.step": "step"}

#: event name → kind (bare names accepted too, as the seed document writes them)
EVENTS = {
    "step.BATCH_SUMMARY": "BATCH_SUMMARY", "step.REQUEST_SNAPSHOT": "REQUEST_SNAPSHOT",
    "api.ARRIVED": "ARRIVED", "api.HANDOFF_TO_CORE": "HANDOFF_TO_CORE",
    "api.DEPARTED": "DEPARTED", "api.ABORTED": "ABORTED",
    "journey.QUEUED": "QUEUED", "journey.SCHEDULED": "SCHEDULED",
    "journey.FIRST_TOKEN": "FIRST_TOKEN", "journey.PREEMPTED": "PREEMPTED",
    "journey.FINISHED": "FINISHED",
}
EVENTS.update({k.split(".", 1)[1]: v for k, v in list(EVENTS.items())})

#: roofcal field → accepted attribute keys (the first is vLLM's; later ones are aliases)
ATTRIBUTES: dict[str, tuple[str, ...]] = {
    # step.BATCH_SUMMARY
    "step_id": ("step.id",),
    "start_ns": ("step.ts_start_ns",),
    "end_ns": ("step.ts_end_ns",),
    "duration_us": ("step.duration_us",),
    "running_depth": ("queue.running_depth",),
    "waiting_depth": ("queue.waiting_depth",),
    "num_prefill_reqs": ("batch.num_prefill_reqs",),
    "num_decode_reqs": ("batch.num_decode_reqs",),
    "scheduled_tokens": ("batch.scheduled_tokens",),
    "prefill_tokens": ("batch.prefill_tokens",),
    "decode_tokens": ("batch.decode_tokens",),
    "num_finished": ("batch.num_finished",),
    "num_preempted": ("batch.num_preempted",),
    "kv_usage": ("kv.usage_gpu_ratio",),
    "kv_blocks_total": ("kv.blocks_total_gpu",),
    "kv_blocks_free": ("kv.blocks_free_gpu",),
    # step.REQUEST_SNAPSHOT
    "snap_request_id": ("request.id",),
    "snap_prompt": ("request.num_prompt_tokens",),
    "snap_computed": ("request.num_computed_tokens",),
    "snap_scheduled": ("request.scheduled_tokens_this_step",),
    # journey (core) and API events
    "ts_ns": ("ts.monotonic_ns",),
    "ts_s": ("ts.monotonic", "event.ts.monotonic"),
    "scheduler_step": ("scheduler.step",),
    "prefill_done": ("prefill.done_tokens", "prefill_done_tokens"),
    "prefill_total": ("prefill.total_tokens", "prefill_total_tokens"),
    "decode_done": ("decode.done_tokens", "decode_done_tokens"),
    "num_preemptions": ("num_preemptions",),
    "schedule_kind": ("schedule.kind",),
    "finish_status": ("finish.status",),
    # span attributes
    "request_id": ("gen_ai.request.id",),
}

#: attributes an event of each kind must carry (a missing one is a one-line error)
REQUIRED = {
    "BATCH_SUMMARY": ("step_id", "start_ns", "end_ns", "duration_us", "running_depth",
                      "waiting_depth", "num_prefill_reqs", "num_decode_reqs", "scheduled_tokens",
                      "num_preempted"),
    "REQUEST_SNAPSHOT": ("step_id", "snap_prompt", "snap_computed", "snap_scheduled"),
    "QUEUED": ("scheduler_step",),
    "SCHEDULED": ("scheduler_step", "prefill_done", "prefill_total", "decode_done"),
    "FIRST_TOKEN": ("scheduler_step",),
    "PREEMPTED": ("scheduler_step",),
    "FINISHED": ("scheduler_step",),
}

#: convention: a snapshot's ``request.num_computed_tokens`` is the KV length before the step
SNAPSHOT_COMPUTED_IS_BEFORE_STEP = True

WARMUP_STEPS = 10          #: default: the first 10 step ids of a file are warm-up
MAX_PREEMPTED = 5          #: default: steps preempting ≥ 5 requests are preemption-heavy


# ------------------------------------------------------------------------------------ schema


@dataclass(frozen=True, slots=True)
class TraceEvent:
    """One span event. ``time_ns``: ``timeUnixNano`` (wall clock, ns); ``raw``: attribute key →
    :class:`OtlpAnyValue`, decoded on access (:attr:`attributes`, :meth:`get`); ``trace_id`` and
    ``request_id`` come from the enclosing span; ``where`` is ``file:line``."""

    scope: str
    name: str
    time_ns: int
    raw: Mapping[str, Any]
    trace_id: str = ""
    request_id: str | None = None
    where: str = ""

    @property
    def attributes(self) -> dict[str, Any]:
        """All attributes, decoded."""
        return {k: _value(v) for k, v in self.raw.items()}

    @property
    def kind(self) -> str | None:
        """The event's kind (:data:`EVENTS`), ``None`` if unknown."""
        return EVENTS.get(self.name)

    def get(self, name: str, default=None):
        """The attribute roofcal calls ``name`` (first of its :data:`ATTRIBUTES` keys present)."""
        v = _pick(self.raw, name)
        return default if v is None else v

    def need(self, name: str):
        """Like :meth:`get`, but a missing attribute is a one-line :class:`RoofcalError`."""
        value = self.get(name)
        if value is None:
            raise RoofcalError(f"{self.where}: event '{self.name}' has no attribute "
                               f"'{ATTRIBUTES[name][0]}'")
        return value

    def monotonic_ns(self) -> int:
        """The event's monotonic time in ns (``ts.monotonic_ns``, else ``ts.monotonic`` s)."""
        ns = self.get("ts_ns")
        if ns is not None:
            return int(ns)
        s = self.get("ts_s")
        if s is None:
            raise RoofcalError(f"{self.where}: event '{self.name}' has no attribute "
                               f"'{ATTRIBUTES['ts_s'][0]}'")
        return round(float(s) * 1e9)


@dataclass(frozen=True)
class TraceStep:
    """One scheduler step. Token counts are integers; times in µs (``*_ns``: monotonic ns).

    ``prefill``/``decode`` are roofcal's step composition (``[[new, cached], ...]``, decode
    contexts), exact unless ``composition == "aggregate"`` (then empty)."""

    source: str
    step_id: int
    composition: str                      # "snapshot" | "journey" | "aggregate"
    prefill: tuple[tuple[int, int], ...]
    decode: tuple[int, ...]
    duration_us: float                    # GPU forward time, step.duration_us
    cycle_us: float | None                # start of step id+1 − start of this step
    start_ns: int
    end_ns: int
    running_depth: int
    waiting_depth: int
    num_prefill_reqs: int
    num_decode_reqs: int
    scheduled_tokens: int
    prefill_tokens: int | None
    decode_tokens: int | None
    num_finished: int | None
    num_preempted: int
    kv_usage: float | None
    kv_blocks_total: int | None
    kv_blocks_free: int | None
    warmup: bool = False
    preemption_heavy: bool = False

    @property
    def usable(self) -> bool:
        """Exact composition, past warm-up and not preemption-heavy (goes to the steps JSONL)."""
        return self.composition != "aggregate" and not self.warmup and not self.preemption_heavy

    def step_json(self) -> dict:
        """The step JSONL object (:class:`roofcal.physics.steps.Step` fields only)."""
        d: dict = {"prefill": [list(c) for c in self.prefill], "decode": list(self.decode)}
        if self.duration_us > 0:
            d["duration_us"] = float(self.duration_us)
        if self.cycle_us is not None and self.cycle_us > 0:
            d["cycle_us"] = float(self.cycle_us)
        return d

    def to_step(self):
        """A :class:`roofcal.physics.steps.Step` (imports JAX)."""
        from roofcal.physics.steps import Step
        return Step(self.prefill, self.decode, float(self.duration_us) if self.duration_us > 0
                    else None, cycle_us=float(self.cycle_us) if self.cycle_us else None)


@dataclass(frozen=True)
class TraceRequest:
    """One request's journey; ``*_ns`` are monotonic ns, intervals in µs (``None`` if unknown)."""

    source: str
    request_id: str
    prompt_tokens: int | None
    output_tokens: int | None
    num_preemptions: int
    finish_status: str | None
    arrived_ns: int | None
    handoff_ns: int | None
    queued_ns: int | None
    scheduled_ns: int | None
    first_token_ns: int | None
    finished_ns: int | None
    departed_ns: int | None
    queued_step: int | None
    scheduled_step: int | None
    first_token_step: int | None
    finished_step: int | None

    def _us(self, a, b) -> float | None:
        if a is None or b is None or b < a:
            return None
        return (b - a) / 1e3

    @property
    def api_us(self) -> float | None:
        """HANDOFF_TO_CORE − ARRIVED (µs)."""
        return self._us(self.arrived_ns, self.handoff_ns)

    @property
    def queueing_us(self) -> float | None:
        """QUEUED − ARRIVED (µs): BLIS's queueing delay."""
        return self._us(self.arrived_ns, self.queued_ns)

    @property
    def wait_us(self) -> float | None:
        """First SCHEDULED − QUEUED (µs): time in the waiting queue."""
        return self._us(self.queued_ns, self.scheduled_ns)

    @property
    def prefill_us(self) -> float | None:
        """FIRST_TOKEN − first SCHEDULED (µs)."""
        return self._us(self.scheduled_ns, self.first_token_ns)

    @property
    def ttft_us(self) -> float | None:
        """FIRST_TOKEN − ARRIVED (µs)."""
        return self._us(self.arrived_ns, self.first_token_ns)

    @property
    def decode_us(self) -> float | None:
        """FINISHED − FIRST_TOKEN (µs)."""
        return self._us(self.first_token_ns, self.finished_ns)

    @property
    def tpot_us(self) -> float | None:
        """(FINISHED − FIRST_TOKEN) / (output − 1) (µs per output token after the first)."""
        d = self.decode_us
        if d is None or not self.output_tokens or self.output_tokens < 2:
            return None
        return d / (self.output_tokens - 1)

    @property
    def e2e_us(self) -> float | None:
        """DEPARTED − ARRIVED (µs)."""
        return self._us(self.arrived_ns, self.departed_ns)


@dataclass(frozen=True)
class TraceSummary:
    """Counts over the files read (see the module docstring for each rule)."""

    files: int = 0
    lines: int = 0
    events: int = 0
    steps: int = 0
    steps_snapshot: int = 0
    steps_journey: int = 0
    steps_aggregate: int = 0
    steps_usable: int = 0
    warmup_steps: int = 0
    preemption_heavy_steps: int = 0
    sampled_out_steps: int = 0
    duplicate_steps: int = 0
    clock_backwards_steps: int = 0
    missing_steps: int = 0
    truncated_lines: int = 0
    unknown_scope_spans: int = 0
    unknown_events: int = 0
    requests: int = 0
    clock_backwards_requests: int = 0

    def __add__(self, other: "TraceSummary") -> "TraceSummary":
        return TraceSummary(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    def text(self) -> str:
        """One ``name: count`` per line."""
        return "\n".join(f"{f.name}: {getattr(self, f.name)}" for f in fields(self))


@dataclass(frozen=True)
class TraceData:
    """What :func:`read_traces` returns: steps (by file, then step id), requests, counts."""

    steps: tuple[TraceStep, ...]
    requests: tuple[TraceRequest, ...]
    summary: TraceSummary


# ------------------------------------------------------------------------------------ reading
#
# The OTLP JSON structures are decoded by msgspec against the typed schema below (the subset of
# opentelemetry-proto's ``trace.proto``/``common.proto`` JSON mapping roofcal reads): fields
# outside it are skipped by the decoder without building Python objects, and ``intValue`` (an
# int64, written as a JSON string) arrives as an int. Lax mode (``strict=False``) is what lets
# msgspec turn those strings into numbers.


class OtlpAnyValue(msgspec.Struct, gc=False):
    """OTLP ``AnyValue``: one field is set (array, kvlist and bytes values stay raw JSON data)."""

    stringValue: str | None = None
    intValue: int | None = None
    doubleValue: float | None = None
    boolValue: bool | None = None
    arrayValue: Any = None
    kvlistValue: Any = None
    bytesValue: Any = None


class OtlpKeyValue(msgspec.Struct, gc=False):
    """OTLP ``KeyValue``: one attribute."""

    key: str
    value: OtlpAnyValue | None = None


class OtlpEvent(msgspec.Struct, gc=False):
    """OTLP ``Span.Event`` (``timeUnixNano``: wall clock ns, a JSON string)."""

    name: str = ""
    timeUnixNano: int = 0
    attributes: list[OtlpKeyValue] | None = None


class OtlpSpan(msgspec.Struct, gc=False):
    """OTLP ``Span``: its trace id, attributes and events (the rest is skipped)."""

    traceId: str = ""
    attributes: list[OtlpKeyValue] | None = None
    events: list[OtlpEvent] | None = None


class OtlpScope(msgspec.Struct, gc=False):
    """OTLP ``InstrumentationScope``."""

    name: str = ""


class OtlpScopeSpans(msgspec.Struct, gc=False):
    """OTLP ``ScopeSpans``."""

    scope: OtlpScope | None = None
    spans: list[OtlpSpan] | None = None


class OtlpResourceSpans(msgspec.Struct, gc=False):
    """OTLP ``ResourceSpans`` (the resource itself is not read)."""

    scopeSpans: list[OtlpScopeSpans] | None = None


class OtlpExport(msgspec.Struct, gc=False):
    """One line of the file exporter: an OTLP ``ExportTraceServiceRequest``."""

    resourceSpans: list[OtlpResourceSpans] | None = None


_DECODER = msgspec.json.Decoder(OtlpExport, strict=False)


class _BadJSON(Exception):
    """A line that is not JSON (private: the caller decides between a warning and an error)."""


def _decode(line: bytes, where: str) -> OtlpExport:
    """One line → :class:`OtlpExport`; raises :class:`_BadJSON` for bad JSON and a one-line
    :class:`RoofcalError` for JSON that is not an OTLP export object."""
    try:
        return _DECODER.decode(line)
    except msgspec.ValidationError as err:
        raise RoofcalError(f"{where}: expected an OTLP JSON object ({err})") from None
    except msgspec.DecodeError:
        raise _BadJSON from None


def _value(v: OtlpAnyValue | None) -> Any:
    """The Python value of one OTLP ``AnyValue`` (int, float, str, bool or raw array/kvlist/bytes
    data), None if absent."""
    if v is None:
        return None
    x = v.intValue
    if x is not None:
        return x
    x = v.doubleValue
    if x is not None:
        return x
    x = v.stringValue
    if x is not None:
        return x
    for x in (v.boolValue, v.arrayValue, v.kvlistValue, v.bytesValue):
        if x is not None:
            return x
    return None


def _attrs(items: list[OtlpKeyValue] | None) -> dict:
    """OTLP ``[{key, value}]`` → ``{key: OtlpAnyValue}`` (decoded later by :func:`_value`)."""
    return {a.key: a.value for a in items} if items else {}


def _pick(raw: Mapping, name: str):
    """The decoded attribute roofcal calls ``name`` (first :data:`ATTRIBUTES` key present) or None."""
    keys = ATTRIBUTES[name]
    v = raw.get(keys[0])
    if v is None:
        for k in keys[1:]:
            v = raw.get(k)
            if v is not None:
                break
        else:
            return None
    return _value(v)


class _Counts:
    """Mutable tallies of one reading pass (private; frozen into :class:`TraceSummary`)."""

    def __init__(self):
        self.lines = self.events = self.truncated = self.unknown_scope = self.unknown_events = 0


PROGRESS_BYTES = 1 << 20         #: progress callbacks come about this many bytes apart


def _open(path: Path):
    """(raw file, line iterator) — gzip detected by its magic bytes."""
    try:
        raw = open(path, "rb")
    except FileNotFoundError:
        raise RoofcalError(f"{path}: no such trace file") from None
    except OSError as err:
        raise RoofcalError(f"{path}: cannot read trace file: {err.strerror or err}") from None
    if raw.read(2) == b"\x1f\x8b":
        raw.seek(0)
        return raw, gzip.GzipFile(fileobj=raw, mode="rb")
    raw.seek(0)
    return raw, raw


def _lines(path: Path, counts: _Counts, progress: Callable[[int], None] | None):
    """Yield (line number, :class:`OtlpExport`) of the non-blank lines; a bad last line is
    counted, any other one an error. ``progress`` gets the (compressed) bytes read, every
    :data:`PROGRESS_BYTES` or so and at the end."""
    raw, stream = _open(path)
    pending: str | None = None          # error of the previous line, raised if another follows
    pos = 0
    try:
        n = 0
        while True:
            try:
                line = stream.readline()
            except (EOFError, OSError, zlib.error):
                counts.truncated += 1               # truncated/corrupt gzip tail
                pending = None
                break
            if not line:
                break
            n += 1
            if progress is not None and raw.tell() - pos >= PROGRESS_BYTES:
                now = raw.tell()
                progress(now - pos)
                pos = now
            if not line.strip():
                continue
            if pending is not None:
                raise RoofcalError(pending)
            counts.lines += 1
            try:
                export = _decode(line, f"{path}:{n}")
            except _BadJSON:
                pending = f"{path}:{n}: bad JSON (not an OTLP JSON line)"
                continue
            yield n, export
        if pending is not None:
            counts.truncated += 1
        if progress is not None:
            progress(raw.tell() - pos)
    finally:
        stream.close()
        raw.close()


def _known_scope_spans(export: OtlpExport, counts: _Counts):
    """Yield (scope name, role, span) for the spans with events of :data:`SCOPES`; spans of other
    scopes are counted in ``counts.unknown_scope``."""
    for rs in export.resourceSpans or ():
        for ss in rs.scopeSpans or ():
            scope = ss.scope.name if ss.scope is not None else ""
            spans = ss.spans or ()
            role = SCOPES.get(scope)
            if role is None:
                counts.unknown_scope += len(spans)
                continue
            for span in spans:
                if span.events:
                    yield scope, role, span


def iter_events(path: str | os.PathLike, counts: _Counts | None = None,
                progress: Callable[[int], None] | None = None) -> Iterator[TraceEvent]:
    """Stream the span events of an OTLP JSON lines file (plain or gzip), line by line.

    Spans of scopes outside :data:`SCOPES` are counted in ``counts`` and skipped. ``progress`` is
    called with the number of (compressed) bytes consumed, every :data:`PROGRESS_BYTES` or so."""
    path = Path(path)
    counts = counts if counts is not None else _Counts()
    for n, export in _lines(path, counts, progress):
        where = f"{path}:{n}"
        for scope, role, span in _known_scope_spans(export, counts):
            rid = None if role == "step" else _pick(_attrs(span.attributes), "request_id")
            for ev in span.events:
                counts.events += 1
                yield TraceEvent(scope, ev.name, ev.timeUnixNano, _attrs(ev.attributes),
                                 span.traceId, rid, where)


# ------------------------------------------------------------------------------ fast line parser
#
# :func:`read_trace` does not go through :class:`TraceEvent`: each decoded line is added straight
# to a :class:`_FileEvents` (step summaries, snapshots, journeys), decoding only the attributes
# roofcal uses.

_API_KINDS = frozenset(("ARRIVED", "HANDOFF_TO_CORE", "DEPARTED", "ABORTED"))
_SUMMARY_KEYS = REQUIRED["BATCH_SUMMARY"] + ("prefill_tokens", "decode_tokens", "num_finished",
                                             "kv_usage", "kv_blocks_total", "kv_blocks_free")
_SNAPSHOT_REQUIRED = REQUIRED["REQUEST_SNAPSHOT"]
_SUMMARY_REQUIRED = REQUIRED["BATCH_SUMMARY"]


def _need(raw: Mapping, name: str, ev_name: str, where: str):
    """:func:`_pick`, a missing attribute being the one-line error of :meth:`TraceEvent.need`."""
    v = _pick(raw, name)
    if v is None:
        raise RoofcalError(f"{where}: event '{ev_name}' has no attribute '{ATTRIBUTES[name][0]}'")
    return v


def _monotonic_ns(raw: Mapping, ev_name: str, where: str) -> int:
    """:meth:`TraceEvent.monotonic_ns` on an attribute dict."""
    ns = _pick(raw, "ts_ns")
    if ns is not None:
        return int(ns)
    return round(float(_need(raw, "ts_s", ev_name, where)) * 1e9)


def _single_keys(names) -> list | None:
    """The attribute keys of roofcal's ``names`` if none has an alias (then ``_pick`` is one
    ``dict.get``), else None."""
    keys = [ATTRIBUTES[n] for n in names]
    return None if any(len(k) != 1 for k in keys) else [k[0] for k in keys]


_SNAPSHOT_KEYS = _single_keys(_SNAPSHOT_REQUIRED)
_SUMMARY_ATTR_KEYS = _single_keys(_SUMMARY_KEYS)


def _picked(raw: dict, names: tuple, keys: list | None) -> list:
    """The decoded values of roofcal's attribute ``names`` (None where absent); ``keys`` from
    :func:`_single_keys` makes each a single look-up."""
    if keys is None:
        return [_pick(raw, k) for k in names]
    get = raw.get
    return [_value(get(k)) for k in keys]


class _FileEvents:
    """What the events of one file add up to (private): counts, step summaries by step id,
    snapshots by step id (``(prompt, computed, scheduled)`` triples packed flat in an
    ``array('q')``) and journeys by journey key."""

    def __init__(self):
        self.counts = _Counts()
        self.summaries: dict[int, dict] = {}
        self.snapshots: dict[int, list] = {}
        self.journeys: dict[str, _Journey] = {}
        self.duplicates = 0

    def add_line(self, export: OtlpExport, where: str) -> None:
        """Add the events of one decoded line; missing attributes raise the one-line errors of
        :meth:`TraceEvent.need`, in event order."""
        counts = self.counts
        for scope, role, span in _known_scope_spans(export, counts):
            events = span.events
            counts.events += len(events)
            rid = None if role == "step" else _pick(_attrs(span.attributes), "request_id")
            key = span.traceId or rid or where
            for ev in events:
                name = ev.name
                kind = EVENTS.get(name)
                if kind is None:
                    counts.unknown_events += 1
                    continue
                raw = _attrs(ev.attributes)
                if kind == "REQUEST_SNAPSHOT":
                    self._add_snapshot(raw, name, where)
                elif kind == "BATCH_SUMMARY":
                    self._add_summary(raw, name, where)
                elif scope == "vllm.api" or kind in _API_KINDS:
                    self._add_api(raw, kind, name, key, rid, where)
                else:
                    self._add_core(raw, kind, name, key, rid, where)

    def _add_snapshot(self, raw: dict, name: str, where: str) -> None:
        """A ``step.REQUEST_SNAPSHOT``: ``(prompt, computed, scheduled)`` under its step id."""
        vals = _picked(raw, _SNAPSHOT_REQUIRED, _SNAPSHOT_KEYS)
        if None in vals:
            for k in _SNAPSHOT_REQUIRED:
                _need(raw, k, name, where)
        step_id, prompt, computed, scheduled = vals
        snaps = self.snapshots.get(int(step_id))
        if snaps is None:                  # packed int64 triples: ~24 bytes per request, not ~150
            snaps = self.snapshots[int(step_id)] = array("q")
        snaps.extend((int(prompt), int(computed), int(scheduled)))

    def _add_summary(self, raw: dict, name: str, where: str) -> None:
        """A ``step.BATCH_SUMMARY``: ``{_SUMMARY_KEYS: value}`` under its step id (the first of a
        duplicated id is kept, the others counted)."""
        vals = _picked(raw, _SUMMARY_KEYS, _SUMMARY_ATTR_KEYS)
        for k, v in zip(_SUMMARY_REQUIRED, vals):
            if v is None:
                _need(raw, k, name, where)
        vals[0] = int(vals[0])
        if vals[0] in self.summaries:
            self.duplicates += 1
        else:
            self.summaries[vals[0]] = dict(zip(_SUMMARY_KEYS, vals))

    def _journey(self, key: str, where: str) -> _Journey:
        """The journey of ``key`` (created, located at ``where``, on its first event)."""
        j = self.journeys.get(key)
        if j is None:
            j = self.journeys[key] = _Journey()
            j.where = where
        return j

    def _add_api(self, raw: dict, kind: str, name: str, key: str, rid, where: str) -> None:
        """An API event: its monotonic time (the first of each kind is kept)."""
        ts = _monotonic_ns(raw, name, where)
        j = self._journey(key, where)
        j.api.setdefault(kind, ts)
        j.request_id = j.request_id or rid

    def _add_core(self, raw: dict, kind: str, name: str, key: str, rid, where: str) -> None:
        """A journey (core) event: the core tuple of :class:`_Journey`; the core span's request
        id wins over the API span's."""
        for k in REQUIRED[kind]:
            _need(raw, k, name, where)
        extra = {"num_preemptions": _pick(raw, "num_preemptions"),
                 "finish_status": _pick(raw, "finish_status"),
                 "schedule_kind": _pick(raw, "schedule_kind")}
        core = (int(_need(raw, "scheduler_step", name, where)), _monotonic_ns(raw, name, where),
                kind, _pick(raw, "prefill_done"), _pick(raw, "prefill_total"),
                _pick(raw, "decode_done"), extra)
        j = self._journey(key, where)
        if rid:
            j.request_id = rid
        j.core.append(core)


# ------------------------------------------------------------------------------- one file


class _Journey:
    """Accumulates one request's events (private)."""

    __slots__ = ("request_id", "core", "api", "where")

    def __init__(self):
        self.request_id = None
        self.core: list = []      # (step, ts_ns, kind, prefill_done, prefill_total, decode_done, event)
        self.api: dict = {}
        self.where = ""


@dataclass
class _Segment:
    """One scheduled run of a request (private): steps start..end (end None: open)."""

    start: int
    end: float
    prefill_end: int | None
    target: int                  # tokens in KV once its prefill ends
    done: int | None             # tokens in KV before step ``done_at``
    done_at: int


def _snapshot_composition(snaps) -> tuple[list, list]:
    """(prefill chunks, decode contexts) of a step's snapshots: ``(prompt, computed, scheduled)``
    packed flat, three ints per request."""
    prefill, decode = [], []
    for prompt, computed, scheduled in zip(snaps[0::3], snaps[1::3], snaps[2::3]):
        if scheduled <= 0:
            continue
        before = computed if SNAPSHOT_COMPUTED_IS_BEFORE_STEP else computed - scheduled
        if scheduled == 1 and before >= prompt:
            decode.append(before)
        else:
            prefill.append((scheduled, before))
    return prefill, decode


def _agrees(s: dict, prefill, decode) -> bool:
    tokens = sum(c[0] for c in prefill) + len(decode)
    return (tokens == s["scheduled_tokens"]
            and len(prefill) + len(decode) == s["num_prefill_reqs"] + s["num_decode_reqs"])


def _segments(j: _Journey) -> list[_Segment]:
    """The scheduled runs of one journey (see the module docstring)."""
    evs = sorted(j.core, key=lambda e: (e[0], e[1]))
    segs = []
    first_token = next((e[0] for e in evs if e[2] == "FIRST_TOKEN"), None)
    for i, e in enumerate(evs):
        if e[2] != "SCHEDULED":
            continue
        s, c, total, n = e[0], int(e[3]), int(e[4]), int(e[5])
        end, f = math.inf, None
        for later in evs[i + 1:]:
            if later[2] == "FINISHED":
                end = later[0]
                break
            if later[2] == "PREEMPTED":
                end = later[0] - 1
                break
            if later[2] == "SCHEDULED":
                end = later[0] - 1
                break
        if n == 0 and first_token is not None and first_token >= s:
            f = first_token
        elif n > 0:
            f = s                                    # resumed: recompute in one step (assumed)
        segs.append(_Segment(s, end, f, total + n, min(c, total + n), s))
    return segs


def _rebuild(step_id: int, active: list[_Segment], s: dict):
    """Journey composition of one step, or None; updates the segments' progress."""
    prefill, decode, unknown = [], [], []
    ok = True
    for seg in active:
        f = seg.prefill_end
        if f is not None and step_id > f:
            decode.append(seg.target + (step_id - f - 1))
            continue
        known = seg.done is not None and seg.done_at == step_id
        if not known:
            seg.done = None
            ok = False
            continue
        if f is not None and step_id == f:
            new = seg.target - seg.done
            if new > 0:
                prefill.append((new, seg.done))
            seg.done, seg.done_at = seg.target, step_id + 1
        else:
            unknown.append(seg)
    if len(unknown) == 1 and ok:
        seg = unknown[0]
        new = s["scheduled_tokens"] - sum(c[0] for c in prefill) - len(decode)
        if new >= 1:
            prefill.append((new, seg.done))
            seg.done, seg.done_at = seg.done + new, step_id + 1
        else:
            seg.done, ok = None, False
    elif unknown:
        for seg in unknown:
            seg.done = None
        ok = False
    return (prefill, decode) if ok else None


def _build_requests(source: str, journeys: dict) -> tuple[list[TraceRequest], int]:
    out, backwards = [], 0
    for j in journeys.values():
        core = sorted(j.core, key=lambda e: (e[0], e[1]))
        first = lambda kind: next((e for e in core if e[2] == kind), None)  # noqa: E731
        q, sch, ft, fin = first("QUEUED"), first("SCHEDULED"), first("FIRST_TOKEN"), first("FINISHED")
        prompt = next((int(e[4]) for e in core if e[4] is not None), None)
        output = None
        if fin is not None and fin[5] is not None:
            output = int(fin[5])
        preempt_events = sum(1 for e in core if e[2] == "PREEMPTED")
        preempt_attr = max((int(e[6].get("num_preemptions") or 0) for e in core), default=0)
        status = fin[6].get("finish_status") if fin is not None else None
        if status is None and "ABORTED" in j.api:
            status = "aborted"
        times = [j.api.get("ARRIVED"), j.api.get("HANDOFF_TO_CORE"), q and q[1], sch and sch[1],
                 ft and ft[1], fin and fin[1], j.api.get("DEPARTED")]
        seq = [t for t in times if t is not None]
        if any(b < a for a, b in zip(seq, seq[1:])):
            backwards += 1
        out.append(TraceRequest(
            source, str(j.request_id or ""), prompt, output, max(preempt_events, preempt_attr),
            status, *times[:6], times[6], q and q[0], sch and sch[0], ft and ft[0],
            fin and fin[0]))
    out.sort(key=lambda r: (r.arrived_ns if r.arrived_ns is not None else
                            (r.queued_ns if r.queued_ns is not None else 0), r.request_id))
    return out, backwards


def read_trace(path: str | os.PathLike, warmup_steps: int = WARMUP_STEPS,
               max_preempted: int = MAX_PREEMPTED,
               progress: Callable[[int], None] | None = None) -> TraceData:
    """Read one OTLP JSON lines trace file (one vLLM run) into steps, requests and counts.

    ``progress`` is called with the number of (compressed) bytes read, every
    :data:`PROGRESS_BYTES` or so."""
    path = Path(path)
    source = str(path)
    acc = _FileEvents()
    for n, export in _lines(path, acc.counts, progress):
        acc.add_line(export, f"{path}:{n}")
    counts, summaries, journeys = acc.counts, acc.summaries, acc.journeys
    if counts.lines == 0:
        raise RoofcalError(f"{path}: empty file (expected OTLP JSON lines of a vLLM trace)")
    if not summaries and not journeys:
        raise RoofcalError(f"{path}: no vLLM step or request spans in {counts.lines} line(s) "
                           f"(scopes {', '.join(SCOPES)}); not a vLLM trace")
    duplicates = acc.duplicates
    steps, stats = _build_steps(source, summaries, acc.snapshots, journeys, warmup_steps,
                                max_preempted)
    requests, backwards = _build_requests(source, journeys)
    referenced = {e[0] for j in journeys.values() for e in j.core}
    missing = len(referenced - set(summaries))
    summary = TraceSummary(
        files=1, lines=counts.lines, events=counts.events, steps=len(steps),
        steps_snapshot=sum(s.composition == "snapshot" for s in steps),
        steps_journey=sum(s.composition == "journey" for s in steps),
        steps_aggregate=sum(s.composition == "aggregate" for s in steps),
        steps_usable=sum(s.usable for s in steps),
        warmup_steps=sum(s.warmup for s in steps),
        preemption_heavy_steps=sum(s.preemption_heavy for s in steps),
        sampled_out_steps=stats["sampled_out"], duplicate_steps=duplicates,
        clock_backwards_steps=stats["backwards"], missing_steps=missing,
        truncated_lines=counts.truncated, unknown_scope_spans=counts.unknown_scope,
        unknown_events=counts.unknown_events, requests=len(requests),
        clock_backwards_requests=backwards)
    return TraceData(tuple(steps), tuple(requests), summary)


def _build_steps(source, summaries, snapshots, journeys, warmup_steps, max_preempted):
    ids = sorted(summaries)
    sampled_out = sum(b - a - 1 for a, b in zip(ids, ids[1:]))
    # clocks: drop steps ending before they start or starting before the previous kept step
    kept, backwards, last_start = [], 0, None
    for i in ids:
        s = summaries[i]
        if s["end_ns"] < s["start_ns"] or (last_start is not None and s["start_ns"] < last_start):
            backwards += 1
            continue
        kept.append(i)
        last_start = s["start_ns"]
    kept_set = set(kept)
    segs = sorted((seg for j in journeys.values() for seg in _segments(j)), key=lambda g: g.start)
    first_id = ids[0] if ids else 0
    steps, active, nxt = [], [], 0
    for i in ids:                    # all emitted ids, so segment progress follows every step
        while nxt < len(segs) and segs[nxt].start <= i:
            active.append(segs[nxt])
            nxt += 1
        active = [g for g in active if g.end >= i]
        s = summaries[i]
        journey = _rebuild(i, active, s) if active or s["scheduled_tokens"] == 0 else None
        if i not in kept_set:
            continue
        comp, prefill, decode = "aggregate", [], []
        if i in snapshots:
            p, d = _snapshot_composition(snapshots[i])
            if _agrees(s, p, d):
                comp, prefill, decode = "snapshot", p, d
        if comp == "aggregate" and journey is not None and _agrees(s, *journey):
            comp, (prefill, decode) = "journey", journey
        nxt_s = summaries.get(i + 1) if (i + 1) in kept_set else None
        cycle = (nxt_s["start_ns"] - s["start_ns"]) / 1e3 if nxt_s else None
        steps.append(TraceStep(
            source, i, comp, tuple(tuple(c) for c in prefill), tuple(decode),
            float(s["duration_us"]), cycle, int(s["start_ns"]), int(s["end_ns"]),
            int(s["running_depth"]), int(s["waiting_depth"]), int(s["num_prefill_reqs"]),
            int(s["num_decode_reqs"]), int(s["scheduled_tokens"]), s["prefill_tokens"],
            s["decode_tokens"], s["num_finished"], int(s["num_preempted"]), s["kv_usage"],
            s["kv_blocks_total"], s["kv_blocks_free"], warmup=i < first_id + warmup_steps,
            preemption_heavy=int(s["num_preempted"]) >= max_preempted))
    return steps, {"sampled_out": sampled_out, "backwards": backwards}


def read_traces(paths: Iterable[str | os.PathLike], warmup_steps: int = WARMUP_STEPS,
                max_preempted: int = MAX_PREEMPTED,
                progress: Callable[[int], None] | None = None) -> TraceData:
    """Read several trace files (each its own run) and concatenate their steps and requests."""
    steps, requests, summary = [], [], TraceSummary()
    for p in paths:
        d = read_trace(p, warmup_steps, max_preempted, progress)
        steps.extend(d.steps)
        requests.extend(d.requests)
        summary = summary + d.summary
    return TraceData(tuple(steps), tuple(requests), summary)


# ------------------------------------------------------------------------------------ writers

#: context CSV columns (one row per step, in steps JSONL order; ``jsonl_line`` empty if left out)
CONTEXT_COLUMNS = ("source", "step_id", "jsonl_line", "composition", "warmup", "preemption_heavy",
                   "duration_us", "cycle_us", "start_ns", "end_ns", "running_depth",
                   "waiting_depth", "num_prefill_reqs", "num_decode_reqs", "scheduled_tokens",
                   "prefill_tokens", "decode_tokens", "num_finished", "num_preempted", "kv_usage",
                   "kv_blocks_total", "kv_blocks_free")

REQUEST_COLUMNS = ("source", "request_id", "prompt_tokens", "output_tokens", "num_preemptions",
                   "finish_status", "queueing_us", "wait_us", "api_us", "prefill_us", "ttft_us",
                   "decode_us", "tpot_us", "e2e_us", "arrived_ns", "handoff_ns", "queued_ns",
                   "scheduled_ns", "first_token_ns", "finished_ns", "departed_ns", "queued_step",
                   "scheduled_step", "first_token_step", "finished_step")


def steps_jsonl_text(data: TraceData) -> str:
    """The steps JSONL text of the usable steps (:attr:`TraceStep.usable`), in order."""
    return "".join(json.dumps(s.step_json(), separators=(", ", ": ")) + "\n"
                   for s in data.steps if s.usable)


def write_steps_jsonl(data: TraceData, path: str | os.PathLike) -> int:
    """Write the usable steps as roofcal step JSONL (atomic); returns the number written."""
    from roofcal.io import write_text_atomic
    text = steps_jsonl_text(data)
    write_text_atomic(path, text)
    return text.count("\n")


def step_context_frame(data: TraceData):
    """A DataFrame of :data:`CONTEXT_COLUMNS`, one row per step."""
    import pandas as pd
    rows, line = [], 0
    for s in data.steps:
        row = {c: getattr(s, c) for c in CONTEXT_COLUMNS if c != "jsonl_line"}
        if s.usable:
            line += 1
        row["jsonl_line"] = line if s.usable else None
        rows.append(row)
    df = pd.DataFrame(rows, columns=list(CONTEXT_COLUMNS))
    df["jsonl_line"] = df["jsonl_line"].astype("Int64")
    return df


def write_step_context_csv(data: TraceData, path: str | os.PathLike) -> None:
    """Write the per-step context CSV atomically."""
    from roofcal.io import write_csv_atomic
    write_csv_atomic(step_context_frame(data), path)


def requests_frame(data: TraceData):
    """A DataFrame of :data:`REQUEST_COLUMNS`, one row per request."""
    import pandas as pd
    df = pd.DataFrame([{c: getattr(r, c) for c in REQUEST_COLUMNS} for r in data.requests],
                      columns=list(REQUEST_COLUMNS))
    for c in REQUEST_COLUMNS:
        if c.endswith(("_ns", "_step", "_tokens")) or c == "num_preemptions":
            df[c] = df[c].astype("Int64")
    return df


def write_requests_csv(data: TraceData, path: str | os.PathLike) -> None:
    """Write the per-request CSV atomically."""
    from roofcal.io import write_csv_atomic
    write_csv_atomic(requests_frame(data), path)


def write_outputs(data: TraceData, steps_path, context_path, requests_path=None) -> int:
    """Write the steps JSONL, the context CSV and (when given) the requests CSV — all of them or
    none (:func:`roofcal.io.write_files_atomic`); returns the number of steps in the JSONL."""
    from roofcal.io import csv_text, write_files_atomic
    text = steps_jsonl_text(data)
    files = {steps_path: text, context_path: csv_text(step_context_frame(data))}
    if requests_path is not None:
        files[requests_path] = csv_text(requests_frame(data))
    write_files_atomic(files)
    return text.count("\n")

"""Recorded serving runs: a TraceV2 (what ``blis observe`` records) and a server description.

A recorded run is a folder (or any place the description points to)::

    server.yaml     the server: what roofcal cannot read from the trace
    trace.yaml      TraceV2 header (YAML)
    trace.csv       TraceV2 data: one request per line

``server.yaml`` (every field required unless marked optional)::

    model: meta-llama/Llama-2-7b-hf   # HF id as BLIS's --model takes it (its config.json is found
                                      # in the model-config folders), or a bundled name / config path
    tensor_parallelism: 1
    gpu: h100_sxm                     # roofcal datasheet name or alias (roofcal gpu list)
    max_num_seqs: 128
    max_num_batched_tokens: 2048      # vLLM's chunked-prefill token budget per step
    kv_blocks: 7463                   # GPU KV blocks, as vLLM logged them
    max_model_len: 4096               # optional
    trace_header: trace.yaml          # optional (default trace.yaml), relative to this file
    trace_data: trace.csv             # optional (default trace.csv)
    name: my-run                      # optional (default: the folder's name)

The TraceV2 format is BLIS's (inference-sim ``sim/workload/tracev2.go``): a header of
``trace_version`` (2 or 3), ``time_unit: microseconds``, ``mode`` (real, generated, replayed),
``warm_up_requests`` and optional provenance blocks; a CSV whose columns are, in this order,
:data:`COLUMNS`, with BLIS's optional ``vllm_priority`` (after ``slo_class``), ``slo_target_us``
(after ``deadline_us``) and trailing ``x_request_id``, ``adapter``, ``think_time_us``. roofcal reads:

* the request: ``request_id`` (unique, in any order: ``blis observe`` writes rows as requests
  complete; roofcal orders them by send time, ties by id), ``send_time_us`` (``arrival_time_us`` when it
  is 0), ``prefix_group`` / ``prefix_length`` / ``input_tokens`` (suffix only when in a group;
  ``server_input_tokens`` replaces it outside a group, as BLIS's replay does),
  ``output_tokens`` (generated), ``deadline_us``;
* what the client saw: ``status`` (``ok`` counts as a success), ``first_chunk_time_us``,
  ``last_chunk_time_us``. Ground truth per request: TTFT = first chunk − send, E2E = last chunk −
  send; ITL = (E2E − TTFT) / (output tokens − 1); means over the successful requests after the
  header's ``warm_up_requests``.

Times may be absolute (``blis observe`` writes the wall clock in µs); the run is replayed from
its first send. Anything else is refused with one line naming the file, line and column: unknown
or misplaced columns, a missing, non-integer or negative value, a repeated request id, a success without a first and last chunk in order, a run without a success, a header key
BLIS would not know, and a KV-offload block (roofcal replays without a CPU KV tier).
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from roofcal.errors import RoofcalError, where
from roofcal.io import read_yaml
from roofcal.measurements.requests import Requests, itl_us

SERVER_FILE = "server.yaml"

#: BLIS's TraceV2 data columns, in order (the base layout, inference-sim @ f90a1e3a)
COLUMNS = ("request_id", "client_id", "tenant_id", "slo_class", "session_id", "round_index",
           "prefix_group", "prefix_length", "streaming", "input_tokens", "output_tokens",
           "text_tokens", "image_tokens", "audio_tokens", "video_tokens", "reason_ratio",
           "model", "deadline_us", "server_input_tokens",
           "arrival_time_us", "send_time_us", "first_chunk_time_us", "last_chunk_time_us",
           "num_chunks", "status", "error_message", "finish_reason")
#: optional trailing columns, in the order BLIS writes them
TRAILING = ("x_request_id", "adapter", "think_time_us")
#: integer columns (≥ 0) roofcal checks; the rest are text or checked by BLIS alone
INT_COLUMNS = ("request_id", "round_index", "prefix_length", "input_tokens", "output_tokens",
               "text_tokens", "image_tokens", "audio_tokens", "video_tokens", "deadline_us",
               "server_input_tokens", "arrival_time_us", "send_time_us", "first_chunk_time_us",
               "last_chunk_time_us", "num_chunks")
#: header keys BLIS's TraceHeader knows
HEADER_KEYS = ("trace_version", "time_unit", "created_at", "mode", "warm_up_requests", "workload_seed",
               "workload_spec", "session_context_growth", "server", "network", "goodput_slo_targets",
               "kv_offload", "observed_kv_metrics")
SERVER_HEADER_KEYS = ("type", "model", "tensor_parallel", "max_num_seqs", "block_size",
                      "gpu_memory_utilization", "max_model_len")
MODES = ("real", "generated", "replayed")
#: ``server.yaml`` fields: required, then optional
SERVER_REQUIRED = ("model", "tensor_parallelism", "gpu", "max_num_seqs", "max_num_batched_tokens", "kv_blocks")
SERVER_OPTIONAL = ("max_model_len", "trace_header", "trace_data", "name")


@dataclass(frozen=True)
class TraceHeader:
    """The parts of a TraceV2 header roofcal uses (the whole mapping is in ``raw``)."""

    version: int
    mode: str
    warm_up_requests: int
    raw: dict


def columns_layout(header_row: list[str]) -> tuple[str, ...]:
    """The column order BLIS's positional parser expects given which optional columns
    ``header_row`` has."""
    has = set(header_row)
    out = []
    for c in COLUMNS:
        out.append(c)
        if c == "slo_class" and "vllm_priority" in has:
            out.append("vllm_priority")
        if c == "deadline_us" and "slo_target_us" in has:
            out.append("slo_target_us")
    return tuple(out + [c for c in TRAILING if c in has])


def read_header(path: str | Path) -> TraceHeader:
    """A TraceV2 header YAML, strictly (see the module docstring)."""
    path = Path(path)
    h = read_yaml(path, "TraceV2 header")
    if not isinstance(h, Mapping):
        raise RoofcalError(f"{path}: expected a mapping of header fields (TraceV2)")
    for key in h:
        if key not in HEADER_KEYS:
            raise RoofcalError(f"{where(path, str(key))}: unknown TraceV2 header field (known: {', '.join(HEADER_KEYS)})")
    version = h.get("trace_version")
    if version not in (2, 3) or isinstance(version, bool):
        raise RoofcalError(f"{where(path, 'trace_version')}: expected 2 or 3, got {version!r}")
    if h.get("time_unit") != "microseconds":
        raise RoofcalError(f"{where(path, 'time_unit')}: expected 'microseconds', got {h.get('time_unit')!r}")
    mode = h.get("mode")
    if mode not in MODES:
        raise RoofcalError(f"{where(path, 'mode')}: expected one of {', '.join(MODES)}, got {mode!r}")
    warm = h.get("warm_up_requests", 0)
    if isinstance(warm, bool) or not isinstance(warm, int) or warm < 0:
        raise RoofcalError(f"{where(path, 'warm_up_requests')}: expected an integer ≥ 0, got {warm!r}")
    server = h.get("server")
    if server is not None:
        if not isinstance(server, Mapping):
            raise RoofcalError(f"{where(path, 'server')}: expected a mapping")
        for key in server:
            if key not in SERVER_HEADER_KEYS:
                raise RoofcalError(f"{where(path, f'server.{key}')}: unknown TraceV2 header field")
    if h.get("kv_offload") is not None:
        raise RoofcalError(f"{where(path, 'kv_offload')}: a KV-offload tier is recorded; roofcal replays "
                           "without a CPU KV tier")
    return TraceHeader(int(version), str(mode), int(warm), dict(h))


def _cell_int(text: str, path: Path, line: int, col: str) -> int:
    s = text.strip()
    if not s:
        raise RoofcalError(f"{path}: line {line}, column '{col}': missing value")
    try:
        v = int(s)
    except ValueError:
        raise RoofcalError(f"{path}: line {line}, column '{col}': expected an integer, got {s!r}") from None
    if v < 0:
        raise RoofcalError(f"{path}: line {line}, column '{col}': negative value {v}")
    return v


def read_data(path: str | Path) -> Requests:
    """A TraceV2 data CSV as :class:`Requests` (times as written; see the module docstring)."""
    path = Path(path)
    try:
        f = open(path, newline="", encoding="utf-8")
    except FileNotFoundError:
        raise RoofcalError(f"{path}: no such TraceV2 data file") from None
    except OSError as err:
        raise RoofcalError(f"{path}: cannot read TraceV2 data: {err.strerror or err}") from None
    cols: dict[str, list] = {c: [] for c in ("request_id", "send", "group", "prefix", "suffix", "out",
                                              "deadline", "first", "last", "ok", "line")}
    with f:
        reader = csv.reader(f)
        try:
            head = next(reader)
        except StopIteration:
            raise RoofcalError(f"{path}: empty file (expected a TraceV2 CSV header line)") from None
        except (csv.Error, UnicodeDecodeError) as err:
            raise RoofcalError(f"{path}: line 1: not a CSV text file ({err})") from None
        for i, name in enumerate(head):
            if name not in COLUMNS + TRAILING + ("vllm_priority", "slo_target_us"):
                raise RoofcalError(f"{path}: line 1, column {i + 1} '{name}': unknown TraceV2 column")
        if len(set(head)) != len(head):
            dup = next(c for c in head if head.count(c) > 1)
            raise RoofcalError(f"{path}: line 1, column '{dup}': given twice")
        want = columns_layout(head)
        if tuple(head) != want:
            missing = [c for c in want if c not in head]
            if missing:
                raise RoofcalError(f"{path}: line 1, column '{missing[0]}': missing (TraceV2 needs {', '.join(COLUMNS)})")
            k = next(i for i, (a, b) in enumerate(zip(head, want)) if a != b)
            raise RoofcalError(f"{path}: line 1, column {k + 1} '{head[k]}': out of order (BLIS reads "
                               f"columns by position; expected '{want[k]}' there)")
        at = {c: i for i, c in enumerate(head)}
        seen: dict[int, int] = {}               # request id → its line
        try:
            for row in reader:
                line = reader.line_num
                if not row:
                    continue
                if len(row) != len(head):
                    raise RoofcalError(f"{path}: line {line}: {len(row)} fields, expected {len(head)}")
                v = {c: _cell_int(row[at[c]], path, line, c) for c in INT_COLUMNS}
                rid = v["request_id"]
                if rid in seen:
                    raise RoofcalError(f"{path}: line {line}, column 'request_id': {rid} repeats the id "
                                       f"of line {seen[rid]}")
                seen[rid] = line
                send = v["send_time_us"] or v["arrival_time_us"]
                # a deadline is on the arrival clock; keep its distance from the send
                arrival = v["arrival_time_us"] or send
                deadline = send + max(v["deadline_us"] - arrival, 1) if v["deadline_us"] > 0 else 0
                group = row[at["prefix_group"]].strip()
                suffix = v["server_input_tokens"] if (not group and v["server_input_tokens"] > 0) else v["input_tokens"]
                status = row[at["status"]].strip()
                ok = status == "ok"
                if ok:
                    if v["first_chunk_time_us"] <= 0 or v["first_chunk_time_us"] < send:
                        raise RoofcalError(f"{path}: line {line}, column 'first_chunk_time_us': a success's "
                                           f"first chunk ({v['first_chunk_time_us']}) must follow its send ({send})")
                    if v["last_chunk_time_us"] < v["first_chunk_time_us"]:
                        raise RoofcalError(f"{path}: line {line}, column 'last_chunk_time_us': before the "
                                           f"first chunk ({v['last_chunk_time_us']} < {v['first_chunk_time_us']})")
                    if v["output_tokens"] < 1:
                        raise RoofcalError(f"{path}: line {line}, column 'output_tokens': a success generated no token")
                for key, val in (("request_id", rid), ("send", send), ("group", group),
                                 ("prefix", v["prefix_length"] if group else 0), ("suffix", suffix),
                                 ("out", v["output_tokens"]), ("deadline", deadline),
                                 ("first", v["first_chunk_time_us"]), ("last", v["last_chunk_time_us"]),
                                 ("ok", ok), ("line", line)):
                    cols[key].append(val)
        except csv.Error as err:
            raise RoofcalError(f"{path}: line {reader.line_num}: bad CSV ({err})") from None
        except UnicodeDecodeError:
            raise RoofcalError(f"{path}: not a UTF-8 text file") from None
    if not cols["request_id"]:
        raise RoofcalError(f"{path}: no requests (only the header line)")
    # in the order the client sent them (``blis observe`` writes rows as requests complete)
    order = np.lexsort((np.asarray(cols["request_id"]), np.asarray(cols["send"])))
    pick = lambda key, dtype=None: np.asarray(cols[key], dtype)[order]
    return Requests(request_id=pick("request_id"), send_us=pick("send"),
                    prefix_group=pick("group", object), prefix_len=pick("prefix"),
                    suffix_len=pick("suffix"), output_tokens=pick("out"), deadline_us=pick("deadline"),
                    stage=np.zeros(len(order), np.int64), first_chunk_us=pick("first"),
                    last_chunk_us=pick("last"), ok=pick("ok"))


def relative(req: Requests) -> Requests:
    """``req`` with every time counted from its first send (a trace's clock may be the wall
    clock)."""
    t0 = int(req.send_us.min())
    dl = np.where(req.deadline_us > 0, np.maximum(req.deadline_us - t0, 1), 0)
    shift = (lambda a: np.where(a > 0, a - t0, 0)) if req.recorded else None
    return Requests(request_id=req.request_id, send_us=req.send_us - t0, prefix_group=req.prefix_group,
                    prefix_len=req.prefix_len, suffix_len=req.suffix_len, output_tokens=req.output_tokens,
                    deadline_us=dl, stage=req.stage,
                    first_chunk_us=shift(req.first_chunk_us) if shift else None,
                    last_chunk_us=shift(req.last_chunk_us) if shift else None, ok=req.ok)


def measured_of(req: Requests, warm_up: int = 0):
    """Ground truth of a recorded run (:class:`~.workload.Measured`): means over its successful
    requests after the first ``warm_up``; TTFT and E2E from the chunk times, ITL by
    :func:`~.requests.itl_us`; the E2E's 1st percentile by linear interpolation (numpy's rule)."""
    from roofcal.measurements.workload import Measured
    scored = np.arange(len(req)) >= warm_up
    ok = req.ok & scored
    n_ok, n_fail = int(ok.sum()), int((~req.ok & scored).sum())
    if n_ok == 0:
        nan = math.nan
        return Measured(nan, nan, nan, nan, 0, n_fail)
    s = req.take(ok)
    ttft, e2e = s.ttft_us(), s.e2e_us()
    return Measured(e2e_ms=float(e2e.mean()) / 1e3, ttft_ms=float(ttft.mean()) / 1e3,
                    itl_ms=itl_us(e2e, ttft, s.output_tokens) / 1e3,
                    generated=float(s.output_tokens.mean()), n_success=n_ok, n_failures=n_fail,
                    prompt_len=float(s.prompt_tokens.mean()), e2e_max_ms=float(e2e.max()) / 1e3,
                    e2e_p1_ms=float(np.percentile(e2e, 1.0)) / 1e3)


def _server_int(d: Mapping[str, Any], key: str, path: Path) -> int:
    v = d.get(key)
    if v is None:
        raise RoofcalError(f"{where(path, key)}: missing")
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise RoofcalError(f"{where(path, key)}: expected an integer ≥ 1, got {v!r}")
    return v


def read_server_description(path: str | Path):
    """``server.yaml`` → (:class:`~.workload.Server`, trace header path, trace data path, name)."""
    from roofcal.measurements.workload import Server
    from roofcal.physics.hardware import load_gpu
    path = Path(path)
    d = read_yaml(path, "server description (server.yaml)")
    if not isinstance(d, Mapping):
        raise RoofcalError(f"{path}: expected a mapping of fields (see roofcal/measurements/tracev2.py)")
    for key in d:
        if key not in SERVER_REQUIRED + SERVER_OPTIONAL:
            raise RoofcalError(f"{where(path, str(key))}: unknown field (known: {', '.join(SERVER_REQUIRED + SERVER_OPTIONAL)})")
    for key in SERVER_REQUIRED:
        if d.get(key) is None:
            raise RoofcalError(f"{where(path, key)}: missing (a server description needs "
                               f"{', '.join(SERVER_REQUIRED)})")
    model = d["model"]
    if not isinstance(model, str) or not model.strip():
        raise RoofcalError(f"{where(path, 'model')}: expected a model id or name, got {model!r}")
    gpu_name = d["gpu"]
    if not isinstance(gpu_name, str):
        raise RoofcalError(f"{where(path, 'gpu')}: expected a GPU name, got {gpu_name!r}")
    try:
        gpu = load_gpu(gpu_name)
    except RoofcalError as err:
        raise RoofcalError(f"{where(path, 'gpu')}: {err}") from None
    ints = {k: _server_int(d, k, path) for k in ("tensor_parallelism", "max_num_seqs",
                                                   "max_num_batched_tokens", "kv_blocks")}
    mml = _server_int(d, "max_model_len", path) if d.get("max_model_len") is not None else None
    files = []
    for key, default in (("trace_header", "trace.yaml"), ("trace_data", "trace.csv")):
        v = d.get(key, default)
        if not isinstance(v, str) or not v.strip():
            raise RoofcalError(f"{where(path, key)}: expected a file name, got {v!r}")
        files.append(path.parent / v)
    name = d.get("name", path.resolve().parent.name)
    if not isinstance(name, str) or not name.strip() or "/" in name:
        raise RoofcalError(f"{where(path, 'name')}: expected a run name without '/', got {name!r}")
    server = Server(model=model.strip(), tp=ints["tensor_parallelism"],
                    max_num_batched_tokens=ints["max_num_batched_tokens"],
                    max_num_seqs=ints["max_num_seqs"], max_model_len=mml, gpu=gpu.name,
                    kv_blocks=ints["kv_blocks"])
    return server, files[0], files[1], name.strip()


def read_trace_experiment(server_path: str | Path):
    """A recorded run as an :class:`~.workload.Experiment` (kind ``"trace"``): one stage at the
    trace's mean rate, ground truth from its own timestamps, replayed from its first send."""
    from roofcal.measurements.workload import Experiment, Stage
    server_path = Path(server_path)
    server, header_path, data_path, name = read_server_description(server_path)
    header = read_header(header_path)
    req = relative(read_data(data_path))
    if header.warm_up_requests >= len(req):
        raise RoofcalError(f"{where(header_path, 'warm_up_requests')}: {header.warm_up_requests} of "
                           f"{len(req)} requests are warm-up; nothing is left to score")
    truth = measured_of(req, header.warm_up_requests)
    if truth.n_success == 0:
        raise RoofcalError(f"{data_path}: no successful request (status 'ok') to score")
    span = float(req.send_us.max()) / 1e6
    n = len(req)
    rate = (n - 1) / span if span > 0 else float(n)
    stage = Stage(rate=rate, duration=max(span, 1e-6), requests=n)
    return Experiment(name=name, path=server_path.parent, kind="trace", server=server, stages=(stage,),
                      truth={"summary": truth}, recorded=req, warm_up=header.warm_up_requests)

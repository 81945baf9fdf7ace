"""A serving run as a TraceV2 that ``blis replay`` replays the way the client sent it.

In: an :class:`~roofcal.measurements.workload.Experiment` and a seed. Out: the header YAML and
data CSV of BLIS's TraceV2 format (layout: :mod:`roofcal.measurements.tracev2`), written
atomically and all-or-nothing by :func:`write_trace`; the same run and seed give the same bytes.

What the trace holds:

* an **inference-perf run**: the schedule rebuilt from what it actually ran
  (:func:`roofcal.measurements.workload.inference_perf_requests`) — open-loop sends, each stage's
  ⌊rate · duration⌋ requests over its duration, the prompt pool as one prefix group per pool
  prompt (the whole prompt but its last token, so BLIS's prefix cache holds what vLLM's did),
  ``output_tokens`` as generated, the client's timeout as ``deadline_us``; ``client_id`` names
  the stage. No outcome is recorded (``status`` empty, chunk times 0): it is a schedule, not a
  measurement; ``mode: generated``;
* a **recorded run**: its requests as sent, from its first send, with the times the client saw
  (``mode`` kept from the recording).

``arrival_time_us`` = ``send_time_us`` (what ``blis replay`` injects at); ``server_input_tokens``
0 (``input_tokens`` is the suffix after the prefix group, BLIS's convention).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from roofcal.io import write_files_atomic
from roofcal.measurements.tracev2 import COLUMNS
from roofcal.measurements.workload import Experiment


def trace_paths(prefix: str | os.PathLike) -> tuple[Path, Path]:
    """``<prefix>.yaml`` and ``<prefix>.csv`` (BLIS's ``--trace-output`` convention)."""
    prefix = Path(prefix)
    return prefix.with_name(prefix.name + ".yaml"), prefix.with_name(prefix.name + ".csv")


def header_text(exp: Experiment, seed: int) -> str:
    """The TraceV2 header of ``exp``'s trace (YAML written by hand: stable bytes)."""
    s = exp.server
    if exp.kind == "inference-perf":
        mode, spec = "generated", f"roofcal workload trace of inference-perf run {exp.name} (results/config.yaml)"
    else:
        mode, spec = "real", f"roofcal workload trace of recorded run {exp.name}, from its first send"
    lines = ["trace_version: 3", "time_unit: microseconds", f"mode: {mode}",
             f"warm_up_requests: {int(exp.warm_up)}"]
    if exp.kind == "inference-perf":
        lines.append(f"workload_seed: {int(seed)}")
    lines += [f'workload_spec: "{spec}"', "server:", "  type: vllm", f'  model: "{s.model}"',
              f"  tensor_parallel: {int(s.tp)}", f"  max_num_seqs: {int(s.max_num_seqs)}", "  block_size: 16"]
    if s.max_model_len:
        lines.append(f"  max_model_len: {int(s.max_model_len)}")
    return "\n".join(lines) + "\n"


def data_text(exp: Experiment, seed: int) -> str:
    """The TraceV2 data CSV of ``exp``'s trace (columns :data:`~roofcal.measurements.tracev2.COLUMNS`)."""
    r = exp.requests(seed)
    n = len(r)
    if exp.kind == "inference-perf":
        client = np.array([f"stage_{i}" for i in r.stage], dtype=object)
        first = last = np.zeros(n, np.int64)
        status = np.full(n, "", dtype=object)
    else:
        client = np.full(n, "", dtype=object)
        first, last = r.first_chunk_us, r.last_chunk_us
        status = np.where(r.ok, "ok", "error").astype(object)
    zero = np.zeros(n, np.int64)
    values = {
        "request_id": r.request_id, "client_id": client, "round_index": zero,
        "prefix_group": r.prefix_group, "prefix_length": r.prefix_len,
        "streaming": np.full(n, "true", dtype=object), "input_tokens": r.suffix_len,
        "output_tokens": r.output_tokens, "text_tokens": zero, "image_tokens": zero,
        "audio_tokens": zero, "video_tokens": zero, "reason_ratio": zero, "deadline_us": r.deadline_us,
        "server_input_tokens": zero, "arrival_time_us": r.send_us, "send_time_us": r.send_us,
        "first_chunk_time_us": first, "last_chunk_time_us": last, "num_chunks": zero, "status": status,
    }
    empty = np.full(n, "", dtype=object)
    cols = [np.asarray(values.get(c, empty)).astype(str) for c in COLUMNS]
    rows = [",".join(cells) for cells in zip(*cols)]
    return ",".join(COLUMNS) + "\n" + "\n".join(rows) + "\n"


def write_trace(exp: Experiment, prefix: str | os.PathLike, seed: int = 42) -> tuple[Path, Path]:
    """Write ``exp``'s trace to ``<prefix>.yaml`` and ``<prefix>.csv``, both or neither; returns
    the two paths."""
    head, data = trace_paths(prefix)
    write_files_atomic({head: header_text(exp, seed), data: data_text(exp, seed)})
    return head, data

"""Speed and memory of the trace reader (``roofcal traces read``) on a synthetic vLLM trace.

* :func:`generate` writes a deterministic synthetic vLLM trace (OTLP JSON lines, rich step mode
  plus request journeys, the format :mod:`roofcal.measurements.traces` reads) of about a target
  size: the same seed and settings give a byte-identical file.
* :func:`bench` generates one (or takes a given file), times :func:`~roofcal.measurements.traces.
  read_trace` in-process and the whole ``roofcal traces read`` command as a subprocess (start-up,
  progress bar and writing the steps JSONL and the context and requests CSVs included), and takes
  the subprocess's peak resident memory (GNU time's ``%M``, else ``ru_maxrss`` of the child).
* :func:`report`: the same as (title, Markdown) sections for ``roofcal bench --traces-mb MB``.

Run alone::

    python -m roofcal.bench.traces --mb 100 --runs 3
    python -m roofcal.bench.traces --mb 2000 --runs 1     # bounded memory on a 2 GB file
    python -m roofcal.bench.traces --mb 5 --keep trace.json   # just write a trace

**The toy scheduler** (:class:`TraceShape` holds its knobs). One engine, continuous time in
monotonic ns. Requests arrive as a Poisson process (on average ``arrival_rate`` per step, plus a
burst of ``burst_size`` with probability ``burst_prob`` per step), with log-normal prompt and
output lengths; 30 % of first schedules hit the prefix cache (a multiple of 16 tokens). Each step
takes the running requests first (a decode is one token, an unfinished prefill continues its
chunk), then admits waiting requests in order while fewer than ``max_seqs`` run and tokens are
left in the ``budget`` (chunked prefill: the last admitted request gets what is left). Now and then
(``preempt_prob`` per step, at least 8 running) the newest running request is preempted before the
step is scheduled and goes back to the head of the queue; when it is scheduled again it recomputes
its prompt and output so far. A step's forward time is 2 ms + 3 µs per token + noise; the next one
starts 0.1–2 ms after it ends. Idle time (nothing to run) emits no step.

**What is written**, with vLLM's names (as :mod:`roofcal.measurements.traces` documents them):

* scope ``vllm.scheduler.step``: one span per step with a ``step.BATCH_SUMMARY`` event and, on
  ``snapshot_fraction`` of the steps (seeded draw), one ``step.REQUEST_SNAPSHOT`` per scheduled
  request (so the reader rebuilds the other steps from the journeys, or leaves them aggregate);
* scope ``vllm.scheduler``: per finished request, a ``llm_core`` span (``gen_ai.request.id`` with
  vLLM's ``-0`` suffix) with ``journey.QUEUED``, ``journey.SCHEDULED`` (``FIRST`` or
  ``RESUME``), ``journey.FIRST_TOKEN``, ``journey.PREEMPTED`` and ``journey.FINISHED``;
* scope ``vllm.api``: per finished request, a ``llm_request`` span with ``api.ARRIVED``,
  ``api.HANDOFF_TO_CORE`` and ``api.DEPARTED`` (same ``traceId`` as its core span);
* spans are written when they end, ``spans_per_line`` to a line (one collector export); after
  every ``unknown_every``-th line comes a line of another instrumentation scope (HTTP server spans
  of a gateway sharing the collector), which the reader counts and skips.

Requests still running when the target size is reached are never written (their spans have not
ended), as in a trace cut at shutdown.

Measured on the project's 2-core machine (seed 1; load average 0.8–1.4), after the reader packed
each step's snapshots into int64 triples:

==========================  ==========================  ==============================  ========
trace                       ``read_trace`` in-process   ``roofcal traces read``         peak RSS
                            MB/s min / median           end to end, MB/s min / median
==========================  ==========================  ==============================  ========
100.5 MB (5,269 steps)      97 / 99 (1.0 s)             49 / 53 (1.7–1.9 s)             137 MB
2,001 MB (91,184 steps)     81 (24.6 s, 1 run)          71 (28.1 s, 1 run)              535 MB
0.2 MB (start-up only)      —                           0.7–0.8 s                       115 MB
==========================  ==========================  ==============================  ========

End to end, a 100 MB file pays ≈ 0.7 s of start-up (mostly importing pandas for the two CSVs),
so it sits at the 50 MB/s target; from a few hundred MB on the reader's own speed dominates.
Memory does not hold the file (a line at a time), but grows with what is kept until the end of
the file, ≈ 0.2 MB of RSS per MB of trace (before the packing: 0.35, with 815 MB at 2 GB; the
snapshot tuples were 19.5 of the 27 MB of accumulators on 100 MB by tracemalloc, step summaries
3.7, journeys 3.5; the final TraceData 10.5 MB).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from roofcal.tables import table

TARGET_MB_S = 50.0          #: the project's target: ≥ 50 MB/s
BLOCK = 16                  #: KV block size (tokens), for the KV usage in the summaries


@dataclass(frozen=True)
class TraceShape:
    """The toy scheduler's knobs (see the module docstring)."""

    budget: int = 2048                 #: tokens per step (``max_num_batched_tokens``)
    max_seqs: int = 64                 #: running requests at most (``max_num_seqs``)
    arrival_rate: float = 0.3          #: mean arrivals per step (Poisson)
    burst_prob: float = 0.002          #: per step: a burst of ``burst_size`` extra arrivals
    burst_size: int = 24
    prompt_lognormal: tuple[float, float] = (6.3, 0.8)    #: mean ≈ 750 tokens
    prompt_range: tuple[int, int] = (8, 8000)
    output_lognormal: tuple[float, float] = (4.3, 0.9)    #: mean ≈ 110 tokens
    output_range: tuple[int, int] = (2, 1000)
    prefix_hit_prob: float = 0.3
    preempt_prob: float = 0.004        #: per step with at least 8 running requests
    snapshot_fraction: float = 0.9     #: steps with ``step.REQUEST_SNAPSHOT`` events
    spans_per_line: int = 16           #: ended spans per JSON line (one collector export)
    unknown_every: int = 100           #: an unknown-scope line after every n-th line
    kv_blocks_total: int = 16384


@dataclass
class GeneratedTrace:
    """What :func:`generate` wrote."""

    path: str
    bytes: int = 0
    lines: int = 0
    unknown_lines: int = 0
    events: int = 0
    steps: int = 0
    steps_with_snapshots: int = 0
    requests: int = 0                  #: finished (written) requests
    preemptions: int = 0
    seconds: float = 0.0
    extra: dict = field(default_factory=dict)


# ------------------------------------------------------------------------------ OTLP JSON text
#
# Written as text directly (no dicts and json.dumps per event): ~4× faster, and every string
# written is a fixed ASCII name or id, so no escaping is needed.

def _int(k: str, v: int) -> str:
    return f'{{"key":"{k}","value":{{"intValue":"{v}"}}}}'


def _dbl(k: str, v: float) -> str:
    return f'{{"key":"{k}","value":{{"doubleValue":{v!r}}}}}'


def _str(k: str, v: str) -> str:
    return f'{{"key":"{k}","value":{{"stringValue":"{v}"}}}}'


def _bool(k: str, v: bool) -> str:
    return f'{{"key":"{k}","value":{{"boolValue":{"true" if v else "false"}}}}}'


def _event(name: str, wall_ns: int, attrs: list[str]) -> str:
    return f'{{"timeUnixNano":"{wall_ns}","name":"{name}","attributes":[{",".join(attrs)}]}}'


def _span(name: str, trace_id: str, span_id: str, start: int, end: int, attrs: list[str],
          events: list[str]) -> str:
    return (f'{{"traceId":"{trace_id}","spanId":"{span_id}","parentSpanId":"","name":"{name}",'
            f'"kind":1,"startTimeUnixNano":"{start}","endTimeUnixNano":"{end}",'
            f'"attributes":[{",".join(attrs)}],"events":[{",".join(events)}],"status":{{}}}}')


def _line(service: str, scope_spans: list[tuple[str, list[str]]]) -> str:
    scopes = ",".join(f'{{"scope":{{"name":"{s}","version":"0.1"}},"spans":[{",".join(spans)}]}}'
                      for s, spans in scope_spans if spans)
    return (f'{{"resourceSpans":[{{"resource":{{"attributes":[{_str("service.name", service)},'
            f'{_str("host.name", "node-1")}]}},"scopeSpans":[{scopes}]}}]}}\n')


class _Request:
    __slots__ = ("n", "id", "trace", "prompt", "out", "done", "dec", "preempt", "first",
                 "core", "api", "t0", "t_end")

    def __init__(self, n: int, prompt: int, out: int):
        self.n, self.id, self.trace = n, f"cmpl-{n:08x}", f"{n:032x}"
        self.prompt, self.out = prompt, out
        self.done = self.dec = self.preempt = 0
        self.first = True
        self.core: list[str] = []
        self.api: list[str] = []
        self.t0 = self.t_end = 0

    def progress(self, step: int) -> list[str]:
        """The journey attributes every core event carries."""
        return [_int("scheduler.step", step), _int("prefill.done_tokens", min(self.done, self.prompt)),
                _int("prefill.total_tokens", self.prompt), _int("decode.done_tokens", self.dec),
                _int("decode.max_tokens", self.out), _int("num_preemptions", self.preempt)]


def _poisson(rng: random.Random, lam: float) -> int:
    """Knuth's Poisson draw (small λ)."""
    limit, k, p = math.exp(-lam), 0, rng.random()
    while p > limit:
        k += 1
        p *= rng.random()
    return k


def _drain_bytes(running: list[_Request], waiting: list[_Request], sh: TraceShape) -> int:
    """A rough size of what is left to write if no request arrived any more: a snapshot per
    remaining step of each request, a summary per step of the longest one, its journey spans."""
    rem = [r.out - r.dec + (r.dec == 0) for r in running] + [r.out - r.dec + 1 for r in waiting]
    if not rem:
        return 0
    return int(460 * sh.snapshot_fraction * sum(rem) + 1300 * max(rem) + 2500 * len(rem))


def generate(path: str | os.PathLike, mb: float, seed: int = 1, shape: TraceShape = TraceShape(),
             progress: Callable[[int], None] | None = None) -> GeneratedTrace:
    """Write a synthetic vLLM trace of about ``mb`` MB (10⁶ bytes; it stops at the first line
    past the target) to ``path``. Deterministic: the same ``seed`` and ``shape`` give a
    byte-identical file. ``progress`` gets the bytes written, line by line."""
    t_start = time.perf_counter()
    rng = random.Random(seed)
    sh = shape
    target = int(mb * 1e6)
    out = GeneratedTrace(str(path))
    wall0 = 1_700_000_000 * 10**9            # wall clock (timeUnixNano) = wall0 + monotonic
    t = 100 * 10**9                          # monotonic ns
    prev_end = t - 1_000_000
    waiting: list[_Request] = []
    running: list[_Request] = []
    pending = {"vllm.api": [], "vllm.scheduler": [], "vllm.scheduler.step": []}
    n_pending = pending_bytes = 0
    nreq = step = 0
    draining = False

    f = open(path, "w", encoding="ascii", newline="\n")

    def write(text: str) -> None:
        f.write(text)
        out.bytes += len(text)
        out.lines += 1
        if progress is not None:
            progress(len(text))

    def flush() -> None:
        nonlocal n_pending, pending_bytes
        if not n_pending:
            return
        write(_line("vllm", [(s, pending[s]) for s in ("vllm.api", "vllm.scheduler",
                                                        "vllm.scheduler.step")]))
        for v in pending.values():
            v.clear()
        n_pending = pending_bytes = 0
        if out.lines % sh.unknown_every == 1 or sh.unknown_every == 1:
            spans = []
            for i in range(1 + rng.randrange(3)):
                a = wall0 + t - rng.randrange(1_000_000, 50_000_000)
                spans.append(_span("POST /v1/completions", f"{rng.getrandbits(128):032x}",
                                   f"{rng.getrandbits(64):016x}", a, a + 4_000_000,
                                   [_str("http.method", "POST"), _int("http.status_code", 200)],
                                   [_event("http.request.body", a + 1000, [_int("size", 512)])]))
            write(_line("gateway", [("opentelemetry.instrumentation.fastapi", spans)]))
            out.unknown_lines += 1

    def emit(scope: str, span: str, n_events: int) -> None:
        nonlocal n_pending, pending_bytes
        pending[scope].append(span)
        n_pending += 1
        pending_bytes += len(span)
        out.events += n_events
        if n_pending >= sh.spans_per_line:
            flush()

    def core_event(r: _Request, name: str, kind: str, ts: int, step_id: int, *extra: str) -> None:
        r.core.append(_event(name, wall0 + ts, [_str("event.type", kind), _int("ts.monotonic_ns", ts),
                                                *r.progress(step_id), *extra]))

    try:
        while True:
            step += 1
            # arrivals since the previous step ended (uniform over the gap, in time order); none
            # once the target size is reached: the engine then drains
            k = _poisson(rng, sh.arrival_rate)
            if rng.random() < sh.burst_prob:
                k += sh.burst_size
            if not draining and out.bytes + pending_bytes + _drain_bytes(running, waiting, sh) >= target:
                draining = True
            if draining:
                if not running and not waiting:
                    break
                k = 0
            for a in sorted(rng.randrange(prev_end, t) for _ in range(k)):
                nreq += 1
                prompt = min(max(int(rng.lognormvariate(*sh.prompt_lognormal)), sh.prompt_range[0]),
                             sh.prompt_range[1])
                n_out = min(max(int(rng.lognormvariate(*sh.output_lognormal)), sh.output_range[0]),
                            sh.output_range[1])
                r = _Request(nreq, prompt, n_out)
                r.t0 = a
                r.api.append(_event("api.ARRIVED", wall0 + a, [_dbl("event.ts.monotonic", a / 1e9)]))
                r.api.append(_event("api.HANDOFF_TO_CORE", wall0 + a + 20_000,
                                    [_dbl("event.ts.monotonic", (a + 20_000) / 1e9)]))
                core_event(r, "journey.QUEUED", "QUEUED", a + 30_000, step)
                waiting.append(r)
            if not running and not waiting:          # idle: no step until the next arrival
                step -= 1
                prev_end, t = t, t + rng.randrange(1_000_000, 20_000_000)
                continue
            start = t
            # preemption (before scheduling: the victim is not in this step)
            preempted = 0
            if len(running) >= 8 and rng.random() < sh.preempt_prob:
                r = running.pop()
                r.preempt += 1
                preempted += 1
                out.preemptions += 1
                core_event(r, "journey.PREEMPTED", "PREEMPTED", start + 10_000, step)
                r.done = 0
                waiting.insert(0, r)
            # schedule: running requests first, then admit waiting ones under the token budget
            tokens, sched = 0, []
            for r in running:
                n = min(r.prompt + r.dec - r.done, sh.budget - tokens)
                if n > 0:
                    sched.append((r, n))
                    tokens += n
            while waiting and len(running) < sh.max_seqs and tokens < sh.budget:
                r = waiting.pop(0)
                if r.first and rng.random() < sh.prefix_hit_prob:
                    r.done = min(r.prompt - 1, BLOCK * rng.randint(1, 8))
                core_event(r, "journey.SCHEDULED", "SCHEDULED", start + 50_000, step,
                           _str("schedule.kind", "FIRST" if r.first else "RESUME"))
                r.first = False
                running.append(r)
                n = min(r.prompt + r.dec - r.done, sh.budget - tokens)
                sched.append((r, n))
                tokens += n
            dur_us = 2000 + 3 * tokens + rng.randrange(500)
            end = start + dur_us * 1000
            snaps, finished = [], []
            n_pre = n_dec = pre_tok = dec_tok = 0
            for r, n in sched:
                before = r.done
                is_dec = n == 1 and before >= r.prompt
                if is_dec:
                    n_dec += 1
                    dec_tok += 1
                else:
                    n_pre += 1
                    pre_tok += n
                snaps.append(_event("step.REQUEST_SNAPSHOT", wall0 + end, [
                    _int("step.id", step), _str("request.id", r.id),
                    _str("request.phase", "DECODE" if is_dec else "PREFILL"),
                    _int("request.num_prompt_tokens", r.prompt),
                    _int("request.num_computed_tokens", before),
                    _int("request.num_output_tokens", r.dec),
                    _int("request.num_preemptions", r.preempt),
                    _int("request.scheduled_tokens_this_step", n)]))
                r.done += n
                if r.done == r.prompt + r.dec:          # all of it in KV: a token is sampled
                    r.dec += 1
                    if r.dec == 1:
                        core_event(r, "journey.FIRST_TOKEN", "FIRST_TOKEN", end, step)
                    if r.dec >= r.out:
                        finished.append(r)
            for r in finished:
                running.remove(r)
                core_event(r, "journey.FINISHED", "FINISHED", end, step,
                           _str("finish.status", "stop" if r.n % 3 == 0 else "length"))
                dep = end + 40_000
                r.api.append(_event("api.DEPARTED", wall0 + dep, [_dbl("event.ts.monotonic", dep / 1e9)]))
                emit("vllm.api", _span("llm_request", r.trace, f"{2 * r.n:016x}", wall0 + r.t0,
                                       wall0 + dep, [_str("gen_ai.request.id", r.id)], r.api),
                     len(r.api))
                emit("vllm.scheduler", _span("llm_core", r.trace, f"{2 * r.n + 1:016x}",
                                             wall0 + r.t0, wall0 + end,
                                             [_str("gen_ai.request.id", r.id + "-0"),
                                              _int("gen_ai.usage.prompt_tokens", r.prompt)], r.core),
                     len(r.core))
                out.requests += 1
            used = min(sh.kv_blocks_total, sum(-(-r.done // BLOCK) for r in running))
            events = [_event("step.BATCH_SUMMARY", wall0 + end, [
                _int("step.id", step), _int("step.ts_start_ns", start), _int("step.ts_end_ns", end),
                _int("step.duration_us", dur_us), _int("queue.running_depth", len(running)),
                _int("queue.waiting_depth", len(waiting)), _int("batch.num_prefill_reqs", n_pre),
                _int("batch.num_decode_reqs", n_dec), _int("batch.scheduled_tokens", tokens),
                _int("batch.prefill_tokens", pre_tok), _int("batch.decode_tokens", dec_tok),
                _int("batch.num_finished", len(finished)), _int("batch.num_preempted", preempted),
                _dbl("kv.usage_gpu_ratio", used / sh.kv_blocks_total),
                _int("kv.blocks_total_gpu", sh.kv_blocks_total),
                _int("kv.blocks_free_gpu", sh.kv_blocks_total - used),
                _bool("step.cuda_graph", bool(n_dec and not n_pre))])]
            out.steps += 1
            if rng.random() < sh.snapshot_fraction:
                events += snaps
                out.steps_with_snapshots += 1
            emit("vllm.scheduler.step", _span("scheduler_steps", f"{1 << 100 | step:032x}",
                                              f"{step:016x}", wall0 + start, wall0 + end,
                                              [_int("step.id", step)], events), len(events))
            prev_end, t = end, end + rng.randrange(100_000, 2_000_000)
        flush()
    finally:
        f.close()
    out.seconds = time.perf_counter() - t_start
    return out


# ------------------------------------------------------------------------------------ benchmark

TIME = "/usr/bin/time"       #: GNU time, if present, reports the command's peak RSS (``%M``)


def _run_cli(args: list[str], log: Path) -> tuple[float, float]:
    """(wall seconds, peak RSS MB) of ``python -m roofcal.cli ARGS`` (stderr, with the progress
    bar, to ``log``); a failure raises with the log's tail.

    The peak RSS comes from GNU time when present: ``ru_maxrss`` of a child forked straight from
    this process also counts this process's pages before the ``exec`` (Linux keeps the old
    memory's high-water mark), which after an in-process run of a large trace is the larger. The
    fallback (no ``/usr/bin/time``) is ``ru_maxrss`` from :func:`os.wait4`, so :func:`bench` runs
    the subprocesses before the in-process runs."""
    cmd = [sys.executable, "-m", "roofcal.cli", *args]
    use_time = os.access(TIME, os.X_OK)
    rss_file = log.with_name("rss.txt")
    if use_time:
        cmd = [TIME, "-f", "%M", "-o", str(rss_file), *cmd]
    with open(log, "wb") as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(p.pid, 0)
        seconds = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode:
        raise RuntimeError(f"roofcal {' '.join(args)} exited with {p.returncode}:\n"
                           + log.read_text(errors="replace")[-2000:])
    if use_time:
        return seconds, int(rss_file.read_text().split()[-1]) / 1024     # %M: KiB
    return seconds, usage.ru_maxrss / 1024          # Linux: ru_maxrss in KiB


def _cli_args(trace: str | os.PathLike, tmp: Path) -> list[str]:
    return ["traces", "read", str(trace), "--out-steps", str(tmp / "steps.jsonl"),
            "--out-requests", str(tmp / "requests.csv")]


def bench(mb: float = 100.0, runs: int = 3, path: str | os.PathLike | None = None, seed: int = 1,
          cli_runs: int | None = None, workdir: str | None = None,
          log: Callable[[str], None] | None = None) -> tuple[dict, str]:
    """Time the trace reader on a synthetic trace of ``mb`` MB (or on ``path``): ``runs`` calls of
    :func:`read_trace` in this process and ``cli_runs`` (default ``runs``) runs of ``roofcal
    traces read`` (with its progress bar, writing all three outputs) as a subprocess, with its
    peak RSS; plus one run on a 0.2 MB trace (start-up and import baseline). The generated files
    live in a temporary directory (under ``workdir``) that is removed at the end.

    Returns (results dict, Markdown table + one line of counts)."""
    from roofcal.measurements.traces import read_trace
    say = log or (lambda s: None)
    cli_runs = runs if cli_runs is None else cli_runs
    res: dict = {"runs": runs, "cli_runs": cli_runs, "seed": seed}
    with tempfile.TemporaryDirectory(prefix="roofcal-trace-bench-", dir=workdir) as d:
        tmp = Path(d)
        if path is None:
            say(f"generating a {mb:g} MB synthetic trace (seed {seed}) in {tmp} ...")
            g = generate(tmp / "trace.json", mb, seed)
            path = g.path
            res.update(generated_seconds=g.seconds, generated_lines=g.lines,
                       generated_unknown_lines=g.unknown_lines, generated_preemptions=g.preemptions)
            say(f"  {g.bytes / 1e6:.1f} MB in {g.seconds:.1f} s")
        size = os.path.getsize(path)
        res.update(file=str(path), file_mb=size / 1e6)
        small = generate(tmp / "small.json", 0.2, seed)
        base_s, base_rss = _run_cli(_cli_args(small.path, tmp), tmp / "stderr.txt")
        cli, rss = [], []
        for i in range(cli_runs):
            s, m = _run_cli(_cli_args(path, tmp), tmp / "stderr.txt")
            cli.append(s)
            rss.append(m)
            say(f"  roofcal traces read run {i + 1}: {s:.2f} s ({size / 1e6 / s:.1f} MB/s), "
                f"peak RSS {m:.0f} MB")
        times = []
        summary = None
        for i in range(runs):
            gc.collect()
            t0 = time.perf_counter()
            data = read_trace(path)
            times.append(time.perf_counter() - t0)
            summary = data.summary
            del data
            say(f"  read_trace run {i + 1}: {times[-1]:.2f} s ({size / 1e6 / times[-1]:.1f} MB/s)")
        gc.collect()
    load = os.getloadavg()
    res.update(read_trace_seconds=times, cli_seconds=cli, cli_peak_rss_mb=rss,
               baseline_seconds=base_s, baseline_peak_rss_mb=base_rss, loadavg=load,
               cpus=os.cpu_count())
    if summary is not None:
        res.update(lines=summary.lines, events=summary.events, steps=summary.steps,
                   steps_snapshot=summary.steps_snapshot, steps_journey=summary.steps_journey,
                   steps_aggregate=summary.steps_aggregate, requests=summary.requests,
                   unknown_scope_spans=summary.unknown_scope_spans)

    def row(what, secs, peak=None):
        if not secs:
            return None
        med = statistics.median(secs)
        return {"reader": what, "runs": len(secs), "seconds min": f"{min(secs):.2f}",
                "seconds median": f"{med:.2f}", "MB/s min": f"{size / 1e6 / max(secs):.1f}",
                "MB/s median": f"{size / 1e6 / med:.1f}",
                "peak RSS MB": f"{max(peak):.0f}" if peak else None, "target MB/s": f"{TARGET_MB_S:g}",
                "met (median)": "yes" if size / 1e6 / med >= TARGET_MB_S else "no"}

    rows = [r for r in (row("read_trace (in-process)", times),
                        row("roofcal traces read (subprocess: start-up, bar, 3 outputs)", cli, rss))
            if r]
    rows.append({"reader": "roofcal traces read, 0.2 MB trace (start-up baseline)", "runs": 1,
                 "seconds min": f"{base_s:.2f}", "seconds median": f"{base_s:.2f}",
                 "peak RSS MB": f"{base_rss:.0f}"})
    md = table(rows, ["reader", "runs", "seconds min", "seconds median", "MB/s min", "MB/s median",
                      "peak RSS MB", "target MB/s", "met (median)"])
    counts = ""
    if summary is not None:
        counts = (f"{size / 1e6:,.1f} MB ({'synthetic, seed %d' % seed if 'generated_lines' in res else path}): "
                  f"{summary.lines:,} lines, {summary.events:,} events, {summary.steps:,} steps "
                  f"({summary.steps_snapshot:,} snapshot, {summary.steps_journey:,} journey, "
                  f"{summary.steps_aggregate:,} aggregate), {summary.requests:,} requests, "
                  f"{summary.unknown_scope_spans:,} unknown-scope spans. ")
    md += (f"\n\n{counts}MB/s min = size / slowest run. Load average {load[0]:.2f} {load[1]:.2f} "
           f"{load[2]:.2f} on {os.cpu_count()} cores at the end.")
    return res, md


def report(mb: float = 100.0, runs: int = 3, seed: int = 1) -> list[tuple[str, str]]:
    """(title, Markdown) sections for ``roofcal bench --traces-mb MB``."""
    _, md = bench(mb, runs, seed=seed)
    return [(f"Trace reader speed ({mb:g} MB synthetic trace, target ≥ {TARGET_MB_S:g} MB/s)", md)]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m roofcal.bench.traces",
                                description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=float, default=100.0, help="size of the synthetic trace (default 100)")
    p.add_argument("--runs", type=int, default=3, help="in-process runs (default 3)")
    p.add_argument("--cli-runs", type=int, help="subprocess runs (default: --runs)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--trace", help="time this trace file instead of a synthetic one")
    p.add_argument("--workdir", help="directory for the temporary files (default: $TMPDIR)")
    p.add_argument("--keep", metavar="PATH", help="only write the synthetic trace to PATH")
    p.add_argument("--json", action="store_true", help="also print the results as JSON")
    a = p.parse_args(argv)
    if a.keep:
        g = generate(a.keep, a.mb, a.seed)
        print(f"wrote {g.path}: {g.bytes:,} bytes, {g.lines:,} lines ({g.unknown_lines} unknown "
              f"scope), {g.events:,} events, {g.steps:,} steps ({g.steps_with_snapshots:,} with "
              f"snapshots), {g.requests:,} requests, {g.preemptions} preemptions, {g.seconds:.1f} s")
        return
    res, md = bench(a.mb, a.runs, a.trace, a.seed, a.cli_runs, a.workdir,
                    log=lambda s: print(s, file=sys.stderr, flush=True))
    title = f"Trace reader speed ({res['file_mb']:.0f} MB, target ≥ {TARGET_MB_S:g} MB/s)"
    print(f"### {title}\n\n{md}")
    if a.json:
        print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()

"""``roofcal traces read``: vLLM's own traces (OTLP JSON lines, journey + step tracing) → roofcal
steps JSONL, a per-step context CSV and a per-request CSV (:mod:`roofcal.measurements.traces`).

Example::

    roofcal traces read traces.json run2/traces.json.gz --out-steps steps.jsonl \\
        --out-requests requests.csv

The steps JSONL holds the steps with an exact composition, past warm-up and not preemption-heavy,
in roofcal's step format (readable by ``roofcal predict --steps``); every step, with its cycle
time, queue depths, KV usage and flags, is in the context CSV (default: ``<steps>.context.csv``),
whose ``jsonl_line`` column points into the steps JSONL.
"""

from __future__ import annotations

import sys
from pathlib import Path


def default_context_path(out_steps: str) -> Path:
    """``steps.jsonl`` → ``steps.context.csv`` beside it."""
    p = Path(out_steps)
    stem = p.name[:-len(".jsonl")] if p.name.endswith(".jsonl") else p.name
    return p.with_name(stem + ".context.csv")


def context_path(a) -> Path:
    """The context CSV: ``--out-context``, else :func:`default_context_path` of ``--out-steps``."""
    return Path(a.out_context) if a.out_context else default_context_path(a.out_steps)


def cmd_read(a) -> None:
    from tqdm import tqdm

    from roofcal.errors import RoofcalError
    from roofcal.measurements import traces as tr

    if a.warmup_steps < 0:
        raise RoofcalError(f"--warmup-steps must be ≥ 0, got {a.warmup_steps}")
    if a.max_preempted < 1:
        raise RoofcalError(f"--max-preempted must be ≥ 1, got {a.max_preempted}")
    context = context_path(a)
    total = 0
    for p in a.traces:
        if Path(p).is_dir():
            raise RoofcalError(f"{p}: is a directory, not a trace file")
        try:
            total += Path(p).stat().st_size
        except OSError:
            raise RoofcalError(f"{p}: no such trace file") from None
    with tqdm(total=total, unit="B", unit_scale=True, desc="traces", file=sys.stderr,
              disable=a.quiet or not sys.stderr.isatty(), mininterval=0.5) as bar:
        data = tr.read_traces(a.traces, a.warmup_steps, a.max_preempted, progress=bar.update)
    n = tr.write_outputs(data, a.out_steps, context, a.out_requests)
    print(data.summary.text())
    print(f"wrote {a.out_steps} ({n} steps), {context} ({len(data.steps)} steps)"
          + (f", {a.out_requests} ({len(data.requests)} requests)" if a.out_requests else ""))


def register(sub) -> None:
    """Add the ``traces`` command group."""
    from roofcal.measurements.traces import MAX_PREEMPTED, WARMUP_STEPS

    t = sub.add_parser("traces", help="read vLLM's journey and step traces (OTLP JSON lines)")
    tsub = t.add_subparsers(dest="traces_command", required=True)
    r = tsub.add_parser("read", help="traces → steps JSONL, step context CSV, requests CSV")
    r.add_argument("traces", nargs="+", metavar="TRACE",
                   help="OTLP JSON lines file of one vLLM run (plain or gzip)")
    r.add_argument("--out-steps", required=True, help="steps JSONL (usable steps only)")
    r.add_argument("--out-requests", help="per-request CSV (intervals in µs)")
    r.add_argument("--out-context", help="per-step context CSV (default: <steps>.context.csv)")
    r.add_argument("--warmup-steps", type=int, default=WARMUP_STEPS,
                   help=f"first step ids of each file flagged as warm-up (default {WARMUP_STEPS})")
    r.add_argument("--max-preempted", type=int, default=MAX_PREEMPTED,
                   help=f"steps preempting at least this many requests are flagged "
                        f"(default {MAX_PREEMPTED})")
    r.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    r.set_defaults(func=cmd_read, inputs=["traces"], outputs=[
        ("out_steps", "file", "steps JSONL (--out-steps)"),
        (context_path, "file", "context CSV (--out-context)"),
        ("out_requests", "file", "requests CSV (--out-requests)")])

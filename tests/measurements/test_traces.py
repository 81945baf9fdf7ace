"""vLLM traces (OTLP JSON lines): hand-built runs whose steps and request intervals are known."""

import argparse
import gzip
import json

import pandas as pd
import pytest

from roofcal.errors import RoofcalError
from roofcal.measurements import traces as tr

BASE = 100_000_000_000                       # monotonic ns of step 1's start
CYCLES_US = [12000, 11000, 15000, 9000, 20000, 10000]
DURATIONS_US = [5000, 6000, 8000, 4000, 3000, 9000, 4000]
STARTS = [BASE + 1000 * sum(CYCLES_US[:i]) for i in range(7)]     # steps 1..7


# ------------------------------------------------------------------------------ trace builder

def _attr(k, v):
    if isinstance(v, bool):
        return {"key": k, "value": {"boolValue": v}}
    if isinstance(v, int):
        return {"key": k, "value": {"intValue": str(v)}}        # OTLP JSON: int64 as a string
    if isinstance(v, float):
        return {"key": k, "value": {"doubleValue": v}}
    return {"key": k, "value": {"stringValue": v}}


def _event(name, attrs, t=1):
    return {"timeUnixNano": str(t), "name": name,
            "attributes": [_attr(k, v) for k, v in attrs.items()]}


def _line(*scope_spans):
    """One OTLP export object: scope_spans = (scope name, [span, ...]) pairs."""
    return json.dumps({"resourceSpans": [{"resource": {"attributes": []}, "scopeSpans": [
        {"scope": {"name": scope}, "spans": spans} for scope, spans in scope_spans]}]})


def _span(name, events, trace="t", attrs=None):
    return {"traceId": trace, "spanId": "s", "name": name,
            "attributes": [_attr(k, v) for k, v in (attrs or {}).items()], "events": events}


def summary(step, tokens, reqs, preempted=0, start=None, end=None):
    start = STARTS[step - 1] if start is None else start
    dur = DURATIONS_US[step - 1] if step <= len(DURATIONS_US) else 1000
    return _event("step.BATCH_SUMMARY", {
        "step.id": step, "step.ts_start_ns": start,
        "step.ts_end_ns": start + 1000 * dur if end is None else end,
        "step.duration_us": dur, "queue.running_depth": reqs, "queue.waiting_depth": 0,
        "batch.num_prefill_reqs": reqs, "batch.num_decode_reqs": 0,    # split unknown to us
        "batch.scheduled_tokens": tokens, "batch.prefill_tokens": 0, "batch.decode_tokens": 0,
        "batch.num_finished": 0, "batch.num_preempted": preempted,
        "kv.usage_gpu_ratio": 0.25, "kv.blocks_total_gpu": 100, "kv.blocks_free_gpu": 75})


def snapshot(step, rid, prompt, computed, scheduled):
    return _event("step.REQUEST_SNAPSHOT", {
        "step.id": step, "request.id": rid, "request.phase": "PREFILL",
        "request.num_prompt_tokens": prompt, "request.num_computed_tokens": computed,
        "request.num_output_tokens": 0, "request.num_preemptions": 0,
        "request.scheduled_tokens_this_step": scheduled})


def core(kind, step, t_ns, done, total, dec, seconds=False, **extra):
    a = {"event.type": kind, "scheduler.step": step, "prefill.done_tokens": done,
         "prefill.total_tokens": total, "decode.done_tokens": dec, "decode.max_tokens": 64,
         "num_preemptions": extra.pop("preempt", 0)}
    a["ts.monotonic" if seconds else "ts.monotonic_ns"] = t_ns / 1e9 if seconds else t_ns
    a.update(extra)
    return _event(f"journey.{kind}", a)


def api(kind, t_ns):
    return _event(f"api.{kind}", {"event.ts.monotonic": t_ns / 1e9})


def ms(x):
    """ns at BASE + x ms."""
    return BASE + round(x * 1e6)


# Requests (prompt, steps; known by hand):
#   A: prompt 6, one-step prefill at 1, decodes at 2, 3, 4 (contexts 6, 7, 8), finished at 4
#   B: prompt 10, chunked prefill 6 + 4 at steps 2, 3, decodes at 4, 5 (contexts 10, 11)
#   C: prompt 8 with a 4-token prefix-cache hit: chunk [4, 4] at 3, decode at 4 (context 8),
#      preempted at 5, resumed at 6 recomputing prompt + 2 outputs ([10, 0]), decode at 7 (ctx 10)
EXPECTED = {
    1: ([(6, 0)], []),
    2: ([(6, 0)], [6]),
    3: ([(4, 6), (4, 4)], [7]),
    4: ([], [8, 10, 8]),
    5: ([], [11]),
    6: ([(10, 0)], []),
    7: ([], [10]),
}
TOKENS = {k: sum(c[0] for c in p) + len(d) for k, (p, d) in EXPECTED.items()}
REQS = {k: len(p) + len(d) for k, (p, d) in EXPECTED.items()}


def journeys():
    a = [core("QUEUED", 1, ms(0.5), 0, 6, 0),
         core("SCHEDULED", 1, ms(1), 0, 6, 0, **{"schedule.kind": "FIRST"}),
         core("FIRST_TOKEN", 1, ms(5), 6, 6, 1),
         core("FINISHED", 4, ms(50), 6, 6, 4, **{"finish.status": "length"})]
    b = [core("QUEUED", 1, ms(2), 0, 10, 0, seconds=True),
         core("SCHEDULED", 2, ms(12), 0, 10, 0, seconds=True),
         core("FIRST_TOKEN", 3, ms(31), 10, 10, 1, seconds=True),
         core("FINISHED", 5, ms(60), 10, 10, 3, seconds=True, **{"finish.status": "stopped"})]
    c = [core("QUEUED", 2, ms(20), 0, 8, 0), core("SCHEDULED", 3, ms(23), 4, 8, 0),
         core("FIRST_TOKEN", 3, ms(31), 8, 8, 1),
         core("PREEMPTED", 5, ms(47), 8, 8, 2, preempt=1),
         core("SCHEDULED", 6, ms(67), 0, 8, 2, preempt=1, **{"schedule.kind": "RESUME"}),
         core("FINISHED", 7, ms(80), 8, 8, 4, preempt=1, **{"finish.status": "stopped"})]
    out = []
    for rid, trace, evs, arrive in (("A", "ta", a, 0.0), ("B", "tb", b, 1.5), ("C", "tc", c, 19.0)):
        out.append(("vllm.api", [_span("llm_request", [api("ARRIVED", ms(arrive)),
                                                       api("HANDOFF_TO_CORE", ms(arrive + 0.2)),
                                                       api("DEPARTED", ms(90))],
                                       trace, {"gen_ai.request.id": f"cmpl-{rid}"})]))
        out.append(("vllm.scheduler", [_span("llm_core", evs, trace,
                                             {"gen_ai.request.id": f"cmpl-{rid}-0"})]))
    return out


def step_line(steps, snapshots=()):
    evs = [summary(k, TOKENS[k], REQS[k], preempted=1 if k == 5 else 0) for k in steps]
    return _line(("vllm.scheduler.step", [_span("scheduler_steps_1", evs + list(snapshots))]))


def write(tmp_path, lines, name="traces.json"):
    p = tmp_path / name
    p.write_text("".join(line + "\n" for line in lines))
    return p


def good_lines(steps=range(1, 8)):
    snaps = [snapshot(3, "B", 10, 6, 4), snapshot(3, "C", 8, 4, 4), snapshot(3, "A", 6, 7, 1)]
    return [_line(*journeys()), step_line([k for k in steps if k <= 4],
                                          [s for s in snaps if 3 in steps]),
            step_line([k for k in steps if k > 4])]


# ------------------------------------------------------------------------------------- tests

def test_steps_rebuilt_exactly_from_snapshots_and_journeys(tmp_path):
    d = tr.read_trace(write(tmp_path, good_lines()), warmup_steps=0)
    got = {s.step_id: ([tuple(c) for c in s.prefill], list(s.decode)) for s in d.steps}
    assert got == EXPECTED
    comp = {s.step_id: s.composition for s in d.steps}
    assert comp == {1: "journey", 2: "journey", 3: "snapshot", 4: "journey", 5: "journey",
                    6: "journey", 7: "journey"}
    assert [s.duration_us for s in d.steps] == DURATIONS_US
    assert [s.cycle_us for s in d.steps] == CYCLES_US + [None]
    s5 = d.steps[4]
    assert (s5.num_preempted, s5.kv_usage, s5.kv_blocks_free, s5.preemption_heavy) == (1, 0.25, 75, False)
    assert d.summary.steps == 7 and d.summary.steps_usable == 7 and d.summary.missing_steps == 0
    assert d.summary.sampled_out_steps == 0 and d.summary.truncated_lines == 0


def test_request_intervals(tmp_path):
    d = tr.read_trace(write(tmp_path, good_lines()))
    r = {x.request_id: x for x in d.requests}
    assert sorted(r) == ["cmpl-A-0", "cmpl-B-0", "cmpl-C-0"]      # core span id wins, joined on traceId
    a, b, c = r["cmpl-A-0"], r["cmpl-B-0"], r["cmpl-C-0"]
    assert (a.prompt_tokens, a.output_tokens, a.num_preemptions, a.finish_status) == (6, 4, 0, "length")
    assert a.api_us == pytest.approx(200) and a.queueing_us == pytest.approx(500)
    assert a.wait_us == pytest.approx(500) and a.prefill_us == pytest.approx(4000)
    assert a.ttft_us == pytest.approx(5000) and a.tpot_us == pytest.approx(45000 / 3)
    assert a.e2e_us == pytest.approx(90000)
    assert (a.queued_step, a.scheduled_step, a.first_token_step, a.finished_step) == (1, 1, 1, 4)
    assert b.queueing_us == pytest.approx(500) and b.wait_us == pytest.approx(10000)   # ts.monotonic in s
    assert b.tpot_us == pytest.approx(29000 / 2)
    assert (c.num_preemptions, c.output_tokens, c.wait_us) == (1, 4, pytest.approx(3000))
    assert d.summary.requests == 3 and d.summary.clock_backwards_requests == 0


def test_warmup_and_preemption_heavy_flags(tmp_path):
    d = tr.read_trace(write(tmp_path, good_lines()), warmup_steps=2, max_preempted=1)
    assert [s.step_id for s in d.steps if s.warmup] == [1, 2]
    assert [s.step_id for s in d.steps if s.preemption_heavy] == [5]
    assert d.summary.steps_usable == 4 and d.summary.warmup_steps == 2
    assert d.summary.preemption_heavy_steps == 1


def test_sampled_out_step_makes_chunked_neighbour_aggregate(tmp_path):
    # step 2 not emitted (and step 3 without its snapshot): B's first chunk is unknown, so step 3's
    # cached length is too; decode-only step 4 is still exact
    lines = good_lines(steps=[1, 4, 5, 6, 7]) + [step_line([3])]
    d = tr.read_trace(write(tmp_path, lines), warmup_steps=0)
    comp = {s.step_id: s.composition for s in d.steps}
    assert comp == {1: "journey", 3: "aggregate", 4: "journey", 5: "journey", 6: "journey",
                    7: "journey"}
    s3 = next(s for s in d.steps if s.step_id == 3)
    assert (s3.prefill, s3.decode, s3.scheduled_tokens) == ((), (), 9)
    assert d.summary.sampled_out_steps == 1 and d.summary.missing_steps == 1   # B: SCHEDULED at 2
    assert [s.cycle_us for s in d.steps][:2] == [None, CYCLES_US[2]]
    assert d.summary.steps_aggregate == 1 and d.summary.steps_usable == 5


def test_writers_round_trip_through_roofcal_step_reader(tmp_path):
    from roofcal.physics.steps import read_steps
    d = tr.read_trace(write(tmp_path, good_lines()), warmup_steps=1)
    n = tr.write_steps_jsonl(d, tmp_path / "steps.jsonl")
    steps = read_steps(tmp_path / "steps.jsonl")
    assert n == 6 and [(s.prefill, s.decode) for s in steps] == \
        [(tuple(EXPECTED[k][0]), tuple(EXPECTED[k][1])) for k in range(2, 8)]
    assert [s.duration_us for s in steps] == DURATIONS_US[1:]
    assert [s.cycle_us for s in steps] == CYCLES_US[1:] + [None]      # step 7 has no successor
    tr.write_step_context_csv(d, tmp_path / "ctx.csv")
    ctx = pd.read_csv(tmp_path / "ctx.csv")
    assert list(ctx.columns) == list(tr.CONTEXT_COLUMNS)
    assert ctx.jsonl_line.isna().tolist() == [True] + [False] * 6
    assert ctx.jsonl_line.dropna().tolist() == [1, 2, 3, 4, 5, 6]
    tr.write_requests_csv(d, tmp_path / "req.csv")
    req = pd.read_csv(tmp_path / "req.csv")
    assert list(req.columns) == list(tr.REQUEST_COLUMNS) and len(req) == 3
    assert req.loc[req.request_id == "cmpl-A-0", "queueing_us"].item() == pytest.approx(500)


def test_gzip_reads_the_same(tmp_path):
    plain = tr.read_trace(write(tmp_path, good_lines()))
    gz = tmp_path / "traces.json.gz"
    gz.write_bytes(gzip.compress("".join(x + "\n" for x in good_lines()).encode()))
    zipped = tr.read_trace(gz)
    assert [(s.prefill, s.decode, s.cycle_us) for s in zipped.steps] == \
        [(s.prefill, s.decode, s.cycle_us) for s in plain.steps]
    assert [r.ttft_us for r in zipped.requests] == [r.ttft_us for r in plain.requests]
    gz.write_bytes(gz.read_bytes()[:-30])                       # collector killed mid-write
    assert tr.read_trace(gz).summary.truncated_lines == 1


def test_truncated_last_line_counted_other_lines_fatal(tmp_path):
    lines = good_lines()
    p = write(tmp_path, lines + [lines[2][:57]])
    d = tr.read_trace(p)
    assert d.summary.truncated_lines == 1 and d.summary.steps == 7
    p = write(tmp_path, [lines[0], lines[1][:40], lines[2]])
    with pytest.raises(RoofcalError, match=r"traces\.json:2: bad JSON"):
        tr.read_trace(p)


def test_unknown_scope_counted_and_skipped(tmp_path):
    other = _line(("some.other.lib", [_span("x", [summary(1, 99, 1)])]))
    d = tr.read_trace(write(tmp_path, good_lines() + [other]), warmup_steps=0)
    assert d.summary.unknown_scope_spans == 1 and d.summary.steps == 7
    assert d.steps[0].scheduled_tokens == 6


def test_missing_attribute_names_file_line_and_attribute(tmp_path):
    bad = summary(8, 1, 1, start=STARTS[6] + 10**9)
    bad["attributes"] = [a for a in bad["attributes"] if a["key"] != "step.duration_us"]
    lines = good_lines() + [_line(("vllm.scheduler.step", [_span("s", [bad])]))]
    with pytest.raises(RoofcalError, match=r"traces\.json:4: event 'step.BATCH_SUMMARY' has no "
                                           r"attribute 'step.duration_us'"):
        tr.read_trace(write(tmp_path, lines))
    j = core("FINISHED", 9, ms(99), 1, 1, 1)
    j["attributes"] = [a for a in j["attributes"] if a["key"] != "scheduler.step"]
    lines = good_lines() + [_line(("vllm.scheduler", [_span("llm_core", [j], "tz")]))]
    with pytest.raises(RoofcalError, match=r":4: event 'journey.FINISHED' has no attribute "
                                           r"'scheduler.step'"):
        tr.read_trace(write(tmp_path, lines))


def test_clock_going_backwards_drops_the_step(tmp_path):
    back = _line(("vllm.scheduler.step", [_span("s", [
        summary(8, 1, 1, start=STARTS[6] - 1000),                       # starts before step 7
        summary(9, 1, 1, start=STARTS[6] + 10**8, end=STARTS[6] + 10**8 - 1)])]))  # ends first
    d = tr.read_trace(write(tmp_path, good_lines() + [back]), warmup_steps=0)
    assert [s.step_id for s in d.steps] == [1, 2, 3, 4, 5, 6, 7]
    assert d.summary.clock_backwards_steps == 2 and d.steps[-1].cycle_us is None


def test_journey_referencing_unemitted_step_counted(tmp_path):
    late = _line(("vllm.scheduler", [_span("llm_core", [core("QUEUED", 42, ms(200), 0, 5, 0)], "td",
                                           {"gen_ai.request.id": "cmpl-D-0"})]))
    d = tr.read_trace(write(tmp_path, good_lines() + [late]))
    assert d.summary.missing_steps == 1 and d.summary.requests == 4


def test_cli_writes_outputs(tmp_path, capsys):
    from roofcal.cli import traces as cli
    p = write(tmp_path, good_lines())
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers(dest="command"))
    a = parser.parse_args(["traces", "read", str(p), str(p), "--out-steps", str(tmp_path / "s.jsonl"),
                           "--out-requests", str(tmp_path / "r.csv"), "--warmup-steps", "0", "-q"])
    a.func(a)
    out = capsys.readouterr().out
    assert "files: 2" in out and "steps_usable: 14" in out
    assert (tmp_path / "s.context.csv").exists() and len(pd.read_csv(tmp_path / "r.csv")) == 6


def test_blank_lines_and_errors_in_file_order(tmp_path):
    lines = good_lines() + [_line(("some.other.lib", [_span("x", [summary(1, 99, 1)])]))]
    p = write(tmp_path, lines[:1] + [""] + lines[1:] + [lines[2][:57]])      # blank + truncated
    d = tr.read_trace(p)
    assert d.summary.truncated_lines == 1 and d.summary.unknown_scope_spans == 1
    assert d.summary.lines == 5                                 # non-blank, the cut one too
    assert {s.step_id: ([tuple(c) for c in s.prefill], list(s.decode)) for s in d.steps} == EXPECTED
    assert [r.request_id for r in d.requests] == ["cmpl-A-0", "cmpl-B-0", "cmpl-C-0"]
    bad = summary(8, 1, 1, start=STARTS[6] + 10**9)
    bad["attributes"] = [a for a in bad["attributes"] if a["key"] != "step.duration_us"]
    p = write(tmp_path, good_lines() + [lines[1][:40], _line(("vllm.scheduler.step", [_span("s", [bad])]))])
    with pytest.raises(RoofcalError, match=r"traces\.json:4: bad JSON"):      # first error in file order
        tr.read_trace(p)
    p = write(tmp_path, good_lines() + [_line(("vllm.scheduler.step", [_span("s", [bad])])), "[1]"])
    with pytest.raises(RoofcalError, match=r":4: event 'step.BATCH_SUMMARY' has no attribute"):
        tr.read_trace(p)


def test_json_that_does_not_fit_otlp_is_a_one_line_error(tmp_path):
    p = write(tmp_path, good_lines() + ["[1]"])                     # even on the last line
    with pytest.raises(RoofcalError, match=r"traces\.json:4: expected an OTLP JSON object"):
        tr.read_trace(p)
    ev = summary(8, 1, 1, start=STARTS[6] + 10**9)
    ev["attributes"][0]["value"] = "8"                             # not an AnyValue object
    p = write(tmp_path, [_line(("vllm.scheduler.step", [_span("s", [ev])]))] + good_lines())
    with pytest.raises(RoofcalError, match=r"traces\.json:1: expected an OTLP JSON object .*"
                                           r"\$\.resourceSpans\[0\]\.scopeSpans\[0\]\.spans"):
        tr.read_trace(p)


def test_iter_events_decodes_otlp_values(tmp_path):
    ev = _event("step.BATCH_SUMMARY", {"step.id": 3, "kv.usage_gpu_ratio": 0.5, "x.flag": True,
                                       "x.name": "n"}, t=1700000000123456789)
    ev["attributes"] += [{"key": "x.list", "value": {"arrayValue": {"values": []}}},
                         {"key": "x.number", "value": {"intValue": 7}},        # number, not string
                         {"key": "x.nan", "value": {"doubleValue": "NaN"}},
                         {"key": "x.none"}]
    p = write(tmp_path, [_line(("vllm.scheduler.step", [_span("s", [ev], "t9")]))])
    (got,) = tr.iter_events(p)
    attrs = got.attributes
    assert (got.scope, got.name, got.kind, got.time_ns, got.trace_id, got.where) == (
        "vllm.scheduler.step", "step.BATCH_SUMMARY", "BATCH_SUMMARY", 1700000000123456789, "t9",
        f"{p}:1")
    assert attrs["x.nan"] != attrs["x.nan"]
    del attrs["x.nan"]
    assert attrs == {"step.id": 3, "kv.usage_gpu_ratio": 0.5, "x.flag": True, "x.name": "n",
                     "x.list": {"values": []}, "x.number": 7, "x.none": None}
    assert got.get("step_id") == 3 and got.need("kv_usage") == 0.5


def test_progress_reports_every_byte(tmp_path):
    p = write(tmp_path, good_lines())
    seen = []
    tr.read_trace(p, progress=seen.append)
    assert sum(seen) == p.stat().st_size


def test_alphas_from_the_request_table_by_hand(tmp_path):
    from roofcal.calibration.alphas import alphas_from_files
    d = tr.read_trace(write(tmp_path, good_lines()), warmup_steps=0)
    tr.write_requests_csv(d, tmp_path / "r.csv")
    tr.write_step_context_csv(d, tmp_path / "c.csv")
    a = alphas_from_files(tmp_path / "r.csv", tmp_path / "c.csv")
    # α0: QUEUED − ARRIVED = 500, 500, 1,000 µs (A, B, C)
    assert a.queueing_us == pytest.approx(2000 / 3)
    # α1: DEPARTED (90 ms) − FINISHED (50, 60, 80 ms)
    assert a.post_decode_us == pytest.approx((40000 + 30000 + 10000) / 3)
    # α2: tpot less the mean cycle of the steps after the first-token step, up to the finished one
    #   A: 45,000/3 − mean(11,000, 15,000, 9,000) = 3,333.3 (steps 2–4)
    #   B: 29,000/2 − mean(9,000, 20,000) = 0 (steps 4–5)
    #   C: 49,000/3 − mean(9,000, 20,000, 10,000) = 3,333.3 (steps 4–7; step 7 has no cycle)
    assert a.output_token_us == pytest.approx((10000 / 3 + 0 + 10000 / 3) / 3)
    assert a.counts == {"requests": 3, "finished": 3, "queueing": 3, "post_decode": 3, "output_token": 3}
    assert alphas_from_files(tmp_path / "r.csv").output_token_us is None      # no cycle times
    with pytest.raises(RoofcalError, match="c.csv: missing column 'finish_status' \\(a requests CSV"):
        alphas_from_files(tmp_path / "c.csv")


@pytest.mark.slow
def test_fit_on_a_trace_with_measured_alphas(tmp_path, capsys):
    """``roofcal traces read`` → ``roofcal fit --step-target gpu+cycle --requests``: the stack
    is fitted on the trace's GPU and cycle times and carries the measured alphas."""
    from roofcal.cli.main import main
    from roofcal.model import coeffs as coeff_io
    p = write(tmp_path, good_lines())
    s, r = tmp_path / "s.jsonl", tmp_path / "r.csv"
    assert main(["traces", "read", str(p), "--out-steps", str(s), "--out-requests", str(r),
                 "--warmup-steps", "0", "-q"]) == 0
    out = tmp_path / "fitted.yaml"
    args = ["fit", "--gpu", "h100_sxm", "--data", str(s), "--model", "llama-3.1-8b-instruct",
            "--tp", "1", "--step-target", "gpu+cycle", "--requests", str(r), "--context",
            str(tmp_path / "s.context.csv"), "--out", str(out), "--quiet"]
    assert main(args) == 0
    c = coeff_io.load(out)
    st = c.stacks[c.stack]
    assert c.stack == "steps" and st.source["step_target"] == "gpu+cycle"
    assert st.alphas_us["queueing_us"] == pytest.approx(2000 / 3, rel=1e-6)
    assert st.alphas_us["output_token_us"] == pytest.approx(20000 / 9, rel=1e-6)
    assert st.source["alphas"]["requests"]["finished"] == 3
    assert "alphas of stack 'steps' from 3 finished requests" in capsys.readouterr().out
    # BLIS's form of the file takes the measured alphas, saying where they came from
    from roofcal.blis.distill import fit_form
    from roofcal.blis.fit import BlisFitSettings
    form = fit_form(out, settings=BlisFitSettings(samples=60, iters=30))
    assert form.alpha[0] == pytest.approx(2000 / 3, rel=1e-6)
    assert form.alpha[2] == pytest.approx(20000 / 9, rel=1e-6)
    assert "measured from request journeys" in form.alpha_source
    # alphas need steps to belong to
    assert main(["fit", "--gpu", "h100_sxm", "--data", "data/microbench/h100_sxm/nccl-2.27.3",
                 "--requests", str(r), "--out", str(tmp_path / "x.yaml"), "--quiet"]) == 2
    assert not (tmp_path / "x.yaml").exists()

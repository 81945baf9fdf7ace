"""Recorded serving runs (roofcal.measurements.tracev2): a hand-built TraceV2 with a server
description is an experiment whose ground truth follows by hand from its timestamps; wall-clock
times are replayed from the first send; and every malformed trace or description is refused with
one line naming the file, line and column — before anything is written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from roofcal.errors import RoofcalError
from roofcal.measurements.tracev2 import COLUMNS, read_data, read_trace_experiment
from roofcal.measurements.workload import read_experiment, read_experiments

HEADER = "trace_version: 3\ntime_unit: microseconds\nmode: real\nwarm_up_requests: 0\n"
SERVER = ("model: meta-llama/Llama-2-7b-hf\ntensor_parallelism: 1\ngpu: h100_sxm\nmax_num_seqs: 128\n"
          "max_num_batched_tokens: 2048\nkv_blocks: 7463\n")
T0 = 1_763_000_000_000_000          # a wall clock, µs


def row(rid, send, first, last, out=11, status="ok", group="g0", prefix=100, inp=20, server_in=0, deadline=0):
    v = {c: "" for c in COLUMNS}
    v.update(request_id=rid, client_id="c0", round_index=0, prefix_group=group, prefix_length=prefix,
             streaming="true", input_tokens=inp, output_tokens=out, text_tokens=0, image_tokens=0,
             audio_tokens=0, video_tokens=0, reason_ratio=0, deadline_us=deadline, server_input_tokens=server_in,
             arrival_time_us=send, send_time_us=send, first_chunk_time_us=first, last_chunk_time_us=last,
             num_chunks=out, status=status)
    return ",".join(str(v[c]) for c in COLUMNS)


def recorded(tmp_path: Path, rows: list[str], header: str = HEADER, server: str = SERVER,
             columns: str = ",".join(COLUMNS)) -> Path:
    d = tmp_path / "rec"
    d.mkdir(parents=True, exist_ok=True)
    (d / "server.yaml").write_text(server)
    (d / "trace.yaml").write_text(header)
    (d / "trace.csv").write_text(columns + "\n" + "\n".join(rows) + "\n")
    return d


GOOD = [row(0, T0, T0 + 30_000, T0 + 130_000),                # TTFT 30 ms, E2E 130 ms, 11 tokens
        row(1, T0 + 500_000, T0 + 550_000, T0 + 750_000),     # 50 ms, 250 ms
        row(2, T0 + 900_000, 0, 0, out=0, status="error"),    # a failure: not scored
        row(3, T0 + 1_000_000, T0 + 1_040_000, T0 + 1_140_000, out=6)]  # 40 ms, 140 ms, 6 tokens


def test_ground_truth_by_hand_and_replayed_from_the_first_send(tmp_path):
    e = read_experiment(recorded(tmp_path, GOOD))
    assert e.kind == "trace" and e.name == "rec" and e.scopes == ("summary",)
    assert (e.tp, e.max_num_seqs, e.max_num_batched_tokens, e.server.kv_blocks, e.server.gpu) == \
        (1, 128, 2048, 7463, "h100_sxm")
    s = e.truth["summary"]
    assert (s.n_success, s.n_failures) == (3, 1) and s.failure_rate == pytest.approx(0.25) and e.overload
    assert s.ttft_ms == pytest.approx((30 + 50 + 40) / 3)
    assert s.e2e_ms == pytest.approx((130 + 250 + 140) / 3)
    # E2E's 1st percentile, numpy's linear rule: 2 % of the way from 130 to 140 ms
    assert s.e2e_p1_ms == pytest.approx(130 + 0.02 * (140 - 130))
    # ITL per request (E2E − TTFT)/(tokens − 1): 100/10, 200/10, 100/5 ms; their mean
    assert s.itl_ms == pytest.approx((10 + 20 + 20) / 3)
    assert s.generated == pytest.approx((11 + 11 + 6) / 3) and s.prompt_len == 120
    r = e.requests()
    assert r.send_us.tolist() == [0, 500_000, 900_000, 1_000_000]      # from the first send
    assert r.first_chunk_us.tolist() == [30_000, 550_000, 0, 1_040_000]
    assert r.prompt_tokens.tolist() == [120] * 4
    assert r.cached_tokens().tolist() == [0, 96, 96, 96]                # 100-token prefix: 6 blocks
    # one stage at the mean sending rate: 3 gaps over 1 s
    assert e.stages[0].requests == 4 and e.stages[0].rate == pytest.approx(3.0)


def test_rows_in_completion_order_as_blis_observe_writes_them(tmp_path):
    # blis observe writes a row when its request completes: ids do not increase down the file.
    # The same requests as GOOD, in the order they finished (the failure at 0.9 s, then 0 at 0.13 s
    # ... sorted by last chunk, the failure first), are the same run, ordered by send time again.
    done = [GOOD[2], GOOD[0], GOOD[1], GOOD[3]]
    e = read_experiment(recorded(tmp_path, done))
    ref = read_experiment(recorded(tmp_path / "ref", GOOD))
    assert e.requests().request_id.tolist() == [0, 1, 2, 3]
    assert e.requests().send_us.tolist() == [0, 500_000, 900_000, 1_000_000]
    assert e.truth["summary"] == ref.truth["summary"]
    # warm-up requests are the first ones sent, whatever line they are on
    head = HEADER.replace("warm_up_requests: 0", "warm_up_requests: 1")
    warm = read_experiment(recorded(tmp_path / "w", [GOOD[3], GOOD[1], GOOD[0], GOOD[2]], head))
    assert warm.truth["summary"].ttft_ms == pytest.approx(45.0)      # request 0 (30 ms) not scored


def test_warm_up_requests_are_not_scored_and_deadlines_keep_their_distance(tmp_path):
    rows = [row(0, T0, T0 + 1000_000, T0 + 2000_000, deadline=T0 + 5_000_000)] + GOOD[1:]
    e = read_experiment(recorded(tmp_path, rows, HEADER.replace("warm_up_requests: 0", "warm_up_requests: 1")))
    assert e.warm_up == 1 and e.truth["summary"].n_success == 2
    assert e.truth["summary"].ttft_ms == pytest.approx(45.0)
    assert e.requests().deadline_us.tolist() == [5_000_000, 0, 0, 0]
    # blis observe: the deadline is on the (relative) arrival clock, the send on the wall clock —
    # the deadline keeps its distance from the request
    observed = row(0, T0, T0 + 10, T0 + 20).split(",")
    observed[COLUMNS.index("arrival_time_us")] = "1000"
    observed[COLUMNS.index("deadline_us")] = "2001000"
    r = read_data(recorded(tmp_path / "o", [",".join(observed)]) / "trace.csv")
    assert r.deadline_us.tolist() == [T0 + 2_000_000] and r.send_us.tolist() == [T0]


def test_server_input_tokens_replace_the_suffix_outside_a_prefix_group(tmp_path):
    rows = [row(0, T0, T0 + 10, T0 + 20, group="", prefix=0, inp=20, server_in=37),
            row(1, T0 + 5, T0 + 10, T0 + 20, group="g", prefix=50, inp=20, server_in=90)]
    r = read_data(recorded(tmp_path, rows) / "trace.csv")
    assert r.prompt_tokens.tolist() == [37, 70]          # BLIS's rule: the server's count, unless grouped


BAD = [
    ("unknown column", dict(columns=",".join(COLUMNS) + ",colour"), "trace.csv: line 1, column 28 'colour': unknown TraceV2 column"),
    ("missing column", dict(columns=",".join(c for c in COLUMNS if c != "send_time_us")), "column 'send_time_us': missing"),
    ("columns out of order", dict(columns=",".join(["client_id", "request_id"] + list(COLUMNS[2:]))), "line 1, column 1 'client_id': out of order"),
    ("duplicate id", dict(rows=[GOOD[0], GOOD[0]]), "line 3, column 'request_id': 0 repeats the id of line 2"),
    ("duplicate id, not adjacent", dict(rows=[GOOD[1], GOOD[0], GOOD[1]]), "line 4, column 'request_id': 1 repeats the id of line 2"),
    ("negative time", dict(rows=[row(0, -5, 10, 20)]), "line 2, column 'arrival_time_us': negative value -5"),
    ("missing time", dict(rows=[row(0, "", T0, T0)]), "line 2, column 'arrival_time_us': missing value"),
    ("not an integer", dict(rows=[row(0, T0, "1e3", T0)]), "line 2, column 'first_chunk_time_us': expected an integer"),
    ("success without a first chunk", dict(rows=[row(0, T0, 0, T0 + 5)]), "line 2, column 'first_chunk_time_us'"),
    ("last chunk before first", dict(rows=[row(0, T0, T0 + 50, T0 + 10)]), "line 2, column 'last_chunk_time_us': before the first chunk"),
    ("short row", dict(rows=[GOOD[0].rsplit(",", 3)[0]]), "line 2: 24 fields, expected 27"),
    ("no success", dict(rows=[row(0, T0, 0, 0, status="timeout")]), "trace.csv: no successful request"),
    ("no rows", dict(rows=[]), "trace.csv: no requests"),
    ("header: unknown key", dict(header=HEADER + "colour: red\n"), "trace.yaml: field 'colour': unknown TraceV2 header field"),
    ("header: version", dict(header=HEADER.replace("trace_version: 3", "trace_version: 4")), "field 'trace_version': expected 2 or 3"),
    ("header: unit", dict(header=HEADER.replace("microseconds", "ms")), "field 'time_unit'"),
    ("header: kv offload", dict(header=HEADER + "kv_offload:\n  cpu_bytes_to_use: 1\n"), "field 'kv_offload'"),
    ("header: all warm-up", dict(header=HEADER.replace("warm_up_requests: 0", "warm_up_requests: 4")), "field 'warm_up_requests': 4 of 4"),
    ("server: missing field", dict(server=SERVER.replace("kv_blocks: 7463\n", "")), "server.yaml: field 'kv_blocks': missing"),
    ("server: unknown field", dict(server=SERVER + "colour: red\n"), "server.yaml: field 'colour': unknown field"),
    ("server: bad gpu", dict(server=SERVER.replace("h100_sxm", "h900")), "server.yaml: field 'gpu'"),
    ("server: zero seqs", dict(server=SERVER.replace("max_num_seqs: 128", "max_num_seqs: 0")), "field 'max_num_seqs': expected an integer ≥ 1"),
]


@pytest.mark.parametrize("case,kw,msg", BAD, ids=[b[0] for b in BAD])
def test_bad_traces_and_descriptions_are_one_line_errors(tmp_path, case, kw, msg):
    rows = kw.pop("rows", GOOD)
    d = recorded(tmp_path, rows, **kw)
    with pytest.raises(RoofcalError) as err:
        read_experiment(d)
    text = str(err.value)
    assert msg in text and "\n" not in text


def test_missing_trace_file_is_named(tmp_path):
    d = recorded(tmp_path, GOOD)
    (d / "trace.csv").unlink()
    with pytest.raises(RoofcalError, match=r"trace\.csv: no such TraceV2 data file"):
        read_experiment(d)
    with pytest.raises(RoofcalError, match="server description"):
        read_trace_experiment(tmp_path / "nowhere" / "server.yaml")


def test_cli_refuses_a_bad_trace_with_one_line_and_writes_nothing(tmp_path):
    d = recorded(tmp_path, [GOOD[0], GOOD[0]])
    out = tmp_path / "v.csv"
    env = dict(os.environ, ROOFCAL_CACHE="off", ROOFCAL_BLIS="/bin/true")
    p = subprocess.run([sys.executable, "-m", "roofcal.cli", "workload", "validate", str(d), "--out", str(out)],
                       capture_output=True, text=True, env=env)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.count("\n") == 1 and "repeats the id of line 2" in p.stderr
    assert not out.exists()


def test_a_folder_of_recorded_and_inference_perf_runs(tmp_path):
    d = recorded(tmp_path, GOOD)
    assert [e.name for e in read_experiments([tmp_path])] == ["rec"]
    assert [e.name for e in read_experiments([d])] == ["rec"]

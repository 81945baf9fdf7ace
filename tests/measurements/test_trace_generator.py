"""The synthetic vLLM trace of the reader benchmark (:mod:`roofcal.bench.traces`) reads back."""

from roofcal.bench.traces import generate
from roofcal.measurements import traces as tr


def test_generated_trace_reads_back(tmp_path):
    g = generate(tmp_path / "t.json", 1.0, seed=3)
    assert 0.5e6 < g.bytes < 3e6
    d = tr.read_trace(g.path)
    s = d.summary
    assert s.truncated_lines == 0 and s.unknown_events == 0 and s.missing_steps == 0
    assert s.clock_backwards_steps == 0 and s.clock_backwards_requests == 0
    assert s.duplicate_steps == 0 and s.sampled_out_steps == 0
    assert s.lines == g.lines and s.events == g.events and s.steps == g.steps
    assert s.steps_snapshot > s.steps / 2
    assert s.steps_journey > 0
    assert s.requests == g.requests > 0
    assert s.unknown_scope_spans > 0
    # every step the generator wrote without snapshots was rebuilt from the journeys
    assert s.steps_snapshot == g.steps_with_snapshots
    assert s.steps_journey == g.steps - g.steps_with_snapshots


def test_same_seed_same_bytes(tmp_path):
    a = generate(tmp_path / "a.json", 0.3, seed=7)
    b = generate(tmp_path / "b.json", 0.3, seed=7)
    c = generate(tmp_path / "c.json", 0.3, seed=8)
    assert open(a.path, "rb").read() == open(b.path, "rb").read()
    assert open(a.path, "rb").read() != open(c.path, "rb").read()

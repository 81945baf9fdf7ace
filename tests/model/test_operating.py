"""The operating point of a sustained load (roofcal.model.operating, combine.at_compute_scale):
a burst prediction is exactly today's; compute-bound steps slow with the clock and memory-bound
ones do not; a prefill-heavy stream reaches the H100's power limit and a decode stream does not."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from roofcal.model import coeffs as C
from roofcal.model.combine import at_compute_scale, step_breakdown
from roofcal.model.operating import operating_point, power_of
from roofcal.physics.config import load_model
from roofcal.physics.hardware import load_gpu
from roofcal.physics.steps import Step, batch_steps

COEFFS = Path(__file__).resolve().parents[2] / "coeffs" / "h100_sxm.yaml"


@pytest.fixture(scope="module")
def c():
    return C.resolve_stack(C.load(COEFFS), None, required=True)


def test_burst_is_exactly_the_kernels_as_timed(c):
    spec, gpu = load_model("llama-2-7b-hf"), load_gpu("h100_sxm")
    b = batch_steps([Step(prefill=((2048, 0),)), Step(decode=(1024,) * 16), Step(prefill=((500, 1500),), decode=(900,) * 8)])
    t0 = np.asarray(step_breakdown(c.params, spec, gpu, 1, b)["total"])
    assert np.array_equal(t0, np.asarray(step_breakdown(at_compute_scale(c.params, None), spec, gpu, 1, b)["total"]))
    assert np.array_equal(t0, np.asarray(step_breakdown(at_compute_scale(c.params, 1.0), spec, gpu, 1, b)["total"]))


def test_compute_bound_time_follows_the_clock_memory_bound_does_not(c):
    spec, gpu = load_model("llama-2-7b-hf"), load_gpu("h100_sxm")
    b = batch_steps([Step(prefill=((8192, 0),)), Step(decode=(512,) * 8)])
    t1 = np.asarray(step_breakdown(c.params, spec, gpu, 1, b)["total"])
    t2 = np.asarray(step_breakdown(at_compute_scale(c.params, 1.1), spec, gpu, 1, b)["total"])
    ratio = t2 / t1
    assert 1.07 < ratio[0] <= 1.1          # an 8,192-token prefill is nearly all compute-bound
    assert ratio[1] < 1.01                 # 8 decodes read weights and KV: memory-bound


@pytest.mark.slow
def test_prefill_stream_is_power_limited_decode_stream_is_not(c):
    spec, gpu = load_model("qwen3-14b"), load_gpu("h100_sxm")
    pm = power_of(c, gpu)
    assert pm == c.power and pm.limit_w == 700.0
    # the fitted parameters at another limit (a board capped lower): a lower clock
    capped = power_of(c, gpu.replace(power_limit_w=500.0))
    assert capped.compute_w == pm.compute_w and capped.limit_w == 500.0
    prefill = operating_point(pm, c.params, spec, gpu, 1, batch_steps([Step(prefill=((8192, 0),))]))
    assert prefill.limited and 1250 < prefill.clock_mhz < 1500 and prefill.compute_scale > 1.08
    assert prefill.demand_w > 700 and prefill.power_w == pytest.approx(700.0, abs=2.0)
    decode = operating_point(pm, c.params, spec, gpu, 1, batch_steps([Step(decode=(1024,) * 16)]))
    assert not decode.limited and decode.compute_scale == 1.0 and decode.demand_w < 700
    assert "boost clock" in decode.text() and "power-limited" in prefill.text()


def test_without_a_power_limit_the_clock_is_the_bursts(c):
    gpu = load_gpu("h100_sxm").replace(power_limit_w=0.0)
    nofit = C.Coefficients(**{**C.load(COEFFS).__dict__})
    nofit.kernel_sets = {k: type(v)(**{**v.__dict__, "power": {}}) for k, v in nofit.kernel_sets.items()}
    assert power_of(nofit, gpu) is None
    op = operating_point(None, c.params, load_model("qwen3-14b"), gpu, 1, batch_steps([Step(prefill=((8192, 0),))]))
    assert op.compute_scale == 1.0 and not op.limited
    # a GPU whose file has no power fit takes the datasheet's defaults
    a100 = power_of(None, load_gpu("a100_sxm"))
    assert a100.limit_w == 400.0 and a100.compute_w == pytest.approx(2.46 * 400)


def test_power_block_round_trips_and_bad_fields_are_named(tmp_path):
    from roofcal.errors import RoofcalError
    from roofcal.io import yaml_load, yaml_text
    c = C.load(COEFFS)
    small = C.Coefficients(**{**c.__dict__, "kernel_sets": {"vllm-0.14.0": c.kernel_sets["vllm-0.14.0"]},
                              "stacks": {}, "stack": None, "kernels": "vllm-0.14.0",
                              "default_kernels": "vllm-0.14.0"})
    small = C.with_kernels(small, "vllm-0.14.0")
    path = tmp_path / "c.yaml"
    C.save(small, path)
    back = C.load(path)
    assert back.power == c.kernel_sets["vllm-0.14.0"].power["model"]
    doc = yaml_load(path.read_text())
    block = doc["kernel_sets"]["vllm-0.14.0"]["power"]
    for key, value, message in (("voltage_exponent", 4.0, "power.voltage_exponent' must be ≤ 3"),
                                ("idle_w", -1.0, "power.idle_w' must be ≥ 0"),
                                ("colour", 1, "power.colour' is not a power-block field")):
        bad = yaml_load(path.read_text())
        bad["kernel_sets"]["vllm-0.14.0"]["power"][key] = value
        (tmp_path / "bad.yaml").write_text(yaml_text(bad, sort_keys=False))
        with pytest.raises(RoofcalError, match=r"bad\.yaml: field 'kernel_sets\.vllm-0\.14\.0\." + message.replace(".", r"\.")):
            C.load(tmp_path / "bad.yaml")
    del block["window_ms"]
    (tmp_path / "bad.yaml").write_text(yaml_text(doc, sort_keys=False))
    with pytest.raises(RoofcalError, match=r"power\.window_ms' is missing"):
        C.load(tmp_path / "bad.yaml")

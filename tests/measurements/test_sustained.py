"""Reading a sustained-load measurement (roofcal.measurements.sustained) on the bundled H100 one:
phases, their settled step times, clocks and power, checked against the files by hand."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from roofcal.errors import RoofcalError
from roofcal.measurements.sustained import read_sustained

H100 = Path(__file__).resolve().parents[2] / "data" / "sustained" / "h100_sxm"


def test_bundled_h100_measurement():
    s = read_sustained(H100)
    assert s.gpu == "h100_sxm" and s.layers == 40
    assert s.gemms == ((7168, 5120), (5120, 5120), (34816, 5120), (5120, 17408))   # Qwen3-14B, TP 1
    assert s.max_clock_mhz == 1980.0 and 125.0 < s.idle_w < 135.0       # idle samples at 1,980 MHz: 128–135 W
    ph = {p.name: p for p in s.phases}
    assert list(ph) == ["prefill_m8192", "decode_m256", "prefill_m8192_again", "m64", "m1024",
                        "mixed_2048_then_256", "m8192_duty50"]
    assert ph["mixed_2048_then_256"].tokens == (2048, 256) and ph["m8192_duty50"].duty == 0.5
    # the windows from 5 s on: 41.044 ms (121 steps), 40.989 (120), 41.078 (121), 41.373 (1):
    # their step-weighted median is 41.044
    assert ph["m1024"].step_ms == 41.044
    assert ph["m1024"].first_ms == pytest.approx(39.6356, abs=1e-3)   # the median of its first 5 steps
    # a memory-bound stream keeps the maximum clock under the limit; compute-bound ones sit at it
    assert ph["m64"].sm_clock_mhz == 1980.0 and 640 < ph["m64"].power_w < 650
    for name in ("prefill_m8192", "decode_m256", "m1024", "mixed_2048_then_256"):
        assert 1320 <= ph[name].sm_clock_mhz <= 1410 and 695 < ph[name].power_w < 702
    # with idle gaps: the 1-s power average takes them in, the busy stretches' clock samples are lower
    duty = ph["m8192_duty50"]
    assert 440 < duty.power_w < 480 and 1400 < duty.busy_clock_mhz < 1500 < duty.sm_clock_mhz
    # the phases without t_start follow one another from the first busy sample: 50 s of 8,192-token
    # steps give 5 samples a second from 5 s after the start to 1 s before the end
    assert 220 <= ph["prefill_m8192"].samples <= 235
    assert ph["m1024"].flops == 27058293964800


def test_bad_measurements_are_one_line_errors(tmp_path):
    d = tmp_path / "m"
    shutil.copytree(H100, d)
    doc = json.loads((d / "sustained2.json").read_text())
    doc["m64"]["windows"][1]["step_ms"] = "fast"
    (d / "sustained2.json").write_text(json.dumps(doc))
    with pytest.raises(RoofcalError, match=r"sustained2.json: phase 'm64': field 'windows\[1\].step_ms' must be a number"):
        read_sustained(d)
    shutil.copy(H100 / "sustained2.json", d / "sustained2.json")
    lines = (d / "smi_trace.csv").read_text().splitlines()
    lines[3] = "2026/11/27 13:00:54.735, fast, 2619 MHz, 110.39 W, 36"
    (d / "smi_trace.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(RoofcalError, match=r"smi_trace.csv: line 4: expected 'timestamp, clocks.sm MHz"):
        read_sustained(d)
    (d / "burst_gemm_qwen3_14b_tp1.csv").unlink()
    with pytest.raises(RoofcalError, match="expected one burst_\\*.csv"):
        read_sustained(d)
    with pytest.raises(RoofcalError, match="no such sustained-measurement folder"):
        read_sustained(tmp_path / "nowhere")

"""roofcal probe's analysis (roofcal.measurements.probe) on the bundled H100 measurement: the
datasheet overlay it writes, and that the overlay is a datasheet every reader takes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from roofcal.errors import RoofcalError
from roofcal.io import yaml_load
from roofcal.measurements.probe import layer_gemms, overlay_of, write_overlay
from roofcal.physics.hardware import load_gpu
from roofcal.physics.hardware.datasheet import overlay_sustained

H100 = Path(__file__).resolve().parents[2] / "data" / "sustained" / "h100_sxm"


def test_layer_gemms_are_the_measured_ones():
    # the probe times the same four GEMMs the H100 measurement did (Qwen3-14B, TP 1)
    assert [(n, k) for _, n, k in layer_gemms("qwen3-14b")] == \
        [(7168, 5120), (5120, 5120), (34816, 5120), (5120, 17408)]
    with pytest.raises(RoofcalError, match="MoE"):
        layer_gemms("mixtral-8x7b-v0.1")


def test_overlay_of_the_h100_measurement():
    ov = overlay_of(H100, "h100_sxm")
    # that measurement did not record nvidia-smi's power.limit: the plateau of the phases that sat
    # at it (697.2–699.3 W) stands in
    assert ov["power_limit_w"] == 698.0 and "plateau" in ov["notes"][0]
    assert ov["boost_clock_mhz"] == 1980.0
    m = ov["measured"]
    assert m["bf16_tflops_8192"] == pytest.approx(811.74, abs=0.01) and m["read_tbs"] == pytest.approx(3.08, abs=0.01)
    # 256 tokens back to back: 12.675 ms after 5 s against 11.51 ms for the first steps: +10 %
    assert m["sustained_over_first_steps"]["decode_m256"] == pytest.approx(12.675 / 11.5116, abs=1e-3)
    assert m["sustained_over_first_steps"]["m64"] == pytest.approx(1.0, abs=0.01)


def test_an_overlay_is_a_datasheet_of_its_base(tmp_path):
    d = tmp_path / "probe"
    shutil.copytree(H100, d)
    peaks = json.loads((d / "burst_peaks.json").read_text())
    peaks.update(power_limit_w=650.0, max_sm_clock_mhz=1980.0)        # what a probe records from nvidia-smi
    (d / "burst_peaks.json").write_text(json.dumps(peaks))
    path = write_overlay(d, "h100_sxm")
    assert path == d / "overlay.yaml" and yaml_load(path.read_text())["sustained"] == "."
    g = load_gpu(str(path))
    assert g.name == "h100_sxm" and g.power_limit_w == 650.0 and "nvidia-smi power.limit" in path.read_text()
    assert g.sha256() == load_gpu("h100_sxm").sha256()        # the H100 coefficient files apply
    assert overlay_sustained(path) == d
    bad = tmp_path / "bad.yaml"
    bad.write_text(path.read_text().replace("base: h100_sxm", "base: h900"))
    with pytest.raises(RoofcalError, match="unknown GPU 'h900'"):
        load_gpu(str(bad))
    bad.write_text(path.read_text() + "colour: red\n")
    with pytest.raises(RoofcalError, match="bad.yaml: unknown field 'colour'"):
        load_gpu(str(bad))


def test_a_measurement_that_never_reached_a_limit_is_refused(tmp_path):
    d = tmp_path / "cool"
    shutil.copytree(H100, d)
    doc = json.loads((d / "sustained2.json").read_text())
    (d / "sustained2.json").write_text(json.dumps({"m64": doc["m64"]}))
    (d / "sustained.json").unlink()
    (d / "smi_trace.csv").unlink()
    with pytest.raises(RoofcalError, match="no power limit recorded and no phase sat at one"):
        overlay_of(d, "h100_sxm")

"""Serving stacks in coefficient files: named, recorded, chosen explicitly; CPU–GPU overlap."""

import math
import re

import jax.numpy as jnp
import numpy as np
import pytest

from roofcal.errors import RoofcalError
from roofcal.io import yaml_load, yaml_text
from roofcal.model import coeffs as coeff_io
from roofcal.model import correction as K
from roofcal.model.coeffs import Coefficients, Stack
from roofcal.model.combine import NON_COMPONENT, step_breakdown
from roofcal.model.predict import predict
from roofcal.physics.config import load_model
from roofcal.physics.hardware import load_gpu
from roofcal.physics.steps import Step, batch_steps

H100 = load_gpu("h100_sxm")
LLAMA7 = load_model("llama-2-7b-hf")


def _stack(step_us=0.0, decode_seq_us=0.0, layer_us=0.0, q=None, source=None) -> Stack:
    p = K.neutral_step_params()
    o = np.asarray(p["overheads"]).copy()
    for name, v in (("step_us", step_us), ("decode_seq_us", decode_seq_us), ("layer_us", layer_us)):
        if v:
            o[K.STEP_OVERHEADS.index(name)] = math.log(v)
    p = {**p, "overheads": jnp.asarray(o, jnp.float32)}
    if q is not None:
        p["overlap"] = jnp.asarray(K.softplus_inv(q - 1.0), jnp.float32)
    return Stack(p, {"queueing_us": 1000.0, "post_decode_us": 0.0, "output_token_us": 20.0},
                 source or {"kind": "test"})


def _breakdown(c: Coefficients, steps):
    return {k: np.asarray(v, np.float64) for k, v in
            step_breakdown(c.params, LLAMA7, H100, 1, batch_steps(steps)).items()}


@pytest.mark.slow
def test_overlap_combines_cpu_and_gpu_work_as_documented():
    steps = [Step(decode=(1000,) * 8)]
    neutral = Coefficients.neutral(H100)
    gpu = _breakdown(neutral, steps)["total"][0]                          # kernels only
    cpu = 2000.0 + 8 * 50.0                                                # step + 8 decode sequences, µs
    serial = coeff_io.add_stack(neutral, "serial", _stack(2000.0, 50.0))
    assert _breakdown(serial, steps)["total"][0] == pytest.approx(gpu + cpu, rel=1e-5)
    assert _breakdown(serial, steps)["overlap"][0] == 0.0
    for q in (2.0, 8.0):
        c = coeff_io.add_stack(neutral, "soft", _stack(2000.0, 50.0, q=q))
        out = _breakdown(c, steps)
        want = (gpu ** q + cpu ** q) ** (1 / q)                            # the soft max, by hand
        assert out["total"][0] == pytest.approx(want, rel=1e-4)
        # the breakdown still sums to the total: overlap = hidden CPU time, ≤ 0
        parts = sum(v for k, v in out.items() if k not in NON_COMPONENT)
        assert parts[0] == pytest.approx(out["total"][0], rel=1e-5)
        assert out["overlap"][0] == pytest.approx(want - gpu - cpu, rel=1e-4) and out["overlap"][0] < 0
    # launch gaps per layer are GPU work: they never hide behind the CPU
    c = coeff_io.add_stack(neutral, "gaps", _stack(layer_us=10.0, q=50.0))
    assert _breakdown(c, steps)["total"][0] == pytest.approx(gpu + 32 * 10.0, rel=1e-4)


def test_stacks_round_trip_through_the_file_with_their_source(tmp_path):
    c = coeff_io.add_stack(Coefficients.neutral(H100), "splitwise", _stack(100.0, source={"kind": "steps", "data": []}))
    c = coeff_io.add_stack(c, "vllm", _stack(2000.0, 50.0, q=3.0, source={"kind": "workload calibration"}), default=True)
    path = tmp_path / "c.yaml"
    coeff_io.save(c, path)
    doc = yaml_load(path.read_text())
    assert doc["schema"] == "roofcal-coeffs/3" and doc["stack"] == "vllm"
    assert doc["stacks"]["vllm"]["overlap_sharpness"] == pytest.approx(3.0)
    assert doc["stacks"]["vllm"]["overheads_us"]["step_us"] == pytest.approx(2000.0)
    assert doc["stacks"]["vllm"]["alphas_us"] == {"queueing_us": 1000.0, "post_decode_us": 0.0, "output_token_us": 20.0}
    back = coeff_io.load(path)
    assert back.stack == "vllm" and set(back.stacks) == {"splitwise", "vllm"}
    assert back.stacks["vllm"].source == {"kind": "workload calibration"}
    steps = [Step(decode=(500,) * 4)]
    np.testing.assert_allclose(_breakdown(back, steps)["total"], _breakdown(c, steps)["total"], rtol=1e-6)
    other = coeff_io.resolve_stack(back, "splitwise")
    assert other.stack == "splitwise" and "overlap" not in other.params["step"]


def test_a_file_without_a_stack_is_never_used_for_steps_by_accident(tmp_path):
    path = tmp_path / "kernels.yaml"
    coeff_io.save(Coefficients.neutral(H100), path)
    steps = [Step(decode=(500,) * 4)]
    with pytest.raises(RoofcalError, match="no serving stack.*--stack none") as refused:
        predict(steps, model="llama-2-7b-hf", gpu="h100_sxm", tp=1, coeffs=str(path))
    df = predict(steps, model="llama-2-7b-hf", gpu="h100_sxm", tp=1, coeffs=str(path), stack="none")
    assert df["stack"].tolist() == ["none"] and df["overhead_us"].iloc[0] < 1e-6          # neutral: 1e-9 µs each
    # the stack the refusal suggests borrowing is a real one: the H100 file's
    borrowed = re.search(r"--stack (\S+:vllm) ", str(refused.value)).group(1)
    assert coeff_io.resolve_stack(coeff_io.load(path), borrowed).stack == "vllm"
    # borrowing a stack from another file names the file and its hash
    donor = tmp_path / "donor.yaml"
    coeff_io.save(coeff_io.add_stack(Coefficients.neutral(H100), "vllm", _stack(2000.0)), donor)
    c = coeff_io.resolve_stack(coeff_io.load(path), f"{donor}:vllm")
    assert c.stack == "vllm" and c.stacks["vllm"].source["borrowed_from"]["file"] == str(donor)
    df = predict(steps, model="llama-2-7b-hf", gpu="h100_sxm", tp=1, coeffs=str(path), stack=f"{donor}:vllm")
    assert df["overhead_us"].iloc[0] == pytest.approx(2000.0, rel=1e-5)
    with pytest.raises(RoofcalError, match="no serving stack 'nope'"):
        coeff_io.resolve_stack(coeff_io.load(donor), "nope")


def test_bad_stack_fields_are_refused_with_the_field_named(tmp_path):
    c = coeff_io.add_stack(Coefficients.neutral(H100), "vllm", _stack(2000.0))
    path = tmp_path / "c.yaml"
    coeff_io.save(c, path)
    text = path.read_text()
    for old, new, field in (("overlap_sharpness: 1.0", "overlap_sharpness: 0.5", "stacks.vllm.overlap_sharpness"),
                            ("queueing_us: 1000.0", "queueing_us: -1.0", "stacks.vllm.alphas_us.queueing_us"),
                            ("stack: vllm", "stack: other", "stack")):
        bad = tmp_path / "bad.yaml"
        bad.write_text(text.replace(old, new))
        with pytest.raises(RoofcalError, match=field.replace(".", r"\.")):
            coeff_io.load(bad)


def test_schema_1_files_read_as_one_named_stack(tmp_path):
    c = coeff_io.add_stack(Coefficients.neutral(H100), "x", _stack(300.0))
    doc = yaml_load(coeff_io.to_yaml(c))
    st = doc.pop("stacks")["x"]
    doc.pop("stack")
    ks = doc.pop("kernel_sets")[doc.pop("kernels")]
    doc["ops"] = ks["ops"]
    doc["schema"] = "roofcal-coeffs/1"
    doc["step"] = {k: st[k] for k in ("overheads_us", "kernel_scales", "mix_sharpness")}
    path = tmp_path / "old.yaml"
    path.write_text(yaml_text(doc, sort_keys=False))
    back = coeff_io.load(path)
    assert back.stack == "schema-1" and back.stacks["schema-1"].source == {"kind": "schema-1 file"}
    assert float(np.exp(back.params["step"]["overheads"][0])) == pytest.approx(300.0, rel=1e-6)

"""Whole-step measurements: the splitwise loader and the step-level fit on real data."""

import numpy as np
import pytest

from roofcal.model import coeffs as coeff_io
from roofcal.measurements import datasets
from roofcal.errors import RoofcalError
from roofcal.calibration.fit import FitSettings, fit_steps, split_groups, step_metrics, step_predictions
from roofcal.measurements.stepdata import read_splitwise, read_step_jsonl

SPLITWISE = "data/steps/splitwise/llama2-70b_h100-80gb_tp4_tp8.csv"


def test_splitwise_rows_become_prefill_and_mean_decode_steps():
    sets = read_splitwise(SPLITWISE)
    assert [d.tp for d in sets] == [4, 8] and all(len(d) == 210 for d in sets)
    d = sets[0].describe()
    # first CSV row: prompt 512, batch 1, 128 generated, prompt_time 59.5557 ms, token_time 29.7623 ms
    pre, dec = d.iloc[0], d.iloc[105]
    assert (pre.phase, pre.batch_size, pre.prefill_tokens) == ("prefill", 1, 512)
    assert pre.measured_us == pytest.approx(59555.72199309245)
    # mean decode iteration: context grows 512 → 639, represented at 512 + 127/2
    assert (dec.phase, dec.batch_size, dec.decode_context) == ("decode", 1, 575.5)
    assert dec.measured_us == pytest.approx(29762.305037895818)


def test_step_level_fit_predicts_held_out_decode_configurations():
    sets = read_splitwise(SPLITWISE)
    kernels = coeff_io.load("coeffs/h100_sxm.yaml", "h100_sxm").params["ops"]
    tests = [split_groups(d.config, 0.2, 1) for d in sets]
    params = fit_steps(sets, kernels, FitSettings(progress=False, step_iters=300), [~t for t in tests])
    overheads = np.exp(np.asarray(params["step"]["overheads"]))
    assert (overheads >= 0).all() and np.isfinite(overheads).all()
    pred = step_predictions(sets, params)
    held = step_metrics(pred, np.concatenate(tests))["heldout"]
    assert held["steps/decode"]["mape"] < 10.0           # measured: 2.5 %
    assert held["steps/prefill"]["mape"] < 30.0          # measured: 18 % (see README)


def test_step_jsonl_needs_durations_and_deployment(tmp_path):
    p = tmp_path / "s.jsonl"
    p.write_text('{"decode": [100], "duration_us": 5000}\n')
    with pytest.raises(RoofcalError, match="no model"):
        read_step_jsonl(p)
    [d] = read_step_jsonl(p, model="llama-2-7b-hf", gpu="h100_sxm", tp=1)
    assert (d.tp, d.gpu, list(d.measured_us)) == (1, "h100_sxm", [5000.0])
    p.write_text('{"decode": [100]}\n')
    with pytest.raises(RoofcalError, match="duration_us"):
        read_step_jsonl(p, model="llama-2-7b-hf", gpu="h100_sxm", tp=1)


def test_bundled_dataset_resolution():
    m = datasets.load(datasets.bundled_paths("a100_sxm"), gpu="a100_sxm")
    assert len(m.ops) == 26689 and not m.steps
    assert all(p["sha256"] and p["rows"] > 0 for p in m.provenance)
    with pytest.raises(RoofcalError, match="no bundled measurements for GPU 'l4'"):
        datasets.bundled_paths("l4")

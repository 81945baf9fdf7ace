"""Export to BLIS: goldens check, realistic sampler, BLIS-form fitting, defaults.yaml line
surgery, BLIS-form files, hardware entries, and a refusal for every invalid input."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from roofcal.blis.basis import BlisHardware, basis_for_constants, blis_step_time_float
from roofcal.blis.form import BlisForm, blis_flags, form_to_yaml, load_form, save_form
from roofcal.blis.distill import export_blis
from roofcal.blis.hardware_json import gemm_mfu, hardware_for_gpu, merge_hardware_entry
from roofcal.blis.defaults_yaml import (
    read_defaults_coefficients,
    replace_coefficients,
    strict_yaml_load,
    yaml_float,
)
from roofcal.blis.fit import BETA_BASIS, Deployment, Rows, design_matrix, fit_betas, resolve_deployment
from roofcal.blis.sampling import (
    SamplerSettings,
    blis_requests_from_steps,
    deployment_seed,
    kv_capacity_tokens,
    sample_steps,
    to_step_records,
)
from roofcal.cli.main import main
from roofcal.io import sha256_file, yaml_load, yaml_text
from roofcal.physics.config import load_model
from roofcal.errors import RoofcalError
from roofcal.physics.hardware import load_gpu
from roofcal.physics.steps import Step, batch_steps, step_totals, uniform_steps

ROOT = Path(__file__).resolve().parents[2]
DEFAULTS = ROOT / "data" / "blis" / "defaults.yaml"
HWCONFIG = ROOT / "data" / "blis" / "hardware_config.json"
GOLDENS = ROOT / "data" / "blis" / "trained_physics_goldens.json"
H100_COEFFS = ROOT / "coeffs" / "h100_sxm.yaml"
A100_COEFFS = ROOT / "coeffs" / "a100_sxm.yaml"
H100 = BlisHardware(tflops_peak=989.5, tflops_fp8=1979.0, bw_peak_tbs=3.35)
BETA11 = (0.152128, 0.0, 1.36252915, 0.752037, 32.09546717, 4.41684444, 126.024825, 481.8613888, 0.0, 1.94710771, 0.752037)
ALPHA = (15563.199579, 777.3455, 45.907545)
SAMPLES = "300"


def run(capsys, *argv) -> tuple[int, str, str]:
    """``roofcal ARGV`` in-process: (exit status, stdout, stderr)."""
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exit_:  # ``blis check`` exits 1 on a mismatch
        code = exit_.code
    out = capsys.readouterr()
    return code, out.out, out.err


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("roofcal: error: "), err
    return lines[0]


def dup_free_load(text: str):
    """Strict YAML: PyYAML safe loader that also refuses duplicate keys."""
    return strict_yaml_load(text, "test")


# ------------------------------------------------------------------------------------------
# blis check


def test_blis_check_bundled_goldens(capsys):
    code, out, _ = run(capsys, "blis", "check", "--goldens", GOLDENS)
    assert code == 0
    assert out.strip() == "294 cases, largest absolute difference 0 µs"


def _goldens_copy(tmp_path, n_cases=4, bump=0) -> Path:
    data = json.loads(GOLDENS.read_text())
    for entry in data["model_configs"].values():
        entry["path"] = str((GOLDENS.parent / entry["path"]).resolve())
    data["cases"] = data["cases"][:n_cases]
    data["cases"][0]["step_time_us"] += bump
    path = tmp_path / "goldens.json"
    path.write_text(json.dumps(data))
    return path


def test_blis_check_mismatch_exits_1(tmp_path, capsys):
    code, out, _ = run(capsys, "blis", "check", "--goldens", _goldens_copy(tmp_path, bump=7))
    assert code == 1
    assert "4 cases, largest absolute difference 7 µs" in out and "1 of 4 cases differ" in out


def test_blis_check_bad_goldens_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    code, _, err = run(capsys, "blis", "check", "--goldens", bad)
    assert code == 2 and "bad.json" in one_error_line(err)
    code, _, err = run(capsys, "blis", "check", "--goldens", tmp_path / "missing.json")
    assert code == 2 and "no such goldens file" in one_error_line(err)


# ------------------------------------------------------------------------------------------
# sampler


def _sample(model="llama-2-70b-hf", tp=4, n=400, seed=0):
    spec, gpu = load_model(model), load_gpu("h100_sxm")
    return sample_steps(deployment_seed(seed, model, tp), n, 4096, kv_capacity_tokens(spec, gpu, tp))


def test_sampler_deterministic_and_seeded():
    a, b, c = _sample(), _sample(), _sample(seed=1)
    for name in ("input_len", "progress_index", "num_new_tokens", "num_output_tokens", "mask"):
        assert np.array_equal(getattr(a.requests, name), getattr(b.requests, name))
    assert np.array_equal(a.steps.decode_ctx, b.steps.decode_ctx) and np.array_equal(a.phase, b.phase)
    assert not np.array_equal(a.steps.decode_ctx, c.steps.decode_ctx)


def test_sampler_is_a_plausible_vllm_server():
    s = _sample(n=2000)
    t = step_totals(s.steps)
    settings = SamplerSettings()
    assert set(s.phase) == {"prefill", "decode", "mixed"}
    assert np.all(t.tokens >= 1) and np.all(t.tokens <= max(settings.token_budgets))
    assert np.all(t.n_prefill + t.n_decode <= settings.max_num_seqs)
    assert t.n_decode.max() > 100 and t.n_decode[s.phase == "decode"].min() >= 1
    m = s.steps.decode_mask > 0
    assert s.steps.decode_ctx[m].max() < 4096 and s.steps.decode_ctx[m].min() >= 1
    full = (s.steps.prefill_new + s.steps.prefill_cached)[s.steps.prefill_mask > 0]
    assert full.max() <= 4096 and (s.steps.prefill_cached > 0).any()  # chunked prefills in progress
    # BLIS classifies every sampled request as roofcal does (doc §1.2)
    r = s.requests
    prefill = r.mask & (r.progress_index < r.input_len)
    decode = r.mask & ~prefill & (r.num_output_tokens > 0)
    assert np.array_equal(prefill.sum(1), t.n_prefill) and np.array_equal(decode.sum(1), t.n_decode)
    assert np.array_equal(np.where(prefill, r.num_new_tokens, 0).sum(1), t.prefill_tokens)
    assert np.array_equal(np.where(decode, r.progress_index, 0).sum(1), (s.steps.decode_ctx * m).sum(1))
    assert np.all(r.input_len[prefill] >= r.progress_index[prefill] + r.num_new_tokens[prefill])  # true prompt
    assert len(to_step_records(s)) == len(s)


def test_sampler_respects_kv_capacity_and_refuses_models_that_do_not_fit():
    spec, gpu = load_model("llama-2-70b-hf"), load_gpu("h100_sxm")
    s = sample_steps(deployment_seed(0, "x", 4), 500, 4096, 20000)
    used = (s.steps.decode_ctx * s.steps.decode_mask).sum(1)
    assert np.all((used <= 20000) | (s.steps.decode_mask.sum(1) == 1))
    with pytest.raises(RoofcalError, match="does not fit"):
        kv_capacity_tokens(spec, gpu, 1)


def test_measured_steps_map_to_blis_requests():
    steps = [Step(((100, 0), (50, 200)), (10, 20)), Step((), (5,)), Step(((8, 0),), ())]
    r = blis_requests_from_steps(batch_steps(steps))
    assert r.mask.sum(1).tolist() == [4, 1, 1]
    prefill = r.mask & (r.progress_index < r.input_len)
    decode = r.mask & ~prefill & (r.num_output_tokens > 0)
    assert prefill.sum() == 3 and decode.sum() == 3
    assert sorted(r.input_len[0][r.mask[0]].tolist()) == [10, 20, 100, 250]  # cached + new; decode: context
    # uniform_steps multiplicities expand to that many requests
    u = blis_requests_from_steps(uniform_steps([4, 0], [512, 1], [0, 0], [0, 3], [0, 700.4]))
    assert u.mask.sum(1).tolist() == [4, 3]
    assert (u.num_new_tokens[0][u.mask[0]] == 512).all() and (u.progress_index[1][u.mask[1]] == 700).all()
    with pytest.raises(RoofcalError, match="multiplicities"):
        blis_requests_from_steps(uniform_steps([1.5], [10], [0], [0], [0]))


# ------------------------------------------------------------------------------------------
# fitting


def _planted_rows(beta, deployments=(("llama-2-7b-hf", 1), ("llama-3.1-8b-instruct", 2), ("llama-2-70b-hf", 4))):
    parts = []
    for i, (model, tp) in enumerate(deployments):
        r = resolve_deployment(Deployment(model, tp), H100)
        s = _sample(model, tp, n=300, seed=i)
        basis = {k: np.asarray(v) for k, v in basis_for_constants(r.constants, s.requests).items()}
        target = np.asarray(blis_step_time_float(basis, list(beta)))
        test = np.arange(len(s)) % 5 == 0
        parts.append(Rows("distill", basis, target, target, s.phase, np.full(len(s), model), test))
    from roofcal.blis.fit import concat_rows

    return concat_rows(parts)


def test_design_matrix_is_blis_float_step_time():
    rows = _planted_rows(BETA11, (("llama-2-7b-hf", 1),))
    assert np.allclose(design_matrix(rows.basis) @ np.array(BETA11), rows.target_us, rtol=1e-12)
    assert len(BETA_BASIS) == 11


def test_fit_recovers_planted_betas_and_keeps_unidentifiable_ones():
    planted = (0.8, 1.3, 1.2, 3.0, 20.0, 6.0, 300.0, 77.0, 0.5, 1.7, 2.2)
    rows = _planted_rows(planted)
    fit = fit_betas([rows], BETA11, iters=300, prior_rows=1e-9)  # noise-free: the data decide alone
    # β8 (interleaved MoE) and β_EP (DP dispatch) have no data for dense TP-only models: kept
    assert fit.kept == (7, 10)
    assert fit.beta[7] == BETA11[7] and fit.beta[10] == BETA11[10]
    for i in set(range(11)) - {7, 10}:
        assert fit.beta[i] == pytest.approx(planted[i], rel=1e-4), i
    # with the default tie-breaking prior, weakly determined betas may move but predictions do not
    default = fit_betas([rows], BETA11)
    pred = design_matrix(rows.basis) @ np.array(default.beta)
    assert np.max(np.abs(pred / rows.target_us - 1)) < 1e-3


def test_fit_is_non_negative_and_deterministic():
    planted = np.array(BETA11) * np.array([1, 0, 1, 1, 1, 1, 1, 1, 0, 1, 1])
    rows = _planted_rows(planted)
    rows = Rows(rows.source, rows.basis, np.maximum(rows.target_us - 0.9 * rows.basis["t_weight_us"], 1.0),
                None, rows.phase, rows.label, rows.test)  # wants a negative weight coefficient
    a, b = fit_betas([rows], BETA11), fit_betas([rows], BETA11)
    assert all(v >= 0 for v in a.beta) and all(math.isfinite(v) for v in a.beta)
    assert a == b


# ------------------------------------------------------------------------------------------
# defaults.yaml surgery


NEW_BETA = (0.0, 1e-05, 1.25, 22.5, 198.5, 284.25, 13444.125, 481.861389, 2802.5, 0.97, 0.752037)


def test_replace_keeps_every_other_byte_and_reads_back():
    text = DEFAULTS.read_bytes().decode("utf-8")
    new = replace_coefficients(text, ALPHA, NEW_BETA, "roofcal test provenance")
    old_lines, new_lines = text.splitlines(keepends=True), new.splitlines(keepends=True)
    assert len(old_lines) == len(new_lines)
    changed = [i for i, (a, b) in enumerate(zip(old_lines, new_lines)) if a != b]
    assert len(changed) == 1 and old_lines[changed[0]].lstrip().startswith("beta_coeffs:")
    assert new_lines[changed[0]].rstrip("\n").endswith("# roofcal test provenance")
    doc = dup_free_load(new)
    assert doc["trained_physics_coefficients"]["beta_coeffs"] == list(NEW_BETA)
    assert doc["trained_physics_coefficients"]["alpha_coeffs"] == list(ALPHA)
    assert all(isinstance(v, float) for v in doc["trained_physics_coefficients"]["beta_coeffs"])
    # a second export replaces the first one's line (comment included), nothing accumulates
    again = replace_coefficients(new, [1.0, 2.0, 3.0], BETA11, "second")
    lines = again.splitlines(keepends=True)
    assert len(lines) == len(old_lines)
    diff = [i for i, (a, b) in enumerate(zip(old_lines, lines)) if a != b]
    assert [old_lines[i].split(":")[0].strip() for i in diff] == ["alpha_coeffs", "beta_coeffs"]
    assert again.count("roofcal test provenance") == 0 and again.count("# second") == 1


def test_replace_handles_block_lists_and_crlf():
    text = ("# head\r\ntrained_physics_coefficients:\r\n  alpha_coeffs:\r\n    - 1\r\n    - 2\r\n    - 3  # old\r\n"
            "  beta_coeffs: [1, 2, 3, 4, 5, 6, 7]\r\nversion: 0.0.1\r\n")
    new = replace_coefficients(text, (4.0, 5.0, 6.0), NEW_BETA, "c")
    assert new.startswith("# head\r\ntrained_physics_coefficients:\r\n  alpha_coeffs: [4.0, 5.0, 6.0]  # ")
    assert new.endswith("# c\r\nversion: 0.0.1\r\n")
    assert dup_free_load(new)["trained_physics_coefficients"]["beta_coeffs"] == list(NEW_BETA)


@pytest.mark.parametrize("text, message", [
    ("defaults: {}\nversion: 1\n", "trained_physics_coefficients' missing"),
    ("trained_physics_coefficients: {alpha_coeffs: [1, 2, 3], beta_coeffs: [1, 2, 3, 4, 5, 6, 7]}\n", "block mapping"),
    ("trained_physics_coefficients:\n  alpha_coeffs: 3\n  beta_coeffs: [1, 2, 3, 4, 5, 6, 7]\n", "list of numbers"),
    ("trained_physics_coefficients:\n  alpha_coeffs: [1, 2, 3]\n", "beta_coeffs' missing"),
    ("trained_physics_coefficients:\n  alpha_coeffs: [1, 2, 3]\n  alpha_coeffs: [1, 2, 3]\n"
     "  beta_coeffs: [1, 2, 3, 4, 5, 6, 7]\n", "duplicate key"),
    ("trained_physics_coefficients:\n  alpha_coeffs: [1, x, 3]\n  beta_coeffs: [1, 2, 3, 4, 5, 6, 7]\n", "expected a number"),
    ("a: [\n", "test.yaml"),
])
def test_replace_refuses_bad_defaults(text, message):
    with pytest.raises(RoofcalError, match=message):
        replace_coefficients(text, ALPHA, BETA11, "c", "test.yaml")


def test_yaml_float_round_trips_in_yaml_1_1():
    for x in (0.0, 1e-05, 2.5e-12, 1e16, 13444.1368, 0.152128, 3.0):
        text = yaml_float(x)
        assert yaml.safe_load(text) == x and isinstance(yaml.safe_load(text), float), text
    assert blis_flags([1.0, 2.0, 3.0], [1e-05] * 7) == "--alpha-coeffs 1.0,2.0,3.0 --beta-coeffs " + ",".join(["1.0e-05"] * 7)


# ------------------------------------------------------------------------------------------
# BLIS-form files


def _form(**changes) -> BlisForm:
    base = dict(alpha=ALPHA, beta=BETA11, hardware="H100",
                hardware_calib=H100,
                deployments=(Deployment("llama-2-70b-hf", 4),), alpha_source="kept", provenance={"method": "test"},
                metrics={"heldout": {"distill": {"all": {"n": 5, "blis_mape": 3.0}}}})
    base.update(changes)
    return BlisForm(**base)


def test_form_round_trip(tmp_path):
    path = tmp_path / "f.yaml"
    save_form(_form(), path)
    back = load_form(path)
    assert back.alpha == ALPHA and back.beta == BETA11 and back.hardware == "H100"
    assert back.deployments == (Deployment("llama-2-70b-hf", 4),)
    assert form_to_yaml(back) == path.read_text()


def _edit(tmp_path, old: str, new: str) -> Path:
    path = tmp_path / "f.yaml"
    text = form_to_yaml(_form())
    assert old in text
    path.write_text(text.replace(old, new, 1))
    return path


BETA_TEXT = "beta: [0.152128, 0.0, 1.36252915, 0.752037, 32.09546717, 4.41684444, 126.024825, 481.8613888, 0.0, 1.94710771, 0.752037]"


@pytest.mark.parametrize("old, new, message", [
    (BETA_TEXT, "beta: [0.1, -0.5, 1, 1, 1, 1, 1]", r"BetaCoeffs\[1\] must be non-negative"),
    (BETA_TEXT, "beta: [0.1, .nan, 1, 1, 1, 1, 1]", r"BetaCoeffs\[1\] is NaN"),
    (BETA_TEXT, "beta: [0.1, .inf, 1, 1, 1, 1, 1]", r"BetaCoeffs\[1\] is Inf"),
    (BETA_TEXT, "beta: [1, 1, 1, 1, 1, 1]", "at least 7 elements, got 6"),
    (BETA_TEXT, "beta: [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]", "12 beta values"),
    (BETA_TEXT, "beta: [1, 1, true, 1, 1, 1, 1]", "expected a number"),
    ("alpha: [15563.199579, 777.3455, 45.907545]", "alpha: [1.0, 2.0]", "AlphaCoeffs requires at least 3"),
    ("alpha: [15563.199579, 777.3455, 45.907545]", "alpha: [1.0, 2.0, -3.0]", r"AlphaCoeffs\[2\] must be non-negative"),
    ("schema: roofcal-blis/1", "schema: roofcal-blis/2", "schema"),
    ("roofcal_version: 0.1.0", "roofcal_version: 0.1.0\nextra: 1", "unknown field 'extra'"),
    ("tp: 4", "tp: 0", "deployments"),
    ("BwPeakTBs: 3.35", "BwPeakTBs: 0", "BwPeakTBs"),
])
def test_form_refusals(tmp_path, old, new, message):
    with pytest.raises(RoofcalError, match=message):
        load_form(_edit(tmp_path, old, new))
    # …and export writes nothing
    out = tmp_path / "out.yaml"
    with pytest.raises(RoofcalError, match=message):
        export_blis(tmp_path / "f.yaml", DEFAULTS, out)
    assert not out.exists()


def test_export_from_form_refuses_deployment_blis_refuses(tmp_path):
    # Qwen3-30B-A3B has 4 KV heads: vLLM replicates them at TP 8, BLIS refuses
    path = _edit(tmp_path, "model: llama-2-70b-hf, tp: 4", "model: qwen3-30b-a3b, tp: 8")
    out = tmp_path / "out.yaml"
    with pytest.raises(RoofcalError, match=r"NumKVHeads \(4\) must be divisible by TP \(8\)"):
        export_blis(path, DEFAULTS, out)
    assert not out.exists()


def test_export_from_form_flags_and_in_place_backup(tmp_path, capsys):
    form_path = tmp_path / "f.yaml"
    save_form(_form(beta=NEW_BETA), form_path)
    defaults = tmp_path / "defaults.yaml"
    shutil.copyfile(DEFAULTS, defaults)
    code, out, _ = run(capsys, "export", "blis", "--coeffs", form_path, "--defaults", defaults, "--in-place", "--flags")
    assert code == 0
    assert (tmp_path / "defaults.yaml.bak").read_bytes() == DEFAULTS.read_bytes()
    assert out.strip().splitlines()[-1] == blis_flags(ALPHA, NEW_BETA)
    assert read_defaults_coefficients(defaults) == (ALPHA, NEW_BETA)
    code, _, _ = run(capsys, "export", "blis", "--coeffs", form_path, "--defaults", defaults, "--in-place")
    assert code == 0 and (tmp_path / "defaults.yaml.bak.1").exists()  # earlier backup kept


# ------------------------------------------------------------------------------------------
# export blis end to end (distillation from a roofcal coefficient file)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("export")
    out1, out2, form = tmp / "d1.yaml", tmp / "d2.yaml", tmp / "form.yaml"
    # the splitwise stack has no request-level data: its export keeps the input's alphas
    assert main(["export", "blis", "--coeffs", str(H100_COEFFS), "--defaults", str(DEFAULTS), "--out", str(out1),
                 "--samples", SAMPLES, "--flags", "--stack", "splitwise"]) == 0
    assert main(["blis", "fit", "--coeffs", str(H100_COEFFS), "--samples", SAMPLES, "--out", str(form),
                 "--stack", "splitwise"]) == 0
    assert main(["export", "blis", "--coeffs", str(form), "--defaults", str(DEFAULTS), "--out", str(out2)]) == 0
    return out1, out2, form


@pytest.mark.slow
def test_export_blis_only_touches_the_beta_line(exported):
    out1, _, form = exported
    old, new = DEFAULTS.read_bytes().splitlines(keepends=True), out1.read_bytes().splitlines(keepends=True)
    assert len(old) == len(new)
    diff = [i for i, (a, b) in enumerate(zip(old, new)) if a != b]
    assert len(diff) == 1 and old[diff[0]].strip().startswith(b"beta_coeffs:")
    line = new[diff[0]].decode()
    assert "roofcal 0.1.0" in line and "sha256" in line and "held-out MAPE" in line
    doc = dup_free_load(out1.read_text())["trained_physics_coefficients"]
    fitted = load_form(form)
    assert doc["beta_coeffs"] == list(fitted.beta) and doc["alpha_coeffs"] == list(ALPHA)
    assert len(fitted.beta) == 11 and all(b >= 0 for b in fitted.beta)


@pytest.mark.slow
def test_export_blis_is_deterministic_and_form_path_agrees(exported, tmp_path):
    out1, out2, form = exported
    assert read_defaults_coefficients(out1) == read_defaults_coefficients(out2)
    again = tmp_path / "again.yaml"
    assert main(["export", "blis", "--coeffs", str(H100_COEFFS), "--defaults", str(DEFAULTS), "--out", str(again),
                 "--samples", SAMPLES, "--stack", "splitwise"]) == 0
    assert again.read_bytes() == out1.read_bytes()


@pytest.mark.slow
def test_export_of_a_workload_calibrated_stack_writes_its_alphas(tmp_path):
    # the default stack of the shipped H100 file was calibrated on serving runs: its alphas (µs)
    # replace the input's, the betas are distilled with its overheads
    from roofcal.model import coeffs
    c = coeffs.load(H100_COEFFS)
    assert c.stack == "vllm" and c.stacks["vllm"].source["kind"].startswith("workload")
    out = tmp_path / "d.yaml"
    assert main(["export", "blis", "--coeffs", str(H100_COEFFS), "--defaults", str(DEFAULTS), "--out", str(out),
                 "--samples", SAMPLES, "--model", "llama-2-7b-hf:1"]) == 0
    doc = dup_free_load(out.read_text())["trained_physics_coefficients"]
    want = [c.stacks["vllm"].alphas_us[n] for n in ("queueing_us", "post_decode_us", "output_token_us")]
    ft = c.stacks["vllm"].source.get("first_token") or {}
    if ft:                        # α0 carries the first-token delay: cycles × the runs' mean cycle
        want[0] += ft["cycles"] * ft["mean_cycle_us"]
    assert doc["alpha_coeffs"] == pytest.approx(want, rel=1e-6)
    kernels_only = tmp_path / "k.yaml"
    assert main(["export", "blis", "--coeffs", str(H100_COEFFS), "--defaults", str(DEFAULTS), "--out",
                 str(kernels_only), "--samples", SAMPLES, "--model", "llama-2-7b-hf:1", "--stack", "none"]) == 0
    k = dup_free_load(kernels_only.read_text())["trained_physics_coefficients"]
    assert k["alpha_coeffs"] == list(ALPHA)                       # kept: no stack, no request data
    assert sum(doc["beta_coeffs"][4:7]) > sum(k["beta_coeffs"][4:7])   # per layer/request/step > 0 with CPU work


@pytest.mark.slow
def test_blis_form_reports_native_and_blis_heldout_side_by_side(exported):
    f = load_form(exported[2])
    held = f.metrics["heldout"]
    assert held["distill"]["all"]["blis_mape"] < 15
    m = held["measured"]["decode"]
    assert {"native_mape", "blis_mape", "input_mape"} <= set(m) and m["n"] > 0
    assert f.provenance["coeffs"]["path"] == "coeffs/h100_sxm.yaml" and f.hardware == "H100"
    assert "no request-level data" in f.alpha_source
    assert f.provenance["beta_kept_from_defaults"] == ["beta8_per_interleaved_moe_layer_us", "beta_ep_moe_dispatch"]


def test_export_blis_refusals(tmp_path, capsys):
    out = tmp_path / "o.yaml"
    cases = [
        (["--coeffs", A100_COEFFS, "--defaults", DEFAULTS, "--out", out, "--stack", "splitwise"], "--model"),
        (["--coeffs", H100_COEFFS, "--defaults", DEFAULTS, "--out", out, "--model", "qwen3-30b-a3b", "--tp", "8"],
         r"NumKVHeads (4) must be divisible by TP (8)"),
        (["--coeffs", H100_COEFFS, "--defaults", DEFAULTS, "--out", out, "--model", "llama-2-7b-hf"], "--tp"),
        (["--coeffs", H100_COEFFS, "--defaults", DEFAULTS, "--out", DEFAULTS], "--in-place"),
        (["--coeffs", H100_COEFFS, "--defaults", DEFAULTS], "--out FILE"),
        (["--coeffs", H100_COEFFS, "--defaults", tmp_path / "nope.yaml", "--out", out], "no such"),
        (["--coeffs", DEFAULTS, "--defaults", DEFAULTS, "--out", out], "schema"),
        (["--coeffs", H100_COEFFS, "--defaults", DEFAULTS, "--out", out, "--hardware", "B300"], "no entry 'B300'"),
    ]
    for args, message in cases:
        code, _, err = run(capsys, "export", "blis", *args)
        assert code == 2, args
        assert message in one_error_line(err), (args, err)
    assert not out.exists()
    assert DEFAULTS.read_bytes().count(b"roofcal") == 0


# ------------------------------------------------------------------------------------------
# hardware entries


def test_hardware_lookup_by_alias():
    assert hardware_for_gpu(HWCONFIG, load_gpu("a100_sxm"))[0] == "A100-SXM"
    name, hw = hardware_for_gpu(HWCONFIG, load_gpu("h100_sxm"))
    assert name == "H100" and hw.tflops_peak == 989.5
    with pytest.raises(RoofcalError, match="no entry for GPU 'b200'"):
        hardware_for_gpu(HWCONFIG, load_gpu("b200"))
    with pytest.raises(RoofcalError, match="entry 'L40S' is GPU 'l40s'"):
        hardware_for_gpu(HWCONFIG, load_gpu("h100_sxm"), "L40S")


@pytest.mark.slow
def test_mfu_definition_is_a_fraction():
    from roofcal.model import coeffs

    c, gpu = coeffs.load(H100_COEFFS), load_gpu("h100_sxm")
    prefill, decode = gemm_mfu(c, gpu, 2048), gemm_mfu(c, gpu, 256)
    assert 0.2 < prefill <= 1 and 0.05 < decode < prefill


def test_export_hardware_replaces_one_entry_in_place(tmp_path, capsys):
    into = tmp_path / "hw.json"
    shutil.copyfile(HWCONFIG, into)
    code, _, _ = run(capsys, "export", "hardware", "--gpu", "h100_sxm", "--coeffs", H100_COEFFS, "--into", into)
    assert code == 0
    old, new = HWCONFIG.read_text(), into.read_text()
    assert (tmp_path / "hw.json.bak").read_text() == old
    before, after = json.loads(old), json.loads(new)
    assert list(before) == list(after)
    for name in before:
        if name != "H100":
            assert before[name] == after[name]
    # bytes outside the H100 object are untouched
    start, end = old.index('"A100-SXM"'), len(old)
    assert new.endswith(old[start:end]) and new.startswith(old[: old.index("{", old.index('"H100"'))])
    h = after["H100"]
    assert h["TFlopsPeak"] == 989.4 and h["TFlopsFP8"] == 1978.9 and h["BwPeakTBs"] == 3.35 and h["MemoryGiB"] == 80
    assert 0 < h["mfuDecode"] < h["mfuPrefill"] <= 1 and "roofcal" in h["_comment"]


def test_export_hardware_appends_new_entry(tmp_path, capsys):
    into, out = tmp_path / "hw.json", tmp_path / "merged.json"
    shutil.copyfile(HWCONFIG, into)
    code, _, _ = run(capsys, "export", "hardware", "--gpu", "a100_sxm", "--name", "A100-roofcal",
                     "--into", into, "--out", out)
    assert code == 0 and into.read_text() == HWCONFIG.read_text()
    old, new = HWCONFIG.read_text(), out.read_text()
    body = old.rstrip()[:-1].rstrip()  # everything before the closing brace
    assert new.startswith(body) and list(json.loads(new))[-1] == "A100-roofcal"
    assert list(json.loads(new))[:-1] == list(json.loads(old))
    assert merge_hardware_entry(None, "X", {"a": 1.0}) == '{\n\t"X": {\n\t\t"a": 1.0\n\t}\n}\n'


def test_export_hardware_refusals(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    cases = [
        (["--gpu", "h200_sxm", "--coeffs", H100_COEFFS], "fitted for GPU 'h100_sxm'"),
        (["--gpu", "b200"], "give --coeffs FILE"),
        (["--gpu", "h100_sxm", "--into", bad], "expected a JSON object"),
        (["--gpu", "nosuch"], "unknown GPU"),
    ]
    for args, message in cases:
        code, _, err = run(capsys, "export", "hardware", *args)
        assert code == 2 and message in one_error_line(err), (args, err)
    assert bad.read_text() == "[1, 2]" and not (tmp_path / "bad.json.bak").exists()


def test_deployment_arguments():
    from argparse import Namespace

    from roofcal.cli.blis import _deployments
    from roofcal.physics.config import Parallel

    def ns(model, tp, dp=1, ep=False, comm="allgather_reducescatter"):
        return Namespace(model=model, tp=tp, dp=dp, enable_expert_parallel=ep, moe_comm_backend=comm)

    assert _deployments(ns(None, None)) is None
    assert _deployments(ns(["a", "b"], [1, 2])) == [
        Deployment("a", 1), Deployment("a", 2), Deployment("b", 1), Deployment("b", 2)]
    assert _deployments(ns(["a:4,8", "b:1"], None)) == [
        Deployment("a", 4), Deployment("a", 8), Deployment("b", 1)]
    assert _deployments(ns(["a:1"], None, 8, True, "deepep_low_latency")) == [
        Deployment("a", 1, Parallel(8, True, "deepep_low_latency"))]
    for model, tp in ((["a"], None), (None, [1]), (["a:4"], [2])):
        with pytest.raises(RoofcalError, match="--tp|--model"):
            _deployments(ns(model, tp))
    with pytest.raises(RoofcalError, match="--dp"):
        _deployments(ns(None, None, dp=2))


# ------------------------------------------------------------------------------------------
# review fixes: non-bundled model configs, scored-only step files, seeds, defaults


def _own_model(tmp_path) -> Path:
    """A copy of a bundled config in a folder whose name roofcal does not bundle."""
    cfg = tmp_path / "my-llama" / "config.json"
    cfg.parent.mkdir()
    shutil.copyfile(ROOT / "model_configs" / "llama-2-7b-hf" / "config.json", cfg)
    return cfg


def _step_file(path: Path, **fields) -> Path:
    """40 measured prefill and decode steps (``fields``: model / gpu / tp of every row)."""
    steps = []
    for i in range(40):
        ctx = 256 * (i + 1)
        if i % 2:
            steps.append(Step(decode=(ctx,) * (1 + i % 7), duration_us=9000.0 + 30.0 * i, **fields))
        else:
            steps.append(Step(prefill=((ctx, 0),), duration_us=12000.0 + 40.0 * i, **fields))
    path.write_text("".join(json.dumps(s.to_json()) + "\n" for s in steps))
    return path


def _coeffs_copy(tmp_path, deployments, data=()) -> Path:
    """coeffs/h100_sxm.yaml recording other step deployments and measurement files."""
    doc = yaml_load(H100_COEFFS.read_text())
    doc["fit"]["deployments"] = [{"model": m, "tp": t} for m, t in deployments]
    # the default stack's own runs would come first (default_deployments): leave fit.deployments
    doc["stacks"][doc["stack"]]["source"].pop("deployments", None)
    doc["data"] = [{"path": str(p), "sha256": sha256_file(p), "kind": "steps", "rows": 40} for p in data]
    path = tmp_path / "coeffs.yaml"
    path.write_text(yaml_text(doc, sort_keys=False))
    return path


def test_default_deployments_are_the_stacks_own_runs_then_the_fitted_steps():
    from roofcal.blis.distill import default_deployments
    from roofcal.model import coeffs as coeff_io
    c = coeff_io.load(H100_COEFFS)
    # the default stack, vllm, was calibrated on runs of three deployments; fit.deployments are
    # the splitwise steps' (Llama-2-70B TP 4 and 8), which belong to the splitwise stack
    recs, where = default_deployments(c)
    assert where == "stacks.vllm.source.deployments"
    assert [(r["model"], r["tp"]) for r in recs] == [("llama-2-7b-hf", 1), ("llama-2-70b-hf", 4),
                                                     ("mixtral-8x7b-v0.1", 2)]
    recs, where = default_deployments(coeff_io.with_stack(c, "splitwise"))
    assert where == "fit.deployments" and [(r["model"], r["tp"]) for r in recs] == [("llama-2-70b-hf", 4),
                                                                                    ("llama-2-70b-hf", 8)]


@pytest.mark.slow
def test_non_bundled_model_config_fits_exports_and_inspects(tmp_path, capsys):
    cfg = _own_model(tmp_path)
    steps = _step_file(tmp_path / "steps.jsonl", model=str(cfg), gpu="h100_sxm", tp=1)
    form = tmp_path / "form.yaml"
    code, _, err = run(capsys, "blis", "fit", "--coeffs", H100_COEFFS, "--model", "llama-2-7b-hf", "--tp", "1",
                       "--samples", "60", "--iters", "30", "--steps", steps, "--out", form)
    assert code == 0, err
    f = load_form(form)
    assert f.provenance["method"] == "distillation + measured"
    # what the betas were fitted for: distilled and measured deployments, the latter by config path
    assert f.deployments == (Deployment("llama-2-7b-hf", 1), Deployment(str(cfg.resolve()), 1))
    assert f.metrics["heldout"]["measured"]["my-llama tp1"]["n"] > 0
    # the form's deployments resolve again on export
    out = tmp_path / "defaults.yaml"
    code, _, err = run(capsys, "export", "blis", "--coeffs", form, "--defaults", DEFAULTS, "--out", out)
    assert code == 0, err
    assert read_defaults_coefficients(out)[1] == f.beta
    # and residuals --blis reads each step's own model config
    code, _, err = run(capsys, "residuals", "--blis", form, "--data", steps, "--no-plots", "--out", tmp_path / "res")
    assert code == 0, err
    res = pd.read_parquet(tmp_path / "res" / "residuals.parquet")
    assert res["model"].astype(str).str.contains("my-llama").sum() == 40


def test_resolve_deployment_takes_a_loaded_spec(tmp_path):
    cfg = _own_model(tmp_path)
    spec = load_model(cfg)
    assert spec.ref == str(cfg.resolve())
    a = resolve_deployment(Deployment(spec.ref, 2), H100, spec=spec)
    b = resolve_deployment(Deployment(str(cfg), 2), H100)
    assert a.spec == b.spec and a.constants == b.constants and a.max_context == b.max_context == 4096
    with pytest.raises(RoofcalError, match=r"^here: TP 3 does not divide"):
        resolve_deployment(Deployment(spec.ref, 3), H100, where="here", spec=spec)


@pytest.mark.slow
def test_export_distils_recorded_config_paths_and_scores_steps_without_a_model(tmp_path):
    from roofcal.blis.fit import BlisFitSettings

    cfg = _own_model(tmp_path)
    steps = _step_file(tmp_path / "steps.jsonl")  # rows name no model, GPU or TP
    coeffs = _coeffs_copy(tmp_path, [(str(cfg.resolve()), 1)], [steps])
    result = export_blis(coeffs, DEFAULTS, tmp_path / "out.yaml", settings=BlisFitSettings(samples=60, iters=30))
    form = result.form
    assert form.deployments == (Deployment(str(cfg.resolve()), 1),)
    assert form.provenance["method"] == "distillation"
    # the step file gets the coefficient file's only deployment, as at fit time, and is scored
    assert form.provenance["scored_only"] == [f"{steps}: scored with serving stack 'vllm' (held-out configurations "
                                              "as in the coefficient fit)"]
    assert form.metrics["heldout"]["measured"]["all"]["n"] > 0
    assert f"for {cfg.resolve()} TP1 on H100" in result.comment


@pytest.mark.slow
def test_scored_only_step_files_that_cannot_be_read_are_skipped_with_a_note(tmp_path):
    from roofcal.model import coeffs as coeff_io
    from roofcal.blis.distill import _coeff_step_data

    steps = _step_file(tmp_path / "steps.jsonl")
    c = coeff_io.load(_coeffs_copy(tmp_path, [("llama-2-7b-hf", 1), ("llama-2-7b-hf", 2)], [steps]))
    data, notes = _coeff_step_data(c)
    assert data == [] and len(notes) == 1
    assert notes[0].startswith(f"{steps}: not scored (") and "has no model" in notes[0]


def test_deployment_seed_streams():
    import zlib

    draw = lambda rng: rng.random(4).tolist()
    assert draw(deployment_seed(3, "m", 2)) == draw(deployment_seed(3, "m", 2, stream=0))
    assert draw(deployment_seed(3, "m", 2, stream=1)) == draw(np.random.default_rng([3, zlib.crc32(b"m"), 2, 1]))
    assert draw(deployment_seed(3, "m", 2, stream=1)) != draw(deployment_seed(3, "m", 2))


def test_hardware_entry_without_positive_peaks_is_refused(tmp_path):
    hw = tmp_path / "hw.json"
    hw.write_text(json.dumps({"H100": {"TFlopsPeak": 0, "BwPeakTBs": 3.35}}))
    with pytest.raises(RoofcalError, match=r"entry 'H100': field 'TFlopsPeak' must be a positive number, got 0.0"):
        hardware_for_gpu(hw, load_gpu("h100_sxm"))


def test_fit_options_default_to_the_settings():
    from roofcal.blis.fit import BlisFitSettings
    from roofcal.cli.main import build_parser

    from roofcal.calibration import WORKLOAD_DEFAULTS
    from roofcal.cli.blis import _settings

    d = BlisFitSettings()
    for argv in (["blis", "fit", "--out", "x"], ["export", "blis", "--coeffs", "c", "--defaults", "d"]):
        a = build_parser().parse_args(argv)
        s = _settings(a)
        assert (s.samples, s.seed, s.holdout, s.iters) == (d.samples, d.seed, d.holdout, d.iters)
    # an export for runs or deployments distils as many steps as workload validate's exports
    a = build_parser().parse_args(["export", "blis", "--coeffs", "c", "--defaults", "d", "--out-dir", "o"])
    assert _settings(a, deployment_export=True).samples == WORKLOAD_DEFAULTS["samples"] == 800

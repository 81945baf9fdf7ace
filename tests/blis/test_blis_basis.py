"""BLIS trained-physics re-implementation (roofcal.blis) against BLIS's Go goldens and doc rules."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from roofcal.blis.basis import (
    BASIS_TERMS,
    BlisBatch,
    BlisHardware,
    blis_basis,
    blis_step_time,
    blis_step_time_float,
    validate_blis_coeffs,
    validate_blis_deployment,
)
from roofcal.blis.config import BlisModel, blis_model_from_dict, load_blis_model
from roofcal.blis.goldens import check_goldens
from roofcal.errors import RoofcalError

ROOT = Path(__file__).resolve().parents[2]
GOLDENS = ROOT / "data" / "blis" / "trained_physics_goldens.json"
CONFIGS = ROOT / "model_configs"

H100 = BlisHardware(tflops_peak=989.5, tflops_fp8=1979.0, bw_peak_tbs=3.35, mfu_prefill=0.45, mfu_decode=0.30, memory_gib=80)
ALPHA = [15563.199579, 777.3455, 45.907545]
BETA11 = [0.152128, 0.0, 1.36252915, 0.752037, 32.09546717, 4.41684444, 126.024825, 481.8613888, 0.0, 1.94710771, 0.752037]


def req(input_len, progress_index, num_new_tokens, num_output_tokens):
    return dict(
        input_len=input_len,
        progress_index=progress_index,
        num_new_tokens=num_new_tokens,
        num_output_tokens=num_output_tokens,
    )


def model(name: str, model_name: str = "") -> BlisModel:
    return load_blis_model(CONFIGS / name / "config.json", model_name)


# ------------------------------------------------------------------------------------------
# goldens


def test_all_goldens_match_exactly():
    report = check_goldens(GOLDENS)
    assert report.n_cases == 294
    assert report.mismatches == []
    assert report.max_abs_diff_us == 0


def test_parsed_models_match_blis_model_config():
    """Our config.json parsing reproduces BLIS's sim.ModelConfig for every goldens model config."""
    data = json.loads(GOLDENS.read_text())
    go_names = {
        "NumLayers": "num_layers",
        "HiddenDim": "hidden",
        "NumHeads": "heads",
        "NumKVHeads": "kv_heads",
        "IntermediateDim": "intermediate",
        "BytesPerParam": "bytes_per_param",
        "WeightBytesPerParam": "weight_bytes_per_param",
        "NumLocalExperts": "num_local_experts",
        "NumExpertsPerTok": "num_experts_per_tok",
        "MoEExpertFFNDim": "moe_intermediate",
        "SharedExpertFFNDim": "shared_expert_ffn",
        "InterleaveMoELayerStep": "interleave_moe_layer_step",
        "DenseIntermediateDim": "dense_intermediate",
        "HeadDim": "head_dim",
        "FirstKDenseReplace": "first_k_dense_replace",
        "KVLoraRank": "kv_lora_rank",
        "QKRopeHeadDim": "qk_rope_head_dim",
        "VocabSize": "vocab_size",
        "HiddenAct": "hidden_act",
    }
    for name, entry in data["model_configs"].items():
        parsed = load_blis_model(GOLDENS.parent / entry["path"], "")  # no name fallback
        assert set(entry["blis_model_config"]) == set(go_names)
        for go, attr in go_names.items():
            assert getattr(parsed, attr) == entry["blis_model_config"][go], (name, go)


# ------------------------------------------------------------------------------------------
# the Go unit-test anchor (TestINVBCDP1_DenseStepTimeByteIdentical)


def test_go_unit_test_anchor_tp_1_2_4_8():
    hw = BlisHardware.from_dict({"TFlopsPeak": 989.0, "BwPeakTBs": 3.35, "mfuPrefill": 0.55, "mfuDecode": 0.3})
    steps = [[req(128, 0, 128, 0)] * 3 + [req(256, 266, 1, 10)] * 5]
    llama8b = model("llama-3.1-8b-instruct")
    got = []
    for tp in (1, 2, 4, 8):
        basis = blis_basis(llama8b, hw, tp, 1, "", BlisBatch.from_steps(steps))
        got.append(int(blis_step_time(basis, BETA11[:10])[0]))
    assert got == [7797, 4538, 2909, 2094]


# ------------------------------------------------------------------------------------------
# a basis term by hand


def test_weight_and_prefill_kv_terms_by_hand():
    # Llama-3.1-8B, TP 1, H100 (BwPeakTBs 3.35 → 3.35e6 B/µs), bf16 weights (2 B/param):
    # L=32, d=4096, H=32, kvH=8 → dH=128, dKV=1024, dFF=14336, dense (nDense=32).
    # t_weight = [L·d·(2d+2dKV)·2 + nDense·3·d·dFF·2] / bw
    #          = [32·4096·10240·2 + 32·3·4096·14336·2] / 3.35e6
    #          = [2,684,354,560 + 11,274,289,152] / 3.35e6 = 13,958,643,712 / 3.35e6
    #          = 4166.7593170149... µs
    # t_pf_kv (one 384-token prefill chunk) = L·2·(dKV/tp)·T_pf·2 B / bw
    #          = 32·2·1024·384·2 / 3.35e6 = 50,331,648 / 3.35e6 = 15.024372537... µs
    basis = blis_basis(model("llama-3.1-8b-instruct"), H100, 1, 1, "", BlisBatch.from_steps([[req(384, 0, 384, 5)]]))
    assert float(basis["t_weight_us"][0]) == pytest.approx(13_958_643_712 / 3.35e6, rel=1e-15)
    assert float(basis["t_pf_kv_us"][0]) == pytest.approx(50_331_648 / 3.35e6, rel=1e-15)
    assert float(basis["t_dc_compute_us"][0]) == 0.0
    assert float(basis["batch_size"][0]) == 1.0


# ------------------------------------------------------------------------------------------
# β-length semantics


@pytest.fixture(scope="module")
def scout_basis():
    """Scout (interleaved MoE) at TP 2, DP 2, all-to-all: every basis term is non-zero."""
    steps = [[req(2000, 0, 512, 100), req(900, 300, 256, 50), req(100, 140, 1, 200), req(60, 1060, 1, 1000)]]
    scout = model("llama-4-scout-17b-16e-instruct-fp8-dynamic")
    basis = blis_basis(scout, H100, 2, 2, "pplx", BlisBatch.from_steps(steps))
    terms = {k: float(v[0]) for k, v in basis.items()}
    assert all(terms[k] > 0 for k in BASIS_TERMS), terms
    assert terms["interleaved_moe_layers"] == 24  # BLIS: nMoE = 48 // (1+1)
    return basis, terms


def test_beta_length_semantics(scout_basis):
    basis, t = scout_basis
    b = [0.3, 0.2, 1.1, 0.7, 30.0, 4.0, 120.0, 400.0, 0.9, 1.7, 2.5, 99.0]  # 12 distinct values
    b1a, b2a, b3, b4, b5, b6, b7, b8, b1b, b2b, bep = b[:11]
    common = b3 * t["t_weight_us"] + b4 * t["t_tp_allreduce_us"] + b5 * t["num_layers"] + b6 * t["batch_size"] + b7
    pf_max = b1a * max(t["t_pf_compute_us"], t["t_pf_kv_us"])
    dc_max = b2a * max(t["t_dc_compute_us"], t["t_dc_kv_us"])
    pf_split = b1a * t["t_pf_compute_us"] + b1b * t["t_pf_kv_us"]
    dc_split = b2a * t["t_dc_compute_us"] + b2b * t["t_dc_kv_us"]
    moe8 = b8 * t["interleaved_moe_layers"]
    expected = {
        7: pf_max + dc_max + common + b4 * t["t_moe_dispatch_us"],  # β8 off, β_EP = β4
        8: pf_max + dc_max + common + b4 * t["t_moe_dispatch_us"] + moe8,
        9: pf_split + dc_max + common + b4 * t["t_moe_dispatch_us"] + moe8,
        10: pf_split + dc_split + common + b4 * t["t_moe_dispatch_us"] + moe8,
        11: pf_split + dc_split + common + bep * t["t_moe_dispatch_us"] + moe8,
        12: pf_split + dc_split + common + bep * t["t_moe_dispatch_us"] + moe8,  # 12th dropped
    }
    for n, want in expected.items():
        assert float(blis_step_time_float(basis, b[:n])[0]) == pytest.approx(want, rel=1e-12), n
        assert int(blis_step_time(basis, b[:n])[0]) == math.trunc(want), n
    assert expected[7] != expected[10] != expected[11]


def test_truncation_floor_nan_and_empty():
    zeros = {k: np.zeros(4) for k in BASIS_TERMS}
    basis = dict(zeros, batch_size=np.array([0.0, 1.0, 1.0, 1.0]), constant=np.array([0.0, 1.0, 1.0, 1.0]))
    basis["t_weight_us"] = np.array([0.0, 0.0, 10.0, np.nan])
    beta = [0.0, 0.0, 1.9, 0.0, 0.0, 0.0, 0.25]  # T = 1.9·t_weight + 0.25
    got = np.asarray(blis_step_time(basis, beta))
    assert got.dtype == np.int64
    # empty step → 1; 0.25 → floor 1; 19.25 → 19 (toward zero); NaN → MaxInt64
    assert got.tolist() == [1, 1, 19, np.iinfo(np.int64).max]


def test_empty_batch_is_one_us():
    basis = blis_basis(model("llama-3.1-8b-instruct"), H100, 1, 1, "", BlisBatch.from_steps([[], [req(10, 0, 10, 1)]]))
    assert float(basis["t_weight_us"][0]) == 0.0
    assert np.asarray(blis_step_time(basis, BETA11)).tolist()[0] == 1


# ------------------------------------------------------------------------------------------
# validation


@pytest.mark.parametrize(
    "alpha, beta, message",
    [
        ([1.0, 2.0], BETA11, r"AlphaCoeffs requires at least 3 elements, got 2"),
        ([1.0, float("nan"), 2.0], BETA11, r"AlphaCoeffs\[1\] is NaN"),
        ([1.0, 2.0, float("inf")], BETA11, r"AlphaCoeffs\[2\] is Inf"),
        ([-1.0, 2.0, 3.0], BETA11, r"AlphaCoeffs\[0\] must be non-negative, got -1.000000"),
        (ALPHA, BETA11[:6], r"BetaCoeffs requires at least 7 elements, got 6"),
        (ALPHA, BETA11[:6] + [float("nan")], r"BetaCoeffs\[6\] is NaN"),
        (ALPHA, BETA11[:9] + [-0.5], r"BetaCoeffs\[9\] must be non-negative"),
    ],
)
def test_coefficient_refusals(alpha, beta, message):
    with pytest.raises(RoofcalError, match=message):
        validate_blis_coeffs(alpha, beta)


def test_coefficients_accepted():
    validate_blis_coeffs(ALPHA, BETA11 + [1.0, 2.0])  # no upper bound on the β count
    validate_blis_coeffs(ALPHA, BETA11[:7])


@pytest.mark.parametrize(
    "name, tp, dp, backend, hw, message",
    [
        ("qwen3-30b-a3b", 8, 1, "", H100, r"NumKVHeads \(4\) must be divisible by TP \(8\)"),  # 32 heads, 4 KV
        ("qwen3-14b", 3, 1, "", H100, r"NumHeads \(40\) must be divisible by TP \(3\)"),
        ("llama-3.1-8b-instruct", 0, 1, "", H100, r"TP must be > 0"),
        ("llama-3.1-8b-instruct", 1, 2, "", H100, r"DP=2 requires a MoE model"),
        ("mixtral-8x7b-v0.1", 1, 0, "", H100, r"DP must be >= 1"),
        ("mixtral-8x7b-v0.1", 2, 2, "nccl", H100, r'unknown MoE comm backend "nccl"'),
        ("llama-3.1-8b-instruct", 1, 1, "", BlisHardware(tflops_peak=0.0, bw_peak_tbs=3.35), r"TFlopsPeak must be"),
        ("llama-3.1-8b-instruct", 1, 1, "", BlisHardware(tflops_peak=989.5, bw_peak_tbs=float("nan")), r"BwPeakTBs must be"),
    ],
)
def test_deployment_refusals(name, tp, dp, backend, hw, message):
    with pytest.raises(RoofcalError, match=message):
        validate_blis_deployment(model(name), hw, tp, dp, backend)
    with pytest.raises(RoofcalError, match=message):  # blis_basis refuses the same deployments
        blis_basis(model(name), hw, tp, dp, backend, BlisBatch.from_steps([[req(10, 0, 10, 1)]]))


def test_moe_without_experts_per_tok_refused():
    mixtral = json.loads((CONFIGS / "mixtral-8x7b-v0.1" / "config.json").read_text())
    del mixtral["num_experts_per_tok"]
    with pytest.raises(RoofcalError, match=r"NumExpertsPerTok must be > 0"):
        validate_blis_deployment(blis_model_from_dict(mixtral), H100, 1, 1)


# ------------------------------------------------------------------------------------------
# config.json parsing


def test_config_fallbacks_and_quantization():
    base = dict(num_hidden_layers=4, hidden_size=256, num_attention_heads=8, dtype="float16", ffn_hidden_size=512, num_kv_heads=2)
    m = blis_model_from_dict(base)
    assert (m.kv_heads, m.intermediate, m.bytes_per_param, m.weight_bytes_per_param) == (2, 512, 2.0, 0.0)
    assert not m.is_moe
    m = blis_model_from_dict(dict(base, num_kv_heads=None, multi_query_group_num=1, num_experts=1, num_local_experts=4, num_experts_per_tok=2, n_shared_experts=2, moe_intermediate_size=64))
    assert (m.kv_heads, m.num_local_experts, m.shared_expert_ffn, m.is_moe) == (1, 4, 128, True)
    assert blis_model_from_dict(dict(base, quantization_config={"bits": "4"})).weight_bytes_per_param == 0.5
    ct = {"quant_method": "compressed-tensors", "config_groups": {"g_b": {"weights": {"num_bits": 8}}, "g_a": {"weights": {"num_bits": 4}}}}
    assert blis_model_from_dict(dict(base, quantization_config=ct)).weight_bytes_per_param == 0.5  # sorted: g_a first
    assert blis_model_from_dict(base, "Org/Model-W4A16").weight_bytes_per_param == 0.5
    assert blis_model_from_dict(base, "org/model-FP8-dynamic").weight_bytes_per_param == 1.0
    assert blis_model_from_dict(dict(base, quantization_config={"quant_method": "fp8"}), "x-w4a16").weight_bytes_per_param == 1.0


def test_weight_precision_fallback_changes_rate():
    """fp8 from the model name → 1 B/param weights → the FP8 peak rate and half the weight bytes."""
    batch = BlisBatch.from_steps([[req(448, 0, 448, 316)]])
    plain = blis_basis(model("llama-3.1-8b-instruct"), H100, 1, 1, "", batch)
    fp8 = blis_basis(model("llama-3.1-8b-instruct", "redhatai/meta-llama-3.1-8b-instruct-fp8-dynamic"), H100, 1, 1, "", batch)
    assert float(fp8["t_weight_us"][0]) == pytest.approx(float(plain["t_weight_us"][0]) / 2, rel=1e-15)
    assert float(fp8["t_pf_compute_us"][0]) == pytest.approx(float(plain["t_pf_compute_us"][0]) * 989.5 / 1979.0, rel=1e-12)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda c: c.pop("num_hidden_layers"), r"config.json: field 'num_hidden_layers'"),
        (lambda c: c.update(torch_dtype="float8_e4m3"), r"config.json: field 'torch_dtype': unsupported dtype"),
        (lambda c: c.update(hidden_size="4096"), r"config.json: field 'hidden_size': expected a number"),
        (lambda c: c.pop("intermediate_size"), r"field 'intermediate_size'.*ffn_hidden_size"),
    ],
)
def test_config_errors_name_file_and_field(tmp_path, edit, message):
    cfg = json.loads((CONFIGS / "llama-3.1-8b-instruct" / "config.json").read_text())
    edit(cfg)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(RoofcalError, match=message) as err:
        load_blis_model(path, "m")
    assert "\n" not in str(err.value)


def test_config_missing_or_bad_json(tmp_path):
    with pytest.raises(RoofcalError, match=r"nope.json: no such model config file"):
        load_blis_model(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(RoofcalError, match=r"bad.json: invalid JSON at line 1"):
        load_blis_model(tmp_path / "bad.json")


# ------------------------------------------------------------------------------------------
# goldens file errors


def _one_case_goldens(tmp_path) -> tuple[dict, Path]:
    data = json.loads(GOLDENS.read_text())
    case = data["cases"][0]
    name = case["model_config"]
    data["cases"] = [case]
    data["model_configs"] = {name: dict(data["model_configs"][name])}
    data["model_configs"][name]["path"] = str((GOLDENS.parent / data["model_configs"][name]["path"]).resolve())
    return data, tmp_path / "goldens.json"


def test_goldens_copy_elsewhere_still_checks(tmp_path):
    data, path = _one_case_goldens(tmp_path)
    path.write_text(json.dumps(data))
    report = check_goldens(path)
    assert (report.n_cases, report.max_abs_diff_us, report.mismatches) == (1, 0, [])


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d["cases"][0].pop("tp"), r"field 'cases\[0\].tp' missing"),
        (lambda d: d["cases"][0].pop("batch"), r"field 'cases\[0\].batch' missing"),
        (lambda d: d.pop("model_configs"), r"field 'model_configs' missing"),
        (lambda d: d["cases"][0]["batch"][2].pop("input_len"), r"batch\[0\]\[2\]: field 'input_len'"),
    ],
)
def test_goldens_missing_field_is_one_line_error(tmp_path, edit, message):
    data, path = _one_case_goldens(tmp_path)
    edit(data)
    path.write_text(json.dumps(data))
    with pytest.raises(RoofcalError, match=message) as err:
        check_goldens(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_goldens_missing_file_and_bad_json(tmp_path):
    with pytest.raises(RoofcalError, match=r"no such goldens file"):
        check_goldens(tmp_path / "absent.json")
    (tmp_path / "bad.json").write_text("[1,")
    with pytest.raises(RoofcalError, match=r"bad.json: invalid JSON at line 1"):
        check_goldens(tmp_path / "bad.json")

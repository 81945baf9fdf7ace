"""Residual inspection: tables that add up, summary numbers, plots, attribution of planted errors,
BLIS mode, and the CLI (determinism, bad input). Small subsets of the bundled data keep it fast."""

import io
import math
import re
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from roofcal.inspection import plots
from roofcal import resources
from roofcal.blis.basis import BlisBatch, blis_basis, blis_step_time_float
from roofcal.blis.config import load_blis_model
from roofcal.cli.main import main
from roofcal.model.coeffs import load as load_coeffs
from roofcal.physics.config import resolve_config_path
from roofcal.measurements.datasets import Measurements
from roofcal.errors import RoofcalError
from roofcal.physics.hardware import load_gpu
from roofcal.calibration.loss import error_summary
from roofcal.model.predict import predict_table
from roofcal.measurements.ops import read_ops, write_ops_csv_text
from roofcal.model.combine import step_breakdown
from roofcal.inspection.attribution import attribution, best_per_regime
from roofcal.inspection.blis_residuals import BLIS_TERMS, blis_hardware, read_blis_coeffs
from roofcal.inspection.residuals import pad_batch, padded_size, smax_split
from roofcal.inspection.report import Residuals, residuals
from roofcal.physics.config import load_model
from roofcal.measurements.stepdata import StepData, read_splitwise
from roofcal.physics.steps import Step, StepBatch, uniform_steps, write_steps_text

H100 = load_gpu("h100_sxm")
COEFFS = resources.COEFFS / "h100_sxm.yaml"
BLIS_DEFAULTS = resources.BLIS / "defaults.yaml"
SPLITWISE = resources.STEPS / "splitwise" / "llama2-70b_h100-80gb_tp4_tp8.csv"
MICRO = resources.MICROBENCH / "h100_sxm" / "vllm-0.14.0"


@pytest.fixture(scope="module")
def coeffs():
    return load_coeffs(COEFFS, H100)


@pytest.fixture(scope="module")
def ops_subset():
    """~70 rows of each of three kernel kinds/variants (evenly spaced, deterministic)."""
    parts = []
    for name, key in (("gemm_perf.parquet", "bf16"), ("generation_attention_perf.parquet", "bf16"),
                      ("context_attention_perf.parquet", "fp8")):
        df = read_ops(MICRO / name)
        df = df[df["dtype"] == key]
        parts.append(df.iloc[:: max(1, len(df) // 70)])
    return pd.concat(parts, ignore_index=True)


@pytest.fixture(scope="module")
def steps_subset():
    """Every 3rd splitwise step of both deployments (TP 4 and 8)."""
    return [d.take(np.arange(0, len(d), 3)) for d in read_splitwise(SPLITWISE)]


@pytest.fixture(scope="module")
def report(tmp_path_factory, coeffs, ops_subset, steps_subset):
    out = tmp_path_factory.mktemp("residuals")
    res = residuals(coeffs, Measurements(ops=ops_subset, steps=steps_subset), out)
    return res, out


# --------------------------------------------------------------------------------------------
# helpers

def md_tables(md: str) -> dict:
    """{heading: DataFrame of strings} for every Markdown table under a '#' heading."""
    out, heading, rows = {}, None, []
    for line in md.splitlines() + [""]:
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
        elif line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not set("".join(cells)) <= set("-"):
                rows.append(cells)
        elif rows:
            out[heading] = pd.DataFrame(rows[1:], columns=rows[0])
            rows = []
    return out


def direct_stats(rows: pd.DataFrame, total_sq: float) -> dict:
    s = error_summary(rows["predicted_us"], rows["measured_us"])
    sq = float(np.sum(np.log(rows["predicted_us"] / rows["measured_us"]) ** 2))
    return {"n": s["n"], "MAPE %": s["mape"], "bias %": s["bias"], "p50 %": s["p50"],
            "p90 %": s["p90"], "p99 %": s["p99"], "loss share %": 100.0 * sq / total_sq}


def check_table(table: pd.DataFrame, csv: pd.DataFrame, by: list[str]) -> int:
    """Every row of a summary table equals the statistics computed from residuals.csv."""
    checked = 0
    for _, r in table.iterrows():
        sel = csv["kind"] == r["kind"]
        for c in by:
            sel &= csv[c].astype(str) == r[c]
        rows = csv[sel]
        kind_rows = csv[csv["kind"] == r["kind"]]
        total = float(np.sum(np.log(kind_rows["predicted_us"] / kind_rows["measured_us"]) ** 2))
        want = direct_stats(rows, total)
        assert int(r["n"]) == want["n"]
        for col in ("MAPE %", "bias %", "p50 %", "p90 %", "p99 %", "loss share %"):
            assert float(r[col]) == pytest.approx(want[col], abs=0.006), (by, r.to_dict(), col)
        checked += 1
    return checked


# --------------------------------------------------------------------------------------------
# the residual table

@pytest.mark.slow
def test_breakdown_sums_to_prediction_and_matches_the_model(report, coeffs, ops_subset,
                                                            steps_subset):
    res, _ = report
    df = res.table
    comp = [c for c in df.columns if c.startswith("comp_")]
    assert np.allclose(df[comp].sum(axis=1), df["predicted_us"], rtol=1e-9)
    assert np.allclose(df["rel_error"], df["predicted_us"] / df["measured_us"] - 1.0)
    kern = df[df["kind"] == "kernel"]
    assert len(kern) == len(ops_subset)
    assert np.allclose(kern["measured_us"], ops_subset["latency_us"])
    # every kernel as predict prices it, measured shapes' curves included (GEMM, MoE, all-reduce,
    # attention: every kind of the subset has measured shapes moved by their curves)
    ref = predict_table(ops_subset, coeffs.params, H100)
    assert np.allclose(kern["predicted_us"], ref["predicted_us"], rtol=2e-5)
    assert all((kern["shape_factor"][kern["op"] == op] != 1.0).any() for op in set(kern["op"]))
    steps = df[df["kind"] == "step"]
    d = steps_subset[0]                                          # TP 4 rows come first
    ref = step_breakdown(coeffs.params, d.model, H100, d.tp, pad_batch(d.batch))
    assert np.allclose(steps["predicted_us"][: len(d)], np.asarray(ref["total"])[: len(d)],
                       rtol=1e-5)
    assert np.allclose(steps["comp_mlp_up_us"][: len(d)], np.asarray(ref["mlp_up"])[: len(d)])
    assert set(steps["phase"]) == {"prefill", "decode"}
    assert steps["batch_bucket"].notna().all() and steps["context_bucket"].notna().all()
    # kernel components: latency + soft-max shares of the corrected compute and memory times
    a = kern["ideal_compute_us"] / kern["compute_efficiency"]
    b = kern["ideal_memory_us"] / kern["memory_efficiency"]
    q = kern["sharpness"]
    assert np.allclose(kern["comp_compute_us"] + kern["comp_memory_us"],
                       (a ** q + b ** q) ** (1 / q) * kern["shape_factor"], rtol=1e-9)


def test_smax_split_shares():
    c, m = smax_split(np.array([3.0, 0.0, 2.0]), np.array([4.0, 5.0, 2.0]), 2.0)
    assert np.allclose(c + m, [5.0, 5.0, 2.0 * math.sqrt(2.0)])
    assert np.allclose(c / (c + m), [9 / 25, 0.0, 0.5])


@pytest.mark.slow
def test_summary_numbers_match_direct_computation(report):
    res, out = report
    csv = pd.read_parquet(out / "residuals.parquet")
    tables = md_tables((out / "summary.md").read_text(encoding="utf-8"))
    n = check_table(tables["Overall"], csv, [])
    n += check_table(tables["Per op / component"], csv, ["key"])
    n += check_table(tables["By phase"], csv, ["phase"])
    n += check_table(tables["By batch size"], csv, ["batch_bucket"])
    n += check_table(tables["By context"], csv, ["context_bucket"])
    n += check_table(tables["By roofline bound"], csv, ["bound"])
    assert n >= 20
    # tables are sorted by impact (loss share) within each kind
    t = tables["Per op / component"]
    for kind in ("step", "kernel"):
        share = t.loc[t["kind"] == kind, "loss share %"].astype(float).to_numpy()
        assert np.all(np.diff(share) <= 0)
    # the worst rows are the largest |log error| ones, with their breakdown
    worst = tables["20 worst kernel rows"]
    kern = csv[csv["kind"] == "kernel"]
    top = kern.iloc[np.argsort(-np.abs(np.log(kern["predicted_us"] / kern["measured_us"])))[:20]]
    assert len(worst) == 20
    assert np.allclose(worst["error %"].astype(float), 100 * top["rel_error"], atol=0.006)
    assert all(re.search(r"(compute|memory|latency) \d+%", b) for b in worst["breakdown"])


@pytest.mark.slow
def test_every_png_is_a_sensible_image_and_is_embedded(report):
    res, out = report
    md = (out / "summary.md").read_text(encoding="utf-8")
    names = sorted(p.name for p in out.glob("*.png"))
    assert names == sorted(["pred_vs_measured.png", "error_vs_work.png", "step_breakdown.png",
                            "error_heatmap.png"])
    for name in names:
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        img = Image.open(io.BytesIO(data))
        img.verify()
        img = Image.open(io.BytesIO(data)).convert("L")
        w, h = img.size
        assert 600 <= w <= 4000 and 400 <= h <= 4000, (name, img.size)
        assert np.asarray(img).std() > 10                  # not blank
        assert f"]({name})" in md
    # stable bytes: rendering again gives the same PNG
    assert plots.error_heatmap(res.table) == (out / "error_heatmap.png").read_bytes()
    assert plots.step_breakdown(res.table) == (out / "step_breakdown.png").read_bytes()


# --------------------------------------------------------------------------------------------
# attribution

def planted_steps(coeffs, component: str, factor: float, select) -> list:
    """Decode and prefill steps whose 'measured' time is the model's with ``component`` × factor
    in the decode steps whose batch size satisfies ``select``."""
    B = np.array([1, 2, 4, 8, 64, 96, 1, 4, 64, 96, 1, 8], float)
    ctx = np.array([300, 700, 1500, 3000, 600, 2500, 5000, 200, 1200, 4000, 900, 9000], float)
    dec = uniform_steps(np.zeros_like(B), np.ones_like(B), np.zeros_like(B), B, ctx)
    pre = uniform_steps(np.array([1, 2, 4, 8.0]), np.array([512, 1024, 256, 128.0]), np.zeros(4),
                        np.zeros(4), np.zeros(4))
    batch = StepBatch(*(np.concatenate([getattr(dec, f), getattr(pre, f)]) for f in
                        ("prefill_new", "prefill_cached", "prefill_mask", "decode_ctx",
                         "decode_mask")))
    phase = np.array(["decode"] * len(B) + ["prefill"] * 4)
    d = StepData(load_model("llama-2-70b-hf"), "h100_sxm", 4, batch, np.ones(len(phase)), phase,
                 np.array([f"s{i}" for i in range(len(phase))]), "planted")
    t = residuals(coeffs, Measurements(steps=[d]), None, plots=False).table
    hit = (phase == "decode") & select(t["batch"].to_numpy())
    meas = t["predicted_us"] + np.where(hit, factor - 1.0, 0.0) * t[f"comp_{component}_us"]
    return [replace(d, measured_us=meas.to_numpy())]


@pytest.mark.slow
def test_attribution_finds_a_planted_step_component(coeffs):
    steps = planted_steps(coeffs, "attn_decode", 1.5, lambda b: b >= 64)
    res = residuals(coeffs, Measurements(steps=steps), None, plots=False)
    best = best_per_regime(res.attribution)
    top = best.iloc[0]
    assert top["regime"] == "decode steps, batch 64–127"
    assert top["component"] == "attn_decode"
    assert top["scale"] == pytest.approx(1.5, rel=2e-3)
    assert top["removed %"] > 99.9
    first = [ln for ln in res.summary.splitlines() if ln.startswith("1. ")][0]
    assert "decode steps, batch 64–127" in first and "attn_decode ×1.5" in first
    # gradient sign: too-slow measurements → the loss falls as the scale grows
    a = res.attribution
    row = a[(a["regime"] == "decode steps, batch 64–127") & (a["component"] == "attn_decode")]
    assert float(row["grad"].iloc[0]) < 0


@pytest.mark.slow
def test_attribution_finds_a_planted_kernel_component(coeffs, ops_subset):
    gemm = ops_subset[ops_subset["op"] == "gemm"].reset_index(drop=True)
    base = residuals(coeffs, Measurements(ops=gemm), None, plots=False).table
    a = base["ideal_compute_us"] / base["compute_efficiency"]
    b = base["ideal_memory_us"] / base["memory_efficiency"]
    q = base["sharpness"]
    planted = gemm.copy()
    # the measured shapes' curves scale a kernel's whole time (its latency column carries it)
    f = base["shape_factor"]
    planted["latency_us"] = (base["comp_latency_us"] + f * (a ** q + (1.3 * b) ** q) ** (1 / q)).to_numpy()
    res = residuals(coeffs, Measurements(ops=planted), None, plots=False)
    att = res.attribution
    row = att[(att["level"] == "key") & (att["regime"] == "gemm/bf16")]
    best = row.sort_values("removed %", ascending=False).iloc[0]
    assert best["component"] == "memory"
    assert best["scale"] == pytest.approx(1.3, rel=2e-3)
    assert best["removed %"] > 99.9
    assert "memory time ×1.3 (memory efficiency ×0.769)" in res.summary


def test_attribution_is_scale_one_when_the_model_is_exact(coeffs):
    steps = planted_steps(coeffs, "overhead", 1.0, lambda b: b > 0)
    att = attribution(residuals(coeffs, Measurements(steps=steps), None, plots=False).table)
    assert np.all(att["loss"] < 1e-10)
    assert np.allclose(att["removed %"], 0.0, atol=1e-6)


# --------------------------------------------------------------------------------------------
# BLIS

def blis_batch_by_hand(d) -> BlisBatch:
    """BLIS requests of every step of a splitwise StepData, built one request at a time."""
    b = d.batch
    rows = []
    for i in range(len(d)):
        # BLIS requests carry integer contexts (the splitwise mean decode sits at x.5)
        new, ctx = float(b.prefill_new[i, 0]), float(np.rint(b.decode_ctx[i, 0]))
        rows.append([(new, 0.0, new, 0.0)] * int(b.prefill_mask[i, 0])
                    + [(ctx, ctx, 1.0, 1.0)] * int(b.decode_mask[i, 0]))
    width = 1 << (max(len(r) for r in rows) - 1).bit_length()   # padded like the report's, so
    arr = np.zeros((4, padded_size(len(rows)), width))          # the compiled basis is reused
    mask = np.zeros(arr.shape[1:], bool)
    for i, r in enumerate(rows):
        for j, req in enumerate(r):
            arr[:, i, j] = req
            mask[i, j] = True
    return BlisBatch(*arr, mask=mask)


def test_blis_mode_components_are_beta_times_basis(steps_subset):
    bc = read_blis_coeffs(BLIS_DEFAULTS)
    assert bc.beta[0] == pytest.approx(0.152128) and len(bc.alpha) == 3
    res = residuals(None, Measurements(steps=steps_subset), None, blis=BLIS_DEFAULTS, plots=False)
    df = res.table
    comp = [c for c in df.columns if c.startswith("comp_")]
    assert {c[5:-3] for c in comp} <= {name for name, *_ in BLIS_TERMS}
    assert np.allclose(df[comp].sum(axis=1), df["predicted_us"], rtol=1e-12)
    for d in steps_subset:
        model = load_blis_model(resolve_config_path(d.model.name), d.model.name)
        basis = blis_basis(model, blis_hardware(H100), d.tp, 1, "", blis_batch_by_hand(d))
        want = np.asarray(blis_step_time_float(basis, list(bc.beta)))[: len(d)]
        got = df.loc[df["tp"] == d.tp, "predicted_us"].to_numpy()
        assert np.allclose(got, want, rtol=1e-9)
        assert np.allclose(df.loc[df["tp"] == d.tp, "comp_weights_us"],
                           bc.beta[2] * np.asarray(basis["t_weight_us"])[: len(d)], rtol=1e-12)
    assert "β1a" in res.summary and "BLIS coefficients on all steps" in res.summary


def test_blis_planted_prefill_coefficient(steps_subset, tmp_path):
    bc = read_blis_coeffs(BLIS_DEFAULTS)
    base = residuals(None, Measurements(steps=steps_subset), None, blis=bc, plots=False).table
    meas = (base["predicted_us"] + 2.0 * base["comp_pf_compute_us"]).to_numpy()   # β1a × 3
    parts = np.split(meas, np.cumsum([len(d) for d in steps_subset])[:-1])
    planted = [replace(d, measured_us=m) for d, m in zip(steps_subset, parts)]
    res = residuals(None, Measurements(steps=planted), tmp_path, blis=bc, plots=False)
    a = res.attribution
    row = a[(a["regime"] == "prefill steps") & (a["component"] == "pf_compute")].iloc[0]
    assert row["scale"] == pytest.approx(3.0, rel=2e-3)
    assert row["implied beta"] == pytest.approx(3 * 0.152128, rel=2e-3)
    assert row["removed %"] > 99.9
    assert sorted(p.name for p in tmp_path.iterdir()) == ["attribution.csv", "residuals.parquet",
                                                          "summary.md"]
    assert "pf_compute ×3" in (tmp_path / "summary.md").read_text(encoding="utf-8")


def test_blis_reader_refuses_bad_files(tmp_path):
    p = tmp_path / "b.yaml"
    p.write_text("trained_physics_coefficients: {beta_coeffs: [1, 2]}\n")
    with pytest.raises(RoofcalError, match="b.yaml.*at least 7"):
        read_blis_coeffs(p)
    p.write_text("other: 1\n")
    with pytest.raises(RoofcalError, match="beta_coeffs' is missing"):
        read_blis_coeffs(p)
    p.write_text("blis:\n  beta_coeffs: [1, 0, 1, 1, 0, 0, 0]\n")
    assert read_blis_coeffs(p).beta == (1, 0, 1, 1, 0, 0, 0)


def test_blis_terms_follow_the_fit_basis_order():
    from roofcal.blis.fit import BETA_BASIS
    assert sorted(i for _, _, i, _ in BLIS_TERMS) == list(range(len(BETA_BASIS)))
    assert all(BETA_BASIS[i] == term for _, _, i, term in BLIS_TERMS)


def test_blis_reader_is_strict_like_the_export(tmp_path):
    p = tmp_path / "b.yaml"
    p.write_text("blis:\n  beta_coeffs: [1, 0, 1, 1, 0, 0, 0]\n  beta_coeffs: [2, 0, 1, 1, 0, 0, 0]\n")
    with pytest.raises(RoofcalError, match="b.yaml: duplicate key 'beta_coeffs' at line 3"):
        read_blis_coeffs(p)
    p.write_text("blis:\n  beta_coeffs: [1, 0, 1, true, 0, 0, 0]\n")
    with pytest.raises(RoofcalError, match=r"field 'blis.beta_coeffs'\[3\]: expected a number"):
        read_blis_coeffs(p)
    with pytest.raises(RoofcalError, match="no such BLIS coefficient file"):
        read_blis_coeffs(tmp_path / "missing.yaml")


def test_blis_mode_reads_non_bundled_model_configs(tmp_path, steps_subset):
    import shutil
    from roofcal.measurements.stepdata import read_step_jsonl
    cfg = tmp_path / "my-llama-70b" / "config.json"
    cfg.parent.mkdir()
    shutil.copyfile(resources.MODEL_CONFIGS / "llama-2-70b-hf" / "config.json", cfg)
    d = steps_subset[0]
    b = d.batch
    steps = [Step(prefill=((int(b.prefill_new[i, 0]), 0),) * int(b.prefill_mask[i, 0]),
                  decode=(int(np.rint(b.decode_ctx[i, 0])),) * int(b.decode_mask[i, 0]),
                  duration_us=float(d.measured_us[i])) for i in range(len(d))]
    (tmp_path / "s.jsonl").write_text(write_steps_text(steps), encoding="utf-8")
    own = read_step_jsonl(tmp_path / "s.jsonl", model=str(cfg), gpu="h100_sxm", tp=d.tp)
    got = residuals(None, Measurements(steps=own), None, blis=BLIS_DEFAULTS, plots=False).table
    want = residuals(None, Measurements(steps=[d]), None, blis=BLIS_DEFAULTS, plots=False).table
    assert (got["model"] == "my-llama-70b").all()
    assert np.array_equal(got["predicted_us"].to_numpy(), want["predicted_us"].to_numpy())


def test_blis_form_file_brings_its_hardware_entry(tmp_path, steps_subset):
    p = tmp_path / "form.yaml"
    p.write_text("schema: roofcal-blis/1\nroofcal_version: 0.1.0\n"
                 "hardware: {name: H100, TFlopsPeak: 989.5, TFlopsFP8: 1979.0, BwPeakTBs: 3.35}\n"
                 "deployments: [{model: llama-2-70b-hf, tp: 4}]\nalpha: [0.0, 0.0, 0.0]\n"
                 "beta: [0.5, 0.1, 1.2, 1.0, 30.0, 5.0, 100.0, 0.0, 0.2, 1.5, 1.0]\n")
    bc = read_blis_coeffs(p)
    assert bc.beta[0] == 0.5 and bc.hardware is not None and bc.hardware.bw_peak_tbs == 3.35
    res = residuals(None, Measurements(steps=steps_subset[:1]), None, blis=bc, plots=False)
    assert "hardware entry H100" in res.summary
    assert np.allclose(res.table["comp_per_step_us"], 100.0)


# --------------------------------------------------------------------------------------------
# CLI

@pytest.fixture(scope="module")
def small_files(tmp_path_factory, ops_subset, steps_subset):
    d = tmp_path_factory.mktemp("data")
    (d / "ops.csv").write_text(write_ops_csv_text(ops_subset.iloc[::4]), encoding="utf-8")
    s = steps_subset[0]
    b = s.batch
    steps = []
    for i in range(len(s)):
        n_pf, n_dc = int(b.prefill_mask[i, 0]), int(b.decode_mask[i, 0])
        steps.append(Step(prefill=((int(b.prefill_new[i, 0]), 0),) * n_pf,
                          decode=(int(b.decode_ctx[i, 0]),) * n_dc,
                          duration_us=float(s.measured_us[i])))
    (d / "steps.jsonl").write_text(write_steps_text(steps), encoding="utf-8")
    return d


@pytest.mark.slow
def test_cli_writes_a_deterministic_report(small_files, tmp_path, capsys):
    args = ["residuals", "--coeffs", str(COEFFS), "--data", str(small_files / "ops.csv"),
            str(small_files / "steps.jsonl"), "--model", "llama-2-70b-hf", "--tp", "4",
            "--no-plots"]
    assert main(args + ["--out", str(tmp_path / "a")]) == 0
    text = capsys.readouterr().out
    assert "## Attribution" in text and "![" not in text and "wrote 3 files" in text
    # it says what it wrote, how many rows and how large, file by file
    size = (tmp_path / "a" / "residuals.parquet").stat().st_size
    listed = re.search(r"\n  residuals\.parquet  \(([\d,]+) rows, ([\d.]+) (k?B)\)", text)
    assert listed, text
    table = pd.read_parquet(tmp_path / "a" / "residuals.parquet")
    assert int(listed.group(1).replace(",", "")) == len(table) > 70
    assert float(listed.group(2)) == pytest.approx(size / (1e3 if listed.group(3) == "kB" else 1), abs=0.051)
    assert main(args + ["--out", str(tmp_path / "b")]) == 0
    for name in ("residuals.parquet", "attribution.csv", "summary.md"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    assert (table["kind"] == "step").sum() == 70 and (table["model"].dropna() == "llama-2-70b-hf").all()
    # --csv: the same table as CSV, in place of the Parquet file
    assert main(args + ["--csv", "--out", str(tmp_path / "c")]) == 0
    assert f"residuals.csv  ({len(table)} rows" in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == ["attribution.csv", "residuals.csv", "summary.md"]
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "c" / "residuals.csv", low_memory=False)[["kind", "measured_us"]],
                                  table[["kind", "measured_us"]], check_dtype=False)


@pytest.mark.parametrize("args, message", [
    (["--coeffs", "nope.yaml"], "no such coefficient file"),
    (["--coeffs", str(COEFFS), "--gpu", "no_such_gpu"], "unknown GPU"),
    (["--coeffs", str(resources.COEFFS / "a100_sxm.yaml"), "--gpu", "h100_sxm"],
     "fitted for GPU 'a100_sxm'"),
    (["--coeffs", str(resources.COEFFS / "a100_sxm.yaml"), "--data", str(SPLITWISE)],
     "not 'a100_sxm'"),
    (["--coeffs", str(COEFFS), "--data", "EMPTY"], "empty file"),
    (["--blis", str(BLIS_DEFAULTS), "--gpu", "h100_sxm", "--data", "OPS"], "needs step"),
    ([], "give --coeffs"),
])
def test_cli_bad_input_is_one_line_and_writes_nothing(args, message, tmp_path, small_files,
                                                      capsys):
    (tmp_path / "empty.csv").write_text("")
    args = [str(tmp_path / "empty.csv") if a == "EMPTY" else
            str(small_files / "ops.csv") if a == "OPS" else a for a in args]
    out = tmp_path / "out"
    assert main(["residuals", *args, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("roofcal: error:") and "\n" not in err and message in err
    assert not out.exists()


@pytest.mark.slow
def test_api_returns_everything_without_writing(coeffs, ops_subset):
    res = residuals(coeffs, Measurements(ops=ops_subset.iloc[::5]), None, plots=False)
    assert isinstance(res, Residuals) and res.files == [] and res.plots == {}
    assert "## Attribution" in res.summary and len(res.table) == len(ops_subset.iloc[::5])


@pytest.mark.slow
def test_tables_follow_the_convention_of_every_roofcal_table(report, tmp_path):
    # attribution.csv as roofcal.io.write_csv_atomic writes any table; residuals.parquet holds the
    # table exactly, and as CSV (table_format="csv") it is every roofcal CSV too
    from roofcal.inspection.report import write_report
    res, out = report
    text = (out / "attribution.csv").read_text(encoding="utf-8")
    assert text == res.attribution.to_csv(index=False, float_format="%.10g", lineterminator="\n")
    same = lambda df: df.astype(object).where(df.notna(), None).reset_index(drop=True)   # noqa: E731
    back = pd.read_parquet(out / "residuals.parquet")      # strings may come back as pandas strings
    pd.testing.assert_frame_equal(same(back), same(res.table))
    write_report(res, tmp_path, "csv")
    text = (tmp_path / "residuals.csv").read_text(encoding="utf-8")
    assert text == res.table.to_csv(index=False, float_format="%.10g", lineterminator="\n")
    back = pd.read_csv(tmp_path / "residuals.csv", low_memory=False)
    assert list(back.columns) == list(res.table.columns) and len(back) == len(res.table)
    np.testing.assert_allclose(back["predicted_us"], res.table["predicted_us"], rtol=1e-9)
    assert not (tmp_path / "residuals.parquet").exists()


@pytest.mark.slow
def test_heatmap_panels_are_steps_and_attention_kernels_only(report):
    # only rows with both a batch and a context bucket have a heat map: GEMM and MoE kernels
    # have no context, so every panel counts sequences
    res, _ = report
    titles = [t for t, _ in plots.heat_panels(res.table)]
    assert titles and all(t.endswith(" steps") or t.startswith("attn_") for t in titles), titles


def test_attribution_line_does_not_contradict_itself():
    # the scale minimises the squared log error; MAPE may rise: the line says so rather than
    # "would remove 5 % of the error (MAPE 17.4 % → 18.4 %)"
    from roofcal.inspection.attribution import effect_text
    assert effect_text(5.2, 17.4, 18.4) == "remove 5% of the squared log error, but raise MAPE 17.4% → 18.4%"
    assert effect_text(95, 28.3, 8.6) == "remove 95% of the squared log error (MAPE 28.3% → 8.6%)"
    assert effect_text(1, 10.04, 10.01) == "remove 1% of the squared log error (MAPE 10.0% → 10.0%)"


@pytest.mark.slow
def test_rows_not_priced_are_named_in_the_report(tmp_path):
    # the vLLM 0.24 MoE table's MXFP4 rows (972 + 1,944) are read but not priced: the report says so
    table = resources.MICROBENCH / "h100_sxm" / "vllm-0.24.0" / "moe_perf.parquet"
    res = residuals(COEFFS, [table], tmp_path / "r", plots=False)
    (note,) = [n for n in res.notes if n.startswith("left out, not priced")]
    assert "2,916 rows: moe of dtype w4a16_mxfp4 (not priced)" in note
    assert note in (tmp_path / "r" / "summary.md").read_text()

"""Out-of-domain flags on predicted steps and per-op rows (roofcal.model.domain), hand-checked."""

import json
import math
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from roofcal.io import yaml_load
from roofcal.model import coeffs as coeff_io
from roofcal.model import domain
from roofcal.model.predict import predict, predict_ops
from roofcal.physics.capacity import capacity
from roofcal.physics.config import load_model, resolve_config_path
from roofcal.physics.hardware import load_gpu
from roofcal.physics.steps import Step
from roofcal.transfer.bootstrap import bootstrap

H100, A100 = load_gpu("h100_sxm"), load_gpu("a100_sxm")
H100_FILE, A100_FILE = "coeffs/h100_sxm.yaml", "coeffs/a100_sxm.yaml"


def file_range(path, key, descriptor, steps=True):
    """A kernel's fitted range in the kernel set a prediction uses: for steps the default stack's
    set, for per-op rows the file's default."""
    doc = yaml_load(open(path).read())
    ks = doc["stacks"][doc["stack"]]["source"].get("kernels", doc["kernels"]) if steps else doc["kernels"]
    return doc["kernel_sets"][ks]["ops"][key]["range"][descriptor]


@pytest.mark.slow
def test_decode_beyond_context_limit_and_fitted_context():
    # llama-2-7b: max_position_embeddings 4096; H100 attn_decode/bf16 context range up to 131071
    hi = file_range(H100_FILE, "attn_decode/bf16", "context")[1]
    assert hi == 131071.0
    df = predict([Step(decode=(10_000_000,))], model="llama-2-7b-hf", gpu="h100_sxm", tp=1,
                 coeffs=H100_FILE)
    r = df.iloc[0]
    assert list(df.columns[-7:]) == list(domain.STEP_FLAGS)
    assert bool(r.ood_context)
    assert r.ood_what == "attn_decode.context"
    # log2(1 + 10,000,000) − log2(1 + 131,071) = 23.253497 − 17 = 6.253497 log2 units
    assert r.ood_shape == pytest.approx(math.log2(10_000_001) - math.log2(131_072), abs=1e-5)
    assert r.ood_shape == pytest.approx(6.253497, abs=1e-5)
    assert r.ood_detail == "context 10,000,000 (fitted 1–131,071)"
    # 10M tokens × 512 KiB of KV: far beyond one H100
    assert not r.fits_memory and not r.zero_shot and not r.no_kernel_data
    # the band is widened: the decode attention is e^(0.15 · 6.25) ≈ 2.6 × wider each way
    assert r.interval_basis == "kernels + extrapolation"
    assert r.p90_us / r.predicted_us > 1.5 and r.p10_us / r.predicted_us < 0.7


@pytest.mark.slow
def test_context_limit_counts_the_new_token():
    # decode at context 4095 computes position 4096 (= the limit); at 4096 it computes 4097
    # prefill chunk 1024 new over 3072 cached reaches 4096 exactly
    df = predict([Step(decode=(4095,)), Step(decode=(4096,)), Step(prefill=((1024, 3072),)),
                  Step(prefill=((1025, 3072),))], model="llama-2-70b-hf", gpu="h100_sxm", tp=4)
    assert df.ood_context.tolist() == [False, True, False, True]
    assert domain.context_limit(load_model("llama-2-70b-hf")) == 4096


@pytest.mark.slow
def test_ordinary_step_is_not_flagged():
    # Llama-2-70B TP 4 (16 heads, 2 KV heads per GPU): shapes inside every fitted range
    steps = [Step(prefill=((512, 0),)), Step(decode=(512, 1024, 1024, 2000)),
             Step(prefill=((256, 0),), decode=(100, 3000))]
    df = predict(steps, model="llama-2-70b-hf", gpu="h100_sxm", tp=4, coeffs=H100_FILE)
    assert (df.ood_shape == 0).all() and (df.ood_what == "").all()
    assert not df.ood_context.any() and df.fits_memory.all()
    assert not df.zero_shot.any() and not df.no_kernel_data.any()
    assert domain.summary(df) == "all 3 steps inside the fitted domain"


@pytest.mark.slow
def test_cached_prefix_widens_the_band_instead_of_a_flag():
    # the per-op prefill tables hold cached = 0 only; a chunk over a cached prefix is looked up at
    # the uncached chunk with the same causal pairs (inside the fitted range), so it is no flag.
    # Its band widens by the measured error of that lookup, in proportion to the prefix's share
    # of the pairs: 512 over 1,536 cached (share 0.86) far more than 512 over 16 (share 0.06)
    steps = [Step(prefill=((512, 0),)), Step(prefill=((512, 16),)), Step(prefill=((512, 1536),))]
    df = predict(steps, model="llama-2-70b-hf", gpu="h100_sxm", tp=4, coeffs=H100_FILE)
    assert (df.ood_shape == 0).all() and (df.ood_what == "").all()
    assert df.interval_basis.tolist() == ["kernels", "kernels + cached prefix", "kernels + cached prefix"]
    width = (df.p90_us - df.p10_us) / df.predicted_us
    assert width[0] < width[1] < width[2]
    # the attention of the long prefix moved to its own band quantiles: 0.50^0.86 and 1.25^0.86
    # (the p90 side: the kernel's own p90 is already wider at share 0.06)
    from roofcal.model.intervals import CACHED_PREFIX, prefix_share
    share = float(prefix_share(*_equivalent(512.0, 1536.0)))
    assert share == pytest.approx(512 * 1536 / (512 * 1536 + 512 * 513 / 2), rel=1e-4)
    attn = df.attn_prefill_us[2]
    assert df.predicted_us[2] - df.p10_us[2] >= attn * (1.0 - CACHED_PREFIX[0] ** share) - 1e-6


def _equivalent(new, cached):
    """(equivalent uncached chunk, cached) descriptors of one chunk (attention.prefill_attention)."""
    n = 0.5 * (math.sqrt((2 * new + 1) ** 2 + 8 * new * cached) - 1)
    return n, cached


@pytest.mark.slow
def test_fits_memory_as_capacity_says():
    spec = load_model("llama-2-70b-hf")
    cap = capacity(spec, H100, 2)
    # 64 prompts of 512 tokens: 32,768 KV tokens
    prompts = Step(prefill=((512, 0),) * 64)
    # a huge decode batch: 2048 sequences at context 4000 → 2048 × 4001 = 8,194,048 KV tokens
    huge = Step(decode=(4000,) * 2048)
    assert 64 * 512 <= cap.kv_tokens < 2048 * 4001
    df = predict([prompts, huge], model="llama-2-70b-hf", gpu="h100_sxm", tp=2)
    assert df.fits_memory.tolist() == [True, False]
    # at the edge: exactly as many KV tokens as the cache holds fits, one more does not
    n = cap.kv_tokens
    edge = [Step(prefill=((n, 0),)), Step(prefill=((n + 1, 0),))]
    assert predict(edge, model="llama-2-70b-hf", gpu="h100_sxm", tp=2).fits_memory.tolist() == [True, False]
    # TP 1: 129 GiB of weights do not fit an H100 at all (vLLM would not start)
    df1 = predict([Step(decode=(10,))], model="llama-2-70b-hf", gpu="h100_sxm", tp=1)
    assert df1.fits_memory.tolist() == [False]


@pytest.mark.slow
def test_zero_shot_bootstrap_borrowed_stack_and_neutral():
    ref = coeff_io.load(H100_FILE, "h100_sxm")
    boot = bootstrap(ref, H100, A100)
    step = [Step(decode=(512, 1024))]
    kw = dict(model="llama-2-70b-hf", gpu="a100_sxm", tp=4)
    assert predict(step, coeffs=boot, **kw).zero_shot.tolist() == [True]
    # no coefficient file: the neutral roofline
    assert predict(step, **kw).zero_shot.tolist() == [True]
    # the A100 file is calibrated, but its default stack is borrowed from the H100 file
    assert predict(step, coeffs=A100_FILE, **kw).zero_shot.tolist() == [True]
    assert predict(step, coeffs=A100_FILE, stack="none", **kw).zero_shot.tolist() == [False]
    # a stack borrowed from a file of the same GPU is not zero-shot
    h = dict(model="llama-2-70b-hf", gpu="h100_sxm", tp=4)
    assert predict(step, coeffs=H100_FILE, stack=f"{H100_FILE}:splitwise", **h).zero_shot.tolist() == [False]
    assert not domain.zero_shot(ref) and domain.zero_shot(boot)


def fp8_model(tmp_path):
    cfg = json.loads(resolve_config_path("llama-2-7b-hf").read_text())
    cfg["quantization_config"] = {"quant_method": "fp8"}
    d = tmp_path / "llama-2-7b-fp8"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    assert load_model(d).weight_dtype == "fp8"
    return str(d)


@pytest.mark.slow
def test_fp8_gemm_on_a100_has_no_kernel_data(tmp_path):
    m = fp8_model(tmp_path)
    step = [Step(decode=(512, 1024))]
    a = predict(step, model=m, gpu="a100_sxm", tp=1, coeffs=A100_FILE)
    assert a.no_kernel_data.tolist() == [True]
    # the H100 file has gemm/fp8; the bf16 model on A100 has every kernel it needs
    assert predict(step, model=m, gpu="h100_sxm", tp=1, coeffs=H100_FILE).no_kernel_data.tolist() == [False]
    assert predict(step, model="llama-2-7b-hf", gpu="a100_sxm", tp=1,
                   coeffs=A100_FILE).no_kernel_data.tolist() == [False]


def test_per_op_rows(tmp_path):
    p = tmp_path / "ops.csv"
    pd.DataFrame({"gpu": "a100_sxm", "op": "gemm", "dtype": ["bf16", "bf16", "fp8"],
                  "m": [256, 65536, 256], "n": [4096, 4096, 4096], "k": [4096, 4096, 4096],
                  "latency_us": [100.0, 10000.0, 100.0]}).to_csv(p, index=False)
    df = predict_ops(p, coeffs=A100_FILE)
    assert list(df.columns[-5:]) == list(domain.OP_FLAGS)
    assert "rel_error" in df.columns and df.predicted_us.notna().all()
    lo, hi = file_range(A100_FILE, "gemm/bf16", "m", steps=False)
    assert df.ood_what.tolist() == ["", "gemm.m", ""]
    # m = 65536 beyond the fitted m ≤ hi: log2(65537) − log2(1 + hi)
    assert df.ood_shape[1] == pytest.approx(math.log2(65537) - math.log2(1 + hi), abs=1e-5)
    assert df.ood_shape[0] == 0 and df.ood_shape[2] == 0
    assert df.no_kernel_data.tolist() == [False, False, True]
    assert not df.zero_shot.any()            # per-op rows use no serving stack
    # in natural units: the value and the range fitted
    assert df.ood_detail.tolist() == ["", f"m 65,536 (fitted {lo:,.0f}–{hi:,.0f})", ""]
    assert domain.summary(df, "rows").startswith("1 of 3 rows out of domain: 1 beyond the fitted "
                                                 "shapes (gemm m 65,536 (fitted ")
    assert predict_ops(p).zero_shot.all()    # neutral roofline


def test_summary_line():
    df = pd.DataFrame({"ood_shape": [3.2, 1.0, 0.0, 0.0, 10.5],
                       "ood_what": ["attn_decode.context", "lm_head.n", "", "", "attn_prefill.heads"],
                       "ood_detail": ["context 1,200,000 (fitted 1–131,071)", "n 64,000 (fitted 64–32,000)", "", "",
                                      "heads 1,500 (fitted 4–128)"],
                       "ood_context": [True, False, True, False, False],
                       "fits_memory": [False, True, True, True, True], "zero_shot": False,
                       "no_kernel_data": [False, False, False, True, False]})
    # the farthest first, in natural units
    assert domain.summary(df) == (
        "4 of 5 steps out of domain: 3 beyond the fitted shapes (attn_prefill heads 1,500 (fitted 4–128); "
        "attn_decode context 1,200,000 (fitted 1–131,071); "
        "lm_head n 64,000 (fitted 64–32,000)), 2 beyond the context limit; 1 does not fit in memory; "
        "1 with kernels that have no fitted data (their shapes not checked)")


def test_summary_never_calls_unchecked_steps_inside_the_domain():
    # kernels without fitted data have no fitted shapes: such steps are not "inside the fitted
    # domain" (the roofline-only predict said "all 3 steps inside the fitted domain; ... 3 with
    # kernels that have no fitted data")
    flags = lambda nk, ctx=False: pd.DataFrame({"ood_shape": 0.0, "ood_what": "", "ood_detail": "",   # noqa: E731
                                               "ood_context": ctx, "fits_memory": True, "zero_shot": True,
                                               "no_kernel_data": nk}, index=range(3))
    assert domain.summary(flags(True), neutral=True) == (
        "3 steps not checked against a fitted domain: no fitted data (neutral roofline defaults, no --coeffs)")
    assert domain.summary(flags(True)) == (
        "3 steps not checked against a fitted domain: their kernels have no fitted data; 3 zero-shot "
        "(coefficients or serving stack not calibrated on this GPU)")
    assert domain.summary(flags([True, False, False])).startswith(
        "2 of 3 steps inside the fitted domain; 3 zero-shot (coefficients or serving stack not calibrated "
        "on this GPU); 1 with kernels that have no fitted data (their shapes not checked)")
    assert domain.summary(flags(True, [True, False, False]), neutral=True) == (
        "1 of 3 steps out of domain: 1 beyond the context limit; neutral roofline defaults (no --coeffs): "
        "no fitted shapes to check")
    assert domain.summary(flags(False).iloc[:1].assign(zero_shot=False)) == "the 1 step inside the fitted domain"


def test_worst_and_excess_are_vectorised():
    u = np.array([[0.0, 5.0], [3.0, 1.0], [1.0, 1.0]])
    d = domain.excess(u, np.array([1.0, 0.0]), np.array([2.0, 2.0]))
    assert d.tolist() == [[1.0, 3.0], [1.0, 0.0], [0.0, 0.0]]
    dist, what = domain.worst(d, ["a.x", "a.y"])
    assert dist.tolist() == [3.0, 1.0, 0.0] and what.tolist() == ["a.y", "a.x", ""]


@pytest.mark.slow
def test_cli_prints_one_line_summary(tmp_path):
    p = tmp_path / "steps.jsonl"
    p.write_text('{"decode": [10000000]}\n{"prefill": [[512, 0]], "decode": []}\n')
    out = tmp_path / "pred.csv"
    r = subprocess.run([sys.executable, "-m", "roofcal.cli", "predict", "--model", "llama-2-7b-hf",
                        "--gpu", "h100_sxm", "--tp", "1", "--coeffs", H100_FILE, "--steps", str(p),
                        "--out", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 3 and lines[0].startswith("wrote 2 rows")
    assert lines[1] == ("1 of 2 steps out of domain: 1 beyond the fitted shapes (attn_decode context "
                        "10,000,000 (fitted 1–131,071)), 1 beyond the context limit; 1 does not fit in memory")
    # the default (vllm) stack has no held-out steps: the interval line says so, and that the
    # band of the step beyond the fitted context was widened
    assert lines[2].startswith("80 % interval: median -") and lines[2].endswith(
        "2 steps from kernels only (their serving stack has no held-out steps, so its own error "
        "is not in the band); 1 step widened for kernels outside their fitted shapes (ood_shape; "
        "roofcal.model.intervals.EXTRAPOLATION)")
    df = pd.read_csv(out, keep_default_na=False)
    assert df.ood_what.tolist() == ["attn_decode.context", ""]


@pytest.mark.slow
def test_roofline_only_predict_says_what_it_is(tmp_path, capsys, monkeypatch):
    from roofcal.cli.main import main
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.jsonl").write_text('{"prefill": [[2048, 0]], "decode": []}\n{"prefill": [[512, 1536]], '
                                      '"decode": [100, 2000, 3000]}\n')
    assert main(["predict", "--model", "llama-3.1-70b-instruct", "--gpu", "h100_sxm", "--tp", "4",
                 "--steps", "s.jsonl", "--out", "p.csv"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == "2 steps not checked against a fitted domain: no fitted data (neutral roofline defaults, no --coeffs)"
    assert "inside the fitted domain" not in lines[1]


@pytest.mark.slow
def test_a_step_inside_the_printed_range_is_not_flagged_on_a_bootstrapped_gpu():
    """The range a flag checks is the range it prints. From the H100 fit (132 SMs, prefill
    ``seqs`` fitted 1–256, decode ``kv_heads`` 1–8) the ``sm`` rule scales each CTA-grid descriptor
    by sqrt(SM_ref/SM_new): on the L40S (142 SMs) seqs 1 reads the H100 at 1 → 2·sqrt(142/132) − 1
    = 1.0744 and 256 at 257·sqrt(142/132) − 1 = 265.56, printed (and checked) as 1–266; on the A100
    (108 SMs) kv_heads 8 moves to 9·sqrt(108/132) − 1 = 7.14, checked and printed as 7."""
    from roofcal.model import correction as K
    ref = coeff_io.load(H100_FILE, "h100_sxm")
    L40S = load_gpu("l40s")
    for new, kind, desc, stored, whole in ((L40S, "attn_prefill", "seqs", (1.0744, 265.557), (1, 266)),
                                           (A100, "attn_decode", "kv_heads", (0.8091, 7.1408), (1, 7))):
        _, p = K.lookup(bootstrap(ref, H100, new).params["ops"], kind, "bf16")
        k = K.OP_KINDS[kind]
        j = k.descriptors.index(desc)
        u = lambda b: float(np.asarray(p[b], np.float64)[j] * k.scale[j] + k.center[j])
        assert (2 ** u("lo") - 1, 2 ** u("hi") - 1) == pytest.approx(stored, abs=2e-4)
        low, high = domain.log2_bounds(kind, p)
        assert (2 ** low[j] - 1, 2 ** high[j] - 1) == pytest.approx(whole, abs=1e-9)
        # every whole value of the printed range is inside; one past it is flagged
        inside = np.log2(1.0 + np.arange(whole[0], whole[1] + 1.0))[:, None]
        assert not domain.excess(inside, low[j:j + 1], high[j:j + 1]).any()
        assert domain.excess(np.log2([[2.0 + whole[1]]]), low[j:j + 1], high[j:j + 1])[0, 0] > 0
    # the step the README's new-GPU section predicts: one 2,048-token prefill, on the L40S bootstrap,
    # and the same file's flag of a value outside (llama-2-7b's 32 KV heads) prints what it checks
    boot = bootstrap(ref, H100, L40S)
    one = predict([Step(prefill=((2048, 0),))], coeffs=boot, model="llama-3.1-70b-instruct", gpu="l40s", tp=4)
    assert one[["ood_shape", "ood_what", "ood_detail"]].values.tolist() == [[0.0, "", ""]]
    out = predict([Step(decode=(512, 1024))], coeffs=boot, model="llama-2-7b-hf", gpu="l40s", tp=1)
    assert out.ood_detail.tolist() == ["kv_heads 32 (fitted 1–8)"]
    assert out.ood_shape.tolist() == pytest.approx([math.log2(33 / 9)], abs=1e-5)     # log2(1+32) − log2(1+8)

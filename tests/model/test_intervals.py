"""Prediction intervals: conformal bands (roofcal.calibration.conformal), how predictions use
them (roofcal.model.intervals) and how coefficient files keep them — hand-checked."""

import math
from types import SimpleNamespace

import numpy as np
import pytest

from roofcal.calibration import conformal
from roofcal.errors import RoofcalError
from roofcal.io import yaml_load, yaml_text
from roofcal.model import coeffs as coeff_io
from roofcal.model import intervals as IV
from roofcal.model.predict import predict
from roofcal.physics.steps import Step

H100_FILE = "coeffs/h100_sxm.yaml"
#: step totals of one decode-only step (what step_interval reads of them)
DECODE = SimpleNamespace(n_prefill=np.array([0.0]), n_decode=np.array([4.0]))


def test_conformal_ranks_by_hand():
    # n = 20: (21 · 0.1, 21 · 0.9) = (2.1, 18.9) → the 2nd and 19th smallest
    assert conformal.ranks(20) == (2, 19)
    # n = 9: (1.0, 9.0) → the smallest and largest, the fewest rows with a finite band
    assert conformal.ranks(9) == (1, 9)
    assert conformal.ranks(8) == (0, 9)
    b = conformal.band(np.arange(1, 21) / 10.0)          # ratios 0.1 … 2.0
    assert (b.p10, b.p90, b.n) == (0.2, 1.9, 20)
    assert conformal.band(np.ones(8)) is None


def test_leave_one_out_bands_equal_refits_without_the_row():
    rng = np.random.default_rng(3)
    r = np.round(rng.lognormal(0.0, 0.1, 25), 2)          # rounded: ties included
    lo, hi = conformal.loo_bands(r)
    for i in range(len(r)):
        b = conformal.band(np.delete(r, i))
        assert (lo[i], hi[i]) == (b.p10, b.p90)
    # 25 rows: bands from 24 others are their (2nd, 23rd) smallest; exactly 21 of the 25 rows
    # land inside (coverage (23 − 2)/25 = 84 % whatever the values, when they are distinct)
    d = np.arange(25.0)
    lo, hi = conformal.loo_bands(d)
    assert int(((d >= lo) & (d <= hi)).sum()) == 21


def test_op_bands_strata_and_fallbacks():
    keys = np.array(["gemm/bf16"] * 30 + ["gemm/fp8"] * 10 + ["allreduce/nccl"] * 5, object)
    reg = np.array(["compute"] * 25 + ["memory"] * 5 + ["compute"] * 10 + ["memory"] * 5, object)
    ratios = np.linspace(0.9, 1.1, 45)
    bands = conformal.op_bands(keys, reg, ratios, min_rows=20)
    # gemm/bf16: 30 rows → own band and a compute band (25 rows); its 5 memory rows are too few
    assert set(bands["gemm/bf16"]) == {"all", "compute"}
    # gemm/fp8 has 10 rows: no band of its own, so the kind pools all 40 gemm rows
    assert "gemm/fp8" not in bands and bands["gemm"]["all"].n == 40
    assert "allreduce" not in bands                          # 5 rows: nothing at all
    assert IV.op_band(bands, "gemm", "bf16", "memory") is bands["gemm/bf16"]["all"]
    assert IV.op_band(bands, "gemm", "fp8", "compute") is bands["gemm"]["all"]
    assert IV.op_band(bands, "allreduce", "nccl") is None
    # the 30 gemm/bf16 ratios are 0.9 + k·0.2/44, k = 0…29; n = 30 → ranks (3, 28)
    b = bands["gemm/bf16"]["all"]
    assert b.p10 == pytest.approx(0.9 + 2 * 0.2 / 44) and b.p90 == pytest.approx(0.9 + 27 * 0.2 / 44)


def test_link_kinds_without_a_band_pool_over_every_link_kind():
    """NCCL's all-gather and all-to-all hold out 20 rows each here, too few for a band of their
    own or of their kind (each kind has one variant); pooled with the all-reduce's 25 rows, the 65
    link rows give one band: ranks (⌊66 · 0.1⌋, ⌈66 · 0.9⌉) = (6, 60) of the sorted ratios. A
    GEMM with as few rows gets none, and a link kind with a band of its own keeps it."""
    keys = np.array(["allgather/nccl"] * 20 + ["alltoall/nccl"] * 20 + ["allreduce/nccl"] * 25
                    + ["gemm/bf16"] * 20, object)
    ratios = np.concatenate([1.0 + np.arange(65) / 100.0, np.full(20, 2.0)])   # 1.00 … 1.64
    bands = conformal.op_bands(keys, np.full(85, "memory", object), ratios, min_rows=30)
    assert set(bands) == {IV.LINK}
    b = bands[IV.LINK]["all"]
    assert (b.p10, b.p90, b.n) == (pytest.approx(1.05), pytest.approx(1.59), 65)
    assert IV.op_band(bands, "allgather", "nccl") is b and IV.op_band(bands, "allreduce", "custom") is b
    assert IV.op_band(bands, "gemm", "bf16") is None
    # with 30 all-reduce rows its own band stands, and the pool still serves the collectives
    more = np.array(["allgather/nccl"] * 20 + ["alltoall/nccl"] * 20 + ["allreduce/nccl"] * 30, object)
    bands = conformal.op_bands(more, np.full(70, "memory", object), 1.0 + np.arange(70) / 100.0, min_rows=30)
    assert bands["allreduce/nccl"]["all"].n == 30 and bands[IV.LINK]["all"].n == 70
    assert IV.op_band(bands, "allreduce", "nccl") is bands["allreduce/nccl"]["all"]
    assert conformal.stratum_of(bands, ["alltoall/nccl", "allreduce/nccl"], ["memory"] * 2).tolist() == \
        ["link|all", "allreduce/nccl|all"]
    # a file names the pool as it names kinds; another name is refused
    back = IV.bands_from_dict(IV.bands_to_dict(bands), "c.yaml: field 'intervals.ops")
    assert back[IV.LINK]["all"].n == 70
    with pytest.raises(RoofcalError, match="intervals.ops.links' is not a kernel kind, kind/variant or 'link'"):
        IV.bands_from_dict({"links": IV.bands_to_dict(bands)[IV.LINK]}, "c.yaml: field 'intervals.ops")


def test_op_interval_uses_the_row_regime():
    bands = {"gemm/bf16": {"all": IV.Band(0.9, 1.1, 100), "compute": IV.Band(0.8, 1.2, 40)}}
    # row 0 compute-bound (tc ≥ tm), row 1 memory-bound → pooled band
    lo, hi = IV.op_interval(bands, "gemm", "bf16", np.array([10.0, 1.0]), np.array([5.0, 2.0]),
                            np.array([100.0, 50.0]))
    assert lo.tolist() == pytest.approx([80.0, 45.0]) and hi.tolist() == pytest.approx([120.0, 55.0])
    lo, _ = IV.op_interval(bands, "moe", "bf16", np.ones(1), np.ones(1), np.ones(1))
    assert math.isnan(lo[0])


def test_kernel_step_interval_by_hand():
    class Call:
        def __init__(self, kind, variant):
            self.kind, self.variant = kind, variant
    bands = {"gemm/bf16": {"all": IV.Band(0.9, 1.2, 50)}, "attn_decode/bf16": {"all": IV.Band(0.95, 1.05, 50)}}
    calls = {"mlp_up": Call("gemm", "bf16"), "attn_decode": Call("attn_decode", "bf16"),
             "elementwise": Call("elementwise", "bf16"), "allreduce": Call("allreduce", "custom")}
    parts = {"mlp_up": np.array([1000.0]), "attn_decode": np.array([200.0]),
             "elementwise": np.array([50.0]), "allreduce": np.array([0.0]),
             "overhead": np.array([300.0])}
    total = np.array([1550.0])
    lo, hi, cov, extrapolated, cached = IV.kernel_step_interval(bands, calls, parts, total)
    # 1550 − 0.1·1000 − 0.05·200 = 1440;  1550 + 0.2·1000 + 0.05·200 = 1760
    assert lo[0] == pytest.approx(1440.0) and hi[0] == pytest.approx(1760.0)
    assert cov[0] == 1.0            # all-reduce takes no time here; elementwise is never measured
    assert not extrapolated[0] and not cached[0]
    # the stack's decode band (0.8, 1.3) is wider: the union holds it
    lo, hi, basis = IV.step_interval(bands, {"decode": IV.Band(0.8, 1.3, 40)}, calls, parts, total,
                                     DECODE)
    assert (lo[0], hi[0], basis[0]) == (pytest.approx(1240.0), pytest.approx(2015.0), "steps+kernels")
    # no band for the all-reduce's time: partial
    parts["allreduce"] = np.array([100.0])
    _, _, basis = IV.step_interval(bands, {}, calls, parts, total + 100.0, DECODE)
    assert basis[0] == "kernels (partial)"


def test_shipped_h100_file_has_bands_from_its_heldout_rows():
    c = coeff_io.load(H100_FILE)
    doc = yaml_load(open(H100_FILE).read())
    # in every kernel set, every kernel has a band from its held-out rows, or its kind pools
    # (all-reduce variants hold out 14 / 14 / 25 rows, fewer than 30), or, for the NCCL
    # collectives (25 held-out rows each, their own kinds), the link kinds pool
    checked = 0
    for name, ks in doc["kernel_sets"].items():
        bands = coeff_io.with_kernels(c, name).op_bands
        for key, m in ks["metrics"]["heldout"].items():
            kind, variant = key.split("/")
            b = IV.op_band(bands, kind, variant)
            assert b is not None and b.p10 < 1.0 < b.p90, (name, key)
            own = bands.get(key, {}).get("all")
            assert own is None or own.n == m["n"]
            assert (own is None) == (m["n"] < conformal.MIN_ROWS)
            checked += 1
        assert bands["allreduce"]["all"].n == 14 + 14 + 25
        assert IV.op_band(bands, "allgather", "nccl") is bands[IV.LINK]["all"]
        assert bands[IV.LINK]["all"].n == 14 + 14 + 25 + 3 * 25
    assert checked == 17 + 16                      # vLLM 0.24 has no FP8-block GEMM rows
    # the splitwise stack has phase bands from its 40 + 40 held-out steps; the serving-run
    # stack has none (it was calibrated on serving runs, not steps)
    sw = c.stacks["splitwise"].intervals
    assert sw["prefill"].n == doc["metrics"]["heldout"]["steps/prefill"]["n"] == 40
    assert sw["decode"].p90 - sw["decode"].p10 < sw["prefill"].p90 - sw["prefill"].p10
    assert c.stacks["vllm"].intervals == {}


@pytest.mark.slow
def test_step_predictions_carry_intervals():
    steps = [Step(prefill=((512, 0),)), Step(decode=(512, 1024, 1024, 2000)),
             Step(prefill=((256, 0),), decode=(100, 3000))]
    c = coeff_io.load(H100_FILE)
    sw = predict(steps, model="llama-2-70b-hf", gpu="h100_sxm", tp=4, coeffs=H100_FILE, stack="splitwise")
    assert list(sw.columns[6:14]) == ["kernels", "clock", "sm_clock_mhz", "compute_scale", "predicted_us", "p10_us",
                                      "p90_us", "interval_basis"]
    assert (sw["clock"] == "burst").all() and (sw["compute_scale"] == 1.0).all()
    assert (sw.p10_us < sw.predicted_us).all() and (sw.predicted_us < sw.p90_us).all()
    assert sw.interval_basis.tolist() == ["steps+kernels"] * 3
    # a pure decode step: the stack's decode band is at least as wide as the kernels' one
    d = c.stacks["splitwise"].intervals["decode"]
    assert sw.p10_us[1] <= sw.predicted_us[1] * d.p10 + 1e-6
    assert sw.p90_us[1] >= sw.predicted_us[1] * d.p90 - 1e-6
    # the mixed step takes the prefill band too (the wider one)
    p = c.stacks["splitwise"].intervals["prefill"]
    assert sw.p90_us[2] >= sw.predicted_us[2] * p.p90 - 1e-6
    vl = predict(steps, model="llama-2-70b-hf", gpu="h100_sxm", tp=4, coeffs=H100_FILE, stack="vllm")
    assert vl.interval_basis.tolist() == ["kernels"] * 3
    # neutral defaults: no held-out evidence, no interval
    nt = predict(steps, model="llama-2-70b-hf", gpu="h100_sxm", tp=4)
    assert nt.p10_us.isna().all() and nt.interval_basis.tolist() == ["none"] * 3


@pytest.mark.slow
def test_bad_band_in_a_file_is_refused(tmp_path):
    doc = yaml_load(open(H100_FILE).read())
    doc["kernel_sets"]["vllm-0.24.0"]["intervals"]["ops"]["gemm/bf16"]["all"]["p10"] = 1.5   # above p90
    p = tmp_path / "bad.yaml"
    p.write_text(yaml_text(doc, sort_keys=False))
    with pytest.raises(RoofcalError, match="kernel_sets.vllm-0.24.0.intervals.ops.gemm/bf16.all' has p10 1.5 "
                                           "above p90"):
        coeff_io.load(p)
    doc = yaml_load(open(H100_FILE).read())
    doc["stacks"]["splitwise"]["intervals"]["decode"] = {"p10": 0.9}
    p.write_text(yaml_text(doc, sort_keys=False))
    with pytest.raises(RoofcalError, match="stacks.splitwise.intervals.decode' must give p10, p90 and n"):
        coeff_io.load(p)


def test_file_roundtrip_keeps_bands(tmp_path):
    c = coeff_io.load(H100_FILE)
    out = tmp_path / "again.yaml"
    coeff_io.save(c, out)
    assert out.read_text() == open(H100_FILE).read()


def test_roundtrip_reads_what_the_file_would_read():
    # the round trip skips the text: as_read(to_doc(c)) is exactly what yaml_load(to_yaml(c)) gives
    c = coeff_io.load("coeffs/a100_sxm.yaml")
    c.notes.append("a tuple reads back as a list")
    c.fit["pair"] = (1, 2.5e-17)
    assert coeff_io.as_read(coeff_io.to_doc(c)) == yaml_load(coeff_io.to_yaml(c))
    assert coeff_io.to_yaml(coeff_io.roundtrip(c)) == coeff_io.to_yaml(c)


def test_per_op_rows_carry_their_regime_band(tmp_path):
    from roofcal.model.predict import predict_ops
    p = tmp_path / "ops.csv"
    # a 4096³ BF16 GEMM is compute-bound (ideal 139 µs of compute vs 30 µs of memory on H100);
    # m = 1 is memory-bound (weights read: 32 MiB in 10 µs vs 0.03 µs of compute)
    p.write_text("gpu,op,dtype,m,n,k,latency_us\nh100_sxm,gemm,bf16,4096,4096,4096,200\n"
                 "h100_sxm,gemm,bf16,1,4096,4096,15\n")
    df = predict_ops(p, coeffs=H100_FILE)
    c = coeff_io.load(H100_FILE)
    comp, mem = c.op_bands["gemm/bf16"]["compute"], c.op_bands["gemm/bf16"]["memory"]
    assert df.ideal_compute_us[0] == pytest.approx(2 * 4096**3 / 989.4e6, rel=1e-4)
    assert df.p10_us[0] == pytest.approx(df.predicted_us[0] * comp.p10, rel=1e-6)
    assert df.p90_us[1] == pytest.approx(df.predicted_us[1] * mem.p90, rel=1e-6)
    cols = list(df.columns)
    assert cols[cols.index("predicted_us"):cols.index("predicted_us") + 3] == ["predicted_us", "p10_us", "p90_us"]


@pytest.mark.slow
def test_trace_steps_show_cycle_and_gpu_side():
    # a step measured by vLLM's tracing: GPU forward time and cycle time side by side with the
    # predicted GPU side and the predicted cycle
    s = Step(decode=(512,) * 8, duration_us=9000.0, cycle_us=12000.0)
    df = predict([s], model="llama-2-70b-hf", gpu="h100_sxm", tp=4, coeffs=H100_FILE, stack="vllm")
    r = df.iloc[0]
    assert (r.measured_us, r.measured_cycle_us) == (9000.0, 12000.0)
    kernels = sum(r[c] for c in df.columns if c.endswith("_us") and c not in
                  ("measured_us", "measured_cycle_us", "predicted_us", "p10_us", "p90_us",
                   "predicted_gpu_us", "overhead_us", "overlap_us"))
    # the GPU side is the kernels plus the GPU overheads: launch gaps on 80 layers and
    # synchronisation on 2 all-reduces per layer with 3 peers each
    o = yaml_load(open(H100_FILE).read())["stacks"]["vllm"]["overheads_us"]
    gpu_overheads = 80 * o["layer_us"] + 2 * 80 * 3 * o["allreduce_peer_us"]
    assert r.predicted_gpu_us == pytest.approx(kernels + gpu_overheads, rel=1e-5)
    # the cycle adds the CPU work less what hides behind the GPU
    assert r.predicted_gpu_us < r.predicted_us < r.predicted_gpu_us + r.overhead_us


def test_out_of_domain_kernels_widen_by_the_measured_slope():
    # a per-op row 2 log2 units beyond its fitted shapes: its band × e^(∓ 0.27 · 2) (GEMM)
    bands = {"gemm/bf16": {"compute": IV.Band(0.9, 1.2, 50), "memory": IV.Band(0.9, 1.2, 50)}}
    lo, hi = IV.op_interval(bands, "gemm", "bf16", np.array([10.0, 10.0]), np.array([1.0, 1.0]),
                            np.array([100.0, 100.0]), distance=np.array([0.0, 2.0]))
    w = math.exp(IV.EXTRAPOLATION["gemm"] * 2.0)
    assert lo.tolist() == pytest.approx([90.0, 90.0 / w]) and hi.tolist() == pytest.approx([120.0, 120.0 * w])
    assert IV.widening("gemm", 1.0) == pytest.approx(1.31, abs=0.005)       # 2× beyond the fitted size

"""The warm L2 of a per-op table: the resident share, hand-checked, and what it does to a kernel."""

import math

import numpy as np
import pytest

from roofcal.physics.cache import MIB, resident_fraction


@pytest.mark.slow
def test_resident_fraction_by_hand():
    c = 96 * MIB                                  # the L40S's L2
    w = np.array([c / 2, c, 2 * c, 0.0])
    got = np.asarray(resident_fraction(w, c))
    assert got == pytest.approx([1 / (1 + 2.0 ** -8), 0.5, 1 / 257, 1.0], rel=1e-6)
    assert np.all(np.diff(np.asarray(resident_fraction(np.geomspace(1e3, 1e10, 50), c))) <= 0)
    assert np.asarray(resident_fraction(w, 0.0)).tolist() == [0.0] * 4       # no L2 given


def test_a_warm_l2_shortens_memory_time_only_where_the_table_was_warm():
    """tm' = tm · (1 − res · g): 10 µs of memory time, all resident, g = 0.75 → 2.5 µs; cold
    (res None, a served step) or a kernel without a saving → 10 µs."""
    import jax.numpy as jnp
    from roofcal.model import correction as K
    p = {"l2_saving": jnp.float32(K.l2_saving_raw(0.75))}
    assert float(K.warm_memory_time(p, 10.0, 1.0)) == pytest.approx(2.5, rel=1e-5)
    assert float(K.warm_memory_time(p, 10.0, 0.5)) == pytest.approx(6.25, rel=1e-5)
    assert K.warm_memory_time(p, 10.0, None) == 10.0
    assert K.warm_memory_time({}, 10.0, 1.0) == 10.0
    neutral = K.neutral_op_params("attn_decode", 1)
    assert float(K.warm_memory_time(neutral, 10.0, 1.0)) == 10.0
    assert "l2_saving" not in K.neutral_op_params("allreduce", 1)


def test_the_saving_is_written_read_and_checked(tmp_path):
    import jax.numpy as jnp
    from roofcal.errors import RoofcalError
    from roofcal.model import coeffs as C
    from roofcal.model import correction as K
    op = {**C.load("coeffs/a100_sxm.yaml").params["ops"]["attn_decode/bf16"],
          "l2_saving": jnp.float32(K.NEUTRAL_L2_SAVING)}
    p = {**op, "l2_saving": jnp.float32(K.l2_saving_raw(0.75))}
    d = C.op_to_dict("attn_decode/bf16", p)
    assert d["l2_saving"] == pytest.approx(0.75)
    back = C.op_from_dict("attn_decode/bf16", d, "f.yaml")
    assert float(K.l2_saving(back)) == pytest.approx(0.75, abs=1e-6)
    assert C.op_to_dict("attn_decode/bf16", back)["l2_saving"] == d["l2_saving"]   # read back exactly
    assert "l2_saving" not in C.op_to_dict("attn_decode/bf16", op)                # no saving
    older = {k: v for k, v in d.items() if k != "l2_saving"}              # a file before the field
    assert float(K.l2_saving(C.op_from_dict("attn_decode/bf16", older, "f.yaml"))) < 1e-12
    with pytest.raises(RoofcalError, match=r"f.yaml: field 'ops.attn_decode/bf16.l2_saving' must be < 0.9"):
        C.op_from_dict("attn_decode/bf16", {**d, "l2_saving": 0.95}, "f.yaml")
    ar = C.op_to_dict("allreduce/nccl", C.load("coeffs/a100_sxm.yaml").params["ops"]["allreduce/nccl"])
    with pytest.raises(RoofcalError, match="l2_saving' is for kinds that read device memory"):
        C.op_from_dict("allreduce/nccl", {**ar, "l2_saving": 0.5}, "f.yaml")


def test_the_bootstrap_carries_the_saving_by_the_l2s_speed():
    """ρ = 1 / (1 − g) times (SM_n · f_n) / (SM_r · f_r) · bw_r / bw_n; H100 SXM → L40S:
    1.369 · 3.877 = 5.31, so g = 0.3 (ρ = 1.43) becomes 1 − 1 / 7.59 = 0.868; never below
    ρ = 1, nor above the largest saving (0.9)."""
    import jax.numpy as jnp
    from roofcal.model import correction as K
    from roofcal.physics.hardware import load_gpu
    from roofcal.transfer.bootstrap import carry_l2, l2_speed_ratio
    h100, l40s = load_gpu("h100_sxm"), load_gpu("l40s")
    r = l2_speed_ratio(h100, l40s)
    assert r == pytest.approx((142 * 2520) / (132 * 1980) * 3.35 / 0.864, rel=1e-9)
    assert r == pytest.approx(5.31, abs=0.005)
    p = {"l2_saving": jnp.float32(K.l2_saving_raw(0.3))}
    assert float(K.l2_saving(carry_l2(p, r))) == pytest.approx(1 - 0.7 / r, abs=1e-5)
    assert float(K.l2_saving(carry_l2(p, 0.25))) < 1e-9                      # ρ clamped at 1
    assert float(K.l2_saving(carry_l2({"l2_saving": jnp.float32(K.l2_saving_raw(0.8))}, r))) \
        == pytest.approx(0.8991, abs=1e-4)                                     # at most 0.9
    assert carry_l2({"latency": 1.0}, r) == {"latency": 1.0}


L40S = __import__("pathlib").Path(__file__).resolve().parents[2].parent / "shared/data/microbench/l40s"


@pytest.mark.slow
@pytest.mark.skipif(not L40S.is_dir(), reason="../shared/data/microbench/l40s absent")
def test_the_l40s_decode_attention_table_is_priced_with_its_warm_l2(monkeypatch):
    """Fitted on the L40S's bf16 decode attention (vLLM 0.14), the warm L2 saves most of the
    memory time of a resident KV (g ≈ 0.75, an L2 ≈ 4× as fast as its GDDR6) and the held-out
    error falls from 14.6 % (the term off) to 6.8 %."""
    import roofcal.model.predict as P
    from roofcal.calibration.fit import FitSettings, fit
    from roofcal.measurements.datasets import load
    from roofcal.model import correction as K
    from roofcal.physics.hardware import load_gpu
    gpu = load_gpu("l40s")
    t = load([L40S / "vllm-0.14.0" / "generation_attention_perf.parquet"], gpu=gpu).ops
    t = t[t.dtype == "bf16"].reset_index(drop=True)
    res = fit(gpu, t, [], FitSettings(progress=False))
    (ks,) = res.coeffs.kernel_sets.values()
    g = float(K.l2_saving(ks.ops["attn_decode/bf16"]))
    warm = ks.metrics["heldout"]["attn_decode/bf16"]["mape"]
    monkeypatch.setattr(P, "warm_share", lambda gpu, op, dt, tm: np.zeros(len(tm), np.float32))
    cold = fit(gpu, t, [], FitSettings(progress=False))
    (ks_cold,) = cold.coeffs.kernel_sets.values()
    assert 0.6 < g < 0.9 and warm < 8.0 < 12.0 < ks_cold.metrics["heldout"]["attn_decode/bf16"]["mape"]

"""Zero-shot prediction bands: the measured transfer error (roofcal.transfer.bands) and how a
bootstrap widens a file's bands with it."""

import math

import numpy as np
import pytest

from roofcal.calibration import conformal
from roofcal.errors import RoofcalError
from roofcal.io import sha256_file, yaml_load, yaml_text
from roofcal.model import coeffs as coeff_io
from roofcal.model import intervals as IV
from roofcal.physics.hardware import load_gpu
from roofcal.physics.components.comm import COLLECTIVES
from roofcal.transfer import bands as TB
from roofcal.transfer.bootstrap import bootstrap

H100, H200 = load_gpu("h100_sxm"), load_gpu("h200_sxm")


def test_symmetric_band_by_hand():
    # |log ratios| 0.01 … 0.10; n = 10: rank ⌈11 · 0.8⌉ = 9 → a = 0.09
    r = np.array([0.01, -0.02, 0.03, -0.04, 0.05, -0.06, 0.07, -0.08, 0.09, -0.10])
    b = TB.symmetric_band(r)
    assert b.n == 10 and b.p10 == pytest.approx(math.exp(-0.09)) and b.p90 == pytest.approx(math.exp(0.09))
    assert TB.symmetric_band(r[:3]) is None          # ⌈4 · 0.8⌉ = 4 > 3 values


def test_widen_joins_own_and_transfer_bands():
    own = {"gemm/bf16": {"all": IV.Band(0.9, 1.1, 100), "compute": IV.Band(0.8, 1.05, 40)},
           "allreduce": {"all": IV.Band(0.93, 1.08, 53)}}
    transfer = {"gemm": IV.Band(0.7, 1.4, 1000), "allreduce": IV.Band(0.95, 1.05, 400)}
    w = conformal.widen(own, transfer)
    # regime strata dropped; each band the union of own and the kind's transfer band
    assert w["gemm/bf16"] == {"all": IV.Band(0.7, 1.4, 1000)}
    assert w["allreduce"] == {"all": IV.Band(0.93, 1.08, 400)}
    assert w["gemm"] == {"all": transfer["gemm"]}
    # a kind without a measured transfer band takes the widest measured one (gemm: log 2)
    w = conformal.widen({"moe/bf16": {"all": IV.Band(0.9, 1.1, 10)}}, transfer)
    assert w["moe/bf16"]["all"] == IV.Band(0.7, 1.4, 1000)


@pytest.mark.slow
def test_shipped_transfer_bands_match_the_shipped_fits():
    doc = yaml_load(open(TB.DEFAULT_PATH).read())
    for gpu, src in doc["from"].items():
        assert sha256_file(src["file"]) == src["sha256"], f"{TB.DEFAULT_PATH} is stale for {gpu}: " \
            "rerun 'roofcal gpu transfer-bands'"
    again = TB.measure()
    # re-measured on this machine: equal up to XLA's CPU rounding (float32 predictions)
    assert _close(again["bands"], doc["bands"]) and _close(again["per_direction"], doc["per_direction"])
    # a collective's launch cost and link are its host's: every collective's band is wider than
    # every kernel's that runs on one GPU; decode attention's narrowed from 3.54× to 2.00× wide
    # once the warm L2 was priced apart (docs/model.md)
    widths = {k: b["p90"] / b["p10"] for k, b in doc["bands"].items()}
    comm = {"allreduce", *COLLECTIVES}
    assert comm <= set(widths) and len(widths) > len(comm)
    assert min(widths[k] for k in comm) > max(w for k, w in widths.items() if k not in comm)
    assert widths["attn_decode"] < 2.1


def test_bootstrap_carries_widened_bands():
    ref = coeff_io.load("coeffs/h100_sxm.yaml")
    tb = TB.load()
    c = coeff_io.roundtrip(bootstrap(ref, H100, H200))
    for key in ("gemm/bf16", "attn_decode/bf16", "moe/fp8"):
        kind = key.split("/")[0]
        want = tb[kind].union(ref.op_bands[key]["all"])
        got = c.op_bands[key]["all"]
        assert (got.p10, got.p90) == pytest.approx((want.p10, want.p90), rel=1e-5)
    assert "transfer_bands" in c.intervals["source"] and "reference" in c.intervals["source"]
    # without transfer bands a bootstrap has none (rather than the reference GPU's own)
    assert bootstrap(ref, H100, H200, transfer_bands=False).intervals == {}


def test_bad_transfer_bands_file(tmp_path):
    p = tmp_path / "tb.yaml"
    doc = yaml_load(open(TB.DEFAULT_PATH).read())
    doc["bands"]["gemm"]["p10"] = -1
    p.write_text(yaml_text(doc, sort_keys=False))
    with pytest.raises(RoofcalError, match=r"field 'bands.gemm.p10' must be a positive ratio"):
        TB.load(p)


def _close(a, b, rel=1e-4) -> bool:
    """Nested dicts / lists of numbers equal within ``rel`` (strings and keys exactly)."""
    if isinstance(a, dict):
        return isinstance(b, dict) and set(a) == set(b) and all(_close(a[k], b[k], rel) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(_close(x, y, rel) for x, y in zip(a, b))
    if isinstance(a, (int, float)) and not isinstance(a, bool):
        return isinstance(b, (int, float)) and abs(a - b) <= rel * max(abs(a), abs(b), 1e-12)
    return a == b

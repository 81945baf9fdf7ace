"""The zero-shot error a bootstrap quotes: measured per pair of GPUs, chosen by memory family."""

import pytest

from roofcal.errors import RoofcalError
from roofcal.physics.hardware import load_gpu
from roofcal.transfer import expectation as E

PAIRS = [
    {"from": "h100_sxm", "to": "a100_sxm", "from_memory": "hbm3", "to_memory": "hbm2e", "mean": 21.6,
     "kinds": {"gemm/bf16": 20.0, "attn_decode/bf16": 27.6}},
    {"from": "a100_sxm", "to": "h100_sxm", "from_memory": "hbm2e", "to_memory": "hbm3", "mean": 34.4,
     "kinds": {"gemm/bf16": 16.0, "allreduce/custom_eager": 72.7}},
    {"from": "h100_sxm", "to": "l40s", "from_memory": "hbm3", "to_memory": "gddr6", "mean": 94.4,
     "kinds": {"gemm/bf16": 57.7, "attn_prefill/fp8": 261.2}},
]


def test_the_pairs_of_the_same_memory_families_are_quoted():
    h100, h200, l40s = load_gpu("h100_sxm"), load_gpu("h200_sxm"), load_gpu("l40s")
    assert E.expectation(h100, h200, PAIRS) == (
        "measured zero shot from HBM to HBM memory (h100_sxm → a100_sxm, a100_sxm → h100_sxm): "
        "22–34 % per-op MAPE on the mean over kernel kinds, 16–73 % per kind")
    assert E.expectation(h100, l40s, PAIRS) == (
        "measured zero shot from HBM to GDDR memory (h100_sxm → l40s): 94–94 % per-op MAPE on the "
        "mean over kernel kinds, 58–261 % per kind")
    # no pair of that kind (GDDR to HBM), or a datasheet without memory kind: every pair
    unknown = h200.replace(memory_kind="")
    for a, b in ((l40s, h100), (h100, unknown)):
        assert E.expectation(a, b, PAIRS).startswith("measured zero shot between any two measured "
                                                     "GPUs (h100_sxm → a100_sxm, a100_sxm → h100_sxm, "
                                                     "h100_sxm → l40s): 22–94 %")
    assert E.memory_family("gddr6x") == "gddr" and E.memory_family("") == "unknown"


def test_the_few_shot_error_is_quoted_where_every_chosen_pair_has_it():
    h100, h200 = load_gpu("h100_sxm"), load_gpu("h200_sxm")
    few = [{**PAIRS[0], "few_shot": {"rows": 300, "draw": "spread", "mean": 6.9}},
           {**PAIRS[1], "few_shot": {"rows": 300, "draw": "spread", "mean": 6.5}}, PAIRS[2]]
    assert E.expectation(h100, h200, few).endswith(
        "16–73 % per kind; refitted on 300 shapes a kernel spread by roofcal gpu plan, 6.5–6.9 % held out")
    # a chosen pair without it: the zero shot alone
    assert E.expectation(h100, h200, [few[0], PAIRS[1]]).endswith("16–73 % per kind")


def test_a_bad_file_is_named(tmp_path):
    p = tmp_path / "z.yaml"
    p.write_text("schema: roofcal-zero-shot/1\npairs: [{from: a, to: b}]\n")
    with pytest.raises(RoofcalError, match="z.yaml: field 'pairs' must list"):
        E.load(p)
    p.write_text("schema: roofcal-zero-shot/1\npairs: [{from: a, to: b, mean: 1, kinds: {gemm/bf16: 1},"
                 " few_shot: {rows: many, mean: 2}}]\n")
    with pytest.raises(RoofcalError, match="z.yaml: field 'few_shot' of pair a → b must be"):
        E.load(p)
    p.write_text("schema: other\n")
    with pytest.raises(RoofcalError, match="z.yaml: field 'schema' must be 'roofcal-zero-shot/1'"):
        E.load(p)


@pytest.mark.slow
def test_the_shipped_file_is_what_the_benchmark_measures():
    """The H100 → A100 pair of coeffs/zero_shot.yaml, measured again on the bundled tables."""
    from roofcal.bench import gpus
    tables = {g: gpus.tp_kinds(gpus.datasets.load(gpus.table_paths(g), gpu=load_gpu(g)).ops)
              for g in ("a100_sxm", "h100_sxm")}
    fits = {g: gpus.fitted(g, tables[g]) for g in tables}
    zs = gpus.zero_shot({"a100_sxm": tables["a100_sxm"]}, {"h100_sxm": fits["h100_sxm"]})
    fs = gpus.few_shot({"a100_sxm": tables["a100_sxm"]}, {"h100_sxm": fits["h100_sxm"]},
                       sizes=(300,), draws=("spread",))
    doc = gpus.expectations_doc(zs, fs)
    (mine,) = doc["pairs"]
    (shipped,) = [p for p in E.load() if (p["from"], p["to"]) == ("h100_sxm", "a100_sxm")]
    assert mine == shipped and shipped["few_shot"] == {"rows": 300, "draw": "spread", "mean": 6.9}
    assert {(p["from"], p["to"]) for p in E.load()} >= {("h100_sxm", "a100_sxm"), ("a100_sxm", "h100_sxm")}


def test_the_bootstrap_quotes_it():
    from roofcal.model.coeffs import load
    from roofcal.transfer.bootstrap import bootstrap
    c = bootstrap(load("coeffs/h100_sxm.yaml"), load_gpu("h100_sxm"), load_gpu("h200_sxm"))
    assert "expect per-op errors as measured zero shot from HBM to HBM memory" in c.notes[0]

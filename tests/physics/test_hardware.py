"""GPU datasheets: bundled files, lookup, and refusal of bad or sparse figures."""

import pytest

from roofcal.errors import RoofcalError
from roofcal.io import yaml_load, yaml_text
from roofcal.physics.hardware import bundled_gpus, load_gpu, parse_datasheet

REQUIRED = {"h100_sxm", "h100_pcie", "h200_sxm", "a100_sxm", "a100_pcie_40gb", "l40s", "l4", "b200"}


def test_bundled_set_and_sources():
    specs = {g.name: g for g in bundled_gpus()}
    assert REQUIRED <= set(specs)
    for g in specs.values():
        assert g.sources and all("http" in s or "whitepaper" in s.lower() or "SMs" in s
                                 for s in g.sources)
        assert g.fp8_tflops <= 2.05 * g.bf16_tflops


def test_h100_figures_and_units():
    g = load_gpu("h100_sxm")
    assert (g.bf16_tflops, g.fp8_tflops, g.hbm_bandwidth_tbs, g.sm_count) == (989.4, 1978.9, 3.35, 132)
    assert g.peak_flops_per_us("bf16") == pytest.approx(989.4e6)
    assert g.peak_flops_per_us("fp8") == pytest.approx(1978.9e6)
    assert g.peak_flops_per_us("int4") == pytest.approx(989.4e6)    # W4A16 runs at BF16 peak
    assert g.hbm_bytes_per_us == pytest.approx(3.35e6)
    assert g.link_bytes_per_us == pytest.approx(450e3)
    a100 = load_gpu("a100_sxm")
    assert a100.peak_flops_per_us("fp8") == pytest.approx(312e6)   # no FP8: BF16 peak


def test_aliases_including_blis_names():
    assert load_gpu("H100").name == "h100_sxm"
    assert load_gpu("A100-80").name == "a100_sxm"
    assert load_gpu("L40S").name == "l40s"


def _sheet(**over):
    """The L40S's bundled datasheet as a mapping, every optional field given (its FP4 peak as 0:
    Ada has no FP4 tensor cores; the bundled file leaves it out, as bundled files may)."""
    d = yaml_load(open("roofcal/physics/hardware/l40s.yaml").read())
    d["dense_tflops"] = {**d["dense_tflops"], "fp4": 0}
    d.update(over)
    return d


def test_blis_l40s_sparse_fp8_is_refused():
    # BLIS's hardware_config.json gives L40S TFlopsFP8 = 1466 next to a dense BF16 of 362.05
    with pytest.raises(RoofcalError, match=r"dense_tflops.fp8.*4.0x the BF16 peak.*sparsity"):
        parse_datasheet(_sheet(dense_tflops={"bf16": 362.05, "fp8": 1466.0}), "l40s.yaml")


def test_fp4_peak_b200_by_hand_sparse_refused_and_hashed_only_where_given():
    """The B200's dense FP4 peak: NVIDIA's 18 PFLOPS per GPU is with sparsity, so 9,000 TFLOP/s
    dense, four times its BF16 (2,250). A figure above four times BF16 is a sparse one; a GPU
    without FP4 hashes as it did before the field (every coefficient file's datasheet hash holds)."""
    b200 = load_gpu("b200")
    assert b200.fp4_tflops == 9000.0 == 4 * b200.bf16_tflops
    assert b200.peak_flops_per_us("fp4") == 9.0e9                      # 9,000e12 FLOP/s = 9e9 /µs
    assert all(g.fp4_tflops == 0.0 for g in bundled_gpus() if g.name != "b200")
    with pytest.raises(RoofcalError, match=r"dense_tflops.fp4'=18000 is 8.0x the BF16 peak.*sparsity"):
        parse_datasheet(_sheet(dense_tflops={"bf16": 2250.0, "fp4": 18000.0}), "b.yaml")
    h100 = load_gpu("h100_sxm")
    assert "fp4_tflops" not in h100.canonical()
    assert h100.sha256() == h100.replace(fp4_tflops=0.0).sha256() != h100.replace(fp4_tflops=3957.8).sha256()
    from roofcal.model import coeffs
    assert coeffs.load("coeffs/h100_sxm.yaml").datasheet_sha256 == h100.sha256()


def test_sparsity_keys_refused():
    with pytest.raises(RoofcalError, match="sparsity"):
        parse_datasheet(_sheet(sparse_tflops={"bf16": 733}), "x.yaml")
    with pytest.raises(RoofcalError, match="sparsity"):
        parse_datasheet(_sheet(dense_tflops={"bf16": 362.05, "fp8_sparse": 1466}), "x.yaml")


@pytest.mark.parametrize("field", ["hbm_bandwidth_tbs", "sm_count", "sources", "interconnect_bandwidth_gbs"])
def test_missing_field_named(field):
    d = _sheet()
    del d[field]
    with pytest.raises(RoofcalError, match=f"x.yaml: missing field '{field}'"):
        parse_datasheet(d, "x.yaml")


def test_bad_values_named():
    with pytest.raises(RoofcalError, match="hbm_bandwidth_tbs"):
        parse_datasheet(_sheet(hbm_bandwidth_tbs=-1), "x.yaml")
    with pytest.raises(RoofcalError, match="unknown field 'tdp'"):
        parse_datasheet(_sheet(tdp=350), "x.yaml")


def test_datasheet_from_path(tmp_path):
    p = tmp_path / "my.yaml"
    p.write_text(yaml_text(_sheet(name="my_gpu")))
    assert load_gpu(str(p)).name == "my_gpu"
    with pytest.raises(RoofcalError, match="unknown GPU 'h900'"):
        load_gpu("h900")


def test_modified_datasheets_are_validated_too():
    g = load_gpu("h100_sxm")
    assert g.replace(hbm_bandwidth_tbs=4.8).hbm_bytes_per_us == pytest.approx(4.8e6)
    for bad in (dict(fp8_tflops=-5.0), dict(fp8_tflops=float("nan")), dict(hbm_bandwidth_tbs=0.0),
                dict(fp8_tflops=4000.0)):
        with pytest.raises(RoofcalError):
            g.replace(**bad)


def test_power_fields_are_optional_checked_and_outside_the_hash():
    d = {k: v for k, v in _sheet().items() if k not in ("power_limit_w", "boost_clock_mhz")}
    plain = parse_datasheet(d, "x.yaml")
    assert plain.power_limit_w == 0.0 and plain.boost_clock_mhz == 0.0      # unknown: no cap modelled
    powered = parse_datasheet({**d, "power_limit_w": 350, "boost_clock_mhz": 2520}, "x.yaml")
    assert (powered.power_limit_w, powered.boost_clock_mhz) == (350.0, 2520.0)
    # the kernel corrections are relative to the peaks, not to the power: a coefficient file
    # fitted before these fields existed still matches its datasheet
    assert powered.sha256() == plain.sha256()
    for bad in (-5, 0, "700 W", float("nan")):
        with pytest.raises(RoofcalError, match="x.yaml: field 'power_limit_w' must be a positive number"):
            parse_datasheet({**d, "power_limit_w": bad}, "x.yaml")
    h100 = load_gpu("h100_sxm")
    assert (h100.power_limit_w, h100.boost_clock_mhz) == (700.0, 1980.0)
    assert all(g.power_limit_w > 0 for g in bundled_gpus())


@pytest.mark.parametrize("spec", bundled_gpus(), ids=lambda g: g.name)
def test_datasheet_template_is_the_inverse_of_the_parser(spec, tmp_path):
    """parse(template(spec)) == spec for every bundled datasheet, names and citations included,
    as a mapping and as the YAML file 'roofcal gpu show NAME --yaml' writes."""
    from dataclasses import asdict

    from roofcal.physics.hardware import datasheet_dict, datasheet_yaml, read_datasheet
    back = parse_datasheet(datasheet_dict(spec), "template")
    assert asdict(back) == asdict(spec)                   # aliases too (not in ==)
    path = tmp_path / f"{spec.name}.yaml"
    path.write_text(datasheet_yaml(spec, header="a header\nof two lines"), encoding="utf-8")
    back = read_datasheet(path)
    assert asdict(back) == asdict(spec) and back.sha256() == spec.sha256()
    # the bundled file's own figures, key for key (fp16 is written even where the file left it
    # to default to bf16; an absent FP8 or INT8 peak is written as 0, "none")
    raw = yaml_load(open(f"roofcal/physics/hardware/{spec.name}.yaml").read())
    mine = datasheet_dict(spec)
    assert {k: v for k, v in mine["dense_tflops"].items() if k != "fp16"} == \
        {"fp8": 0.0, "int8": 0.0, "fp4": 0.0} | {k: float(v) for k, v in raw["dense_tflops"].items()
                                     if k != "fp16" and v is not None}
    assert set(mine) - {"display_name", "aliases"} == set(raw) - {"display_name", "aliases", "notes"}


def test_datasheet_template_follows_the_dataclass():
    """A field a GPUSpec has beyond its defaults is written under its own name; a field at its
    default is left out (so an optional figure nobody gave is not invented), except an FP8 or
    INT8 peak of 0, written as 0: the GPU has no such tensor cores (and reading it warns of nothing)."""
    from roofcal.physics.hardware import datasheet_dict
    g = load_gpu("a100_sxm")
    d = datasheet_dict(g)
    assert d["dense_tflops"]["fp8"] == 0.0 == g.fp8_tflops               # no FP8 tensor cores, said
    assert d["sm_count"] == 108 and isinstance(d["sm_count"], int)
    assert list(d)[:5] == ["schema", "name", "display_name", "aliases", "sources"]
    assert "aliases" not in datasheet_dict(g.replace(aliases=()))


def test_transfer_fields_every_bundled_gpu_has_checked_and_outside_the_hash():
    """L2 capacity, memory kind and compute capability: given for every bundled GPU (the
    vendors' figures, cited), validated, and not part of the hash (no correction reads them)."""
    expected = {"a100_sxm": (40, "hbm2e", "8.0"), "h100_sxm": (50, "hbm3", "9.0"),
                "l40s": (96, "gddr6", "8.9"), "l4": (48, "gddr6", "8.9"), "h200_sxm": (50, "hbm3e", "9.0")}
    for g in bundled_gpus():
        assert g.l2_cache_mib > 0 and g.memory_kind and g.compute_capability, g.name
        assert any("L2" in s for s in g.sources), g.name
        if g.name in expected:
            assert (g.l2_cache_mib, g.memory_kind, g.compute_capability) == expected[g.name]
    d = {k: v for k, v in _sheet().items() if k not in ("l2_cache_mib", "memory_kind", "compute_capability")}
    plain = parse_datasheet(d, "x.yaml")
    assert (plain.l2_cache_mib, plain.memory_kind, plain.compute_capability) == (0.0, "", "")
    full = parse_datasheet({**d, "l2_cache_mib": 96, "memory_kind": "GDDR6", "compute_capability": "8.9"}, "x.yaml")
    assert (full.l2_cache_mib, full.memory_kind, full.compute_capability) == (96.0, "gddr6", "8.9")
    assert full.sha256() == plain.sha256()
    with pytest.raises(RoofcalError, match="x.yaml: field 'memory_kind' must be one of hbm2, "):
        parse_datasheet({**d, "memory_kind": "ddr5"}, "x.yaml")
    with pytest.raises(RoofcalError, match="x.yaml: field 'compute_capability' must be 'major.minor'"):
        parse_datasheet({**d, "compute_capability": 9}, "x.yaml")
    with pytest.raises(RoofcalError, match="x.yaml: field 'l2_cache_mib' must be a positive number"):
        parse_datasheet({**d, "l2_cache_mib": -1}, "x.yaml")


# --------------------------------------------------------------------------------------------
# a new GPU's template, optional fields left out, GDDR memory


def test_template_of_a_new_gpu_has_its_name_empty_sources_and_parses_once_filled(tmp_path):
    """``roofcal gpu template my_gpu``: the name given, ``sources: []``, every figure blank with the
    reference's value only in a comment marked with its name; refused as it is (one line naming
    the blank fields), read back to the figures written in."""
    from roofcal.physics.hardware import read_datasheet
    from roofcal.physics.hardware.datasheet import template_yaml
    text = template_yaml("my_gpu", load_gpu("h100_sxm"))
    raw = yaml_load(text)
    assert raw["name"] == "my_gpu" and raw["sources"] == [] and raw["aliases"] == []
    assert set(raw["dense_tflops"].values()) == {None} and raw["hbm_bandwidth_tbs"] is None
    assert "h100_sxm" not in {str(v) for v in raw.values()}          # nothing of the H100's but hints
    assert "bf16:                       # h100_sxm: 989.4" in text
    assert "interconnect_bandwidth_gbs:   # h100_sxm: 450" in text
    assert "ONE direction" in text and "2^30 bytes" in text and "HBM or GDDR alike" in text
    assert "FP32 accumulate" in text and "no sparsity" in text
    path = tmp_path / "my_gpu.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(RoofcalError, match=r"my_gpu.yaml: 7 required fields are blank: sources, "
                                           r"dense_tflops.bf16, hbm_bandwidth_tbs, hbm_capacity_gib, "
                                           r"interconnect, interconnect_bandwidth_gbs, sm_count"):
        read_datasheet(path)
    filled = {"sources: []": 'sources: ["My GPU spec sheet: 500 TFLOPS BF16 dense, 2 TB/s, 64 GB"]',
              "  bf16:": "  bf16: 500", "  fp8:": "  fp8: 0", "hbm_bandwidth_tbs:": "hbm_bandwidth_tbs: 2.0",
              "hbm_capacity_gib:": "hbm_capacity_gib: 64", "interconnect:": "interconnect: pcie5",
              "interconnect_bandwidth_gbs:": "interconnect_bandwidth_gbs: 64", "sm_count:": "sm_count: 100",
              "memory_kind:": "memory_kind: gddr7"}
    lines = [filled.get(ln.split("#")[0].rstrip(), ln) for ln in text.splitlines()]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    # the optional fields still blank, one warning each (fp8 and memory_kind were given)
    assert [w.split("'")[1] for w in _warnings_of(path)] == [
        "aliases", "dense_tflops.fp16", "dense_tflops.int8", "dense_tflops.fp4", "power_limit_w",
        "boost_clock_mhz", "l2_cache_mib", "compute_capability"]
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        g = read_datasheet(path)
    assert (g.name, g.display_name, g.bf16_tflops, g.fp16_tflops, g.fp8_tflops) == ("my_gpu", "my_gpu", 500.0, 500.0, 0.0)
    assert (g.hbm_bandwidth_tbs, g.hbm_capacity_gib, g.interconnect_bandwidth_gbs, g.sm_count) == (2.0, 64.0, 64.0, 100)
    assert g.memory_kind == "gddr7" and g.balance_flops_per_byte == 250.0     # 500 / 2
    with pytest.raises(RoofcalError, match="a GPU name is letters, digits"):
        template_yaml("my gpu", load_gpu("h100_sxm"))


def _written(tmp_path, d) -> "Path":
    path = tmp_path / "x.yaml"
    path.write_text(yaml_text(d, sort_keys=False), encoding="utf-8")
    return path


def _warnings_of(path) -> list[str]:
    import warnings

    from roofcal.errors import RoofcalWarning
    from roofcal.physics.hardware import read_datasheet
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        read_datasheet(path)
    return [str(w.message) for w in caught if issubclass(w.category, RoofcalWarning)]


@pytest.mark.parametrize("key", ["aliases", "dense_tflops.fp16", "dense_tflops.fp8", "dense_tflops.int8",
                                 "dense_tflops.fp4", "power_limit_w", "boost_clock_mhz", "l2_cache_mib", "memory_kind",
                                 "compute_capability"])
def test_each_optional_field_left_out_is_one_warning_naming_it_and_its_default(key, tmp_path):
    from roofcal.physics.hardware.datasheet import OMITTED
    d = _sheet()                                           # the L40S: every optional field given
    assert _warnings_of(_written(tmp_path, d)) == []
    if key.startswith("dense_tflops."):
        d["dense_tflops"] = {k: v for k, v in d["dense_tflops"].items() if k != key.split(".")[1]}
    else:
        del d[key]
    got = _warnings_of(_written(tmp_path, d))
    default, effect = OMITTED[key]
    assert len(got) == 1 and got[0].startswith(f"{tmp_path / 'x.yaml'}: optional field '{key}' not given, "
                                               f"taken as {default}: {effect}"), got
    assert "\n" not in got[0]
    # blank (what a template leaves) is the same as left out
    if not key.startswith("dense_tflops."):
        assert _warnings_of(_written(tmp_path, {**_sheet(), key: None})) == got


def test_what_an_absent_figure_warns_of_by_hand(tmp_path):
    d = {k: v for k, v in _sheet().items() if k != "boost_clock_mhz"}
    assert _warnings_of(_written(tmp_path, d)) == [
        f"{tmp_path / 'x.yaml'}: optional field 'boost_clock_mhz' not given, taken as 0 (unknown): a "
        "prediction's clock is known only as a share of the maximum (compute_scale; its sm_clock_mhz "
        "column is NaN), and a bootstrap scales the warm-L2 saving by SM counts alone"]
    # an FP8 peak of 0 says "no FP8 tensor cores": the same GPU as leaving it out, without the warning
    none = {**_sheet(), "dense_tflops": {"bf16": 312.0, "int8": 624.0, "fp8": 0, "fp4": 0}}
    left = {**_sheet(), "dense_tflops": {"bf16": 312.0, "int8": 624.0, "fp4": 0}}
    assert parse_datasheet(none, "x.yaml") == parse_datasheet(left, "x.yaml")
    assert parse_datasheet(none, "x.yaml").fp8_tflops == 0.0
    assert [w.split("'")[1] for w in _warnings_of(_written(tmp_path, none))] == ["dense_tflops.fp16"]
    with pytest.raises(RoofcalError, match="x.yaml: field 'dense_tflops.bf16' must be a positive number"):
        parse_datasheet({**_sheet(), "dense_tflops": {"bf16": 0}}, "x.yaml")


def test_bundled_datasheets_read_without_warnings():
    import warnings

    from roofcal.physics.hardware import HERE, read_datasheet
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for p in sorted(HERE.glob("*.yaml")):
            read_datasheet(p)                 # b200 leaves boost_clock_mhz out, cited in its sources


@pytest.mark.parametrize("kind", ["gddr6", "gddr6x", "gddr7", "GDDR6X", "hbm3e"])
def test_memory_kinds_gddr_included(kind):
    from roofcal.transfer.expectation import memory_family
    g = parse_datasheet(_sheet(memory_kind=kind), "x.yaml")
    assert g.memory_kind == kind.lower()
    assert memory_family(g.memory_kind) == ("hbm" if kind.startswith("hbm") else "gddr")


def test_bad_input_is_one_line_naming_file_and_field_without_traceback(tmp_path, capsys):
    from roofcal.cli.main import main
    p = _written(tmp_path, _sheet(memory_kind="ddr5"))
    assert main(["gpu", "show", str(p)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"roofcal: error: {p}: field 'memory_kind' must be one of hbm2, hbm2e, hbm3, hbm3e, "
                          "gddr6, gddr6x, gddr7")
    p = _written(tmp_path, {**_sheet(), "sm_count": None})
    assert main(["gpu", "show", str(p)]) == 2
    assert capsys.readouterr().err.startswith(f"roofcal: error: {p}: field 'sm_count' is blank (SMs: ")

from roofcal import io


def test_a_large_yaml_text_is_parsed_once_and_handed_out_as_copies(monkeypatch):
    import yaml
    big = "rows:\n" + "".join(f"  - {{at: '{i} {i + 1}', ratio: {i / 7:.6f}}}\n" for i in range(3000))
    want = yaml.safe_load(big)
    calls = []
    real = yaml.load
    monkeypatch.setattr(yaml, "load", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(io, "_PARSED", {})
    assert len(big) >= io.PARSED_FROM
    first = io.yaml_load(big)
    first["rows"][0]["at"] = "changed"                       # a caller's change stays its own
    second = io.yaml_load(big)
    assert len(calls) == 1 and second == want and second["rows"][0]["at"] == "0 1"
    io.yaml_load(big.replace("0.142857", "0.142858"))        # other text: parsed
    assert len(calls) == 2
    io.yaml_load("a: 1\n")                                  # small texts are not remembered
    io.yaml_load("a: 1\n")
    assert len(calls) == 4 and len(io._PARSED) == 2
    for k in range(io.PARSED_KEPT + 2):                      # at most PARSED_KEPT documents kept
        io.yaml_load(big + f"k{k}: 1\n")
    assert len(io._PARSED) == io.PARSED_KEPT


def test_the_strict_parse_is_remembered_apart_and_still_refuses_duplicates(monkeypatch):
    import pytest
    import yaml
    from roofcal.blis.defaults_yaml import strict_yaml_load
    from roofcal.errors import RoofcalError
    big = "rows:\n" + "".join(f"  - {{at: {i}, ratio: {i / 7:.6f}}}\n" for i in range(3000))
    calls = []
    real = yaml.load
    monkeypatch.setattr(yaml, "load", lambda *a, **k: calls.append(k.get("Loader")) or real(*a, **k))
    monkeypatch.setattr(io, "_PARSED", {})
    doc = strict_yaml_load(big, "big.yaml")
    doc["rows"].clear()                                     # a caller's change stays its own
    assert strict_yaml_load(big, "big.yaml")["rows"][2] == {"at": 2, "ratio": 0.285714}
    assert io.yaml_load(big) == strict_yaml_load(big, "big.yaml")
    assert len(calls) == 2 and calls[0] is not calls[1]       # one parse per parser
    dup = big + "rows: []\n"                                 # a duplicate key: refused, each time
    for _ in range(2):
        with pytest.raises(RoofcalError, match="big.yaml: duplicate key 'rows' at line 3002"):
            strict_yaml_load(dup, "big.yaml")
    assert len(io._PARSED) == 2

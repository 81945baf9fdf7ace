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

"""A new GPU as the README walks it: a datasheet from ``roofcal gpu show NAME --yaml``, then each
command the previous one prints, run as printed (the bootstrap's step file is written by the
``printf`` line it prints, in a shell)."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(argv, capsys) -> str:
    from roofcal.cli.main import main
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert code == 0, f"roofcal {shlex.join(argv)} exited {code}:\n{err}"
    return out


def printed_commands(out: str, cwd: Path | None = None) -> list[list[str]]:
    """The ``roofcal …`` commands an output prints (one per line, indented), as argv; a printed
    ``printf … > FILE`` line is run in a shell in ``cwd`` instead."""
    cmds = []
    for line in out.splitlines():
        m = re.match(r"\s+(roofcal .*)$", line)
        if m:
            cmds.append(shlex.split(m.group(1))[1:])
        elif re.match(r"\s+printf ", line):
            assert cwd is not None, line
            subprocess.run(["bash", "-c", line.strip()], cwd=cwd, check=True)
    return cmds


@pytest.mark.slow
def test_new_gpu_from_a_template_every_printed_hint_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ROOFCAL_CACHE", "off")
    # the A100 stands in for a new GPU: its measured kernels are bundled
    out = run(["gpu", "show", "a100_sxm", "--yaml", "--out", "my_gpu.yaml"], capsys)
    hints = printed_commands(out)
    assert [h[:2] for h in hints] == [["gpu", "bootstrap"]], out
    out = run(hints[0], capsys)
    assert (tmp_path / "my_gpu_coeffs.yaml").is_file()
    hints = printed_commands(out, tmp_path)
    assert [h[0] for h in hints] == ["predict", "fit"], out
    assert "my_gpu.yaml" in hints[0] and "my_gpu.yaml" in hints[1]      # the datasheet file, not its name
    run(hints[0], capsys)
    pred = pd.read_csv(tmp_path / "my_gpu_coeffs-pred.csv")    # a name of its own, not the README's pred.csv
    assert len(pred) == 1 and pred["gpu"].tolist() == ["a100_sxm"] and pred["zero_shot"].all()
    assert not pred["ood_what"].fillna("").any()                # the README's deployment: inside the domain
    out = run(hints[1] + ["--quiet"], capsys)                   # the bundled A100 kernels
    assert (tmp_path / "out" / "a100_sxm.yaml").is_file(), out


def test_gpu_show_yaml_prints_what_every_reader_accepts(tmp_path, monkeypatch, capsys):
    from roofcal.physics.hardware import load_gpu
    monkeypatch.chdir(tmp_path)
    text = run(["gpu", "show", "h100", "--yaml"], capsys)
    (tmp_path / "h.yaml").write_text(text, encoding="utf-8")
    spec, bundled = load_gpu("h.yaml"), load_gpu("h100_sxm")
    assert spec == bundled and spec.aliases == bundled.aliases and spec.sha256() == bundled.sha256()
    # the readable form keeps its own keys; only --yaml writes a datasheet
    assert "bf16_tflops: 989.4 TFLOP/s" in run(["gpu", "show", "h100_sxm"], capsys)


def test_gpu_show_out_needs_yaml(tmp_path, monkeypatch, capsys):
    from roofcal.cli.main import main
    monkeypatch.chdir(tmp_path)
    assert main(["gpu", "show", "l4", "--out", "l4.yaml"]) == 2
    assert "--yaml" in capsys.readouterr().err
    assert not (tmp_path / "l4.yaml").exists()


@pytest.mark.parametrize("given, named", [("h100", "h100_sxm"), ("my.yaml", "my.yaml")])
def test_hints_name_the_gpu_as_a_later_command_can(given, named, tmp_path, monkeypatch):
    from roofcal.cli.gpu import gpu_argument
    monkeypatch.chdir(tmp_path)
    assert gpu_argument(given) == named


def test_gpu_template_names_the_new_gpu_and_its_next_commands(tmp_path, monkeypatch, capsys):
    """``roofcal gpu template my_gpu --like l40s --out F``: a blank datasheet of my_gpu, the
    L40S's figures as marked hints; ``gpu show F`` refuses it in one line until it is filled; a
    bundled GPU's name is refused."""
    from roofcal.cli.main import main
    monkeypatch.chdir(tmp_path)
    out = run(["gpu", "template", "my_gpu", "--like", "l40s", "--out", "my_gpu.yaml"], capsys)
    assert [h[:2] for h in printed_commands(out)] == [["gpu", "show"], ["gpu", "bootstrap"]], out
    text = (tmp_path / "my_gpu.yaml").read_text(encoding="utf-8")
    assert "name: my_gpu\n" in text and "sources: []\n" in text and "The l40s datasheet" not in text
    assert "hbm_bandwidth_tbs:            # l40s: 0.864" in text
    assert "memory_kind:                  # l40s: gddr6" in text
    assert main(["gpu", "show", "my_gpu.yaml"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "my_gpu.yaml: 7 required fields are blank: sources, " in err
    assert main(["gpu", "template", "l40s"]) == 2
    assert "names the bundled datasheet l40s" in capsys.readouterr().err


def test_gpu_show_warns_once_per_optional_field_left_out(tmp_path, monkeypatch, capsys):
    """A user's datasheet without boost clock and L2: ``gpu show`` prints it, and on stderr one
    line per field left out, its default and what it changes."""
    import warnings

    from roofcal.cli.main import main
    from roofcal.physics.hardware import datasheet_dict, load_gpu
    from roofcal.io import yaml_text
    monkeypatch.chdir(tmp_path)
    d = datasheet_dict(load_gpu("l40s").replace(name="my_l40s", boost_clock_mhz=0.0, l2_cache_mib=0.0))
    (tmp_path / "my.yaml").write_text(yaml_text(d, sort_keys=False), encoding="utf-8")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        assert main(["gpu", "show", "my.yaml"]) == 0
    out, err = capsys.readouterr()
    assert "boost_clock_mhz: - (absent: a prediction's clock is known only as a share" in out
    lines = err.splitlines()
    assert [ln.split("'")[1] for ln in lines] == ["boost_clock_mhz", "l2_cache_mib"], err
    assert lines[0].startswith("roofcal: warning: my.yaml: optional field 'boost_clock_mhz' not given, "
                               "taken as 0 (unknown): ")


@pytest.mark.slow
def test_readme_new_gpu_prediction_is_inside_the_fitted_domain():
    """The README's new-GPU prediction (its model and TP, the steps its 'Predict' section writes)
    on the A100 bootstrapped from the H100 fit: every step inside the fitted domain, as the README
    says (llama-2-7b's 32 KV heads, beyond the fitted 1–8, and its 4,096-token limit were not)."""
    import json

    from roofcal.model import coeffs as coeff_io
    from roofcal.model.predict import predict
    from roofcal.physics.hardware import load_gpu
    from roofcal.physics.steps import Step
    from roofcal.transfer.bootstrap import bootstrap
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    steps = re.search(r"cat > steps.jsonl <<'EOF'\n(.*?)\nEOF", readme, re.S).group(1).splitlines()
    section = readme[readme.index("## A new GPU"):]
    argv = shlex.split(re.search(r"^(roofcal predict --gpu my_gpu.yaml .*?)$",
                                 section.replace("\\\n", " "), re.M).group(1))
    model, tp = argv[argv.index("--model") + 1], int(argv[argv.index("--tp") + 1])
    assert "all 3 steps inside the fitted domain; 3 zero-shot" in section and len(steps) == 3
    boot = bootstrap(coeff_io.load(ROOT / "coeffs" / "h100_sxm.yaml", "h100_sxm"), load_gpu("h100_sxm"),
                     load_gpu("a100_sxm"))
    batch = [Step(prefill=tuple(map(tuple, s["prefill"])), decode=tuple(s["decode"]))
             for s in map(json.loads, steps)]
    df = predict(batch, coeffs=boot, model=model, gpu="a100_sxm", tp=tp)
    assert df.ood_shape.tolist() == [0.0] * 3 and not df.ood_context.any() and df.zero_shot.all()

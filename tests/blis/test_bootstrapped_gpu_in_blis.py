"""A GPU known by its datasheet alone, simulated in the real BLIS binary: bootstrap the L40S from
the shipped H100 fit, write its BLIS hardware entry and a per-deployment defaults.yaml, and run
the printed ``blis run`` command on a synthetic workload."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from roofcal.cli.main import main

SHARED = Path(__file__).resolve().parents[2].parent / "shared"
BLIS = (SHARED / "tools" / "blis").resolve()        # as roofcal prints it (../shared may be a link)


@pytest.mark.slow
@pytest.mark.skipif(not BLIS.is_file(), reason=f"BLIS binary {BLIS} not found (../shared beside the project)")
def test_a_bootstrapped_gpu_runs_in_blis_as_its_export_prints(tmp_path, capsys):
    boot, hw, out = tmp_path / "l40s.yaml", tmp_path / "hw.json", tmp_path / "d"
    main(["gpu", "bootstrap", "--datasheet", "l40s", "--from", "coeffs/h100_sxm.yaml", "--out", str(boot)])
    main(["export", "hardware", "--gpu", "l40s", "--coeffs", str(boot), "--into",
          "data/blis/hardware_config.json", "--out", str(hw)])
    entry = json.loads(hw.read_text())["L40S"]
    assert entry["TFlopsPeak"] == pytest.approx(362.05) and entry["BwPeakTBs"] == pytest.approx(0.864)
    capsys.readouterr()
    main(["export", "blis", "--coeffs", str(boot), "--defaults", "data/blis/defaults.yaml",
          "--model", "llama-2-7b-hf:1", "--hardware-config", str(hw), "--out-dir", str(out), "--blis", str(BLIS)])
    printed = capsys.readouterr().out
    (line,) = [ln.strip() for ln in printed.splitlines() if ln.strip().startswith(f"{BLIS} run --model")
               and "--trace-output" in ln]
    args = shlex.split(line)
    assert args[:2] == [str(BLIS), "run"] and "--hardware" in args and args[args.index("--hardware") + 1] == "L40S"
    assert Path(args[args.index("--hardware-config") + 1]) == hw.resolve()
    # the printed line with a load of its own (BLIS takes a repeated flag's last value)
    res = subprocess.run([*args, "--num-requests", "20", "--rate", "1",
                          "--prompt-tokens", "256", "--output-tokens", "64", "--seed", "1"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-500:]
    metrics = json.loads(res.stdout[res.stdout.index("{"):res.stdout.rindex("}") + 1])
    assert metrics["completed_requests"] == 20
    # one sequence decoding most of the time: BLIS's ITL is the exported decode step plus the
    # per-token α, within the distillation's stated error of roofcal's own step (≈ 20 ms:
    # 13.5 GB of weights over 864 GB/s and the H100's serving stack)
    steps = tmp_path / "steps.jsonl"
    steps.write_text('{"prefill": [], "decode": [300]}\n')
    main(["predict", "--model", "llama-2-7b-hf", "--gpu", "l40s", "--tp", "1", "--steps", str(steps),
          "--coeffs", str(boot), "--out", str(tmp_path / "p.csv")])
    native = float(pd.read_csv(tmp_path / "p.csv")["predicted_us"].iloc[0]) / 1000.0
    assert 15.0 < native < 30.0
    assert 0.9 < metrics["itl_mean_ms"] / native < 1.3, (metrics["itl_mean_ms"], native)

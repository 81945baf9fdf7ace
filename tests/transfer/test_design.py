"""Which shapes to time on a new GPU (``roofcal gpu plan``, :mod:`roofcal.transfer.design`)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from roofcal.errors import RoofcalError
from roofcal.physics.hardware import load_gpu
from roofcal.transfer.design import farthest_first, plan, spread_rows, write_plan

A100 = load_gpu("a100_sxm")


def test_farthest_first_by_hand():
    z = np.array([[0.0], [1.0], [2.0], [10.0]])
    # from each first row, by hand: the next is the farthest from it, then the farthest from both
    # (ties: the first such row)
    expect = {0: {0, 3, 2}, 1: {1, 3, 0}, 2: {2, 3, 0}, 3: {3, 0, 2}}
    for seed in range(8):
        first = int(np.random.default_rng(seed).integers(4))
        got = farthest_first(z, 3, seed)
        assert set(got) == expect[first] and list(got) == sorted(got), (seed, got)
    assert list(farthest_first(z, 4, 0)) == [0, 1, 2, 3]
    assert list(farthest_first(z, 9, 0)) == [0, 1, 2, 3]
    assert list(farthest_first(z, 0, 0)) == []


def test_a_repeated_shape_is_taken_once_every_distinct_one_is():
    z = np.array([[0.0, 0.0], [0.0, 0.0], [3.0, 4.0], [3.0, 4.0], [0.0, 4.0]])
    for seed in range(6):
        got = farthest_first(z, 3, seed)
        assert len({tuple(z[i]) for i in got}) == 3, (seed, got)


def gemm_sweep(n: int = 12) -> pd.DataFrame:
    """A GEMM sweep timed in two kernel sets: every shape twice."""
    m = 2.0 ** np.arange(n)
    one = pd.DataFrame({"gpu": "h100_sxm", "op": "gemm", "dtype": "bf16", "m": m,
                        "n": 4096.0, "k": 4096.0, "latency_us": 10.0 + m})
    return pd.concat([one.assign(kernels="vllm-0.14.0"), one.assign(kernels="vllm-0.24.0")],
                     ignore_index=True)


def test_a_plan_takes_distinct_shapes_spread_for_its_gpu_with_no_timing(tmp_path):
    rows = plan(gemm_sweep(), A100, 3, seed=0)
    # m = 1 … 2048 is the one descriptor that varies; standardized (K.standardize) m = 1, 32, 64,
    # 1024, 2048 sit at -1.500, -0.489, -0.244, 0.750, 1.000. Seed 0 starts at the 11th distinct
    # shape (m = 1024), the farthest from it is m = 1 (2.25), then the farthest from both is
    # m = 32 (1.011; m = 64 is 0.994 from 1024 and 2048 is 0.25 from it)
    assert sorted(rows["m"]) == [1.0, 32.0, 1024.0]
    assert (rows["gpu"] == "a100_sxm").all() and rows["latency_us"].isna().all()
    out = tmp_path / "plan.csv"
    write_plan(rows, out)
    from roofcal.measurements.ops import read_ops_csv
    with pytest.raises(RoofcalError, match="row 1: field 'latency_us' must be a positive number"):
        read_ops_csv(out)                                # not timed yet
    filled = pd.read_csv(out).assign(latency_us=[5.0, 6.0, 7.0])
    filled.to_csv(out, index=False)
    back = read_ops_csv(out)
    assert back[["m", "n", "k"]].to_numpy().tolist() == rows[["m", "n", "k"]].to_numpy().tolist()


def test_spread_rows_cover_a_real_sweep_closer_than_random_rows():
    """Farthest first is within 2× of the smallest covering radius any 300 rows reach, so every
    row of the A100's GEMM sweep lies nearer its spread set than its random set does, in the
    standardized shapes the surface is a polynomial of."""
    from roofcal.bench.transfer import sample_rows
    from roofcal.measurements.datasets import microbench_table
    from roofcal.model.predict import ideal_times
    t = microbench_table("a100_sxm", "vllm-0.14.0")
    t = t[(t["op"] == "gemm")].reset_index(drop=True)
    z = ideal_times(A100, t).rows("gemm", np.arange(len(t)))[2].astype(np.float64)
    pool = np.ones(len(t), bool)
    radius = lambda idx: np.sqrt(((z[:, None, :] - z[idx][None]) ** 2).sum(-1).min(1))
    spread = radius(spread_rows(t, A100, 300, 0, pool)["gemm/bf16"])
    rand = radius(sample_rows(t, pool, 300, 0)["gemm/bf16"])
    assert spread.max() < 0.6 * rand.max(), (spread.max(), rand.max())      # 0.45 and 1.11
    assert np.mean(spread) < np.mean(rand), (np.mean(spread), np.mean(rand))


def test_gpu_plan_writes_the_csv_and_prints_the_refit(tmp_path, capsys, monkeypatch):
    from roofcal.cli.main import main
    src = tmp_path / "sweep.csv"
    gemm_sweep().drop(columns="kernels").to_csv(src, index=False)
    (tmp_path / "vllm-0.24.0").mkdir()
    out = tmp_path / "vllm-0.24.0" / "plan.csv"
    assert main(["gpu", "plan", "--gpu", "a100_sxm", "--rows", "4", "--shapes", str(src),
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "4 shapes to time on a100_sxm" in text and "gemm/bf16 4" in text
    assert "read as kernel set vllm-0.24.0" in text
    assert "roofcal gpu bootstrap --datasheet a100_sxm --from coeffs/h100_sxm.yaml --out a100_sxm_coeffs.yaml" in text
    assert f"roofcal fit --gpu a100_sxm --prior a100_sxm_coeffs.yaml --data {out}" in text
    assert len(pd.read_csv(out)) == 4
    monkeypatch.chdir(tmp_path)                 # (the temporary folders' names look like sets)
    assert main(["gpu", "plan", "--gpu", "a100_sxm", "--rows", "4", "--shapes", str(src),
                 "--out", "flat.csv"]) == 0
    assert "read as no kernel set" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--rows", "0"], "--rows must be at least 1"),
    (["--variants", "gemm/fp9"], "--variants: no shapes of gemm/fp9 (there are: gemm/bf16)"),
])
def test_gpu_plan_refuses_in_one_line_and_writes_nothing(tmp_path, capsys, argv, message):
    from roofcal.cli.main import main
    src = tmp_path / "sweep.csv"
    gemm_sweep().drop(columns="kernels").to_csv(src, index=False)
    out = tmp_path / "plan.csv"
    assert main(["gpu", "plan", "--gpu", "a100_sxm", "--shapes", str(src), "--out", str(out),
                 *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not out.exists()


@pytest.mark.slow
def test_a_refit_on_spread_rows_lands_closer_than_on_random_rows():
    """The A100's bf16 GEMMs refitted from the H100 fit (bootstrapped) on 300 rows, as the
    leave-one-GPU-out benchmark draws them (seed 0: 20 % held out, the rows from the rest):
    held out, 9.8 % on a random draw and 7.9 % on the spread one (measured)."""
    from roofcal.bench import transfer as T
    from roofcal.bench.gpus import tp_kinds
    from roofcal.measurements.datasets import microbench_table
    from roofcal.model import correction as K
    from roofcal.model.coeffs import load, roundtrip
    from roofcal.transfer.bootstrap import bootstrap
    t = tp_kinds(microbench_table("a100_sxm", "vllm-0.14.0"))
    prior = roundtrip(bootstrap(load("coeffs/h100_sxm.yaml", "h100_sxm"), load_gpu("h100_sxm"), A100))
    test = T.heldout_split(t, 0)
    key = "gemm/bf16"
    held = t[test & (t["op"] + "/" + t["dtype"] == key).to_numpy()]
    err = {}
    for draw in ("random", "spread"):
        rows = T.draw_rows(t, ~test, 300, 300, draw, A100)[key]
        ops = T.refit(t, {key: rows}, prior, A100, 0.1)
        err[draw] = T.per_op_mape(held, {"ops": ops, "step": K.neutral_step_params()}, A100)[key]
    assert err["spread"] < 0.9 * err["random"], err


@pytest.mark.slow
def test_a_timed_plan_refits_with_the_commands_it_prints(tmp_path, monkeypatch, capsys):
    """A plan of the A100's bf16 GEMMs, "timed" by the A100's own table (every planned shape is
    one of its rows), then the two printed commands as printed."""
    import shlex

    from roofcal.cli.main import main
    from roofcal.measurements.ops import read_ops
    from roofcal.physics.kernels import ALL_SHAPES
    from roofcal.resources import ROOT
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ROOFCAL_CACHE", "off")
    sweep = ROOT / "data" / "microbench" / "a100_sxm" / "vllm-0.14.0" / "gemm_perf.parquet"
    (tmp_path / "vllm-0.14.0").mkdir()
    assert main(["gpu", "plan", "--gpu", "a100_sxm", "--rows", "60", "--shapes", str(sweep),
                 "--variants", "gemm/bf16", "--out", "vllm-0.14.0/plan.csv"]) == 0
    printed = [shlex.split(line.strip())[1:] for line in capsys.readouterr().out.splitlines()
               if line.startswith("  roofcal ")]
    assert [p[:2] for p in printed] == [["gpu", "bootstrap"], ["fit", "--gpu"]], printed
    plan_rows = pd.read_csv("vllm-0.14.0/plan.csv")
    keys = ["op", "dtype", "m", "n", "k"]
    timed = read_ops(sweep).drop_duplicates(subset=keys)[keys + ["latency_us"]]
    filled = plan_rows.drop(columns="latency_us").merge(timed, on=keys, how="left")
    assert len(filled) == 60 and filled["latency_us"].notna().all()
    filled[[c for c in ["gpu", *keys, *[c for c in ALL_SHAPES if c in filled and c not in keys],
                        "latency_us"]]].to_csv("vllm-0.14.0/plan.csv", index=False)
    assert main(printed[0]) == 0
    assert main(printed[1] + ["--quiet"]) == 0
    from roofcal.model.coeffs import load
    c = load("out/a100_sxm.yaml", "a100_sxm")
    assert "gemm/bf16" in c.kernel_sets["vllm-0.14.0"].ops and c.calibrated


@pytest.mark.slow
def test_a_default_plan_covers_every_kernel_the_bundled_sweeps_hold(tmp_path, monkeypatch, capsys):
    """``gpu plan`` as ``gpu bootstrap`` prints it for a GPU without bundled kernels: the shapes of
    every bundled H100 table (vLLM 0.14 and 0.24, NCCL), 300 per kind/variant or all it has."""
    from roofcal.cli.main import main
    from roofcal.measurements.datasets import microbench_table
    monkeypatch.chdir(tmp_path)
    assert main(["gpu", "plan", "--gpu", "l4", "--out", "vllm-0.14.0/plan.csv"]) == 0
    rows = pd.read_csv(tmp_path / "vllm-0.14.0" / "plan.csv")
    from roofcal.transfer.design import distinct_shapes
    sweep = distinct_shapes(microbench_table("h100_sxm"))
    have = (sweep["op"] + "/" + sweep["dtype"]).value_counts()
    got = (rows["op"] + "/" + rows["dtype"]).value_counts()
    assert dict(got) == {k: min(300, int(n)) for k, n in have.items()}
    assert (rows["gpu"] == "l4").all() and rows["latency_us"].isna().all()
    assert len(rows.drop_duplicates()) == len(rows)

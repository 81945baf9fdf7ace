"""Is the TTFT that BLIS cannot follow a constant, or does it grow with the step time?

For each scored serving run (``../shared/workload/default_args``), the steady-state model
(:mod:`roofcal.model.serving`) with a coefficient file's serving stack and all alphas at 0 gives
a TTFT and a cycle time τ; the gap to the measured TTFT is what BLIS's α0 has to carry. This
fits the gap by least squares as ``a + b·τ`` over the runs, and scores two forms of it
leave-one-model-out (fitted on the other models' runs): a constant (BLIS's α0) and a constant
plus one cycle (the first token leaving one step after its prefill step).

With ``--blis PATH`` the same on BLIS itself: the file's export replayed once with α0 = 0 (α0
only delays a request's entry into the queue, so with open-loop arrivals it adds exactly to TTFT
and E2E: measured 23.15 ms on every run for an α0 of 23.15 ms), BLIS's ITL as the cycle. Only α0
is refitted per held-out model here — the stack and betas stay the file's.

    python -m roofcal.bench.ttft_gap [--coeffs coeffs/h100_sxm.yaml] [--stack vllm] [--blis PATH] [EXP_DIR]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np


def gaps(coeffs_path, stack: str, experiments) -> list[dict]:
    """Per scored run: measured TTFT, the steady-state TTFT with zero alphas and its cycle τ
    (ms)."""
    from dataclasses import replace
    import jax.numpy as jnp
    from roofcal.blis.run import model_config_folder
    from roofcal.calibration import workload as W
    from roofcal.model import coeffs as C
    from roofcal.physics.config import load_model
    from roofcal.physics.hardware import load_gpu
    from roofcal.resources import MODEL_CONFIGS
    c = C.resolve_stack(C.load(coeffs_path), stack, required=True)
    st = replace(c.stacks[c.stack], alphas_us={n: 0.0 for n in C.ALPHAS})
    theta = W.stack_theta(st)
    gpu = load_gpu(c.gpu)
    folders = (MODEL_CONFIGS, Path("..") / "shared" / "workload" / "model_configs")
    rows = []
    for e in experiments:
        case = W.case_of(e, load_model(model_config_folder(e, folders) / "config.json"))
        _, ttft, itl = np.asarray(W.predict_case(jnp.asarray(theta), c.params["ops"], gpu, case)) / 1000
        rows.append({"run": e.name, "model": f"{e.model}", "measured_ttft_ms": case.measured_us[1] / 1000,
                     "model_ttft_ms": float(ttft), "cycle_ms": float(itl)})
    return rows


def blis_gaps(coeffs_path, stack: str, experiments, blis) -> list[dict]:
    """Per scored run: measured TTFT, BLIS's TTFT with the file's export but α0 = 0, and BLIS's
    ITL as the cycle (ms)."""
    from roofcal.blis.run import BlisSettings, find_blis
    from roofcal.blis.validate import validate
    from roofcal.calibration.workload import export_for
    from roofcal.model import coeffs as C
    from roofcal.resources import BLIS_DEFAULTS, BLIS_HARDWARE, MODEL_CONFIGS
    shared = (Path("..") / "shared" / "workload" / "model_configs").resolve()
    settings = BlisSettings(blis=find_blis(blis), defaults=BLIS_DEFAULTS, hardware_config=BLIS_HARDWARE,
                            model_configs=(MODEL_CONFIGS, shared))
    c = C.resolve_stack(C.load(coeffs_path), stack, required=True)
    alpha, beta = export_for(c, experiments, settings)
    t = validate(experiments, settings, (0.0,) + tuple(alpha[1:]), beta, progress=False).table
    t = t[t["scope"] == "summary"]
    return [{"run": r.experiment, "model": r.model, "measured_ttft_ms": r.measured_ttft_ms,
             "model_ttft_ms": r.sim_ttft_ms, "cycle_ms": r.sim_itl_ms} for r in t.itertuples()]


def analyse(rows: list[dict]) -> dict:
    """The least-squares gap ``a + b·τ`` and the leave-one-model-out TTFT MAPE (%) of a constant
    gap and of a constant plus one cycle."""
    meas = np.array([r["measured_ttft_ms"] for r in rows])
    base = np.array([r["model_ttft_ms"] for r in rows])
    tau = np.array([r["cycle_ms"] for r in rows])
    gap = meas - base
    (a, b), *_ = np.linalg.lstsq(np.stack([np.ones_like(tau), tau], 1), gap, rcond=None)
    models = np.array([r["model"] for r in rows])
    out = {"a_ms": float(a), "b": float(b)}
    for name, extra in (("constant", np.zeros_like(tau)), ("constant + one cycle", tau)):
        err = []
        for m in sorted(set(models)):
            held = models == m
            const = np.mean(gap[~held] - extra[~held])
            err.extend(np.abs((base[held] + const + extra[held]) / meas[held] - 1.0))
        out[f"lomo_mape_{name}"] = float(np.mean(err) * 100.0)
    return out


def main(argv=None) -> None:
    from roofcal.measurements.workload import read_experiments
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("experiments", nargs="?", default="../shared/workload/default_args")
    p.add_argument("--coeffs", default="coeffs/h100_sxm.yaml")
    p.add_argument("--stack", default="vllm")
    p.add_argument("--blis", help="BLIS binary: measure the gap on BLIS's replays instead")
    a = p.parse_args(argv)
    exps = [e for e in read_experiments([a.experiments]) if not e.overload]
    rows = blis_gaps(a.coeffs, a.stack, exps, a.blis) if a.blis else gaps(a.coeffs, a.stack, exps)
    for r in rows:
        print(f"{r['run']:50s} TTFT measured {r['measured_ttft_ms']:6.1f} ms, model with α = 0 "
              f"{r['model_ttft_ms']:5.1f}, gap {r['measured_ttft_ms'] - r['model_ttft_ms']:5.1f}, "
              f"cycle {r['cycle_ms']:5.1f}")
    res = analyse(rows)
    print(f"gap = {res['a_ms']:.1f} ms + {res['b']:.2f} x cycle; leave-one-model-out TTFT MAPE: "
          f"constant {res['lomo_mape_constant']:.1f} %, constant + one cycle "
          f"{res['lomo_mape_constant + one cycle']:.1f} %")


if __name__ == "__main__":
    main()

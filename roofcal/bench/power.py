"""The power-limited clock on the bundled sustained-load measurement (``roofcal bench``): each
phase's step, SM clock and power predicted from its solved clock, by the shipped file's power
model (fitted on every phase) and by one fitted without that phase (leave one phase out: the
held-out figure), beside the burst — what the per-op tables give a back-to-back stream without
the power limit."""

from __future__ import annotations

import numpy as np

from roofcal.tables import table


def report(coeffs, kernels: str = "vllm-0.14.0") -> list[tuple[str, str]]:
    """[(title, Markdown table)] for ``roofcal bench`` (``coeffs``: an H100 coefficient file)."""
    from roofcal.calibration.power import bundled_sustained, check, fit_models, phase_models
    from roofcal.measurements.sustained import read_sustained
    from roofcal.model import coeffs as coeff_io
    from roofcal.physics.hardware import load_gpu
    gpu = load_gpu(coeffs.gpu)
    folder = bundled_sustained(gpu.name)
    if folder is None or gpu.power_limit_w <= 0:
        return []
    c = coeff_io.with_kernels(coeffs, kernels)
    meas = read_sustained(folder)
    models = phase_models(meas, c.params, gpu)
    boost = gpu.boost_clock_mhz or meas.max_clock_mhz
    full, _ = fit_models(models, meas.idle_w, gpu.power_limit_w, boost)
    in_sample = check(full, models).set_index("phase")
    rows = []
    for i, m in enumerate(models):
        others = [x for j, x in enumerate(models) if j != i and x.phase.tokens != m.phase.tokens]
        held, _ = fit_models(others, meas.idle_w, gpu.power_limit_w, boost)
        h = check(held, [m]).iloc[0]
        f = in_sample.loc[m.phase.name]
        err = lambda pred, meas_: 100.0 * (pred / meas_ - 1.0)     # noqa: E731
        rows.append({"phase": m.phase.name, "tokens": f["tokens"], "duty": m.phase.duty,
                     "step ms": m.phase.step_ms, "burst %": err(m.burst_us / 1e3, m.phase.step_ms),
                     "fitted %": err(f["step_ms_pred"], m.phase.step_ms),
                     "held out %": err(h["step_ms_pred"], m.phase.step_ms),
                     "SM MHz": f["sm_clock_mhz_meas"], "held-out clock %": err(h["sm_clock_mhz_pred"], f["sm_clock_mhz_meas"]),
                     "W": m.phase.power_w, "held-out power %": err(h["power_w_pred"], m.phase.power_w)})
    pct = ("burst %", "fitted %", "held out %", "held-out clock %", "held-out power %")
    mape = lambda k: float(np.mean([abs(r[k]) for r in rows if r["duty"] >= 1.0]))   # noqa: E731
    summary = {"phase": "MAPE, back-to-back phases", **{k: f"{mape(k):.1f}" for k in pct}}
    shown = [{**r, **{k: f"{r[k]:+.1f}" for k in pct}, "duty": f"{r['duty']:g}", "step ms": f"{r['step ms']:.2f}",
              "SM MHz": f"{r['SM MHz']:.0f}", "W": f"{r['W']:.0f}"} for r in rows]
    cols = ["phase", "tokens", "duty", "step ms", "burst %", "fitted %", "held out %", "SM MHz", "held-out clock %",
            "W", "held-out power %"]
    title = (f"Sustained load: {gpu.name} at its {gpu.power_limit_w:.0f} W limit ({folder.name} measurement, "
             f"kernels {kernels}; signed step error of the burst clock, of the power model fitted on every "
             f"phase, and of one fitted without the phase's token counts; clock and power of the latter)")
    return [(title, table(shown + [summary], cols))]

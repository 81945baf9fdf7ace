"""What treating a mixed step's prefill and decode attention as one kernel would change on the
given serving runs.

vLLM's V1 engine runs a mixed batch's prefill chunks and decodes in one FlashAttention call;
roofcal times them as two calls (each fitted on its own per-op table) and combines them with the
serving stack's soft max, sharpness ``mix`` (1 = the two add, as the ``vllm`` stack has it; large
= one hides behind the other, the most one kernel could save). No per-op table times the mixed
call, so this bounds its effect instead: per stage of every run, the steady state's mixed step at
its running decodes D, and the steady-state TTFT, ITL and E2E, with the sum and with the max.

    python -m roofcal.bench.mixed_attention [--coeffs coeffs/h100_sxm.yaml] [--runs DIR]
"""

from __future__ import annotations

import argparse
from pathlib import Path

#: sharpness standing for "max" (one call hides the other entirely)
MAX_SHARPNESS = 64.0


def measure(coeffs_path: str, runs_dir: str) -> list[dict]:
    """One row per run stage: D, the share of steps that prefill, the mixed step (µs, sum) and the
    relative change of the step, TTFT, ITL and E2E when the two attentions overlap fully."""
    import jax.numpy as jnp

    from roofcal.measurements.workload import read_experiments
    from roofcal.model import coeffs as coeff_io
    from roofcal.model import correction as K
    from roofcal.model.combine import step_breakdown
    from roofcal.model.serving import loads_of, step_grid, steady_state
    from roofcal.physics.config import load_model
    from roofcal.physics.hardware import load_gpu
    c = coeff_io.load(coeffs_path)
    gpu = load_gpu(c.gpu)
    st = c.stacks[c.stack]
    alphas = jnp.asarray([st.alphas_us[n] for n in coeff_io.ALPHAS], jnp.float32)
    out = []
    for e in read_experiments(sorted(p for p in Path(runs_dir).iterdir() if p.is_dir())):
        spec = load_model(e.model)
        for i, ld in enumerate(loads_of(e)):
            grid, n = step_grid(ld), ld.max_seqs + 1
            res = {}
            for name, q in (("sum", 1.0), ("max", MAX_SHARPNESS)):
                step = {**c.params["step"], "mix": jnp.asarray(K.softplus_inv(max(q - 1.0, 1e-9)), jnp.float32)}
                t = step_breakdown({"ops": c.params["ops"], "step": step}, spec, gpu, int(e.tp), grid)["total"]
                s = steady_state(t[:n], t[n:], ld, alphas, 1.0)
                d = int(round(float(s["running"])))
                res[name] = {"step": float(t[n + d]), "d": d, "f": float(s["mixed_fraction"]),
                             **{m: float(s[f"{m}_us"]) for m in ("ttft", "itl", "e2e")}}
            a, b = res["sum"], res["max"]
            out.append({"run": e.name, "stage": i, "req/s": ld.rate, "D": a["d"], "prefill share": a["f"],
                        "mixed step ms": a["step"] / 1e3,
                        **{f"{k} max/sum %": 100.0 * (b[k] / a[k] - 1.0) for k in ("step", "ttft", "itl", "e2e")}})
    return out


def main(argv=None) -> None:
    from roofcal.tables import table
    p = argparse.ArgumentParser(prog="python -m roofcal.bench.mixed_attention",
                                description=__doc__.splitlines()[0])
    p.add_argument("--coeffs", default="coeffs/h100_sxm.yaml")
    p.add_argument("--runs", default="../shared/workload/default_args")
    a = p.parse_args(argv)
    rows = measure(a.coeffs, a.runs)
    print(table(rows, list(rows[0]), floats="{:.2f}"))


if __name__ == "__main__":
    main()

"""How far BLIS's trained-physics form can follow an MoE deployment's step, and what one term of
its basis would change.

BLIS's ``T_weight`` loads every routed expert resident on a GPU on every step
(``nMoE · (N / moeGroup) · 3 · d · dFF_moe · weightBPP``; ``docs/blis-latency-models.md`` §1).
A step of few tokens reads only the experts those tokens pick, and so does roofcal's native step
(:mod:`roofcal.physics.components.moe`). BLIS's own roofline model counts them:
``nEff = N · (1 − ((N − k) / N)^B)`` distinct experts for ``B`` tokens routed uniformly to ``k``
of ``N`` (§2.2). This benchmark exports each MoE deployment as ``export blis`` does (the same
distillation, nominal load) twice: with BLIS's basis as it is, and with its routed-expert weights
scaled by ``nEff / N``, ``B`` the step's tokens over all ranks; and reports the held-out error
against the native step and on its light and saturated steps. The second column is what a BLIS
whose ``T_weight`` had that term would reach; no BLIS binary has it (the export never writes it).

``python -m roofcal.bench.blis_form [--out FILE]`` (about 3 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
from contextlib import contextmanager

import numpy as np

from roofcal import resources
from roofcal.bench import emit
from roofcal.physics.config import Parallel

#: the MoE deployments the README and accuracy.md quote (H100, the shipped file)
DEPLOYMENTS = (
    ("mixtral-8x7b-v0.1", 2, Parallel()),
    ("mixtral-8x7b-v0.1", 4, Parallel()),
    ("qwen3-30b-a3b", 2, Parallel()),
    ("mixtral-8x7b-v0.1", 1, Parallel(4, True)),
    ("mixtral-8x7b-v0.1", 1, Parallel(4, True, "deepep_low_latency")),
    ("qwen3-30b-a3b", 1, Parallel(4, True)),
    ("qwen3-30b-a3b", 1, Parallel(8, True, "deepep_low_latency")),
    ("deepseek-v2-lite", 1, Parallel(4, True)),
)


def touched_share(tokens, experts: int, topk: int):
    """Share of the routed experts ``B`` tokens touch, each routed uniformly to ``topk`` of
    ``experts``: nEff / N = 1 − ((N − k) / N)^B (0 for an empty step). Hand check, Mixtral
    (N = 8, k = 2): one token 0.25; two tokens 1 − 0.75² = 0.4375; 32 tokens 0.9999."""
    n, k = float(experts), float(max(1, topk))
    return 1.0 - ((n - k) / n) ** np.asarray(tokens, np.float64)


@contextmanager
def touched_experts_basis():
    """Within the block, the BLIS basis that :mod:`roofcal.blis.fit` builds its rows from has
    its routed-expert weight bytes scaled by :func:`touched_share` of each step's tokens."""
    import roofcal.blis.fit as F
    from roofcal.blis import basis as B

    routed: dict[float, tuple] = {}
    constants, basis = F.blis_constants, F.basis_for_constants

    def with_routed(model, hw, tp, dp=1, moe_comm_backend=""):
        c = constants(model, hw, tp, dp, moe_comm_backend)
        if model.is_moe:
            n_moe, _ = B.layer_split(model)
            bpp = model.weight_bytes_per_param if model.weight_bytes_per_param > 0 else model.bytes_per_param
            ff = model.moe_intermediate or model.intermediate
            share = n_moe * (model.num_local_experts / (tp * max(1, dp))) * 3 * model.hidden * ff * bpp
            routed[float(c.weight_bytes)] = (share, model.num_local_experts, model.num_experts_per_tok)
        return c

    def touched(c, req):
        out = dict(basis(c, req))
        key = float(np.ravel(np.asarray(c.weight_bytes))[0])
        if key in routed:
            share, n, k = routed[key]
            mask = np.asarray(req.mask, bool)
            prefill = mask & (np.asarray(req.progress_index) < np.asarray(req.input_len))
            decode = mask & ~prefill & (np.asarray(req.num_output_tokens) > 0)
            tokens = np.where(prefill, np.asarray(req.num_new_tokens, np.float64), 0.0).sum(-1) + decode.sum(-1)
            bw = float(np.ravel(np.asarray(c.bw_us))[0])
            out["t_weight_us"] = (mask.any(-1) * (key - share + share * touched_share(tokens, n, k)) / bw)
        return out

    F.blis_constants, F.basis_for_constants = with_routed, touched
    try:
        yield
    finally:
        F.blis_constants, F.basis_for_constants = constants, basis


def export_errors(coeffs, model: str, tp: int, parallel: Parallel) -> dict:
    """{held_out, light, saturated}: MAPE % of a per-deployment export against the native step."""
    from roofcal.blis.deployments import export_deployment, targets_for_deployments
    from roofcal.blis.fit import BlisFitSettings, Deployment
    from roofcal.calibration import WORKLOAD_DEFAULTS

    target = targets_for_deployments([Deployment(model, tp, parallel)])[0]
    ex = export_deployment(coeffs, target, settings=BlisFitSettings(samples=WORKLOAD_DEFAULTS["samples"]))
    mixes = ex.metrics.get("mixes", {})
    return {"held_out": ex.distill_mape(), "light": mixes.get("light"), "saturated": mixes.get("saturated")}


def run(out: str | None = None) -> str:
    """The table as Markdown (printed; written to ``out`` when given)."""
    from roofcal.model import coeffs as coeff_io
    from roofcal.tables import table

    c = coeff_io.resolve_stack(coeff_io.load(resources.REFERENCE_COEFFS), None, required=True)
    rows = []
    for model, tp, parallel in DEPLOYMENTS:
        now = export_errors(c, model, tp, parallel)
        with touched_experts_basis():
            then = export_errors(c, model, tp, parallel)
        f = lambda e: f"{e['held_out']:.1f} ({e['light']:.1f} / {e['saturated']:.1f})"
        rows.append({"deployment": f"{model} {parallel.title(tp)}", "BLIS's basis": f(now),
                     "routed experts as touched": f(then)})
    md = ("### BLIS's form on MoE deployments: export vs native step, held-out MAPE % (light / "
          "saturated steps), H100, the shipped file\n\n"
          + table(rows, ["deployment", "BLIS's basis", "routed experts as touched"]) + "\n")
    return emit(md, out)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m roofcal.bench.blis_form", description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="also write the Markdown table to this file")
    run(ap.parse_args(argv).out)


if __name__ == "__main__":
    main()

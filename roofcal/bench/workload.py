"""The serving runs replayed in BLIS, every way side by side — the README's workload table.

Each row replays the same experiments (default ``../shared/workload/default_args``) in the real
BLIS binary and scores mean E2E, TTFT and ITL against measurement (MAPE over the non-overload
runs, and how many have all three within 10 %):

* BLIS's own bundled coefficients through BLIS's closed-loop ``inference_perf:`` expansion (what
  inference-sim's validation runs) and through the faithful trace;
* roofcal's coefficient file through the faithful trace, exported as one global
  ``defaults.yaml``, one per deployment (the default), and one per run (the deployment at that
  run's load) — each used exactly as ``roofcal export blis`` writes it;
* with ``--lomo``, the leave-one-model-out calibration (``roofcal workload lomo``, ≈ 5 min).

It also prints the first-token evidence: per stage, the α0 that would have made BLIS's TTFT
exact under the per-deployment export (measured TTFT − (BLIS's TTFT − the α0 it used)), against
the stage's measured ITL (≈ its cycle), fitted as a + b·cycle by least squares.

    python -m roofcal.bench.workload [--coeffs coeffs/h100_sxm.yaml] [--blis PATH] [--lomo] [--out FILE.md] [EXP...]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

#: the replays of the table: (label, replay, coefficients: "blis" or an export of --coeffs)
ROWS = (
    ("BLIS's bundled coefficients, BLIS's closed-loop expansion", "expansion", "blis"),
    ("BLIS's bundled coefficients, faithful trace", "trace", "blis"),
    ("roofcal export, one global defaults.yaml, faithful trace", "trace", "global"),
    ("roofcal export, one defaults.yaml per deployment, faithful trace", "trace", "per-deployment"),
    ("roofcal export, one defaults.yaml per run (its load), faithful trace", "trace", "per-run"),
)


def replay_all(coeffs_path, exps, settings, export: str, work: Path):
    """The validation of ``exps`` with ``coeffs_path`` exported as ``export`` (or BLIS's own
    coefficients for ``"blis"``), the defaults files written under ``work``."""
    from roofcal.blis.deployments import write_defaults
    from roofcal.blis.validate import validate
    from roofcal.calibration.workload import export_for
    from roofcal.model import coeffs as C
    if export == "blis":
        return validate(exps, settings, progress=False), []
    c = C.resolve_stack(C.load(coeffs_path), None, required=True)
    exports = export_for(c, exps, settings, export=export)
    paths = write_defaults(exports, settings.defaults, work / export, coeffs_path)
    per_run = {e.name: paths[next(i for i, x in enumerate(exports) if x.covers(e))] for e in exps}
    return validate(exps, settings, progress=False, defaults=per_run), exports


def first_token_evidence(v, exports, exps) -> tuple[list[dict], tuple[float, float]]:
    """Per stage of the scored runs: the measured TTFT, the α0 that would have made BLIS exact,
    and the measured ITL; and (a, b) of required α0 ≈ a + b·ITL (ms)."""
    t = v.table
    rows = []
    for e in exps:
        if e.overload:
            continue
        a0 = next(x.alpha[0] for x in exports if x.covers(e)) / 1000.0
        for scope in e.scopes[1:] or e.scopes:
            r = t[(t["experiment"] == e.name) & (t["scope"] == scope)].iloc[0]
            rows.append({"run": e.name, "scope": scope, "measured_ttft_ms": r["measured_ttft_ms"],
                         "required_alpha0_ms": r["measured_ttft_ms"] - (r["sim_ttft_ms"] - a0),
                         "measured_itl_ms": r["measured_itl_ms"]})
    x = np.array([r["measured_itl_ms"] for r in rows])
    y = np.array([r["required_alpha0_ms"] for r in rows])
    b, a = np.polyfit(x, y, 1)
    return rows, (float(a), float(b))


def main(argv=None) -> None:
    from roofcal import resources
    from roofcal.blis.run import BlisSettings, find_blis
    from roofcal.resources import default_model_configs
    from roofcal.measurements.workload import read_experiments
    from roofcal.tables import table

    p = argparse.ArgumentParser(prog="python -m roofcal.bench.workload", description=__doc__.splitlines()[0])
    p.add_argument("experiments", nargs="*", default=[str(Path("..") / "shared" / "workload" / "default_args")])
    p.add_argument("--coeffs", default=str(resources.COEFFS / "h100_sxm.yaml"))
    p.add_argument("--blis", help="BLIS binary (default: $ROOFCAL_BLIS)")
    p.add_argument("--lomo", action="store_true", help="also run the leave-one-model-out calibration (≈ 5 min)")
    p.add_argument("--out", help="write the Markdown report here too")
    a = p.parse_args(argv)
    exps = read_experiments(a.experiments)
    base = dict(blis=find_blis(a.blis), defaults=resources.BLIS_DEFAULTS, hardware_config=resources.BLIS_HARDWARE,
                model_configs=tuple(default_model_configs()))
    out, lines = [], []
    evidence = None
    with tempfile.TemporaryDirectory(prefix="roofcal-bench-workload-") as tmp:
        for label, replay, export in ROWS:
            t0 = time.time()
            v, exports = replay_all(a.coeffs, exps, BlisSettings(**base, replay=replay), export, Path(tmp))
            out.append({"coefficients and replay": label, "E2E %": v.mape["e2e"], "TTFT %": v.mape["ttft"],
                        "ITL %": v.mape["itl"], "all three ≤ 10 %": f"{v.within} / {v.scored}",
                        "seconds": time.time() - t0})
            if export == "per-deployment":
                evidence = first_token_evidence(v, exports, exps)
                signed = v.table[(v.table["scope"] == "summary")]
    if a.lomo:
        from roofcal.calibration.workload import WorkloadSettings, leave_one_model_out
        t0 = time.time()
        held, m, within, _ = leave_one_model_out(a.coeffs, exps, BlisSettings(**base), WorkloadSettings())
        n = int((~held["overload"].astype(bool)).sum())
        out.append({"coefficients and replay": "roofcal per-deployment export, leave-one-model-out calibration",
                    "E2E %": m["e2e"], "TTFT %": m["ttft"], "ITL %": m["itl"],
                    "all three ≤ 10 %": f"{within} / {n}", "seconds": time.time() - t0})
    lines += ["### Serving runs replayed in BLIS (MAPE over the non-overload runs)", "",
              table(out, list(out[0])), ""]
    lines += ["Per run, per-deployment export (signed %):", "",
              table([{"run": r["experiment"] + (" (overload)" if r["overload"] else ""),
                      "E2E": r["err_e2e_pct"], "TTFT": r["err_ttft_pct"], "ITL": r["err_itl_pct"]}
                     for r in signed.to_dict("records")], ["run", "E2E", "TTFT", "ITL"], floats="{:+.1f}"), ""]
    rows, (ia, ib) = evidence
    lines += ["### The first token: the α0 each stage needed (per-deployment export)", "",
              table(rows, list(rows[0])), "",
              f"least squares over {len(rows)} stages: required α0 ≈ {ia:.1f} ms + {ib:.2f} × cycle (measured ITL)", ""]
    text = "\n".join(lines)
    print(text)
    if a.out:
        from roofcal.io import write_text_atomic
        write_text_atomic(a.out, text)


if __name__ == "__main__":
    main()

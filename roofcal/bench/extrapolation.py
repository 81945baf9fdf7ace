"""How fast a kernel correction's error grows outside its fitted shapes — the widening of the
prediction bands of out-of-domain rows (:data:`roofcal.model.intervals.EXTRAPOLATION`).

For each kernel kind, on the bundled H100 per-op rows of its default variant: fit the correction
on the rows whose size descriptor (GEMM ``m``, prefill ``seq_len``, decode ``context``, MoE
``tokens``, all-reduce ``bytes``) is at most its 75th percentile, then score the rows beyond it.
A row's distance is how far its descriptor lies beyond the fitted range, in log2(1 + x) units
(as ``ood_shape``). Per distance bin, the 90th percentile of |log(predicted / measured)| less the
same percentile inside the range is the extra error; its least-squares slope through the origin,
in natural-log units per log2 unit, is how much an 80 % band must widen per unit of distance.

    python -m roofcal.bench.extrapolation [--gpu h100_sxm]
"""

from __future__ import annotations

import argparse

import numpy as np

#: the kernel kinds measured, the variant and the size descriptor held back
CASES = (("gemm", "bf16", "m"), ("attn_prefill", "bf16", "seq_len"), ("attn_decode", "bf16", "context"),
         ("moe", "bf16", "tokens"), ("allreduce", "custom", "bytes"))
#: the share of rows (by the descriptor) fitted on
FITTED_QUANTILE = 0.75


def measure(gpu_name: str = "h100_sxm") -> list[dict]:
    """Per kernel kind: rows fitted / beyond, the in-range and per-distance 90th percentiles of
    |log error| and the slope (natural-log units per log2 unit)."""
    import jax.numpy as jnp

    from roofcal.calibration import fit as F
    from roofcal.measurements.datasets import microbench_table
    from roofcal.model import correction as K
    from roofcal.physics.hardware import load_gpu
    gpu = load_gpu(gpu_name)
    table = microbench_table(gpu_name)
    out = []
    settings = F.FitSettings(progress=False)
    for kind, variant, desc in CASES:
        t = table[(table["op"] == kind) & (table["dtype"] == variant)].reset_index(drop=True)
        if kind == "attn_prefill":
            col = "seq"
        elif kind == "allreduce":
            col = "bytes"
        else:
            col = {"m": "m", "context": "context", "tokens": "tokens"}[desc]
        u = np.log2(1.0 + t[col].to_numpy(np.float64))
        cut = np.quantile(u, FITTED_QUANTILE)
        test = u > cut                                    # held back: everything beyond the cut
        data = F.kernel_data(t, gpu, test, settings)
        (key, d), = data.items()
        deg = settings.degree_of(kind)
        center = F.default_prior(kind, deg, d)
        center = {**center, "lo": jnp.asarray(d.lo, jnp.float32), "hi": jnp.asarray(d.hi, jnp.float32)}
        p = F.fit_kernel(d, settings, center, None)
        n = len(d.index)
        pred = np.asarray(K.op_time_from_features(p, d.feats, d.tc, d.tm))[:n]
        err = np.abs(np.log(pred / np.asarray(d.y)[:n]))
        inside = err[~test]
        base = float(np.quantile(inside, 0.9))
        dist = u[test] - u[~test].max()
        bins = np.arange(0.0, np.ceil(dist.max()) + 1.0, 1.0)
        xs, ys = [], []
        for lo_, hi_ in zip(bins, bins[1:]):
            sel = (dist > lo_) & (dist <= hi_)
            if sel.sum() >= 10:
                xs.append(float(dist[sel].mean()))
                ys.append(max(float(np.quantile(err[test][sel], 0.9)) - base, 0.0))
        xs, ys = np.array(xs), np.array(ys)
        slope = float((xs @ ys) / (xs @ xs)) if len(xs) else float("nan")
        out.append({"kernel": key, "descriptor": desc, "rows fitted": int((~test).sum()),
                    "rows beyond": int(test.sum()), "p90 |log err| inside": base,
                    "p90 extra by distance (log2 units)": ", ".join(f"{x:.1f}: {y:.3f}" for x, y in zip(xs, ys)),
                    "slope per log2 unit": slope})
    return out


def main(argv=None) -> None:
    from roofcal.tables import table
    p = argparse.ArgumentParser(prog="python -m roofcal.bench.extrapolation", description=__doc__.splitlines()[0])
    p.add_argument("--gpu", default="h100_sxm")
    a = p.parse_args(argv)
    rows = measure(a.gpu)
    print(table(rows, list(rows[0])))


if __name__ == "__main__":
    main()

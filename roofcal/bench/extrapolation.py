"""How fast a kernel correction's error grows outside its fitted shapes — the widening of the
prediction bands of out-of-domain rows (:data:`roofcal.model.intervals.EXTRAPOLATION`).

For each kernel kind, on the bundled H100 per-op rows of its default variant: fit the correction
on the rows whose size descriptor (GEMM ``m``, prefill ``seq_len``, decode ``context``, MoE
``tokens``, all-reduce ``bytes``) is at most its 75th percentile, then score the rows beyond it.
A row's distance is how far its descriptor lies beyond the fitted range, in log2(1 + x) units
(as ``ood_shape``). Per distance bin, the 90th percentile of |log(predicted / measured)| less the
same percentile inside the range is the extra error; its least-squares slope through the origin,
in natural-log units per log2 unit, is how much an 80 % band must widen per unit of distance.

It also measures the band of prefill attention over a cached prefix
(:data:`roofcal.model.intervals.CACHED_PREFIX`, :func:`cached_prefix`).

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
        col = {"seq_len": "seq"}.get(desc, desc)          # the table's column of the descriptor
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
        pred = np.asarray(K.op_time_from_features(p, d.features().T, d.tc, d.tm, res=d.resident()))[:n]
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


#: the decode rows that are the measured limit of prefill attention over a cached prefix
MIN_CACHED = 255


def cached_prefix_ratios(coeffs_path: str = "coeffs/h100_sxm.yaml", gpu_name: str = "h100_sxm",
                         kernels: str = "vllm-0.14.0"):
    """Prefill attention over a cached prefix at its measured limit: every decode row of kernel set
    ``kernels`` with context c ≥ :data:`MIN_CACHED`, predicted as one new token over c cached keys
    per sequence by the prefill-attention correction of ``coeffs_path`` (the kernel vLLM's
    FlashAttention runs for such a chunk is the one the decode tables time). One row per decode
    row: ``batch`` (sequences), ``context`` (c), ``ratio`` = measured / predicted."""
    import pandas as pd

    from roofcal.measurements.datasets import microbench_table
    from roofcal.model import coeffs as coeff_io
    from roofcal.model.predict import predict_table
    from roofcal.physics.hardware import load_gpu
    gpu = load_gpu(gpu_name)
    params = coeff_io.with_kernels(coeff_io.load(coeffs_path, gpu), kernels).params
    t = microbench_table(gpu_name, kernels)
    d = t[(t.op == "attn_decode") & (t.context >= MIN_CACHED)]
    rows = pd.DataFrame({k: d[k].values for k in ("gpu", "dtype", "batch", "heads", "kv_heads",
                                                  "head_dim", "latency_us", "source")})
    rows = rows.assign(op="attn_prefill", seq=1, cached=d.context.values)
    pred = predict_table(rows, params, gpu)
    return pd.DataFrame({"batch": d.batch.values, "context": d.context.values,
                         "ratio": (pred["latency_us"] / pred["predicted_us"]).to_numpy(np.float64)})


def weighted_quantile(x, w, q):
    """Quantiles ``q`` of values ``x`` with weights ``w`` (midpoints of the cumulative weight)."""
    order = np.argsort(x)
    x, w = np.asarray(x, np.float64)[order], np.asarray(w, np.float64)[order]
    cum = (np.cumsum(w) - 0.5 * w) / w.sum()
    return np.interp(q, cum, x)


def cached_prefix(coeffs_path: str = "coeffs/h100_sxm.yaml", gpu_name: str = "h100_sxm",
                  sets=("vllm-0.14.0", "vllm-0.24.0")) -> dict:
    """(p10, p90) of :func:`cached_prefix_ratios` pooled over kernel ``sets`` (each weighted
    equally), with per-set medians by sequence count: :data:`roofcal.model.intervals.CACHED_PREFIX`."""
    xs, ws, by = [], [], {}
    for name in sets:
        rows = cached_prefix_ratios(coeffs_path, gpu_name, name)
        r, batch = rows["ratio"].to_numpy(), rows["batch"].to_numpy()
        xs.append(r)
        ws.append(np.full(len(r), 1.0 / len(r)))
        by[name] = {int(b): float(np.median(r[batch == b])) for b in sorted(set(batch.tolist()))}
    p10, p90 = weighted_quantile(np.concatenate(xs), np.concatenate(ws), [0.1, 0.9])
    return {"p10": float(p10), "p90": float(p90), "rows": int(sum(len(x) for x in xs)),
            "median by sequences": by}


def main(argv=None) -> None:
    from roofcal.tables import table
    p = argparse.ArgumentParser(prog="python -m roofcal.bench.extrapolation", description=__doc__.splitlines()[0])
    p.add_argument("--gpu", default="h100_sxm")
    a = p.parse_args(argv)
    rows = measure(a.gpu)
    print(table(rows, list(rows[0])))
    if a.gpu == "h100_sxm":
        c = cached_prefix()
        print(f"\nprefill attention over a cached prefix, one new token per sequence ({c['rows']} "
              f"decode rows, vLLM 0.14 and 0.24 pooled): measured / predicted p10 {c['p10']:.3f}, "
              f"p90 {c['p90']:.3f} (roofcal.model.intervals.CACHED_PREFIX)")
        for name, med in c["median by sequences"].items():
            print(f"  {name} median by sequences: " + ", ".join(f"{b}: {m:.2f}" for b, m in med.items()))


if __name__ == "__main__":
    main()

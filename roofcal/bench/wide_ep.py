"""A published wide-EP figure against the native DP × EP step: DeepSeek decode per H200.

vLLM's team reports 2.2k output tokens/s per H200 for DeepSeek-R1 (the DeepSeek-V3 architecture)
served with wide expert parallelism, decode disaggregated from prefill, DeepEP kernels, dual-batch
overlap and expert-parallel load balancing, on a multi-node H200 cluster over InfiniBand
(blog.vllm.ai, "vLLM Large Scale Serving: DeepSeek @ 2.2k tok/s/H200 with Wide-EP", Dec 2025).
The post does not state the batch per rank or the context, so the comparison is a table over
them: decode-only steps (the decode side of disaggregated serving), every rank with ``B`` sequences
at context ``C``, balanced routing (what load balancing aims at), the H200 bootstrapped from the
H100 fit and its datasheet (no H200 table is read), DP = EP = 8 (one node, inside the NCCL tables'
2–8 GPUs) and 16 (two nodes, priced as if one NVLink domain: the inter-node link is not modelled).

Throughput per GPU = B / step time (every GPU a rank at TP 1). Run::

    python -m roofcal.bench.wide_ep              # prints the Markdown table
"""

from __future__ import annotations



from roofcal.tables import table

#: the published figure: output tokens/s per H200 GPU
PUBLISHED_TOK_S_PER_GPU = 2200.0
BATCHES = (64, 128, 256)
CONTEXTS = (1024, 2048, 4096)
RANKS = (8, 16)
BACKEND = "deepep_low_latency"


def rows(coeffs_path: str = "coeffs/h100_sxm.yaml", gpu: str = "h200_sxm") -> list[dict]:
    """One row per (ranks, batch per rank, context): the predicted decode step, its parts and
    the tokens/s per GPU beside :data:`PUBLISHED_TOK_S_PER_GPU`."""
    from roofcal.model import coeffs as coeff_io
    from roofcal.model.predict import predict
    from roofcal.physics.config import Parallel
    from roofcal.physics.hardware import load_gpu
    from roofcal.transfer.bootstrap import bootstrap
    from roofcal.physics.steps import Step
    ref = coeff_io.load(coeffs_path)
    boot = coeff_io.roundtrip(bootstrap(ref, load_gpu(ref.gpu), load_gpu(gpu)))
    out = []
    for ranks in RANKS:
        steps = [Step(decode=(c,) * (b * ranks)) for b in BATCHES for c in CONTEXTS]
        df = predict(steps, model="deepseek-v3", gpu=gpu, tp=1, coeffs=boot,
                     parallel=Parallel(ranks, True, BACKEND))
        for (b, c), (_, r) in zip([(b, c) for b in BATCHES for c in CONTEXTS], df.iterrows()):
            tok_s = b / (r["predicted_us"] / 1e6)
            out.append({"DP = EP": ranks, "batch per rank": b, "context": c,
                        "step ms": r["predicted_us"] / 1e3, "MoE ms": r["moe_us"] / 1e3,
                        "dispatch + combine ms": (r["moe_dispatch_us"] + r["moe_combine_us"]) / 1e3,
                        "attention ms": r["attn_decode_us"] / 1e3,
                        "tok/s per GPU": tok_s,
                        "vs 2.2k %": 100.0 * (tok_s / PUBLISHED_TOK_S_PER_GPU - 1.0),
                        "fits memory": bool(r["fits_memory"])})
    return out


def report(coeffs_path: str = "coeffs/h100_sxm.yaml") -> str:
    """The Markdown table of :func:`rows`."""
    r = rows(coeffs_path)
    return table(r, list(r[0]))


def main() -> None:
    print(report())


if __name__ == "__main__":
    main()


__all__ = ["PUBLISHED_TOK_S_PER_GPU", "report", "rows"]


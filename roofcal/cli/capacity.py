"""``roofcal capacity``: the KV-cache capacity vLLM would allocate for a model, GPU and TP degree.

A thin wrapper over :func:`roofcal.physics.capacity.capacity`: prints weights per GPU, KV bytes
per token per GPU, KV blocks and tokens, and how many sequences of ``--context`` tokens fit at once,
followed by the assumptions made.
"""

from __future__ import annotations


def capacity_text(model: str, gpu: str, tp: int, kv_dtype: str = "auto", gpu_memory_utilization: float = 0.9,
                  block_size: int = 16, context: int = 4096, weight_dtype: str | None = None,
                  max_num_batched_tokens: int = 8192, max_num_seqs: int = 256, parallel=None) -> str:
    """The ``roofcal capacity`` report (a one-row table and the notes); ``parallel``: the layout
    beyond TP (:class:`roofcal.physics.config.Parallel`), whose every rank the report is of."""
    from roofcal.physics.capacity import GIB, capacity, max_batch
    from roofcal.physics.config import load_model
    from roofcal.physics.hardware import load_gpu
    from roofcal.tables import table
    from roofcal.errors import RoofcalError
    from roofcal.model.domain import context_limit
    from roofcal.physics.config import Parallel, check_tp, served
    spec, g = load_model(model), load_gpu(gpu)
    if parallel is not None and parallel != Parallel():
        check_tp(spec, tp)
        spec = served(spec, parallel)
    limit = context_limit(spec)
    if limit and context > limit:
        raise RoofcalError(f"--context {context:,} exceeds {spec.name}'s limit of {limit:,} tokens "
                           "(max_position_embeddings): vLLM refuses such sequences")
    cap = capacity(spec, g, tp, kv_dtype=kv_dtype, gpu_memory_utilization=gpu_memory_utilization,
                   block_size=block_size, weight_dtype=weight_dtype,
                   max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs)
    row = {"model": spec.name, "GPU": g.name, "TP": tp,
           **({} if spec.parallel == Parallel() else {"DP": spec.parallel.dp, "EP": spec.parallel.ep}),
           "weights GiB/GPU": cap.weights_bytes_per_gpu / GIB,
           "KV bytes/token/GPU": cap.kv_bytes_per_token_per_gpu,
           "KV GiB/GPU": cap.kv_blocks * cap.block_size * cap.kv_bytes_per_token_per_gpu / GIB,
           f"KV blocks ({cap.block_size} tok)": cap.kv_blocks, "KV tokens": cap.kv_tokens,
           f"max seqs @ {context}": max_batch(cap, context)}
    lines = [table([row], list(row))]
    need = -(-context // cap.block_size)
    if row[f"max seqs @ {context}"] == 0:
        lines.append(f"note: one sequence of {context:,} tokens needs {need:,} KV blocks; the cache holds "
                     f"{cap.kv_blocks:,} ({cap.kv_tokens:,} tokens)")
    lines += ["", "assumed:"]
    lines += [f"  - {n}" for n in cap.notes]
    if spec.parallel != Parallel():
        lines.append(f"  - per data-parallel rank (each of the {spec.parallel.dp} holds its own KV cache and batch); "
                     f"the routed experts split over all {spec.parallel.dp * tp} GPUs")
    return "\n".join(lines)


def cmd_capacity(a) -> None:
    from roofcal.cli.main import parallel_of
    print(capacity_text(a.model, a.gpu, a.tp, a.kv_dtype, a.gpu_memory_utilization, a.block_size, a.context,
                        a.weight_dtype, a.max_num_batched_tokens, a.max_num_seqs, parallel_of(a)))


def register(sub) -> None:
    """Add ``capacity`` to the ``roofcal`` subcommands."""
    s = sub.add_parser("capacity", help="KV-cache blocks, tokens and batch vLLM would allocate")
    s.add_argument("--model", required=True, help="bundled model name or config.json")
    s.add_argument("--gpu", required=True, help="bundled GPU name or datasheet .yaml")
    s.add_argument("--tp", type=int, required=True, help="tensor-parallel degree")
    from roofcal.cli.main import add_parallel_options
    add_parallel_options(s)
    s.add_argument("--kv-dtype", default="auto", help="KV-cache dtype: auto (the model's) or fp8")
    s.add_argument("--weight-dtype", default=None, help="weight dtype of the linear layers (default: the model's)")
    s.add_argument("--gpu-memory-utilization", type=float, default=0.9, help="vLLM's share of GPU memory")
    s.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    s.add_argument("--context", type=int, default=4096, help="tokens per sequence for the max-sequences column")
    s.add_argument("--max-num-batched-tokens", type=int, default=8192,
                   help="tokens of vLLM's profiling run (sizes the activation reservation)")
    s.add_argument("--max-num-seqs", type=int, default=256, help="sequences of vLLM's sampler profiling run")
    s.set_defaults(func=cmd_capacity)

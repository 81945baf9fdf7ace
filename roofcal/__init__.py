"""roofcal: physics-informed, calibrated step-time models for LLM inference (vLLM), with export to BLIS.

Data flows one way — config + datasheet → components → corrections → combine → loss → optimizer →
coefficients → exporters and residual reports; each stage is a module of its own:

======================  ========================================================================
``config``              HuggingFace ``config.json`` → :class:`ModelSpec`
``hardware``            GPU datasheets → :class:`GPUSpec`
``steps``               step JSONL ↔ :class:`Step` ↔ padded :class:`StepBatch`
``components``          analytical work (FLOPs, bytes, shape) of each kernel
``decompose``           a model's step → its kernel calls per GPU
``correction``          efficiency surfaces, latencies, soft max, step overheads and scales
``model``               corrected kernels + step level → step time and breakdown
``predict``             ``roofcal predict`` for steps; ``ops`` for per-op tables
``ops``, ``stepdata``   measurements: per-op tables and CSV; whole steps (JSONL, splitwise)
``datasets``            measurement files → tables and step datasets, with provenance
``loss``, ``optim``     relative-error loss and priors; optax Adam / L-BFGS
``fit``                 the two-stage fit (``roofcal fit``)
``coeffs``              coefficient files: schema, save, load, validation
``blis``                BLIS's exact trained-physics basis, BLIS-form fitting and export
``residuals``           residual tables; ``attribution``; ``residuals_report`` (``roofcal residuals``)
``bootstrap``           zero-shot transfer to a new GPU; ``whatif`` datasheet sensitivities
``bench``               ``roofcal bench``; ``transfer_bench`` for GPU transfer
``cli``                 the command line (thin wrappers over the functions above)
======================  ========================================================================
"""

__version__ = "0.1.0"

from .errors import RoofcalError  # noqa: E402

__all__ = ["RoofcalError", "__version__", "predict", "load_model", "load_gpu"]


def __getattr__(name):  # lazy, so ``import roofcal`` stays light for the CLI's error paths
    if name == "predict":
        from .predict import predict
        return predict
    if name == "load_model":
        from .config import load_model
        return load_model
    if name == "load_gpu":
        from .hardware import load_gpu
        return load_gpu
    raise AttributeError(name)

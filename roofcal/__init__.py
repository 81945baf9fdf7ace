"""roofcal: physics-informed, calibrated step-time models for LLM inference (vLLM), with export to BLIS.

Data flows one way — config + datasheet → kernel calls → corrections → combine → loss → optimizer →
coefficients → exporters and residual reports. Each stage is a package; each package's ``__init__``
says what comes in, what goes out and which module to open first:

=================  =============================================================================
``physics``        ``config.json`` → :class:`ModelSpec`; datasheets → :class:`GPUSpec`; steps;
                   the analytical work (FLOPs, bytes) of each kernel call (``decompose``)
``measurements``   readers of what was timed: per-op tables, step files, serving runs (``workload``)
``model``          correction layer (``correction``), step combine with the serving stack
                   (``combine``), ``predict``, loaded-server means (``serving``), coefficient
                   files with named serving stacks (``coeffs``)
``calibration``    relative-error loss and priors, optax optimisers, the two-stage ``fit``,
                   serving-stack calibration against serving runs through BLIS (``workload``)
``inspection``     residual tables, gradient attribution, plots, ``roofcal residuals`` (``report``)
``transfer``       zero-shot transfer to a new GPU (``bootstrap``); datasheet what-if
``blis``           BLIS's exact trained-physics basis, BLIS-form fits, export into BLIS's files,
                   replay of serving runs in the BLIS binary (``run``, ``validate``)
``bench``          ``roofcal bench``: held-out accuracy, speed, GPU transfer
``cli``            the command line: a module per command group, thin wrappers over the above
=================  =============================================================================

Shared helpers: ``errors`` (one-line errors), ``io`` (atomic writes), ``resources`` (bundled
files), ``tables`` (Markdown tables), ``grouping`` (rows grouped by value, one sort per table).
"""

__version__ = "0.1.0"

from roofcal.errors import RoofcalError  # noqa: E402

__all__ = ["RoofcalError", "__version__", "predict", "load_model", "load_gpu"]


def __getattr__(name):  # lazy, so ``import roofcal`` stays light for the CLI's error paths
    if name == "predict":
        from roofcal.model.predict import predict
        return predict
    if name == "load_model":
        from roofcal.physics.config import load_model
        return load_model
    if name == "load_gpu":
        from roofcal.physics.hardware import load_gpu
        return load_gpu
    raise AttributeError(name)

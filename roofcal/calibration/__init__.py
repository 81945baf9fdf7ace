"""Calibration: fitting the model's corrections to measurements.

In: per-op tables and step data (:mod:`roofcal.measurements`), the model (:mod:`roofcal.model`).
Out: a fitted :class:`~roofcal.model.coeffs.Coefficients` with held-out metrics (:func:`.fit.fit`).
Open first: ``fit.py``; its loss is ``loss.py``, its optimisers ``optim.py``; ``workload.py`` fits
a serving stack to measured serving runs with BLIS in the loop.
"""

#: defaults of :class:`.workload.WorkloadSettings` the command line shows (kept here so it need
#: not import JAX to show them)
WORKLOAD_DEFAULTS = {"refreshes": 4, "samples": 800, "first_token_cycles": 1.0}
#: names of :data:`.fit.STEP_TARGETS` (for the command line)
STEP_TARGET_NAMES = ("step", "gpu", "cycle", "gpu+cycle")

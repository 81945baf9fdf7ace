"""BLIS: its exact trained-physics basis, BLIS-form fits, and export into BLIS's files.

In: a roofcal coefficient file (or measured steps), BLIS's ``defaults.yaml`` and ``hardware_config.json``.
Out: BLIS-form betas, a rewritten ``defaults.yaml`` (:func:`.distill.export_blis`), hardware entries; goldens checks.
Open first: ``basis.py`` (BLIS's formula), then ``distill.py`` (the export); ``trace.py`` writes a
serving run as the TraceV2 ``run.py`` replays in the real BLIS binary, ``validate.py`` compares
the replays with measurement.
"""

#: defaults of a BLIS-form fit (:class:`roofcal.blis.fit.BlisFitSettings`), kept here so the
#: command line can show them without importing JAX
FIT_DEFAULTS = {"seed": 0, "holdout": 0.2, "samples": 3000, "iters": 300}
#: how :mod:`roofcal.blis.run` replays a serving run: its faithful trace through ``blis replay``
#: (default), or BLIS's own closed-loop ``inference_perf:`` expansion through ``blis run``
REPLAYS = ("trace", "expansion")

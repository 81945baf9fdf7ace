"""BLIS: its exact trained-physics basis, BLIS-form fits, and export into BLIS's files.

In: a roofcal coefficient file (or measured steps), BLIS's ``defaults.yaml`` and ``hardware_config.json``.
Out: BLIS-form betas, a rewritten ``defaults.yaml`` (:func:`.distill.export_blis`), hardware entries; goldens checks.
Open first: ``basis.py`` (BLIS's formula), then ``distill.py`` (the export); ``run.py`` replays
serving runs in the real BLIS binary, ``validate.py`` compares them with measurement.
"""

#: defaults of a BLIS-form fit (:class:`roofcal.blis.fit.BlisFitSettings`), kept here so the
#: command line can show them without importing JAX
FIT_DEFAULTS = {"seed": 0, "holdout": 0.2, "samples": 3000, "iters": 300}
#: arrival modes and prompt replays of :mod:`roofcal.blis.run` (see its docstring)
ARRIVALS = ("open", "closed")
PROMPTS = ("pool", "fresh")

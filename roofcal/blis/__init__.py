"""BLIS: its exact trained-physics basis, BLIS-form fits, and export into BLIS's files.

In: a roofcal coefficient file (or measured steps), BLIS's ``defaults.yaml`` and ``hardware_config.json``.
Out: BLIS-form betas, a rewritten ``defaults.yaml`` (:func:`.distill.export_blis`), hardware entries; goldens checks.
Open first: ``basis.py`` (BLIS's formula), then ``distill.py`` (the export); ``run.py`` replays
serving runs in the real BLIS binary, ``validate.py`` compares them with measurement.
"""

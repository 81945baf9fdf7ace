"""Model: corrected kernel times, combined into step times, and the coefficient files that hold it.

In: kernel calls from :mod:`roofcal.physics` and a coefficient file (:mod:`.coeffs`), or the neutral roofline defaults.
Out: step times with a per-component breakdown (:func:`.combine.step_breakdown`, :func:`.predict.predict`).
Open first: ``correction.py`` (one kernel; ``curves.py``: what its measured shapes add), then
``combine.py`` (one step); ``serving.py`` turns step times into a loaded server's mean TTFT, ITL
and E2E.
"""

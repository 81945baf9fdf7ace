"""Inspection: where a coefficient file's error comes from.

In: a coefficient file (or BLIS coefficients) and measurements.
Out: residual tables, summaries per component and regime, gradient attribution, plots (:func:`.report.residuals`).
Open first: ``report.py``.
"""

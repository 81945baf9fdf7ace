"""Benchmarks (``roofcal bench``): accuracy on held-out data and speed, against the project's targets.

In: the bundled measurements.
Out: Markdown tables of held-out error, fit time and throughput (bench/RESULTS.md in the source tree).
Open first: ``fits.py``; GPU transfer is ``transfer.py``.
"""

"""Benchmarks (``roofcal bench``): accuracy on held-out data and speed, against the project's targets.

In: the bundled measurements.
Out: Markdown tables of held-out error, fit time and throughput (bench/RESULTS.md in the source tree).
Open first: ``fits.py``; GPU transfer is ``transfer.py``.
"""


def emit(md: str, out: str | None = None) -> str:
    """Print a benchmark's Markdown and, when ``out`` is given, write it there atomically."""
    print(md)
    if out:
        from roofcal.io import write_text_atomic
        write_text_atomic(out, md)
    return md

"""Measurements: readers of what was timed, kept apart from prediction.

In: per-op tables (aiconfigurator parquet, interchange CSV), whole-step files (step JSONL, splitwise CSV)
and serving-run folders (server config, load profile, measured latencies: ``workload.py``).
Out: validated per-op tables and :class:`.stepdata.StepData`, with file provenance (:func:`.datasets.load`).
Open first: ``datasets.py``.
"""

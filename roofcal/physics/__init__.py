"""Physics: the analytical work of one vLLM step, before any correction.

In: a HuggingFace ``config.json`` (:mod:`.config`), a GPU datasheet (:mod:`.hardware`), a TP degree and steps (:mod:`.steps`).
Out: each step's kernel calls with their FLOPs and bytes (:func:`.decompose.step_ops`, :mod:`.components`).
Open first: ``decompose.py``; per-op measurement rows map to the same components in ``kernels.py``.
"""

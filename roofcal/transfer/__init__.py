"""Transfer: a calibrated model carried to another GPU, and what a datasheet change would do.

In: a calibrated coefficient file and a datasheet.
Out: zero-shot coefficients for the new GPU (:func:`.bootstrap.bootstrap`), which shapes to time on it
for a few-shot refit (:func:`.design.plan`), elasticities per step phase (:func:`.whatif.whatif`).
Open first: ``bootstrap.py``.
"""

#: the rules of :mod:`.bootstrap` and the default one (here so the command line lists them
#: without importing JAX)
RULES = ("shape", "balance", "sm", "balance_sm", "duration")
DEFAULT_RULE = "sm"

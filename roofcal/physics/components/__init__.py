"""Analytical components: the work (FLOPs, bytes) of each kernel in one vLLM step.

Every component is a pure function of array-valued shapes that returns a :class:`Work`. The same
function serves a microbenchmark row and a model layer, so a correction fitted on kernels applies
unchanged inside whole steps. Ideal times follow from a datasheet via :func:`ideal_times`.
"""

from .base import Work, ideal_times
from .gemm import gemm
from .attention import decode_attention, prefill_attention
from .comm import COLLECTIVES, allreduce, collective
from .moe import expected_active_experts, moe
from .memory import elementwise

__all__ = ["Work", "ideal_times", "gemm", "prefill_attention", "decode_attention", "allreduce",
           "collective", "COLLECTIVES",
           "moe", "expected_active_experts", "elementwise"]

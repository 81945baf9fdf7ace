"""Step batches are computed padded (roofcal.model.combine.padded): batches of similar size share
one compiled program, and each real step keeps its value."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from roofcal.model import coeffs as C
from roofcal.model.combine import (NON_COMPONENT, _step_breakdown, combined, kernel_breakdown, padded,
                                   step_breakdown)
from roofcal.physics.config import load_model
from roofcal.physics.hardware import load_gpu
from roofcal.physics.steps import Step, batch_steps

COEFFS = Path(__file__).resolve().parents[2] / "coeffs" / "h100_sxm.yaml"
STEPS = [Step(prefill=((2048, 0),)), Step(decode=(1024,) * 16), Step(prefill=((500, 1500),), decode=(900,) * 8)]


def test_padding_appends_empty_steps_and_slots():
    a = batch_steps(STEPS)                                   # 3 steps, 1 prefill slot, 16 decode slots
    p = padded(a)
    assert p.prefill_new.shape == (512, 8) and p.decode_ctx.shape == (512, 128)
    assert np.array_equal(p.decode_ctx[:3, :16], a.decode_ctx)
    assert np.array_equal(p.prefill_cached[:3, :1], a.prefill_cached)
    assert not p.decode_mask[3:].any() and not p.decode_mask[:, 16:].any() and not p.prefill_new[3:].any()
    # 1,326 steps (an export's largest grid): steps of 512 up to 4,096 -> 1,536; 9 slots -> 16
    big = padded(batch_steps(STEPS * 442, pad_prefill=9))
    assert big.prefill_new.shape == (1536, 16) and big.decode_ctx.shape == (1536, 128)


@pytest.mark.slow
def test_batches_of_similar_size_share_one_program_and_keep_their_values():
    c = C.resolve_stack(C.load(COEFFS), None, required=True)
    spec, gpu = load_model("llama-2-7b-hf"), load_gpu("h100_sxm")
    a, b = batch_steps(STEPS), batch_steps(STEPS * 5, pad_decode=100)   # (3, 1, 16), (15, 1, 100)
    before = _step_breakdown.programs()
    ta = np.asarray(step_breakdown(c.params, spec, gpu, 1, a)["total"])
    tb = np.asarray(step_breakdown(c.params, spec, gpu, 1, b)["total"])
    assert _step_breakdown.programs() - before <= 1       # one (512, 8, 128) program, not two
    assert ta.shape == (3,) and tb.shape == (15,)
    alone = np.asarray(_step_breakdown(c.params, spec, gpu, 1, a)["total"])
    np.testing.assert_allclose(ta, alone, rtol=1e-6)
    np.testing.assert_allclose(tb, np.tile(alone, 5), rtol=1e-6)
    assert 2000 < ta[0] < 100_000                            # a 2,048-token prefill of a 7B: ms, not µs or s


@pytest.mark.slow
def test_kernels_apart_from_the_step_level_give_the_same_breakdown():
    """What a fit of the step level alone computes: the kernels' times once
    (``kernel_breakdown``), then the step level on them (``combined``) — the same components and
    total as ``step_breakdown``, at this stack's overheads, scales and attention mix."""
    c = C.resolve_stack(C.load(COEFFS), None, required=True)
    spec, gpu = load_model("llama-2-7b-hf"), load_gpu("h100_sxm")
    a = batch_steps(STEPS)
    t, kernels = kernel_breakdown(c.params, spec, gpu, 1, a)
    assert np.asarray(t.tokens).tolist() == [2048, 16, 508]           # new tokens + decodes
    assert set(kernels) and all(np.shape(v) == (3,) for v in kernels.values())
    split = combined(c.params["step"], spec, 1, t, kernels)
    whole = step_breakdown(c.params, spec, gpu, 1, a)
    for k in set(whole) - set(NON_COMPONENT) | {"total", "cpu"}:
        np.testing.assert_allclose(np.asarray(split[k]), np.asarray(whole[k]), rtol=1e-6, err_msg=k)
    # the step level moved: the kernels' times are unchanged, the total follows
    step = {**c.params["step"], "scales": c.params["step"]["scales"] + 0.1}
    moved = combined(step, spec, 1, t, kernels)
    assert np.all(np.asarray(moved["total"]) > np.asarray(split["total"]))

"""Optimisers from optax, jitted in blocks of iterations: Adam and L-BFGS.

Adam (:func:`minimize`) explores from a rough start; L-BFGS (:func:`lbfgs`) converges a smooth
objective to high precision in a few hundred iterations (the kernel fits, by continuation in
the surfaces' degree). Deterministic: no randomness inside, fixed iteration blocks (an early
stop happens at a block boundary, on the loss alone, or where line searches stop finding a
decrease).

Objectives have the form ``loss_fn(params, data)`` with ``loss_fn`` a module-level function and
``data`` a pytree of arrays, so compiled code is reused by every problem of the same shapes.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from roofcal.programs import stored


#: on jax.jit, not the store: its one caller's loss (fit.fit_steps) closes over the step data,
#: which no key can name (programs.text_of)
@partial(jax.jit, static_argnames=("loss_fn", "length", "lr", "total", "final"))
def _adam_block(loss_fn, params, state, data, length, lr, total, final):
    opt = optax.adam(optax.cosine_decay_schedule(lr, total, final))

    def one(carry, _):
        p, s = carry
        value, grad = jax.value_and_grad(loss_fn)(p, data)
        upd, s = opt.update(grad, s, p)
        return (optax.apply_updates(p, upd), s), value

    (params, state), values = jax.lax.scan(one, (params, state), None, length=length)
    return params, state, values[-1]


@stored(static_argnames=("lr", "total", "final"))
def _adam_init(params, lr, total, final):
    """Adam's state at ``params`` (one program, not one per array)."""
    return optax.adam(optax.cosine_decay_schedule(lr, total, final)).init(params)


def minimize(loss_fn: Callable, params, data, steps: int, lr: float, desc: str = "fit",
             chunks: int = 10, progress: bool = True, final_lr_fraction: float = 0.01):
    """Minimise ``loss_fn(params, data)`` with Adam; returns (params, final loss).

    ``steps`` iterations with a cosine decay from ``lr`` to ``lr·final_lr_fraction``, run as
    ``chunks`` jitted ``lax.scan`` blocks so a progress bar can advance between them.
    """
    per = max(1, steps // chunks)
    total = per * chunks
    state = _adam_init(params, lr, total, final_lr_fraction)
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=total, desc=desc, unit="it", leave=False, dynamic_ncols=True)
    value = float("nan")
    for _ in range(chunks):
        params, state, v = _adam_block(loss_fn, params, state, data, per, lr, total,
                                       final_lr_fraction)
        value = float(v)
        if bar is not None:
            bar.update(per)
            bar.set_postfix(loss=f"{value:.4g}")
    if bar is not None:
        bar.close()
    return params, value


def _lbfgs():
    """L-BFGS with a backtracking (Armijo) line search: as accurate here as optax's default zoom
    search and about twice as fast to compile."""
    return optax.lbfgs(linesearch=optax.scale_by_backtracking_linesearch(
        max_backtracking_steps=30, store_grad=True))


#: failed line searches in a row that end an L-BFGS run: a search fails when none of its 31 trials
#: lowers the loss enough (Armijo), and optax then takes the last, 0.8³⁰ ≈ 1e-3 long, step anyway.
#: One failure is often a badly scaled direction that the next iteration mends; two in a row
#: mean the loss no longer decreases measurably in float32 — after them the kernel fits never
#: gained more than 2e-7 (relative) in the rest of a stage, whose searches then ran all 31
#: trials each (12,683 of a fit's 48,248 objective evaluations)
FAILED_SEARCHES = 2


@stored(static_argnames=("loss_fn", "length"))
def _lbfgs_block(loss_fn, params, state, fails, data, length):
    """Up to ``length`` L-BFGS iterations; fewer when :data:`FAILED_SEARCHES` line searches in
    a row fail (``fails``: failures in a row so far). Returns (params, state, fails, the loss
    at params, iterations run)."""
    opt = _lbfgs()
    f = partial(loss_fn, data=data)
    value_and_grad = optax.value_and_grad_from_state(f)

    def more(carry):
        i, _, _, fails, _ = carry
        return (i < length) & (fails < FAILED_SEARCHES)

    def one(carry):
        i, p, s, fails, _ = carry
        value, grad = value_and_grad(p, state=s)
        upd, s = opt.update(grad, s, p, value=value, grad=grad, value_fn=f)
        failed = optax.tree.get(s, "info").decrease_error > 0.0
        fails = jnp.where(failed, fails + 1, jnp.zeros_like(fails))
        return i + 1, optax.apply_updates(p, upd), s, fails, value

    start = (jnp.zeros((), jnp.int32), params, state, fails, jnp.asarray(jnp.nan, jnp.float32))
    i, params, state, fails, value = jax.lax.while_loop(more, one, start)
    # the loss at the returned params, as the last line search found it (no evaluation more:
    # the program holds one copy of the objective fewer); a search that found no finite value
    # kept the params (step 0), whose loss began the last iteration
    step, found = optax.tree.get(state, "learning_rate"), optax.tree.get(state, "value")
    return params, state, fails, jnp.where(step == 0.0, value, found), i


def _strong(tree):
    """``tree`` with weakly typed leaves made strong: the state a block returns is strongly
    typed, so a weakly typed initial state would compile every block program twice."""
    import jax.numpy as jnp
    return jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.result_type(x)), tree)


@stored
def _lbfgs_init(params):
    """The L-BFGS state at ``params``, strongly typed (one program, not one per array)."""
    return _strong(_lbfgs().init(params))


@dataclass(frozen=True)
class OnVector:
    """``loss_fn(params, data)`` of a dict of float32 arrays, called with one vector that holds
    them end to end (``layout``: their (name, shape) in that order). L-BFGS then keeps one array
    of history, not one per leaf: each of its tree operations is one operation, and each
    iteration a shorter chain (a warm ``roofcal fit`` 5 % faster; compiling no faster). Hashable
    and keyed by value (a static argument of the stored program)."""

    loss_fn: Callable
    layout: tuple

    def __call__(self, x, data):
        return self.loss_fn(unflattened(x, self.layout), data)


def layout_of(params: dict) -> tuple:
    """The (name, shape) of each array of ``params``, in name order."""
    return tuple((k, tuple(np.shape(params[k]))) for k in sorted(params))


def flattened(params: dict, layout: tuple):
    """``params``' arrays end to end in one float32 vector, built on the host (no XLA program)."""
    return jax.device_put(np.concatenate(
        [np.asarray(params[k], np.float32).reshape(-1) for k, _ in layout]))


def unflattened(x, layout: tuple) -> dict:
    """The dict of arrays that :func:`flattened` laid into ``x`` (a traced or a host vector)."""
    out, at = {}, 0
    for name, shape in layout:
        size = int(np.prod(shape, dtype=int))
        out[name] = x[at:at + size].reshape(shape)
        at += size
    return out


def lbfgs(loss_fn: Callable, params: dict, data, steps: int, chunks: int = 1, tol: float = 0.0):
    """Minimise ``loss_fn(params, data)`` over a dict of float32 arrays with optax L-BFGS (on
    them laid end to end: :class:`OnVector`); returns (params, final loss).

    ``steps`` iterations in ``chunks`` jitted blocks; with ``tol`` > 0 it stops after the first
    block that lowers the loss by less than ``tol`` (relative) — deterministic, as the blocks
    are fixed. It stops earlier, inside a block, once :data:`FAILED_SEARCHES` line searches in
    a row found no decrease."""
    layout = layout_of(params)
    on_vector = OnVector(loss_fn, layout)
    x = flattened(params, layout)
    state = _lbfgs_init(x)
    fails = jax.device_put(np.int32(0))        # on the host: no XLA program
    per = max(1, steps // chunks)
    value = float("nan")
    for _ in range(chunks):
        x, state, fails, v, _ = _lbfgs_block(on_vector, x, state, fails, data, per)
        last, value = value, float(v)
        if int(fails) >= FAILED_SEARCHES:
            break
        if tol > 0 and last == last and last - value < tol * abs(last):
            break
    found = unflattened(np.asarray(x), layout)          # on the host: no XLA program per slice
    return {k: jax.device_put(v) for k, v in found.items()}, value

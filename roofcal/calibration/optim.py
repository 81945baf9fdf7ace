"""Optimisers from optax, jitted in blocks of iterations: Adam and L-BFGS.

Adam (:func:`minimize`) explores from a rough start; L-BFGS (:func:`lbfgs`: optax's L-BFGS
directions, with a backtracking line search in the same loop) converges a smooth objective to
high precision in a few hundred iterations (the kernel fits, by continuation in the surfaces'
degree). Deterministic: no randomness inside, fixed iteration blocks (an early stop happens at a
block boundary, on the loss alone, or where line searches stop finding a decrease).

Objectives have the form ``loss_fn(params, data)`` with ``loss_fn`` a module-level function and
``data`` a pytree of arrays, so compiled code is reused by every problem of the same shapes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from roofcal.programs import FAST_COMPILE, stored


#: in the store for a loss it can key (fit.HeldKernelsLoss); one that closes over its data
#: (fit.fit_steps with the kernels free) runs on jax.jit (programs.text_of)
@stored(static_argnames=("loss_fn", "length", "lr", "total", "final"))
def _adam_block(loss_fn, params, state, data, length, lr, total, final):
    opt = optax.adam(optax.cosine_decay_schedule(lr, total, final))

    def one(carry, _):
        p, s = carry
        value, grad = jax.value_and_grad(loss_fn)(p, data)
        upd, s = opt.update(grad, s, p)
        return (optax.apply_updates(p, upd), s), value

    (params, state), values = jax.lax.scan(one, (params, state), None, length=length)
    return params, state, values[-1]


#: :func:`_adam_block` compiled for its compile time (``programs.FAST_COMPILE``), for a loss that
#: costs little to run (:func:`minimize`'s ``fast_compile``): the step level with its kernels
#: held, 10 blocks of 50 steps over 210 steps, compiles in 0.31 s of CPU, not 0.80, and runs its
#: blocks in 4.5 ms rather than 0.8
_adam_block_fast = _adam_block.with_options(FAST_COMPILE)


@stored(static_argnames=("lr", "total", "final"))
def _adam_init(params, lr, total, final):
    """Adam's state at ``params`` (one program, not one per array)."""
    return optax.adam(optax.cosine_decay_schedule(lr, total, final)).init(params)


def minimize(loss_fn: Callable, params, data, steps: int, lr: float, desc: str = "fit",
             chunks: int = 10, progress: bool = True, final_lr_fraction: float = 0.01,
             fast_compile: bool = False):
    """Minimise ``loss_fn(params, data)`` with Adam; returns (params, final loss).

    ``steps`` iterations with a cosine decay from ``lr`` to ``lr·final_lr_fraction``, run as
    ``chunks`` jitted ``lax.scan`` blocks so a progress bar can advance between them; with
    ``fast_compile`` (a loss cheap to run) compiled for compile time (:data:`_adam_block_fast`).
    """
    block = _adam_block_fast if fast_compile else _adam_block
    per = max(1, steps // chunks)
    total = per * chunks
    state = _adam_init(params, lr, total, final_lr_fraction)
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=total, desc=desc, unit="it", leave=False, dynamic_ncols=True)
    value = float("nan")
    for _ in range(chunks):
        params, state, v = block(loss_fn, params, state, data, per, lr, total, final_lr_fraction)
        value = float(v)
        if bar is not None:
            bar.update(per)
            bar.set_postfix(loss=f"{value:.4g}")
    if bar is not None:
        bar.close()
    return params, value


#: optax.lbfgs's L-BFGS memory (pairs of steps) and its backtracking line search
#: (optax.scale_by_backtracking_linesearch): at most 31 trials, each 0.8 times the last, until the
#: loss falls by at least 1e-4 of the slope's promise (Armijo); a search's first trial is 1.5
#: times the last step taken, at most 1
MEMORY, TRIALS, SHRINK, GROW, ARMIJO = 10, 31, 0.8, 1.5, 1e-4

#: failed line searches in a row that end an L-BFGS run: a search fails when none of its 31 trials
#: lowers the loss enough (Armijo), and the last, 0.8³⁰ ≈ 1e-3 long, step is taken anyway.
#: One failure is often a badly scaled direction that the next iteration mends; two in a row
#: mean the loss no longer decreases measurably in float32 — after them the kernel fits never
#: gained more than 2e-7 (relative) in the rest of a stage, whose searches then ran all 31
#: trials each (12,683 of a fit's 48,248 objective evaluations)
FAILED_SEARCHES = 2


class Search(NamedTuple):
    """Where an L-BFGS run stands between two evaluations of the objective: the accepted point
    ``x`` (n,), its loss and gradient (inf and 0 before ``x`` is evaluated), the direction from
    it, the step length of the next trial, the trials of the current line search so far (−1:
    ``x`` not yet evaluated) and optax's L-BFGS memory."""

    x: jax.Array
    value: jax.Array
    grad: jax.Array
    direction: jax.Array
    step: jax.Array
    tries: jax.Array
    memory: optax.ScaleByLBFGSState

    @property
    def slope(self):
        """⟨direction, gradient⟩: the loss's rate of change along the direction at ``x``."""
        return self.direction @ self.grad


def start(x: np.ndarray) -> Search:
    """The :class:`Search` at ``x`` (n,), built on the host (no XLA program)."""
    n, zero = len(x), np.float32(0.0)
    vec, mat = np.zeros(n, np.float32), np.zeros((MEMORY, n), np.float32)
    memory = optax.ScaleByLBFGSState(count=np.int32(0), params=vec, updates=vec,
                                     diff_params_memory=mat, diff_updates_memory=mat,
                                     weights_memory=np.zeros(MEMORY, np.float32))
    return jax.device_put(Search(np.asarray(x, np.float32), np.float32(np.inf), vec, vec,
                                 zero, np.int32(-1), memory))


@stored(static_argnames=("loss_fn", "length"))
def _lbfgs_block(loss_fn, search, fails, data, length):
    """Up to ``length`` L-BFGS iterations from ``search`` (a :class:`Search`); fewer when
    :data:`FAILED_SEARCHES` line searches in a row fail (``fails``: failures in a row so far).
    Returns (search, fails, iterations run).

    optax.lbfgs with its backtracking line search, written as one loop with one evaluation of the
    objective (value and gradient) per turn. A turn is a trial of the line search; the trial that
    ends a search (Armijo's decrease, or the last of :data:`TRIALS`) moves ``x`` there and takes
    optax's L-BFGS direction from it (``optax.scale_by_lbfgs``). optax's own loop holds the
    objective twice (its first value and gradient, and the search's trials in a loop within
    the loop); this program holds it once and compiles in 30–40 % less CPU time (1.0–1.4 s
    instead of 1.5–2.2 s). Same steps as optax.lbfgs, up to float rounding (values from
    ``jax.value_and_grad`` rather than ``jax.linearize``) — which, on the kernel fits'
    non-convex surfaces, leads some stages to other local minima (docs/accuracy.md#kernels)."""
    lbfgs = optax.scale_by_lbfgs(memory_size=MEMORY)
    value_and_grad = jax.value_and_grad(loss_fn)

    def more(carry):
        i, _, fails = carry
        return (i < length) & (fails < FAILED_SEARCHES)

    def one(carry):
        i, s, fails = carry
        first = s.tries < 0                                  # x itself (step 0)
        trial = s.x + s.step * s.direction
        value, grad = value_and_grad(trial, data)
        error = value - s.value - ARMIJO * s.step * s.slope              # Armijo: ≤ 0 accepts
        error = jnp.where(jnp.isnan(error), jnp.inf, jnp.maximum(error, 0.0))
        ends = first | (error <= 0.0) | (s.tries >= TRIALS - 1)
        moves = ends & (first | jnp.isfinite(error))         # no finite value found: stay
        where = lambda c, new, old: jax.tree_util.tree_map(lambda a, b: jnp.where(c, a, b), new, old)
        x, value, grad = where(moves, (trial, value, grad), (s.x, s.value, s.grad))
        update, memory = lbfgs.update(grad, s.memory, x)
        direction, memory = where(ends, (-update, memory), (s.direction, s.memory))
        next_step = jnp.where(first, 1.0, jnp.minimum(GROW * jnp.where(moves, s.step, 0.0), 1.0))
        search = Search(x, value, grad, direction, jnp.where(ends, next_step, SHRINK * s.step),
                        jnp.where(ends, 0, s.tries + 1), memory)
        counted = ends & ~first
        fails = jnp.where(counted, jnp.where(error > 0.0, fails + 1, 0), fails)
        return i + counted.astype(jnp.int32), search, fails

    i, search, fails = jax.lax.while_loop(more, one, (jnp.zeros((), jnp.int32), search, fails))
    return search, fails, i


#: :func:`_lbfgs_block` compiled for its compile time (``programs.FAST_COMPILE``), for a short run
#: on few rows (:func:`lbfgs`'s ``fast_compile``)
_lbfgs_block_fast = _lbfgs_block.with_options(FAST_COMPILE)


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
    """``params``' arrays end to end in one float32 vector, on the host (no XLA program)."""
    return np.concatenate([np.asarray(params[k], np.float32).reshape(-1) for k, _ in layout])


def unflattened(x, layout: tuple) -> dict:
    """The dict of arrays that :func:`flattened` laid into ``x`` (a traced or a host vector)."""
    out, at = {}, 0
    for name, shape in layout:
        size = int(np.prod(shape, dtype=int))
        out[name] = x[at:at + size].reshape(shape)
        at += size
    return out


def lbfgs(loss_fn: Callable, params: dict, data, steps: int, chunks: int = 1, tol: float = 0.0,
          fast_compile: bool = False):
    """Minimise ``loss_fn(params, data)`` over a dict of float32 arrays with optax L-BFGS (on
    them laid end to end: :class:`OnVector`); returns (params, final loss).

    ``steps`` iterations in ``chunks`` jitted blocks; with ``tol`` > 0 it stops after the first
    block that lowers the loss by less than ``tol`` (relative) — deterministic, as the blocks
    are fixed. It stops earlier, inside a block, once :data:`FAILED_SEARCHES` line searches in
    a row found no decrease. With ``fast_compile`` (a run short and cheap) compiled for compile
    time (:data:`_lbfgs_block_fast`)."""
    block = _lbfgs_block_fast if fast_compile else _lbfgs_block
    layout = layout_of(params)
    on_vector = OnVector(loss_fn, layout)
    search = start(flattened(params, layout))
    fails = jax.device_put(np.int32(0))        # on the host: no XLA program
    per = max(1, steps // chunks)
    value = float("nan")
    for _ in range(chunks):
        search, fails, _ = block(on_vector, search, fails, data, per)
        last, value = value, float(search.value)
        if int(fails) >= FAILED_SEARCHES:
            break
        if tol > 0 and last == last and last - value < tol * abs(last):
            break
    found = unflattened(np.asarray(search.x), layout)   # on the host: no XLA program per slice
    return {k: jax.device_put(v) for k, v in found.items()}, value

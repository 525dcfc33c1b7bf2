"""The time scan's loop: its static description (:class:`Loop`) and the runner
(:func:`run_loop`) that steps a history of slabs with ``lax`` loops.

Saving is nested: an outer ``scan`` over saved slabs, an inner ``fori_loop``
of ``every`` steps, so memory is the window depth plus the saved slabs.  With
``checkpoint`` the inner loop runs in ``jax.checkpoint``-ed blocks of about
``sqrt(every)`` steps, so reverse-mode memory grows like ``sqrt(steps)``.

The step itself (what one position computes) is built in
:mod:`xstencil._engine.tscan`; this module only runs it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import io_callback

__all__ = ["Loop", "run_loop"]


@dataclass(frozen=True)
class Loop:
    """Static description of the loop.

    Positions ``start .. start + steps - 1`` are computed; ``every`` is the
    save interval (``0``: keep only the last slab); ``lo``/``hi`` the window's
    reach along time; ``length`` the input's length along time (0 when
    growing); ``mode`` the time axis's boundary mode for reads past the end.
    """

    start: int
    steps: int
    every: int
    lo: int
    hi: int
    length: int = 0
    mode: str = "fill"
    checkpoint: bool = False
    progress_every: int = 0
    check_finite: bool = False

    @property
    def depth(self) -> int:
        return self.lo

    @property
    def saves(self) -> int:
        return 1 if self.every == 0 else self.steps // self.every


# -- the loop ---------------------------------------------------------------------------

def run_loop(step: Callable[[Any, Any], tuple[Any, ...]], init: Sequence[Sequence[Any]],
             loop: Loop, progress: Any = None) -> tuple[tuple[Any, ...], Any]:
    """Run ``loop.steps`` steps from the history ``init`` (per evolving
    variable, its last ``max(depth, 1)`` slabs, oldest first).

    Returns ``(saved, first_bad)``: per evolving variable the saved slabs
    stacked along a new axis 0 (one per save; the last slab only when
    ``loop.every == 0``), and the first position where a non-finite value
    appeared (-1 if none, or if ``check_finite`` is off).  ``progress`` is
    ``(callback, token)``: every ``loop.progress_every`` steps (after each
    chunk of that many steps, or after the save group that completes it) the
    loop tests whether a report is due; if so it calls
    ``callback(token, done)`` on the host (``io_callback``), which returns the
    step count of the next report, so the host sets the update rate.  With
    ``loop.checkpoint`` the test comes after each save group (or checkpoint
    block, without saves), outside the checkpointed steps.  The steps compute
    the same with and without ``progress`` (bitwise).
    """
    hist0 = tuple(tuple(h) for h in init)
    bad0 = jnp.asarray(-1, jnp.int32) if loop.check_finite else None

    def one(t: Any, carry: Any) -> Any:
        if not loop.check_finite:
            return _one(t, carry[0]), None
        hist, bad = carry
        new = step(t, hist)
        if loop.check_finite:
            ok = jnp.asarray(True)
            for n in new:
                if jnp.issubdtype(n.dtype, jnp.inexact):
                    ok = ok & jnp.all(jnp.isfinite(n))
            bad = jnp.where((bad < 0) & ~ok, t.astype(jnp.int32), bad)
        return _shift(hist, new), bad

    def _one(t: Any, hist: Any) -> Any:
        return _shift(hist, step(t, hist))

    chunk = loop.progress_every if progress is not None else 0

    def report(done: Any, due: Any, gate: Any = True) -> Any:
        """After ``done`` steps, if a report is ``due`` (and ``gate``): the host
        moves the bar and answers the step count of its next report (it adapts
        that to the measured speed).  A ``while_loop`` of zero or one trip,
        not a ``cond``: JAX cannot vmap a ``cond`` holding an ``io_callback``."""
        callback, token = progress
        done = jnp.asarray(done, jnp.int32)
        return lax.while_loop(lambda d: gate & (done >= d), lambda d: io_callback(
            callback, jax.ShapeDtypeStruct((), jnp.int32), token, done, ordered=False), due)

    def advance(carry: Any, t0: Any, n: int, due: Any) -> Any:
        if n == 0:
            return carry, due
        if chunk and n >= chunk and not loop.checkpoint:
            # chunks of steps, a scalar test after each (is a report due?): no per-step branch
            nc, rem = divmod(n, chunk)

            def part(j: Any, cd: Any) -> Any:
                c = lax.fori_loop(0, chunk, lambda i, c: one(t0 + j * chunk + i, c), cd[0])
                return c, report(t0 + (j + 1) * chunk - loop.start, cd[1])

            carry, due = lax.fori_loop(0, nc, part, (carry, due))
            return lax.fori_loop(0, rem, lambda i, c: one(t0 + nc * chunk + i, c), carry), due
        if not loop.checkpoint or n < 4:
            return lax.fori_loop(0, n, lambda i, c: one(t0 + i, c), carry), due
        b = math.isqrt(n)
        nb, rem = divmod(n, b)

        @jax.checkpoint
        def block(c: Any, j: Any) -> Any:
            return lax.fori_loop(0, b, lambda i, c: one(t0 + j * b + i, c), c)

        def blocks(cd: Any, j: Any) -> Any:
            c, d = block(cd[0], j), cd[1]
            if chunk and d is not None:  # a test after each block, outside the checkpoint
                d = report(t0 + (j + 1) * b - loop.start, d)
            return (c, d), None

        (carry, due), _ = lax.scan(blocks, (carry, due), jnp.arange(nb))
        return lax.fori_loop(0, rem, lambda i, c: one(t0 + nb * b + i, c), carry), due

    due0 = jnp.asarray(0, jnp.int32)  # the first check reports (and starts the clock)
    carry0 = (hist0, bad0)
    if loop.every == 0:
        (hist, bad), _ = advance(carry0, jnp.asarray(loop.start), loop.steps, due0)
        return tuple(h[-1][None] for h in hist), _bad(bad)
    every = loop.every

    # groups per check; with checkpoint, advance() runs no chunks, so the test
    # comes after each group, however long
    per = max(1, chunk // every) if chunk and (every < chunk or loop.checkpoint) else 0

    if loop.checkpoint:
        # the report stays outside the checkpointed steps: JAX cannot
        # rematerialize an io_callback (its effect) under grad
        if every > 1:
            block = jax.checkpoint(lambda c, j: advance(c, loop.start + j * every, every,
                                                        None)[0])
        else:  # per-step checkpoint
            def block(c: Any, j: Any) -> Any:
                return jax.checkpoint(lambda c, t: one(t, c))(c, loop.start + j)

        def run_group(carry: Any, due: Any, j: Any) -> Any:
            return block(carry, j), due
    else:
        def run_group(carry: Any, due: Any, j: Any) -> Any:
            return advance(carry, loop.start + j * every, every, due)

    def group(cd: Any, j: Any) -> Any:
        carry, due = run_group(cd[0], cd[1], j)
        if per:
            due = report((j + 1) * every, due, (j + 1) % per == 0)
        return (carry, due), tuple(h[-1] for h in carry[0])

    ((hist, bad), _), saved = lax.scan(group, (carry0, due0), jnp.arange(loop.saves))
    return saved, _bad(bad)


def _shift(hist: Any, new: Sequence[Any]) -> Any:
    """Drop the oldest slab of each history and append the new one."""
    return tuple(h[1:] + (n,) if len(h) > 1 else (n,) for h, n in zip(hist, new, strict=True))


def _bad(bad: Any) -> Any:
    return jnp.asarray(-1, jnp.int32) if bad is None else bad

"""The time loop of a grown loop scan (split from :mod:`xstencil._labelled.loop_scan`).

:func:`run_steps` runs the steps of one scan on the compiled nest of one
step (``loops._Built``): the first step from Python, which also checks the
state with ``check_finite`` and moves a progress bar, and, once the nest is
hot, the rest in compiled chunks (:mod:`xstencil._backends.loop_steps`).
Each step writes every advanced variable's new slab into a buffer of its
own (two spares per variable, or the saved position), reading the previous
slabs of all of them, so the results are bitwise those of a numpy time loop.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from xstencil import _progress
from xstencil._backends import bufpool, loop_steps
from xstencil._backends.finite import all_finite
from xstencil._labelled.scan_dims import short_buffers
from xstencil._labelled.scan_plan import ScanPlan
from xstencil._labelled.scan_result import finite, initial_finite

__all__ = ["run_loop", "run_steps", "step_sources"]

_LOG = logging.getLogger("xstencil.loops")


def step_sources(slabs: Sequence[np.ndarray], consts: Sequence[np.ndarray | None],
             evolving: Sequence[int]) -> list[np.ndarray]:
    """The loop's source arrays: per variable its current slab or constant."""
    return [slabs[evolving.index(i)] if c is None else c for i, c in enumerate(consts)]



def run_steps(built: Any, sp: ScanPlan, slabs: Sequence[np.ndarray],
              consts: Sequence[np.ndarray | None], order: Sequence[int], dleaves: list[Any],
              leaves: list[Any]) -> list[np.ndarray]:
    """:func:`run_loop`, under a progress bar where the scan asks for one (as
    :func:`~xstencil._labelled.scan_result.call_with_progress` opens it for
    the XLA loop and for a repeated call); with ``check_finite``, the initial
    state is checked first, as the XLA scan does (a repeated call checks it
    in :mod:`~xstencil._labelled.scan_fast`)."""
    if sp.check_finite and not all(all_finite(s) for s in slabs):  # numpy: a quick read
        initial_finite(sp.call, [[s] for s in slabs], sp.dim, sp.k)  # XLA's error
    if not sp.loop.progress_every:
        return run_loop(built, sp, slabs, consts, order, dleaves, leaves)
    with _progress.Progress(sp.loop.steps, _progress.label(sp.call)) as p:
        outs = run_loop(built, sp, slabs, consts, order, dleaves, leaves, p.token)
        if p.interrupted:  # Ctrl-C after the last report: the run finished anyway
            raise KeyboardInterrupt
    return outs


def run_loop(built: Any, sp: ScanPlan, slabs: Sequence[np.ndarray],
           consts: Sequence[np.ndarray | None], order: Sequence[int], dleaves: list[Any],
           leaves: list[Any], token: int = 0) -> list[np.ndarray]:
    """Run ``sp.loop.steps`` steps from ``slabs`` (one per advanced variable;
    ``consts``: a Dataset's constants; ``order``: the advanced variable each
    loop output is): per advanced variable its saved positions, dim first.
    Every step writes every variable's new slab into a buffer of its own,
    reading the previous slabs of all of them (two buffers per variable).
    ``token``: the open progress bar (:mod:`xstencil._progress`) to move
    between steps (:class:`~xstencil._progress.Ticker`; 0: none, and the test
    for a due report never passes).  With ``check_finite``, each step's new
    slabs are checked after the step; the first that holds a NaN or Inf stops
    the loop with the XLA scan's error for its position."""
    loop = sp.loop
    params = [np.ascontiguousarray(np.asarray(x, dtype=p.dtype)).reshape(-1)
              for x, p in zip(list(dleaves) + list(leaves), built.params, strict=True)]
    fixed = [*built.tables, *built.fills, *params]
    every, steps = loop.every, loop.steps
    outs, spares = _buffers(slabs, loop.saves + 1 if every else 1, every)
    cur = list(slabs)  # never written: they may share the caller's data
    check = loop.check_finite
    tick = _progress.Ticker(token)
    due = 1 if token else steps + 1  # the first report after one step: it times a step
    short = short_buffers(sp, slabs)
    fused = _fused(built) if check and not short else None
    fz = np.empty(built.field[0], np.bool_) if fused is not None else None
    # after a first step here, the rest in compiled chunks (loop_steps.py)
    drive: Any = None if not short and (fused is not None or not check) and loop_steps.hot(
        built.fn, steps) else False
    if drive is None and fused is not None:  # its first step runs the driver's build too
        fused.prefer_parallel()
    # stepped from Python to the end (no driver): the thread count is tuned here
    stepped = loop_steps.Stepped(built) if drive is False and steps >= loop_steps.MIN_STEPS \
        else None
    with stepped or contextlib.nullcontext():
        t = 0
        while t < steps:
            if stepped is not None:
                stepped.before()
            t += 1
            if every and t % every == 0:
                nxt = [out[t // every] for out in outs]
            elif not every and t == steps:
                nxt = [out[0] for out in outs]
            else:
                nxt = [a if c is not a else b for c, (a, b) in zip(cur, spares, strict=True)]
            if short:  # variables on fewer dims: the loop writes the whole field, kept here
                built.fn(*[nxt[j] if j not in short else short[j][0] for j in order],
                         *step_sources(cur, consts, sp.evolving), *fixed)
                for j, (full, index) in short.items():
                    np.copyto(nxt[j], full[index])
            elif fused is not None:  # the nest reports per row whether what it wrote is finite
                try:
                    fused(fz, *[nxt[j] for j in order], *step_sources(cur, consts, sp.evolving),
                          *fixed)
                except Exception as e:  # noqa: BLE001 - its compile failed: the plain nest + a read
                    _LOG.debug("check_finite reads the state after each step: %s", e)
                    built.drop_checked()
                    built.fn(*[nxt[j] for j in order], *step_sources(cur, consts, sp.evolving),
                             *fixed)
                    fused = None
                else:
                    if not fz.all():
                        finite(sp.call, loop.start + t - 1, sp.tvals, sp.dim)
            else:
                built.fn(*[nxt[j] for j in order], *step_sources(cur, consts, sp.evolving), *fixed)
            if stepped is not None:
                stepped.after()
            if check and fused is None and not all(all_finite(x) for x in nxt):
                finite(sp.call, loop.start + t - 1, sp.tvals, sp.dim)
            cur = nxt
            if t >= due:
                due = tick(t)
            if drive is None and t < steps:
                drive = loop_steps.driver(fused if fused is not None else built.fn, len(slabs),
                                          order, _roles(consts, sp.evolving), len(fixed),
                                          fused is not None) or False
            if drive and t < steps:
                t, cur, status, due = _drive(drive, t, steps, every, cur, fz, outs, spares,
                                             consts, fixed, due, tick)
                if status == 1:
                    finite(sp.call, loop.start + t - 1, sp.tvals, sp.dim)
                drive = drive if status == 0 else False  # 2, 3: the rest runs here
    if not every and steps == 0:
        for out, slab in zip(outs, slabs, strict=True):
            out[0] = slab
    return outs


def _buffers(slabs: Sequence[np.ndarray], n: int, every: int
             ) -> tuple[list[np.ndarray], list[tuple[np.ndarray, np.ndarray]]]:
    """Per advanced variable, the saved positions (``n`` of them, the first
    the initial slab where positions are saved) and two spare slabs: each
    step reads one and writes the other, each placed by what it reads
    (bufpool.offset: half a page after it within a page)."""
    outs = [bufpool.empty((n, *s.shape), s.dtype) for s in slabs]
    if every:
        for out, slab in zip(outs, slabs, strict=True):
            out[0] = slab
    spares = []
    for s in slabs:
        first = bufpool.empty(s.shape, s.dtype, bufpool.near_of(s))
        spares.append((first, bufpool.empty(s.shape, s.dtype, bufpool.near_of(first))))
    return outs, spares


def _roles(consts: Sequence[np.ndarray | None], evolving: Sequence[int]
           ) -> list[tuple[str, int]]:
    """Per nest source, what :func:`step_sources` passes: ``("c", j)``, the
    state of advanced variable ``j``, or ``("k", i)``, constant ``i``."""
    return [("c", evolving.index(i)) if c is None else ("k", i) for i, c in enumerate(consts)]


def _drive(drive: Any, t: int, steps: int, every: int, cur: list[np.ndarray],
           fz: np.ndarray | None, outs: list[np.ndarray],
           spares: list[tuple[np.ndarray, np.ndarray]], consts: Sequence[np.ndarray | None],
           fixed: list[Any], due: int, tick: Any) -> tuple[int, list[np.ndarray], int, int]:
    """Steps ``t + 1 ..`` by the compiled driver (:func:`loop_steps.run
    <xstencil._backends.loop_steps.run>`): the last step run, the state after
    it, the status (0: done; 1: step ``t`` is not finite; 2, 3: the rest runs
    in Python) and the next due report."""
    return loop_steps.run(drive, t, steps, every, cur, fz, outs, spares,
                          [c for c in consts if c is not None], fixed, due, tick)


def _fused(built: Any) -> Any:
    """The nest that computes ``check_finite``'s flags as it writes (a
    map's loop, ``loops._Built.checked``), or ``None`` (a mesh's nests: the
    new state is read after the step)."""
    checked = getattr(built, "checked", None)
    if checked is None or not built.field:
        return None
    return checked()

"""Scans along one axis (time stepping), computed slab by slab.

The field is split into a walked axis (time) and the others, which are
computed in parallel: each step evaluates the kernel over one slab (the field
without the walked axis) with :func:`xstencil._engine.lower.evaluate`, so a
step compiles into the same fused whole-array expression as a map.

One ``lax`` loop runs the steps; its carry holds only the last ``depth``
computed slabs of each evolving variable (the window's reach into the past).
A window cell at time offset ``o`` reads

* ``o < 0``: the slab computed ``-o`` steps ago (the carry), for evolving
  variables, or the input at ``t + o`` for variables the scan does not compute;
* ``o >= 0``: the input at ``t + o`` (the time axis's boundary mode beyond the
  end), or, when there is no input (growing a trajectory), the latest slab.

Each time offset of each variable is its own spatial-only :class:`Source`; the
per-cell window is rebuilt by stacking those cells along the window's time
axis (``expand_dims`` + ``concatenate``: structural operations that the lifter
turns into nothing; ``jnp.stack`` is its own primitive, which it does not
know).  Spatial
boundary modes come from the sources' virtual padding, so no padded copy of a
slab is ever made.

Saving is nested: an outer ``scan`` over saved slabs, an inner ``fori_loop``
of ``every`` steps, so memory is the window depth plus the saved slabs.  With
``checkpoint`` the inner loop runs in ``jax.checkpoint``-ed blocks of about
``sqrt(every)`` steps, so reverse-mode memory grows like ``sqrt(steps)``.

:func:`slab_mesh` (a mesh over one slab whose membership along the walked axes
is decided at run time) and :func:`read_cells` (which window cells the kernels
read) are shared with the kernex-semantics :mod:`xstencil._engine.kscan`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import io_callback

from xstencil._engine.boundary import pad
from xstencil._engine.call import stand_in
from xstencil._engine.lower import AxisGeom, KernelCall, Source, dependencies, evaluate, trace
from xstencil._engine.mesh import Mask, Slab, region_values, write_region

__all__ = ["Var", "Loop", "slab_mesh", "read_cells", "time_reads", "stacking", "run_loop",
           "stencil_step"]


# -- shared with kscan ------------------------------------------------------------------

def read_cells(calls: Sequence[KernelCall], sources: Sequence[Source], geom: Sequence[AxisGeom],
               dyn: Any) -> tuple[list[set[tuple[int, ...]]], set[int]]:
    """Which window cells of each source, and which ``dyn`` leaves, any of
    ``calls`` reads (a static dependency analysis of the traced kernels)."""
    shapes = [tuple(geom[a].size for a in s.cell_axes) for s in sources]
    out: list[set[tuple[int, ...]]] = [set() for _ in sources]
    used: set[int] = set()
    for call in calls:
        closed, _ = trace(call, sources, geom, dyn)
        for k, cells in enumerate(dependencies(closed, len(sources), shapes)):
            out[k] |= cells
        used |= _used_inputs(closed.jaxpr, len(sources))
    return out, used


def _used_inputs(jaxpr: Any, skip: int) -> set[int]:
    """Indices (after the first ``skip``) of the jaxpr inputs that any equation
    or output reads."""
    ids = {id(v): k for k, v in enumerate(jaxpr.invars) if k >= skip}
    used = set()
    for eqn in jaxpr.eqns:
        for v in eqn.invars:
            if id(v) in ids:
                used.add(ids[id(v)] - skip)
    for v in jaxpr.outvars:
        if id(v) in ids:
            used.add(ids[id(v)] - skip)
    return used


def slab_mesh(branches: Sequence[tuple[Slab | Mask, KernelCall]], base: KernelCall,
              sources: Sequence[Source], sub: Sequence[AxisGeom], dyn: Any,
              pos: dict[int, Any], walked: dict[int, tuple[int, int]]) -> Any:
    """One slab under a function mesh whose regions span the walked axes.

    ``sub`` is the slab's geometry (count 1 along each walked axis), ``pos``
    the current (traced) output position along each walked axis and
    ``walked`` the ``[lo, hi)`` range of positions the walk visits.  Region
    membership along walked axes is decided at run time, except for regions
    that span the whole walk, which apply unconditionally.  Returns the
    kernels' output pytree.
    """
    par: list[tuple[Slab | Mask, KernelCall, Any]] = []
    for region, call in branches:
        if isinstance(region, Mask):
            m = lax.dynamic_slice(jnp.asarray(region.array, bool),
                                  [pos.get(a, 0) for a in range(len(sub))],
                                  [1 if a in pos else sub[a].count for a in range(len(sub))])
            par.append((Mask(m), call, None))
            continue
        ranges = list(region.ranges)
        cond: Any = None
        for a, p in pos.items():
            lo, hi, step = ranges[a]
            w_lo, w_hi = walked[a]
            ranges[a] = (0, 1, 1)
            if lo <= w_lo and hi >= w_hi and step == 1:
                continue
            c = (p >= lo) & (p < hi) & ((p - lo) % step == 0)
            cond = c if cond is None else cond & c
        par.append((Slab(tuple(ranges)), call, cond))
    first = 0
    for k, (region, _, cond) in enumerate(par):
        if cond is None and isinstance(region, Slab) and region.covers(sub):
            first = k + 1
    if first:
        out = evaluate(par[first - 1][1], sources, sub, dyn)
    else:
        out = evaluate(base, sources, sub, dyn)
    leaves, treedef = jax.tree_util.tree_flatten(out)
    for region, call, cond in par[first:]:
        vals = region_values(region, call, sources, sub, dyn)
        if vals is None:
            continue
        new = write_region(leaves, region, vals)
        leaves = new if cond is None else [jnp.where(cond, n, o)
                                           for n, o in zip(new, leaves, strict=True)]
    return jax.tree_util.tree_unflatten(treedef, leaves)


# -- time scans -------------------------------------------------------------------------

@dataclass(frozen=True)
class Var:
    """One variable of a time scan.

    ``axes``/``cell_axes``/``pads``/``modes``/``fill_value`` describe its slab
    as a :class:`Source` (field axes, time excluded).  ``window_time`` is the
    position of the time axis in its per-cell window (``None`` when the window
    has no time axis).  ``state`` is its index among the evolving variables
    (``None``: not computed by the scan).  ``has_time``: its input carries the
    time axis (as axis 0).
    """

    axes: tuple[int, ...]
    cell_axes: tuple[int, ...]
    pads: tuple[tuple[int, int], ...]
    modes: tuple[str, ...]
    fill_value: Any
    window_time: int | None
    state: int | None
    has_time: bool


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


def _time_index(p: Any, n: int, mode: str) -> tuple[Any, Any]:
    """The input index read at time position ``p`` (traced), and whether it is
    inside (``False`` means the fill value)."""
    if mode == "periodic":
        return p % n, True
    if mode == "extend":
        return jnp.clip(p, 0, n - 1), True
    if mode == "reflect":
        if n == 1:
            return p * 0, True
        q = p % (2 * n - 2)
        return jnp.where(q < n, q, 2 * n - 2 - q), True
    if mode == "symmetric":
        q = p % (2 * n)
        return jnp.where(q < n, q, 2 * n - 1 - q), True
    return jnp.clip(p, 0, n - 1), p < n


def stacking(call: KernelCall, variables: Sequence[Var], loop: Loop) -> KernelCall:
    """Wrap ``call(cells, dyn)`` (cells: one per variable, then the extra
    sources) so that it accepts one cell per source of :func:`stencil_step`
    (a variable with a time window has one source per time offset)."""
    width = loop.lo + loop.hi + 1

    def wrapped(cells: Sequence[Any], dyn: Any) -> Any:
        out = []
        k = 0
        for v in variables:
            if v.window_time is None:
                out.append(cells[k])
                k += 1
            else:
                t = v.window_time
                out.append(lax.concatenate(
                    [lax.expand_dims(c, (t,)) for c in cells[k:k + width]], t))
                k += width
        return call(out + list(cells[k:]), dyn)

    return wrapped


def step_sources(variables: Sequence[Var], arrays: Sequence[Any], hist: Sequence[Sequence[Any]],
                 t: Any, loop: Loop) -> list[Source]:
    """The sources one step reads at position ``t``."""
    out = []
    for v, x in zip(variables, arrays, strict=True):
        offsets = [0] if v.window_time is None else range(-loop.lo, loop.hi + 1)
        for o in offsets:
            if v.state is not None and (o < 0 or x is None):
                h = hist[v.state]
                slab = h[len(h) + o] if o < 0 else h[-1]
            elif v.has_time:
                idx, inside = _time_index(t + o, loop.length, loop.mode)
                slab = lax.dynamic_index_in_dim(x, idx, 0, keepdims=False)
                if inside is not True:
                    slab = jnp.where(inside, slab, jnp.asarray(v.fill_value, slab.dtype))
            else:
                slab = x
            out.append(_padded(slab, v))
    return out


def _padded(slab: Any, v: Var) -> Source:
    """A source over ``slab`` with its halo built explicitly.

    Inside a loop, one fused pass over a padded slab (XLA fuses the halo's
    concatenates into the consumer) beats the map's interior/shell split,
    whose pieces are assembled with dynamic-update-slices that force copies
    of the loop carry.
    """
    if not v.pads or not any(lo or hi for lo, hi in v.pads):
        return Source(slab, v.axes, v.cell_axes)
    padded = lax.optimization_barrier(pad(slab, v.pads, v.modes, v.fill_value))
    return Source(padded, v.axes, v.cell_axes)


def _drop_axis(src: Source, axis: int) -> Source:
    def f(axes: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(a - (a > axis) for a in axes)

    return dataclasses.replace(src, axes=f(src.axes), cell_axes=f(src.cell_axes))


def stencil_step(branches: Sequence[tuple[Slab | Mask, KernelCall]], base: KernelCall,
                 variables: Sequence[Var], arrays: Sequence[Any], extra: Sequence[Source],
                 geom: Sequence[AxisGeom], axis: int, tcoord: Any, dyn: Any,
                 loop: Loop, total: int) -> Callable[[Any, Any], tuple[Any, ...]]:
    """``step(t, hist) -> new slabs``: one time step of a (mesh of) kernel(s).

    ``geom`` is the full output geometry (``total`` positions along ``axis``);
    ``tcoord`` the padded time coordinate (or ``None``), whose window is
    passed to the kernels as ``dyn = (dyn, window)``.
    """
    sub = [AxisGeom(0, 1, 1, 1) if a == axis else g for a, g in enumerate(geom)]
    wrap = [(r, stacking(c, variables, loop)) for r, c in branches]
    wbase = stacking(base, variables, loop)
    covering = [c for r, c in wrap if isinstance(r, Slab) and r.ranges[axis][0] <= loop.start
                and r.ranges[axis][1] >= total and r.ranges[axis][2] == 1
                and r.covers([AxisGeom(0, 1, total if a == axis else g.count)
                              for a, g in enumerate(geom)])]
    plain = len(wrap) == 1 and covering
    width = loop.lo + loop.hi + 1

    def step(t: Any, hist: Any) -> tuple[Any, ...]:
        srcs = step_sources(variables, arrays, hist, t, loop) + list(extra)
        tw = None if tcoord is None else lax.dynamic_slice(tcoord, [t], [width])
        d = (dyn, tw)
        if plain:
            # without the walked axis: no size-1 axis in the step's expressions
            flat = [g for a, g in enumerate(geom) if a != axis]
            out = evaluate(wrap[0][1], [_drop_axis(x, axis) for x in srcs], flat, d)
            return tuple(jax.tree_util.tree_leaves(out))
        else:
            out = slab_mesh(wrap, wbase, srcs, sub, d, {axis: t}, {axis: (loop.start, total)})
        return tuple(lax.squeeze(leaf, (axis,)) for leaf in jax.tree_util.tree_leaves(out))

    return step


def time_reads(calls: Sequence[KernelCall], variables: Sequence[Var], slabs: Sequence[Any],
               extra: Sequence[Source], geom: Sequence[AxisGeom], axis: int, tcoord: Any,
               dyn: Any, loop: Loop) -> tuple[set[tuple[int, int]], bool]:
    """``({(variable, time offset) read}, whether the time coordinate is read)``.

    ``slabs`` are arrays (or shape structs) of each variable's slab.
    """
    sub = [AxisGeom(0, 1, 1, 1) if a == axis else g for a, g in enumerate(geom)]
    srcs, owner = [], []
    for k, (v, s) in enumerate(zip(variables, slabs, strict=True)):
        offsets = [0] if v.window_time is None else range(-loop.lo, loop.hi + 1)
        for o in offsets:
            srcs.append(Source(s, v.axes, v.cell_axes, v.pads, v.modes, v.fill_value))
            owner.append((k, o))
    srcs += list(extra)
    width = loop.lo + loop.hi + 1
    tw = None if tcoord is None else stand_in((width,), tcoord.dtype)
    wrapped = [stacking(c, variables, loop) for c in calls]
    cells, used = read_cells(wrapped, srcs, sub, (dyn, tw))
    reads = {owner[k] for k in range(len(owner)) if cells[k]}
    n_dyn = len(jax.tree_util.tree_leaves(dyn))
    return reads, tcoord is not None and n_dyn in used


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

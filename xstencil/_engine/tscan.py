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

The loop that runs the steps (:class:`Loop`, :func:`run_loop`: nested saves,
checkpointed blocks, progress reports) lives in :mod:`xstencil._engine.tloop`
and is re-exported here.

:func:`slab_mesh` (a mesh over one slab whose membership along the walked axes
is decided at run time) and :func:`read_cells` (which window cells the kernels
read) are shared with the kernex-semantics :mod:`xstencil._engine.kscan`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from xstencil._engine.boundary import pad, pads_fuse
from xstencil._engine.call import stand_in
from xstencil._engine.lower import (
    AxisGeom,
    KernelCall,
    Source,
    dependencies,
    evaluate,
    trace,
)
from xstencil._engine.mesh import Mask, Slab, guarded, kept, region_values, write_region
from xstencil._engine.tloop import Loop, run_loop

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
    # as mesh_evaluate: each kernel reads NaN and inf as zero in its derivatives at
    # the outputs a later region overwrites (NaN land must not reach the gradient
    # of what the sea kernel keeps); a region that applies only at some positions
    # of the walk is not counted as overwriting
    if first:
        out = guarded(par[first - 1][1], sources, sub, dyn, _kept_at(par, first - 1, sub))
    else:
        out = evaluate(base, sources, sub, dyn)
    leaves, treedef = jax.tree_util.tree_flatten(out)
    for k, (region, call, cond) in enumerate(par[first:], first):
        vals = region_values(region, call, sources, sub, dyn, _kept_at(par, k, sub))
        if vals is None:
            continue
        new = write_region(leaves, region, vals)
        leaves = new if cond is None else [jnp.where(cond, n, o)
                                           for n, o in zip(new, leaves, strict=True)]
    return jax.tree_util.tree_unflatten(treedef, leaves)


def _kept_at(par: Sequence[tuple[Slab | Mask, KernelCall, Any]], k: int,
             sub: Sequence[AxisGeom]) -> Any:
    """:func:`~xstencil._engine.mesh.kept` of ``par[k]``, counting as later
    regions only those that apply at every position of the walk."""
    seq = [(r, c) for r, c, _ in par[:k + 1]]
    seq += [(r, c) for r, c, cond in par[k + 1:] if cond is None]
    return kept(seq, k, sub)


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
    padded = pad(slab, v.pads, v.modes, v.fill_value)
    if not pads_fuse():  # XLA:CPU: built once, not recomputed inside each consumer
        padded = lax.optimization_barrier(padded)
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
    rest = tuple(a for a in range(len(geom)) if a != axis)
    fits = [_fitter(v.axes, rest) for v in sorted(
        (v for v in variables if v.state is not None), key=lambda v: v.state)]

    def step(t: Any, hist: Any) -> tuple[Any, ...]:
        srcs = step_sources(variables, arrays, hist, t, loop) + list(extra)
        tw = None if tcoord is None else lax.dynamic_slice(tcoord, [t], [width])
        d = (dyn, tw)
        if plain:
            # without the walked axis: no size-1 axis in the step's expressions
            flat = [g for a, g in enumerate(geom) if a != axis]
            out = evaluate(wrap[0][1], [_drop_axis(x, axis) for x in srcs], flat, d)
            leaves = jax.tree_util.tree_leaves(out)
        else:
            out = slab_mesh(wrap, wbase, srcs, sub, d, {axis: t}, {axis: (loop.start, total)})
            leaves = [lax.squeeze(leaf, (axis,)) for leaf in jax.tree_util.tree_leaves(out)]
        if len(leaves) != len(fits):
            return tuple(leaves)
        return tuple(fit(leaf) for fit, leaf in zip(fits, leaves, strict=True))

    return step


def _fitter(axes: tuple[int, ...], rest: tuple[int, ...]) -> Callable[[Any], Any]:
    """Fit a step's output over the slab's axes ``rest`` (the field's, time
    excluded) to a variable's slab over ``axes`` (a subset of ``rest``, in the
    variable's order): the first cell along the axes it lacks (the labelled
    layer has checked that the output is constant along them), transposed.
    """
    if axes == rest:
        return lambda x: x
    index = tuple(slice(None) if a in axes else 0 for a in rest)
    kept = [a for a in rest if a in axes]
    perm = tuple(kept.index(a) for a in axes)

    def fit(x: Any) -> Any:
        if x.ndim != len(rest):  # not an output over the slab: the caller's error
            return x
        x = x[index]
        return x if perm == tuple(range(len(perm))) else jnp.transpose(x, perm)

    return fit


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

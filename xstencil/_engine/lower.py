"""Lower a kernel over a slab of output positions to whole-array operations.

This is the performance core (DESIGN.md section 5).  The kernel is traced
once on a per-cell window; :mod:`xstencil._engine.lift` then replays it with
each window cell standing for a whole shifted slice of the padded input, so
a map compiles into one fused XLA expression.  Kernels that cannot be lifted
(data-dependent indexing, control flow on window values) fall back to
``vmap`` over a materialized stack of windows, which gives the same numbers.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from xstencil._engine import dense as dense_windows
from xstencil._engine import dense_split
from xstencil._engine.boundary import block, pads_fuse
from xstencil._engine.call import stand_in
from xstencil._engine.lift import (
    Abstract,
    ArrayAlgebra,
    DepsAlgebra,
    Lifted,
    Table,
    Unliftable,
    cell_grid,
    interpret,
)
from xstencil._errors import XStencilError

__all__ = ["AxisGeom", "Source", "evaluate", "dependencies", "cell_avals"]


@dataclass(frozen=True)
class AxisGeom:
    """Where the outputs of a slab sit along one field axis.

    Output ``j`` (``0 <= j < count``) reads the window whose first cell is at
    padded index ``start + j * step``; the window has ``size`` cells.
    """

    start: int
    step: int
    count: int
    size: int = 1


@dataclass(frozen=True)
class Source:
    """One input array and how its axes map onto the field's axes.

    ``axes`` are the field axes of the array's dims (increasing); ``cell_axes``
    (a subset of ``axes``) are the axes the kernel's per-cell window spans.
    ``pads`` gives the ``(lo, hi)`` halo per array axis, filled by ``modes``
    (see :mod:`xstencil._engine.boundary`); geometry indices are in padded
    coordinates.  The padding is virtual: the interior of the output reads
    the array directly and only the boundary shell reads a padded copy.
    """

    array: Any
    axes: tuple[int, ...]
    cell_axes: tuple[int, ...]
    pads: tuple[tuple[int, int], ...] = ()
    modes: tuple[str, ...] = ()
    fill_value: Any = 0

    def shifts(self) -> list[int]:
        """Padded index minus array index, per array axis."""
        return [-lo for lo, _ in self.pads] if self.pads else [0] * len(self.axes)

    def block(self, geom: Sequence[AxisGeom]) -> tuple[Any, list[int]]:
        """The padded block that a slab reads, and its shifts."""
        ranges = []
        for a in self.axes:
            g = geom[a]
            size = g.size if a in self.cell_axes else 1
            ranges.append((g.start, g.start + g.step * (g.count - 1) + size))
        if not self.pads:
            return self.array, [0] * len(self.axes)
        x = block(self.array, ranges, self.pads, self.modes, self.fill_value)
        return x, [-a for a, _ in ranges]


KernelCall = Callable[[Sequence[Any], Any], Any]


#: Window cells a kernel may read before lowering switches from one shifted
#: slice per cell to one gather of every window (see ``_gathered``).  Measured
#: on 2 busy CPU cores, 100x100 float32, ``(u * w).sum()``: the sliced program
#: compiled in 5 s at 9x9, 13 s at 15x15, 19 s at 21x21 and did not finish in
#: 2 minutes at 31x31 (61x61: 37 s and 678 MB was reported on a free machine).
MAX_LIFTED_CELLS = 256

#: The largest stack of windows ``_gathered`` builds (a bigger one is refused).
MAX_GATHER_BYTES = 2**30


def cell_avals(sources: Sequence[Source], geom: Sequence[AxisGeom]) -> list[Any]:
    return [
        stand_in(tuple(geom[a].size for a in s.cell_axes), s.array.dtype)
        for s in sources
    ]


def _slice(x: Any, src: Source, cell: tuple[int, ...], geom: Sequence[AxisGeom],
           shift: Sequence[int]) -> Any:
    """The slice of ``x`` that window cell ``cell`` reads at every output;
    ``shift`` converts padded indices to indices of ``x`` per source axis."""
    offset = dict(zip(src.cell_axes, cell, strict=True))
    starts, limits, strides = [], [], []
    for a, sh in zip(src.axes, shift, strict=True):
        g = geom[a]
        s0 = g.start + offset.get(a, 0) + sh
        starts.append(s0)
        limits.append(s0 + max(g.step * (g.count - 1) + 1, 0))
        strides.append(g.step)
    if any(s != 0 or lim != n or st != 1
           for s, lim, st, n in zip(starts, limits, strides, x.shape, strict=True)):
        x = lax.slice(x, starts, limits, strides)
    rank = len(geom)
    if len(src.axes) < rank:
        x = lax.reshape(x, tuple(geom[a].count if a in src.axes else 1 for a in range(rank)))
    return x


def evaluate(
    kernel_call: KernelCall,
    sources: Sequence[Source],
    geom: Sequence[AxisGeom],
    dyn: Any,
    closed: Any = None,
    guard: Any = None,
    split: bool = True,
) -> Any:
    """Run ``kernel_call(cells, dyn)`` at every output position of the slab.

    Returns the kernel's output pytree; each leaf has shape
    ``field_shape + per_cell_shape``.  The output box is split into an
    interior, whose windows lie inside the arrays and read them directly,
    and a thin boundary shell that reads padded copies.

    ``guard`` (a boolean array of ``field_shape``, or None) marks the outputs
    the caller keeps.  Elsewhere non-finite window cells are read as zero:
    the values there are discarded, and their gradients (zero cotangents
    times NaN) would otherwise poison the kept ones (the double-``where``
    pattern).
    """
    if closed is None:
        closed = trace(kernel_call, sources, geom, dyn)
    jaxpr, out_tree = closed
    field_shape = tuple(g.count for g in geom)
    if 0 in field_shape:
        return jax.tree_util.tree_unflatten(out_tree, [
            jnp.zeros(field_shape + tuple(v.aval.shape), v.aval.dtype)
            for v in jaxpr.jaxpr.outvars])
    # a dense linear sum (constant or runtime weights): one correlation (separable,
    # slices or FFT)
    # (not under a NaN guard: the guarded slices below keep non-finite values
    # of unselected cells out of derivatives)
    dense = None if guard is not None else dense_windows.lower(jaxpr, sources, geom, dyn)
    if dense is None and guard is None and split:
        # large window sums under a non-linear function: the sums densely, the
        # rest point by point
        dense = dense_split.lower(jaxpr, sources, geom, dyn,
                                  lambda k: _general(k, sources, geom, dyn))
    if dense is not None:
        return jax.tree_util.tree_unflatten(out_tree, dense)

    def run(sub: list[AxisGeom], raw: bool) -> list[Any]:
        if raw:
            arrays = [s.array for s in sources]
            shifts = [s.shifts() for s in sources]
        else:
            arrays, shifts = zip(*(s.block(sub) for s in sources), strict=True)
        g = None
        if guard is not None:
            offs = [(q.start - p.start) // p.step for q, p in zip(sub, geom, strict=True)]
            g = lax.slice(guard, offs, [o + q.count for o, q in zip(offs, sub, strict=True)])
        try:
            return _lifted(jaxpr, sources, arrays, shifts, sub, dyn, g)
        except Unliftable:
            return _vmapped(kernel_call, sources, arrays, shifts, sub, dyn, g)

    def split(axis: int, sub: list[AxisGeom]) -> list[Any]:
        if axis == len(sub):
            return run(sub, raw=True)
        g = sub[axis]
        j_lo, j_hi = interior_ranges(sources, axis, g)
        if j_lo >= j_hi:
            return run(sub, raw=False)
        parts = []
        for a, b in ((0, j_lo), (j_lo, j_hi), (j_hi, g.count)):
            if b <= a:
                continue
            part = list(sub)
            part[axis] = AxisGeom(g.start + a * g.step, g.step, b - a, g.size)
            leaves = split(axis + 1, part) if (a, b) == (j_lo, j_hi) else run(part, raw=False)
            parts.append((a, leaves))
        return _place(parts, axis, g.count)

    leaves = run(list(geom), raw=False) if pads_fuse() else split(0, list(geom))
    return jax.tree_util.tree_unflatten(out_tree, leaves)


def _general(closed: Any, sources: Sequence[Source], geom: Sequence[AxisGeom],
             dyn: Any) -> list[Any]:
    """The output leaves of the kernel ``closed`` (a closed jaxpr of the
    cells and ``dyn``'s leaves) by the general lowering."""
    def call(cells: Sequence[Any], d: Any) -> list[Any]:
        return jax.core.eval_jaxpr(closed.jaxpr, closed.consts, *cells,
                                   *jax.tree_util.tree_leaves(d))

    tree = jax.tree_util.tree_structure([0] * len(closed.jaxpr.outvars))
    return jax.tree_util.tree_leaves(evaluate(call, sources, geom, dyn, closed=(closed, tree),
                                              split=False))


def _place(parts: list[tuple[int, list[Any]]], axis: int, count: int) -> list[Any]:
    """Write the pieces of each output leaf into one buffer along ``axis``
    (in-place dynamic-update-slices, which XLA fuses with the producers)."""
    if len(parts) == 1:
        return parts[0][1]
    out = []
    for k in range(len(parts[0][1])):
        first = parts[0][1][k]
        shape = list(first.shape)
        shape[axis] = count
        buf = jnp.zeros(shape, first.dtype)
        # the largest piece (the interior) goes first so later writes are small
        for a, leaves in sorted(parts, key=lambda p: -p[1][k].shape[axis]):
            start = [0] * len(shape)
            start[axis] = a
            buf = lax.dynamic_update_slice(buf, leaves[k], start)
        out.append(buf)
    return out


def interior_ranges(sources: Sequence[Source], axis: int, g: AxisGeom) -> tuple[int, int]:
    """Outputs ``[j_lo, j_hi)`` along ``axis`` whose windows need no halo."""
    j_lo, j_hi = 0, g.count
    for s in sources:
        if axis not in s.axes or not s.pads:
            continue
        k = s.axes.index(axis)
        lo, _ = s.pads[k]
        n = s.array.shape[k]
        size = g.size if axis in s.cell_axes else 1
        # first window cell at unpadded index g.start + j*step - lo must be >= 0,
        # and the last, + size - 1, must be <= n - 1.
        first = max(0, -(-(lo - g.start) // g.step))
        last = (n - size + lo - g.start) // g.step + 1
        j_lo, j_hi = max(j_lo, first), min(j_hi, last)
    # a window wider than the field leaves no interior, and j_lo may pass
    # the count: the loops' shell runs [0, j_lo) and must stop at the count
    j_lo = min(j_lo, g.count)
    return j_lo, max(j_lo, j_hi)


def trace(kernel_call: KernelCall, sources: Sequence[Source], geom: Sequence[AxisGeom],
          dyn: Any) -> tuple[Any, Any]:
    """Trace the kernel on per-cell windows: ``(closed_jaxpr, out_tree)``."""
    closed, shapes = jax.make_jaxpr(kernel_call, return_shape=True)(cell_avals(sources, geom), dyn)
    return closed, jax.tree_util.tree_structure(shapes)


def _guarded(x: Any, guard: Any) -> Any:
    """``x`` with non-finite values read as zero where ``guard`` is False."""
    if guard is None or not jnp.issubdtype(x.dtype, jnp.inexact):
        return x
    return jnp.where(guard | jnp.isfinite(x), x, jnp.zeros((), x.dtype))


def _lifted(closed: Any, sources: Sequence[Source], arrays: Sequence[Any],
            shifts: Sequence[Sequence[int]], geom: Sequence[AxisGeom], dyn: Any,
            guard: Any = None) -> list[Any]:
    field_shape = tuple(g.count for g in geom)
    table = Table(ArrayAlgebra())
    cells = []
    used = [0]

    def cell(x: Any, src: Source, sh: Sequence[int], idx: tuple[int, ...]) -> Any:
        used[0] += 1
        if used[0] > MAX_LIFTED_CELLS:
            # each read cell is one shifted slice in the XLA program, and its
            # compile time grows with their number: gather the windows instead
            raise Unliftable(f"the kernel reads more than {MAX_LIFTED_CELLS} window cells")
        return _guarded(_slice(x, src, idx, geom, sh), guard)

    for src, x, sh, aval in zip(sources, arrays, shifts, cell_avals(sources, geom), strict=True):
        cells.append(cell_grid(table, aval.shape,
                               lambda idx, x=x, src=src, sh=sh: cell(x, src, sh, idx),
                               aval.dtype))
    args = cells + jax.tree_util.tree_leaves(dyn)
    outs = interpret(closed.jaxpr, closed.consts, args, table)
    return [_assemble(o, v.aval, field_shape, table)
            for o, v in zip(outs, closed.jaxpr.outvars, strict=True)]


def _assemble(val: Any, aval: Any, field_shape: tuple[int, ...], table: Table) -> Any:
    shape = field_shape + tuple(aval.shape)
    if isinstance(val, Lifted):
        elems = [_to_field(table.get(int(i)), field_shape, aval.dtype) for i in val.ids.flat]
        if val.ids.ndim == 0:
            return elems[0]
        return jnp.stack(elems, axis=-1).reshape(shape)
    val = jnp.asarray(val, dtype=aval.dtype)
    return lax.broadcast_in_dim(val, shape, tuple(range(len(field_shape), len(shape))))


def _to_field(e: Any, field_shape: tuple[int, ...], dtype: Any) -> Any:
    e = jnp.asarray(e)
    if e.dtype != dtype:
        e = lax.convert_element_type(e, dtype)
    if e.shape != field_shape:
        e = lax.broadcast_in_dim(e, field_shape, tuple(range(len(field_shape) - e.ndim,
                                                             len(field_shape))))
    return e


def _vmapped(kernel_call: KernelCall, sources: Sequence[Source], arrays: Sequence[Any],
             shifts: Sequence[Sequence[int]], geom: Sequence[AxisGeom], dyn: Any,
             guard: Any = None) -> list[Any]:
    """The fallback: a stack of every window, and the kernel vmapped over it."""
    field_shape = tuple(g.count for g in geom)
    stacks = []
    for src, x, sh, aval in zip(sources, arrays, shifts, cell_avals(sources, geom), strict=True):
        if math.prod(aval.shape) > MAX_LIFTED_CELLS:
            st = _gathered(x, src, sh, geom, aval.shape)
            if guard is not None:
                g = jnp.broadcast_to(guard, field_shape).reshape((-1,) + (1,) * len(aval.shape))
                st = _guarded(st, g)
            stacks.append(st)
            continue
        cells = [jnp.broadcast_to(_guarded(_slice(x, src, idx, geom, sh), guard), field_shape)
                 for idx in itertools.product(*(range(s) for s in aval.shape))]
        st = jnp.stack(cells, axis=-1) if cells else jnp.zeros(field_shape + (0,), aval.dtype)
        stacks.append(st.reshape((-1,) + aval.shape))
    out = jax.vmap(lambda *cs: kernel_call(list(cs), dyn))(*stacks)
    return [leaf.reshape(field_shape + leaf.shape[1:]) for leaf in jax.tree_util.tree_leaves(out)]


def _gathered(x: Any, src: Source, shift: Sequence[int], geom: Sequence[AxisGeom],
              cell_shape: tuple[int, ...]) -> Any:
    """Every window of ``src`` as one gather, shaped ``(outputs,) + cell_shape``:
    one XLA op whatever the window size (``_slice`` per cell compiles in time
    linear in the cells)."""
    rank, ncell = len(geom), len(src.cell_axes)
    index = []
    for a, sh in zip(src.axes, shift, strict=True):
        g = geom[a]
        shape = [1] * (rank + ncell)
        shape[a] = g.count
        pos = (g.start + sh + g.step * np.arange(g.count)).reshape(shape)
        if a in src.cell_axes:
            k = src.cell_axes.index(a)
            cshape = [1] * (rank + ncell)
            cshape[rank + k] = g.size
            pos = pos + np.arange(g.size).reshape(cshape)
        index.append(pos.astype(np.int32))
    field_shape = tuple(g.count for g in geom)
    size = math.prod(field_shape) * math.prod(cell_shape) * np.dtype(x.dtype).itemsize
    if size > MAX_GATHER_BYTES:
        window = "x".join(map(str, cell_shape))
        raise XStencilError(
            f"a {window} window ({math.prod(cell_shape)} cells) over {field_shape} outputs "
            f"needs every window at once ({size / 2**30:.1f} GiB, over the "
            f"{MAX_GATHER_BYTES / 2**30:.0f} GiB limit), and as shifted slices it would not "
            f"compile in reasonable time; a kernel linear in its window (a weighted sum such "
            f"as (u * w).sum(), the weights closed over or passed as arguments) is lowered "
            f"as an FFT whatever its size, but this one is not (a product of window values, "
            f"a non-linear function, or a weight computed from the window); write the "
            f"linear part as its own map, or use scipy.ndimage.correlate or "
            f"scipy.signal.fftconvolve, a smaller window, a stride, or separable passes "
            f"(one dim at a time)")
    stack = jnp.broadcast_to(x[tuple(index)], field_shape + tuple(cell_shape))
    return stack.reshape((-1,) + tuple(cell_shape))


def dependencies(closed: Any, n_sources: int,
                 shapes: Sequence[tuple[int, ...]]) -> list[set[tuple[int, ...]]]:
    """Which window cells each source's kernel output depends on."""
    table = Table(DepsAlgebra())
    cells = []
    index: dict[int, tuple[int, tuple[int, ...]]] = {}
    for k, shape in enumerate(shapes):
        grid = np.empty(shape, dtype=np.int64)
        for idx in itertools.product(*(range(s) for s in shape)):
            key = len(index)
            index[key] = (k, idx)
            grid[idx] = table.add(frozenset({key}))
        cells.append(Lifted(grid, None))
    args = cells + [Abstract(v.aval) for v in closed.jaxpr.invars[n_sources:]]
    result: list[set[tuple[int, ...]]] = [set() for _ in shapes]
    try:
        outs = interpret(closed.jaxpr, closed.consts, args, table)
    except Unliftable:
        for k, shape in enumerate(shapes):
            result[k] = set(itertools.product(*(range(s) for s in shape)))
        return result
    for o in outs:
        if isinstance(o, Lifted):
            for i in o.ids.flat:
                for key in table.get(int(i)):
                    k, idx = index[key]
                    result[k].add(idx)
    return result

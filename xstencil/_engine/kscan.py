"""kernex-semantics scans: windows visited in row-major order, every result
written into the working array before the next window is read.

The kernel is traced once to find which window cells it reads.  A read at
offset ``o`` (relative to the centre) sees an earlier result only when every
component of ``o`` is a multiple of the stride along its axis and ``o`` comes
before zero in row-major order.  Only the axes that carry such a dependency
must be walked in order; all the others are computed in parallel, as one
slab per step.  A time-causal kernel on ``(time, x)`` therefore runs as one
``fori_loop`` over rows of whole-row array expressions, and only a genuine
recurrence along ``x`` nests a walk along ``x``.

A walk along axis 0 alone reads the window row by row and, whenever every
write lands inside the input, carries the input itself rather than a padded
copy (the halo rows come from small blocks built before the loop), as a
hand-written ``lax.scan`` over rows would.

The slab evaluation under a mesh (:func:`~xstencil._engine.tscan.slab_mesh`)
and the dependency analysis (:func:`~xstencil._engine.tscan.read_cells`) are
shared with the labelled time scan in :mod:`xstencil._engine.tscan`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import jax.numpy as jnp
from jax import lax

from xstencil._engine.boundary import block, pad
from xstencil._engine.lower import AxisGeom, KernelCall, Source
from xstencil._engine.mesh import Mask, Slab, mesh_evaluate
from xstencil._engine.tscan import read_cells, slab_mesh

__all__ = ["sequential_axes", "read_offsets", "kscan_array"]


def _first_nonzero(o: Sequence[int]) -> int | None:
    for d, v in enumerate(o):
        if v:
            return d
    return None


def _lex_negative(o: Sequence[int]) -> bool:
    d = _first_nonzero(o)
    return d is not None and o[d] < 0


def sequential_axes(offsets: Iterable[Sequence[int]], strides: Sequence[int]) -> tuple[int, ...]:
    """The axes that must be walked in order for row-major kscan semantics.

    Walking the chosen axes in order (the others in parallel) must show each
    read exactly what the row-major walk shows: earlier results for
    dependencies, input values for everything else.
    """
    hits = [tuple(o) for o in offsets
            if any(o) and all(v % s == 0 for v, s in zip(o, strides, strict=True))]
    seq = {_first_nonzero(o) for o in hits if _lex_negative(o)}
    changed = True
    while changed:
        changed = False
        for o in hits:
            a = _first_nonzero(o)
            if _lex_negative(o) or a in seq:
                continue
            # a later cell: it must not be computed earlier in our order
            if _lex_negative([o[d] for d in sorted(seq)]):
                seq.add(a)
                changed = True
    return tuple(sorted(d for d in seq if d is not None))


def read_offsets(calls: Sequence[KernelCall], source: Source, geom: Sequence[AxisGeom],
                 dyn: Any, centre: Sequence[int]) -> set[tuple[int, ...]]:
    """Offsets (relative to the centre) that any of the kernels reads."""
    (cells,), _ = read_cells(calls, [source], geom, dyn)
    return {tuple(i - c for i, c in zip(idx, centre, strict=True)) for idx in cells}


def kscan_array(
    branches: Sequence[tuple[Slab | Mask, KernelCall]],
    base: KernelCall,
    x: Any,
    pads: Sequence[tuple[int, int]],
    modes: Sequence[str],
    fill_value: Any,
    geom: Sequence[AxisGeom],
    dyn: Any,
    centre: Sequence[int],
) -> Any:
    """Scan over ``x`` padded by ``pads`` (filled by ``modes``); returns the
    outputs.

    ``branches`` are the mesh regions (over output positions) and their
    kernels; ``base`` computes positions no region covers.  Geometry indices
    are in padded coordinates.  The halo holds the input's padding for the
    whole scan: writes land only on window centres.
    """
    rank = x.ndim
    axes = tuple(range(rank))
    virtual = Source(x, axes, axes, tuple(pads), tuple(modes), fill_value)
    strides = [g.step for g in geom]
    offsets = read_offsets([c for _, c in branches] + [base], virtual, geom, dyn, centre)
    seq = sequential_axes(offsets, strides)
    if not seq:  # nothing reads a result: one parallel map over the padded input
        return mesh_evaluate(branches, base, [virtual], geom, dyn)
    par = [a for a in axes if a not in seq]
    counts = [geom[a].count for a in seq]
    if 0 in counts or any(geom[a].count == 0 for a in par):
        return _outputs(pad(x, pads, modes, fill_value), geom, centre)

    segments = _segments(branches, seq, counts)
    if tuple(seq) == (0,) and segments is not None:
        rows = {centre[0] + o[0] for o in offsets}
        if _core_rows(x, pads, modes, geom, centre):
            return _walk_rows(segments, base, x, pads, modes, fill_value, geom, dyn, centre, rows)
        work = pad(x, pads, modes, fill_value)
        return _walk_rows(segments, base, work, [(0, 0)] * rank, modes, fill_value, geom, dyn,
                          centre, rows)
    work = pad(x, pads, modes, fill_value)
    if segments is None:  # regions that change along walked axes in other ways
        segments = [(0, math.prod(counts), None)]
    for lo, hi, active in segments:
        if active is not None and not active:
            continue  # no kernel applies here: every position keeps its value
        body = _step(branches if active is None else active, base, geom, dyn, centre, seq,
                     counts, par, lo, dynamic=active is None)
        work = lax.fori_loop(0, hi - lo, body, work)
    return _outputs(work, geom, centre)


def _core_rows(x: Any, pads: Sequence[tuple[int, int]], modes: Sequence[str],
               geom: Sequence[AxisGeom], centre: Sequence[int]) -> bool:
    """Whether a walk along axis 0 can carry ``x`` itself, unpadded.

    Every write must land inside ``x``, and the halo of a row along the
    other axes must not depend on the row's values (a periodic halo of a
    row holds the row's *input* values while the scan overwrites them).
    """
    for a, (g, c, (lo, hi), n) in enumerate(zip(geom, centre, pads, x.shape, strict=True)):
        first = g.start + c
        if first < lo or first + g.step * (g.count - 1) >= lo + n:
            return False
        if a and (lo or hi) and modes[a] not in ("fill", "valid"):
            return False
    return True


def _walk_rows(segments: list[tuple[int, int, Any]], base: KernelCall, x: Any,
               pads: Sequence[tuple[int, int]], modes: Sequence[str], fill_value: Any,
               geom: Sequence[AxisGeom], dyn: Any, centre: Sequence[int],
               read: set[int]) -> Any:
    """Walk axis 0 carrying ``x``, padded by ``pads`` along axis 0 and
    virtually along the others; ``read`` are the window rows the kernels
    read.  Where :func:`_core_rows` holds, ``x`` is the unpadded input; the
    fallback passes the padded array with zero ``pads``.

    Each step reads the window's rows one by one: rows inside the array
    from the carry (their halo along the other axes is virtual), rows in
    the halo along axis 0 from two small blocks built once before the loop.
    Hand-written scans carry no halo either; a padded carry costs two extra
    passes over the array (pad, then slice the outputs back out).
    """
    g0, lo0, n0 = geom[0], pads[0][0], x.shape[0]
    rest = tuple(range(1, x.ndim))
    full = [(0, lo + n + hi) for (lo, hi), n in zip(pads[1:], x.shape[1:], strict=True)]
    top = block(x, [(0, lo0)] + full, pads, modes, fill_value) if lo0 > 0 else None
    bottom = (block(x, [(lo0 + n0, lo0 + n0 + pads[0][1])] + full, pads, modes, fill_value)
              if pads[0][1] > 0 else None)
    # split the walk where a window row crosses into or out of the array
    cuts = set()
    for r in read:
        for edge in (lo0, lo0 + n0):
            cuts.add(max(-(-(edge - r) // g0.step), 0))
    sub = [AxisGeom(0, 1, 1, g0.size)] + list(geom[1:])
    halo = (tuple(pads[1:]), tuple(modes[1:]), fill_value) if any(map(any, pads[1:])) else ()
    wstart = [c - lo for c, (lo, _) in zip(centre[1:], pads[1:], strict=True)]
    par_steps = [g.step for g in geom[1:]]
    out = x
    for lo, hi, active in segments:
        if not active:
            continue
        bounds = sorted({lo, hi} | {c for c in cuts if lo < c < hi})
        for a, b in zip(bounds, bounds[1:], strict=False):
            # an unread row is taken from the carry (clamped): the kernel never uses it
            where = ["core" if r not in read or lo0 <= a * g0.step + r < lo0 + n0 else
                     "top" if a * g0.step + r < lo0 else "bottom" for r in range(g0.size)]
            calls = [(reg, _stack_rows(c)) for reg, c in active]

            def body(j: Any, w: Any, a: int = a, where: list[str] = where,
                     calls: Any = calls) -> Any:
                # step a + j: indices are j * step plus a static offset, which
                # XLA compiles to faster loops than (a + j) * step + r - lo
                rows = []
                for r, kind in enumerate(where):
                    if kind == "core":
                        k = _affine(j, g0.step, a * g0.step + r - lo0)
                        rows.append(Source(lax.dynamic_index_in_dim(w, k, 0, False), rest,
                                           rest, *halo))
                    else:
                        blk, k0 = (top, 0) if kind == "top" else (bottom, lo0 + n0)
                        k = _affine(j, g0.step, a * g0.step + r - k0)
                        rows.append(Source(lax.dynamic_index_in_dim(blk, k, 0, False),
                                           rest, rest))
                val = mesh_evaluate(calls, _stack_rows(base), rows, sub, dyn).astype(w.dtype)
                row = _affine(j, g0.step, a * g0.step + centre[0] - lo0)
                if all(s == 1 for s in par_steps):
                    return lax.dynamic_update_slice(w, val, [row, *wstart])
                idx = (row,) + tuple(slice(s, s + st * (g.count - 1) + 1, st)
                                     for s, st, g in zip(wstart, par_steps, geom[1:], strict=True))
                return w.at[idx].set(jnp.squeeze(val, axis=0))

            out = body(0, out) if b - a == 1 else lax.fori_loop(0, b - a, body, out)
    if _outputs_are_input(x, pads, geom, centre):
        return out
    starts = [c - lo for c, (lo, _) in zip(centre, pads, strict=True)]
    limits = [s + max(g.step * (g.count - 1) + 1, 0) for s, g in zip(starts, geom, strict=True)]
    return lax.slice(out, starts, limits, [g.step for g in geom])


def _affine(j: Any, step: int, offset: int) -> Any:
    """``j * step + offset`` without the operations that are no-ops."""
    v = j if step == 1 else j * step
    return v if offset == 0 else v + offset


def _outputs_are_input(x: Any, pads: Sequence[tuple[int, int]], geom: Sequence[AxisGeom],
                       centre: Sequence[int]) -> bool:
    """Whether the outputs sit exactly on the cells of ``x``."""
    return all(g.start + c == lo and g.step == 1 and g.count == n
               for g, c, (lo, _), n in zip(geom, centre, pads, x.shape, strict=True))


def _segments(branches: Sequence[tuple[Slab | Mask, KernelCall]], seq: Sequence[int],
              counts: Sequence[int]) -> list[tuple[int, int, Any]] | None:
    """Split a walk along one axis into runs where the same regions apply.

    Within a run, region membership along the walked axis is static, so the
    step needs no per-step selects.  Returns ``None`` when that does not hold
    (several walked axes, strided regions along the walked axis, masks).
    """
    if len(seq) != 1 or any(isinstance(r, Mask) for r, _ in branches):
        return None
    (a,) = seq
    if any(r.ranges[a][2] != 1 for r, _ in branches if isinstance(r, Slab)):
        return None
    n = counts[0]
    cuts = {0, n}
    for r, _ in branches:
        lo, hi, _ = r.ranges[a]  # type: ignore[union-attr]
        cuts |= {min(max(lo, 0), n), min(max(hi, 0), n)}
    cuts_sorted = sorted(cuts)
    out = []
    for lo, hi in zip(cuts_sorted, cuts_sorted[1:], strict=False):
        active = []
        for r, call in branches:
            rlo, rhi, _ = r.ranges[a]  # type: ignore[union-attr]
            if rlo <= lo and hi <= rhi:
                ranges = list(r.ranges)  # type: ignore[union-attr]
                ranges[a] = (0, 1, 1)
                active.append((Slab(tuple(ranges)), call))
        out.append((lo, hi, active))
    return out


def _step(branches: Sequence[tuple[Slab | Mask, KernelCall]], base: KernelCall,
          geom: Sequence[AxisGeom], dyn: Any, centre: Sequence[int], seq: Sequence[int],
          counts: Sequence[int], par: Sequence[int], first: int, *, dynamic: bool) -> Any:
    """The loop body for step ``first + j``: compute one slab of outputs and
    write it back.  ``first`` is nonzero only when walking one axis."""
    axes = tuple(range(len(geom)))

    def body(j: Any, w: Any) -> Any:
        pos, at = {}, {}
        rem = j
        for k, (a, n) in enumerate(zip(reversed(seq), reversed(counts), strict=True)):
            last = k == len(seq) - 1
            pos[a] = rem if last else rem % n
            rem = rem // n
        for a in seq:  # padded index of the slab's first cell (see _affine)
            at[a] = _affine(pos[a], geom[a].step, first * geom[a].step)
            pos[a] = _affine(pos[a], 1, first)
        sub = [AxisGeom(0, 1, 1, g.size) if a in pos else g for a, g in enumerate(geom)]
        starts = [at.get(a, 0) for a in axes]
        sizes = [geom[a].size if a in pos else w.shape[a] for a in axes]
        src = Source(lax.dynamic_slice(w, starts, sizes), axes, axes)
        if dynamic:
            val = slab_mesh(branches, base, [src], sub, dyn, pos,
                            {a: (0, n) for a, n in zip(seq, counts, strict=True)})
        else:
            val = mesh_evaluate(branches, base, [src], sub, dyn)
        val = val.astype(w.dtype)
        if all(geom[a].step == 1 for a in par):
            wstart = [at[a] + centre[a] if a in at else geom[a].start + centre[a] for a in axes]
            return lax.dynamic_update_slice(w, val, wstart)
        idx = tuple(
            at[a] + centre[a] if a in at
            else slice(geom[a].start + centre[a],
                       geom[a].start + centre[a] + geom[a].step * (geom[a].count - 1) + 1,
                       geom[a].step)
            for a in axes)
        return w.at[idx].set(jnp.squeeze(val, axis=tuple(seq)))

    return body


def _stack_rows(call: KernelCall) -> KernelCall:
    """``call`` on per-row cells: the window is rebuilt by stacking the rows
    (structural operations, which the lifter turns into nothing)."""
    def run(cells: Sequence[Any], d: Any) -> Any:
        return call([lax.concatenate([lax.expand_dims(c, (0,)) for c in cells], 0)], d)

    return run


def _outputs(work: Any, geom: Sequence[AxisGeom], centre: Sequence[int]) -> Any:
    starts = [g.start + c for g, c in zip(geom, centre, strict=True)]
    limits = [s + max(g.step * (g.count - 1) + 1, 0) for s, g in zip(starts, geom, strict=True)]
    return lax.slice(work, starts, limits, [g.step for g in geom])

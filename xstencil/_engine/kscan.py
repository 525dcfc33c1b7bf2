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
    work: Any,
    geom: Sequence[AxisGeom],
    dyn: Any,
    centre: Sequence[int],
) -> Any:
    """Scan over the padded working array ``work``; returns the outputs.

    ``branches`` are the mesh regions (over output positions) and their
    kernels; ``base`` computes positions no region covers.
    """
    rank = work.ndim
    axes = tuple(range(rank))
    src = Source(work, axes, axes)
    strides = [g.step for g in geom]
    offsets = read_offsets([c for _, c in branches] + [base], src, geom, dyn, centre)
    seq = sequential_axes(offsets, strides)
    if not seq:
        return mesh_evaluate(branches, base, [src], geom, dyn)
    par = [a for a in axes if a not in seq]
    counts = [geom[a].count for a in seq]
    if 0 in counts or any(geom[a].count == 0 for a in par):
        return _outputs(work, geom, centre)

    segments = _segments(branches, seq, counts)
    if segments is None:  # regions that change along walked axes in other ways
        segments = [(0, math.prod(counts), None)]
    for lo, hi, active in segments:
        if active is not None and not active:
            continue  # no kernel applies here: every position keeps its value
        body = _step(branches if active is None else active, base, geom, dyn, centre, seq,
                     counts, par, dynamic=active is None)
        work = lax.fori_loop(lo, hi, body, work)
    return _outputs(work, geom, centre)


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
          counts: Sequence[int], par: Sequence[int], *, dynamic: bool) -> Any:
    """The loop body: compute one slab of outputs and write it back."""
    axes = tuple(range(len(geom)))

    def body(i: Any, w: Any) -> Any:
        pos = {}
        rem = i
        for k, (a, n) in enumerate(zip(reversed(seq), reversed(counts), strict=True)):
            last = k == len(seq) - 1
            pos[a] = rem if last else rem % n
            rem = rem // n
        sub = [AxisGeom(0, 1, 1, g.size) if a in pos else g for a, g in enumerate(geom)]
        if tuple(seq) == (0,) and not dynamic:
            # one source per window row: only the rows the kernel reads are sliced
            # out of the carry, each fused into the step's arithmetic
            rest = axes[1:]
            rows = [Source(lax.dynamic_index_in_dim(w, pos[0] * geom[0].step + r, 0, False),
                           rest, rest) for r in range(geom[0].size)]
            val = mesh_evaluate([(reg, _stack_rows(c)) for reg, c in branches],
                                _stack_rows(base), rows, sub, dyn)
        else:
            starts = [pos[a] * geom[a].step if a in pos else 0 for a in axes]
            sizes = [geom[a].size if a in pos else w.shape[a] for a in axes]
            src = Source(lax.dynamic_slice(w, starts, sizes), axes, axes)
            if dynamic:
                val = slab_mesh(branches, base, [src], sub, dyn, pos,
                                {a: (0, n) for a, n in zip(seq, counts, strict=True)})
            else:
                val = mesh_evaluate(branches, base, [src], sub, dyn)
        val = val.astype(w.dtype)
        if all(geom[a].step == 1 for a in par):
            wstart = [pos[a] * geom[a].step + centre[a] if a in pos
                      else geom[a].start + centre[a] for a in axes]
            return lax.dynamic_update_slice(w, val, wstart)
        idx = tuple(
            pos[a] * geom[a].step + centre[a] if a in pos
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

"""Function meshes in block scans (dask chunks, sharded devices).

A block is a piece of the domain extended by a deep halo, and the same
compiled step serves every block, so a cell's global position is known only
at run time: ``origin`` is the global index of the block's first cell along
each spatial axis, ``t`` the position along the scanned dim being computed.
Region membership is computed from them with ``iota`` comparisons, and each
region's kernel runs over the whole block, selected with ``where``.  The
halo cells need the right kernels too: after K steps their values have
reached the block's own cells.

Mask regions travel as arrays aligned with the block, halo included (dask
overlaps them like the data; the sharded scan exchanges them), with one slab
per step when the mask varies along the scanned dim.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

from xstencil._engine.lower import AxisGeom, Source, evaluate
from xstencil._engine.mesh import Slab

__all__ = ["BlockMesh", "block_mesh", "local_regions", "mesh_step"]


@dataclass(frozen=True)
class BlockMesh:
    """A mesh over global positions ``(dim, *space)``: ``regions[j]`` is a
    :class:`Slab` or the index of a mask; later regions win, and cells no
    region covers keep their input (the centre of the window)."""

    regions: tuple[Slab | int, ...]
    timed: tuple[bool, ...]  # per mask: one slab per position along dim
    sizes: tuple[int, ...]  # global (total, *space)
    periodic: tuple[bool, ...]  # per spatial axis
    k: int  # the first computed position along dim


def block_mesh(regions: Sequence[Slab | int], masks: Sequence[Any], plan: Any,
               total: int) -> tuple[BlockMesh, list[np.ndarray]]:
    """A function mesh's ``regions`` over the block scan's plan (dims ``(dim,
    *space)``; from ``Mesh.regions(plan, dim)`` in the labelled layer) and
    its masks, shaped ``(total or 1, *space)``."""
    out = list(regions)
    masks = [np.ascontiguousarray(m, dtype=bool) for m in masks]
    periodic = tuple(s.mode == "periodic" for s in plan.specs[1:])
    bm = BlockMesh(tuple(out), tuple(m.shape[0] > 1 for m in masks),
                   (total,) + tuple(plan.shape[1:]), periodic, plan.specs[0].lo)
    return bm, masks


def _covers(bm: BlockMesh, region: Slab) -> bool:
    """Whether ``region`` holds every computed cell (no ``where`` needed)."""
    (lo, hi, st), *space = region.ranges
    if not (lo <= bm.k and hi >= bm.sizes[0] and st == 1):
        return False
    return all(r == (0, n, 1) for r, n in zip(space, bm.sizes[1:], strict=True))


def _inside(p: Any, r: tuple[int, int, int]) -> Any:
    lo, hi, st = r
    c = (p >= lo) & (p < hi)
    return c if st == 1 else c & ((p - lo) % st == 0)


def _member(bm: BlockMesh, region: Slab, t: Any, origin: Sequence[Any],
            block: Sequence[int]) -> Any:
    """Where ``region`` holds at position ``t``, over the block's cells."""
    (tr, *space) = region.ranges
    cond = _inside(t, tr) if tr != (0, bm.sizes[0], 1) else None
    for a, (r, n, nb) in enumerate(zip(space, bm.sizes[1:], block, strict=True)):
        if r == (0, n, 1):
            continue
        p = origin[a] + lax.iota(np.int32, nb)
        if bm.periodic[a]:
            p = p % n
        shape = [1] * len(block)
        shape[a] = nb
        c = _inside(p, r).reshape(shape)
        cond = c if cond is None else cond & c
    return jnp.ones((), bool) if cond is None else cond


def mesh_step(bm: BlockMesh, calls: Sequence[Callable[..., Any]], base: Callable[..., Any],
              sources: Sequence[Source], geom: Sequence[AxisGeom], dyn: Any, t: Any,
              origin: Sequence[Any], masks: Sequence[Any], dtype: Any) -> Any:
    """One step of the block under the mesh: ``calls[j]`` on ``regions[j]``,
    ``base`` elsewhere; ``masks`` are this step's mask slabs.  The calls
    return a tuple (one field per advanced variable), and so does this."""
    block = [g.count for g in geom]
    start = 0
    for j, r in enumerate(bm.regions):
        if isinstance(r, Slab) and _covers(bm, r):
            start = j + 1
    first = calls[start - 1] if start else base
    out = [x.astype(dtype) for x in evaluate(first, sources, geom, dyn)]
    for r, c in zip(bm.regions[start:], calls[start:], strict=True):
        if isinstance(r, Slab) and any(lo >= hi for lo, hi, _ in r.ranges):
            continue  # an empty region
        cond = masks[r] if isinstance(r, int) else _member(bm, r, t, origin, block)
        vals = evaluate(c, sources, geom, dyn)
        out = [jnp.where(cond, v.astype(dtype), o) for v, o in zip(vals, out, strict=True)]
    return tuple(out)


def local_regions(bm: BlockMesh, origin: Sequence[int], block: Sequence[int],
                  masks: Sequence[np.ndarray]) -> list[tuple[str, Any] | None] | None:
    """The regions of ``bm`` over one block's own spatial cells, halo
    included, for a block scan that runs an in-memory mesh on the block
    (``origin``: the global index of its first cell per spatial axis,
    ``block`` its shape; ``masks``: each mask region's cells over the block,
    from its pieces).  Per region ``("box", ((start, stop), ...))`` where it
    is a box of the block's cells, ``("mask", cells)`` otherwise (a strided
    slab, or one wrapped around a periodic axis), ``None`` where it holds no
    computed position.  ``None`` where some region holds only part of the
    computed positions along the scanned dim, or a mask varies along it:
    such a mesh is not the same function of the state at every step."""
    k, total = bm.k, bm.sizes[0]
    out: list[tuple[str, Any] | None] = []
    for r in bm.regions:
        if not isinstance(r, Slab):
            if bm.timed[r]:
                return None
            out.append(("mask", np.asarray(masks[r], dtype=bool)))
            continue
        (tr, *space) = r.ranges
        lo, hi, st = tr
        first = lo if lo >= k else lo + -(-(k - lo) // st) * st  # the first hit from k on
        hits = len(range(first, min(hi, total), st))  # computed positions it holds
        if not hits:
            out.append(None)
            continue
        if hits != total - k:
            return None
        members = []
        for a, (rg, n, nb) in enumerate(zip(space, bm.sizes[1:], block, strict=True)):
            p = int(origin[a]) + np.arange(nb)
            if bm.periodic[a]:
                p %= n
            members.append(np.asarray(_inside(p, rg)))
        boxes = []
        for m in members:
            idx = np.flatnonzero(m)
            if idx.size and idx[-1] - idx[0] + 1 == idx.size:
                boxes.append((int(idx[0]), int(idx[-1]) + 1))
            elif not idx.size:
                boxes.append((0, 0))
            else:
                boxes = None
                break
        if boxes is not None:
            out.append(None if any(a == b for a, b in boxes) else ("box", tuple(boxes)))
            continue
        cells = members[0]
        for m in members[1:]:
            cells = np.multiply.outer(cells, m)
        out.append(("mask", np.asarray(cells, dtype=bool)))
    return out

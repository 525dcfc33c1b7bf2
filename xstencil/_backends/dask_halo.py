"""dask halos without ``map_overlap``: each block task reads its neighbours' edges.

:func:`halo_array` builds a lean graph for a blockwise stencil.  Per source
chunk, split axis and side, one task cuts the edge strip a neighbour needs
(2 per split axis: ``2 * ndim`` strip tasks per chunk), and the task of
block ``c`` takes its own chunk of each input plus one strip per neighbour
(up to 8 in 2-D, corners sliced from the diagonal neighbour's strip).  A
periodic axis wraps around for its neighbours; along other axes the chunk at
the global edge has no neighbour there.

The block function then joins the pieces into one block with a full halo on
every side (:func:`assemble`, inside the compiled code), so every block of a
chunk shape has the same shape, whatever its position, and compiles once;
the halo on a global edge is rebuilt from the block's own cells in the
boundary mode (:func:`~xstencil._backends.edges.repad`), from flags given at
run time.  ``map_overlap`` with a periodic boundary costs about 26 tasks per chunk; this costs
``2 * ndim + 1`` plus the inputs' own.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax.numpy as jnp
import numpy as np

from xstencil._backends.edges import repad

__all__ = ["Overlap", "assemble", "halo_array", "neighbour_offsets", "strip_slices", "block_pieces"]


@dataclass(frozen=True)
class Overlap:
    """One input of a halo graph: a dask array, its halo width per axis (the
    same on both sides; 0: no halo) and optionally ``rows``, a range
    ``[r0, r1)`` along axis 0 cut from every piece (rows past the end read
    as zeros, so every block keeps one shape)."""

    array: Any
    depth: tuple[int, ...]
    rows: tuple[int, int] | None = None


def neighbour_offsets(depth: Sequence[int]) -> list[tuple[int, ...]]:
    """The neighbour offsets of a block, itself first (``(0, ...)``)."""
    return list(itertools.product(*[(0, -1, 1) if d else (0,) for d in depth]))


def strip_slices(x: Overlap, axis: int, last: bool) -> tuple[slice, ...]:
    """The slices of a chunk's strip along ``axis``: its last ``depth`` cells
    (the next block's low halo) or its first ones."""
    d = x.depth[axis]
    out = [slice(None)] * x.array.ndim
    out[axis] = slice(-d, None) if last else slice(0, d)
    if x.rows is not None:
        out[0] = slice(*x.rows)
    return tuple(out)


def halo_array(name: str, fn: Callable[..., Any], inputs: Sequence[Overlap],
               periodic: Sequence[bool], chunks: tuple[tuple[int, ...], ...], dtype: Any,
               meta: Any) -> Any:
    """A dask array whose block ``c`` is ``fn(c, edges, pieces)``.

    ``edges`` is a bool array ``(ndim, 2)``: whether the block's low / high
    side along each axis is a global edge of a non-periodic axis (its halo
    there must be rebuilt from its own cells).  ``pieces`` holds per input
    a nested list (one level per axis, as :func:`jax.numpy.block` takes) of
    the block's chunk and its neighbours' strips, ``(lo, own, hi)`` along
    each axis with a halo; a missing neighbour's piece is a slice of the
    block's own chunk of the right shape.  All inputs share the chunk grid
    of the first; ``chunks`` are the output's (extra trailing axes with one
    chunk each allowed).
    """
    import dask.array as dsa
    from dask.base import tokenize
    from dask.highlevelgraph import HighLevelGraph, MaterializedLayer

    grid = tuple(len(c) for c in inputs[0].array.chunks)
    extra = (0,) * (len(chunks) - len(grid))
    layers: dict[str, Any] = {}
    deps: dict[str, set[str]] = {}
    for x in inputs:
        g = x.array.__dask_graph__()
        layers.update(g.layers)
        deps.update(g.dependencies)
    specs = [[list(x.depth), None if x.rows is None else list(x.rows)] for x in inputs]
    strips: dict[str, dict[Any, Any]] = {}
    sources: dict[str, set[str]] = {}  # per strip layer, its array's layers
    tasks: dict[Any, Any] = {}
    for c in np.ndindex(*grid):
        groups = []
        for x in inputs:
            sname = "xstencil-halo-" + tokenize(x.array.name, x.depth, x.rows)
            layer = strips.setdefault(sname, {})
            sources[sname] = set(x.array.__dask_layers__())
            keys: list[Any] = []
            for o in neighbour_offsets(x.depth)[1:]:
                cc = []
                for a, (ci, oi) in enumerate(zip(c, o, strict=True)):
                    j = ci + oi
                    if periodic[a]:
                        j %= grid[a]
                    cc.append(j)
                if any(j < 0 or j >= n for j, n in zip(cc, grid, strict=True)):
                    keys.append(None)
                    continue
                a = next(a for a, oi in enumerate(o) if oi)
                key = (sname, a, int(o[a] < 0)) + tuple(cc)
                if key not in layer:
                    layer[key] = (operator.getitem, (x.array.name,) + tuple(cc),
                                  strip_slices(x, a, o[a] < 0))
                keys.append(key)
            groups.append([(x.array.name,) + c, keys])
        edges = np.array([[not periodic[a] and c[a] == 0, not periodic[a] and c[a] == n - 1]
                          for a, n in enumerate(grid)], dtype=bool)
        tasks[(name,) + c + extra] = (_run, fn, c, edges, specs, groups)
    parents = {lay for x in inputs for lay in x.array.__dask_layers__()}
    for sname, layer in strips.items():
        layers[sname] = MaterializedLayer(layer)
        deps[sname] = sources[sname]
    layers[name] = MaterializedLayer(tasks)
    deps[name] = parents | set(strips)
    graph = HighLevelGraph(layers, deps)
    return dsa.Array(graph, name, chunks, dtype=dtype, meta=meta)


def _rows(x: np.ndarray, rows: tuple[int, int] | None, cut: bool) -> np.ndarray:
    if rows is None:
        return x
    if cut:
        x = x[rows[0]:rows[1]]
    short = rows[1] - rows[0] - x.shape[0]
    if short > 0:
        x = np.concatenate([x, np.zeros((short,) + x.shape[1:], x.dtype)])
    return x


def block_pieces(x: Overlap, own: np.ndarray, strips: Sequence[np.ndarray | None]) -> Any:
    """The nested list of a block's pieces (see :func:`halo_array`)."""
    own = _rows(own, x.rows, True)
    flat = {}
    for o, s in zip(neighbour_offsets(x.depth), [None, *strips], strict=True):
        if not any(o):
            flat[o] = own
            continue
        a = next(a for a, oi in enumerate(o) if oi)
        src = own if s is None else _rows(s, x.rows, False)
        sl = []
        for b, ob in enumerate(o):
            d = x.depth[b]
            if ob == 0 or (s is not None and b == a):
                sl.append(slice(None))
            elif (ob < 0) == (s is not None):  # from a neighbour before: its last cells
                sl.append(slice(-d, None))
            else:
                sl.append(slice(0, d))
        flat[o] = src[tuple(sl)]

    def nest(prefix: tuple[int, ...]) -> Any:
        a = len(prefix)
        if a == own.ndim:
            return flat[prefix]
        return [nest(prefix + (oi,)) for oi in ((-1, 0, 1) if x.depth[a] else (0,))]

    return nest(())


def _run(fn: Callable[..., Any], loc: tuple[int, ...], edges: np.ndarray, specs: Any,
         groups: Sequence[Any]) -> Any:
    """The task of one block: its pieces (``specs``: per input its depth and
    rows, as plain lists), then ``fn``."""
    pieces = [block_pieces(Overlap(None, tuple(d), None if r is None else (r[0], r[1])), own,
                           strips)
              for (d, r), (own, strips) in zip(specs, groups, strict=True)]
    return fn(tuple(int(c) for c in loc), edges, pieces)


def assemble(pieces: Any, depth: Sequence[int], modes: Sequence[str | None], fill: Any,
             edges: Any) -> Any:
    """One block with its full halo, from :func:`halo_array`'s pieces
    (traced); along each axis whose ``modes`` entry is not ``None``, the halo
    on a global edge (``edges``, traced) is rebuilt in that mode, axis by
    axis, so corners are padded in both modes as in memory."""
    x = jnp.block(pieces)
    for a, (d, m) in enumerate(zip(depth, modes, strict=True)):
        if d and m is not None:
            x = repad(x, a, d, d, m, fill, edges[a, 0], edges[a, 1])
    return x

"""dask map blocks on the CPU loop backend.

A dask map evaluates each block with its halo (:class:`~xstencil._backends.
dask.BlockMap`).  Where the loop backend applies (:mod:`xstencil._backends.
loops`: numba installed, numpy blocks on the CPU, ``backend=`` or
``XSTENCIL_BACKEND`` not ``"xla"``, and for ``"auto"`` a block of at least
:data:`~xstencil._backends.loops.AUTO_MIN_POINTS` outputs), a block is joined
with its neighbours' strips in numpy, its halo on a global edge is rebuilt in
numpy (:func:`repad_host`, the same cells as the traced
:func:`~xstencil._backends.edges.repad`), and the kernel runs as the same
generated loop nest as an in-memory map, writing straight into the block's
result.  A function mesh's block runs the mesh's nests
(:class:`BlockMeshLoops`: one per region, in assignment order, as in
memory), with the block's own regions and masks: blocks whose regions have
the same boxes share compiled nests, and each hands its masks to them at
run time.  Everything else (a kernel the generator cannot express, small
blocks, non-numpy chunks, results with an array per point) keeps the jitted
XLA block function.

Measured at 4096² float32 in 2048² chunks, 5-point Laplacian, threaded
scheduler, 2 cores: 113 ms per ``.values`` periodic and 94 ms with ``fill``
on XLA before; see docs/performance.rst for the loop figures.

numba's ``workqueue`` threading layer (where neither OpenMP nor TBB is
available) aborts the process when two threads launch parallel loops at once,
so the nests of concurrent blocks run one at a time (:data:`_NEST_LOCK`) until
a nest has run and numba reports a thread-safe layer (``omp`` or ``tbb``).
Serialised, the 4096² Laplacian in 2048² chunks took 25 ms per call against
22 ms (threaded scheduler, medians of 7).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from xstencil._backends.dask_base import cached, note_trace
from xstencil._backends.loops import (
    AUTO_MIN_POINTS,
    LoopOrJit,
    available,
    resolve_mode,
)
from xstencil._backends.loops_mesh import MeshLoops, Piece, covered, pieces, write_into
from xstencil._engine.boundary import source_index
from xstencil._engine.call import precision
from xstencil._engine.lower import AxisGeom, Source
from xstencil._engine.mesh import Slab

__all__ = ["BlockLoops", "BlockMeshLoops", "block_loops", "join_host", "mesh_parts",
           "repad_host", "structure"]

#: Serialises the loop nests of concurrent dask tasks in this process while
#: numba's threading layer is unknown or not thread-safe (module docstring).
_NEST_LOCK = threading.Lock()
_SERIAL = [True]


def _thread_safe_layer() -> bool:
    """Whether numba's threading layer (known once a parallel loop ran) may be
    launched from several threads at once."""
    import numba

    try:
        return numba.threading_layer() in ("omp", "tbb")
    except ValueError:  # no parallel loop has run yet
        return False


def repad_host(x: np.ndarray, axis: int, lo: int, hi: int, mode: str, fill: Any,
               at_lo: bool, at_hi: bool) -> None:
    """In place, where ``at_lo`` / ``at_hi``: rebuild the outer ``lo`` / ``hi``
    cells of ``x`` along ``axis`` from the cells inside, in ``mode`` (numpy's
    twin of :func:`~xstencil._backends.edges.repad`: the mode reads the
    ``w + 1`` cells next to a halo of ``w``; ``fill`` is cast to ``x``'s
    dtype as JAX casts it)."""
    n = x.shape[axis]
    value = None
    if mode == "fill":
        with precision(x):  # a 64-bit x keeps its fill value in 64 bits
            value = np.asarray(jnp.full((), fill, x.dtype))[()]

    def rebuild(first: int, inner: int, positions: np.ndarray, avail: int) -> None:
        m = min(avail, len(positions) + 1)  # the inner cells the mode reads
        idx = source_index(positions, m, mode)
        dst = [slice(None)] * x.ndim
        src = [slice(None)] * x.ndim
        for k, i in enumerate(idx):
            dst[axis] = first + k
            if i < 0:
                x[tuple(dst)] = value
            else:
                src[axis] = inner + int(i)
                x[tuple(dst)] = x[tuple(src)]

    if lo and at_lo:
        # where the high side is a global edge too, its halo is not rebuilt yet:
        # the mode reads the core only (reflect reaches one cell past a core of lo)
        rebuild(0, lo, np.arange(-lo, 0), n - lo - (hi if at_hi else 0))
    if hi and at_hi:
        m = min(n - hi, hi + 1)
        rebuild(n - hi, n - hi - m, np.arange(m, m + hi), m)


def join_host(pieces: Any, depth: Sequence[int], modes: Sequence[str | None], fill: Any,
              edges: np.ndarray) -> np.ndarray:
    """A block with its full halo from :func:`~xstencil._backends.dask_halo.
    halo_array`'s pieces, in numpy (the twin of its traced
    :func:`~xstencil._backends.dask_halo.assemble`): always a new array."""
    x = np.block(pieces)
    if any(np.may_share_memory(x, p) for p in jax.tree_util.tree_leaves(pieces)):
        x = x.copy()
    for a, (d, m) in enumerate(zip(depth, modes, strict=True)):
        if d and m is not None:
            repad_host(x, a, d, d, m, fill, bool(edges[a, 0]), bool(edges[a, 1]))
    return x


def _launched(run: Callable[[], Any]) -> Any:
    """``run()`` (a block's nests), under :data:`_NEST_LOCK` until a nest has
    run and numba reports a thread-safe threading layer."""
    if not _SERIAL[0]:
        return run()
    with _NEST_LOCK:
        res = run()
        if res is not None and _thread_safe_layer():
            _SERIAL[0] = False
        return res


class _Once:
    """A block geometry's first run traces and compiles, once (later blocks
    of the geometry wait for it); :func:`~xstencil._backends.dask_base.
    compile_count` counts it."""

    def __init__(self) -> None:
        self.declined = False
        self._first = threading.Lock()
        self._ready = False

    def once(self, run: Callable[[], Any]) -> Any:
        if not self._ready:
            with self._first:
                if not self._ready:
                    note_trace()
                    res = _launched(run)
                    self._ready = True
                    return res
        return _launched(run)


def _sources(cell_axes: tuple[int, ...], coord_axes: Sequence[int]
             ) -> Callable[[Any, Any], list[Source]]:
    """A joined block's sources: every array over every field axis, no
    padding (the block holds its halo), then the coordinates."""
    def sources(arrays: Any, coords: Any) -> list[Source]:
        out = [Source(x, tuple(range(x.ndim)), cell_axes) for x in arrays]
        out += [Source(c, (a,), (a,)) for c, a in zip(coords, coord_axes, strict=True)]
        return out

    return sources


class BlockLoops(_Once):
    """One block geometry's loop nest: a :class:`~xstencil._backends.loops.
    LoopOrJit` without a jitted function, and whether it declined (the
    block then takes the XLA path without joining its pieces again)."""

    def __init__(self, call: Callable[..., Any], geom: Sequence[AxisGeom],
                 cell_axes: tuple[int, ...], coord_axes: Sequence[int], backend: str | None):
        super().__init__()

        def kernel(cells: Any, dyn: Any, leaves: Any) -> Any:
            return call(cells, dyn)

        self.loops = LoopOrJit(None, kernel, _sources(cell_axes, coord_axes), geom, backend)

    def run(self, arrays: list[np.ndarray], coords: Sequence[np.ndarray], dyn: list[Any],
            out: np.ndarray | None) -> Any:
        """The block's output pytree (``out`` itself where the nest wrote
        into it), or ``None`` where the loops do not apply."""
        def go() -> Any:
            staged = self.loops.try_loops(arrays, coords, dyn, [], out)
            if staged is None:
                self.declined = True
                return None
            return staged.go()

        return self.once(go)


class BlockMeshLoops(_Once):
    """One function-mesh block structure's nests (:class:`~xstencil._backends.
    loops_mesh.MeshLoops`): the regions' boxes and which are masked are
    fixed per structure; the masks themselves are each block's own, handed
    to the compiled nests at run time."""

    def __init__(self, calls: Sequence[Callable[..., Any]], base: Callable[..., Any],
                 parts: Sequence[Piece], geom: Sequence[AxisGeom], cell_axes: tuple[int, ...],
                 coord_axes: Sequence[int], dtypes: Sequence[str], backend: str | None):
        super().__init__()
        field = tuple(g.count for g in geom)

        def shapes(*_: Any) -> Any:  # the result's dtypes: the whole mesh's, as on XLA
            return [jnp.zeros(field, dt) for dt in dtypes]

        def region(call: Callable[..., Any]) -> Callable[..., Any]:
            return lambda cells, dyn, leaves: call(cells, dyn)

        self.loops = MeshLoops(shapes, [region(c) for c in calls], region(base), parts,
                               _sources(cell_axes, coord_axes), geom, backend)

    def run(self, arrays: list[np.ndarray], coords: Sequence[np.ndarray], dyn: list[Any],
            parts: Sequence[Piece]) -> list[np.ndarray] | None:
        """The block's result leaves (new arrays), or ``None`` where the
        loops do not apply; ``parts``: this block's pieces (its masks)."""
        def go() -> list[np.ndarray] | None:
            built = self.loops.built_for(arrays, coords, dyn, (), [])
            if built is None:
                self.declined = True
                return None
            nests = [n._replace(mask=p.mask) for n, p in zip(built.nests, parts, strict=True)]
            outs = [np.empty(built.field, dt) for dt in built.out_dtypes]
            write_into(built._replace(nests=nests), outs, arrays, coords,
                       jax.tree_util.tree_leaves(dyn))
            return outs

        return self.once(go)


def mesh_parts(regions: Sequence[Slab | int], masks: Sequence[np.ndarray],
               field: tuple[int, ...]) -> list[Piece]:
    """A mesh block's loop nests (:func:`~xstencil._backends.loops_mesh.pieces`),
    its coverage computed from its own regions and masks."""
    return pieces(regions, masks, field, covered(regions, masks, field))


def structure(parts: Sequence[Piece]) -> tuple[Any, ...]:
    """What a mesh block's compiled nests depend on: each piece's kernel,
    box and whether it is masked (not the mask's values)."""
    return tuple((p.kernel, p.box, p.mask is None) for p in parts)


def block_loops(key: Any, backend: str | None, geom: Sequence[AxisGeom],
                make: Callable[[], Any]) -> Any:
    """The cached :class:`BlockLoops` (or :class:`BlockMeshLoops`) of a block
    geometry, or ``None`` where the loop backend cannot apply (checked
    before the pieces are joined)."""
    mode = resolve_mode(backend)
    if mode == "xla" or not available() or jax.default_backend() != "cpu":
        return None
    if mode == "auto" and math.prod(g.count for g in geom) < AUTO_MIN_POINTS:
        return None
    loops = cached(("loops",) + tuple(key), make)
    return None if loops.declined else loops

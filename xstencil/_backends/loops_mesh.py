"""Function meshes on the generated-loop CPU backend.

A mesh's result equals a per-cell switch over its regions' kernels, the later
region winning where regions overlap and uncovered cells keeping their input
(:mod:`xstencil._engine.mesh`).  On the loop backend that is a sequence of
loop nests writing into one preallocated output: first the input kept
everywhere (only when the regions leave a cell uncovered), then each region's
kernel over its own box, in assignment order, so that a later region
overwrites an earlier one.  A rectangular region's box is its slab of output
positions (with steps); a mask region's box is the whole field, and its loop
writes only where the mask (a runtime argument) is true, so that the
generated code does not depend on where the mask lies.  Every compiled nest
is kept in the shared compile cache under its source text, so a mesh whose
mask moved, or another mesh with a region in common, compiles no nest twice.
A boundary strip's nest (serial, not the whole field) takes where its box
lies (counts, starts, interior ranges) as a runtime argument instead of
constants in the source, so strips of one kernel with the same steps (a
boundary kernel on several edges) share one compile; large nests keep their
box in the source, where runtime bounds cost numba about 3x.  Every
nest is :func:`~xstencil._engine.loopgen.generate`'s loop of that kernel over
that box, so boundaries at a region's edge read the same cells as on the XLA
path.  The result's dtypes are the XLA function's (found with
:func:`jax.eval_shape`), and every region casts its values into them as the
XLA mesh does (``astype``).

:class:`MeshLoops` stands in for the jitted mesh function exactly as
:class:`~xstencil._backends.loops.LoopOrJit` does for a map: numba loops on
concrete numpy data on the CPU outside JAX transforms, else (silently, with
the same result) the jitted XLA function.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from xstencil._backends import bufpool
from xstencil._backends.hostwrap import wrap
from xstencil._backends.loopcache import njit_source
from xstencil._backends.loops import (
    AUTO_MIN_POINTS,
    MAX_STATEMENTS,
    host_views,
    leaf_sig,
    numba,
    numpy_on_cpu,
    omp_env,
    resolve_mode,
)
from xstencil._backends.tiered import from_source, promote_after
from xstencil._engine.kcache import cached
from xstencil._engine.lift import Unliftable
from xstencil._engine.loopgen import Param, boundary_tables, generate
from xstencil._engine.loopnest import box_args
from xstencil._engine.lower import AxisGeom, Source, cell_avals
from xstencil._engine.mesh import Slab, slab_geometry

__all__ = ["AUTO_MAX_NESTS", "PARALLEL_MIN_POINTS", "Piece", "MeshLoops", "covered", "pieces",
           "run_mesh", "write_into", "write_nests"]

#: ``"auto"`` runs a mesh as loops only up to this many loop nests (regions,
#: plus one where cells keep their input): numba compiles each nest, about a
#: second apiece.
AUTO_MAX_NESTS = 8
#: Boxes of fewer output points (a boundary strip) run serially: numba
#: compiles a serial nest 2-4 times faster than a parallel one, and a strip
#: of a few thousand points gains nothing from threads.
PARALLEL_MIN_POINTS = 1 << 16

_LOG = logging.getLogger("xstencil.loops")


class Piece(NamedTuple):
    """One loop nest: ``kernel`` (an index into the mesh's kernels, -1 for
    the kept input) over the output positions ``box``, written where
    ``mask`` (booleans of the box's shape, or ``None``: everywhere)."""

    kernel: int
    box: Slab
    mask: np.ndarray | None


def covered(regions: Sequence[Slab | int], masks: Sequence[np.ndarray],
            counts: tuple[int, ...]) -> bool:
    """Whether the regions (:class:`Slab` or indices into ``masks``) leave no
    output position uncovered."""
    if any(isinstance(r, Slab) and all(rr[2] == 1 and len(range(*rr)) == n
                                       for rr, n in zip(r.ranges, counts, strict=True))
           for r in regions):
        return True  # a region over the whole output
    hit = np.zeros(counts, bool)
    for r in regions:
        hit[tuple(slice(*rr) for rr in r.ranges) if isinstance(r, Slab) else masks[r]] = True
    return bool(hit.all())


def pieces(regions: Sequence[Slab | int], masks: Sequence[np.ndarray], counts: Sequence[int],
           covered: bool) -> list[Piece]:
    """The loop nests of a mesh, in the order they write.

    ``regions`` are :class:`Slab` or indices into ``masks`` (booleans of the
    output's field shape ``counts``).  Regions before the last one that
    covers the whole field, empty regions and (when ``covered``) the kept
    input are left out: every cell they would write is overwritten."""
    whole = Slab(tuple((0, n, 1) for n in counts))
    out = [] if covered else [Piece(-1, whole, None)]
    for i, r in enumerate(regions):
        if isinstance(r, Slab):
            if 0 in r.counts():
                continue
            if r == whole or all(len(range(*rr)) == n and rr[2] == 1
                                 for rr, n in zip(r.ranges, counts, strict=True)):
                out = []
            out.append(Piece(i, r, None))
            continue
        m = np.ascontiguousarray(masks[r], dtype=bool)
        if not m.any():
            continue
        out.append(Piece(i, whole, None if m.all() else m))
    return out


class _Nest(NamedTuple):
    fn: Any
    source: str
    index: tuple[slice, ...]  # the piece's box in the output
    box: np.ndarray | None  # a boxed nest: where its box lies (loopnest.box_args)
    tables: list[np.ndarray]
    mask: np.ndarray | None


class _BuiltMesh(NamedTuple):
    nests: list[_Nest]
    fills: list[Any]
    params: list[Param]
    out_dtypes: list[np.dtype]
    out_tree: Any
    field: tuple[int, ...]


class MeshLoops:
    """The engine function of a function mesh: loops where they apply, else ``jitted``.

    ``kernels[i](cells, dyn, leaves)`` is region ``i``'s kernel (``base``:
    the kept input) on per-cell windows; ``parts`` are the loop nests
    (:func:`pieces`); ``make_sources(arrays, coords)`` describes the inputs.
    """

    def __init__(self, jitted: Callable[..., Any], kernels: Sequence[Callable[..., Any]],
                 base: Callable[..., Any], parts: Sequence[Piece],
                 make_sources: Callable[[Any, Any], list[Source]], geom: Sequence[AxisGeom],
                 backend: str | None):
        self.jitted = jitted
        self.kernels = list(kernels)
        self.base = base
        self.parts = list(parts)
        self.make_sources = make_sources
        self.geom = list(geom)
        self.backend = backend
        self.built: dict[Any, _BuiltMesh | str] = {}  # per input layout, as LoopOrJit

    def __getattr__(self, name: str) -> Any:  # .lower, .trace ... of the jitted function
        if name == "jitted":
            raise AttributeError(name)
        return getattr(self.jitted, name)

    def __call__(self, arrays: Any, coords: Any, dyn: Any, dynamic: Any, leaves: Any) -> Any:
        out = self._loops(arrays, coords, dyn, dynamic, leaves)
        if out is not None:
            return out
        return self.jitted(arrays, coords, dyn, dynamic, leaves)

    def _loops(self, arrays: Any, coords: Any, dyn: Any, dynamic: Any, leaves: Any) -> Any:
        arrays = host_views(arrays)
        built = self.built_for(arrays, coords, dyn, dynamic, leaves)
        if built is None:
            return None
        return run_mesh(built, arrays, coords, jax.tree_util.tree_leaves(dyn), leaves)

    def built_for(self, arrays: Any, coords: Any, dyn: Any, dynamic: Any, leaves: Any
                  ) -> _BuiltMesh | None:
        """The compiled nests for this call's layout (built on its first
        call), or ``None`` where the loops do not apply."""
        mode = resolve_mode(self.backend)
        if mode == "xla" or numba is None or not self.parts:
            return None
        if mode == "auto" and (math.prod(g.count for g in self.geom) < AUTO_MIN_POINTS
                               or len(self.parts) > AUTO_MAX_NESTS):
            return None
        dleaves = jax.tree_util.tree_leaves(dyn)
        if not numpy_on_cpu("mesh", arrays, list(coords) + dleaves + list(leaves)):
            return None
        x64 = bool(jax.config.read("jax_enable_x64"))
        key = (mode, tuple((x.shape, x.dtype.str) for x in arrays), tuple(map(leaf_sig, coords)),
               tuple(map(leaf_sig, dleaves)), tuple(map(leaf_sig, leaves)), x64)
        built = self.built.get(key)
        if built is None:
            built = self._build(arrays, coords, dyn, dynamic, leaves, MAX_STATEMENTS[mode])
            self.built[key] = built
            if isinstance(built, str):
                _LOG.debug("mesh runs with XLA: %s", built)
        return None if isinstance(built, str) else built

    def _build(self, arrays: Any, coords: Any, dyn: Any, dynamic: Any, leaves: Any,
               limit: int) -> _BuiltMesh | str:
        """Trace, generate and compile every nest, or say why the loops do not apply."""
        promote_after()  # a bad XSTENCIL_PROMOTE_AFTER is the user's error, not a fallback
        try:
            # the result's structure and dtypes: the XLA function's own
            shapes = jax.eval_shape(self.jitted, arrays, coords, dyn, dynamic, leaves)
            avals, tree = jax.tree_util.tree_flatten(shapes)
            field = tuple(g.count for g in self.geom)
            if any(tuple(a.shape) != field for a in avals):
                return "the kernels return arrays per point"
            out_dtypes = [np.dtype(a.dtype) for a in avals]
            coords = [np.asarray(c) for c in coords]
            sources = self.make_sources(list(arrays), coords)
            omp_env()
            nests, params = [], None
            for part in self.parts:
                kernel = self.base if part.kernel < 0 else self.kernels[part.kernel]
                geom = slab_geometry(self.geom, part.box)
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    closed = jax.make_jaxpr(kernel)(cell_avals(sources, geom), dyn, list(leaves))
                if caught:  # the XLA path traces again and shows the warning
                    return f"tracing warned: {caught[0].message}"
                params = [Param(i, tuple(v.aval.shape), np.dtype(v.aval.dtype))
                          for i, v in enumerate(closed.jaxpr.invars[len(sources):])]
                parallel = math.prod(part.box.counts()) >= PARALLEL_MIN_POINTS
                whole = all(r == (0, g.count, 1)
                            for r, g in zip(part.box.ranges, self.geom, strict=True))
                # a boundary strip's box is a runtime argument: strips of one kernel
                # with the same steps share the source, hence one compile (large
                # boxes keep it in the source: runtime bounds cost numba 3x there)
                boxed = not parallel and not whole
                source, n = generate(closed, sources, geom, params, limit, out_dtypes,
                                     masked=part.mask is not None,
                                     out_steps=tuple(r[2] for r in part.box.ranges)
                                     if boxed else None)
                if n != len(out_dtypes):
                    return "a kernel returns another structure than the mesh's result"
                fn = cached(("loop-nest", source, parallel),
                            lambda s=source, p=parallel: _compile(s, p))
                nests.append(_Nest(fn, source, tuple(slice(*r) for r in part.box.ranges),
                                   box_args(sources, geom, [r[0] for r in part.box.ranges])
                                   if boxed else None,
                                   boundary_tables(sources, geom), part.mask))
            fills = [np.asarray(jnp.full((), s.fill_value, s.array.dtype))[()] for s in sources]
            return _BuiltMesh(nests, fills, params or [], out_dtypes, tree, field)
        except Unliftable as e:
            return f"not expressible as loops: {e}"
        except Exception as e:  # noqa: BLE001 - correctness first: XLA decides and reports
            return f"{type(e).__name__}: {e}"


def _compile(source: str, parallel: bool) -> Any:
    """The numba function of a generated nest (compiled on its first call, or
    loaded from numba's disk cache: :mod:`xstencil._backends.loopcache`); a
    parallel one runs serially until its runs add up
    (:mod:`xstencil._backends.tiered`)."""
    if parallel:
        return from_source(source, "<xstencil mesh loop>")
    return njit_source(source, "<xstencil mesh loop>", error_model="numpy")


def run_mesh(built: _BuiltMesh, arrays: Sequence[np.ndarray], coords: Sequence[Any],
             dleaves: Sequence[Any], leaves: Sequence[Any]) -> Any:
    """Run a compiled mesh: its nests in order into one set of output buffers
    (JAX arrays on the CPU that share them, wrapped by
    :func:`~xstencil._backends.hostwrap.wrap`: ``jax.device_put``'s result,
    in 30-50 µs instead of 150-250; recycled buffers, see bufpool.py)."""
    near = bufpool.near_of(arrays[0]) if arrays else None  # half a page off (bufpool.offset)
    outs = [bufpool.empty(built.field, dt, near) for dt in built.out_dtypes]
    write_into(built, outs, arrays, coords, list(dleaves) + list(leaves))
    return jax.tree_util.tree_unflatten(built.out_tree, [wrap(o) for o in outs])


def write_into(built: _BuiltMesh, outs: Sequence[np.ndarray], arrays: Sequence[np.ndarray],
               coords: Sequence[Any], values: Sequence[Any]) -> None:
    """Run a compiled mesh's nests into ``outs`` (``values``: the kernels'
    argument leaves, then their closed-over arrays)."""
    params = [np.ascontiguousarray(np.asarray(x, dtype=p.dtype)).reshape(-1)
              for x, p in zip(values, built.params, strict=True)]
    write_nests(built, outs, list(arrays) + [np.asarray(c) for c in coords], params)


def write_nests(built: _BuiltMesh, outs: Sequence[np.ndarray], srcs: Sequence[np.ndarray],
                params: Sequence[np.ndarray]) -> None:
    """Run a compiled mesh's nests in order into the whole-field buffers
    ``outs`` (``srcs``: the arrays and coordinates; ``params``: the flat
    argument and closed-over arrays)."""
    for nest in built.nests:
        extra = [] if nest.mask is None else [nest.mask]
        if nest.box is None:
            views = [o[nest.index] for o in outs]
            nest.fn(*views, *srcs, *nest.tables, *built.fills, *params, *extra)
        else:  # a boxed nest writes into the whole outputs
            nest.fn(*outs, *srcs, *nest.tables, *built.fills, *params, *extra, nest.box)

"""dask-backed DataArrays: lazy maps, one task per chunk with its neighbours' edges.

``da.stencil.map`` on a DataArray whose data is a dask array returns a lazy,
dask-backed DataArray with the input's chunks.  Nothing is computed until the
user asks (``.compute()``, ``.values``, ``to_netcdf``...).

How a block is computed
-----------------------
* The halo depth along each window dim is ``max(lo, hi)`` of the window.
  The graph is built by :func:`~xstencil._backends.dask_halo.halo_array`
  (not ``map_overlap``, whose periodic overlap costs ~26 tasks per chunk):
  per chunk, one strip task per split axis and side, and one block task
  taking its chunk and its neighbours' strips (wrapping around periodic
  dims).  Every block gets a full halo, so blocks of one chunk shape share
  one compiled function; on a global edge of a non-periodic dim the halo is
  rebuilt inside the compiled code from the block's own cells, in the mode
  (``valid`` pads with ``fill``: its outputs never read the halo), from
  edge flags given at run time.
* Every block is evaluated by one jitted engine function (the same lowering
  as in-memory maps: whole shifted slices, no padding copy).  The jitted
  functions live in the per-process cache of
  :mod:`xstencil._backends.dask_base`, keyed by a token of the kernel and the
  options computed once on the client.  A kernel pickled to a worker is a new
  object on every task; keying by the token, not by the object, is what keeps
  a worker at one compile per block geometry.
* Each block knows its global position (its chunk index), so strides,
  ``valid`` trimming, mesh regions by label or position, and coordinate
  windows (``u.coord``, sliced per block with its halo) are all exact across
  chunk borders.

Scans over dask data (:func:`~xstencil._backends.dask_scan.scan_dask`) live in
:mod:`xstencil._backends.dask_scan` and share the compile cache.
No xarray here: the labelled layer passes the raw arrays, the numeric
coordinates and the kernel adapter (:class:`~xstencil._backends.jobs.Hooks`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from xstencil._backends.dask_base import (
    any_dask,
    cached,
    clear_cache,
    compile_count,
    is_dask,
    merged,
    note_trace,
    token,
    with_progress,
)
from xstencil._backends.dask_halo import Overlap, assemble, halo_array
from xstencil._backends.dask_loops import (
    BlockLoops,
    BlockMeshLoops,
    block_loops,
    join_host,
    mesh_parts,
    structure,
)
from xstencil._backends.dask_pack import byte_width, pack, unpack
from xstencil._backends.jobs import Hooks, MapJob
from xstencil._backends.loops import resolve_mode
from xstencil._backends.loops_mesh import covered
from xstencil._engine.call import avals, precision, promote, split_static, stand_in
from xstencil._engine.coords import padded, read_dtype
from xstencil._engine.kcache import describe, rebuild, snapshot
from xstencil._engine.lower import AxisGeom, Source, evaluate
from xstencil._engine.mesh import Slab, branches, mesh_evaluate
from xstencil._errors import XStencilError

Plan = Any  # xstencil._labelled.plan.Plan: a frozen description; backends read its fields

# is_dask, any_dask, compile_count, clear_cache and with_progress live in dask_base and
# are re-exported here for the modules that import them from this one
__all__ = ["is_dask", "any_dask", "map_dask", "compile_count", "clear_cache", "with_progress"]


# -- per-axis layout -------------------------------------------------------------------


@dataclass(frozen=True)
class _Axis:
    """One field axis: halo depth, the mode that rebuilds the halo at the
    global edges (``None``: periodic, or no halo), and per input chunk the
    output range."""

    depth: int
    edge_mode: str | None
    starts: tuple[int, ...]  # input chunk starts
    sizes: tuple[int, ...]  # input chunk sizes
    out: tuple[tuple[int, int], ...]  # [j_lo, j_hi) outputs per chunk
    lo: int
    stride: int
    offset: int  # the centre of output j sits at input j * stride + offset


def _axes(plan: Plan, chunks: Sequence[Sequence[int]]) -> list[_Axis]:
    out = []
    for d, s, g, ch in zip(plan.dims, plan.specs, plan.geom, chunks, strict=True):
        depth = max(s.lo, s.hi)
        if depth and sum(ch) < depth:
            # no chunking helps: the whole dim is shorter than the halo
            raise XStencilError(
                f"{plan.call}: dim {d!r} has {sum(ch)} points in all, fewer than the "
                f"window's halo of {depth}; a dask-backed map builds each block's halo from "
                f"its own and its neighbours' chunks, so no rechunking can supply it; map "
                f"the data in "
                f"memory (obj.compute().stencil.map(...)), where the boundary mode builds "
                f"the halo, or use a window reaching at most {sum(ch)} points along {d!r}"
            )
        if depth and min(ch) < depth:
            raise XStencilError(
                f"{plan.call}: dim {d!r} has a chunk of {min(ch)} points, smaller than the "
                f"window's halo of {depth}; neighbouring chunks must supply the halo, so "
                f"rechunk with every chunk >= {depth}, e.g. "
                f".chunk({{{d!r}: {merged(tuple(ch), depth)!r}}})"
            )
        edge = None  # the mode that rebuilds the halo on a global edge
        if depth and s.mode != "periodic":
            edge = "fill" if s.mode == "valid" else s.mode
        starts = tuple(int(v) for v in np.cumsum((0,) + tuple(ch))[:-1])
        off = s.lo - s.pad_lo
        rng = []
        for a, n in zip(starts, ch, strict=True):
            j_lo = min(max(-(-(a - off) // s.stride), 0), g.count)
            j_hi = min(max(-(-(a + n - off) // s.stride), 0), g.count)
            rng.append((j_lo, max(j_lo, j_hi)))
        out.append(_Axis(depth, edge, starts, tuple(int(c) for c in ch), tuple(rng), s.lo,
                         s.stride, off))
    return out


# -- the task function -----------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class BlockMap:
    """The function dask calls on each (overlapped) block; pickled to workers.

    It holds the kernels, the plan and the global layout; the compiled code
    is looked up by ``token`` in the worker's process-wide cache.
    """

    token: str
    plan: Plan
    hooks: Hooks
    kernels: tuple[Callable[..., Any], ...]
    regions: tuple[Slab | int, ...] | None  # None: a plain map
    static: Any
    dyn: tuple[Any, ...]
    coords: tuple[np.ndarray, ...]  # padded by each axis's depth
    axes: tuple[_Axis, ...]
    nvar: int
    stacked: bool  # several output leaves, stacked along a trailing axis
    packed: bool = False  # leaves of different dtypes: stacked as their raw bytes
    dtypes: tuple[str, ...] | None = None  # a mesh's leaves: the dtypes every block casts to
    backend: str | None = None  # backend= of the map: its blocks may run as CPU loops
    out_dtype: str | None = None  # a plain map's one scalar result per point: its dtype
    scalar: bool = False  # every result is one value per point (a mesh may run as loops)
    # the compile cache's key: ``token`` less what the block gets as arguments (the
    # data's graph name, the values of array arguments and coordinates), so that a
    # new field of the same layout reuses the compiled block on every worker
    code: str = ""

    def __call__(self, loc: tuple[int, ...], edges: np.ndarray, pieces: list[Any]
                 ) -> np.ndarray:
        """One block: ``pieces`` per input (the fields, then the masks) from
        :func:`~xstencil._backends.dask_halo.halo_array`."""
        arrays, masks = pieces[:self.nvar], pieces[self.nvar:]
        geom, coords, regions = [], [], []
        for k, (ax, c) in enumerate(zip(self.axes, loc, strict=True)):
            a = ax.starts[c]
            j_lo, j_hi = ax.out[c]
            first = j_lo * ax.stride + ax.offset - a  # the first centre, in the core
            geom.append(AxisGeom(ax.depth + first - ax.lo, ax.stride, j_hi - j_lo,
                                 self.plan.specs[k].size))
        for d, c in zip(self.plan.coord_dims, self.coords, strict=True):
            k = self.plan.axis(d)
            ax = self.axes[k]
            a = ax.starts[loc[k]]
            coords.append(c[a:a + ax.sizes[loc[k]] + 2 * ax.depth])
        if self.regions is not None:
            spans = [ax.out[c] for ax, c in zip(self.axes, loc, strict=True)]
            regions = [_local(r, spans) for r in self.regions]
        leaves = jax.tree_util.tree_leaves(pieces)
        key = (self.code or self.token, tuple(geom), tuple(regions),
               tuple((x.shape, str(x.dtype)) for x in leaves))
        if all(type(x) is np.ndarray for x in leaves):
            res = None
            if self.regions is None:
                res = self._on_loops(key, geom, arrays, edges, coords)
            elif self.scalar:
                res = self._mesh_on_loops(key, geom, regions, arrays, masks, edges, coords)
            if res is not None:
                return res
        fn = cached(key, lambda: self._build(geom, regions))
        with precision(jax.tree_util.tree_leaves(arrays), self.dyn, self.plan.dtype_probe()):
            out = fn(list(arrays), edges, coords, list(self.dyn), list(masks))
        return np.asarray(out)

    def _on_loops(self, key: Any, geom: list[AxisGeom], arrays: list[Any], edges: np.ndarray,
                  coords: list[np.ndarray]) -> np.ndarray | None:
        """The block on the CPU loop backend (:mod:`~xstencil._backends.
        dask_loops`), or ``None`` where it does not apply."""
        plan = self.plan

        def make() -> BlockLoops:
            return BlockLoops(self.hooks.caller(plan, self.kernels[0], self.static), geom,
                              *self._loop_axes(), self.backend)

        loops = block_loops(key, self.backend, geom, make)
        if loops is None:
            return None
        buf = None
        if self.out_dtype is not None:
            buf = np.empty(tuple(g.count for g in geom), self.out_dtype)
        with precision(jax.tree_util.tree_leaves(arrays), self.dyn, plan.dtype_probe()):
            res = loops.run(self._joined(arrays, edges), coords, list(self.dyn), buf)
            if res is None or res is buf:
                return res
            # a copy: the loop's own buffers go back to their pool
            return np.array(self._assembled(jax.tree_util.tree_leaves(res), len(geom)))

    def _mesh_on_loops(self, key: Any, geom: list[AxisGeom], regions: list[Slab | int],
                       arrays: list[Any], masks: list[Any], edges: np.ndarray,
                       coords: list[np.ndarray]) -> np.ndarray | None:
        """A function mesh's block on the CPU loop backend: the mesh's nests
        (one per region, in assignment order) over the joined block, with
        this block's regions and masks; ``None`` where it does not apply."""
        plan = self.plan
        field = tuple(g.count for g in geom)
        parts = mesh_parts(regions, [np.block(m) for m in masks], field)

        def make() -> BlockMeshLoops:
            calls = [self.hooks.caller(plan, k, self.static) for k in self.kernels]
            return BlockMeshLoops(calls, self.hooks.identity(plan, calls[-1]), parts, geom,
                                  *self._loop_axes(), self.dtypes or (), self.backend)

        loops = block_loops(key + (structure(parts),), self.backend, geom, make)
        if loops is None:
            return None
        with precision(jax.tree_util.tree_leaves(arrays), self.dyn, plan.dtype_probe()):
            outs = loops.run(self._joined(arrays, edges), coords, list(self.dyn), parts)
            return None if outs is None else np.asarray(self._assembled(outs, len(geom)))

    def _loop_axes(self) -> tuple[tuple[int, ...], list[int]]:
        """The field axes the kernel's window spans, and each read coordinate's."""
        plan = self.plan
        return (tuple(sorted(plan.axis(d) for d in plan.window_dims)),
                [plan.axis(d) for d in plan.coord_dims])

    def _joined(self, arrays: list[Any], edges: np.ndarray) -> list[np.ndarray]:
        """Each input's block with its full halo, in numpy (under the call's
        precision: the fill value is cast as JAX casts it)."""
        fill = 0 if self.plan.fill_value is None else self.plan.fill_value
        depth = tuple(ax.depth for ax in self.axes)
        modes = tuple(ax.edge_mode for ax in self.axes)
        return [join_host(p, depth, modes, fill, edges) for p in arrays]

    def _assembled(self, leaves: list[Any], nfield: int) -> Any:
        """A block's result leaves as the task returns them: the one leaf, or
        all of them stacked (as raw bytes where their dtypes differ)."""
        if not self.stacked:
            return leaves[0]
        return pack(leaves, nfield) if self.packed else _stack(leaves, nfield)

    def _build(self, geom: list[AxisGeom], regions: list[Slab | int]) -> Callable[..., Any]:
        plan, static, hooks, assembled = self.plan, self.static, self.hooks, self._assembled
        kernels, axes = self.kernels, self.axes
        is_mesh = self.regions is not None
        dtypes = self.dtypes
        wset = {plan.axis(d) for d in plan.window_dims}
        modes = tuple(ax.edge_mode for ax in axes)
        depth = tuple(ax.depth for ax in axes)
        fill = 0 if plan.fill_value is None else plan.fill_value

        def run(arrays: Any, edges: Any, coords: Any, dyn: Any, masks: Any) -> Any:
            note_trace()
            srcs = []
            masks = [jnp.block(m) for m in masks]
            for p in arrays:
                x = assemble(p, depth, modes, fill, edges)
                srcs.append(Source(x, tuple(range(x.ndim)), tuple(sorted(wset))))
            for c, d in zip(coords, plan.coord_dims, strict=True):
                a = plan.axis(d)
                srcs.append(Source(c, (a,), (a,)))
            if not is_mesh:
                out = evaluate(hooks.caller(plan, kernels[0], static), srcs, geom, dyn)
            else:
                calls = [hooks.caller(plan, k, static) for k in kernels]
                out = mesh_evaluate(branches(regions, masks, calls),
                                    hooks.identity(plan, calls[-1]), srcs, geom, dyn)
                # a block promotes only the kernels it runs: cast to the whole mesh's dtypes
                leaves, tree = jax.tree_util.tree_flatten(out)
                out = jax.tree_util.tree_unflatten(tree, [
                    v.astype(dt) for v, dt in zip(leaves, dtypes or (), strict=True)])
            return assembled(jax.tree_util.tree_leaves(out), len(geom))

        return jax.jit(run)


def _local(region: Slab | int, spans: Sequence[tuple[int, int]]) -> Slab | int:
    """A global slab of outputs, restricted to one block's outputs."""
    if not isinstance(region, Slab):
        return region
    out = []
    for (a, b, c), (j_lo, j_hi) in zip(region.ranges, spans, strict=True):
        hit = np.arange(a, b, c)
        hit = hit[(hit >= j_lo) & (hit < j_hi)] - j_lo
        if hit.size == 0:
            return Slab(tuple((0, 0, 1) for _ in spans))
        step = int(hit[1] - hit[0]) if hit.size > 1 else 1
        out.append((int(hit[0]), int(hit[-1]) + 1, step))
    return Slab(tuple(out))


def _stack(out: Any, nfield: int) -> Any:
    import jax.numpy as jnp

    leaves = jax.tree_util.tree_leaves(out)
    dt = np.result_type(*[x.dtype for x in leaves])
    # the trailing size spelled out: -1 is ambiguous in a block with no points
    flat = [x.reshape(x.shape[:nfield] + (int(np.prod(x.shape[nfield:])),)).astype(dt)
            for x in leaves]
    return jnp.concatenate(flat, axis=-1)


# -- building the graph ----------------------------------------------------------------


def _coords(job: MapJob, axes: Sequence[_Axis]) -> tuple[np.ndarray, ...]:
    """The coordinates the kernel reads, padded by each axis's halo depth."""
    plan = job.plan
    depth = {d: (axes[plan.axis(d)].depth,) * 2 for d in plan.coord_dims}
    modes = {d: plan.specs[plan.axis(d)].mode for d in plan.coord_dims}
    return padded(plan.call, job.coords, depth, modes, job.period, read_dtype(plan.var_dtypes))


def _leaf_shapes(job: MapJob, static: Any, dyn: Sequence[Any], arrays: Sequence[Any],
                 coords: Sequence[np.ndarray]) -> Any:
    """The kernel's per-point output structure (shapes and dtypes), from one
    per-cell trace on the client."""
    plan = job.plan
    with precision(list(arrays), list(dyn), plan.dtype_probe()):
        cells = []
        for x, vdims in zip(arrays, plan.var_dims, strict=True):
            shape = tuple(plan.specs[plan.axis(d)].size for d in vdims if d in plan.window_dims)
            cells.append(stand_in(shape, x.dtype))
        for c, d in zip(coords, plan.coord_dims, strict=True):
            cells.append(stand_in((plan.specs[plan.axis(d)].size,), c.dtype))
        outs = [_traced(job, static, k, cells, dyn) for k in range(len(job.kernels))]
        last = outs[-1]
        if job.regions is None:
            return last
        # a mesh writes every kernel's results, and the kept input where no region
        # covers a position, into one array: their promoted dtype
        calls = [job.hooks.caller(plan, k, static) for k in job.kernels]
        outs = [jax.tree_util.tree_leaves(o) for o in outs]
        if not covered(job.regions or (), job.masks, tuple(job.plan.out_shape)):
            outs.append(jax.tree_util.tree_leaves(jax.eval_shape(
                job.hooks.identity(plan, calls[-1]), cells, list(dyn))))
        leaves, tree = jax.tree_util.tree_flatten(last)
        return jax.tree_util.tree_unflatten(tree, [
            stand_in(v.shape, promote(*[o[k].dtype for o in outs]))
            for k, v in enumerate(leaves)])


def _traced(job: MapJob, static: Any, k: int, cells: Any, dyn: Sequence[Any]) -> Any:
    """The output structure of kernel ``k``, traced with the arrays it closes
    over abstract, as an in-memory map traces them (they are inputs of its
    compiled code): a kernel that needs one concrete (``float(w[0])``) fails
    here as it fails in memory, not only on dask, where blocks bake them in."""
    lifted = describe(job.kernels)

    def one(cells: Any, dyn: Any, leaves: Any) -> Any:
        return job.hooks.caller(job.plan, rebuild(lifted, leaves)[k], static)(cells, dyn)

    return jax.eval_shape(one, cells, list(dyn), list(lifted.leaves))


def map_dask(job: MapJob) -> Any:
    """A lazy map (or mesh map) of dask-backed fields: the engine output as
    dask arrays (a dict of them for a Dataset kernel returning a dict)."""
    import dask.array as dsa

    job.check_full("with dask-backed data")
    # the graph is computed later: it reads the closed-over arrays as they are now
    job = replace(job, kernels=snapshot(job.kernels))
    plan, kernels, regions, masks = job.plan, job.kernels, job.regions, job.masks
    arrays = [x if is_dask(x) else dsa.from_array(np.asarray(x)) for x in job.arrays]
    if len(arrays) > 1:
        arrays = list(dsa.core.unify_chunks(
            *[a for x in arrays for a in (x, tuple(range(x.ndim)))], warn=False)[1])
    chunks = arrays[0].chunks
    axes = _axes(plan, chunks)
    dyn, static = split_static(plan.call, (job.args, job.kwargs))
    dyn = tuple(np.asarray(x) for x in dyn)
    coords = _coords(job, axes)
    shapes = _leaf_shapes(job, static, dyn, arrays, coords)
    leaves, treedef = jax.tree_util.tree_flatten(shapes)
    stacked = len(leaves) > 1
    packed = stacked and len({np.dtype(v.dtype) for v in leaves}) > 1
    nfield = len(plan.dims)
    out_chunks = tuple(tuple(b - a for a, b in ax.out) for ax in axes)
    widths = [math.prod(v.shape) for v in leaves]
    extra: tuple[tuple[int, ...], ...]
    if packed:
        widths = [w * byte_width(np.dtype(v.dtype)) for w, v in zip(widths, leaves, strict=True)]
        dtype = np.dtype(np.uint8)
        extra = ((sum(widths),),)
    elif stacked:
        dtype = np.result_type(*[v.dtype for v in leaves])
        extra = ((sum(widths),),)
    else:
        dtype = np.dtype(leaves[0].dtype)
        extra = tuple((n,) for n in leaves[0].shape)
    # the backend in effect is part of the name: a graph on the loops and one on XLA
    # (whose floats may differ in the last bits) never share task keys
    tok = token(plan.call, "xstencil-map", tuple(kernels), plan, static,
                tuple(regions or ()), [x.name for x in arrays], dyn, coords,
                resolve_mode(job.backend))
    code = token(plan.call, "xstencil-map-code", tuple(kernels), plan, static,
                 tuple(regions or ()), [str(x.dtype) for x in arrays], avals(dyn),
                 avals(coords), resolve_mode(job.backend))
    fn = BlockMap(tok, plan, job.hooks, tuple(kernels),
                  None if regions is None else tuple(regions), static, dyn, coords,
                  tuple(axes), len(arrays), stacked, packed,
                  None if regions is None else tuple(str(v.dtype) for v in leaves),
                  job.backend,
                  str(leaves[0].dtype) if regions is None and not stacked
                  and leaves[0].shape == () else None,
                  all(v.shape == () for v in leaves), code)
    depth = tuple(ax.depth for ax in axes)
    inputs = [Overlap(x, depth) for x in arrays] + [
        Overlap(dsa.from_array(np.asarray(m), chunks=out_chunks), (0,) * nfield)
        for m in masks]
    periodic = [s.mode == "periodic" for s in plan.specs]
    out = halo_array(f"xstencil-map-{tok}", fn, inputs, periodic, out_chunks + extra,
                     dtype, np.empty((0,) * (nfield + len(extra)), dtype=dtype))
    if not stacked:
        return jax.tree_util.tree_unflatten(treedef, [out])
    parts, k = [], 0
    for v, w in zip(leaves, widths, strict=True):
        if packed:
            parts.append(unpack(out[(slice(None),) * nfield + (slice(k, k + w),)],
                                np.dtype(v.dtype), tuple(v.shape), nfield))
            k += w
            continue
        if v.shape == ():
            part = out[(slice(None),) * nfield + (k,)]
        else:
            part = out[(slice(None),) * nfield + (slice(k, k + w),)]
            part = part.reshape(part.shape[:nfield] + v.shape)
        parts.append(part.astype(v.dtype))
        k += w
    return jax.tree_util.tree_unflatten(treedef, parts)

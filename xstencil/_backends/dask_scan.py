"""dask arrays: lazy scans, K steps of one chunk per task.

:func:`scan_dask` builds one layer of tasks per ``halo_every`` (K) steps
(:func:`~xstencil._backends.dask_halo.halo_array`: per chunk one strip task
per split dim and side, and one task that advances its chunk K steps with
the shared block scan of :mod:`xstencil._backends.halo`).  Every block has a
full halo; on a global edge of a non-periodic dim it is rebuilt after each
step from the block's own cells (as the sharded scan's edge devices do), from
flags given at run time, and the step count is a run-time input too, so a
worker compiles one block program per chunk shape, whatever the chunk's
position or the segment's length.  The jitted task functions use the
per-process compile cache of :mod:`xstencil._backends.dask_base`.  The
labelled front end is :func:`xstencil._labelled.scale.scan_dask`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from xstencil._backends.blockmesh import BlockMesh, local_regions
from xstencil._backends.dask_base import cached, is_dask, merged, note_trace, token
from xstencil._backends.dask_halo import Overlap, assemble, halo_array
from xstencil._backends.dask_loops import join_host
from xstencil._backends.edges import repad as halo_repad
from xstencil._backends.halo import (
    Block,
    BlockJob,
    ScanSpec,
    Stepper,
    padded_coords,
    run_steps,
    segments,
    time_padded,
)
from xstencil._backends.jobs import Hooks
from xstencil._engine.call import avals, precision
from xstencil._engine.kcache import snapshot
from xstencil._errors import XStencilError

__all__ = ["BlockScan", "default_halo_every", "scan_dask"]


@dataclass(frozen=True, eq=False)
class BlockScan:
    """One dask task of a scan: ``n`` steps of one chunk with a deep halo."""

    token: str
    spec: ScanSpec
    hooks: Hooks
    kernels: tuple[Callable[..., Any], ...]  # one, or one per region of ``mesh``
    mesh: BlockMesh | None
    static: Any
    dyn: tuple[Any, ...]
    coords: tuple[np.ndarray, ...]  # padded by width[axis]
    periods: tuple[float | None, ...]  # per coordinate, where its axis is periodic
    width: tuple[tuple[int, int], ...]
    depth: tuple[int, ...]  # per axis, 0 where the axis is not split
    periodic: tuple[bool, ...]
    starts: tuple[tuple[int, ...], ...]
    t: int  # the first position computed
    n: int  # steps (a run-time input: every segment shares the compiled code)
    has_input: bool
    nforce: int  # variables read along dim but not advanced: rows j * F + f
    nmask: int
    evolving: tuple[str, ...]  # the advanced variables: rows j * V + v of the state
    forced: tuple[str, ...]
    finite: Callable[[int, str], Exception] | None  # check_finite's error, or None
    tcoord: np.ndarray | None  # dim's coordinate padded by (k, ahead), if the kernel reads it
    # the labelled layer's loop scan of a block (dask_loop_scan.py): (state rows,
    # constants, n, a mesh's regions over the block or None) -> the last state's rows,
    # or None where the loops do not apply
    loops: Callable[..., np.ndarray | None] | None = None
    # the compile cache's key: ``token`` less what the task gets as arguments (the
    # data's graph name, argument and coordinate values), as for maps (dask.py)
    code: str = ""

    def __call__(self, loc: tuple[int, ...], edges: np.ndarray, pieces: list[Any]
                 ) -> np.ndarray:
        """One block: ``pieces`` per input (state, input, forcing, masks,
        constants) from :func:`~xstencil._backends.dask_halo.halo_array`."""
        own = [_own(p) for p in pieces]
        if self._loops_apply(pieces):
            res = self._on_loops(loc, edges, pieces, own[0].shape)
            if res is not None:
                return res
        shape = (own[0].shape[0],) + tuple(
            n + 2 * d for n, d in zip(own[0].shape[1:], self.depth[1:], strict=True))
        spec = self.spec
        # every block has a full halo (rebuilt on global edges): one shape per chunk shape
        cores = [(self.depth[a], own[0].shape[a]) for a in range(1, len(shape))]
        coords = []
        for d, cc in zip(spec.space_coords, self.coords, strict=True):
            a = spec.plan.axis(d)
            s = spec.plan.specs[a]
            first = self.starts[a][loc[a]] - cores[a - 1][0] - s.pad_lo + self.width[a][0]
            coords.append(cc[first:first + shape[a] + s.pad_lo + s.pad_hi])
        # the global index of the block's first cell, halo included, per spatial axis
        origin = np.array([self.starts[a][loc[a]] - cores[a - 1][0]
                           for a in range(1, len(shape))], np.int32)
        key = (self.code or self.token, tuple(
            (x.shape, str(x.dtype)) for x in jax.tree_util.tree_leaves(pieces)), tuple(cores))
        fn = cached(key, lambda: self._build(tuple(cores)))
        with precision([own[0]], self.dyn):
            out, bad = fn(pieces, edges, coords, list(self.dyn), np.int32(self.t),
                          np.int32(self.n), origin, self.tcoord)
        if self.finite is not None and int(bad) >= 0:
            first = ", ".join(f"{d}[{self.starts[a][loc[a]]}:{self._end(a, loc[a])}]"
                              for a, d in enumerate(spec.plan.dims)
                              if a and len(self.starts[a]) > 1)
            raise self.finite(int(bad), f" in the chunk at {first}" if first else "")
        return np.asarray(out)

    def _end(self, a: int, k: int) -> int:
        """The stop of chunk ``k`` along axis ``a`` (the next chunk's start)."""
        starts = self.starts[a]
        return starts[k + 1] if k + 1 < len(starts) else int(self.spec.plan.shape[a])

    def _loops_apply(self, pieces: list[Any]) -> bool:
        """Whether the task may run the loop scan: one initial position, no
        input, forcing or finiteness check, masks only as a function mesh's
        regions (and that mesh one the loops take: no mask varying along the
        scanned dim), numpy pieces (the state, masks and a Dataset's
        constants; the loop scan itself declines a kernel that reads other
        positions or coordinates)."""
        if self.loops is None or self.spec.k != 1 or self.finite is not None \
                or self.has_input or self.nforce:
            return False
        if self.mesh is None:
            if self.nmask:
                return False
        elif any(self.mesh.timed):
            return False
        return all(type(x) is np.ndarray for x in jax.tree_util.tree_leaves(pieces))

    def _on_loops(self, loc: tuple[int, ...], edges: np.ndarray, pieces: list[Any],
                  own: tuple[int, ...]) -> np.ndarray | None:
        """The task on the loop backend (:mod:`xstencil._labelled.dask_loop_scan`):
        each piece joined with its halo, less the halo on the global edges of
        non-periodic dims (there the loop scan's boundary mode is the true
        one), scanned ``n`` steps (a function mesh with its regions over the
        block: :func:`~xstencil._backends.blockmesh.local_regions`); the
        state's own cells, or ``None``."""
        core, origin = [slice(None)], []
        for a in range(1, len(self.depth)):
            d = self.depth[a]
            lo = d * bool(edges[a, 0])  # flags: non-periodic only
            core.append(slice(d - lo, d - lo + own[a]))
            origin.append(self.starts[a][loc[a]] - (d - lo))
        none = (None,) * len(self.depth)
        # the halo pieces on those global edges are left out before the join: one copy
        state, *rest = [join_host(_cut(p, self.depth, edges), self.depth, none, 0, edges)
                        for p in pieces]
        masks, consts = rest[:self.nmask], rest[self.nmask:]
        regions = None
        if self.mesh is not None:
            regions = local_regions(self.mesh, origin, state.shape[1:], [m[0] for m in masks])
            if regions is None:
                return None
        assert self.loops is not None
        last = self.loops(state, [c[0] for c in consts], self.n, regions)
        if last is None:
            return None
        return last[tuple(core)]

    def _build(self, cores: tuple[tuple[int, int], ...]) -> Callable[..., Any]:
        spec, static, depth = self.spec, self.static, self.depth
        plan = spec.plan
        # split dims: "extend" stands for the halo's far side (wrong cells creep inward,
        # never reaching the block's own); their global edges are rebuilt after each step
        modes = tuple("extend" if depth[a] else s.mode
                      for a, s in enumerate(plan.specs) if a > 0)
        edge_modes = (None,) + tuple(None if not depth[a] or self.periodic[a] else s.mode
                                     for a, s in enumerate(plan.specs) if a > 0)
        fill = 0 if plan.fill_value is None else plan.fill_value
        V = len(self.evolving)
        own = tuple(slice(a, a + m) for a, m in cores)
        nin = 1 + self.has_input + bool(self.nforce)

        def run(pieces: Any, edges: Any, coords: Any, dyn: Any, t: Any, n: Any, origin: Any,
                tcoord: Any) -> Any:
            note_trace()

            def repad(x: Any) -> Any:  # x: one new slab (*space)
                for a, m in enumerate(edge_modes[1:], 1):
                    if m is not None:
                        x = halo_repad(x, a - 1, depth[a], depth[a], m, fill, edges[a, 0],
                                       edges[a, 1])
                return x

            ext = [assemble(p, depth, edge_modes, fill, edges) for p in pieces[:nin]]
            masks = [jnp.block(m) for m in pieces[nin:nin + self.nmask]]
            consts = [assemble(p, depth, edge_modes, fill, edges)[0]
                      for p in pieces[nin + self.nmask:]]
            hist = ext[0]
            inp = ext[1] if self.has_input else None
            forcing = ext[-1] if self.nforce else None
            stepper = Stepper(spec, self.hooks, self.kernels, static, modes, self.evolving,
                              self.forced, self.mesh, self.periods,
                              own if self.finite is not None else None,
                              repad if any(m is not None for m in edge_modes) else None)
            hist = hist.reshape((spec.k, V) + hist.shape[1:])
            if inp is not None:
                inp = inp.reshape((-1, V) + inp.shape[1:])
            if forcing is not None:
                forcing = forcing.reshape((-1, self.nforce) + forcing.shape[1:])
            new, bad = run_steps(stepper, n, Block(
                tuple(hist[j] for j in range(spec.k)), inp, coords, dyn, (t, list(origin)),
                masks, consts, tcoord, forcing))
            new = jnp.concatenate(new)  # (k * V, *block)
            return new[(slice(None),) + own], bad

        return jax.jit(run)


def _cut(pieces: Any, depth: Sequence[int], edges: np.ndarray, axis: int = 0) -> Any:
    """A block's nested pieces (one list level per axis: low halo, own chunk,
    high halo where ``depth`` splits the axis) without the halo pieces on the
    sides ``edges`` flags (global edges of non-periodic dims)."""
    if not isinstance(pieces, list):
        return pieces
    if axis and depth[axis]:
        assert len(pieces) == 3, len(pieces)
        pieces = pieces[int(bool(edges[axis, 0])):3 - int(bool(edges[axis, 1]))]
    return [_cut(p, depth, edges, axis + 1) for p in pieces]


def _own(pieces: Any) -> np.ndarray:
    """A block's own chunk among its pieces (the centre of the nested list)."""
    while isinstance(pieces, list):
        pieces = pieces[len(pieces) // 2]
    return pieces


def _interleave(fields: list[Any]) -> Any:
    """Fields ``(n, *space)`` as one dask array ``(n * len(fields), *space)``
    whose row ``j * len(fields) + v`` is row ``j`` of field ``v``, with one
    chunk along that axis."""
    import dask.array as dsa

    if len(fields) == 1:
        return fields[0].rechunk({0: -1})
    x = dsa.stack([f.rechunk({0: -1}) for f in fields], axis=1)
    return x.reshape((-1,) + fields[0].shape[1:], merge_chunks=True).rechunk({0: -1})


def default_halo_every(reach: int, chunks: Sequence[int], steps: int) -> int:
    """K such that the halo (K times the reach) is at most an eighth of the
    smallest chunk, capped at 32 steps and the steps between saves."""
    if not reach:
        return max(1, min(32, steps))
    return max(1, min(32, steps, min(chunks) // (8 * reach)))


def _check_chunks(call: str, plan: Any, chunks: Any, split: Sequence[int],
                  depth: Sequence[int], K: int) -> None:
    for a in split:
        if min(chunks[a]) < depth[a]:
            raise XStencilError(
                f"{call}: dim {plan.dims[a]!r} has a chunk of {min(chunks[a])} points, smaller "
                f"than the halo of {depth[a]} that halo_every={K} steps need; use a smaller "
                f"halo_every or larger chunks, e.g. .chunk({{{plan.dims[a]!r}: "
                f"{merged(tuple(chunks[a]), depth[a])!r}}})")


def _as_dask(x: Any, chunks: Any = None) -> Any:
    import dask.array as dsa

    x = x if is_dask(x) else dsa.from_array(np.asarray(x))
    return x if chunks is None else x.rechunk(chunks)


def scan_dask(job: BlockJob, halo_every: int | None = None,
              loops: Callable[[np.ndarray, list[np.ndarray], int], np.ndarray | None]
              | None = None) -> list[Any]:
    """Scan the fields of ``job`` lazily: the saved trajectory (or last state)
    of each advanced variable, as dask arrays with dim first.

    ``dim`` must be a single chunk; the other dims may be chunked.  Each task
    advances one chunk by ``halo_every`` (K) steps, reading a halo K times the
    window's reach deep from its neighbours, so the graph has one layer of
    tasks per K steps.  ``halo_every`` defaults to the largest K (at most
    32) whose halo is at most an eighth of the smallest split chunk.
    ``loops(state, consts, n)``, if given, runs a task on the CPU loop
    backend where it applies (see :class:`BlockScan`).
    """
    import dask.array as dsa

    # the graph is computed later: it reads the closed-over arrays as they are now
    job = replace(job, kernels=snapshot(job.kernels))
    call, spec = job.call, job.spec
    plan = spec.plan
    bmesh, masks = job.mesh, job.masks
    # the advanced variables interleaved along dim: row j * V + v is position j of variable v
    V = len(job.evolving)
    fields = [_as_dask(d) for d in job.datas]
    fields = [fields[0]] + [f.rechunk(fields[0].chunks) for f in fields[1:]]
    data = _interleave(fields)
    chunks = fields[0].chunks
    reach_of = [max(s.lo, s.hi) for s in plan.specs]
    split = [a for a in range(1, data.ndim) if len(chunks[a]) > 1 and reach_of[a]]
    reach = max([reach_of[a] for a in split], default=0)
    K = default_halo_every(reach, [c for a in split for c in chunks[a]], spec.steps_per_save) \
        if halo_every is None else int(halo_every)
    if K < 1:
        raise XStencilError(f"{call}: halo_every={halo_every!r} must be an int >= 1")
    depth = tuple(K * reach_of[a] if a in split else 0 for a in range(data.ndim))
    _check_chunks(call, plan, chunks, split, depth, K)
    periodic = tuple(s.mode == "periodic" for s in plan.specs)
    width = tuple((depth[a] + s.pad_lo, depth[a] + s.pad_hi) for a, s in enumerate(plan.specs))
    coords, periods = padded_coords(job, width)
    starts = tuple(tuple(int(v) for v in np.cumsum((0,) + tuple(c))[:-1]) for c in chunks)
    dyn = tuple(np.asarray(x) for x in job.dyn)
    # the route is part of the name, as for maps (dask.py): loops and XLA graphs never
    # share task keys
    tok = token(call, "xstencil-scan", job.kernels, bmesh, masks, spec, job.static, dyn,
                tuple(coords), depth, data.name, job.evolving, job.finite is not None,
                None if loops is None else getattr(loops, "route", "loops"))
    code = token(call, "xstencil-scan-code", job.kernels, bmesh, avals(masks), spec,
                 job.static, avals(dyn), avals(coords), periods, depth, str(data.dtype),
                 job.evolving, job.finite is not None,
                 None if loops is None else getattr(loops, "route", "loops"))
    state = data[:spec.k * V].rechunk({0: -1})
    inp = None if spec.grown else _interleave([time_padded(spec, f) for f in fields])
    F = len(job.forced)
    forcing = None if not F else _interleave([time_padded(spec, _as_dask(f, chunks))
                                              for f in job.forcings])
    dmasks = [dsa.from_array(m, chunks=((m.shape[0],),) + tuple(chunks[1:])) for m in masks]
    dconsts = [_as_dask(c, chunks[1:])[None] for c in job.consts]
    saved = []
    for t, n, save in segments(spec, K):
        fn = BlockScan(tok, spec, job.hooks, job.kernels, bmesh, job.static, dyn,
                       tuple(coords), periods, width, depth, periodic, starts, t, n,
                       inp is not None, F, len(dmasks), job.evolving, job.forced, job.finite,
                       job.tcoord, loops, code)
        # every segment reads K steps of input (zeros past the end): one block shape
        ins = [Overlap(state, depth)]
        if inp is not None:
            ins.append(Overlap(inp, depth, (t * V, (t + K + spec.ahead) * V)))
        if forcing is not None:  # positions [t - k, t + K + ahead)
            ins.append(Overlap(forcing, depth, ((t - spec.k) * F, (t + K + spec.ahead) * F)))
        ins += [Overlap(m, depth, (t, t + K) if timed else None)
                for m, timed in zip(dmasks, bmesh.timed if bmesh else (), strict=True)]
        ins += [Overlap(c, depth) for c in dconsts]
        state = halo_array(f"xstencil-scan-{t}-{tok}", fn, ins, periodic, state.chunks,
                           data.dtype, np.empty((0,) * data.ndim, dtype=data.dtype))
        if save:
            saved.append(state[-V:])
    if spec.every == 0:
        return [state[-V + v] for v in range(V)]
    traj = dsa.concatenate([data[:spec.k * V]] + saved, axis=0)
    return [traj[v::V] for v in range(V)]

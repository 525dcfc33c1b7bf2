"""dask arrays: lazy scans, K steps of one chunk per task.

:func:`scan_dask` builds one layer of :func:`dask.array.map_overlap` tasks
per ``halo_every`` (K) steps; each task advances its chunk K steps with the
shared block scan of :mod:`xstencil._backends.halo`.  The jitted task functions
use the per-process compile cache of :mod:`xstencil._backends.dask`.  The
labelled front end is :func:`xstencil._labelled.scale.scan_dask`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from xstencil._backends.blockmesh import BlockMesh
from xstencil._backends.dask import _cached, _merged, _token, _traces, is_dask
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
from xstencil._engine.call import precision
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
    n: int
    has_input: bool
    nforce: int  # variables read along dim but not advanced: rows j * F + f
    nmask: int
    evolving: tuple[str, ...]  # the advanced variables: rows j * V + v of the state
    forced: tuple[str, ...]
    finite: Callable[[int, str], Exception] | None  # check_finite's error, or None
    tcoord: np.ndarray | None  # dim's coordinate padded by (k, ahead), if the kernel reads it

    def __call__(self, hist: Any, *others: Any, block_info: Any = None) -> np.ndarray:
        rest = list(others)
        inp = rest.pop(0) if self.has_input else None
        forcing = rest.pop(0) if self.nforce else None
        masks, consts = rest[:self.nmask], [c[0] for c in rest[self.nmask:]]
        loc = block_info[0]["chunk-location"]
        spec = self.spec
        cores = []
        for a in range(1, hist.ndim):
            dep, c, nch = self.depth[a], loc[a], len(self.starts[a])
            left = dep if dep and (self.periodic[a] or c > 0) else 0
            right = dep if dep and (self.periodic[a] or c < nch - 1) else 0
            cores.append((left, hist.shape[a] - left - right))
        coords = []
        for d, cc in zip(spec.space_coords, self.coords, strict=True):
            a = spec.plan.axis(d)
            s = spec.plan.specs[a]
            first = self.starts[a][loc[a]] - cores[a - 1][0] - s.pad_lo + self.width[a][0]
            coords.append(cc[first:first + hist.shape[a] + s.pad_lo + s.pad_hi])
        # the global index of the block's first cell, halo included, per spatial axis
        origin = np.array([self.starts[a][loc[a]] - cores[a - 1][0]
                           for a in range(1, hist.ndim)], np.int32)
        key = (self.token, self.n, hist.shape, None if inp is None else inp.shape,
               str(hist.dtype), tuple(cores), tuple(m.shape for m in masks))
        fn = _cached(key, lambda: self._build(tuple(cores), inp is None))
        with precision([hist], self.dyn):
            out, bad = fn(hist, inp, coords, list(self.dyn), np.int32(self.t), origin, masks,
                          consts, self.tcoord, forcing)
        if self.finite is not None and int(bad) >= 0:
            first = ", ".join(f"{d}[{self.starts[a][loc[a]]}:]" for a, d in
                              enumerate(spec.plan.dims) if a and len(self.starts[a]) > 1)
            raise self.finite(int(bad), f" in the chunk at {first}" if first else "")
        return np.asarray(out)

    def _build(self, cores: tuple[tuple[int, int], ...], grown: bool) -> Callable[..., Any]:
        spec, static, n = self.spec, self.static, self.n
        modes = tuple("extend" if self.depth[a] and self.periodic[a] else s.mode
                      for a, s in enumerate(spec.plan.specs) if a > 0)

        V = len(self.evolving)
        own = tuple(slice(a, a + m) for a, m in cores)
        stepper = Stepper(spec, self.hooks, self.kernels, static, modes, self.evolving,
                          self.forced, self.mesh, self.periods,
                          own if self.finite is not None else None)

        def run(hist: Any, inp: Any, coords: Any, dyn: Any, t: Any, origin: Any,
                masks: Any, consts: Any, tcoord: Any, forcing: Any) -> Any:
            _traces[0] += 1
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
                f"{_merged(tuple(chunks[a]), depth[a])!r}}})")


def _as_dask(x: Any, chunks: Any = None) -> Any:
    import dask.array as dsa

    x = x if is_dask(x) else dsa.from_array(np.asarray(x))
    return x if chunks is None else x.rechunk(chunks)


def scan_dask(job: BlockJob, halo_every: int | None = None) -> list[Any]:
    """Scan the fields of ``job`` lazily: the saved trajectory (or last state)
    of each advanced variable, as dask arrays with dim first.

    ``dim`` must be a single chunk; the other dims may be chunked.  Each task
    advances one chunk by ``halo_every`` (K) steps, reading a halo K times the
    window's reach deep from its neighbours, so the graph has one layer of
    tasks per K steps.  ``halo_every`` defaults to the largest K (at most
    32) whose halo is at most an eighth of the smallest split chunk.
    """
    import dask.array as dsa

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
    token = _token(call, "xstencil-scan", job.kernels, bmesh, masks, spec, job.static, dyn,
                   tuple(coords), depth, data.name, job.evolving, job.finite is not None)
    boundary = {a: "periodic" if periodic[a] and depth[a] else "none"
                for a in range(data.ndim)}
    dd = {a: depth[a] for a in range(data.ndim)}
    state = data[:spec.k * V].rechunk({0: -1})
    inp = None if spec.grown else _interleave([time_padded(spec, f) for f in fields])
    F = len(job.forced)
    forcing = None if not F else _interleave([time_padded(spec, _as_dask(f, chunks))
                                              for f in job.forcings])
    dmasks = [dsa.from_array(m, chunks=((m.shape[0],),) + tuple(chunks[1:])) for m in masks]
    dconsts = [_as_dask(c, chunks[1:])[None] for c in job.consts]
    saved = []
    for t, n, save in segments(spec, K):
        fn = BlockScan(token, spec, job.hooks, job.kernels, bmesh, job.static, dyn,
                       tuple(coords), periods, width, depth, periodic, starts, t, n,
                       inp is not None, F, len(dmasks), job.evolving, job.forced, job.finite,
                       job.tcoord)
        margs = [state] if inp is None else [state, inp[t * V:(t + n + spec.ahead) * V]]
        if forcing is not None:  # positions [t - k, t + n + ahead)
            margs.append(forcing[(t - spec.k) * F:(t + n + spec.ahead) * F])
        margs += [m[t:t + n] if timed else m
                  for m, timed in zip(dmasks, bmesh.timed if bmesh else (), strict=True)]
        margs += dconsts
        state = dsa.map_overlap(
            fn, *margs, depth=[dd] * len(margs), boundary=[boundary] * len(margs),
            trim=False, align_arrays=False, allow_rechunk=False, chunks=state.chunks,
            dtype=data.dtype, meta=np.empty((0,) * data.ndim, dtype=data.dtype),
            name=f"xstencil-scan-{t}-{token}")
        if save:
            saved.append(state[-V:])
    if spec.every == 0:
        return [state[-V + v] for v in range(V)]
    traj = dsa.concatenate([data[:spec.k * V]] + saved, axis=0)
    return [traj[v::V] for v in range(V)]

"""dask-backed DataArrays: lazy scans, K steps of one chunk per task.

:func:`scan_dask` builds one layer of :func:`dask.array.map_overlap` tasks
per ``halo_every`` (K) steps; each task advances its chunk K steps with the
shared block scan of :mod:`xstencil._blockscan`.  The jitted task functions
use the per-process compile cache of :mod:`xstencil._dask`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from xstencil._blockmesh import block_mesh
from xstencil._dask import _cached, _merged, _token, _traces, is_dask
from xstencil._engine.call import precision
from xstencil._errors import XStencilError

__all__ = ["BlockScan", "default_halo_every", "scan_dask"]


@dataclass(frozen=True, eq=False)
class BlockScan:
    """One dask task of a scan: ``n`` steps of one chunk with a deep halo."""

    token: str
    spec: Any  # xstencil._blockscan.ScanSpec
    kernels: tuple[Callable[..., Any], ...]  # one, or one per region of ``mesh``
    mesh: Any  # xstencil._blockmesh.BlockMesh, or None
    static: Any
    dyn: tuple[Any, ...]
    coords: tuple[np.ndarray, ...]  # padded by width[axis]
    width: tuple[tuple[int, int], ...]
    depth: tuple[int, ...]  # per axis, 0 where the axis is not split
    periodic: tuple[bool, ...]
    starts: tuple[tuple[int, ...], ...]
    t: int  # the first position computed
    n: int
    has_input: bool

    def __call__(self, hist: Any, *others: Any, block_info: Any = None) -> np.ndarray:
        inp = others[0] if self.has_input else None
        masks = list(others[1:] if self.has_input else others)
        loc = block_info[0]["chunk-location"]
        spec = self.spec
        cores = []
        for a in range(1, hist.ndim):
            dep, c, nch = self.depth[a], loc[a], len(self.starts[a])
            left = dep if dep and (self.periodic[a] or c > 0) else 0
            right = dep if dep and (self.periodic[a] or c < nch - 1) else 0
            cores.append((left, hist.shape[a] - left - right))
        coords = []
        for d, cc in zip(spec.plan.coord_dims, self.coords, strict=True):
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
            out = fn(hist, inp, coords, list(self.dyn), np.int32(self.t), origin, masks)
        return np.asarray(out)

    def _build(self, cores: tuple[tuple[int, int], ...], grown: bool) -> Callable[..., Any]:
        from xstencil._blockscan import run_steps

        spec, static, n = self.spec, self.static, self.n
        modes = tuple("extend" if self.depth[a] and self.periodic[a] else s.mode
                      for a, s in enumerate(spec.plan.specs) if a > 0)

        def run(hist: Any, inp: Any, coords: Any, dyn: Any, t: Any, origin: Any,
                masks: Any) -> Any:
            _traces[0] += 1
            new = run_steps(spec, self.kernels, static, n,
                            tuple(hist[j] for j in range(spec.k)), inp, coords, dyn, modes,
                            mesh=self.mesh, where=(t, list(origin)), masks=masks)
            idx = (slice(None),) + tuple(slice(a, a + m) for a, m in cores)
            return jnp.stack(new)[idx]

        return jax.jit(run)


def default_halo_every(reach: int, chunks: Sequence[int], steps: int) -> int:
    """K such that the halo (K times the reach) is at most an eighth of the
    smallest chunk, capped at 32 steps and the steps between saves."""
    if not reach:
        return max(1, min(32, steps))
    return max(1, min(32, steps, min(chunks) // (8 * reach)))


def scan_dask(obj: Any, kernel: Callable[..., Any] | None, dim: str = "time", *args: Any,
              halo_every: int | None = None, function_mesh: Any = None, **kwargs: Any) -> Any:
    """Scan a kernel along ``dim`` over a dask-backed DataArray, lazily.

    ``dim`` must be a single chunk; the other dims may be chunked.  Each task
    advances one chunk by ``halo_every`` (K) steps, reading a halo K times the
    window's reach deep from its neighbours, so the graph has one layer of
    tasks per K steps.  The result equals the in-memory :func:`xstencil.scan`.

    Parameters
    ----------
    obj
        A dask-backed DataArray: the initial state (with ``steps=N``) or the
        trajectory, as for :func:`xstencil.scan`.
    kernel, dim, *args
        As for :func:`xstencil.scan`.
    halo_every
        Steps per task (K).  Defaults to the largest K (at most 32) whose
        halo is at most an eighth of the smallest split chunk.
    function_mesh
        A :class:`~xstencil.Mesh` over ``obj`` (``kernel`` is then
        ``None``): its kernels on its regions, as ``mesh.scan(dim)`` does
        in memory.
    **kwargs
        ``window``, ``boundary``, ``fill_value``, ``steps``, ``dt``,
        ``coord``, ``save_every`` and ``period`` as for :func:`xstencil.scan`;
        other keywords go to the kernel.

    Returns
    -------
    DataArray
        Backed by a lazy dask array, one chunk per saved position along
        ``dim`` and the input's chunks along the other dims.

    Examples
    --------
    >>> import numpy as np, xarray as xr, xstencil
    >>> from xstencil._dask_scan import scan_dask
    >>> u0 = xr.DataArray(np.eye(8)[0], dims="x").chunk({"x": 4})
    >>> heat = lambda u: u(time=-1) + 0.25 * (u(time=-1, x=1) - 2 * u(time=-1)
    ...                                       + u(time=-1, x=-1))
    >>> out = scan_dask(u0, heat, "time", steps=2, boundary="periodic", halo_every=2)
    >>> out.chunks
    ((1, 1, 1), (4, 4))
    >>> out.isel(time=1).values
    array([0.5 , 0.25, 0.  , 0.  , 0.  , 0.  , 0.  , 0.25])
    """
    import dask.array as dsa

    from xstencil._blockscan import padded_coords, rewrap, segments, setup, time_padded
    from xstencil._shard import split_options

    call = "da.stencil.scan(...)"
    opts, kw = split_options(kwargs)
    if isinstance(obj, Mapping) or not hasattr(obj, "dims"):
        raise XStencilError(f"{call}: expected a DataArray, got {type(obj).__name__}")
    if dim in obj.dims and is_dask(obj.data) and len(obj.chunks[obj.get_axis_num(dim)]) > 1:
        raise XStencilError(
            f"{call}: the data is chunked along the scanned dim {dim!r} "
            f"({len(obj.chunks[obj.get_axis_num(dim)])} chunks); positions along it are "
            f"computed in order, so it must be one chunk: rechunk with "
            f".chunk({{{dim!r}: -1}}) and chunk the other dims instead")
    kernels = (kernel,) if function_mesh is None else tuple(k for _, k in function_mesh._regions)
    prep = setup(call, obj, kernels, dim, args, kw, **opts)
    spec = prep.spec
    plan = spec.plan
    bmesh, masks = (None, []) if function_mesh is None else block_mesh(
        function_mesh, plan, dim, spec.total)
    data = prep.data if is_dask(prep.data) else dsa.from_array(np.asarray(prep.data))
    chunks = data.chunks
    split = [a for a in range(1, data.ndim) if len(chunks[a]) > 1
             and max(plan.specs[a].lo, plan.specs[a].hi)]
    reach = max([max(plan.specs[a].lo, plan.specs[a].hi) for a in split], default=0)
    K = default_halo_every(reach, [c for a in split for c in chunks[a]], spec.steps_per_save) \
        if halo_every is None else int(halo_every)
    if K < 1:
        raise XStencilError(f"{call}: halo_every={halo_every!r} must be an int >= 1")
    depth = tuple(K * max(plan.specs[a].lo, plan.specs[a].hi) if a in split else 0
                  for a in range(data.ndim))
    for a in split:
        if min(chunks[a]) < depth[a]:
            raise XStencilError(
                f"{call}: dim {plan.dims[a]!r} has a chunk of {min(chunks[a])} points, smaller "
                f"than the halo of {depth[a]} that halo_every={K} steps need; use a smaller "
                f"halo_every or larger chunks, e.g. .chunk({{{plan.dims[a]!r}: "
                f"{_merged(tuple(chunks[a]), depth[a])!r}}})")
    periodic = tuple(s.mode == "periodic" for s in plan.specs)
    width = tuple((depth[a] + s.pad_lo, depth[a] + s.pad_hi) for a, s in enumerate(plan.specs))
    coords = tuple(padded_coords(spec, prep.obj, width, opts.get("period")))
    starts = tuple(tuple(int(v) for v in np.cumsum((0,) + tuple(c))[:-1]) for c in chunks)
    dyn = tuple(np.asarray(x) for x in prep.dyn)
    token = _token("xstencil-scan", kernels, bmesh, masks, spec, prep.static, dyn, coords,
                   depth, data.name)
    boundary = {a: "periodic" if periodic[a] and depth[a] else "none"
                for a in range(data.ndim)}
    dd = {a: depth[a] for a in range(data.ndim)}
    state = data[:spec.k].rechunk({0: -1})
    inp = None if spec.grown else time_padded(spec, data).rechunk({0: -1})
    dmasks = [dsa.from_array(m, chunks=((m.shape[0],),) + tuple(chunks[1:])) for m in masks]
    saved = []
    for t, n, save in segments(spec, K):
        fn = BlockScan(token, spec, kernels, bmesh, prep.static, dyn, coords, width, depth,
                       periodic, starts, t, n, inp is not None)
        margs = [state] if inp is None else [state, inp[t:t + n + spec.ahead]]
        margs += [m[t:t + n] if timed else m
                  for m, timed in zip(dmasks, bmesh.timed if bmesh else (), strict=True)]
        state = dsa.map_overlap(
            fn, *margs, depth=[dd] * len(margs), boundary=[boundary] * len(margs),
            trim=False, align_arrays=False, allow_rechunk=False, chunks=state.chunks,
            dtype=data.dtype, meta=np.empty((0,) * data.ndim, dtype=data.dtype),
            name=f"xstencil-scan-{t}-{token}")
        if save:
            saved.append(state[-1:])
    if spec.every == 0:
        return rewrap(prep, state[-1])
    return rewrap(prep, dsa.concatenate([data[:spec.k]] + saved, axis=0))

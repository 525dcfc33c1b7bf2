"""Scans on blocks with a deep halo: K steps per halo exchange.

Shared by the dask scan (:mod:`xstencil._dask_scan`, one task runs K steps of
one chunk) and the sharded scan (:mod:`xstencil._shard_scan`, one ``ppermute``
exchange every K steps).  A block extended by ``K * lo`` / ``K * hi`` cells of
neighbouring data along each split dim can advance K steps on its own: every
step, the cells within one window reach of the extended block's edge read a
wrong halo, so the wrong cells creep inward by the reach per step, and after
K steps they have not reached the block's own cells.  The block's own cells
are then exact, and are all that is kept.

Boundary modes along split dims are applied exactly:

* ``periodic``: the neighbour across the seam supplies the halo (dask's
  ``periodic`` overlap, a cyclic ``ppermute``);
* other modes, dask: the chunk at the global edge has no halo on that side,
  and the step's own virtual padding in that mode is the true boundary;
* other modes, sharded: every device has the same block shape, so the edge
  devices rebuild their outer halo from their own cells in that mode after
  every step (a ``where`` on ``axis_index``).

Scope: a DataArray and one kernel or a function mesh (regions by position,
label or mask; see :mod:`xstencil._blockmesh`); the kernel does not read
``u.coord(dim)`` along the scanned dim.  The scanned dim must not be
split.  Saving follows :func:`xstencil.scan`: the ``k`` initial positions,
then every ``save_every``-th computed one, or the last only.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax.numpy as jnp
import numpy as np
import xarray as xr
from jax import lax

from xstencil._blockmesh import BlockMesh, mesh_step
from xstencil._engine.boundary import pad
from xstencil._engine.lower import AxisGeom, Source, evaluate
from xstencil._errors import XStencilError
from xstencil._labelled.coords import numeric_coord, pad_coord
from xstencil._labelled.plan import Plan

__all__ = ["ScanSpec", "setup", "run_steps", "segments", "padded_coords", "rewrap"]


@dataclass(frozen=True)
class ScanSpec:
    """A scan, reduced to what a block needs: the plan over ``(dim,) + space``
    (without the time coordinate), the reach back ``k`` and ahead ``ahead``
    along ``dim``, and the saved positions."""

    plan: Plan
    dim: str
    k: int
    ahead: int
    total: int  # positions along dim, initial ones included
    grown: bool
    every: int  # 0: the last only
    nsave: int  # saved positions after the initial ones
    tmode: str

    @property
    def steps_per_save(self) -> int:
        return self.total - self.k if self.every == 0 else self.every

    @property
    def last(self) -> int:
        """The last position computed."""
        return self.k - 1 + self.nsave * self.steps_per_save

    def reach(self, axis: int) -> tuple[int, int]:
        s = self.plan.specs[axis]
        return s.pad_lo, s.pad_hi


@dataclass
class Prepared:
    spec: ScanSpec
    obj: xr.DataArray  # the input, dim first
    orig: tuple[str, ...]  # the input's dims, in its order
    data: Any  # (n_input, *space): the input, dim first
    order: tuple[str, ...]  # the input's dims (to transpose back)
    coords: dict[str, Any]  # the trajectory's coordinate for dim, if any
    static: Any
    dyn: list[Any]


def setup(call: str, obj: Any, kernels: Sequence[Callable[..., Any]], dim: str, args: Any,
          kwargs: Any, *, window: Any = None, boundary: Any = "fill", fill_value: Any = None,
          steps: Any = None, dt: Any = None, coord: Any = None, save_every: Any = 1,
          period: Any = None, **unsupported: Any) -> Prepared:
    """Validate a scale-out scan and reduce it to a :class:`ScanSpec`."""
    from xstencil._engine.call import split_static
    from xstencil._labelled.core import Fields, prepare

    bad = {k: v for k, v in unsupported.items() if v not in (None, False)}
    if bad:
        raise XStencilError(
            f"{call}: {sorted(bad)!r} are not available for dask-backed or sharded scans; "
            f"run in memory (.compute() the data, or drop mesh=) to use them")
    if not isinstance(obj, xr.DataArray):
        raise XStencilError(
            f"{call}: dask-backed and sharded scans take a DataArray; scan each variable, or "
            f"load the Dataset into memory")
    for kernel in kernels:
        if not callable(kernel):
            raise XStencilError(f"{call}: kernel={kernel!r:.60} is not callable")
    if not isinstance(dim, str):
        raise XStencilError(f"{call}: dim={dim!r} must be a dim name (str)")
    if save_every == "last":
        every = 0
    elif isinstance(save_every, numbers.Integral) and not isinstance(save_every, bool) \
            and save_every >= 1:
        every = int(save_every)
    else:
        raise XStencilError(f"{call}: save_every={save_every!r} must be an int >= 1 or 'last'")
    space = tuple(str(d) for d in obj.dims if d != dim)
    orig = tuple(str(d) for d in obj.dims)
    if dim in obj.dims:
        obj = obj.transpose(dim, *space)
        n0 = obj.sizes[dim]
        data = obj.data
    else:
        n0 = 0
        data = obj.data[None]
    if steps is not None:
        if isinstance(steps, bool) or not isinstance(steps, numbers.Integral) or steps < 1:
            raise XStencilError(f"{call}: steps={steps!r} must be an int >= 1")
        steps = int(steps)
    dims = (dim,) + space
    b = dict(boundary) if isinstance(boundary, Mapping) else dict.fromkeys(dims, boundary)
    tmode = b.get(dim, "fill")
    b[dim] = "extend"
    guess = (n0 or 1) + (steps or 0)
    template = obj.drop_vars([c for c in obj.coords if dim in obj[c].dims]) \
        if steps is not None else obj
    f = Fields(template, dims, (guess,) + tuple(obj.sizes[d] for d in space), None, [data],
               (dims,), (obj.dtype,))
    plan = prepare(call, f, list(kernels), window=window, boundary=b, fill_value=fill_value,
                   stride=None, output_dims=None, args=args, kwargs=kwargs)
    ts = plan.specs[0]
    k, ahead = ts.lo, ts.hi
    if k == 0:
        raise XStencilError(
            f"{call}: the kernel reads no earlier position along {dim!r} (such as "
            f"u({dim}=-1)); there is nothing to scan")
    if steps is not None:
        if n0 not in (0, k) or (n0 == 0 and k != 1):
            raise XStencilError(
                f"{call}: steps={steps} grows a trajectory from its first {k} position(s) "
                f"along {dim!r}; the input has {n0 or 'no'} position(s) there")
        total = k + steps
    else:
        if n0 == 0:
            raise XStencilError(
                f"{call}: dimension {dim!r} not found; available dims are {space!r} (to grow "
                f"a trajectory from an initial state, pass steps=N)")
        total = n0
        if total <= k:
            raise XStencilError(f"{call}: {dim!r} has {total} positions, no more than the "
                                f"{k} initial ones")
    for d, s in zip(plan.dims[1:], plan.specs[1:], strict=True):
        if s.mode == "valid" and (s.lo or s.hi):
            raise XStencilError(f"{call}: boundary 'valid' along {d!r} would shrink each step; "
                                f"use a padding boundary mode")
    n_comp = total - k
    if every and every > n_comp:
        raise XStencilError(f"{call}: save_every={every} is larger than the {n_comp} "
                            f"positions to compute; use save_every='last'")
    if every and steps is not None and steps % every:
        raise XStencilError(f"{call}: steps={steps} is not a multiple of "
                            f"save_every={every}")
    nsave = 1 if every == 0 else n_comp // every
    plan = dataclasses.replace(plan, shape=(total,) + plan.shape[1:],
                               coord_dims=tuple(d for d in plan.coord_dims if d != dim))
    spec = ScanSpec(plan, dim, k, ahead, total, steps is not None, every, nsave, tmode)
    coords = _time_coord(call, obj, dim, spec, n0, dt, coord)
    dyn, static = split_static(call, (args, kwargs))
    return Prepared(spec, obj, orig, data, space, coords, static, dyn)


def _time_coord(call: str, obj: xr.DataArray, dim: str, spec: ScanSpec, n0: int, dt: Any,
                coord: Any) -> dict[str, Any]:
    have = obj[dim].values if n0 and dim in obj.coords else None
    if not spec.grown:
        return {} if have is None else {dim: have}
    total = spec.total
    if coord is not None:
        c = np.asarray(coord)
        if len(c) == total:
            return {dim: c}
        if len(c) == total - n0 and (have is not None or not n0):
            return {dim: c if not n0 else np.concatenate([have, c])}
        raise XStencilError(f"{call}: coord= has {len(c)} values; give {total}")
    if dt is not None:
        if have is not None:
            return {dim: np.concatenate([have, have[-1] + dt * np.arange(1, total - n0 + 1)])}
        base = np.zeros((), dtype=np.asarray(dt).dtype) if isinstance(dt, np.timedelta64) else 0
        return {dim: base + dt * np.arange(total)}
    if have is not None:
        if n0 < 2:
            raise XStencilError(f"{call}: the input has a {dim!r} coordinate; pass dt= or "
                                f"coord= to continue it")
        d = have[-1] - have[-2]
        return {dim: np.concatenate([have, have[-1] + d * np.arange(1, total - n0 + 1)])}
    return {}


def saved_positions(spec: ScanSpec) -> np.ndarray:
    if spec.every == 0:
        return np.array([spec.last])
    return np.concatenate([np.arange(spec.k),
                           spec.k - 1 + spec.every * np.arange(1, spec.nsave + 1)])


def segments(spec: ScanSpec, K: int) -> list[tuple[int, int, bool]]:
    """``(first position, steps, saved after)`` per block of at most ``K`` steps."""
    out = []
    t = spec.k
    for _ in range(spec.nsave):
        left = spec.steps_per_save
        while left:
            n = min(K, left)
            left -= n
            out.append((t, n, left == 0))
            t += n
    return out


def padded_coords(spec: ScanSpec, obj: xr.DataArray, width: Sequence[tuple[int, int]],
                  period: Mapping[str, float] | None) -> list[np.ndarray]:
    """The spatial coordinates read by the kernel, padded by ``width[axis]``
    ``(lo, hi)`` cells in the axis's boundary mode."""
    plan = spec.plan
    cdt = np.dtype(plan.var_dtypes[0])
    cdt = cdt if cdt.kind == "f" else np.dtype(np.float32)
    out = []
    for d in plan.coord_dims:
        a = plan.axis(d)
        c = numeric_coord(plan.call, d, np.asarray(obj[d].values))
        mode = plan.specs[a].mode
        out.append(np.asarray(pad_coord(plan.call, d, c, width[a][0], width[a][1], mode,
                                        None if period is None else period.get(d)), dtype=cdt))
    return out


def run_steps(spec: ScanSpec, kernels: Sequence[Callable[..., Any]], static: Any, n: int,
              hist: tuple[Any, ...], inp: Any, coords: Sequence[Any], dyn: Any,
              modes: Sequence[str], repad: Callable[[Any], Any] | None = None,
              mesh: BlockMesh | None = None, where: tuple[Any, Sequence[Any]] | None = None,
              masks: Sequence[Any] = ()) -> tuple[Any, ...]:
    """Advance ``hist`` (the last ``k`` slabs, oldest first) by ``n`` steps.
    ``inp`` holds the input slabs ``[t, t + n + ahead)`` (``None`` when
    growing: reads at offsets >= 0 then see the latest slab).  ``modes`` is
    the virtual padding per spatial axis; ``coords`` the spatial coordinates
    with ``pad_lo``/``pad_hi`` extra cells; ``repad`` rebuilds a new slab's
    outer halo (sharded edge devices).

    With a function ``mesh`` (see :mod:`xstencil._blockmesh`), ``kernels``
    go with its regions, ``where`` is ``(t, origin)``: the position of the
    first step along dim and the global index of the block's first cell per
    spatial axis, and ``masks`` are the mask regions over the block,
    ``(n or 1, *block)``.  Without one, ``kernels`` holds one kernel.

    Each time offset is its own spatial :class:`Source`, and the kernel's time
    window is stacked from their cells (a structural operation the lowering
    removes), so no slab is copied to build a window.
    """
    from xstencil._labelled.core import identity_caller, kernel_caller

    plan, k, ahead = spec.plan, spec.k, spec.ahead
    calls = [kernel_caller(plan, kn, static) for kn in kernels]
    width = k + 1 + ahead
    block = hist[0].shape
    space = tuple(range(len(block)))  # the step's field: the spatial axes only
    wset = tuple(plan.axis(d) - 1 for d in plan.window_dims if d != spec.dim)
    fill = 0 if plan.fill_value is None else plan.fill_value
    pads = tuple((s.pad_lo, s.pad_hi) for s in plan.specs[1:])
    geom = [AxisGeom(0, 1, nb, s.size) for nb, s in zip(block, plan.specs[1:], strict=True)]
    csrc = [Source(c, (plan.axis(d) - 1,), (plan.axis(d) - 1,))
            for d, c in zip(plan.coord_dims, coords, strict=True)]
    nsrc = k if inp is None else width  # growing: the latest slab stands for offsets >= 0

    def stacked(call: Callable[..., Any]) -> Callable[..., Any]:
        def run(cells: Sequence[Any], dyn: Any) -> Any:
            time_cells = list(cells[:nsrc]) + [cells[k - 1]] * (width - nsrc)
            win = lax.concatenate([lax.expand_dims(c, (0,)) for c in time_cells], 0)
            return call([win] + list(cells[nsrc:]), dyn)

        return run

    def source(x: Any) -> Source:
        # inside a loop, one explicitly padded slab beats the interior/shell split,
        # whose dynamic-update-slices force copies of the loop carry
        if any(lo or hi for lo, hi in pads):
            x = lax.optimization_barrier(pad(x, pads, modes, fill))
        return Source(x, space, wset)

    def step(i: Any, hist: tuple[Any, ...]) -> tuple[Any, ...]:
        if inp is None:
            now = []
        else:
            now = [lax.dynamic_index_in_dim(inp, i + j, axis=0, keepdims=False)
                   for j in range(1 + ahead)]
        srcs = [source(x) for x in list(hist) + now] + csrc
        dtype = hist[0].dtype
        if mesh is None:
            new = evaluate(stacked(calls[0]), srcs, geom, dyn).astype(dtype)
        else:
            t0, origin = where  # type: ignore[misc]
            now_masks = [lax.dynamic_index_in_dim(m, i, 0, False) if timed else m[0]
                         for m, timed in zip(masks, mesh.timed, strict=True)]
            base = stacked(identity_caller(plan, calls[-1]))
            new = mesh_step(mesh, [stacked(c) for c in calls], base, srcs, geom, dyn, t0 + i,
                            origin, now_masks, dtype)
        if repad is not None:
            new = repad(new)
        return hist[1:] + (new,)

    return step(0, tuple(hist)) if n == 1 else lax.fori_loop(0, n, step, tuple(hist))


def time_padded(spec: ScanSpec, data: Any) -> Any:
    """The input along dim, padded by ``ahead`` positions in the dim's mode
    (the values reads past the end of the input see)."""
    if not spec.ahead:
        return data
    mode = spec.tmode if spec.tmode != "valid" else "fill"
    fill = 0 if spec.plan.fill_value is None else spec.plan.fill_value
    if hasattr(data, "dask"):
        import dask.array as dsa

        kw: dict[str, Any] = {"mode": {"fill": "constant", "extend": "edge",
                                       "periodic": "wrap"}.get(mode, mode)}
        if mode == "fill":
            kw["constant_values"] = fill
        widths = [(0, spec.ahead)] + [(0, 0)] * (data.ndim - 1)
        return dsa.pad(data, widths, **kw)
    widths = [(0, spec.ahead)] + [(0, 0)] * (data.ndim - 1)
    return pad(jnp.asarray(data), widths, [mode] + ["fill"] * (data.ndim - 1), fill)


def rewrap(prep: Prepared, out: Any) -> xr.DataArray:
    """The saved trajectory (``(nsaved, *space)``, or ``space`` for the last
    only) as a DataArray like the in-memory scan's."""
    spec, obj = prep.spec, prep.obj
    dim = spec.dim
    pos = saved_positions(spec)
    coords = {str(c): v.variable for c, v in obj.coords.items() if dim not in v.dims}
    tc = prep.coords.get(dim)
    if tc is None and spec.grown:  # a grown trajectory is labelled by position
        tc = np.arange(spec.total)
    extra = {str(c): obj[c].isel({dim: pos}).variable for c in obj.coords
             if dim in obj[c].dims and c != dim and not spec.grown}
    if spec.every == 0:
        res = xr.DataArray(out, dims=prep.order, coords=coords, attrs=dict(obj.attrs),
                           name=obj.name)
        if tc is not None:
            res = res.assign_coords({dim: tc[spec.last]})
        return res
    if tc is not None:
        coords[dim] = xr.Variable(dim, np.asarray(tc)[pos])
    coords.update(extra)
    res = xr.DataArray(out, dims=(dim,) + prep.order, coords=coords, attrs=dict(obj.attrs),
                       name=obj.name)
    return res.transpose(*prep.orig) if dim in prep.orig else res




def scale_out(obj: Any, kernel: Any, dim: str, args: Any, kwargs: Mapping[str, Any], *,
              mesh: Any = None, halo_every: int | None = None,
              function_mesh: Any = None) -> Any:
    """The dask-backed or sharded scan of ``obj``, or ``None`` when it is in
    memory on one device and ``mesh`` is not given (the caller scans then).

    ``kwargs`` holds the scan options (``window``, ``boundary``, ...) and the
    kernel's keyword arguments together, as :func:`xstencil.scan` receives them.
    ``function_mesh`` is a :class:`~xstencil.Mesh` to scan instead of ``kernel``.
    """
    from xstencil._dask import any_dask
    from xstencil._dask_scan import scan_dask
    from xstencil._shard import is_sharded
    from xstencil._shard_scan import scan_sharded

    arrays = [v.data for v in obj.data_vars.values()] if isinstance(obj, xr.Dataset) \
        else [getattr(obj, "data", None)]
    if any_dask(arrays):
        if mesh is not None:
            raise XStencilError("da.stencil.scan(...): mesh= shards JAX arrays; the data is a "
                                "dask array (drop mesh=, or .compute() the data first)")
        return scan_dask(obj, kernel, dim, *args, halo_every=halo_every,
                         function_mesh=function_mesh, **kwargs)
    if mesh is not None or is_sharded(arrays):
        return scan_sharded(obj, kernel, dim, *args, mesh=mesh, halo_every=halo_every or 1,
                            function_mesh=function_mesh, **kwargs)
    return None

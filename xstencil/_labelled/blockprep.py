"""The dask-backed and sharded scans' side of the one scan setup and rewrap.

A block scan is set up as the in-memory scan is
(:func:`~xstencil._labelled.scan_setup.plan_scan`: one frozen
:class:`~xstencil._labelled.scan_plan.ScanPlan` and the
:class:`~xstencil._labelled.core.Fields` of the trajectory), on the input
with the scanned dim first (:func:`setup`).  :func:`block_spec` and
:func:`block_arrays` reduce that to the backend's plain data, and
:func:`rewrap` labels the saved slabs with the in-memory scan's
:func:`~xstencil._labelled.scan_result.rewrap`.

Scope for Datasets: every variable spans the same spatial dims, and the
advanced variables share one dtype (the block scans stack them into one
array).  The variables the kernels do not return are read as they are:
constant fields without the scanned dim (a bathymetry), or, when scanning a
trajectory, inputs along it (a forcing), stacked like the advanced ones.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax.numpy as jnp
import numpy as np
import xarray as xr

from xstencil._backends.halo import ScanSpec
from xstencil._backends.jobs import HIDDEN, grid_coordinate_read
from xstencil._engine.call import precision, split_static
from xstencil._engine.kcache import describe
from xstencil._errors import XStencilError
from xstencil._labelled.core import Fields, coord_arrays
from xstencil._labelled.scan_loop import time_input as scan_time_input
from xstencil._labelled.scan_plan import ScanPlan
from xstencil._labelled.scan_result import rewrap as rewrap_scan
from xstencil._labelled.scan_setup import padded_time, plan_scan

__all__ = ["BlockArrays", "setup", "block_spec", "block_arrays", "time_input", "rewrap"]


@dataclass(frozen=True)
class BlockArrays:
    """The arrays a block scan moves, dim first: per advanced variable its
    input ``(n or 1, *space)`` (``names``), per forced variable (read along
    dim, not advanced) ``(n, *space)``, per other variable ``(*space)``."""

    names: tuple[str, ...]  # the advanced variables ("" for a DataArray)
    datas: tuple[Any, ...]
    forced: tuple[str, ...]
    forcings: tuple[Any, ...]
    consts: tuple[Any, ...]


def _space(call: str, obj: Any, dim: str) -> tuple[str, ...]:
    """The spatial dims (every variable of a Dataset must span them)."""
    if isinstance(obj, xr.DataArray):
        return tuple(str(d) for d in obj.dims if d != dim)
    if not isinstance(obj, xr.Dataset):
        raise XStencilError(f"{call}: expected a DataArray or Dataset, got "
                            f"{type(obj).__name__}")
    names = tuple(str(n) for n in obj.data_vars)
    if not names:
        raise XStencilError(f"{call}: the Dataset has no data variables")
    space = tuple(str(d) for d in obj[names[0]].dims if d != dim)
    for n in names:
        own = {str(d) for d in obj[n].dims if d != dim}
        if own != set(space) and n.startswith(HIDDEN):  # a grid coordinate the kernel reads
            raise XStencilError(grid_coordinate_read(
                f"{call}: on dask-backed or sharded data",
                [str(d) for d in obj[n].dims if d != dim]))
        if own != set(space):
            raise XStencilError(
                f"{call}: dask-backed and sharded scans of a Dataset need every variable over "
                f"the same dims; {names[0]!r} spans {space!r} but {n!r} spans "
                f"{tuple(d for d in obj[n].dims if d != dim)!r} (broadcast it with "
                f"xr.broadcast, or scan in memory)")
    return space


def _dim_first(obj: Any, dim: str, space: tuple[str, ...]) -> Any:
    """``obj`` with ``dim`` first in every variable (and in the Fields' dims:
    a Dataset's variables along ``dim`` first), coordinates as they are."""
    order = (dim, *space)
    if isinstance(obj, xr.DataArray):
        return obj.transpose(*[d for d in order if d in obj.dims], transpose_coords=False)
    names = list(obj.data_vars)
    if dim not in obj[names[0]].dims:  # the Fields' dims follow the first variable's
        names.sort(key=lambda n: dim not in obj[n].dims)
    data = {n: obj[n].variable.transpose(*[d for d in order if d in obj[n].dims])
            for n in names}
    return xr.Dataset(data, coords=obj.coords, attrs=obj.attrs)


def _check_call(call: str, kernels: Sequence[Callable[..., Any]],
                unsupported: Mapping[str, Any]) -> None:
    """The call's own arguments (the options are checked by :class:`ScanPlan`)."""
    bad = {k: v for k, v in unsupported.items() if v not in (None, False)}
    if bad:
        raise XStencilError(
            f"{call}: {sorted(bad)!r} are not available for dask-backed or sharded scans; "
            f"run in memory (.compute() the data, or drop devices=) to use them")
    for kernel in kernels:
        if not callable(kernel):
            raise XStencilError(f"{call}: kernel={kernel!r:.60} is not callable")


def setup(call: str, obj: Any, kernels: Sequence[Callable[..., Any]], dim: str, args: Any,
          kwargs: Any, *, window: Any = None, boundary: Any = "fill", fill_value: Any = None,
          steps: Any = None, dt: Any = None, coord: Any = None, save_every: Any = 1,
          period: Any = None, check_finite: bool = False, progress: bool = False,
          checkpoint: bool = False, **unsupported: Any) -> tuple[ScanPlan, Fields]:
    """The scan's :class:`ScanPlan` and :class:`Fields`, set up as in memory
    (:func:`~xstencil._labelled.scan_setup.plan_scan`) on ``obj`` with
    ``dim`` first; plus the block scans' own limits."""
    request = ScanPlan(call, dim, window, boundary, fill_value, steps, dt, coord, save_every,
                       progress, checkpoint, check_finite, period)
    _check_call(call, kernels, unsupported)
    first = _dim_first(obj, dim, _space(call, obj, dim))
    udyn, static = split_static(call, (args, kwargs))
    sp, f = plan_scan(first, list(kernels), request, args, kwargs, describe(list(kernels)),
                      static, udyn, in_memory=False)
    assert sp.plan is not None
    dtypes = {str(np.dtype(sp.plan.var_dtypes[i])) for i in sp.evolving}
    if len(dtypes) > 1:
        raise XStencilError(
            f"{call}: the advanced variables have dtypes {sorted(dtypes)!r}; dask-backed "
            f"and sharded scans stack them, so give them one dtype (.astype(...))")
    return sp, f


def block_spec(sp: ScanPlan) -> ScanSpec:
    """The plan reduced to what a block needs (plain data for the backends)."""
    plan = sp.plan
    assert plan is not None and plan.dims[0] == sp.dim
    return ScanSpec(plan, sp.dim, sp.k, plan.specs[0].hi, sp.total, sp.grown, sp.every,
                    sp.loop.saves, sp.tmode)


def block_arrays(sp: ScanPlan, f: Fields) -> BlockArrays:
    """The arrays of ``f`` by their role in the scan, dim first."""
    plan, dim = sp.plan, sp.dim
    assert plan is not None
    datas = tuple(f.arrays[i] if len(plan.var_dims[i]) == np.ndim(f.arrays[i])
                  else f.arrays[i][None] for i in sp.evolving)
    if plan.var_names is None:
        return BlockArrays(("",), datas, (), (), ())
    others = [i for i in range(len(plan.var_names)) if i not in sp.evolving]
    forced = [i for i in others if dim in plan.var_dims[i]]
    return BlockArrays(tuple(sp.names or ()), datas,
                       tuple(plan.var_names[i] for i in forced),
                       tuple(f.arrays[i] for i in forced),
                       tuple(f.arrays[i] for i in others if i not in forced))


def time_input(sp: ScanPlan, f: Fields, kernels: Sequence[Callable[..., Any]], args: Any,
               kwargs: Any) -> Any:
    """The coordinate along dim padded as the kernel reads it (numpy), when
    the trajectory has a numeric one (``None`` otherwise).  Checked as in
    memory (:func:`~xstencil._labelled.scan_loop.time_input`): no reads at
    offsets >= 0 when growing, and a coordinate the kernel reads increases."""
    plan, dim = sp.plan, sp.dim
    assert plan is not None
    udyn, static = split_static(sp.call, (args, kwargs))
    spatial = dataclasses.replace(plan, coord_dims=tuple(d for d in plan.coord_dims
                                                         if d != dim))
    with precision(f.arrays, args, kwargs):
        coords = [jnp.asarray(c) for c in coord_arrays(spatial, f, sp.period)]
        scan_time_input(sp, list(kernels), describe(list(kernels)), static, udyn, coords)
    if sp.tvals is None or dim not in plan.coord_dims:
        return None
    return padded_time(sp.call, plan, dim, sp.tvals, sp.k, plan.specs[0].hi, sp.tmode)


def rewrap(sp: ScanPlan, f: Fields, obj: Any, outs: Sequence[Any]) -> Any:
    """The saved slabs (per advanced variable ``(nsaved, *space)``, or
    ``space`` for the last only) labelled like ``obj``, as in memory."""
    if sp.every == 0:
        outs = [x[None] for x in outs]
    return rewrap_scan(sp, f, obj, outs)

"""Setting up a block scan (dask chunks, sharded devices) and labelling its result.

:func:`setup` checks a scale-out scan and reduces it to a
:class:`~xstencil._backends.halo.ScanSpec` plus the arrays that travel: per
variable that the kernels advance, its input with the scanned dim first; per
other variable of a Dataset, a constant field.  :func:`rewrap` turns the
saved slabs back into a DataArray or Dataset like the in-memory scan's.

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

import numpy as np
import xarray as xr

from xstencil._backends.halo import ScanSpec
from xstencil._engine.call import precision, split_static
from xstencil._errors import XStencilError
from xstencil._labelled.core import Fields, prepare
from xstencil._labelled.scan_plan import ScanPlan
from xstencil._labelled.scan_setup import (
    check_grown_length,
    check_monotonic,
    check_own_length,
    grown_coord,
    padded_time,
    returned,
)

__all__ = ["Prepared", "setup", "saved_positions", "rewrap"]


@dataclass
class Prepared:
    spec: ScanSpec
    obj: xr.DataArray | xr.Dataset  # the input
    names: tuple[str, ...] | None  # the data variables (None: a DataArray)
    evolving: tuple[str, ...]  # the variables the kernels advance ("" for a DataArray)
    datas: list[Any]  # per evolving variable: (n_input or 1, *space)
    consts: list[Any]  # per other variable without dim: (*space)
    forced: tuple[str, ...]  # the other variables with dim (read, not advanced)
    forcings: list[Any]  # their input, (n_input, *space)
    space: tuple[str, ...]
    coords: dict[str, Any]  # the trajectory's coordinate for dim, if any
    static: Any
    dyn: list[Any]
    check_finite: bool
    progress: bool
    checkpoint: bool
    tcoord: Any  # the coordinate along dim padded by (k, ahead), if the kernel reads it

    @property
    def labels(self) -> Any:
        """The trajectory's coordinate along dim (positions when grown), or None."""
        return self.coords.get(self.spec.dim)


def _variables(call: str, obj: Any, dim: str) -> tuple[tuple[str, ...] | None, tuple[str, ...]]:
    """The data variables (``None`` for a DataArray) and the spatial dims."""
    if isinstance(obj, xr.DataArray):
        return None, tuple(str(d) for d in obj.dims if d != dim)
    if not isinstance(obj, xr.Dataset):
        raise XStencilError(f"{call}: expected a DataArray or Dataset, got "
                            f"{type(obj).__name__}")
    names = tuple(str(n) for n in obj.data_vars)
    if not names:
        raise XStencilError(f"{call}: the Dataset has no data variables")
    space = tuple(str(d) for d in obj[names[0]].dims if d != dim)
    for n in names:
        own = {str(d) for d in obj[n].dims if d != dim}
        if own != set(space):
            raise XStencilError(
                f"{call}: dask-backed and sharded scans of a Dataset need every variable over "
                f"the same dims; {names[0]!r} spans {space!r} but {n!r} spans "
                f"{tuple(d for d in obj[n].dims if d != dim)!r} (broadcast it with "
                f"xr.broadcast, or scan in memory)")
    return names, space


def _field(obj: Any, name: str | None, dim: str, space: Sequence[str]) -> Any:
    """A variable's data, ``(n, *space)`` with ``dim`` first, or ``space``."""
    v = obj if name is None else obj[name]
    if dim in v.dims:
        return v.transpose(dim, *space).data
    return v.transpose(*space).data


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


def _template(obj: Any, dim: str, steps: int | None, guess: int) -> Any:
    """What the plan reads coordinates from: the input, or for a grown
    trajectory its coords (dim's values come later; without dt= or coord=
    they are positions, as in memory)."""
    if steps is None:
        return obj
    coords = {str(n): v.variable for n, v in obj.coords.items() if dim not in v.dims}
    coords[dim] = xr.Variable(dim, np.arange(guess, dtype=float))
    return xr.Dataset(coords=coords)


def _evolving(call: str, obj: Any, names: tuple[str, ...], plan: Any,
              kernels: Sequence[Callable[..., Any]], dim: str, steps: int | None, args: Any,
              kwargs: Any) -> tuple[str, ...]:
    """The Dataset variables the kernels return (advance), checked."""
    dyn, static = split_static(call, (args, kwargs))
    with precision([obj[n].data for n in names], args, kwargs):
        got = returned(call, plan, kernels, static, dyn)
    evolving = tuple(got or ())
    fixed = [n for n in names if n not in evolving]
    timed = [n for n in fixed if dim in obj[n].dims]
    if timed and steps is not None:
        raise XStencilError(
            f"{call}: {timed[0]!r} has dim {dim!r} but the kernel does not return it, and "
            f"steps= grows the trajectory past its input; drop {dim!r} from it (a "
            f"constant field), or scan a trajectory that holds it at every position")
    lacking = [n for n in evolving if dim in obj.dims and dim not in obj[n].dims]
    if lacking:
        raise XStencilError(
            f"{call}: the kernel advances {lacking[0]!r}, which has no {dim!r}; give it "
            f"{dim!r} like the other advanced variables")
    dtypes = {str(np.dtype(obj[n].dtype)) for n in evolving}
    if len(dtypes) > 1:
        raise XStencilError(
            f"{call}: the advanced variables have dtypes {sorted(dtypes)!r}; dask-backed "
            f"and sharded scans stack them, so give them one dtype (.astype(...))")
    return evolving


def _positions(request: ScanPlan, plan: Any, space: tuple[str, ...], n0: int) -> tuple[int, int]:
    """``(total, nsave)``: the positions along dim, initial ones included,
    and the saved positions after the initial ones; checked as in memory."""
    call, dim, steps, every = request.call, request.dim, request.steps, request.every
    k = plan.specs[0].lo
    if steps is not None:
        check_grown_length(request, n0, k)
        total = k + steps
    else:
        if n0 == 0:
            raise XStencilError(
                f"{call}: dimension {dim!r} not found; available dims are {space!r} (to grow "
                f"a trajectory from an initial state without {dim!r}, pass steps=N)")
        total = n0
        check_own_length(request, total, k)
    for d, s in zip(plan.dims[1:], plan.specs[1:], strict=True):
        if s.mode == "valid" and (s.lo or s.hi):
            raise XStencilError(
                f"{call}: boundary 'valid' along {d!r} would shrink each step's output; a scan "
                f"needs a padding boundary mode for {d!r} (e.g. 'periodic' or 'extend')")
    return total, 1 if every == 0 else (total - k) // every


def _time(call: str, spec: ScanSpec, obj: Any, coord: Any, dt: Any, steps: int | None,
          n0: int) -> tuple[dict[str, Any], Any]:
    """The trajectory's coordinate along dim (if any) and, when the kernel
    reads it, that coordinate padded as the kernel reads it."""
    dim, plan = spec.dim, spec.plan
    if spec.grown:
        coords = {dim: grown_coord(call, obj, dim, coord, dt, steps, n0, spec.total)}
    else:
        coords = {dim: obj[dim].values} if dim in obj.coords else {}
    if not spec.reads_time:
        return coords, None
    if dim not in coords:
        raise XStencilError(
            f"{call}: the kernel reads u.coord({dim!r}) but the trajectory has no {dim!r} "
            f"coordinate; give the input one")
    check_monotonic(call, dim, coords[dim])
    return coords, padded_time(call, plan, dim, coords[dim], spec.k, spec.ahead, spec.tmode)


def setup(call: str, obj: Any, kernels: Sequence[Callable[..., Any]], dim: str, args: Any,
          kwargs: Any, *, window: Any = None, boundary: Any = "fill", fill_value: Any = None,
          steps: Any = None, dt: Any = None, coord: Any = None, save_every: Any = 1,
          period: Any = None, check_finite: bool = False, progress: bool = False,
          checkpoint: bool = False, **unsupported: Any) -> Prepared:
    """Validate a scale-out scan and reduce it to a :class:`ScanSpec`."""
    # the options are validated as for an in-memory scan: one ScanPlan
    request = ScanPlan(call, dim, window, boundary, fill_value, steps, dt, coord, save_every,
                       progress, checkpoint, check_finite, period)
    _check_call(call, kernels, unsupported)
    steps, every, boundary = request.steps, request.every, request.boundary
    names, space = _variables(call, obj, dim)
    has_dim = dim in obj.dims
    n0 = obj.sizes[dim] if has_dim else 0
    dims = (dim,) + space
    b = dict(boundary) if isinstance(boundary, Mapping) else dict.fromkeys(dims, boundary)
    tmode = b.get(dim, "fill")
    b[dim] = "extend"
    guess = (n0 or 1) + (steps or 0)
    template = _template(obj, dim, steps, guess)
    keys = names or (None,)
    sizes = tuple(obj.sizes[d] for d in space)

    def plan_for(evolve: Sequence[Any]) -> Any:
        fields = [_field(obj, n, dim, space) for n in keys]
        # growing: the advanced variables gain dim; scanning a trajectory: as they are
        var_dims = tuple(dims if (n in evolve if steps is not None else
                                  dim in (obj if n is None else obj[n]).dims)
                         else space for n in keys)
        arrays = [f if len(vd) == f.ndim else f[None] for f, vd in zip(fields, var_dims,
                                                                        strict=True)]
        f = Fields(template, dims, (guess,) + sizes, names, arrays, var_dims,
                   tuple(np.dtype(a.dtype) for a in arrays))
        return prepare(call, f, list(kernels), window=window, boundary=b, fill_value=fill_value,
                       stride=None, output_dims=None, args=args, kwargs=kwargs)

    plan = plan_for(keys)
    dyn, static = split_static(call, (args, kwargs))
    evolving: tuple[Any, ...] = (None,)
    if names is not None:
        evolving = _evolving(call, obj, names, plan, kernels, dim, steps, args, kwargs)
        if steps is not None and len(evolving) < len(names):
            plan = plan_for(evolving)
    total, nsave = _positions(request, plan, space, n0)
    plan = dataclasses.replace(plan, shape=(total,) + plan.shape[1:])
    ts = plan.specs[0]
    spec = ScanSpec(plan, dim, ts.lo, ts.hi, total, steps is not None, every, nsave, tmode)
    coords, tcoord = _time(call, spec, obj, coord, dt, steps, n0)
    datas = [_field(obj, n, dim, space) for n in evolving]
    datas = [d if has_dim else d[None] for d in datas]
    others = [n for n in (names or ()) if n not in evolving]
    forced = tuple(n for n in others if dim in obj[n].dims)
    consts = [_field(obj, n, dim, space) for n in others if n not in forced]
    forcings = [_field(obj, n, dim, space) for n in forced]
    return Prepared(spec, obj, names, tuple(evolving) if names else ("",), datas, consts,
                    forced, forcings, space, coords, static, dyn, bool(check_finite),
                    bool(progress), bool(checkpoint), tcoord)


def saved_positions(spec: ScanSpec) -> np.ndarray:
    if spec.every == 0:
        return np.array([spec.last])
    return np.concatenate([np.arange(spec.k),
                           spec.k - 1 + spec.every * np.arange(1, spec.nsave + 1)])


def rewrap(prep: Prepared, outs: Sequence[Any]) -> xr.DataArray | xr.Dataset:
    """The saved trajectories, one per evolving variable (``(nsaved, *space)``,
    or ``space`` for the last only), labelled like the in-memory scan's."""
    spec, obj = prep.spec, prep.obj
    dim = spec.dim
    pos = saved_positions(spec)
    tc = prep.labels  # a grown trajectory is labelled by position
    base = obj.drop_vars([c for c in obj.coords if dim in obj[c].dims]
                         + ([] if prep.names is None else list(prep.evolving)))
    if prep.forced:  # inputs along dim that were read, not advanced: at the saved positions
        base = base.isel({dim: spec.last if spec.every == 0 else pos})
    if spec.every == 0:
        coords = {} if tc is None else {dim: tc[spec.last]}
    else:
        coords = {} if tc is None else {dim: xr.Variable(dim, np.asarray(tc)[pos])}
        if not spec.grown:  # the input's other coords along dim, at the saved positions
            coords.update({str(c): obj[c].isel({dim: pos}).variable for c in obj.coords
                           if dim in obj[c].dims and c != dim})
    lead = () if spec.every == 0 else (dim,)
    out: Any = base if prep.names is not None else None
    for name, x in zip(prep.evolving, outs, strict=True):
        own = obj if prep.names is None else obj[name]
        da = xr.DataArray(x, dims=lead + prep.space, attrs=dict(own.attrs))
        order = [d for d in (own.dims if dim in own.dims else (dim,) + own.dims)
                 if d in da.dims]
        da = da.transpose(*order)
        if prep.names is None:
            out = da.assign_coords({str(c): v.variable for c, v in base.coords.items()})
            out.name = obj.name
        else:
            out[name] = da
    out = out.assign_coords(coords)
    if prep.names is not None:
        out = out[list(prep.names)]  # the input's variable order
        out.attrs = dict(obj.attrs)
    return out

"""Setting up a scan (:mod:`xstencil._labelled.scan`): a validated request
(:class:`~xstencil._labelled.scan_plan.ScanPlan`) completed with the plan and
fields of the whole trajectory, its ``dim`` coordinate and the variables the
kernel advances."""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import xarray as xr

from xstencil._engine.call import precision
from xstencil._engine.coords import (
    coord_values,
    is_cftime,
    numeric_coord,
    pack_coord,
    pad_coord,
    read_coord,
    read_dtype,
)
from xstencil._engine.kcache import cached
from xstencil._errors import XStencilError
from xstencil._labelled.core import Fields, kernel_caller, prepare, unwrap
from xstencil._labelled.plan import Plan
from xstencil._labelled.returns import kernel_cells
from xstencil._labelled.scan_dims import check_advanced_dims
from xstencil._labelled.scan_plan import ScanPlan
from xstencil._labelled.sizes import check_fits, check_inputs
from xstencil._labelled.timesteps import joined, spaced

__all__ = ["grown_coord", "setup", "plan_scan", "check_grown_length", "check_own_length",
           "returned", "evolving_indices", "time_coord",
           "padded_time", "coord_dtype", "check_monotonic", "time_placeholder"]


def _time_boundary(boundary: Any, dim: str) -> tuple[Any, str]:
    """(boundary with a placeholder mode for ``dim``, the mode asked for ``dim``)."""
    if isinstance(boundary, Mapping):
        asked = boundary.get(dim, "fill")
        b = dict(boundary)
        b[dim] = "extend"
        return b, asked
    return boundary, boundary if isinstance(boundary, str) else "fill"


def grown_coord(call: str, obj: Any, dim: str, coord: Any, dt: Any, steps: int, n0: int,
                total: int) -> np.ndarray:
    """The coordinate along ``dim`` of a trajectory grown by ``steps=``: from
    ``coord=``, from ``dt=``, continuing the input's spacing, or positions.

    A scalar coordinate ``dim`` (as left by ``obj.isel(time=-1)``) labels the
    initial position, so the new positions continue from it.  New positions
    that turn back on the input's (``dt=1`` after labels 10, 9) are refused:
    they would repeat labels."""
    have = coord_values(obj[dim].variable) if n0 and dim in obj.coords else None
    if not n0 and dim in obj.coords and obj[dim].ndim == 0:
        have = np.asarray(coord_values(obj[dim].variable))[None]
    if have is not None and coord is None and is_cftime(have):
        out = _cftime_grown(call, dim, have, dt, total)
    else:
        out = _grown(call, obj, dim, coord, dt, steps, n0, total, have)
    if have is not None and coord is None and len(have) >= 2:
        _same_direction(call, dim, have, out, dt)
    return out


def _cftime_grown(call: str, dim: str, have: np.ndarray, dt: Any, total: int) -> np.ndarray:
    """cftime labels continued by a timedelta ``dt`` (or the last spacing)."""
    if dt is None:
        if len(have) < 2:
            raise XStencilError(
                f"{call}: the {dim!r} coordinate is a cftime calendar; pass dt= (a timedelta, "
                f"e.g. dt=datetime.timedelta(days=1)) or coord= to continue it")
        dt = have[-1] - have[-2]
    if isinstance(dt, np.timedelta64):
        dt = pd.Timedelta(dt).to_pytimedelta()
    if not isinstance(dt, datetime.timedelta):
        raise XStencilError(
            f"{call}: dt={dt!r:.60} does not fit the {dim!r} coordinate, a cftime calendar "
            f"({have[-1].calendar}); pass a timedelta, e.g. dt=datetime.timedelta(days=1)")
    new = [have[-1] + k * dt for k in range(1, total - len(have) + 1)]
    return np.concatenate([have, np.array(new, dtype=object)])


def _same_direction(call: str, dim: str, have: np.ndarray, out: np.ndarray, dt: Any) -> None:
    """Refuse a positive ``dt`` after labels that run down (``dt`` is a spacing,
    always positive, so it continues upward and would repeat labels)."""
    if dt is None or not all(a > b for a, b in zip(have[:-1], have[1:], strict=True)):
        return
    raise XStencilError(
        f"{call}: the {dim!r} coordinate runs down ({have[0]} ... {have[-1]}), but dt={dt!r:.40} "
        f"(a positive spacing) continues it upward, which repeats labels; leave dt= out to "
        f"continue the input's own spacing, or pass coord= with the new labels")


def _grown(call: str, obj: Any, dim: str, coord: Any, dt: Any, steps: int, n0: int,
           total: int, have: np.ndarray | None) -> np.ndarray:
    n_have = 0 if have is None else len(have)
    if coord is not None:
        c = np.asarray(coord)
        if c.ndim != 1 or len(c) not in (total, total - n_have) or (
                len(c) == total - n0 and n0 and have is None):
            if n_have:
                want = (f"give {total} values (the {n0} initial position(s) and steps={steps})"
                        f" or {total - n_have} values for the new positions (the initial ones "
                        f"keep their {dim!r} labels)")
            else:
                want = (f"give {total} values: the {max(n0, 1)} initial position(s) have no "
                        f"{dim!r} coordinate, so label them too (or assign one first with "
                        f"obj.assign_coords({dim}=...) and pass {total - max(n0, 1)} values "
                        f"for the steps={steps} new positions)")
            raise XStencilError(f"{call}: coord= has shape {c.shape}; {want}")
        return c if len(c) == total else np.concatenate([have, c]) if n_have else c
    if dim in obj.coords and _tz_aware(obj[dim]):
        fix = (f"obj.assign_coords({dim}=obj.indexes[{dim!r}].tz_convert(None))"
               if dim in obj.indexes else f"obj.assign_coords({dim}=<UTC datetime64 values>)")
        raise XStencilError(
            f"{call}: the {dim!r} coordinate is timezone-aware; continuing it with steps= "
            f"would silently drop the timezone. Convert it to UTC first ({fix}), or pass "
            f"coord= with the new values")
    if dt is not None:
        kind = None if have is None else have.dtype.kind
        timed = isinstance(dt, np.timedelta64 | datetime.timedelta)
        if kind is not None and (kind in "Mm") != timed:
            want = ("a timedelta, e.g. dt=np.timedelta64(6, 'h')" if kind in "Mm" else
                    "a number, e.g. dt=0.5")
            raise XStencilError(
                f"{call}: dt={dt!r:.60} does not fit the {dim!r} coordinate of dtype "
                f"{have.dtype}; pass {want}")
        if timed:  # exact or an error: numpy's datetime arithmetic wraps silently
            start = None if have is None else have[-1]
            ks = np.arange(1, total - n_have + 1) if have is not None else np.arange(total)
            new = spaced(call, dim, start, dt, ks)
            return new if have is None else joined(call, dim, have, new)
        if have is not None:
            new = have[-1] + dt * np.arange(1, total - n_have + 1)
            return np.concatenate([have, new])
        return 0 + dt * np.arange(total)
    if have is not None:
        if n_have < 2:
            raise XStencilError(
                f"{call}: the input has a {dim!r} coordinate; pass dt= (a spacing) or coord= "
                f"(values) to continue it for steps={steps}")
        d = have[-1] - have[-2]
        ks = np.arange(1, total - n_have + 1)
        if have.dtype.kind in "Mm":
            return joined(call, dim, have, spaced(call, dim, have[-1], d, ks))
        return np.concatenate([have, have[-1] + d * ks])
    return np.arange(total)  # step numbers


def _tz_aware(c: Any) -> bool:
    """A timezone-aware datetime coordinate (xarray reads it as objects)."""
    if getattr(c.dtype, "tz", None) is not None:
        return True
    v = coord_values(c.variable).ravel()
    return c.dtype.kind == "O" and bool(v.size) and isinstance(v[0], datetime.datetime)


def _fields(call: str, obj: Any, o: ScanPlan, evolve: Sequence[str] | None,
            total: int) -> tuple[Fields, int, np.ndarray | None]:
    """The Fields of the whole trajectory (arrays: the input), ``n0`` (input
    length along dim) and the trajectory's dim coordinate."""
    dim = o.dim
    f = unwrap(call, obj)
    if o.steps is None:
        if dim not in f.dims:
            raise XStencilError(
                f"{call}: dimension {dim!r} not found; available dims are {f.dims!r} (to grow "
                f"a trajectory from an initial state without {dim!r}, pass steps=N)")
        tv = coord_values(obj[dim].variable) if dim in obj.coords else None
        return f, f.shape[f.dims.index(dim)], tv
    n0 = f.shape[f.dims.index(dim)] if dim in f.dims else 0
    coords: dict[str, Any] = {str(n): v.variable for n, v in obj.coords.items()
                              if dim not in v.dims}
    if o.coord is None and o.dt is None and dim not in obj.coords:
        # step numbers: a lazy range, not 8 bytes a step (xarray's index would copy
        # them once more), so that steps=10**9 with save_every='last' fits in memory
        tvals: Any = pd.RangeIndex(total)
        coords[dim] = tvals
    else:
        tvals = grown_coord(call, obj, dim, o.coord, o.dt, o.steps, n0, total)
        if tvals is not None:  # with the input's attrs (units, standard_name)
            coords[dim] = xr.Variable(dim, tvals, obj[dim].attrs if dim in obj.coords else None)
    template = xr.Dataset(coords=coords)
    if dim in f.dims:
        shape = tuple(total if d == dim else n for d, n in zip(f.dims, f.shape, strict=True))
        return Fields(template, f.dims, shape, f.names, f.arrays, f.var_dims, f.dtypes), n0, tvals
    names = f.names or ("",)
    var_dims = tuple((dim,) + vd if (evolve is None or n in evolve) else vd
                     for n, vd in zip(names, f.var_dims, strict=True))
    return Fields(template, (dim,) + f.dims, (total,) + f.shape, f.names, f.arrays, var_dims,
                  f.dtypes), n0, tvals


def check_grown_length(o: ScanPlan, n0: int, k: int) -> None:
    """Check that the input holds the ``k`` initial positions a grown
    trajectory starts from."""
    call, dim = o.call, o.dim
    if k == 0:
        raise XStencilError(
            f"{call}: the kernel reads no earlier position along {dim!r} (such as "
            f"u({dim}=-1)), so there is nothing to grow with steps={o.steps}")
    if n0 not in (0, k) or (n0 == 0 and k != 1):
        what = f"{n0} position(s)" if n0 else f"no {dim!r}"
        raise XStencilError(
            f"{call}: steps={o.steps} grows a trajectory from its initial conditions, "
            f"which are the first {k} position(s) along {dim!r} (the window reaches {k} "
            f"back); the input has {what}. Pass "
            + (f"obj.isel({dim}=slice(0, {k}))" if n0 > k else
               f"{k} initial position(s) along {dim!r}")
            + (" or scan the input's own trajectory without steps=" if n0 > k else ""))


def check_own_length(o: ScanPlan, total: int, k: int) -> None:
    """Check the input's own trajectory: long enough, and a whole number of
    ``save_every`` intervals after the ``k`` initial positions."""
    call, dim, every = o.call, o.dim, o.every
    if k == 0:
        raise XStencilError(
            f"{call}: the kernel reads no earlier position along {dim!r} (such as "
            f"u({dim}=-1)); there is nothing to scan. Read the previous value u({dim}=-1), "
            f"or use .stencil.map(...) for a kernel that does not step along {dim!r}")
    if total <= k:  # whatever save_every: nothing to compute is an error, not a no-op
        raise XStencilError(
            f"{call}: the window reaches {k} position(s) back along {dim!r}, which has "
            f"{total}: the first {k} are the initial conditions, so there is nothing to "
            f"compute; give more positions along {dim!r}, or grow a trajectory from "
            f"obj.isel({dim}=slice(0, {k})) with steps=N")
    n_comp = total - k
    if every and every > n_comp:
        raise XStencilError(
            f"{call}: save_every={every} is larger than the {n_comp} positions to "
            f"compute along {dim!r}, so nothing would be computed; use "
            f"save_every<={n_comp} or save_every='last'")
    if every and n_comp % every:
        fit = max(e for e in range(1, every + 1) if n_comp % e == 0)
        raise XStencilError(
            f"{call}: the {n_comp} positions to compute along {dim!r} (positions {k}.."
            f"{total - 1}) are not a multiple of save_every={every}, so the last "
            f"{n_comp % every} would be neither computed nor returned; use "
            f"save_every={fit} or 'last', or trim the input (obj.isel({dim}=slice(0, "
            f"{total - n_comp % every})))")


def _check_size(o: ScanPlan, f: Fields, plan: Plan, k: int, total: int,
                in_memory: bool = True) -> None:
    """The saved trajectory must fit in memory (when it is held there); no
    dim but ``dim`` may be 'valid'."""
    call, dim, every = o.call, o.dim, o.every
    check_inputs(call, f.names or (None,), f.arrays)
    saves = 1 if not every else k + (total - k) // every
    slab = sum(int(np.prod([n for d, n in zip(f.dims, f.shape, strict=True)
                            if d in plan.var_dims[i] and d != dim]))
               * np.dtype(plan.var_dtypes[i]).itemsize for i in range(len(plan.var_dims))
               if dim in plan.var_dims[i])
    if in_memory:
        check_fits(call, saves * slab, f"the saved trajectory ({saves} positions along "
                   f"{dim!r})", "save fewer positions (save_every=..., or 'last'), or run the "
                   "scan on dask-backed data (.chunk(...)) or in shorter pieces")
    for d, s in zip(plan.dims, plan.specs, strict=True):
        if s.mode == "valid" and d != dim and (s.lo or s.hi):
            raise XStencilError(
                f"{call}: boundary 'valid' along {d!r} would shrink each step's output; a scan "
                f"needs a padding boundary mode for {d!r} (e.g. 'periodic' or 'extend')")


def setup(obj: Any, kernels: Sequence[Any], o: ScanPlan, args: Any, kwargs: Any,
          evolve: Sequence[str] | None = None, *,
          in_memory: bool = True) -> tuple[ScanPlan, Fields]:
    """The request ``o`` completed with the data's layout, and the fields of
    the whole trajectory (whose arrays are the input's).  ``in_memory=False``
    (dask-backed or sharded data) skips the check that the saved trajectory
    fits in memory."""
    call, dim = o.call, o.dim

    def planned(f: Fields, boundary: Any) -> Plan:
        return prepare(call, f, kernels, window=o.window, boundary=boundary,
                       fill_value=o.fill_value, stride=None, output_dims=None, args=args,
                       kwargs=kwargs)

    # the input holds the k initial positions (or none, k = 1): the total to expect
    total_guess = None if o.steps is None else max(obj.sizes.get(dim, 0), 1) + o.steps
    f, n0, tvals = _fields(call, obj, o, evolve, total_guess or 0)
    boundary, tmode = _time_boundary(o.boundary, dim)
    plan = planned(f, boundary)
    spec = plan.specs[plan.axis(dim)]
    k = spec.lo
    if o.steps is not None:
        check_grown_length(o, n0, k)
        if k + o.steps != total_guess:
            f, n0, tvals = _fields(call, obj, o, evolve, k + o.steps)
            plan = planned(f, boundary)
    total = f.shape[f.dims.index(dim)]
    if o.steps is None:
        check_own_length(o, total, k)
    if tmode not in ("fill", "extend") or spec.hi and tmode == "fill":
        b = dict(o.boundary) if isinstance(o.boundary, Mapping) else dict.fromkeys(
            f.dims, o.boundary)
        b[dim] = tmode
        plan = planned(f, b)
    _check_size(o, f, plan, k, total, in_memory)
    if plan.var_names is None:
        evolving: tuple[int, ...] = (0,)
    else:
        evolving = tuple(i for i, vd in enumerate(plan.var_dims) if dim in vd)
    return dataclasses.replace(o, plan=plan, k=k, total=total, n0=n0, evolving=evolving,
                               tvals=tvals, tmode=tmode), f


def plan_scan(obj: Any, kernels: Sequence[Any], o: ScanPlan, args: Any, kwargs: Any,
              lifted: Any, static: Any, udyn: Any, *,
              in_memory: bool = True,
              region_dims: Sequence[str] = ()) -> tuple[ScanPlan, Fields]:
    """The scan's one setup, for every backend: the request completed with the
    data's layout (:func:`setup`), and the evolving variables: for a Dataset,
    those the kernels return (traced once per kernel structure and plan),
    each checked not to vary along a dim it lacks, through the kernels' reads
    or through a mesh's regions (``region_dims``: the dims they vary along;
    see :mod:`xstencil._labelled.scan_dims`)."""
    call = o.call
    sp, f = setup(obj, kernels, o, args, kwargs, in_memory=in_memory)
    assert sp.plan is not None
    if sp.plan.var_names is None:
        return sp, f
    shapes = tuple((tuple(np.shape(x)), str(getattr(x, "dtype", ""))) for x in udyn)
    plan = sp.plan
    with precision(f.arrays, args, kwargs):
        got = cached(("returned", lifted.key, plan, static, shapes),
                     lambda: returned(call, plan, kernels, static, udyn))
    names = None if got is None else list(got)  # a copy: the cached list stays intact
    if names is not None and sp.grown and sp.dim not in obj.dims:
        sp, f = setup(obj, kernels, o, args, kwargs, evolve=names, in_memory=in_memory)
    sp = dataclasses.replace(sp, evolving=evolving_indices(sp, names))
    with precision(f.arrays, args, kwargs):
        check_advanced_dims(sp, obj, kernels, lifted, static, udyn, (f.arrays, args, kwargs),
                            region_dims)
    return sp, f


def returned(call: str, plan: Plan, kernels: Sequence[Any], static: Any,
             udyn: Any) -> list[str] | None:
    """The variable names a Dataset kernel returns (``None`` for a DataArray)."""
    if plan.var_names is None:
        return None
    cells = kernel_cells(plan, plan.var_dtypes, pack_coord(np.zeros(0), coord_dtype(plan)).dtype)
    names: list[str] | None = None
    for kn in kernels:
        c = kernel_caller(plan, kn, static)
        shapes = jax.eval_shape(lambda cs, d, c=c: c(cs, d), cells, udyn)
        if not isinstance(shapes, Mapping):
            raise XStencilError(
                f"{call}: a Dataset kernel must return a dict of the variables it advances, "
                f"e.g. {{{plan.var_names[0]!r}: ...}}")
        got = list(shapes)
        unknown = [n for n in got if n not in plan.var_names]
        if unknown:
            raise XStencilError(
                f"{call}: the kernel returned {unknown!r}, which are not data variables; "
                f"available are {plan.var_names!r}")
        if names is not None and set(got) != set(names):
            raise XStencilError(
                f"{call}: the mesh kernels return different variables ({sorted(names)!r} and "
                f"{sorted(got)!r}); every kernel must return the same ones")
        names = got
    return names


def evolving_indices(s: ScanPlan, names: Sequence[str] | None) -> tuple[int, ...]:
    """The indices of the variables a Dataset kernel returns (``names``),
    checked: each has ``dim``, and a grown trajectory advances all that do."""
    call, dim, plan = s.call, s.dim, s.plan
    assert plan is not None
    if names is None:
        return (0,)
    assert plan.var_names is not None
    consts = [n for n in names if dim not in plan.var_dims[plan.var_names.index(n)]]
    if consts:
        raise XStencilError(
            f"{call}: the kernel returned {consts!r}, which have no dim {dim!r}; variables "
            f"without {dim!r} are constants of the scan (give them the dim to advance them)")
    evolving = tuple(plan.var_names.index(n) for n in names)
    if s.grown:
        missing = [n for i, n in enumerate(plan.var_names)
                   if dim in plan.var_dims[i] and i not in evolving]
        if missing:
            raise XStencilError(
                f"{call}: variables {missing!r} have dim {dim!r} but the kernel does not "
                f"return them; when growing a trajectory every variable along {dim!r} must be "
                f"advanced (return them, or drop their {dim!r})")
    return evolving


def time_coord(s: ScanPlan) -> Any:
    """The trajectory's ``dim`` coordinate as the kernel reads it, padded
    (``None`` when the kernel cannot read it)."""
    plan = s.plan
    assert plan is not None
    if s.dim not in plan.coord_dims or s.tvals is None:
        return None
    spec = plan.specs[plan.axis(s.dim)]
    return jnp.asarray(padded_time(s.call, plan, s.dim, s.tvals, spec.lo, spec.hi, s.tmode))


def time_placeholder(s: ScanPlan) -> Any:
    """A stand-in for :func:`time_coord` (``None`` where that is ``None``), one
    window long, for a kernel that does not read the time coordinate."""
    plan = s.plan
    assert plan is not None
    if s.dim not in plan.coord_dims or s.tvals is None:
        return None
    spec = plan.specs[plan.axis(s.dim)]
    cdt = pack_coord(np.zeros(0), coord_dtype(plan)).dtype
    return jnp.zeros((spec.lo + spec.hi + 1,), cdt)


def padded_time(call: str, plan: Plan, dim: str, values: Any, lo: int, hi: int,
                tmode: str) -> np.ndarray:
    """The coordinate along ``dim`` as a kernel reads it (``u.coord(dim)``):
    numeric, in the variables' float dtype, padded by ``(lo, hi)`` positions
    (extended linearly unless the dim's boundary is ``fill``)."""
    c = read_coord(call, dim, np.asarray(values))
    mode = tmode if tmode in ("fill", "extend") else "extend"
    return pack_coord(pad_coord(call, dim, c, lo, hi, mode), coord_dtype(plan))


def coord_dtype(plan: Plan) -> Any:
    """The float dtype coordinates are read in (as in :func:`coord_arrays`)."""
    return read_dtype(plan.var_dtypes)


def check_monotonic(call: str, dim: str, tvals: Any) -> None:
    if tvals is None:
        return
    c = numeric_coord(call, dim, np.asarray(tvals))
    if c is not None and len(c) > 1 and not np.all(np.diff(c) > 0):
        bad = int(np.argmin(np.diff(c) > 0))
        raise XStencilError(
            f"{call}: the kernel reads u.coord({dim!r}), but coordinate {dim!r} does not "
            f"increase strictly (position {bad + 1}: {tvals[bad]!r} -> {tvals[bad + 1]!r}); "
            f"sort the data along {dim!r} (obj.sortby({dim!r})) or pass increasing coord=")

"""The repeat-call fast path of ``map``: per-call work cached per kernel
structure (the :func:`~xstencil._engine.kcache.describe` key).

A labelled call validates its options, infers the window, builds a plan,
pads the coordinates and looks up the compiled function: about a hundred
microseconds of Python that a time-stepping loop pays on every call.  The
first call with a given kernel does all of it (the slow path, where every
error is raised); it then records an :class:`Entry` under a *signature* of
the call: the data's type, dims, shape and dtype, the options, the static
kernel arguments and the shapes of the dynamic ones.  A later call with the
same signature and the same coordinate values skips straight to the compiled
function with the cached padded coordinates (already on the device) and puts
the result back into xarray with a cheap rewrap.

Only plain DataArrays take the fast path (numpy or single-device JAX data,
or tracers); Datasets, dask and sharded data always take the full path.
Coordinates are recognised by the identity of their index objects first and,
failing that, by value, so new objects with equal coordinates hit too.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, NamedTuple

import jax
import numpy as np
import xarray as xr

from xstencil._engine.call import is_wide, narrowed_here, precision, settled, split_static
from xstencil._engine.coords import coord_values, same_values
from xstencil._engine.elements import linear_mode
from xstencil._engine.kcache import Lifted, freeze_each, peek, put
from xstencil._engine.x64flag import x64
from xstencil._labelled.core import (
    Fields,
    coord_arrays,
    dtype_probe,
)
from xstencil._labelled.plan import Plan
from xstencil._labelled.result import host64, replace_data, rewrap

__all__ = ["Entry", "arg_key", "signature", "lookup", "checked", "coord_sources", "run", "remember"]



class Entry(NamedTuple):
    plan: Plan
    fn: Callable[..., Any]
    coords: list[Any]  # padded coordinate arrays on the device
    sources: tuple[Any, ...]  # the coordinates' index objects (identity check)
    values: tuple[np.ndarray, ...]  # the coordinates' values (equality check)
    wide: bool  # run under x64
    simple: bool  # output has the input's shape and dims: rewrap by replacing the data


def arg_key(args: Any, kwargs: Any) -> Hashable:
    """The part of a call's signature that its kernel arguments make: the
    static ones by value, the array ones by shape and dtype (``None``
    without arguments)."""
    if not (args or kwargs):
        return None
    dyn, static = split_static("map", (args, kwargs))
    return static, tuple((np.shape(x), str(getattr(x, "dtype", ""))) for x in dyn)


def signature(obj: Any, options: tuple[Any, ...], args: Any, kwargs: Any) -> Hashable | None:
    """The call's signature, or None where the fast path does not apply
    (also inside a solve's operator, whose lowering differs: elements.linear_mode)."""
    if type(obj) is not xr.DataArray or linear_mode() or narrowed_here():
        return None
    data = obj.variable._data
    if isinstance(data, np.ndarray):
        if not data.dtype.isnative:  # '>f8' from a netCDF3 file: the full path converts
            return None
    elif isinstance(data, jax.core.Tracer):
        pass
    elif isinstance(data, jax.Array):
        if len(data.sharding.device_set) > 1:
            return None
    else:
        return None
    args_key = arg_key(args, kwargs)
    try:
        key = (obj.dims, data.shape, data.dtype, freeze_each(options), args_key, x64())
        hash(key)
    except TypeError:
        return None
    return key


def coord_sources(obj: xr.DataArray, plan: Plan) -> tuple[Any, ...]:
    indexes = getattr(obj, "_indexes", None)
    if indexes is None:
        indexes = obj.xindexes
    return tuple(indexes.get(d) for d in plan.coord_dims)


def lookup(lifted: Lifted, sig: Hashable, obj: xr.DataArray) -> Entry | None:
    return checked(("fast", lifted.key, sig), obj)


def checked(key: Hashable, obj: xr.DataArray) -> Any:
    """The entry cached under ``key`` if ``obj``'s coordinates are still the
    ones it was made from (the same index objects, or equal values), else
    ``None``; map's and the mesh's fast paths both check this way."""
    entry = peek(key)
    if entry is None:
        return None
    if entry.plan.coord_dims:
        now = coord_sources(obj, entry.plan)
        if any(a is not b or a is None for a, b in zip(now, entry.sources, strict=True)):
            variables = obj.coords.variables
            for d, old in zip(entry.plan.coord_dims, entry.values, strict=True):
                v = variables.get(d)
                if v is None or v.dims != (d,) or not same_values(coord_values(v), old):
                    return None
            entry = entry._replace(sources=now)
            put(key, entry)
    return entry


def run(entry: Entry, obj: xr.DataArray, args: Any, kwargs: Any,
        lifted: Lifted, into: Any = None) -> xr.DataArray:
    """The repeated call.  ``into`` is the checked buffer of ``map(...,
    out=)``, passed to the map's engine function (see ``LoopOrJit``)."""
    data = obj.variable._data
    dyn = split_static("map", (args, kwargs))[0] if args or kwargs else []
    leaves = list(lifted.leaves)
    kw = {} if into is None else {"out": into}
    stage = getattr(entry.fn, "stage", None) if entry.simple and not entry.wide else None
    if stage is not None:  # the loop backend: the result is wrapped before the nest runs
        # repeating its last call where it can (LoopOrJit.quick), else staged in full
        staged = entry.fn.quick(data, entry.coords, into, leaves) if not dyn else None
        if staged is None:
            staged = stage([data], entry.coords, dyn, [], leaves, **kw)
        if staged.early is not None:
            res = replace_data(obj, staged.early)  # while the caches still hold this code
            staged.go()  # the nest writes into the arrays res holds; nothing saw them yet
            return res
        return replace_data(obj, settled(staged.go(), (data, dyn, leaves)))
    if entry.wide and not x64():
        with jax.enable_x64(True):
            out = settled(entry.fn([data], entry.coords, dyn, [], leaves, **kw),
                          (data, dyn, leaves))
        out = host64(out)
    else:
        out = settled(entry.fn([data], entry.coords, dyn, [], leaves, **kw), (data, dyn, leaves))
    if entry.simple:
        return replace_data(obj, out)
    f = Fields(obj, entry.plan.dims, entry.plan.shape, None, [data], entry.plan.var_dims,
               entry.plan.var_dtypes)
    return rewrap(entry.plan, f, out)


def remember(lifted: Lifted, sig: Hashable | None, obj: Any, plan: Plan, f: Fields,
             period: Any, args: Any, kwargs: Any, used: dict[str, Any]) -> None:
    """Record the entry for ``sig`` after a successful full call (``used``:
    what :func:`~xstencil._labelled.core.call_engine` compiled and padded)."""
    if sig is None or "fn" not in used:
        return
    fn, coords = used["fn"], used["coords"]
    if any(isinstance(c, jax.core.Tracer) for c in coords):  # made inside a user's trace:
        with precision(f.arrays, args, kwargs):  # keep host copies, never leak tracers
            coords = [np.asarray(c) for c in coord_arrays(plan, f, period)]
    variables = obj.coords.variables
    values = tuple(coord_values(variables[d]) for d in plan.coord_dims)
    index = plan.input_index()
    simple = not plan.output_dims and all(
        s == slice(0, n, 1) for s, n in zip(index.values(), plan.shape, strict=True))
    put(("fast", lifted.key, sig), Entry(plan, fn, coords, coord_sources(obj, plan), values,
                                         is_wide(f.arrays, args, kwargs, dtype_probe(plan)),
                                         simple))

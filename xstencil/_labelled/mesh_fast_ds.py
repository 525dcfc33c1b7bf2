"""The repeat-call fast path of a Dataset's function mesh (``m.map()`` on a
``ds.stencil.mesh(...)``), next to the DataArray one in
:mod:`xstencil._labelled.mesh_run`.

The first call takes the full path (every check, the window inference, the
regions, the result dims of each returned variable, :mod:`~xstencil.
_labelled.returns`) and records a :class:`DsEntry` under the same key as a
DataArray mesh's entry: the kernels' describe key (closed-over and global
values, arrays read afresh), the regions by value (masks by digest), the
branches, and a signature of the call (:func:`ds_signature`: every data
variable's name, dims, shape and dtype, the options and the kernel
arguments).  A later call whose key matches, on data whose index objects are
the ones the regions were checked against (or whose coordinate values are
equal), runs the compiled function on the variables' arrays and rewraps its
results with :func:`~xstencil._labelled.result.rewrap`, as the full path
does, so the result is the same.  A Dataset changed after the mesh was made
(a variable added, dropped or reshaped, new coordinate labels) has another
signature or other index objects and takes the full path, which raises.
Only Datasets with numpy or single-device JAX data take it.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import xarray as xr

from xstencil._engine.call import is_wide, narrowed_here, settled, split_static
from xstencil._engine.coords import coord_values
from xstencil._engine.elements import linear_mode
from xstencil._engine.kcache import Lifted, freeze
from xstencil._engine.x64flag import x64
from xstencil._labelled.core import Fields, dtype_probe
from xstencil._labelled.fastpath import arg_key, coord_sources
from xstencil._labelled.plan import Plan
from xstencil._labelled.result import host64, rewrap
from xstencil._labelled.returns import to_dims

__all__ = ["DsEntry", "ds_signature", "ds_datas", "run_ds", "ds_entry"]


class DsEntry(NamedTuple):
    plan: Plan
    fn: Callable[..., Any]
    coords: list[Any]  # padded coordinate arrays on the device
    dynamic: list[Any]  # the membership array or masks, on the device
    sources: tuple[Any, ...]  # the coordinates' index objects (identity check)
    values: tuple[np.ndarray, ...]  # the coordinates' values (equality check)
    wide: bool  # run under x64
    names: tuple[str, ...]  # the data variables, in the plan's order
    perms: tuple[tuple[int, ...] | None, ...]  # per variable: its transpose to the plan's order
    leaf_dims: Any  # per result: its own dims (returns.py)
    simple: bool  # untrimmed, without output dims: rewrap by replacing the variables


def _plain(data: Any) -> bool:
    """In-memory data the fast path takes: native numpy, or a single-device
    JAX array (not a tracer: a traced call takes the full path)."""
    if isinstance(data, np.ndarray):
        return data.dtype.isnative
    if isinstance(data, jax.core.Tracer) or not isinstance(data, jax.Array):
        return False
    return len(data.sharding.device_set) == 1


def ds_signature(obj: Any, options: tuple[Any, ...], args: Any,
                 kwargs: Any) -> Hashable | None:
    """The signature of a Dataset mesh call, or ``None`` where the fast path
    does not apply (also inside a solve's operator: elements.linear_mode)."""
    if type(obj) is not xr.Dataset or not obj.data_vars or linear_mode() or narrowed_here():
        return None
    variables = obj._variables
    layout = []
    for n in obj.data_vars:
        v = variables[n]
        data = v._data
        if not _plain(data):
            return None
        layout.append((n, v.dims, data.shape, data.dtype))
    try:
        key = ("Dataset", tuple(layout), freeze(options), arg_key(args, kwargs), x64())
        hash(key)
    except TypeError:
        return None
    return key


def ds_datas(obj: xr.Dataset) -> list[Any]:
    """The data variables' arrays (to test them for tracers)."""
    variables = obj._variables
    return [variables[n]._data for n in obj.data_vars]


def _arrays(entry: DsEntry, obj: xr.Dataset) -> list[Any]:
    variables = obj._variables
    out = []
    for n, perm in zip(entry.names, entry.perms, strict=True):
        x = variables[n]._data
        out.append(x if perm is None else x.transpose(perm))
    return out


def run_ds(entry: DsEntry, obj: xr.Dataset, args: Any, kwargs: Any, lifted: Lifted) -> Any:
    """The compiled call on the variables' arrays, and the full path's rewrap."""
    arrays = _arrays(entry, obj)
    dyn = split_static("map", (args, kwargs))[0] if args or kwargs else []
    leaves = list(lifted.leaves)
    inputs = (arrays, dyn, leaves)
    if entry.wide and not jax.config.read("jax_enable_x64"):
        with jax.enable_x64(True):
            out = settled(entry.fn(arrays, entry.coords, dyn, entry.dynamic, leaves), inputs)
    else:
        out = settled(entry.fn(arrays, entry.coords, dyn, entry.dynamic, leaves), inputs)
    out = host64(out)
    plan = entry.plan
    if entry.simple:
        fast = _replaced(plan, obj, out, entry.leaf_dims)
        if fast is not None:
            return fast
    f = Fields(obj, plan.dims, plan.shape, entry.names, arrays, plan.var_dims, plan.var_dtypes)
    return rewrap(plan, f, out, entry.leaf_dims)


def _replaced(plan: Plan, obj: xr.Dataset, out: Any, leaf_dims: Any) -> xr.Dataset | None:
    """:func:`~xstencil._labelled.result.rewrap`'s Dataset for an untrimmed
    output without output dims, built without xarray's merge and alignment
    (the results' dims and coords are the input's): every variable copied
    shallowly, each result a new variable on its own dims with a copy of its
    attrs (``None``: xarray's internals moved, take the public way)."""
    if not isinstance(out, Mapping):
        return None
    try:
        variables = {k: v.copy(deep=False) for k, v in obj._variables.items()}
        for n, v in out.items():
            own = leaf_dims[n]
            old = variables.get(n)
            attrs = {} if old is None else dict(old.attrs)
            variables[n] = xr.Variable(own, to_dims(plan, v, own), attrs, fastpath=True)
        return obj._replace(variables=variables, indexes=dict(obj._indexes),
                            attrs=dict(obj.attrs))
    except (AttributeError, TypeError, KeyError):
        return None


def ds_entry(plan: Plan, f: Fields, args: Any, kwargs: Any, fn: Callable[..., Any],
             coords: Sequence[Any], dynamic: Sequence[Any],
             leaf_dims: Mapping[Any, tuple[str, ...]] | None) -> DsEntry | None:
    """The entry to record after a successful full call of a Dataset mesh
    (``None`` where a variable's dims cannot be matched)."""
    obj = f.obj
    assert f.names is not None
    perms: list[tuple[int, ...] | None] = []
    for n, vd in zip(f.names, plan.var_dims, strict=True):
        own = tuple(str(d) for d in obj[n].dims)
        if set(own) != set(vd):
            return None
        perm = tuple(own.index(d) for d in vd)
        perms.append(None if perm == tuple(range(len(perm))) else perm)
    if leaf_dims is None:
        return None
    variables = obj.coords.variables
    values = tuple(coord_values(variables[d]) for d in plan.coord_dims)
    index = plan.input_index()
    simple = not plan.output_dims and all(
        s == slice(0, n, 1) for s, n in zip(index.values(), plan.shape, strict=True))
    return DsEntry(plan, fn, list(coords), [jnp.asarray(x) for x in dynamic],
                   coord_sources(obj, plan), values,
                   is_wide(f.arrays, args, kwargs, dtype_probe(plan)), tuple(f.names),
                   tuple(perms), dict(leaf_dims), simple)

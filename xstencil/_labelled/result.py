"""Results back into xarray: :func:`rewrap` puts the engine's output into a
DataArray or Dataset with the input's dims, coords, attrs and name (each
result on its own dims, see returns.py); :func:`host64` keeps 64-bit results
on the host while JAX's x64 flag is off; :func:`replace_data` swaps a
DataArray's data cheaply."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
import xarray as xr

from xstencil._labelled.core import Fields
from xstencil._labelled.plan import Plan
from xstencil._labelled.returns import to_dims

__all__ = ["host64", "replace_data", "rewrap"]


def host64(tree: Any) -> Any:
    """64-bit results as numpy arrays when JAX's x64 flag is off.

    A float64 JAX array outside an x64 context is truncated to float32 by the
    next JAX operation on it (with a warning), so labelled results keep their
    precision through follow-up arithmetic by living on the host instead.
    Tracers and 32-bit results are returned unchanged.
    """
    if jax.config.read("jax_enable_x64"):
        return tree

    def conv(x: Any) -> Any:
        if isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer) \
                and x.dtype.itemsize == 8 and x.is_fully_addressable \
                and len(x.sharding.device_set) == 1:
            return np.asarray(x)
        return x

    return jax.tree_util.tree_map(conv, tree)


def replace_data(obj: xr.DataArray, out: Any) -> xr.DataArray:
    """``obj.copy(deep=False, data=out)`` without the encoding (the on-disk
    dtype and scale_factor were the input's), in a few microseconds:
    coordinate variables are copied shallowly, indexes (immutable) shared."""
    try:
        var = xr.Variable(obj.dims, out, dict(obj.attrs), fastpath=True)
        coords = {k: v.copy(deep=False) for k, v in obj._coords.items()}
        return obj._replace(variable=var, coords=coords, indexes=dict(obj._indexes))
    except (AttributeError, TypeError):  # xarray internals moved: the public way
        res = obj.copy(deep=False, data=out)
        res.encoding = {}
        return res


def rewrap(plan: Plan, f: Fields, out: Any,
           leaf_dims: Mapping[str | None, tuple[str, ...]] | None = None
           ) -> xr.DataArray | xr.Dataset:
    """Put the engine's output back into xarray with dims, coords, attrs, name.

    ``leaf_dims`` (Datasets, see returns.py) gives each result's own dims."""
    out = host64(out)
    index = {d: s for d, s in plan.input_index().items()
             if s != slice(0, f.shape[plan.axis(d)], 1)}
    if isinstance(f.obj, xr.DataArray) and not index and not plan.output_dims \
            and not isinstance(out, Mapping):
        return replace_data(f.obj, out)
    coords_ds = f.obj.coords.to_dataset()
    if index:  # coords may lack some of the dims (dims without coordinates)
        coords_ds = coords_ds.isel({d: s for d, s in index.items() if d in coords_ds.dims})
    dims = plan.dims + plan.output_dims
    if isinstance(out, Mapping):
        ds = f.obj if not index else f.obj.isel(index)
        ds = ds.copy(deep=False)
        for n, v in out.items():
            v, vdims, vcoords = _own_dims(plan, coords_ds, v, dims, leaf_dims, n)
            ds[n] = xr.DataArray(v, dims=vdims, coords=vcoords,
                                 attrs=f.obj[n].attrs if n in f.obj else {}, name=n)
        return ds
    attrs = f.obj.attrs
    name = f.obj.name if isinstance(f.obj, xr.DataArray) else None
    out, dims, coords = _own_dims(plan, coords_ds, out, dims, leaf_dims, None)
    res = xr.DataArray(out, dims=dims, coords=coords, attrs=dict(attrs))
    res.name = name  # not name=: a None there takes a dask array's graph name
    return res


def _own_dims(plan: Plan, coords_ds: xr.Dataset, v: Any, dims: tuple[str, ...],
              leaf_dims: Mapping[str | None, tuple[str, ...]] | None, name: str | None
              ) -> tuple[Any, tuple[str, ...], Any]:
    """A result reduced to its own dims (``leaf_dims[name]``), with the coords on them."""
    if leaf_dims is None or name not in leaf_dims:
        return v, dims, coords_ds.coords
    own = leaf_dims[name]
    v = to_dims(plan, v, own)
    dims = own + plan.output_dims
    drop = [k for k, c in coords_ds.coords.items() if not set(c.dims) <= set(dims)]
    return v, dims, coords_ds.drop_vars(drop).coords

"""A kernel or a mesh as a function of raw arrays, for the compiled loops of
:func:`xstencil.iterate` and :func:`xstencil.solve`.

The state travels through ``lax.while_loop`` as plain arrays; each step wraps
them back into a DataArray or Dataset shaped like the input (same dims,
coords, attrs) and runs the ordinary :func:`xstencil.map` or
:meth:`xstencil.Mesh.map` on it, so the kernel is lowered by the same
shifted-slice machinery (and compile cache) as every other map.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
import xarray as xr
from jax.dtypes import canonicalize_dtype

from xstencil._engine.call import native
from xstencil._engine.coords import coord_digest
from xstencil._engine.fresh import fresh
from xstencil._errors import XStencilError
from xstencil._labelled.loop_body import MeshSpec
from xstencil._labelled.map import map as _map
from xstencil._labelled.mesh import Mesh
from xstencil._labelled.step_labels import by_label

__all__ = ["State", "state_of", "step_function", "weak", "mesh_order", "own_order"]

_MAP_OPTIONS = ("window", "boundary", "fill_value", "period")


class State:
    """The layout of a DataArray or Dataset state: names, dims and a template
    to wrap arrays back into labelled objects."""

    def __init__(self, call: str, obj: Any, discrete: bool = False):
        self.call = call
        if isinstance(obj, xr.DataArray):
            self.names: tuple[str, ...] | None = None
            self.arrays = [native(obj.data)]
        elif isinstance(obj, xr.Dataset):
            self.names = tuple(str(n) for n in obj.data_vars)
            if not self.names:
                raise XStencilError(f"{call}: the Dataset has no data variables")
            self.arrays = [native(obj[n].data) for n in self.names]
        else:
            raise XStencilError(
                f"{call}: expected an xarray DataArray or Dataset, got {type(obj).__name__}: "
                f"{obj!r:.60}; wrap it with xarray.DataArray(..., dims=...)")
        for x in self.arrays:
            if np.dtype(x.dtype).kind not in ("fcbiu" if discrete else "fc"):
                kinds = "floating point, integer or bool" if discrete else "floating point"
                raise XStencilError(
                    f"{call}: the data has dtype {x.dtype}; {kinds} data is needed here "
                    f"(convert with .astype(float))")
        # the layout only: no reference to the data (compiled loops keep the State)
        self.dims = tuple(obj.dims)
        self.coords = obj.coords.to_dataset().coords
        self.name = obj.name if isinstance(obj, xr.DataArray) else None
        self.attrs = dict(obj.attrs)
        self.var = {} if self.names is None else {
            n: (tuple(obj[n].dims), dict(obj[n].attrs)) for n in self.names}
        self.shape = tuple(obj.shape) if self.names is None else None
        self.var_shapes = None if self.names is None else tuple(
            tuple(obj[n].shape) for n in self.names)
        self.dtypes = tuple(np.dtype(x.dtype) for x in self.arrays)

    def wrap(self, datas: Sequence[Any]) -> Any:
        """Arrays in the state's order, as a DataArray or Dataset like the input."""
        if self.names is None:
            return xr.DataArray(datas[0], dims=self.dims, coords=self.coords, name=self.name,
                                attrs=dict(self.attrs))
        return xr.Dataset({n: (self.var[n][0], d, dict(self.var[n][1]))
                           for n, d in zip(self.names, datas, strict=True)},
                          coords=self.coords, attrs=dict(self.attrs))

    def unwrap(self, obj: Any) -> list[Any]:
        """The arrays of a map's result, in the state's order and dtypes."""
        indexes = self.coords.indexes
        if self.names is None:
            obj = by_label(self.call, obj, indexes, "step= returned the state with")
            return [self._cast(jnp.asarray(obj.transpose(*self.dims).data), self.dtypes[0],
                               "the state")]
        return [self._cast(jnp.asarray(by_label(self.call, obj[n], indexes,
                                                f"step= returned {n!r} with")
                                       .transpose(*self.var[n][0]).data), dt, repr(n))
                for n, dt in zip(self.names, self.dtypes, strict=True)]

    def _cast(self, x: Any, dt: np.dtype, what: str) -> Any:
        """``x`` in the state's dtype ``dt``.  A bool or integer state takes only
        results that fit it exactly: a float result would be truncated (0.4 to
        False) and a wider integer wrapped (a uint32 count into uint8)."""
        if dt.kind in "biu" and not np.can_cast(x.dtype, dt, "safe"):
            raise XStencilError(
                f"{self.call}: the step returned {what} as {x.dtype}, which does not fit the "
                f"state's {dt} exactly; return {dt} values (a comparison for bool, or "
                f".astype({dt.name!r}) where the values fit)")
        return x.astype(canonicalize_dtype(dt))

    def key(self) -> Any:
        """What decides a trace: names, dims, shapes, dtypes, coordinate values
        and the attrs and name (the compiled loop wraps each step's state with
        this State's, so a step function reading them must not see an older
        call's)."""
        coords = [coord_digest(n, v) for n, v in self.coords.items()]
        vars_ = [(None, self.dims, self.shape)] if self.names is None else \
            [(n, self.var[n][0], sh, repr(self.var[n][1]))
             for n, sh in zip(self.names, self.var_shapes, strict=True)]
        return (tuple(vars_), tuple(map(str, self.dtypes)), tuple(coords),
                repr(self.name), repr(self.attrs))


def state_of(call: str, obj: Any) -> State:
    return State(call, obj)


def weak(x: Any) -> Callable[[], Any]:
    """A weak reference to ``x``, or a strong one where Python allows no weak one."""
    try:
        return weakref.ref(x)
    except TypeError:
        return lambda: x


def mesh_order(obj: Any, mesh: Any) -> Any:
    """``obj`` with each variable's dims in the order of the data ``mesh`` was
    built on (a mask region is stored in that order: on a square field, a
    transposed state read it transposed).  Not a mesh, or nothing to do:
    ``obj`` itself."""
    ref = getattr(mesh, "_obj", None) if isinstance(mesh, Mesh) else None
    if isinstance(obj, xr.DataArray) and isinstance(ref, xr.DataArray):
        return obj.transpose(*ref.dims) if obj.dims != ref.dims else obj
    if isinstance(obj, xr.Dataset) and isinstance(ref, xr.Dataset):
        new = {n: obj[n].transpose(*ref[n].dims) for n in obj.data_vars
               if n in ref.data_vars and obj[n].dims != ref[n].dims
               and set(obj[n].dims) == set(ref[n].dims)}
        return obj.assign(new) if new else obj
    return obj


def own_order(field: Any, like: Any) -> Any:
    """``field`` (a result in :func:`mesh_order`) back in ``like``'s dim orders."""
    if isinstance(field, xr.DataArray):
        return field.transpose(*like.dims) if field.dims != like.dims else field
    new = {n: field[n].transpose(*like[n].dims) for n in field.data_vars
           if n in like.data_vars and field[n].dims != like[n].dims}
    return field.assign(new) if new else field


def step_function(call: str, body: Any, state: State, options: Mapping[str, Any],
                  free: bool = False) -> Callable[..., list[Any]]:
    """``step(datas, args, kwargs)``: one application of ``body`` (a kernel or a
    :class:`~xstencil.Mesh`; with ``free``, any function of the labelled state,
    as ``scan(step=...)``) to arrays shaped like the state."""
    if free:
        if not callable(body):
            raise XStencilError(f"{call}: step={body!r:.60} is not callable; pass a function "
                                f"of the state returning the next state")

        def free_step(datas: Sequence[Any], args: Any, kwargs: Any) -> list[Any]:
            new = fresh(body)(state.wrap(datas), *args, **kwargs)
            if state.names is None and not isinstance(new, xr.DataArray) or \
                    state.names is not None and not isinstance(new, xr.Dataset):
                raise XStencilError(f"{call}: step= returned {type(new).__name__}; return "
                                    f"an object like the state (a DataArray or Dataset)")
            return state.unwrap(new)

        return free_step
    if isinstance(body, Mesh | MeshSpec):
        bad = [k for k in _MAP_OPTIONS if options.get(k) is not None]
        if bad:
            raise XStencilError(
                f"{call}: {bad[0]}= is set on the mesh itself (da.stencil.mesh({bad[0]}=...)); "
                f"drop it here")
        regions = list(body._regions) if isinstance(body, Mesh) else body.regions()
        mopts = dict(body._options)
        if not regions:
            raise XStencilError(f"{call}: the mesh has no regions; assign kernels with "
                                f"m[...] = f before iterating")

        def step(datas: Sequence[Any], args: Any, kwargs: Any) -> list[Any]:
            m = Mesh(state.wrap(datas), **mopts)
            m._regions = list(regions)
            return state.unwrap(m.map(*args, **kwargs))

        return step
    if not callable(body):
        raise XStencilError(
            f"{call}: body={body!r:.60} is neither a kernel (a function of one window) nor a "
            f"mesh (da.stencil.mesh(...)); pass e.g. lambda u: 0.5 * (u(x=1) + u(x=-1))")
    opts = {k: v for k, v in options.items() if v is not None}

    def step(datas: Sequence[Any], args: Any, kwargs: Any) -> list[Any]:
        return state.unwrap(_map(state.wrap(datas), body, *args, **opts, **kwargs))

    return step

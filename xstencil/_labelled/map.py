"""``xstencil.map``: one kernel over a whole DataArray or Dataset."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import xarray as xr

from xstencil._dask import any_dask
from xstencil._engine.lower import evaluate
from xstencil._errors import XStencilError, raised_here
from xstencil._labelled.core import call_engine, kernel_caller, prepare, rewrap, sources, unwrap
from xstencil._labelled.fastpath import lookup, remember, run, signature
from xstencil._shard import is_sharded

__all__ = ["map"]


@raised_here
def map(  # noqa: A001 - the contract's name
    obj: xr.DataArray | xr.Dataset,
    kernel: Callable[..., Any],
    *args: Any,
    window: Mapping[str, int | tuple[int, int]] | None = None,
    boundary: str | Mapping[str, str] = "fill",
    fill_value: Any = None,
    stride: int | Mapping[str, int] | None = None,
    output_dims: str | Sequence[str] | None = None,
    period: Mapping[str, float] | None = None,
    mesh: Any = None,
    **kwargs: Any,
) -> xr.DataArray | xr.Dataset:
    """Apply a stencil kernel at every point of a DataArray or Dataset.

    Parameters
    ----------
    obj
        The data.  For a Dataset the kernel receives a
        :class:`~xstencil.WindowSet`: ``s["u"]`` (or ``s.u``) is the window of
        variable ``u``.
    kernel
        ``kernel(u, *args, **kwargs)``, a function of one window ``u``:
        ``u()`` is the centre, ``u(x=1, y=-1)`` reads by dim name,
        ``u[1, -1]`` by relative position in the window's dim order, and
        ``u`` works as an array of the window's shape (``(u * w).sum()``).
        ``u.coord("x")`` is the window of coordinate ``x``.  It returns a
        scalar, an array (new trailing dims, see ``output_dims``), or, for a
        Dataset, a dict of variables.
    *args, **kwargs
        Passed to the kernel.  Arrays among them are traced (differentiable,
        no recompilation when they change); other values are static.
    window
        ``{dim: size}`` (centred; an even size leans left, so the centre is at
        ``(size - 1) // 2``) or ``{dim: (lo, hi)}`` (cells before and after the
        centre).  Inferred from the offsets the kernel reads when omitted.
        Dims not in the window are mapped over.
    boundary
        One mode or ``{dim: mode}`` (unlisted dims get ``"fill"``): ``"fill"``,
        ``"extend"``, ``"periodic"``, ``"reflect"``, ``"symmetric"`` or
        ``"valid"`` (no halo: the output shrinks and its coords are trimmed).
    fill_value
        The halo value for ``"fill"``.  Defaults to NaN for float data, as in
        :meth:`xarray.DataArray.rolling`; integer data needs a value.
    stride
        ``{dim: step}`` (or one int for all dims): compute every step-th point.
        Coords are subsampled to match.
    output_dims
        Names of the trailing dims for kernels that return arrays.
    period
        ``{dim: period}`` of a periodic coordinate, for ``u.coord`` across the
        periodic seam; inferred from uniform spacing when omitted.
    mesh
        Run on several devices: ``{dim: mesh_axis_name}`` or a
        :class:`jax.sharding.Mesh` whose axes are named after dims.  Data that
        is already a sharded JAX array runs sharded without it.  See
        :doc:`/scaling`.

    Returns
    -------
    DataArray or Dataset
        With the input's dims, dim order, coords, attrs and name, holding a
        JAX array of the input's dtype (float64 stays float64).

    Notes
    -----
    The kernel is traced and compiled once per kernel, data layout (dims,
    shape, dtype) and options.  A repeated call with the same ones reuses the
    compiled function and also skips validation and planning.  A lambda
    written inline, new on every call, counts as the same kernel when its
    code and the values it closes over are the same (numbers, strings,
    modules, functions); one that closes over an array compiles on every
    call, so define such kernels once.  ``map`` works inside ``jax.jit``,
    ``jax.grad`` and ``jax.vmap``, and DataArrays and Datasets are pytrees, so
    those transforms also accept functions that take and return them.

    Examples
    --------
    >>> import numpy as np, xarray as xr, xstencil
    >>> da = xr.DataArray(np.arange(5.0), dims="x", coords={"x": np.arange(5) * 0.5})
    >>> out = da.stencil.map(lambda u: u(x=1) - u(x=-1), boundary="extend")
    >>> out.values
    array([1., 2., 2., 2., 1.])
    >>> ddx = da.stencil.map(lambda u: (u(x=1) - u(x=-1)) /
    ...                      (u.coord("x")(x=1) - u.coord("x")(x=-1)), boundary="periodic")
    >>> ddx.values
    array([-4.,  2.,  2.,  2., -4.])
    """
    call = "da.stencil.map(...)" if isinstance(obj, xr.DataArray) else "ds.stencil.map(...)"
    if not callable(kernel):
        raise XStencilError(f"{call}: kernel={kernel!r:.60} is not callable; pass a function "
                            f"of one window, e.g. lambda u: u(x=1) - u(x=-1)")
    sig = None
    if mesh is None:  # a repeated call: skip validation and planning (see fastpath.py)
        sig = signature(obj, (window, boundary, fill_value, stride, output_dims, period),
                        args, kwargs)
        entry = None if sig is None else lookup(kernel, sig, obj)
        if entry is not None:
            return run(entry, obj, args, kwargs)
    f = unwrap(call, obj)
    plan = prepare(call, f, [kernel], window=window, boundary=boundary, fill_value=fill_value,
                   stride=stride, output_dims=output_dims, args=args, kwargs=kwargs)
    if any_dask(f.arrays):  # lazy: xstencil._dask builds a map_overlap graph
        from xstencil._dask import map_dask

        return rewrap(plan, f, map_dask(plan, f, [kernel], args, kwargs, period, mesh=mesh))
    if mesh is not None or is_sharded(f.arrays):  # several devices: xstencil._shard
        from xstencil._shard import map_sharded

        return rewrap(plan, f, map_sharded(plan, f, [kernel], args, kwargs, period, mesh, kernel))
    used: dict[str, Any] = {}
    out = call_engine(plan, f, kernel, None, _body, args, kwargs, period, used=used)
    remember(kernel, sig, obj, plan, f, period, args, kwargs, used)
    return rewrap(plan, f, out)


def _body(kernel: Any, plan: Any, static: Any, arrays: Any, coords: Any, dyn: Any,
          dynamic: Any) -> Any:
    return evaluate(kernel_caller(plan, kernel, static), sources(plan, arrays, coords),
                    plan.geom, dyn)

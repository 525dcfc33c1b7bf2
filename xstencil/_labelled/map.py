"""``xstencil.map``: one kernel over a whole DataArray or Dataset."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import jax
import numpy as np
import xarray as xr

from xstencil._backends.dask import with_progress
from xstencil._backends.loops import LoopOrJit, backend_arg
from xstencil._engine.call import precision, split_static
from xstencil._engine.kcache import cached, describe, rebuild
from xstencil._engine.lower import evaluate
from xstencil._errors import XStencilError, raised_here
from xstencil._labelled.core import call_engine, kernel_caller, prepare, sources, unwrap
from xstencil._labelled.dispatch import devices_arg, map_scaled
from xstencil._labelled.dtypes import out_dtype
from xstencil._labelled.fastpath import lookup, remember, run, signature
from xstencil._labelled.map_out import Target, check_alias, deliver, out_target
from xstencil._labelled.result import rewrap
from xstencil._labelled.returns import check_new_vars, result_dims
from xstencil._labelled.sizes import check_inputs
from xstencil._labelled.staggered_ops import FILL, map_grid

__all__ = ["map"]


@raised_here
def map(  # noqa: A001 - the contract's name
    obj: xr.DataArray | xr.Dataset,
    kernel: Callable[..., Any],
    *args: Any,
    window: Mapping[str, int | tuple[int, int]] | None = None,
    boundary: str | Mapping[str, str] = FILL,
    fill_value: Any = None,
    stride: int | Mapping[str, int] | None = None,
    output_dims: str | Sequence[str] | None = None,
    period: Mapping[str, float] | None = None,
    devices: Any = None,
    mesh: Any = None,
    new_vars: str | Sequence[str] | None = None,
    grid: Any = None,
    at: Mapping[str, str] | None = None,
    dtype: Any = None,
    progress: bool = False,
    backend: str | None = None,
    out: Any = None,
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
        Default ``"fill"``; on a grid, the grid's padding per axis.
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
        periodic seam; inferred from uniform spacing when omitted.  It does
        not make a dim periodic: a period for a window dim whose boundary is
        not ``"periodic"`` raises (it would be ignored).
    devices
        Run on several devices: ``{dim: mesh_axis_name}`` or a
        :class:`jax.sharding.Mesh` whose axes are named after dims.  Data that
        is already a sharded JAX array runs sharded without it.  See
        :doc:`/scaling`.
    new_vars
        Names a Dataset kernel may return that are not data variables yet
        (new variables); any other unknown name raises, to catch typos.  See
        :doc:`/datasets` for the dims each result gets.
    grid, at
        A staggered grid (an ``xgcm.Grid``, ``{"X": {"center": "x_c", "left":
        "x_g"}}``, or ``"comodo"`` to read the Dataset's ``axis`` and
        ``c_grid_axis_shift`` attributes) and the output position per axis
        (``{"X": "left"}``; omitted: the position all inputs share).  The
        kernel reads by axis name in cells from the output point,
        ``s["v"](X=0.5)``; see :doc:`/staggered`.
    mesh
        Deprecated spelling of ``devices`` (a DeprecationWarning says so).
    dtype
        Cast the results to this dtype.  By default the result has the dtype
        the kernel returns (numpy's and JAX's rule; see :doc:`/dtypes`).
    progress
        For dask-backed data: compute the result now, kept chunked
        (``persist``), under dask's progress display (a
        :class:`dask.diagnostics.ProgressBar` on local schedulers,
        ``distributed.progress`` with a distributed ``Client``).  Without
        it the result is lazy; compute it inside ``with ProgressBar():``
        for the same bar.  In memory a map is one compiled call and shows
        no progress.
    backend
        ``"auto"`` (the default, else the ``XSTENCIL_BACKEND`` environment
        variable), ``"loops"`` or ``"xla"``.  ``"auto"`` runs numpy data of
        at least 512 x 512 outputs on the CPU as numba loop nests, and so
        each such block of dask-backed numpy data; everything else (JAX
        arrays, transforms, GPUs, kernels the loops cannot express) runs
        with XLA, with the same result.  ``"loops"`` drops the size floor;
        ``"xla"`` never loops.  See :doc:`/performance`.
    out
        A preallocated result: a writeable, C-contiguous numpy array (or a
        DataArray whose ``.data`` is one, with the result's dims) of exactly
        the result's shape and dtype, sharing no memory with the data, its
        coords or the kernel's arrays.  The loop backend writes into it
        directly, which saves the page faults of a new result (about half the
        time of a large map); other paths copy their result into it.  The
        returned DataArray wraps ``out`` (``res.data is out``), so a later
        call with the same ``out`` overwrites it, as in numpy.  DataArray maps
        on in-memory data only, outside ``jax.jit``/``grad``/``vmap``; a
        wrong shape, dtype or layout raises rather than casting or copying.

    Returns
    -------
    DataArray or Dataset
        With the input's dims, dim order, coords, attrs and name, holding a
        JAX array of the dtype the kernel returns: a sum over a uint8 or bool
        window is an integer of JAX's default width, a kernel that computes
        in float32 returns float32, and a Python scalar takes the data's
        dtype.  float64 data stays float64 when JAX's x64 flag is off.

    Notes
    -----
    The kernel is traced and compiled once per kernel, data layout (dims,
    shape, dtype) and options.  A repeated call with the same ones reuses the
    compiled function and also skips validation and planning.  A lambda
    written inline, new on every call, counts as the same kernel when its
    code and the values it reads are the same (numbers and strings by value,
    arrays by shape and dtype: closed-over arrays are inputs of the compiled
    function, so a new weight array of the same shape does not recompile).
    A changed global, default or class attribute is never served stale; see
    :doc:`/performance`.  ``map`` works inside ``jax.jit``,
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
    >>> buf = np.empty(5)
    >>> res = da.stencil.map(lambda u: u(x=1) - u(x=-1), boundary="extend", out=buf)
    >>> res.data is buf, buf
    (True, array([1., 2., 2., 2., 1.]))
    """
    call = "da.stencil.map(...)" if isinstance(obj, xr.DataArray) else "ds.stencil.map(...)"
    if not callable(kernel):
        raise XStencilError(f"{call}: kernel={kernel!r:.60} is not callable; pass a function "
                            f"of one window, e.g. lambda u: u(x=1) - u(x=-1)")
    if progress:  # dask-backed: persist now under dask's progress display
        return with_progress(map(obj, kernel, *args, window=window, boundary=boundary,
                                 fill_value=fill_value, stride=stride, output_dims=output_dims,
                                 period=period, devices=devices, mesh=mesh, new_vars=new_vars,
                                 grid=grid, at=at, dtype=dtype, backend=backend, out=out,
                                 **kwargs))
    devices = devices_arg(call, devices, mesh)
    backend = backend_arg(call, backend)
    target = out_target(call, obj, out, devices=devices, grid=grid, at=at, trims=stride is not None
                        or "valid" in (boundary.values() if isinstance(boundary, dict)
                                       else (boundary,)))
    if grid is not None or at is not None:  # staggered: translated into a plain call
        res = map_grid(map, obj, kernel, args, kwargs, grid=grid, at=at, window=window,
                       boundary=boundary, fill_value=fill_value, stride=stride,
                       output_dims=output_dims, period=period, mesh=devices,
                       new_vars=new_vars)
        return res if dtype is None else res.astype(out_dtype(call, dtype))
    return _map(call, obj, kernel, args, kwargs, (window, boundary, fill_value, stride,
                                                  output_dims, period), devices, new_vars,
                dtype, backend, target)


def _map(call: str, obj: Any, kernel: Callable[..., Any], args: tuple[Any, ...],
         kwargs: dict[str, Any], options: tuple[Any, ...], devices: Any, new_vars: Any,
         dtype: Any, backend: str | None = None, target: Target | None = None) -> Any:
    """A plain map: a repeated call from the fast path, else validate and
    plan, then run on the backend the arrays choose (the engine in memory).
    ``options`` is ``(window, boundary, fill_value, stride, output_dims,
    period)``; ``target`` is the checked ``out=`` (map_out.py)."""
    window, boundary, fill_value, stride, output_dims, period = options
    sig = None
    lifted = describe([kernel])  # the compile-cache key and closed-over arrays (kcache.py)
    into = None if target is None else target.buf
    if target is not None:
        check_alias(call, target, obj, args, kwargs, lifted.leaves)
    if devices is None:  # a repeated call: skip validation and planning (see fastpath.py)
        sig = signature(obj, (window, boundary, fill_value, stride, output_dims, period,
                              str(dtype) if dtype is not None else None, backend), args,
                        kwargs)
        entry = None if sig is None else lookup(lifted, sig, obj)
        if entry is not None:
            return deliver(call, target, run(entry, obj, args, kwargs, lifted, into))
    result = out_dtype(call, dtype)
    f = unwrap(call, obj)
    check_inputs(call, f.names or (None,), f.arrays)  # e.g. a huge broadcast view
    # a float64 dtype= runs the kernel under x64: so does the trace that infers its window
    with precision(np.zeros(0, result) if isinstance(result, np.dtype) else None):
        plan = prepare(call, f, [kernel], window=window, boundary=boundary,
                       fill_value=fill_value, stride=stride, output_dims=output_dims,
                       args=args, kwargs=kwargs)
    plan = replace(plan, out_dtype=result)
    leaf_dims = None
    if f.names is not None:  # each result gets its own dims (returns.py)
        leaf_dims = leaf_dims_cached(plan, f, [kernel], lifted.key, args, kwargs, new_vars)
    elif new_vars is not None:
        raise XStencilError(f"{call}: new_vars={new_vars!r:.60} is for Dataset kernels that "
                            f"return a dict; a DataArray kernel returns one value")
    out = map_scaled(plan, f, [kernel], kernel, args, kwargs, period, devices,
                     backend=backend)
    if out is not None:  # dask-backed or sharded: the backend chosen by the arrays
        return rewrap(plan, f, out, leaf_dims)
    used: dict[str, Any] = {}
    out = call_engine(plan, f, lifted, ("loops", backend), _body, args, kwargs, period,
                      used=used, loops=_loop_backend(plan, backend), out=into)
    remember(lifted, sig, obj, plan, f, period, args, kwargs, used)
    return deliver(call, target, rewrap(plan, f, out, leaf_dims))


def _body(kernels: Any, plan: Any, static: Any, arrays: Any, coords: Any, dyn: Any,
          dynamic: Any) -> Any:
    return evaluate(kernel_caller(plan, kernels[0], static), sources(plan, arrays, coords),
                    plan.geom, dyn)


def _loop_backend(plan: Any, backend: str | None) -> Callable[..., Any]:
    """Wrap the jitted map in the CPU loop backend (``_backends/loops.py``)."""

    def wrap(jitted: Callable[..., Any], template: Any, static: Any) -> LoopOrJit:
        def kernel(cells: Any, dyn: Any, leaves: Any) -> Any:
            return kernel_caller(plan, rebuild(template, leaves)[0], static)(cells, dyn)

        return LoopOrJit(jitted, kernel, lambda arrays, coords: sources(plan, arrays, coords),
                         plan.geom, backend)

    return wrap


def leaf_dims_cached(plan: Any, f: Any, kernels: Sequence[Any], kernels_key: Any, args: Any,
                     kwargs: Any, new_vars: Any, region_dims: Sequence[str] = ()) -> Any:
    """The dims of each result of a Dataset kernel (returns.py), traced once per
    kernel structure (``kernels_key``, from :func:`describe`), data layout and
    region dims, and then kept in the compile cache (shared by map and mesh)."""
    dyn, static = split_static(plan.call, (args, kwargs))
    names = check_new_vars(plan.call, new_vars)
    region_dims = tuple(region_dims)

    def build() -> Any:
        # the explicit dtype= too: a requested float64 traces under x64 (else JAX warns)
        return result_dims(plan, f.obj, [kernel_caller(plan, k, static) for k in kernels], dyn,
                           (f.arrays, args, kwargs, plan.dtype_probe()), names, region_dims)

    obj = f.obj
    layout = (tuple((str(n), tuple(str(d) for d in obj[n].dims)) for n in obj.data_vars),
              tuple((str(n), tuple(str(d) for d in c.dims)) for n, c in obj.coords.items()),
              tuple((np.shape(x), str(x.dtype if hasattr(x, "dtype") else np.result_type(x)))
                    for x in jax.tree_util.tree_leaves(dyn)))
    key = ("result_dims", kernels_key, plan, static, names, layout, region_dims)
    try:
        hash(key)
    except TypeError:
        return build()
    return cached(key, build)

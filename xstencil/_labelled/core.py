"""The labelled pipeline shared by map, mesh and scan: unwrap an xarray
object into fields and run the engine under a cached jit; kernel_call.py
builds the kernels' windows inside the trace, result.py rewraps the result with
its coords."""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import xarray as xr

from xstencil._engine.call import (
    as_array,
    dtype_kind,
    native,
    outside_transforms,
    precision,
    settled,
    split_static,
)
from xstencil._engine.coords import (
    coord_values,
    is_cftime,
    numeric_coord,
    pack_coord,
    pad_coord,
    read_coord,
    read_dtype,
    same_values,
    warn_repeated_endpoint,
)
from xstencil._engine.dense_hoist import Staged
from xstencil._engine.elements import linear_mode
from xstencil._engine.kcache import (
    Lifted,
    cached,
    compiled,
    describe,
    peek,
    put,
    rebuild,
    settle,
)
from xstencil._engine.lower import Source
from xstencil._errors import XStencilError
from xstencil._labelled.kernel_call import dtype_probe, identity_caller, kernel_caller
from xstencil._labelled.kernel_checks import (
    check_extra_args,
    check_known_chunks,
)
from xstencil._labelled.plan import (
    Plan,
    check_options,
    infer_window,
    make_plan,
    parse_window,
)

__all__ = ["Fields", "unwrap", "prepare", "kernel_caller", "identity_caller",
           "compiled", "sources", "dtype_probe"]


@dataclass
class Fields:
    """An xarray object seen as named arrays over a common field of dims."""

    obj: xr.DataArray | xr.Dataset
    dims: tuple[str, ...]
    shape: tuple[int, ...]
    names: tuple[str, ...] | None  # None for a DataArray
    arrays: list[Any]  # data in field dim order (per variable: its own dims)
    var_dims: tuple[tuple[str, ...], ...]
    dtypes: tuple[Any, ...]


def _check_dtype(call: str, name: str, dtype: Any) -> None:
    try:
        np.dtype(dtype)
    except TypeError:  # a pandas extension dtype (Float64, Int64, ...): not a numpy one
        raise XStencilError(
            f"{call}: {name} has dtype {dtype} (a pandas extension type), which JAX cannot "
            f"read; convert it with .astype(float) (missing values become NaN) or "
            f".astype(int)") from None
    if dtype_kind(dtype) not in "biufc":
        raise XStencilError(
            f"{call}: {name} has dtype {np.dtype(dtype)}, which is not numeric; stencils run "
            f"on bool, int, float or complex data (convert with .astype(float))"
        )


def unwrap(call: str, obj: Any, *, skip: Sequence[str] = ()) -> Fields:
    """Check and unwrap a DataArray or Dataset (no copy of JAX data)."""
    if isinstance(obj, xr.DataArray):
        _check_dtype(call, "the data", obj.dtype)
        if obj.ndim == 0:
            raise XStencilError(f"{call}: the DataArray is a scalar; stencils need dims")
        data = native(obj.data)
        return Fields(obj, tuple(map(str, obj.dims)), tuple(obj.shape), None, [data],
                      (tuple(map(str, obj.dims)),), (data.dtype,))
    if isinstance(obj, xr.Dataset):
        names = tuple(str(n) for n in obj.data_vars if str(n) not in skip)
        if not names:
            raise XStencilError(f"{call}: the Dataset has no data variables")
        dims: list[str] = []
        for n in names:
            _check_dtype(call, f"data variable {n!r}", obj[n].dtype)
            dims += [str(d) for d in obj[n].dims if str(d) not in dims]
        arrays, var_dims = [], []
        for n in names:
            v = obj[n]
            order = tuple(d for d in dims if d in v.dims)
            arrays.append(native(v.transpose(*order).data))
            var_dims.append(order)
        shape = tuple(obj.sizes[d] for d in dims)
        return Fields(obj, tuple(dims), shape, names, arrays, tuple(var_dims),
                      tuple(a.dtype for a in arrays))
    call = call.replace("ds.stencil.", "xstencil.").replace("da.stencil.", "xstencil.")
    raise XStencilError(
        f"{call}: expected an xarray DataArray or Dataset, got {type(obj).__name__}: "
        f"{obj!r:.60}; wrap it with xarray.DataArray(..., dims=...) or use the array API "
        f"(xstencil.kmap)"
    )


def coord_dims(f: Fields) -> tuple[str, ...]:
    """Dims with a one-dimensional numeric coordinate of the same name."""
    variables = f.obj.coords.variables
    out = []
    for d in f.dims:
        v = variables.get(d)
        if v is not None and v.dims == (d,) and (v.dtype.kind in "iufMm" or (
                v.dtype.kind == "O" and is_cftime(coord_values(v)))):
            out.append(d)
    return tuple(out)


def prepare(call: str, f: Fields, kernels: Sequence[Callable[..., Any]], *, window: Any,
            boundary: Any, fill_value: Any, stride: Any, output_dims: Any, args: Any,
            kwargs: Any, extra_reach: Mapping[str, tuple[int, int]] | None = None) -> Plan:
    """Validate options and build the plan, inferring the window if needed."""
    check_extra_args(call, args, kwargs)
    check_known_chunks(call, f.names, f.var_dims, f.arrays)
    check_options(call, f.dims, boundary=boundary, stride=stride, fill_value=fill_value)
    odims = _output_dims(call, output_dims, f.dims)
    _output_dims_free(call, output_dims, odims, f.obj)
    cdims = coord_dims(f)
    order: tuple[str, ...] = ()  # the dims of window= as written (Plan.window_order)
    read = cdims  # the coordinates the kernels may read with u.coord
    if window is None:
        reach: dict[str, tuple[int, int]] = {}
        named: set[str] = set()
        for k in kernels:
            inferred, names = _inferred(call, k, f, cdims, args, kwargs)
            named |= names
            for d, (lo, hi) in inferred.items():
                a, b = reach.get(d, (0, 0))
                reach[d] = (max(a, lo), max(b, hi))
        # the probe saw every u.coord the kernels make: the others are neither
        # padded nor passed (nor need a period; a read left out fails loudly)
        read = tuple(d for d in cdims if d in named)
    else:
        reach = parse_window(call, window, f.dims, dict(zip(f.dims, f.shape, strict=True)))
        order = tuple(reach)
    for d, (lo, hi) in (extra_reach or {}).items():
        a, b = reach.get(d, (0, 0))
        reach[d] = (max(a, lo), max(b, hi))
    plan = make_plan(call, dims=f.dims, shape=f.shape, window=reach, window_arg=window,
                     boundary=boundary, fill_value=fill_value, stride=stride,
                     var_names=f.names, var_dims=f.var_dims, var_dtypes=f.dtypes,
                     coord_dims=read, output_dims=odims,
                     window_order=order)
    for d, s in zip(plan.dims, plan.specs, strict=True):  # a grid repeating its endpoint
        if s.mode == "periodic" and (s.pad_lo > 0 or s.pad_hi > 0) and d in cdims \
                and not isinstance(f.obj.indexes.get(d), pd.RangeIndex) \
                and f.obj.coords[d].dtype.kind not in "Mm":  # (never repeats; times
            # in seconds that span 360 or 2 pi are no angles)
            warn_repeated_endpoint(call, d, numeric_coord(call, d, coord_values(f.obj.coords[d])))
    return plan


def _output_dims(call: str, output_dims: Any, dims: tuple[str, ...]) -> tuple[str, ...]:
    if output_dims is None:
        return ()
    if isinstance(output_dims, str):
        odims: tuple[Any, ...] = (output_dims,)
    elif isinstance(output_dims, Sequence):
        odims = tuple(output_dims)
    else:
        odims = (None,)
    for d in odims:
        if not isinstance(d, str):
            raise XStencilError(
                f"{call}: output_dims={output_dims!r:.60} must be a dim name or a tuple of dim "
                f"names (str), such as output_dims=('k',)"
            )
        if d in dims:
            raise XStencilError(
                f"{call}: output_dims={output_dims!r} repeats dim {d!r} of the data; name the "
                f"new dims differently"
            )
    if len(set(odims)) != len(odims):
        raise XStencilError(f"{call}: output_dims={output_dims!r} repeats a name")
    return odims


def _output_dims_free(call: str, output_dims: Any, odims: tuple[str, ...],
                      obj: xr.DataArray | xr.Dataset) -> None:
    """New output dims must not take the name of a coordinate or data variable."""
    for d in odims:
        what = "a coordinate" if d in obj.coords else \
            "a data variable" if isinstance(obj, xr.Dataset) and d in obj.data_vars else None
        if what is not None:
            raise XStencilError(
                f"{call}: output_dims={output_dims!r} names new dim {d!r}, which is already "
                f"{what} of the input; name the new dims differently (e.g. {d + '_out'!r}) or "
                f"drop it first with .drop_vars({d!r})")


def _inferred(call: str, kernel: Callable[..., Any], f: Fields, cdims: tuple[str, ...],
              args: Any, kwargs: Any) -> tuple[dict[str, tuple[int, int]], frozenset[str]]:
    """The kernel's window, inferred once per kernel and data layout, and the
    coordinates it reads with ``u.coord``."""
    dyn, static = split_static(call, (args, kwargs))
    key = ("window", describe([kernel]).key, f.dims, f.names, f.var_dims,
           tuple(map(str, f.dtypes)), cdims, static,
           tuple((tuple(np.shape(x)), str(getattr(x, "dtype", ""))) for x in dyn))

    def infer() -> tuple[dict[str, tuple[int, int]], frozenset[str]]:
        names: set[str] = set()
        reach = infer_window(call, kernel, f.dims, f.names, f.var_dims, f.dtypes, cdims, args,
                             kwargs, coords_read=names)
        return reach, frozenset(names)

    return cached(key, infer)


def coord_arrays(plan: Plan, f: Fields, period: Mapping[str, float] | None) -> list[Any]:
    """Padded coordinate values for the window dims that have coordinates."""
    check_period(plan.call, period, plan.dims, plan_modes(plan))
    out = []
    cdt = read_dtype(plan.var_dtypes)
    variables = f.obj.coords.variables
    for d in plan.coord_dims:
        s = plan.specs[plan.axis(d)]
        c = read_coord(plan.call, d, coord_values(variables[d]))
        try:
            p = pad_coord(plan.call, d, c, s.pad_lo, s.pad_hi, s.mode,
                          None if period is None else period.get(d))
        except XStencilError as e:
            if not plan.window_order:  # inferred: the kernel was seen to read u.coord(d)
                raise
            raise XStencilError(f"{e}. {explicit_window_coords(d)}") from None
        out.append(pack_coord(p, cdt))
    return out


def explicit_window_coords(d: str) -> str:
    """What to do when a coordinate cannot be padded in a call with an
    explicit ``window=``: it is padded whether or not the kernel reads it."""
    return (f"With window= given, every coordinate of a window dim is padded for "
            f"u.coord({d!r}), read or not (which ones a kernel reads is known only when the "
            f"window is inferred from its offsets). If the kernel does not read it, leave "
            f"window= out and write the reads as offsets (u({d}=-1) + u() + u({d}=1)), or "
            f"drop the coordinate for the call: "
            f"obj.drop_vars({d!r}).stencil.map(...).assign_coords({d}=obj[{d!r}])")


def _seconds(p: np.timedelta64 | datetime.timedelta) -> float:
    if isinstance(p, np.timedelta64):
        return float(p / np.timedelta64(1, "s")) if not np.isnat(p) else 86400.0
    return p.total_seconds()


def plan_modes(plan: Plan) -> dict[str, str]:
    """The boundary mode of each window dim of ``plan`` (the others are not
    padded, so a period there changes nothing either way)."""
    return {d: s.mode for d, s in zip(plan.dims, plan.specs, strict=True)
            if d in plan.window_dims}


def check_period(call: str, period: Any, dims: tuple[str, ...],
                 modes: Mapping[str, str] | None = None) -> None:
    """Check ``period=``; with ``modes`` (each dim's boundary mode), refuse a
    period for a dim whose boundary is not periodic: only a periodic seam
    reads a coordinate one period on, so the period would be ignored."""
    if period is None:
        return
    if not isinstance(period, Mapping):
        raise XStencilError(
            f"{call}: period={period!r:.60} must be a dict mapping dim names to periods, such "
            f"as {{{dims[-1]!r}: 360.0}}")
    for d, p in period.items():
        if d not in dims:
            raise XStencilError(
                f"{call}: period={dict(period)!r}: dimension {d!r} not found; available dims "
                f"are {dims!r}")
        if isinstance(p, np.timedelta64 | datetime.timedelta):
            # np.timedelta64 is an np.integer: without this it reached np.isclose
            raise XStencilError(
                f"{call}: period={dict(period)!r}: give the period of {d!r} in seconds, as "
                f"datetime and timedelta coordinates are read in kernels (seconds since "
                f"the first label), e.g. {{{d!r}: {_seconds(p)!r}}}")
        if isinstance(p, bool) or not isinstance(p, int | float | np.integer | np.floating) \
                or not np.isfinite(p) or p <= 0:
            raise XStencilError(
                f"{call}: period={dict(period)!r}: the period of {d!r} must be a positive "
                f"number, got {p!r}")
        if modes is not None and modes.get(d, "periodic") != "periodic":
            raise XStencilError(
                f"{call}: period={dict(period)!r}: the boundary of {d!r} is {modes[d]!r}, and "
                f"a period applies only across a periodic boundary (it does not make the dim "
                f"periodic), so it would be ignored; pass boundary={{{d!r}: 'periodic'}} "
                f"(or boundary='periodic'), or drop {d!r} from period=")


def sources(plan: Plan, arrays: Sequence[Any], coords: Sequence[Any]) -> list[Source]:
    out = []
    wset = set(plan.window_dims)
    for x, vdims in zip(arrays, plan.var_dims, strict=True):
        axes = tuple(plan.axis(d) for d in vdims)
        specs = [plan.specs[a] for a in axes]
        out.append(Source(x, axes, tuple(a for a, d in zip(axes, vdims, strict=True) if d in wset),
                          tuple((s.pad_lo, s.pad_hi) for s in specs),
                          tuple(s.mode if s.mode != "valid" else "fill" for s in specs),
                          0 if plan.fill_value is None else plan.fill_value))
    for c, d in zip(coords, plan.coord_dims, strict=True):
        a = plan.axis(d)
        out.append(Source(c, (a,), (a,)))
    return out


# -- compile cache: see kcache.py ------------------------------------------------------

def call_engine(plan: Plan, f: Fields, kernels: Sequence[Callable[..., Any]] | Lifted,
                key_extra: Any, body: Callable[..., Any], args: Any, kwargs: Any,
                period: Mapping[str, float] | None, dynamic: Sequence[Any] = (),
                used: dict[str, Any] | None = None,
                loops: Callable[..., Any] | None = None, out: Any = None) -> Any:
    """Run ``body(kernels, plan, static, arrays, coords, dyn, dynamic)`` under jit.

    The compiled function is shared by every call whose kernels have the same
    :func:`~xstencil._engine.kcache.describe` key; the arrays the kernels
    close over travel as dynamic inputs (``body`` gets copies of the kernels
    that read them).  ``used``, if given, receives the compiled function
    (``"fn"``), the padded coordinate arrays (``"coords"``) and the lifted
    kernels (``"lifted"``), for the repeat-call fast path.  ``loops``, if
    given, wraps the jitted function, ``loops(jitted, kernels, static)``
    (the CPU loop backend of maps, :mod:`xstencil._backends.loops`); ``out``
    (with ``loops`` only) is the checked buffer of ``map(..., out=)``, which
    the loop writes into where it can (see ``LoopOrJit``).
    """
    lifted = kernels if isinstance(kernels, Lifted) else describe(kernels)
    with precision(f.arrays, args, kwargs, dtype_probe(plan)):
        # numpy data goes to the compiled function as it is (jit moves it once)
        arrays = [x if isinstance(x, np.ndarray) and x.dtype.kind in "biufc"
                  else as_array(plan.call, "the data", x) for x in f.arrays]
        leaves = list(lifted.leaves)
        if not outside_transforms(()):
            # inside a trace (a caller's, or iterate/solve/scan(step=)'s own) numpy
            # arrays become constants, which JAX 0.10 converts to 32 bits (x64 off)
            # through a cache keyed by the array object: a closed-over float64 array
            # changed in place read the old copy (views are new objects)
            arrays = [x.view() if isinstance(x, np.ndarray) else x for x in arrays]
            leaves = [v.view() if isinstance(v, np.ndarray) else v for v in leaves]
        coords = _device_coords(plan, f, period)
        dyn, static = split_static(plan.call, (args, kwargs))
        # the lowering inside a solve's operator differs (elements.linear_mode)
        key = ("engine", lifted.key, plan, static, key_extra, linear_mode())

        def build() -> Callable[..., Any]:
            template = lifted  # the first call's kernels: only their structure is used

            def run(arrays: Any, coords: Any, dyn: Any, dynamic: Any, leaves: Any) -> Any:
                return body(rebuild(template, leaves), plan, static, arrays, coords, dyn,
                            dynamic)

            jitted = Staged(run)  # jax.jit(run), FFT weight spectra hoisted (dense_hoist)
            return jitted if loops is None else loops(jitted, template, static)

        fn = cached(key, build)
        if used is not None:
            used.update(fn=fn, coords=coords, lifted=lifted)
        into = {} if out is None else {"out": out}
        out = settled(fn(arrays, coords, dyn, list(dynamic), leaves, **into),
                      (arrays, dyn, list(dynamic), leaves))
        settle(lifted)  # lists the trace wrote to (trace counters) stop being keyed
        return out


def _device_coords(plan: Plan, f: Fields, period: Mapping[str, float] | None) -> list[Any]:
    """:func:`coord_arrays` on the device, cached by the plan, the period and
    the coordinate values (recognised by their index objects first), so a
    rebuilt mesh over the same coordinates does not pad them again."""
    if not plan.coord_dims or not (period is None or isinstance(period, dict)):
        return [jnp.asarray(c) for c in coord_arrays(plan, f, period)]  # checks period
    try:
        key = ("coords", plan, None if period is None else tuple(sorted(period.items())))
        hash(key)
    except TypeError:
        return [jnp.asarray(c) for c in coord_arrays(plan, f, period)]
    variables = f.obj.coords.variables
    indexes = getattr(f.obj, "_indexes", {})
    sources = tuple(indexes.get(d) for d in plan.coord_dims)
    got = peek(key)
    if got is not None:
        old_sources, values, coords = got
        if all(a is b and a is not None for a, b in zip(sources, old_sources, strict=True)) \
                or all(same_values(coord_values(variables[d]), v)
                       for d, v in zip(plan.coord_dims, values, strict=True)):
            return coords
    coords = [jnp.asarray(c) for c in coord_arrays(plan, f, period)]
    if not any(isinstance(c, jax.core.Tracer) for c in coords):
        put(key, (sources, tuple(coord_values(variables[d]) for d in plan.coord_dims),
                  coords))
    return coords

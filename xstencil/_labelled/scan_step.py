"""``scan(obj, step=fn, steps=N)`` (:mod:`xstencil._labelled.scan`): a step
function called on the previous state, as a DataArray or Dataset of traced
arrays, inside the compiled loop."""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import xarray as xr

from xstencil import _progress
from xstencil._backends.dask import any_dask
from xstencil._backends.shard import is_sharded
from xstencil._engine.call import as_array, avals, merge_static, own_loop, promote, split_static
from xstencil._engine.coords import coord_digest
from xstencil._engine.fresh import fresh
from xstencil._engine.kcache import cached
from xstencil._engine.tscan import Loop, run_loop
from xstencil._errors import PrecisionWarning, XStencilError
from xstencil._labelled.loop_body import baking
from xstencil._labelled.result import host64
from xstencil._labelled.scan_plan import ScanPlan
from xstencil._labelled.scan_result import call_with_progress, finite, initial_finite
from xstencil._labelled.scan_setup import grown_coord
from xstencil._labelled.step_labels import by_label

__all__ = ["run_step"]


def run_step(call: str, obj: Any, fn: Any, o: ScanPlan, args: Any, kwargs: Any,
             dtype: Any = None) -> Any:
    """``scan(obj, step=fn, steps=N)``: ``fn`` maps the previous state to the next.

    The state has the promoted dtype of the input and the step's result, or
    ``dtype`` (already applied to ``obj``), to which each result is cast."""
    dim = o.dim
    state0, names, arrays, tvals = _state(call, obj, fn, o)
    with own_loop(arrays, args, kwargs):
        arrays = [as_array(call, "the data", x) for x in arrays]
        udyn, static = split_static(call, (args, kwargs))
        template = state0.copy(deep=False)
        # a step with a parameter named like dim gets the state's time: the values
        # travel as an input of the loop (a changed dt= must not reuse old ones)
        times = None if dim in kwargs else _step_times(call, fn, dim, tvals, o.steps)
        # the arrays the step closes over are inputs of the loop, as a map's are:
        # the loop is keyed by the step's structure, and an inline step over new
        # arrays (or one changed in place) reuses it, reading them as they are now;
        # a step that needs them concrete (np.roll(w, 1)) has them baked in instead
        (outs, bad), evolving = baking(
            call, fn, True, lambda lb: _run(call, lb, arrays, udyn, static, times, template,
                                            names, dim, o, dtype))
    outs = host64(outs)
    finite(call, bad, tvals, dim)
    return _trajectory(o, template, names, evolving, outs, tvals)


def _run(call: str, lb: Any, arrays: list[Any], udyn: Any, static: Any, times: Any,
         template: Any, names: tuple[str, ...] | None, dim: str, o: ScanPlan, dtype: Any
         ) -> Any:
    """The trajectory of :func:`run_step` with the step ``lb`` (its arrays
    inputs of the loop, or baked in)."""
    udyn = (udyn, times, lb.leaves)

    def apply(datas: Sequence[Any], dyn: Any, t: Any = 1) -> list[Any]:
        udyn, times, leaves = dyn
        a, kw = merge_static(udyn, static)
        if times is not None:
            kw = {**kw, dim: times[t - 1]}
        new = fresh(lb.resolve(leaves))(_wrap(template, names, datas), *a, **kw)
        return _step_result(call, new, names, template, datas)

    # what the step reads and the layout decide the state's dtypes, found by
    # tracing the step once (not again on every call)
    reads, labels = (call, dim, lb.key), _labels(template)
    layout = ("step-dtypes", static, names, avals(arrays), avals(udyn), labels, reads,
              None if dtype is None else str(np.dtype(dtype)))
    wide, evolving = cached(layout, lambda: _widened(call, apply, arrays, udyn, dtype))
    arrays = [x if x.dtype == w else x.astype(w) for x, w in zip(arrays, wide, strict=True)]
    loop = Loop(1, o.steps, o.every, 1, 0, 0, "fill", o.checkpoint,
                _progress.check_every(o.steps, sum(int(np.prod(x.shape)) for x in arrays))
                if o.progress else 0, o.check_finite)
    key = ("step", static, loop, names, tuple(evolving), avals(arrays), labels, reads)
    if o.check_finite:
        initial_finite(call, [[arrays[i]] for i in evolving], dim, 1)
    run = cached(key, lambda: _build(apply, loop, evolving))
    return call_with_progress(run, (arrays, udyn), loop.progress_every, loop.steps, call), \
        evolving


def _step_times(call: str, fn: Any, dim: str, tvals: Any, steps: int) -> Any:
    """The coordinate values along ``dim`` (positions 0 .. steps) as a JAX
    array, where ``fn`` takes a parameter named ``dim`` (``def step(s,
    time)``); else ``None``.  Without a coordinate (no ``dt=`` or
    ``coord=``), the positions; datetimes as seconds since the first."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return None
    p = params.get(dim)
    if p is None or p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
        return None
    if tvals is None:
        return jnp.arange(steps + 1)
    values = np.asarray(tvals.values)
    if values.dtype.kind in "mM":
        values = (values - values[0]) / np.timedelta64(1, "s")
    elif values.dtype.kind not in "biuf":
        raise XStencilError(
            f"{call}: step= takes {dim}=, but the {dim!r} coordinate holds {values.dtype} "
            f"values (a cftime calendar?), which a compiled step cannot read; pass dt= as a "
            f"number, or drop the {dim!r} parameter and keep a counter in the state")
    got = jnp.asarray(values)
    if got.dtype != values.dtype and values.dtype.kind == "f" and len(values) > 1:
        # x64 off: the step reads float32 times; say so where they lose the steps apart
        err = float(np.max(np.abs(np.asarray(got, np.float64) - values)))
        if err > 0.01 * float(np.min(np.abs(np.diff(values)))):
            warnings.warn(
                f"{call}: the {dim!r} values handed to step= are float32 (JAX's x64 flag is "
                f"off) and are up to {err:.3g} off, over 1% of a step; enable x64 "
                f"(jax.config.update('jax_enable_x64', True)), or measure time from the "
                f"start (coord= starting at 0)", PrecisionWarning, stacklevel=4)
    return got


def _labels(template: Any) -> Hashable:
    """The state's coordinates (by value), dims, attrs and name: the compiled loop
    wraps every step's state with ``template``, so a call whose labels differ
    from the call that compiled it must not reuse it (it read the old ones)."""
    coords = [coord_digest(n, v) for n, v in template.coords.items()]
    own = [tuple(map(str, template.dims))] if isinstance(template, xr.DataArray) else \
        [(str(n), tuple(map(str, v.dims)), repr(v.attrs)) for n, v in template.data_vars.items()]
    return (tuple(coords), tuple(own), repr(template.attrs),
            repr(getattr(template, "name", None)))


def _state(call: str, obj: Any, fn: Any, o: ScanPlan
           ) -> tuple[Any, tuple[str, ...] | None, list[Any], Any]:
    """The initial state (without ``dim``), its variable names (``None``: a
    DataArray), their data and the trajectory's ``dim`` coordinate; checked."""
    dim = o.dim
    if o.steps is None:
        raise XStencilError(f"{call}: step= grows a trajectory from an initial state; pass "
                            f"steps=N (and dt= or coord= for the {dim!r} coordinate)")
    if not callable(fn):
        raise XStencilError(f"{call}: step={fn!r:.60} is not callable")
    if dim in obj.dims:
        if obj.sizes[dim] != 1:
            raise XStencilError(
                f"{call}: step= advances one state to the next, so the input needs no "
                f"{dim!r} or exactly 1 position along it; it has {obj.sizes[dim]} (pass "
                f"obj.isel({dim}=[-1]))")
        state0 = obj.isel({dim: 0})
        n0 = 1
    else:
        state0, n0 = obj, 0
    state0 = state0.drop_vars([n for n, v in state0.coords.items() if dim in v.dims or n == dim])
    tvals = grown_coord(call, obj, dim, o.coord, o.dt, o.steps, n0, 1 + o.steps)
    if tvals is not None:  # with the input's attrs (units, standard_name)
        tvals = xr.Variable(dim, tvals, obj[dim].attrs if dim in obj.coords else None)
    if isinstance(state0, xr.DataArray):
        names: tuple[str, ...] | None = None
        arrays = [state0.data]
    else:
        names = tuple(str(n) for n in state0.data_vars)
        arrays = [state0[n].data for n in names]
    if any_dask(arrays):
        raise XStencilError(
            f"{call}: step= runs in memory, but the data is dask-backed; .compute() it "
            f"first, or write the step as one kernel (scan(obj, kernel, ...) advances "
            f"dask-backed data lazily, K steps per task)")
    if is_sharded(arrays):
        raise XStencilError(
            f"{call}: step= runs on one device, but the data is sharded over several; "
            f"gather it first (numpy.asarray), or write the step as one kernel "
            f"(scan(obj, kernel, ...) advances sharded data with a halo exchange)")
    return state0, names, arrays, tvals


def _wrap(template: Any, names: tuple[str, ...] | None, datas: Sequence[Any]) -> Any:
    """The state as a DataArray or Dataset like ``template``, holding ``datas``."""
    if names is None:
        return xr.DataArray(datas[0], dims=template.dims, coords=template.coords,
                            name=template.name, attrs=template.attrs)
    return xr.Dataset({n: (template[n].dims, d, template[n].attrs)
                       for n, d in zip(names, datas, strict=True)},
                      coords=template.coords, attrs=template.attrs)


def _widened(call: str, apply: Callable[..., Any], arrays: list[Any], udyn: Any,
             dtype: Any) -> tuple[tuple[Any, ...], tuple[int, ...]]:
    """The state's dtypes: the promoted dtype of the input and the step's
    result (unless ``dtype`` fixed it); and the variables the step returns."""
    shapes = jax.eval_shape(apply, arrays, udyn)
    for _ in range(4):  # the state takes the promoted dtype of input and result
        wider = [promote(x.dtype, sd.dtype) if sd is not None and dtype is None
                 else x.dtype for x, sd in zip(arrays, shapes, strict=True)]
        if all(w == x.dtype for w, x in zip(wider, arrays, strict=True)):
            break
        arrays = [x.astype(w) for x, w in zip(arrays, wider, strict=True)]
        shapes = jax.eval_shape(apply, arrays, udyn)
    else:
        raise XStencilError(f"{call}: the step's result dtype keeps widening from step "
                            f"to step; pass dtype=... to fix the state's dtype")
    return (tuple(x.dtype for x in arrays),
            tuple(i for i, sd in enumerate(shapes) if sd is not None))


def _build(apply: Callable[..., Any], loop: Loop, evolving: Sequence[int]) -> Callable[..., Any]:
    """The jitted loop of ``apply`` (the step on the state's arrays)."""
    def run(arrays: Any, udyn: Any, token: Any) -> Any:
        def stepf(t: Any, hist: Any) -> tuple[Any, ...]:
            datas = list(arrays)
            for j, i in enumerate(evolving):
                datas[i] = hist[j][-1]
            new = apply(datas, udyn, t)
            return tuple(new[i].astype(arrays[i].dtype) for i in evolving)

        init = [[arrays[i]] for i in evolving]
        prog = (_progress.advance, token) if loop.progress_every else None
        saved, bad = run_loop(stepf, init, loop, prog)
        if loop.every:
            saved = tuple(jnp.concatenate([arrays[i][None], x])
                          for i, x in zip(evolving, saved, strict=True))
        return saved, bad

    return jax.jit(run)


def _trajectory(o: ScanPlan, template: Any, names: tuple[str, ...] | None,
                evolving: Sequence[int], outs: Sequence[Any], tvals: Any) -> Any:
    """The saved states as a DataArray or Dataset along ``dim``."""
    dim = o.dim
    pos = (np.array([o.steps]) if o.every == 0 else
           np.concatenate([[0], o.every * np.arange(1, o.steps // o.every + 1)]))
    tc = {} if tvals is None else {dim: (dim, np.asarray(tvals)[pos], tvals.attrs)}
    if names is None:
        out: Any = xr.DataArray(outs[0], dims=(dim,) + tuple(template.dims),
                                coords={**template.coords, **tc}, name=template.name,
                                attrs=template.attrs)
    else:
        out = template.assign_coords(tc)
        for j, i in enumerate(evolving):
            n = names[i]
            out[n] = ((dim,) + tuple(template[n].dims), outs[j], template[n].attrs)
    return out.isel({dim: 0}) if o.every == 0 else out


def _step_result(call: str, new: Any, names: tuple[str, ...] | None, template: Any,
                 datas: Sequence[Any]) -> list[Any]:
    """The step function's result as arrays in the state's dim order (``None``
    for Dataset variables it does not return: they are constants)."""
    if names is None:
        if not isinstance(new, xr.DataArray):
            raise XStencilError(f"{call}: step= returned {type(new).__name__}; return a "
                                f"DataArray like the state, e.g. state.copy(data=new_values)")
        new = by_label(call, new, template.indexes, "step= returned the state with")
        return [_dims_like(call, new, template.dims, "the state", template.shape)]
    if isinstance(new, Mapping) and not isinstance(new, xr.Dataset):
        new = dict(new)
    elif isinstance(new, xr.Dataset):
        new = {str(n): new[n] for n in new.data_vars}
    else:
        raise XStencilError(f"{call}: step= returned {type(new).__name__}; return a Dataset "
                            f"or a dict of DataArrays")
    unknown = [n for n in new if n not in names]
    if unknown:
        raise XStencilError(f"{call}: step= returned {unknown!r}, which are not data "
                            f"variables; available are {names!r}")
    out = []
    for n in names:
        v = new.get(n)
        if isinstance(v, xr.DataArray):
            v = by_label(call, v, template.indexes, f"step= returned {n!r} with")
        out.append(None if n not in new else
                   _dims_like(call, v, template[n].dims, repr(n), template[n].shape))
    return out


def _dims_like(call: str, new: Any, dims: Sequence[Any], what: str,
               shape: tuple[int, ...]) -> Any:
    data = new.data if isinstance(new, xr.DataArray) else new
    if isinstance(new, xr.DataArray):
        if set(new.dims) != set(dims):
            raise XStencilError(f"{call}: step= returned dims {tuple(new.dims)!r} for {what}, "
                                f"which has dims {tuple(dims)!r}")
        data = new.transpose(*dims).data
    data = jnp.asarray(data)
    if data.shape != tuple(shape):
        sizes = dict(zip(dims, shape, strict=True))
        got = dict(zip(dims, data.shape, strict=False))
        raise XStencilError(
            f"{call}: step= returned shape {data.shape} (sizes {got!r}) for {what}, which has "
            f"sizes {sizes!r}; each step must return a state of the same size (for a "
            f"neighbour difference, use the state's stencil.map or pad/shift with "
            f"boundary handling rather than slicing it)")
    return data

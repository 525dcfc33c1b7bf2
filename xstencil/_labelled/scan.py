"""``xstencil.scan``: kernels scanned along a named dim (time stepping).

Semantics (DESIGN.md section 2, "Scan semantics"):

* positions along ``dim`` are computed in order, the other dims in parallel;
* a read at a negative offset along ``dim`` sees values already computed;
  a read at offset >= 0 sees the input (past the end of the input, the
  boundary mode given for ``dim``, by default ``"fill"``).  When a trajectory
  is grown (``steps=N``) there is no input ahead, so such reads raise;
* the first ``k`` positions, ``k`` being how far back the window reaches
  along ``dim``, are initial conditions kept as they are; kernels and mesh
  regions apply from position ``k`` on.

Saved positions: ``save_every=s`` keeps the ``k`` initial positions and then
positions ``k - 1 + s, k - 1 + 2 s, ...`` (so for ``k = 1`` exactly
``full.isel(time=slice(None, None, s))``); the scan stops at the last saved
position.  ``save_every="last"`` returns the final state only (the dim
becomes a scalar coordinate, as with ``.isel(time=-1)``).

The time coordinate reads as float in ``u.coord("time")``: numbers as they
are (in the data's float precision), datetimes as seconds since the first
position, timedeltas as seconds.  It must increase strictly when read.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import xarray as xr

from xstencil import _progress
from xstencil._engine.boundary import canonical_mode
from xstencil._engine.call import as_array, precision, split_static, stand_in
from xstencil._engine.kcache import cached, describe, rebuild, settle
from xstencil._engine.lower import AxisGeom, Source
from xstencil._engine.mesh import Mask, Slab
from xstencil._engine.tscan import Var, run_loop, stencil_step, time_reads
from xstencil._errors import XStencilError, raised_here
from xstencil._labelled.blocking import blocked, blocking_arg
from xstencil._labelled.core import coord_arrays, identity_caller, kernel_caller
from xstencil._labelled.dispatch import devices_arg
from xstencil._labelled.dtypes import out_dtype, state_dtype
from xstencil._labelled.plan import Plan
from xstencil._labelled.scale import scale_out
from xstencil._labelled.scan_result import call_with_progress, finite, initial_finite, rewrap
from xstencil._labelled.scan_setup import (
    Opts,
    Setup,
    check_dt,
    check_monotonic,
    engine_vars,
    evolving_indices,
    make_loop,
    returned,
    setup,
    size_text,
    time_coord,
    time_placeholder,
)
from xstencil._labelled.scan_step import run_step
from xstencil._labelled.staggered_ops import FILL, scan_grid
from xstencil._labelled.stream import streamed

__all__ = ["scan", "scan_mesh", "MAX_STEPS"]

#: The most steps one scan runs: loop positions are int32 on the device.
MAX_STEPS = 2**31 - 2**16



def _options(call: str, dim: Any, window: Any, boundary: Any, fill_value: Any, steps: Any,
             dt: Any, coord: Any, save_every: Any, progress: Any, checkpoint: Any,
             check_finite: Any, period: Any) -> Opts:
    if not isinstance(dim, str):
        raise XStencilError(f"{call}: dim={dim!r} must be a dim name (str), e.g. dim='time'")
    if steps is not None:
        if isinstance(steps, bool) or not isinstance(steps, numbers.Integral) or steps < 1:
            raise XStencilError(f"{call}: steps={steps!r} must be an int >= 1 (the number of "
                                f"new positions to compute along {dim!r})")
        steps = int(steps)
        if steps > MAX_STEPS:
            raise XStencilError(
                f"{call}: steps={steps!r} is more than a scan can run: the loop counts "
                f"positions in int32, so at most {MAX_STEPS} steps, and the {dim!r} "
                f"coordinate alone would need {size_text(8 * (steps + 1))} (int64); split the "
                f"run into several scans of at most {MAX_STEPS} steps (save_every='last' "
                f"each, continuing from the last state)")
    if save_every == "last":
        every = 0
    elif isinstance(save_every, numbers.Integral) and not isinstance(save_every, bool):
        every = int(save_every)
        if every <= 0:
            raise XStencilError(f"{call}: save_every={save_every!r} must be an int >= 1 or "
                                f"'last'")
        if steps is not None and every > steps:
            raise XStencilError(f"{call}: save_every={save_every!r} is larger than "
                                f"steps={steps!r}, so nothing would be saved; use "
                                f"save_every<={steps} or save_every='last'")
        if steps is not None and steps % every:
            raise XStencilError(
                f"{call}: steps={steps!r} is not a multiple of save_every={save_every!r}; "
                f"use steps={steps - steps % every or every} or another save_every")
    else:
        raise XStencilError(f"{call}: save_every={save_every!r} must be an int >= 1 or 'last'")
    if (dt is not None or coord is not None) and steps is None:
        raise XStencilError(f"{call}: dt= and coord= build the {dim!r} coordinate of a grown "
                            f"trajectory; they need steps=N")
    if dt is not None and coord is not None:
        raise XStencilError(f"{call}: pass dt= or coord=, not both")
    # scipy.ndimage/numpy names ('wrap', 'nearest', ...) become xstencil's
    boundary = ({d: canonical_mode(m) for d, m in boundary.items()}
                if isinstance(boundary, Mapping) else canonical_mode(boundary))
    if dt is not None:
        check_dt(call, dt)
    return Opts(dim, window, boundary, fill_value, steps, dt, coord, every, bool(progress),
                 bool(checkpoint), bool(check_finite), period)


@raised_here
def scan(
    obj: xr.DataArray | xr.Dataset,
    kernel: Callable[..., Any] | None = None,
    dim: str = "time",
    *args: Any,
    window: Mapping[str, int | tuple[int, int]] | None = None,
    boundary: str | Mapping[str, str] = FILL,
    fill_value: Any = None,
    steps: int | None = None,
    dt: Any = None,
    coord: Any = None,
    save_every: int | str = 1,
    progress: bool = False,
    checkpoint: bool = False,
    check_finite: bool = False,
    period: Mapping[str, float] | None = None,
    step: Callable[..., Any] | None = None,
    devices: Any = None,
    halo_every: int | None = None,
    grid: Any = None,
    at: Mapping[str, str] | None = None,
    mesh: Any = None,
    dtype: Any = None,
    store: Any = None,
    resume: bool = False,
    segment: int | None = None,
    blocking: bool | Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> xr.DataArray | xr.Dataset:
    """Scan a stencil kernel along a dim: explicit time stepping.

    Parameters
    ----------
    obj
        The data.  With the full trajectory along ``dim``, its first ``k``
        positions are the initial conditions (``k``: how far back the window
        reaches along ``dim``) and later positions are the input that reads at
        offsets >= 0 see.  With ``steps=N`` it is the initial state: without
        ``dim`` (then ``k`` must be 1), or with exactly its ``k`` initial
        positions.  For a Dataset, variables without ``dim`` are constants.
    kernel
        ``kernel(u, *args, **kwargs)`` as for :func:`xstencil.map`; the new
        value at position ``t`` is computed from the window centred on ``t``:
        ``u(time=-1)`` is the previous (computed) value.  A Dataset kernel
        returns a dict of the variables it advances.
    dim
        The dim to scan along.
    *args, **kwargs
        Passed to the kernel (arrays are traced: differentiable, no recompile).
    window, boundary, fill_value, period
        As for :func:`xstencil.map`.  ``boundary`` for ``dim`` applies only to
        reads past the end of the input at offsets > 0.  ``"valid"`` and
        strides are not available in a scan.
    steps
        Grow a trajectory by ``steps`` new positions instead of scanning the
        input's own; the full trajectory is never allocated.
    dt, coord
        The ``dim`` coordinate of a grown trajectory: a spacing (numbers or a
        ``numpy.timedelta64``; continues from the input's last coordinate, or
        starts at 0), or the values (``k + steps`` of them, or ``steps`` new
        ones after the input's).  Without either, the coordinate continues the
        input's last spacing, or counts positions (0, 1, 2, ...).
    save_every
        ``1`` (all positions), ``s`` (the initial positions, then every
        ``s``-th computed one) or ``"last"`` (the final state only).  Memory is
        the window depth plus the saved positions.
    progress
        Show a tqdm bar updated from inside the compiled loop.
    checkpoint
        Recompute steps in the backward pass (``jax.checkpoint`` over blocks
        of about ``sqrt(steps)``) so gradients of long scans need memory that
        grows like ``sqrt(steps)``.
    check_finite
        Raise, naming the first position, if a NaN or Inf appears.
    step
        Instead of ``kernel``: ``step(state, *args, **kwargs) -> new state``,
        called on the previous state (a DataArray or Dataset without ``dim``,
        holding traced JAX arrays) inside the compiled loop.  It may call
        :func:`xstencil.map` (``state.stencil.map(...)``) any number of times,
        so multi-stage schemes (Runge-Kutta) are written as in numpy.  Needs
        ``steps=N``.
    devices, halo_every
        Scale-out: ``devices={dim: axis}`` shards the data over JAX devices (see
        :doc:`/scaling`); for dask-backed or sharded data, ``halo_every=K``
        runs K steps per halo exchange (a halo K times as deep).
    grid, at
        A staggered grid and output position, as for :func:`xstencil.map`;
        ``kernel`` may then be ``{name: kernel}``, each variable advanced at
        its own position.  See :doc:`/staggered`.
    mesh
        Deprecated spelling of ``devices`` (a DeprecationWarning says so).
    dtype
        The state's dtype: the input is cast to it and each step's result is
        cast to it.  By default the state takes the promoted dtype of the
        input and the kernel's result (so a uint8 sum does not wrap and a
        float32 kernel on int data gives float32); see :doc:`/dtypes`.
    store, resume, segment
        Streamed saves (with ``steps=N`` and an int ``save_every``): run the
        scan ``segment`` saved positions at a time, appending each segment to
        the Zarr store at path ``store``, and return the result opened lazily
        from it; memory holds the window depth plus one segment (by default
        about 64 MiB of saved positions).  ``resume=True`` continues a run
        that was killed from its last complete saved position, bitwise as if
        uninterrupted, and refuses a store written with other kernels, options
        or inputs.  See :doc:`/scaling`.
    blocking
        Temporal blocking of an in-memory scan (see :doc:`/performance`):
        ``None`` (the default) steps cache-sized tiles K steps at a time on
        threads when the state is large (12 MiB or more per position) and the
        scan supports it; ``True`` blocks whenever supported; ``False`` never
        does; ``{"tile": 512, "steps": 16}`` (or ``{"tile": {"x": 512, ...}}``)
        blocks with these sizes.  Results are the same, bitwise, either way.

    Returns
    -------
    DataArray or Dataset
        The trajectory, with the input's dims, coords, attrs and name.

    Raises
    ------
    XStencilError
        Bad options, ``dim`` missing, reads ahead while growing, an input that
        is longer than the initial conditions with ``steps``, a non-monotonic
        time coordinate read by the kernel, or (``check_finite``) a
        non-finite value.

    Examples
    --------
    >>> import numpy as np, xarray as xr, xstencil
    >>> u0 = xr.DataArray([0.0, 1.0, 0.0, 0.0], dims="x")
    >>> heat = lambda u: u(time=-1) + 0.25 * (u(time=-1, x=1) - 2 * u(time=-1)
    ...                                       + u(time=-1, x=-1))
    >>> traj = u0.stencil.scan(heat, dim="time", steps=2, dt=0.5, boundary="periodic")
    >>> traj.sizes["time"], traj["time"].values
    (3, array([0. , 0.5, 1. ]))
    >>> traj.isel(time=1).values
    array([0.25, 0.5 , 0.25, 0.  ])

    A Runge-Kutta step that calls maps on the traced state:

    >>> def rk2(s):
    ...     f = lambda s: s.stencil.map(lambda u: -(u(x=1) - u(x=-1)) / 2, boundary="periodic")
    ...     k1 = f(s)
    ...     return s + 0.1 * f(s + 0.05 * k1)
    >>> out = xstencil.scan(u0, step=rk2, steps=10, save_every="last")
    >>> round(float(out.values.sum()), 6)
    1.0
    """
    if store is not None or resume or segment is not None:  # streamed saves (Zarr)
        return streamed(scan, f"{'da' if isinstance(obj, xr.DataArray) else 'ds'}.stencil."
                        f"scan(..., store=...)", obj, kernel, dim, args, kwargs, dict(
                            window=window, boundary=boundary, fill_value=fill_value,
                            steps=steps, dt=dt, coord=coord, save_every=save_every,
                            progress=progress, checkpoint=checkpoint,
                            check_finite=check_finite, period=period, step=step,
                            devices=devices, halo_every=halo_every, grid=grid, at=at,
                            mesh=mesh, dtype=dtype), store=store, resume=resume,
                        segment=segment)
    if grid is not None or at is not None:  # staggered: translated into a plain scan
        if step is not None:
            raise XStencilError("ds.stencil.scan(..., grid=...): grid= goes to the maps inside "
                                "step=, e.g. state.stencil.map(k, grid=G, at=...)")
        return scan_grid(scan, obj, kernel, dim, args, kwargs, dict(
            steps=steps, dt=dt, coord=coord, save_every=save_every, progress=progress,
            checkpoint=checkpoint, check_finite=check_finite, mesh=mesh,
            halo_every=halo_every), grid=grid, at=at, window=window, boundary=boundary,
            fill_value=fill_value, period=period)
    call = f"{'da' if isinstance(obj, xr.DataArray) else 'ds'}.stencil.scan(...)"
    devices = devices_arg(call, devices, mesh)
    o = _options(call, dim, window, boundary, fill_value, steps, dt, coord, save_every,
                 progress, checkpoint, check_finite, period)
    blocking_arg(call, blocking)
    if step is not None:
        if kernel is not None:
            raise XStencilError(f"{call}: pass a kernel or step=, not both")
        if dtype is not None:
            obj = obj.astype(out_dtype(call, dtype))
        return run_step(call, obj, step, o, args, kwargs, dtype)
    if not callable(kernel):
        raise XStencilError(f"{call}: kernel={kernel!r:.60} is not callable; pass a function "
                            f"of one window, e.g. lambda u: u(time=-1) + ..., or step=fn")
    obj = state_dtype(call, obj, [kernel], kernel, o, args, kwargs, dtype)
    out = scale_out(obj, kernel, dim, args, dict(
        window=window, boundary=boundary, fill_value=fill_value, steps=steps, dt=dt,
        coord=coord, save_every=save_every, period=period, progress=progress,
        checkpoint=checkpoint, check_finite=check_finite, **kwargs),
        devices=devices, halo_every=halo_every)
    if out is not None:  # dask-backed or sharded data: K steps per halo exchange
        return out
    out = blocked(obj, kernel, dim, args, kwargs, blocking, window=window, boundary=boundary,
                  fill_value=fill_value, steps=steps, dt=dt, coord=coord, save_every=save_every,
                  period=period, progress=progress, checkpoint=checkpoint,
                  check_finite=check_finite)
    if out is not None:  # in memory, large: tiles stepped K steps at a time (blocking.py)
        return out
    return _run(call, obj, [kernel], kernel, None, o, args, kwargs)


def scan_mesh(m: Any, dim: str = "time", *args: Any, **options: Any) -> Any:
    """Run a :class:`~xstencil.Mesh` as a scan along ``dim`` (``m.scan(...)``);
    options as for :func:`scan`, defaulting to the mesh's own."""
    call = m._call.replace("mesh(...)", "mesh(...).scan()")
    opts = {k: v for k, v in m._options.items() if k in ("window", "boundary", "fill_value",
                                                           "period")}
    known = {"window", "boundary", "fill_value", "steps", "dt", "coord", "save_every",
             "progress", "checkpoint", "check_finite", "period"}
    if options.get("store") is not None:
        raise XStencilError(f"{call}: store= (streamed saves) is not available for a function "
                            f"mesh yet; scan a single kernel with store=, or write m.scan(...) "
                            f"with .to_zarr(...)")
    halo_every = options.pop("halo_every", None)
    blocking_arg(call, options.pop("blocking", None))  # checked; a mesh runs unblocked
    dtype = options.pop("dtype", m._options.get("dtype"))
    kwargs = {k: v for k, v in options.items() if k not in known}
    opts.update({k: v for k, v in options.items() if k in known})
    o = _options(call, dim, opts.get("window"), opts.get("boundary", "fill"),
                 opts.get("fill_value"), opts.get("steps"), opts.get("dt"), opts.get("coord"),
                 opts.get("save_every", 1), opts.get("progress", False),
                 opts.get("checkpoint", False), opts.get("check_finite", False),
                 opts.get("period"))
    if not m._regions:
        raise XStencilError(f"{call}: the mesh has no regions; assign kernels with m[...] = f")
    kernels = [k for _, k in m._regions]
    obj = state_dtype(call, m._obj, kernels, m, o, args, kwargs, dtype)
    out = scale_out(obj, None, dim, args, {**opts, **kwargs},
                    devices=m._options.get("devices"), halo_every=halo_every, function_mesh=m)
    if out is not None:  # dask-backed or sharded data: K steps per halo exchange
        return out
    return _run(call, obj, kernels, m, m, o, args, kwargs)


# -- running ----------------------------------------------------------------------------

def _run(call: str, obj: Any, kernels: Sequence[Any], owner: Any, mesh: Any, o: Opts,
         args: Any, kwargs: Any) -> Any:
    dim = o.dim
    s = setup(call, obj, kernels, o, args, kwargs)
    with precision(s.f.arrays, args, kwargs):
        udyn, static = split_static(call, (args, kwargs))
        shapes = tuple((tuple(np.shape(x)), str(getattr(x, "dtype", ""))) for x in udyn)
        lifted = describe(kernels)  # the compile-cache key, closed-over arrays (kcache.py)
        names = None  # a Dataset kernel's results, traced once per kernel structure and plan
        if s.plan.var_names is not None:
            got = cached(("returned", lifted.key, s.plan, static, shapes),
                         lambda: returned(call, s.plan, kernels, static, udyn))
            names = None if got is None else list(got)  # a copy: the cached list stays intact
        if names is not None and s.grown and dim not in obj.dims:
            s = setup(call, obj, kernels, o, args, kwargs, evolve=names)
        plan = s.plan
        evolving = evolving_indices(call, s, names, dim)
        t_ax = plan.axis(dim)
        geom = plan.geom
        sub = [AxisGeom(0, 1, 1, 1) if a == t_ax else g for a, g in enumerate(geom)]
        spatial = dataclasses.replace(plan, coord_dims=tuple(d for d in plan.coord_dims
                                                             if d != dim))
        coords = [jnp.asarray(c) for c in coord_arrays(spatial, s.f, o.period)]
        # the padded time coordinate is as long as the trajectory: built only if read
        tcoord = time_placeholder(s, o)
        variables = engine_vars(s, dim, evolving)
        loop = make_loop(s, o)
        arrays = [_input(x, vd, dim) for x, vd in zip(s.f.arrays, plan.var_dims, strict=True)]
        init = [_initial(arrays[i], s, variables[i]) for i in evolving]
        if o.check_finite:
            initial_finite(call, init, dim, s.k)
        slab_avals = [stand_in(
            tuple(plan.shape[plan.axis(d)] for d in vd if d != dim), np.dtype(dt))
            for vd, dt in zip(plan.var_dims, plan.var_dtypes, strict=True)]
        extra = [Source(c, (plan.axis(d),), (plan.axis(d),))
                 for d, c in zip(spatial.coord_dims, coords, strict=True)]
        lcalls = [_labelled_call(plan, kernel_caller(plan, k, static), dim, names)
                  for k in kernels]
        reads, t_used = cached(("reads", lifted.key, plan, static, loop, tuple(evolving),
                                tuple(names or ()), tcoord is None, shapes),
                               lambda: time_reads(lcalls, variables, slab_avals, extra, sub,
                                                    t_ax, tcoord, udyn, loop))
        if s.grown:
            ahead = sorted({(plan.var_names or ("u",))[v] for v, off in reads
                            if off >= 0 and variables[v].state is not None})
            if ahead:
                what = "u" if plan.var_names is None else f"s[{ahead[0]!r}]"
                raise XStencilError(
                    f"{call}: the kernel reads {what} at offset >= 0 along {dim!r} (e.g. "
                    f"{what}() or {what}({dim}=1)); when growing a trajectory with steps= "
                    f"there is no input there; read the previous value {what}({dim}=-1)")
        if t_used:
            check_monotonic(call, dim, s.tvals)
            tcoord = time_coord(call, s, o)
        if mesh is not None:
            regions, masks = mesh.regions(plan, dim)
        else:
            regions, masks = [Slab(tuple((0, g.count, 1) for g in geom))], []
        key = ("scan", lifted.key, plan, static, loop, tuple(evolving), tuple(names or ()),
               tuple(regions), tcoord is None, s.total)
        k = s.k

        def build() -> Callable[..., Any]:
            def run(arrays: Any, init: Any, coords: Any, tcoord: Any, masks: Any, udyn: Any,
                    leaves: Any, token: Any) -> Any:
                kernels = rebuild(lifted, leaves)  # reading this call's closed-over arrays
                calls = [_labelled_call(plan, kernel_caller(plan, kn, static), dim, names)
                         for kn in kernels]
                base = _labelled_call(plan, identity_caller(
                    plan, kernel_caller(plan, kernels[-1], static)), dim, names)
                branches = [(r if isinstance(r, Slab) else Mask(masks[r]), c)
                            for r, c in zip(regions, calls, strict=True)]
                ex = [Source(c, (plan.axis(d),), (plan.axis(d),))
                      for d, c in zip(spatial.coord_dims, coords, strict=True)]
                stepf = stencil_step(branches, base, variables, arrays, ex, geom, t_ax, tcoord,
                                     udyn, loop, s.total)
                prog = (_progress.advance, token) if loop.progress_every else None
                saved, bad = run_loop(stepf, init, loop, prog)
                outs = []
                for h, x in zip(init, saved, strict=True):
                    if loop.every and k:
                        x = jnp.concatenate([jnp.stack(h[-k:]), x])
                    outs.append(x)
                return outs, bad

            return jax.jit(run)

        fn = cached(key, build)
        arrays_in = [a if v.has_time or v.state is None else None
                     for a, v in zip(arrays, variables, strict=True)]
        runargs = (arrays_in, init, coords, tcoord, [jnp.asarray(m) for m in masks], udyn,
                   list(lifted.leaves))
        outs, bad = call_with_progress(fn, runargs, loop.progress_every, loop.steps,
                                       call)
        settle(lifted)  # lists the trace wrote to (trace counters) stop being keyed
    finite(call, bad, s.tvals, dim)
    return rewrap(s, o, outs, evolving)


def _labelled_call(plan: Plan, caller: Any, dim: str, order: Sequence[str] | None) -> Any:
    """Engine-facing: ``cells`` = variables then spatial coords, ``dyn`` =
    ``(user dyn, time-coordinate window)``; returns a tuple (one per evolving
    variable, in ``order``)."""
    nvar = len(plan.var_dims)

    def c(cells: Sequence[Any], dyn: Any) -> Any:
        udyn, tw = dyn
        it = iter(cells[nvar:])
        cs = [tw if d == dim else next(it) for d in plan.coord_dims]
        out = caller(list(cells[:nvar]) + cs, udyn)
        if order is None:
            return out
        return tuple(out[n] for n in order) if isinstance(out, Mapping) else out

    return c


def _input(x: Any, vdims: Sequence[str], dim: str) -> Any:
    x = as_array("scan", "the data", x)
    if dim in vdims:
        ax = list(vdims).index(dim)
        if ax:
            x = jnp.moveaxis(x, ax, 0)
    return x


def _initial(x: Any, s: Setup, v: Var) -> list[Any]:
    """The last ``max(k, 1)`` initial slabs, oldest first."""
    if s.k == 0:
        return [jnp.zeros(x.shape[1:], x.dtype)]
    if not v.has_time and s.grown and x.ndim == len(v.axes):
        return [x]
    return [x[i] for i in range(s.k)]

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

import jax.numpy as jnp
import xarray as xr

from xstencil._backends.loops import backend_arg, resolve_mode
from xstencil._engine.call import precision, split_static
from xstencil._engine.kcache import cached, describe, settle
from xstencil._engine.mesh import Slab
from xstencil._errors import XStencilError, raised_here
from xstencil._labelled import scan_fast
from xstencil._labelled.blocking import blocked, blocking_arg
from xstencil._labelled.core import Fields, coord_arrays
from xstencil._labelled.dispatch import devices_arg
from xstencil._labelled.dtypes import out_dtype, state_dtype
from xstencil._labelled.loop_mesh_scan import loop_mesh_scan
from xstencil._labelled.loop_scan import loop_scan
from xstencil._labelled.scale import scale_out
from xstencil._labelled.scan_loop import build_loop, inputs, time_input
from xstencil._labelled.scan_plan import MAX_STEPS, ScanPlan
from xstencil._labelled.scan_repeat import loop_keeper, mesh_repeat_entry, repeat_entry
from xstencil._labelled.scan_result import call_with_progress, finite, initial_finite, rewrap
from xstencil._labelled.scan_setup import plan_scan
from xstencil._labelled.scan_step import run_step
from xstencil._labelled.staggered_ops import FILL, scan_grid
from xstencil._labelled.stream import streamed

__all__ = ["scan", "scan_mesh", "MAX_STEPS"]


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
    backend: str | None = None,
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
        Show a tqdm bar (labelled with the call, e.g. ``da.stencil.scan``),
        moved about every 0.1-0.5 s: from inside the compiled loop on XLA, and
        between steps by the time loop on the numba loops (``backend=``
        below), where it costs next to nothing.  The result is bitwise the same
        with and without a bar; Ctrl-C stops the scan at the bar's next update
        with ``KeyboardInterrupt``.
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
    backend
        ``"auto"`` (the default, or the ``XSTENCIL_BACKEND`` environment
        variable), ``"loops"`` or ``"xla"``, as for :func:`xstencil.map`: a
        DataArray or Dataset grown by ``steps=`` on numpy data whose kernel
        reads only the previous position (``u(time=-1, ...)``; for a
        Dataset, ``s["u"](time=-1, ...)`` of every advanced variable, with
        variables without ``dim`` read as constants) runs as numba loops when
        ``blocking`` is ``None`` or ``False``, one loop nest per step over all
        advanced variables, with or without ``progress`` and ``check_finite``, and
        without ``checkpoint`` or ``period`` (see :doc:`/performance`); every other
        scan, and one the loops cannot express, runs on XLA (silently, also
        for ``"loops"``).

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
        scall = f"{'da' if isinstance(obj, xr.DataArray) else 'ds'}.stencil.scan(..., store=...)"
        return streamed(scan, scall, obj, kernel, dim, args, kwargs, dict(
                            window=window, boundary=boundary, fill_value=fill_value,
                            steps=steps, dt=dt, coord=coord, save_every=save_every,
                            progress=progress, checkpoint=checkpoint,
                            check_finite=check_finite, period=period, step=step,
                            devices=devices, halo_every=halo_every, grid=grid, at=at,
                            mesh=mesh, dtype=dtype, blocking=blocking,
                            # resolved, so that a resume under another XSTENCIL_BACKEND
                            # is refused (the fingerprint holds it), not mixed
                            backend=resolve_mode(backend_arg(scall, backend))),
                        store=store, resume=resume, segment=segment)
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
    backend = backend_arg(call, backend)
    devices = devices_arg(call, devices, mesh)
    options = (dim, window, boundary, fill_value, steps, dt, coord, save_every, progress,
               checkpoint, check_finite, period)
    sig, lifted = None, None
    blocking_arg(call, blocking)
    if step is None and devices is None and halo_every is None \
            and blocking in (None, False) \
            and callable(kernel):  # a repeated call: skip the setup (see scan_fast.py)
        lifted, sig, entry = repeat_entry(obj, kernel, options, args, kwargs, dtype,
                                          blocking, backend)
        if entry is not None:
            return scan_fast.run(entry, obj, args, kwargs, lifted)
    o = ScanPlan(call, *options)
    _check_extent(call, obj, dim, halo_every)
    if step is not None:
        if kernel is not None:
            raise XStencilError(f"{call}: pass a kernel or step=, not both")
        if dtype is not None:
            obj = obj.astype(out_dtype(call, dtype))
        return run_step(call, obj, step, o, args, kwargs, dtype)
    if not callable(kernel):
        raise XStencilError(f"{call}: kernel={kernel!r:.60} is not callable; pass a function "
                            f"of one window, e.g. lambda u: u(time=-1) + ..., or step=fn")
    return _scan_kernel(obj, kernel, o, options, args, kwargs, dtype, devices, halo_every,
                        (lifted, sig), blocking, backend)


def _check_extent(call: str, obj: Any, dim: str, halo_every: Any) -> None:
    """No dim of size 0, and ``halo_every`` an int >= 1 (in memory too, where
    it was taken as given: 0, 2.5 or True)."""
    if halo_every is not None and (isinstance(halo_every, bool) or not isinstance(
            halo_every, numbers.Integral) or halo_every < 1):
        raise XStencilError(
            f"{call}: halo_every={halo_every!r} must be an int >= 1 (steps per halo "
            f"exchange of dask-backed or sharded data), or None")
    empty = [str(d) for d, n in obj.sizes.items() if n == 0 and d != dim]
    if empty:
        raise XStencilError(
            f"{call}: dim {empty[0]!r} has size 0, so there is nothing to step; scan data "
            f"with at least one point along every dim (select it with .isel or check the "
            f"selection that emptied it)")


def _scan_kernel(obj: Any, kernel: Any, o: ScanPlan, options: tuple[Any, ...], args: Any,
                 kwargs: Any, dtype: Any, devices: Any, halo_every: Any, fast: Any,
                 blocking: Any = None, backend: str | None = None) -> Any:
    """A kernel scanned by the backend the arrays choose; ``fast`` is the
    ``(describe key, signature)`` to record an in-memory call under (or
    ``(None, None)``)."""
    cast = state_dtype(o.call, obj, [kernel], kernel, o, args, kwargs, dtype)
    opts = dict(zip(_OPTIONS, options[1:], strict=True))
    out = scale_out(cast, kernel, o.dim, args, {**opts, **kwargs}, devices=devices,
                    halo_every=halo_every, backend=backend)
    if out is not None:  # dask-backed or sharded data: K steps per halo exchange
        return out
    lifted, sig = fast

    def keep(sp: ScanPlan, fn: Any, coords: Any, tcoord: Any, outs: Any, res: Any,
             masks: Any) -> None:
        scan_fast.remember(lifted, sig, obj, cast, sp, fn, coords, tcoord, (args, kwargs),
                           outs, res, masks)

    if (blocking is None or blocking is False) and devices is None and halo_every is None:
        out = loop_scan(cast, kernel, o, args, kwargs, backend,
                        loop_keeper(lifted, sig, obj, cast, args, kwargs))
        if out is not None:  # numba loops: a grown DataArray or Dataset on numpy data
            # (loop_scan.py)
            return out
    out = blocked(cast, kernel, o.dim, args, kwargs, blocking, backend, **opts)
    if out is not None:  # in memory, large: tiles stepped K steps at a time (blocking.py)
        return out

    return _run(o.call, cast, [kernel], None, o, args, kwargs, None if sig is None else keep)


#: The scan options after ``dim``, in the order :class:`ScanPlan` takes them.
_OPTIONS = ("window", "boundary", "fill_value", "steps", "dt", "coord", "save_every",
            "progress", "checkpoint", "check_finite", "period")


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
    backend = backend_arg(call, options.pop("backend", m._options.get("backend")))
    dtype = options.pop("dtype", m._options.get("dtype"))
    kwargs = {k: v for k, v in options.items() if k not in known}
    opts.update({k: v for k, v in options.items() if k in known})
    o = ScanPlan(call, dim, opts.get("window"), opts.get("boundary", "fill"),
                 opts.get("fill_value"), opts.get("steps"), opts.get("dt"), opts.get("coord"),
                 opts.get("save_every", 1), opts.get("progress", False),
                 opts.get("checkpoint", False), opts.get("check_finite", False),
                 opts.get("period"))
    if not m._regions:
        raise XStencilError(f"{call}: the mesh has no regions; assign kernels with m[...] = f")
    kernels = [k for _, k in m._regions]
    local = halo_every is None and m._options.get("devices") is None
    lifted = sig = None
    if local:  # a repeated call: skip the setup
        lifted, sig, entry = mesh_repeat_entry(m, kernels, o.options[1:], args, kwargs, dtype,
                                               backend)
        if entry is not None:
            return scan_fast.run(entry, m._obj, args, kwargs, lifted)
    obj = state_dtype(call, m._obj, kernels, m, o, args, kwargs, dtype)
    out = scale_out(obj, None, dim, args, {**opts, **kwargs},
                    devices=m._options.get("devices"), halo_every=halo_every, function_mesh=m,
                    backend=backend)
    if out is not None:  # dask-backed or sharded data: K steps per halo exchange
        return out
    if local:
        out = loop_mesh_scan(obj, m, kernels, o, args, kwargs, backend,
                             loop_keeper(lifted, sig, m._obj, obj, args, kwargs))
        if out is not None:  # numba loops: one nest per region (loop_mesh_scan.py)
            return out

    def keep(sp: ScanPlan, fn: Any, coords: Any, tcoord: Any, outs: Any, res: Any,
             masks: Any) -> None:
        scan_fast.remember(lifted, sig, m._obj, obj, sp, fn, coords, tcoord, (args, kwargs),
                           outs, res, masks)

    return _run(call, obj, kernels, m, o, args, kwargs, None if sig is None else keep)


# -- running ----------------------------------------------------------------------------

def _run(call: str, obj: Any, kernels: Sequence[Any], mesh: Any, o: ScanPlan, args: Any,
         kwargs: Any, keep: Callable[..., None] | None = None) -> Any:
    """The in-memory scan (the slow path: every check runs).  ``keep(sp, fn,
    coords, tcoord, outs, out, masks)`` is told what was compiled and passed,
    for the repeat-call fast path (:mod:`xstencil._labelled.scan_fast`)."""
    udyn, static = split_static(call, (args, kwargs))
    lifted = describe(kernels)  # the compile-cache key, closed-over arrays (kcache.py)
    sp, f = _plan(obj, kernels, o, args, kwargs, lifted, static, udyn,
                  () if mesh is None else mesh._region_dims())
    with precision(f.arrays, args, kwargs):
        spatial = dataclasses.replace(sp.plan, coord_dims=tuple(
            d for d in sp.plan.coord_dims if d != sp.dim))
        coords = [jnp.asarray(c) for c in coord_arrays(spatial, f, o.period)]
        tcoord = time_input(sp, kernels, lifted, static, udyn, coords)
        if mesh is not None:
            regions, masks = mesh.regions(sp.plan, sp.dim)
        else:
            regions, masks = [Slab(tuple((0, g.count, 1) for g in sp.plan.geom))], []
        fn = cached(("scan", lifted.key, sp.key, static, tuple(regions), tcoord is None),
                    lambda: build_loop(sp, lifted, static, regions))
        arrays_in, init = inputs(sp, f.arrays)
        if sp.check_finite:
            initial_finite(call, init, sp.dim, sp.k)
        dmasks = [jnp.asarray(m) for m in masks]
        runargs = (arrays_in, init, coords, tcoord, dmasks, udyn, list(lifted.leaves))
        outs, bad = call_with_progress(fn, runargs, sp.loop.progress_every, sp.loop.steps,
                                       call)
        settle(lifted)  # lists the trace wrote to (trace counters) stop being keyed
    finite(call, bad, sp.tvals, sp.dim)
    # save_every="last": the loop drops the axis along dim that rewrap expects
    out = rewrap(sp, f, obj, outs if sp.every else [x[None] for x in outs])
    if keep is not None:
        keep(sp, fn, coords, tcoord, outs, out, dmasks)
    return out


def _plan(obj: Any, kernels: Sequence[Any], o: ScanPlan, args: Any, kwargs: Any,
          lifted: Any, static: Any, udyn: Any,
          region_dims: Sequence[str] = ()) -> tuple[ScanPlan, Fields]:
    """The request completed with the data's layout and the evolving
    variables (:func:`~xstencil._labelled.scan_setup.plan_scan`, the setup
    the dask and sharded scans share)."""
    return plan_scan(obj, kernels, o, args, kwargs, lifted, static, udyn,
                     region_dims=region_dims)

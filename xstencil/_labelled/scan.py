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
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import xarray as xr

from xstencil import _progress
from xstencil._engine.call import as_array, merge_static, precision, split_static
from xstencil._engine.lower import AxisGeom, Source
from xstencil._engine.mesh import Mask, Slab
from xstencil._engine.tscan import Loop, Var, run_loop, stencil_step, time_reads
from xstencil._errors import XStencilError
from xstencil._labelled.coords import numeric_coord, pad_coord
from xstencil._labelled.core import (
    Fields,
    compiled,
    coord_arrays,
    host64,
    identity_caller,
    kernel_caller,
    prepare,
    unwrap,
)
from xstencil._labelled.plan import Plan

__all__ = ["scan", "scan_mesh"]


@dataclasses.dataclass(frozen=True)
class _Opts:
    dim: str
    window: Any
    boundary: Any
    fill_value: Any
    steps: int | None
    dt: Any
    coord: Any
    save_every: int  # 0: last
    progress: bool
    checkpoint: bool
    check_finite: bool
    period: Any


def _options(call: str, dim: Any, window: Any, boundary: Any, fill_value: Any, steps: Any,
             dt: Any, coord: Any, save_every: Any, progress: Any, checkpoint: Any,
             check_finite: Any, period: Any) -> _Opts:
    if not isinstance(dim, str):
        raise XStencilError(f"{call}: dim={dim!r} must be a dim name (str), e.g. dim='time'")
    if steps is not None:
        if isinstance(steps, bool) or not isinstance(steps, numbers.Integral) or steps < 1:
            raise XStencilError(f"{call}: steps={steps!r} must be an int >= 1 (the number of "
                                f"new positions to compute along {dim!r})")
        steps = int(steps)
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
    return _Opts(dim, window, boundary, fill_value, steps, dt, coord, every, bool(progress),
                 bool(checkpoint), bool(check_finite), period)


def scan(
    obj: xr.DataArray | xr.Dataset,
    kernel: Callable[..., Any] | None = None,
    dim: str = "time",
    *args: Any,
    window: Mapping[str, int | tuple[int, int]] | None = None,
    boundary: str | Mapping[str, str] = "fill",
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
    mesh: Mapping[str, str] | None = None,
    halo_every: int | None = None,
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
    mesh, halo_every
        Scale-out: ``mesh={dim: axis}`` shards the data over JAX devices (see
        :doc:`/scaling`); for dask-backed or sharded data, ``halo_every=K``
        runs K steps per halo exchange (a halo K times as deep).

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
    call = f"{'da' if isinstance(obj, xr.DataArray) else 'ds'}.stencil.scan(...)"
    o = _options(call, dim, window, boundary, fill_value, steps, dt, coord, save_every,
                 progress, checkpoint, check_finite, period)
    if step is not None:
        if kernel is not None:
            raise XStencilError(f"{call}: pass a kernel or step=, not both")
        return _run_step(call, obj, step, o, args, kwargs)
    if not callable(kernel):
        raise XStencilError(f"{call}: kernel={kernel!r:.60} is not callable; pass a function "
                            f"of one window, e.g. lambda u: u(time=-1) + ..., or step=fn")
    from xstencil._blockscan import scale_out

    out = scale_out(obj, kernel, dim, args, dict(
        window=window, boundary=boundary, fill_value=fill_value, steps=steps, dt=dt,
        coord=coord, save_every=save_every, period=period, progress=progress,
        checkpoint=checkpoint, check_finite=check_finite, **kwargs),
        mesh=mesh, halo_every=halo_every)
    if out is not None:  # dask-backed or sharded data: K steps per halo exchange
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
    return _run(call, m._obj, kernels, m, m, o, args, kwargs)


# -- set-up -----------------------------------------------------------------------------

def _time_boundary(boundary: Any, dim: str) -> tuple[Any, str]:
    """(boundary with a placeholder mode for ``dim``, the mode asked for ``dim``)."""
    if isinstance(boundary, Mapping):
        asked = boundary.get(dim, "fill")
        b = dict(boundary)
        b[dim] = "extend"
        return b, asked
    return boundary, boundary if isinstance(boundary, str) else "fill"


def _grown_coord(call: str, obj: Any, o: _Opts, n0: int, total: int) -> np.ndarray | None:
    dim = o.dim
    have = obj[dim].values if n0 and dim in obj.coords else None
    if o.coord is not None:
        c = np.asarray(o.coord)
        if c.ndim != 1 or len(c) not in (total, total - n0) or (len(c) == total - n0
                                                                and n0 and have is None):
            raise XStencilError(
                f"{call}: coord= has shape {c.shape}; give {total} values (the initial "
                f"position(s) and steps={o.steps}) or {total - n0} values for the new ones")
        return c if len(c) == total else np.concatenate([have, c]) if n0 else c
    if o.dt is not None:
        if have is not None:
            start = have[-1]
            return np.concatenate([have, start + o.dt * np.arange(1, total - n0 + 1)])
        base = np.zeros((), dtype=np.asarray(o.dt).dtype) if isinstance(
            o.dt, np.timedelta64) else 0
        return base + o.dt * np.arange(total)
    if have is not None:
        if n0 < 2:
            raise XStencilError(
                f"{call}: the input has a {dim!r} coordinate; pass dt= (a spacing) or coord= "
                f"(values) to continue it for steps={o.steps}")
        d = have[-1] - have[-2]
        return np.concatenate([have, have[-1] + d * np.arange(1, total - n0 + 1)])
    return np.arange(total)  # step numbers


@dataclasses.dataclass
class _Setup:
    plan: Plan
    f: Fields
    k: int
    total: int
    grown: bool
    n0: int
    evolving: tuple[int, ...]  # variable indices advanced by the scan
    tvals: np.ndarray | None  # the dim coordinate of the whole trajectory
    tmode: str
    obj: Any


def _fields(call: str, obj: Any, o: _Opts, evolve: Sequence[str] | None,
            total: int) -> tuple[Fields, int, np.ndarray | None]:
    """The Fields of the whole trajectory (arrays: the input), ``n0`` (input
    length along dim) and the trajectory's dim coordinate."""
    dim = o.dim
    f = unwrap(call, obj)
    if o.steps is None:
        if dim not in f.dims:
            raise XStencilError(
                f"{call}: dimension {dim!r} not found; available dims are {f.dims!r} (to grow "
                f"a trajectory from an initial state without {dim!r}, pass steps=N)")
        tv = obj[dim].values if dim in obj.coords else None
        return f, f.shape[f.dims.index(dim)], tv
    n0 = f.shape[f.dims.index(dim)] if dim in f.dims else 0
    tvals = _grown_coord(call, obj, o, n0, total)
    coords = {str(n): v.variable for n, v in obj.coords.items() if dim not in v.dims}
    if tvals is not None:
        coords[dim] = xr.Variable(dim, tvals)
    template = xr.Dataset(coords=coords)
    if dim in f.dims:
        shape = tuple(total if d == dim else n for d, n in zip(f.dims, f.shape, strict=True))
        return Fields(template, f.dims, shape, f.names, f.arrays, f.var_dims, f.dtypes), n0, tvals
    names = f.names or ("",)
    var_dims = tuple((dim,) + vd if (evolve is None or n in evolve) else vd
                     for n, vd in zip(names, f.var_dims, strict=True))
    return Fields(template, (dim,) + f.dims, (total,) + f.shape, f.names, f.arrays, var_dims,
                  f.dtypes), n0, tvals


def _setup(call: str, obj: Any, kernels: Sequence[Any], o: _Opts, args: Any,
           kwargs: Any, evolve: Sequence[str] | None = None) -> _Setup:
    dim = o.dim
    total_guess = None if o.steps is None else 1 + o.steps
    f, n0, tvals = _fields(call, obj, o, evolve, total_guess or 0)
    boundary, tmode = _time_boundary(o.boundary, dim)
    plan = prepare(call, f, kernels, window=o.window, boundary=boundary,
                   fill_value=o.fill_value, stride=None, output_dims=None, args=args,
                   kwargs=kwargs)
    spec = plan.specs[plan.axis(dim)]
    k = spec.lo
    if o.steps is not None:
        if k == 0:
            raise XStencilError(
                f"{call}: the kernel reads no earlier position along {dim!r} (such as "
                f"u({dim}=-1)), so there is nothing to grow with steps={o.steps}")
        if n0 not in (0, k) or (n0 == 0 and k != 1):
            what = f"{n0} position(s)" if n0 else f"no {dim!r}"
            raise XStencilError(
                f"{call}: steps={o.steps} grows a trajectory from its initial conditions, "
                f"which are the first {k} position(s) along {dim!r} (the window reaches {k} "
                f"back); the input has {what}. Pass "
                + (f"obj.isel({dim}=slice(0, {k}))" if n0 > k else
                   f"{k} initial position(s) along {dim!r}")
                + (" or scan the input's own trajectory without steps=" if n0 > k else ""))
        if k + o.steps != total_guess:
            f, n0, tvals = _fields(call, obj, o, evolve, k + o.steps)
            plan = prepare(call, f, kernels, window=o.window, boundary=boundary,
                           fill_value=o.fill_value, stride=None, output_dims=None,
                           args=args, kwargs=kwargs)
    total = f.shape[f.dims.index(dim)]
    if o.steps is None and total < k:
        raise XStencilError(
            f"{call}: the window reaches {k} positions back along {dim!r}, which has only "
            f"{total}; the first {k} positions are the initial conditions")
    if tmode not in ("fill", "extend") or spec.hi and tmode == "fill":
        b = dict(o.boundary) if isinstance(o.boundary, Mapping) else dict.fromkeys(
            f.dims, o.boundary)
        b[dim] = tmode
        plan = prepare(call, f, kernels, window=o.window, boundary=b, fill_value=o.fill_value,
                       stride=None, output_dims=None, args=args, kwargs=kwargs)
    for d, s in zip(plan.dims, plan.specs, strict=True):
        if s.mode == "valid" and d != dim and (s.lo or s.hi):
            raise XStencilError(
                f"{call}: boundary 'valid' along {d!r} would shrink each step's output; a scan "
                f"needs a padding boundary mode for {d!r} (e.g. 'periodic' or 'extend')")
    if plan.var_names is None:
        evolving: tuple[int, ...] = (0,)
    else:
        evolving = tuple(i for i, vd in enumerate(plan.var_dims) if dim in vd)
    return _Setup(plan, f, k, total, o.steps is not None, n0, evolving, tvals, tmode, obj)


def _engine_vars(s: _Setup, dim: str, evolving: Sequence[int]) -> list[Var]:
    plan = s.plan
    wset = set(plan.window_dims)
    out = []
    for i, vdims in enumerate(plan.var_dims):
        axes = tuple(plan.axis(d) for d in vdims if d != dim)
        specs = [plan.specs[a] for a in axes]
        wd = [d for d in vdims if d in wset]
        out.append(Var(
            axes, tuple(a for a in axes if plan.dims[a] in wset),
            tuple((sp.pad_lo, sp.pad_hi) for sp in specs),
            tuple(sp.mode if sp.mode != "valid" else "fill" for sp in specs),
            0 if plan.fill_value is None else plan.fill_value,
            wd.index(dim) if dim in wd else None,
            evolving.index(i) if i in evolving else None,
            dim in vdims and not (s.grown and i in evolving)))
    return out


# -- running ----------------------------------------------------------------------------

def _run(call: str, obj: Any, kernels: Sequence[Any], owner: Any, mesh: Any, o: _Opts,
         args: Any, kwargs: Any) -> Any:
    dim = o.dim
    s = _setup(call, obj, kernels, o, args, kwargs)
    with precision(s.f.arrays, args, kwargs):
        udyn, static = split_static(call, (args, kwargs))
        names = _returned(call, s, kernels, static, udyn, o)
        if names is not None and s.grown and dim not in obj.dims:
            s = _setup(call, obj, kernels, o, args, kwargs, evolve=names)
        plan = s.plan
        evolving = _evolving(call, s, names, dim)
        t_ax = plan.axis(dim)
        geom = plan.geom
        sub = [AxisGeom(0, 1, 1, 1) if a == t_ax else g for a, g in enumerate(geom)]
        spatial = dataclasses.replace(plan, coord_dims=tuple(d for d in plan.coord_dims
                                                             if d != dim))
        coords = [jnp.asarray(c) for c in coord_arrays(spatial, s.f, o.period)]
        tcoord = _time_coord(call, s, o)
        variables = _engine_vars(s, dim, evolving)
        loop = _loop(s, o)
        arrays = [_input(x, vd, dim) for x, vd in zip(s.f.arrays, plan.var_dims, strict=True)]
        init = [_initial(arrays[i], s, variables[i]) for i in evolving]
        slab_avals = [jax.ShapeDtypeStruct(
            tuple(plan.shape[plan.axis(d)] for d in vd if d != dim), np.dtype(dt))
            for vd, dt in zip(plan.var_dims, plan.var_dtypes, strict=True)]
        extra = [Source(c, (plan.axis(d),), (plan.axis(d),))
                 for d, c in zip(spatial.coord_dims, coords, strict=True)]
        lcalls = [_labelled_call(plan, kernel_caller(plan, k, static), dim, names)
                  for k in kernels]
        shapes = tuple((tuple(np.shape(x)), str(getattr(x, "dtype", ""))) for x in udyn)
        reads, t_used = compiled(owner, ("reads", plan, static, loop, tuple(evolving),
                                         tuple(names or ()), tcoord is None, shapes,
                                         tuple(kernels)),
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
            _check_monotonic(call, dim, s.tvals)
        if mesh is not None:
            regions, masks = _mesh_regions(mesh, plan, dim)
        else:
            regions, masks = [Slab(tuple((0, g.count, 1) for g in geom))], []
        key = ("scan", plan, static, loop, tuple(evolving), tuple(names or ()),
               tuple(regions), tcoord is None, s.total,
               tuple(kernels) if mesh is not None else None)
        k = s.k

        def build() -> Callable[..., Any]:
            def run(arrays: Any, init: Any, coords: Any, tcoord: Any, masks: Any, udyn: Any,
                    token: Any) -> Any:
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
                prog = (_progress.report, token) if loop.progress_every else None
                saved, bad = run_loop(stepf, init, loop, prog)
                outs = []
                for h, x in zip(init, saved, strict=True):
                    if loop.every and k:
                        x = jnp.concatenate([jnp.stack(h[-k:]), x])
                    outs.append(x)
                return outs, bad

            return jax.jit(run)

        fn = compiled(owner, key, build)
        arrays_in = [a if v.has_time or v.state is None else None
                     for a, v in zip(arrays, variables, strict=True)]
        runargs = (arrays_in, init, coords, tcoord, [jnp.asarray(m) for m in masks], udyn)
        outs, bad = _call(fn, runargs, loop, call)
    _finite(call, bad, s, dim)
    return _rewrap(s, o, outs, evolving)


def _returned(call: str, s: _Setup, kernels: Sequence[Any], static: Any, udyn: Any,
              o: _Opts) -> list[str] | None:
    """The variable names a Dataset kernel returns (``None`` for a DataArray)."""
    plan = s.plan
    if plan.var_names is None:
        return None
    cells = [jax.ShapeDtypeStruct(
        tuple(plan.specs[plan.axis(d)].size for d in vd if d in plan.window_dims), np.dtype(dt))
        for vd, dt in zip(plan.var_dims, plan.var_dtypes, strict=True)]
    cells += [jax.ShapeDtypeStruct((plan.specs[plan.axis(d)].size,), _cdt(plan))
              for d in plan.coord_dims]
    names: list[str] | None = None
    for kn in kernels:
        c = kernel_caller(plan, kn, static)
        shapes = jax.eval_shape(lambda cs, d, c=c: c(cs, d), cells, udyn)
        if not isinstance(shapes, Mapping):
            raise XStencilError(
                f"{call}: a Dataset kernel must return a dict of the variables it advances, "
                f"e.g. {{{plan.var_names[0]!r}: ...}}")
        got = list(shapes)
        unknown = [n for n in got if n not in plan.var_names]
        if unknown:
            raise XStencilError(
                f"{call}: the kernel returned {unknown!r}, which are not data variables; "
                f"available are {plan.var_names!r}")
        if names is not None and set(got) != set(names):
            raise XStencilError(
                f"{call}: the mesh kernels return different variables ({sorted(names)!r} and "
                f"{sorted(got)!r}); every kernel must return the same ones")
        names = got
    return names


def _evolving(call: str, s: _Setup, names: Sequence[str] | None, dim: str) -> tuple[int, ...]:
    plan = s.plan
    if names is None:
        return (0,)
    assert plan.var_names is not None
    consts = [n for n in names if dim not in plan.var_dims[plan.var_names.index(n)]]
    if consts:
        raise XStencilError(
            f"{call}: the kernel returned {consts!r}, which have no dim {dim!r}; variables "
            f"without {dim!r} are constants of the scan (give them the dim to advance them)")
    evolving = tuple(plan.var_names.index(n) for n in names)
    if s.grown:
        missing = [n for i, n in enumerate(plan.var_names)
                   if dim in plan.var_dims[i] and i not in evolving]
        if missing:
            raise XStencilError(
                f"{call}: variables {missing!r} have dim {dim!r} but the kernel does not "
                f"return them; when growing a trajectory every variable along {dim!r} must be "
                f"advanced (return them, or drop their {dim!r})")
    return evolving


def _call(fn: Any, runargs: Any, loop: Loop, call: str) -> Any:
    if not loop.progress_every:
        return fn(*runargs, jnp.asarray(0, jnp.int32))
    with _progress.Progress(loop.steps, call.split("(")[0]) as p:
        try:
            out = fn(*runargs, jnp.asarray(p.token, jnp.int32))
            jax.block_until_ready(out)
        except jax.errors.JaxRuntimeError as e:
            # Ctrl-C inside the progress callback surfaces wrapped by the runtime
            if "KeyboardInterrupt" in str(e):
                raise KeyboardInterrupt from e
            raise
    return out


def _mesh_regions(mesh: Any, plan: Plan, dim: str) -> Any:
    """The mesh's regions over the trajectory.  Masks of a mesh over an initial
    state without ``dim`` get a length-1 ``dim`` axis, which every step reads
    (the dynamic slice at position ``t`` clamps to it)."""
    if dim in mesh._fields.dims:
        return mesh.regions(plan)
    ax = plan.axis(dim)
    proxy = types.SimpleNamespace(_regions=[
        (np.expand_dims(r, ax) if isinstance(r, np.ndarray) else r, k)
        for r, k in mesh._regions])
    return type(mesh).regions(proxy, plan)


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


def _time_coord(call: str, s: _Setup, o: _Opts) -> Any:
    plan = s.plan
    if o.dim not in plan.coord_dims or s.tvals is None:
        return None
    c = numeric_coord(call, o.dim, np.asarray(s.tvals))
    spec = plan.specs[plan.axis(o.dim)]
    mode = s.tmode if s.tmode in ("fill", "extend") else "extend"
    p = pad_coord(call, o.dim, c, spec.lo, spec.hi, mode)
    return jnp.asarray(np.asarray(p, dtype=_cdt(plan)))


def _cdt(plan: Plan) -> Any:
    """The float dtype coordinates are read in (as in :func:`coord_arrays`)."""
    cdt = np.result_type(*[dt if np.dtype(dt).kind in "fc" else np.float32
                           for dt in plan.var_dtypes])
    if np.dtype(cdt).kind == "c":
        cdt = np.float64 if np.dtype(cdt).itemsize == 16 else np.float32
    return np.dtype(cdt)


def _check_monotonic(call: str, dim: str, tvals: Any) -> None:
    if tvals is None:
        return
    c = numeric_coord(call, dim, np.asarray(tvals))
    if c is not None and len(c) > 1 and not np.all(np.diff(c) > 0):
        bad = int(np.argmin(np.diff(c) > 0))
        raise XStencilError(
            f"{call}: the kernel reads u.coord({dim!r}), but coordinate {dim!r} does not "
            f"increase strictly (position {bad + 1}: {tvals[bad]!r} -> {tvals[bad + 1]!r}); "
            f"sort the data along {dim!r} (obj.sortby({dim!r})) or pass increasing coord=")


def _loop(s: _Setup, o: _Opts) -> Loop:
    k = s.k
    steps = s.total - k
    every = o.save_every
    if every:
        steps = steps // every * every
    plan = s.plan
    cells = sum(int(np.prod([plan.shape[plan.axis(d)] for d in plan.var_dims[i] if d != o.dim]))
                for i in s.evolving)
    prog = _progress.every(steps, cells) if o.progress and steps else 0
    return Loop(k, steps, every, plan.specs[plan.axis(o.dim)].lo,
                plan.specs[plan.axis(o.dim)].hi, 0 if s.grown else s.total, s.tmode,
                o.checkpoint, prog, o.check_finite)


def _input(x: Any, vdims: Sequence[str], dim: str) -> Any:
    x = as_array("scan", "the data", x)
    if dim in vdims:
        ax = list(vdims).index(dim)
        if ax:
            x = jnp.moveaxis(x, ax, 0)
    return x


def _initial(x: Any, s: _Setup, v: Var) -> list[Any]:
    """The last ``max(k, 1)`` initial slabs, oldest first."""
    if s.k == 0:
        return [jnp.zeros(x.shape[1:], x.dtype)]
    if not v.has_time and s.grown and x.ndim == len(v.axes):
        return [x]
    return [x[i] for i in range(s.k)]


def _finite(call: str, bad: Any, s: _Setup, dim: str) -> None:
    if isinstance(bad, jax.core.Tracer):
        return
    b = int(bad)
    if b >= 0:
        where = f" ({dim}={np.asarray(s.tvals)[b]})" if s.tvals is not None else ""
        raise XStencilError(
            f"{call}: check_finite=True: a NaN or Inf first appeared at position {b} along "
            f"{dim!r}{where}; check the time step (stability) and the boundary values")


def _positions(s: _Setup, loop: Loop) -> np.ndarray:
    if loop.every == 0:
        return np.array([s.k + loop.steps - 1 if loop.steps else s.total - 1])
    return np.concatenate([np.arange(s.k), s.k - 1 + loop.every * np.arange(
        1, loop.saves + 1)]).astype(int)


def _rewrap(s: _Setup, o: _Opts, outs: Sequence[Any], evolving: Sequence[int]) -> Any:
    outs = host64(outs)
    dim = o.dim
    plan = s.plan
    pos = _positions(s, _loop(s, o))
    coords = s.f.obj.coords.to_dataset()
    if dim in coords.dims:
        coords = coords.isel({dim: pos})
    datas = {}
    for i, x in zip(evolving, outs, strict=True):
        ax = list(plan.var_dims[i]).index(dim)
        # numpy for host results (float64 with x64 off): a jnp op would truncate them
        move = np.moveaxis if isinstance(x, np.ndarray) else jnp.moveaxis
        datas[i] = move(x, 0, ax) if ax else x
    obj = s.obj
    if plan.var_names is None:
        out: Any = xr.DataArray(datas[0], dims=plan.var_dims[0], coords=coords.coords,
                                name=obj.name, attrs=dict(obj.attrs))
    else:
        names = [plan.var_names[i] for i in evolving]
        rest = obj.drop_vars(names)
        if s.grown:
            rest = rest.drop_vars([n for n, v in rest.variables.items() if dim in v.dims])
            rest = rest.assign_coords(coords.coords)
        else:
            rest = rest.isel({dim: pos})
        for i, n in zip(evolving, names, strict=True):
            da = xr.DataArray(datas[i], dims=plan.var_dims[i], attrs=dict(obj[n].attrs))
            own = tuple(obj[n].dims)
            order = [d for d in (own if dim in own else (dim,) + own) if d in da.dims]
            order += [d for d in da.dims if d not in order]
            rest[n] = da.transpose(*order)
        out = rest[[str(n) for n in obj.data_vars]]
    return out.isel({dim: 0}) if _loop(s, o).every == 0 else out


# -- step functions ---------------------------------------------------------------------

def _run_step(call: str, obj: Any, fn: Any, o: _Opts, args: Any, kwargs: Any) -> Any:
    """``scan(obj, step=fn, steps=N)``: ``fn`` maps the previous state to the next."""
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
    tvals = _grown_coord(call, obj, o, n0, 1 + o.steps)
    if isinstance(state0, xr.DataArray):
        names: tuple[str, ...] | None = None
        arrays = [state0.data]
    else:
        names = tuple(str(n) for n in state0.data_vars)
        arrays = [state0[n].data for n in names]
    with precision(arrays, args, kwargs):
        arrays = [as_array(call, "the data", x) for x in arrays]
        udyn, static = split_static(call, (args, kwargs))
        template = state0.copy(deep=False)

        def wrap(datas: Sequence[Any]) -> Any:
            if names is None:
                return xr.DataArray(datas[0], dims=template.dims, coords=template.coords,
                                    name=template.name, attrs=template.attrs)
            return xr.Dataset({n: (template[n].dims, d, template[n].attrs)
                               for n, d in zip(names, datas, strict=True)},
                              coords=template.coords, attrs=template.attrs)

        def apply(datas: Sequence[Any], udyn: Any) -> list[Any]:
            a, kw = merge_static(udyn, static)
            new = fn(wrap(datas), *a, **kw)
            return _step_result(call, new, names, template, datas)

        shapes = jax.eval_shape(apply, arrays, udyn)
        evolving = [i for i, (x, sd) in enumerate(zip(arrays, shapes, strict=True))
                    if sd is not None]
        loop = Loop(1, o.steps, o.save_every, 1, 0, 0, "fill", o.checkpoint,
                    _progress.every(o.steps, sum(int(np.prod(x.shape)) for x in arrays))
                    if o.progress else 0, o.check_finite)
        key = ("step", static, loop, names, tuple(evolving), tuple(
            (tuple(x.shape), str(x.dtype)) for x in arrays))

        def build() -> Callable[..., Any]:
            def run(arrays: Any, udyn: Any, token: Any) -> Any:
                def stepf(t: Any, hist: Any) -> tuple[Any, ...]:
                    datas = list(arrays)
                    for j, i in enumerate(evolving):
                        datas[i] = hist[j][-1]
                    new = apply(datas, udyn)
                    return tuple(new[i].astype(arrays[i].dtype) for i in evolving)

                init = [[arrays[i]] for i in evolving]
                prog = (_progress.report, token) if loop.progress_every else None
                saved, bad = run_loop(stepf, init, loop, prog)
                if loop.every:
                    saved = tuple(jnp.concatenate([arrays[i][None], x])
                                  for i, x in zip(evolving, saved, strict=True))
                return saved, bad

            return jax.jit(run)

        run = compiled(fn, key, build)
        outs, bad = _call(run, (arrays, udyn), loop, call)
    outs = host64(outs)
    if not isinstance(bad, jax.core.Tracer) and int(bad) >= 0:
        b = int(bad)
        where = f" ({dim}={np.asarray(tvals)[b]})" if tvals is not None else ""
        raise XStencilError(
            f"{call}: check_finite=True: a NaN or Inf first appeared at position {b} along "
            f"{dim!r}{where}; check the time step (stability) and the boundary values")
    pos = (np.array([o.steps]) if o.save_every == 0 else
           np.concatenate([[0], o.save_every * np.arange(1, o.steps // o.save_every + 1)]))
    tc = {} if tvals is None else {dim: (dim, np.asarray(tvals)[pos])}
    if names is None:
        out: Any = xr.DataArray(outs[0], dims=(dim,) + tuple(template.dims),
                                coords={**template.coords, **tc}, name=template.name,
                                attrs=template.attrs)
    else:
        out = template.assign_coords(tc)
        for j, i in enumerate(evolving):
            n = names[i]
            out[n] = ((dim,) + tuple(template[n].dims), outs[j], template[n].attrs)
    return out.isel({dim: 0}) if o.save_every == 0 else out


def _step_result(call: str, new: Any, names: tuple[str, ...] | None, template: Any,
                 datas: Sequence[Any]) -> list[Any]:
    """The step function's result as arrays in the state's dim order (``None``
    for Dataset variables it does not return: they are constants)."""
    if names is None:
        if not isinstance(new, xr.DataArray):
            raise XStencilError(f"{call}: step= returned {type(new).__name__}; return a "
                                f"DataArray like the state")
        return [_dims_like(call, new, template.dims, "the state")]
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
    return [None if n not in new else _dims_like(call, new[n], template[n].dims, repr(n))
            for n in names]


def _dims_like(call: str, new: Any, dims: Sequence[Any], what: str) -> Any:
    data = new.data if isinstance(new, xr.DataArray) else new
    if isinstance(new, xr.DataArray):
        if set(new.dims) != set(dims):
            raise XStencilError(f"{call}: step= returned dims {tuple(new.dims)!r} for {what}, "
                                f"which has dims {tuple(dims)!r}")
        data = new.transpose(*dims).data
    return jnp.asarray(data)

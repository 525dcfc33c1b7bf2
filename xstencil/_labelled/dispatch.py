"""Hand a labelled map to the backend its arrays choose.

:data:`HOOKS` is the labelled layer's kernel adapter and compile cache, lent
to the backends (they never import this layer).  :func:`map_scaled` reduces
a planned map to a :class:`~xstencil._backends.jobs.MapJob` and runs it on
dask or sharded devices; in-memory data stays with the caller.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from xstencil._backends import backend_for
from xstencil._backends.dask import map_dask
from xstencil._backends.jobs import Hooks, MapJob
from xstencil._backends.shard import map_sharded, prepared
from xstencil._engine.call import precision
from xstencil._engine.coords import coord_values, read_coord
from xstencil._engine.kcache import compiled
from xstencil._errors import XStencilError
from xstencil._labelled.core import (
    Fields,
    check_period,
    identity_caller,
    kernel_caller,
    plan_modes,
    prepare,
    unwrap,
)
from xstencil._labelled.options import MAP

__all__ = ["HOOKS", "devices_arg", "map_job", "map_scaled", "sharded_hlo"]

HOOKS = Hooks(caller=kernel_caller, identity=identity_caller, compiled=compiled)


def devices_arg(call: str, devices: Any, mesh: Any) -> Any:
    """``devices=``, or the deprecated ``mesh=`` with a DeprecationWarning
    (``mesh=`` of ``map``/``scan`` named the device mesh before function
    meshes, :func:`xstencil.mesh`, took the name)."""
    if mesh is None:
        return devices
    if devices is not None:
        raise XStencilError(
            f"{call}: devices={devices!r} and mesh={mesh!r} both given; mesh= is the old "
            f"name of devices=, so pass devices= only")
    warnings.warn(
        f"{call}: mesh= is deprecated for the device mesh (it collides with function meshes, "
        f"xstencil.mesh); pass devices={mesh!r} instead", DeprecationWarning, stacklevel=3)
    return mesh


def map_job(plan: Any, f: Fields, kernels: Sequence[Callable[..., Any]], owner: Any,
            args: Any, kwargs: Any, period: Mapping[str, float] | None, devices: Any,
            regions: Sequence[Any] | None = None, masks: Sequence[Any] = (),
            backend: str | None = None) -> MapJob:
    """The map of ``f`` reduced to raw arrays and numeric coordinates."""
    check_period(plan.call, period, plan.dims, plan_modes(plan))
    variables = f.obj.coords.variables
    coords = {d: read_coord(plan.call, d, coord_values(variables[d]))
              for d in plan.coord_dims}
    return MapJob(plan, HOOKS, tuple(kernels), owner, list(f.arrays), f.var_dims, f.names,
                  coords, period, tuple(args), dict(kwargs),
                  None if regions is None else tuple(regions), tuple(masks), devices, backend)


def map_scaled(plan: Any, f: Fields, kernels: Sequence[Callable[..., Any]], owner: Any,
               args: Any, kwargs: Any, period: Mapping[str, float] | None, devices: Any,
               regions: Sequence[Any] | None = None, masks: Sequence[Any] = (),
               backend: str | None = None) -> Any:
    """The engine output of a map on dask or sharded data, or ``None`` when
    the data is in memory on one device (the caller runs the engine then).
    ``backend``: ``backend=`` of the map (dask blocks on the CPU loop
    backend, :mod:`xstencil._backends.dask_loops`)."""
    which = backend_for(f.arrays, plan.call, devices)
    if which == "memory":
        return None
    job = map_job(plan, f, kernels, owner, args, kwargs, period, devices, regions, masks,
                  backend)
    return map_dask(job) if which == "dask" else map_sharded(job)


def sharded_hlo(obj: Any, kernel: Callable[..., Any], *args: Any, devices: Any = None,
                mesh: Any = None, **options: Any) -> str:
    """The optimized HLO text of a sharded ``map`` call, to inspect its
    communication (``collective-permute`` for halos, no ``all-gather``).

    Takes the same arguments as :func:`xstencil.map`; extra keyword
    arguments that are not map options are passed to the kernel.
    """
    call = "xstencil.sharded_hlo(...)"
    devices = devices_arg(call, devices, mesh)
    opts = {k: options.pop(k) for k in list(options) if k in MAP}
    f = unwrap(call, obj)
    plan = prepare(call, f, [kernel], window=opts.get("window"),
                   boundary=opts.get("boundary", "fill"), fill_value=opts.get("fill_value"),
                   stride=opts.get("stride"), output_dims=opts.get("output_dims"), args=args,
                   kwargs=options)
    job = map_job(plan, f, [kernel], kernel, args, options, opts.get("period"), devices)
    with precision(f.arrays, args, options):
        fn, inputs = prepared(job)
        return fn.lower(*inputs).compile().as_text()

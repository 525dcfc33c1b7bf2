"""``blocking=``: in-memory scans stepped tile by tile, K steps at a time.

:func:`blocked` is the hook :func:`xstencil.scan` calls for in-memory data
before it runs the whole-array loop: when the scan is large enough to gain
and the blocked path supports it, the scan runs on the in-memory tile
backend (:mod:`xstencil._backends.tiles`), reduced to the same
:class:`~xstencil._backends.halo.BlockJob` as a dask-backed scan
(:mod:`xstencil._labelled.blockprep`), and the result is labelled and
typed as the in-memory scan's.  Otherwise it returns ``None`` and the scan
runs as before.

The blocked path is taken only outside JAX transforms, for numpy data or
concrete JAX arrays on one CPU device, on the CPU backend, for a kernel
(not ``step=`` or a function mesh), without ``progress``, ``checkpoint``
or ``check_finite``.  Anything else, and any scan the block setup refuses,
takes the whole-array loop silently: blocking changes speed, never results.
"""

from __future__ import annotations

import itertools
import math
import numbers
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import xarray as xr

from xstencil._backends import tiles
from xstencil._backends.loops import AUTO_MIN_POINTS, resolve_mode
from xstencil._engine.call import outside_transforms
from xstencil._errors import XStencilError
from xstencil._labelled.blockprep import block_spec, rewrap, setup
from xstencil._labelled.dask_loop_scan import block_loop_scan
from xstencil._labelled.scale import block_job
from xstencil._labelled.scan_plan import ScanPlan

__all__ = ["MIN_BYTES", "MIN_STEPS", "blocking_arg", "blocked"]

#: The smallest state (bytes of one position of the advanced variables) that
#: is blocked by default: below it the whole array stays in cache and the
#: whole-array loop is faster (measured: docs/performance.rst, "Temporal
#: blocking").
MIN_BYTES = 12 << 20
#: The fewest steps between saves that are blocked by default (each save
#: ends a layer of tiles, so fewer steps leave too little to amortise).
MIN_STEPS = 8


def blocking_arg(call: str, blocking: Any) -> None | bool | dict[str, Any]:
    """``blocking=`` checked: ``None`` (automatic), ``True`` (block whenever
    supported, automatic sizes), ``False`` (never), or a dict with ``"tile"``
    (cells per dim: an int for every dim, or ``{dim: int}``) and/or
    ``"steps"`` (K, an int), which implies ``True``."""
    if blocking is None or isinstance(blocking, bool):
        return blocking
    if not isinstance(blocking, Mapping) or set(blocking) - {"tile", "steps"}:
        raise XStencilError(
            f"{call}: blocking={blocking!r} must be None (automatic), True, False, or a dict "
            f"with 'tile' and/or 'steps', e.g. blocking={{'tile': 512, 'steps': 16}}")
    out = dict(blocking)
    k = out.get("steps")
    if k is not None and (isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1):
        raise XStencilError(f"{call}: blocking={{'steps': {k!r}}} must be an int >= 1 (the "
                            f"steps each tile runs at a time), e.g. blocking={{'steps': 16}}")
    tile = out.get("tile")
    sizes = tile.values() if isinstance(tile, Mapping) else [tile]
    if tile is not None and any(isinstance(s, bool) or not isinstance(s, numbers.Integral)
                                or s < 1 for s in sizes):
        raise XStencilError(f"{call}: blocking={{'tile': {tile!r}}} must be an int >= 1 or a "
                            f"dict {{dim: int >= 1}} (cells per tile along each dim), e.g. "
                            f"blocking={{'tile': 512}}")
    return out


def _concrete(x: Any) -> bool:
    """Whether ``x`` is data the blocked path reads without a device transfer
    or a trace: numpy, or a concrete JAX array on one CPU device."""
    if type(x) is np.ndarray:
        return True
    if isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer):
        devs = x.sharding.device_set
        return len(devs) == 1 and next(iter(devs)).platform == "cpu"
    return False


def _state_bytes(obj: Any, dim: str) -> int:
    """Bytes of one position of the data variables (an upper bound of the
    advanced ones)."""
    vs = [obj] if isinstance(obj, xr.DataArray) else list(obj.data_vars.values())
    return sum(math.prod(s for d, s in v.sizes.items() if d != dim) * v.dtype.itemsize
               for v in vs)


def _as_memory(x: np.ndarray) -> Any:
    """As the whole-array scan returns it: a JAX array, but numpy for 64-bit
    data while JAX's x64 flag is off (see ``result.host64``)."""
    if x.dtype.itemsize >= 8 and not jax.config.read("jax_enable_x64"):
        return x
    return jnp.asarray(x)


def _retyped(sp: ScanPlan, out: Any) -> Any:
    if isinstance(out, xr.DataArray):
        return out.copy(data=_as_memory(np.asarray(out.data)))
    for n in sp.names or ():
        out[n] = out[n].copy(data=_as_memory(np.asarray(out[n].data)))
    return out


def _tiling(call: str, sp: ScanPlan, how: dict[str, Any] | bool | None, forced: bool,
            strips: bool = False) -> tiles.Tiling | None:
    spec = block_spec(sp)
    plan = spec.plan
    space = tuple(plan.dims[1:])  # the block setup puts dim first
    reach = [max(s.lo, s.hi) for s in plan.specs[1:]]
    shape = plan.shape[1:]
    itemsize = np.dtype(plan.var_dtypes[sp.evolving[0]]).itemsize
    row_bytes = spec.k * len(sp.evolving) * itemsize
    opts = how if isinstance(how, dict) else {}
    tile = opts.get("tile")
    if isinstance(tile, Mapping):
        unknown = [d for d in tile if d not in space]
        if unknown:
            raise XStencilError(
                f"{call}: blocking={{'tile': {tile!r}}}: dim {unknown[0]!r} is not a dim the "
                f"scan tiles; available dims are {space!r}")
        tile = [int(tile.get(d, n)) for d, n in zip(space, shape, strict=True)]
    elif tile is not None:
        tile = [int(tile)] * len(shape)
    got = tiles.choose(shape, reach, row_bytes, spec.steps_per_save, tile=tile,
                       steps=opts.get("steps"), strips=strips)
    if not forced and (got.steps < MIN_STEPS or got.count < 2):
        return None
    return got


def _below_floor(tiling: tiles.Tiling, backend: str | None) -> bool:
    """Whether ``"auto"`` would run some tile of ``tiling`` on XLA (fewer
    cells than its floor for the loops)."""
    smallest = min(math.prod(b - a for a, b in c) for c in itertools.product(*tiling.bounds))
    return resolve_mode(backend) == "auto" and smallest < AUTO_MIN_POINTS


def blocked(obj: Any, kernel: Callable[..., Any], dim: str, args: Any, kwargs: Any,
            blocking: Any, backend: str | None = None, **options: Any) -> Any:
    """The scan of ``obj`` run temporally blocked, or ``None`` for the
    whole-array loop.

    ``options`` are the scan's own (``window``, ``boundary``, ``fill_value``,
    ``steps``, ``dt``, ``coord``, ``save_every``, ``period``, ``progress``,
    ``checkpoint``, ``check_finite``) as :func:`xstencil.scan` received them;
    ``kwargs`` go to the kernel.  Where the in-memory loop scan applies
    (``backend``, numpy data), each tile runs it
    (:mod:`~xstencil._labelled.dask_loop_scan`).
    """
    call = f"{'da' if isinstance(obj, xr.DataArray) else 'ds'}.stencil.scan(...)"
    how = blocking_arg(call, blocking)
    if how is False or options.get("progress") or options.get("checkpoint") \
            or options.get("check_finite") or jax.default_backend() != "cpu":
        return None
    datas = [obj.data] if isinstance(obj, xr.DataArray) else [
        v.data for v in obj.data_vars.values()]
    if not all(_concrete(x) for x in datas):
        return None
    if not outside_transforms(jax.tree_util.tree_leaves((args, kwargs))):
        return None
    forced = how is not None
    if not forced and _state_bytes(obj, dim) < MIN_BYTES:
        return None
    try:
        sp, f = setup(call, obj, (kernel,), dim, args, kwargs, **options)
    except XStencilError:  # not for the block scans: the whole-array loop decides
        return None
    loops = block_loop_scan(call, obj, kernel, sp, options, tuple(args), kwargs, backend, None)
    # on the loop scan (forced: unforced, the whole-array loop scan ran first, and declined),
    # whole-row strips, unless "auto" would send strips that small to XLA anyway
    strips = loops is not None and forced
    tiling = _tiling(call, sp, how, forced, strips)
    if strips and tiling is not None and _below_floor(tiling, backend):
        tiling = _tiling(call, sp, how, forced)
    if tiling is None:
        return None
    job = block_job(call, sp, f, obj, (kernel,), kernel, None, args, kwargs)
    outs = tiles.scan_tiles(job, tiling, loops=loops)
    return _retyped(sp, rewrap(sp, f, obj, outs))

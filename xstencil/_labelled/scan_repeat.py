"""A scan's repeat-call lookup, and a scan run on the loop backend only.

:func:`repeat_entry` is the lookup :func:`xstencil.scan` makes before its
setup (the kernel's key, the call's signature, and the fast path's entry,
``scan_fast.py``); :func:`mesh_repeat_entry` is a function mesh's
(``m.scan(...)``), whose signature holds its regions too.
:func:`scan_loops_only` runs a scan on the numba loops or not at all, for a
caller with an XLA path of its own (a dask scan task or a temporally blocked
tile, :mod:`~xstencil._labelled.dask_loop_scan`); its repeats take the same
fast path as a user's repeated scan.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import xarray as xr

from xstencil._engine.kcache import describe
from xstencil._labelled import scan_fast
from xstencil._labelled.loop_mesh_scan import loop_mesh_scan
from xstencil._labelled.loop_scan import Repeat, backend_mode, eligible, loop_scan
from xstencil._labelled.mesh_run import layout, still_seen
from xstencil._labelled.scan_plan import ScanPlan

__all__ = ["loop_keeper", "mesh_repeat_entry", "mesh_scan_loops_only", "repeat_entry",
           "scan_loops_only"]


def repeat_entry(obj: Any, kernel: Any, options: tuple[Any, ...], args: Any, kwargs: Any,
                 dtype: Any, blocking: Any, backend: str | None) -> tuple[Any, Any, Any]:
    """The kernel's key, the call's signature and the fast path's entry for
    them (``None`` when there is none yet).  ``options`` as
    :class:`~xstencil._labelled.scan_plan.ScanPlan` takes them after
    ``call``."""
    # blocking=False (never block) runs the loops unblocked, as None does for a
    # loop scan; keyed apart, as None may block a large scan the loops decline
    return _entry(obj, [kernel], options, args, kwargs, dtype,
                  blocking is None or blocking is False, backend,
                  (("unblocked",),) if blocking is False else ())


def mesh_repeat_entry(m: Any, kernels: Any, options: tuple[Any, ...], args: Any, kwargs: Any,
                      dtype: Any, backend: str | None) -> tuple[Any, Any, Any]:
    """:func:`repeat_entry` for a function mesh's scan (``m.scan(...)``):
    the kernels' key, and a signature that holds the mesh's regions (by
    value, masks by digest, and which kernel each runs: ``layout(m).key``)
    besides the call's.  As for a mesh's map (``mesh_run.lookup``), only a
    mesh whose data still has the index objects its regions were checked
    against takes the fast path."""
    if not still_seen(m):
        return None, None, None
    return _entry(m._obj, list(kernels), options, args, kwargs, dtype, True, backend,
                  (("mesh", layout(m).key),))


def _entry(obj: Any, kernels: list[Any], options: tuple[Any, ...], args: Any, kwargs: Any,
           dtype: Any, may_loop: bool, backend: str | None, extra: tuple[Any, ...]
           ) -> tuple[Any, Any, Any]:
    """The kernels' key, the signature (the call's, ``extra`` appended) and
    the entry (see :func:`repeat_entry`)."""
    dim, steps, checkpoint, period = options[0], options[4], options[9], options[11]
    lifted = describe(kernels)
    # whether it may run as numba loops is keyed too: an entry never changes the route
    loops = may_loop and eligible(obj, dim, steps is not None, bool(checkpoint or period),
                                  args, kwargs, backend)
    sig = scan_fast.signature(obj, options + (None if dtype is None else str(dtype),
                                              backend_mode(backend), loops) + extra,
                              args, kwargs)
    return lifted, sig, None if sig is None else scan_fast.lookup(lifted, sig, obj)


def scan_loops_only(obj: Any, kernel: Any, options: tuple[Any, ...], args: Any, kwargs: Any,
                    backend: str | None) -> Any:
    """The scan of ``obj`` (of the state's dtype) on the loop backend only,
    or ``None`` where the loops do not apply.  ``options`` as for
    :func:`repeat_entry`.  A repeat of the same layout and kernel takes the
    fast path, as a user's repeated scan does."""
    call = f"{'da' if isinstance(obj, xr.DataArray) else 'ds'}.stencil.scan(...)"
    lifted, sig, entry = repeat_entry(obj, kernel, options, args, kwargs, None, None, backend)
    if entry is not None and isinstance(entry.fn, Repeat):  # a loop scan's entry
        return scan_fast.run(entry, obj, args, kwargs, lifted)

    return loop_scan(obj, kernel, ScanPlan(call, *options), args, kwargs, backend,
                     loop_keeper(lifted, sig, obj, obj, args, kwargs))


def mesh_scan_loops_only(m: Any, options: tuple[Any, ...], args: Any, kwargs: Any,
                         backend: str | None) -> Any:
    """The scan of function mesh ``m`` on the loop backend only, or ``None``
    (as :func:`scan_loops_only`; ``m``'s data of the state's dtype)."""
    obj = m._obj
    kernels = [k for _, k in m._regions]
    call = f"{'da' if isinstance(obj, xr.DataArray) else 'ds'}.stencil.mesh(...).scan()"
    lifted, sig, entry = mesh_repeat_entry(m, kernels, options, args, kwargs, None, backend)
    if entry is not None and isinstance(entry.fn, Repeat):  # a loop scan's entry
        return scan_fast.run(entry, obj, args, kwargs, lifted)
    return loop_mesh_scan(obj, m, kernels, ScanPlan(call, *options), args, kwargs, backend,
                          loop_keeper(lifted, sig, obj, obj, args, kwargs))


def loop_keeper(lifted: Any, sig: Any, obj: Any, cast: Any, args: Any, kwargs: Any
                ) -> Callable[..., None] | None:
    """``loop_scan``'s ``keep``: records a loop scan of ``obj`` (``cast``: it
    with the state's dtype) as the fast path's entry for ``sig``; ``None``
    where the call has no signature."""
    if sig is None:
        return None

    def keep(sp: ScanPlan, repeat: Any, outs: Any, res: Any) -> None:
        scan_fast.remember(lifted, sig, obj, cast, sp, repeat, [], None, (args, kwargs), outs,
                           res)

    return keep

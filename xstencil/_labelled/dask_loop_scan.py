"""dask scan tasks on the CPU loop backend.

A dask scan task advances one chunk K steps from a copy extended by a halo
K window reaches deep (:mod:`xstencil._backends.dask_scan`).  Where the
in-memory loop scan applies (:mod:`xstencil._labelled.loop_scan`: a
DataArray grown by ``steps=`` whose kernel reads only the previous position,
on numpy chunks on the CPU, no coordinate reads, no ``check_finite``,
``checkpoint`` or ``period``), the task runs that loop scan on the extended
block instead of the XLA block program: :class:`BlockLoopScan` is called
with the block, its halo on the global edges of non-periodic dims left out
(there the scan's own boundary mode is the true boundary, applied every
step), and scans it ``n`` steps, keeping the last position.  Along every
other side the extended block's own padding in the dim's mode is wrong, but
the wrong cells creep inward by one reach per step and never reach the
chunk's own cells within K steps: the chunk's cells are those of the
whole-array loop scan, bitwise.

Anything the loop scan declines (it returns ``None``) sends the task, and
every later task of this object, to the XLA block program, with the same
result up to XLA's rounding.  The loop scans of concurrent tasks in one
process run one at a time (:data:`_LOCK`): each already uses every core, and
the loop scan's caches and time-loop driver were written for one caller.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import xarray as xr

from xstencil._backends.loops import available, resolve_mode

__all__ = ["BlockLoopScan", "block_loop_scan"]

_LOCK = threading.Lock()


class BlockLoopScan:
    """``self(block, n)``: the last of ``n`` steps of the in-memory loop
    scan of ``block`` (numpy, ``(1, *space)`` with ``dim`` first), or
    ``None`` where the loops do not apply.  Pickled to dask workers with the
    kernel and its arguments."""

    def __init__(self, call: str, kernel: Any, dim: str, dims: Sequence[str],
                 opts: Mapping[str, Any], args: tuple[Any, ...], kwargs: Mapping[str, Any],
                 backend: str | None):
        self.call, self.kernel, self.dim, self.dims = call, kernel, dim, tuple(dims)
        self.window = opts.get("window")
        self.boundary = opts.get("boundary", "fill")
        self.fill_value = opts.get("fill_value")
        self.args, self.kwargs, self.backend = tuple(args), dict(kwargs), backend
        self.declined = False

    def __call__(self, block: np.ndarray, n: int) -> np.ndarray | None:
        if self.declined:
            return None
        from xstencil._labelled.scan import scan_loops_only  # scan.py imports this module

        obj = xr.DataArray(block, dims=self.dims)
        options = (self.dim, self.window, self.boundary, self.fill_value, int(n), None, None,
                   "last", False, False, False, None)
        with _LOCK:
            out = scan_loops_only(obj, self.kernel, options, self.args, self.kwargs,
                                  self.backend)
        if out is None:
            self.declined = True
            return None
        if self.dim in out.dims:
            out = out.isel({self.dim: -1})
        return np.array(out.transpose(*self.dims[1:]).data)  # a copy: loop buffers are pooled


def block_loop_scan(call: str, obj: Any, kernel: Any, dims: Sequence[str],
                    opts: Mapping[str, Any], args: tuple[Any, ...], kwargs: Mapping[str, Any],
                    backend: str | None, function_mesh: Any) -> BlockLoopScan | None:
    """The loop scan of a dask scan's tasks (``dims``: the scan plan's, the
    scanned dim first), or ``None`` where it cannot apply whatever the block
    (checked on the client: the rest is decided by the first task)."""
    if resolve_mode(backend) == "xla" or not available() or function_mesh is not None:
        return None
    if type(obj) is not xr.DataArray or kernel is None:
        return None
    if opts.get("steps") is None or opts.get("checkpoint") or opts.get("period") \
            or opts.get("check_finite"):
        return None
    meta = getattr(obj.data, "_meta", None)
    if type(meta) is not np.ndarray or meta.dtype.kind not in "biuf":
        return None
    return BlockLoopScan(call, kernel, dims[0], dims, opts, args, kwargs, backend)

"""dask scan tasks on the CPU loop backend.

A dask scan task advances one chunk K steps from a copy extended by a halo
K window reaches deep (:mod:`xstencil._backends.dask_scan`).  Where the
in-memory loop scan applies (:mod:`xstencil._labelled.loop_scan`: a
DataArray or Dataset grown by ``steps=`` whose kernel reads only the
previous position, on numpy chunks on the CPU, no coordinate reads, no
``check_finite``, ``checkpoint`` or ``period``; a Dataset's other variables
constants over the spatial dims), the task runs that loop scan on the
extended block instead of the XLA block program: :class:`BlockLoopScan` is
called with the block (and the constants' blocks), its halo on the global
edges of non-periodic dims left out
(there the scan's own boundary mode is the true boundary, applied every
step), and scans it ``n`` steps, keeping the last position.  Along every
other side the extended block's own padding in the dim's mode is wrong, but
the wrong cells creep inward by one reach per step and never reach the
chunk's own cells within K steps: the chunk's cells are those of the
whole-array loop scan, bitwise.

Anything the loop scan declines (it returns ``None``) sends the task, and
every later task of this object with the same block shapes, to the XLA block
program, with the same result up to XLA's rounding.  The loop scans of concurrent tasks in one
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
from xstencil._labelled.scan_repeat import mesh_scan_loops_only, scan_loops_only

__all__ = ["BlockLoopScan", "block_loop_scan"]

_LOCK = threading.Lock()


class BlockLoopScan:
    """``self(state, consts, n)``: the last of ``n`` steps of the in-memory
    loop scan of a block, or ``None`` where the loops do not apply.
    ``state`` holds the advanced variables' block, one row each
    (``(V, *space)``, numpy), ``consts`` a Dataset's constants' blocks
    (``*space``); the result is ``(V, *space)``.  Pickled to dask workers
    with the kernel and its arguments."""

    def __init__(self, call: str, kernel: Any, dims: Sequence[str], names: Sequence[str] | None,
                 consts: Sequence[str], opts: Mapping[str, Any], args: tuple[Any, ...],
                 kwargs: Mapping[str, Any], backend: str | None, function_mesh: Any = None):
        self.call, self.kernel, self.dim, self.dims = call, kernel, dims[0], tuple(dims)
        # a function mesh's: its class (each block's mesh is one of it), options and
        # kernels, one per region
        self.mesh_type = None if function_mesh is None else type(function_mesh)
        self.mesh_options = {} if function_mesh is None else {
            k: v for k, v in function_mesh._options.items()
            if k in ("window", "boundary", "fill_value", "period")}
        self.kernels = () if function_mesh is None else tuple(
            k for _, k in function_mesh._regions)
        self.names = None if names is None else tuple(names)  # None: a DataArray
        self.consts = tuple(consts)
        self.window = opts.get("window")
        self.boundary = opts.get("boundary", "fill")
        self.fill_value = opts.get("fill_value")
        self.args, self.kwargs, self.backend = tuple(args), dict(kwargs), backend
        self.route = resolve_mode(backend)  # part of the graph's name (dask_scan.py)
        # the block shapes the loop scan declined (e.g. under "auto"'s size floor): a
        # block's route depends on its shape only, never on which task ran first
        self.declined: set[tuple[Any, ...]] = set()

    def __call__(self, state: np.ndarray, consts: Sequence[np.ndarray], n: int,
                 regions: Sequence[tuple[str, Any] | None] | None = None
                 ) -> np.ndarray | None:
        """``regions``: a function mesh's, over the block
        (:func:`~xstencil._backends.blockmesh.local_regions`)."""
        shapes: tuple[Any, ...] = (state.shape, *(c.shape for c in consts))
        if regions is not None:  # the route by the regions' layout too (boxes, masks)
            shapes += tuple(r if r is None or r[0] == "box" else "mask" for r in regions)
        if shapes in self.declined:
            return None
        space = self.dims[1:]
        obj: Any
        if self.names is None:
            obj = xr.DataArray(state[:1], dims=self.dims)
        else:
            obj = xr.Dataset({**{v: (self.dims, state[i:i + 1])
                                 for i, v in enumerate(self.names)},
                              **{c: (space, x) for c, x in zip(self.consts, consts,
                                                                 strict=True)}})
        options = (self.dim, self.window, self.boundary, self.fill_value, int(n), None, None,
                   "last", False, False, False, None)
        with _LOCK:
            if regions is None:
                out = scan_loops_only(obj, self.kernel, options, self.args, self.kwargs,
                                      self.backend)
            else:
                m = self._mesh(obj, regions)
                out = None if m is None else mesh_scan_loops_only(
                    m, options, self.args, self.kwargs, self.backend)
        if out is None:
            self.declined.add(shapes)
            return None
        if self.dim in out.dims:
            out = out.isel({self.dim: -1})
        rows = [np.asarray(r.transpose(*space).data)
                for r in ([out] if self.names is None else [out[v] for v in self.names])]
        # one row: a view (the loop's pooled buffer stays leased while the view lives,
        # bufpool.py); more: stacked, a copy
        return rows[0][None] if len(rows) == 1 else np.stack(rows)

    def _mesh(self, obj: Any, regions: Sequence[tuple[str, Any] | None]) -> Any:
        """The function mesh of one block: each region a box of positions or a
        mask over the block's cells, with its kernel; ``None`` where no region
        applies to the block (the XLA block program keeps its input)."""
        assert self.mesh_type is not None
        space = self.dims[1:]
        m = self.mesh_type(obj, **self.mesh_options)
        for r, kernel in zip(regions, self.kernels, strict=True):
            if r is None:
                continue
            kind, where = r
            if kind == "mask":
                if where.any():  # (a mask with no cell in this block never runs here)
                    m[xr.DataArray(where, dims=space)] = kernel
                continue
            sel = {d: slice(a, b) for d, (a, b) in zip(space, where, strict=True)
                   if (a, b) != (0, obj.sizes[d])}
            if sel:
                m[sel] = kernel
            else:
                m[...] = kernel
        return m if m._regions else None


def block_loop_scan(call: str, obj: Any, kernel: Any, sp: Any, opts: Mapping[str, Any],
                    args: tuple[Any, ...], kwargs: Mapping[str, Any], backend: str | None,
                    function_mesh: Any) -> BlockLoopScan | None:
    """The loop scan of a dask scan's tasks (``sp``: the scan's plan), or
    ``None`` where it cannot apply whatever the block (checked on the
    client: the rest is decided by the first task).  A Dataset's variables
    must each span the field: the advanced ones over the plan's dims, the
    constants over its spatial dims, in that order."""
    if resolve_mode(backend) == "xla" or not available():
        return None
    if (kernel is None and function_mesh is None) or opts.get("steps") is None \
            or opts.get("checkpoint") or opts.get("period") or opts.get("check_finite"):
        return None
    plan = sp.plan
    dims = tuple(plan.dims)
    names, consts = None, []
    if type(obj) is xr.Dataset:
        names = list(sp.names or ())
        for i, (v, vd) in enumerate(zip(plan.var_names, plan.var_dims, strict=True)):
            if i in sp.evolving:
                if tuple(vd) != dims and tuple(vd) != dims[1:]:
                    return None
            elif tuple(vd) == dims[1:]:
                consts.append(v)
            else:  # read along dim without being advanced (forcing), or on fewer dims
                return None
        variables = [obj[v] for v in obj.data_vars]
    elif type(obj) is xr.DataArray:
        variables = [obj]
    else:
        return None
    for v in variables:
        meta = getattr(v.data, "_meta", v.data)
        if type(meta) is not np.ndarray or meta.dtype.kind not in "biuf":
            return None
    return BlockLoopScan(call, kernel, dims, names, consts, opts, args, kwargs, backend,
                         function_mesh)

"""Scale-out scans: a labelled scan handed to the dask or sharded backend.

:func:`scale_out` picks the backend from the arrays; :func:`scan_dask` and
:func:`scan_sharded` set the scan up as in memory (one
:class:`~xstencil._labelled.scan_plan.ScanPlan` and its
:class:`~xstencil._labelled.core.Fields`, :func:`~xstencil._labelled.
blockprep.setup`), turn a function mesh into regions and masks, reduce it
all to a :class:`~xstencil._backends.halo.BlockJob` of raw arrays, run the
backend, and label its result with the in-memory scan's rewrap
(:func:`~xstencil._labelled.blockprep.rewrap`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import xarray as xr

from xstencil._backends import backend_for
from xstencil._backends import dask_scan as dask_backend
from xstencil._backends import shard_scan as shard_backend
from xstencil._backends.blockmesh import block_mesh
from xstencil._backends.dask import is_dask, with_progress
from xstencil._backends.halo import BlockJob
from xstencil._engine.call import precision, split_static
from xstencil._engine.coords import coord_values, read_coord
from xstencil._errors import XStencilError
from xstencil._labelled.blockprep import block_arrays, block_spec, rewrap, setup, time_input
from xstencil._labelled.core import Fields
from xstencil._labelled.dask_loop_scan import block_loop_scan
from xstencil._labelled.dispatch import HOOKS, devices_arg
from xstencil._labelled.options import split_options
from xstencil._labelled.scan_plan import ScanPlan
from xstencil._labelled.scan_result import call_with_progress, not_finite

__all__ = ["scale_out", "scan_dask", "scan_sharded", "block_job"]


def _call(obj: Any) -> str:
    return f"{'ds' if isinstance(obj, xr.Dataset) else 'da'}.stencil.scan(...)"


def scale_out(obj: Any, kernel: Any, dim: str, args: Any, kwargs: Mapping[str, Any], *,
              devices: Any = None, halo_every: int | None = None,
              function_mesh: Any = None, backend: str | None = None) -> Any:
    """The dask-backed or sharded scan of ``obj``, or ``None`` when it is in
    memory on one device and ``devices`` is not given (the caller scans then).

    ``kwargs`` holds the scan options (``window``, ``boundary``, ...) and the
    kernel's keyword arguments together, as :func:`xstencil.scan` receives them.
    ``function_mesh`` is a :class:`~xstencil.Mesh` to scan instead of ``kernel``.
    """
    arrays = [v.data for v in obj.data_vars.values()] if isinstance(obj, xr.Dataset) \
        else [getattr(obj, "data", None)]
    which = backend_for(arrays, _call(obj), devices)
    if which == "dask":
        return scan_dask(obj, kernel, dim, *args, halo_every=halo_every,
                         function_mesh=function_mesh, backend=backend, **kwargs)
    if which == "shard":
        return scan_sharded(obj, kernel, dim, *args, devices=devices,
                            halo_every=halo_every or 1, function_mesh=function_mesh, **kwargs)
    return None


def _kernels(kernel: Any, function_mesh: Any) -> tuple[Callable[..., Any], ...]:
    return (kernel,) if function_mesh is None else tuple(k for _, k in function_mesh._regions)


def block_job(call: str, sp: ScanPlan, f: Fields, obj: Any, kernels: tuple[Callable[..., Any], ...],
         owner: Any, function_mesh: Any, args: Any, kwargs: Any) -> BlockJob:
    """The scan's plan and fields reduced to raw arrays; a function mesh to
    regions and masks."""
    spec = block_spec(sp)
    plan = spec.plan
    bmesh, masks = None, []
    if function_mesh is not None:
        regions, gmasks = function_mesh.regions(plan, spec.dim)
        bmesh, masks = block_mesh(regions, gmasks, plan, spec.total)
    coords = {d: read_coord(call, d, coord_values(obj[d])) for d in spec.space_coords}
    finite = functools.partial(not_finite, call, spec.dim, sp.tvals) \
        if sp.check_finite else None
    a = block_arrays(sp, f)
    dyn, static = split_static(call, (args, kwargs))
    tcoord = time_input(sp, f, kernels, args, kwargs)
    return BlockJob(call, spec, HOOKS, kernels, owner, a.datas, a.consts, a.forcings, a.names,
                    a.forced, static, tuple(dyn), tcoord, coords, sp.period, bmesh,
                    tuple(masks), finite, sp.progress, sp.checkpoint)


def scan_dask(obj: Any, kernel: Callable[..., Any] | None, dim: str = "time", *args: Any,
              halo_every: int | None = None, function_mesh: Any = None,
              backend: str | None = None, **kwargs: Any) -> Any:
    """Scan a kernel along ``dim`` over a dask-backed DataArray or Dataset, lazily.

    ``dim`` must be a single chunk; the other dims may be chunked.  Each task
    advances one chunk by ``halo_every`` (K) steps, reading a halo K times the
    window's reach deep from its neighbours, so the graph has one layer of
    tasks per K steps.  The result equals the in-memory :func:`xstencil.scan`.

    Parameters
    ----------
    obj
        A dask-backed DataArray or Dataset: the initial state (with
        ``steps=N``) or the trajectory, as for :func:`xstencil.scan` (see
        :mod:`xstencil._labelled.blockprep` for what a Dataset may hold).
    kernel, dim, *args
        As for :func:`xstencil.scan`.
    halo_every
        Steps per task (K).  Defaults to the largest K (at most 32) whose
        halo is at most an eighth of the smallest split chunk.
    function_mesh
        A :class:`~xstencil.Mesh` over ``obj`` (``kernel`` is then
        ``None``): its kernels on its regions, as ``mesh.scan(dim)`` does
        in memory.
    backend
        As for :func:`xstencil.scan`: where the in-memory loop scan applies
        (numba, numpy chunks, a DataArray grown by ``steps=`` whose kernel
        reads only the previous position), each task runs it on its
        extended block (:mod:`xstencil._labelled.dask_loop_scan`).
    **kwargs
        ``window``, ``boundary``, ``fill_value``, ``steps``, ``dt``,
        ``coord``, ``save_every``, ``period``, ``check_finite`` and
        ``progress`` as for :func:`xstencil.scan` (``progress=True``
        computes the result now, kept chunked, under dask's progress
        display: a :class:`dask.diagnostics.ProgressBar` on local
        schedulers, ``distributed.progress`` with a distributed
        ``Client``); other keywords go to the kernel.

    Returns
    -------
    DataArray or Dataset
        Backed by lazy dask arrays (persisted ones with ``progress=True``),
        one chunk per saved position along ``dim`` and the input's chunks
        along the other dims.

    Examples
    --------
    >>> import numpy as np, xarray as xr, xstencil
    >>> from xstencil._labelled.scale import scan_dask
    >>> u0 = xr.DataArray(np.eye(8)[0], dims="x").chunk({"x": 4})
    >>> heat = lambda u: u(time=-1) + 0.25 * (u(time=-1, x=1) - 2 * u(time=-1)
    ...                                       + u(time=-1, x=-1))
    >>> out = scan_dask(u0, heat, "time", steps=2, boundary="periodic", halo_every=2)
    >>> out.chunks
    ((1, 1, 1), (4, 4))
    >>> out.isel(time=1).values
    array([0.5 , 0.25, 0.  , 0.  , 0.  , 0.  , 0.  , 0.25])
    """
    call = _call(obj)
    opts, kw = split_options(kwargs)
    if not isinstance(obj, xr.DataArray | xr.Dataset):
        raise XStencilError(f"{call}: expected a DataArray or Dataset, got "
                            f"{type(obj).__name__}")
    for v in [obj] if isinstance(obj, xr.DataArray) else obj.data_vars.values():
        if dim in v.dims and is_dask(v.data) and len(v.chunks[v.get_axis_num(dim)]) > 1:
            raise XStencilError(
                f"{call}: the data is chunked along the scanned dim {dim!r} "
                f"({len(v.chunks[v.get_axis_num(dim)])} chunks); positions along it are "
                f"computed in order, so it must be one chunk: rechunk with "
                f".chunk({{{dim!r}: -1}}) and chunk the other dims instead")
    if opts.get("checkpoint"):
        raise XStencilError(
            f"{call}: checkpoint=True saves memory in gradients, but a dask-backed scan is "
            f"not differentiable; differentiate an in-memory or sharded scan instead")
    kernels = _kernels(kernel, function_mesh)
    sp, f = setup(call, obj, kernels, dim, args, kw, **opts)
    owner = function_mesh if function_mesh is not None else kernel
    job = block_job(call, sp, f, obj, kernels, owner, function_mesh, args, kw)
    loops = block_loop_scan(call, obj, kernel, sp, opts, tuple(args), kw, backend,
                            function_mesh)
    out = rewrap(sp, f, obj, dask_backend.scan_dask(job, halo_every, loops))
    # progress=True: computed now (kept chunked) under dask's progress display
    return with_progress(out) if sp.progress else out


def scan_sharded(obj: Any, kernel: Callable[..., Any] | None, dim: str = "time", *args: Any,
                 devices: Any = None, halo_every: int = 1, hlo: bool | str = False,
                 function_mesh: Any = None, mesh: Any = None, **kwargs: Any) -> Any:
    """Scan a kernel along ``dim`` with the other dims sharded over devices.

    Every ``halo_every`` steps each device receives a halo ``halo_every``
    windows deep from its neighbours (one ``ppermute`` per side and sharded
    dim), then advances ``halo_every`` steps without communication.  Deeper
    halos mean fewer, larger messages and some redundant work at the block
    edges.  The result equals the in-memory :func:`xstencil.scan` and stays
    sharded.

    Parameters
    ----------
    obj
        A DataArray or Dataset: the initial state (with ``steps=N``) or the trajectory,
        as for :func:`xstencil.scan`; a sharded JAX array, or any array with
        ``devices=``.  ``dim`` itself must not be sharded.
    kernel, dim, *args
        As for :func:`xstencil.scan`.
    devices
        ``{dim: mesh_axis}`` or a :class:`jax.sharding.Mesh` with axes named
        after dims; defaults to the data's sharding.  ``mesh=`` is its
        deprecated spelling.
    halo_every
        Steps between halo exchanges (K).  The halo is K times the window's
        reach, and every device must hold at least that many points.
    hlo
        ``True``: return the compiled HLO text instead of running (to inspect
        the communication: ``collective-permute``, and no ``all-gather``);
        ``"compiled"``: return the compiled executable (for
        ``memory_analysis()``, per device).
    function_mesh
        A :class:`~xstencil.Mesh` over ``obj`` (``kernel`` is then
        ``None``): its kernels on its regions, as ``m.scan(dim)`` does in
        memory.  Mask regions are sharded like the data and exchange halos
        with it.
    **kwargs
        ``window``, ``boundary``, ``fill_value``, ``steps``, ``dt``,
        ``coord``, ``save_every`` and ``period`` as for :func:`xstencil.scan`;
        other keywords go to the kernel.

    Returns
    -------
    DataArray or Dataset
        The saved trajectory, JAX arrays sharded like the input.

    Examples
    --------
    On however many devices there are (one CPU here):

    >>> import numpy as np, xarray as xr, xstencil
    >>> from xstencil._labelled.scale import scan_sharded
    >>> u0 = xr.DataArray(np.eye(8, dtype=np.float32)[0], dims="x")
    >>> heat = lambda u: u(time=-1) + 0.25 * (u(time=-1, x=1) - 2 * u(time=-1)
    ...                                       + u(time=-1, x=-1))
    >>> out = scan_sharded(u0, heat, "time", steps=2, boundary="periodic", devices={"x": "i"})
    >>> out.isel(time=1).values
    array([0.5 , 0.25, 0.  , 0.  , 0.  , 0.  , 0.  , 0.25], dtype=float32)
    """
    call = _call(obj)
    devices = devices_arg(call, devices, mesh)
    opts, kw = split_options(kwargs)
    kernels = _kernels(kernel, function_mesh)
    sp, f = setup(call, obj, kernels, dim, args, kw, **opts)
    owner = function_mesh if function_mesh is not None else kernel
    with precision(f.arrays, args, kw):
        job = block_job(call, sp, f, obj, kernels, owner, function_mesh, args, kw)
        c = shard_backend.scan_sharded(job, devices, halo_every)
        if hlo:
            exe = c.fn.lower(*c.inputs, np.int32(0)).compile()
            return exe if hlo == "compiled" else exe.as_text()
        out, bad = call_with_progress(c.fn, c.inputs, c.report_every, c.steps, call)
    if job.finite is not None and int(bad) >= 0:
        raise job.finite(int(bad), "")
    return rewrap(sp, f, obj, list(out))

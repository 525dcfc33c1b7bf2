"""Several processes: open, gather and write global sharded arrays.

Under :func:`jax.distributed.initialize` every process runs the same
program, and a sharded array is *global*: each process holds only the
blocks on its own devices.  These helpers keep it that way at both ends of a
pipeline:

* :func:`open_sharded` opens a Zarr store or NetCDF file (or any lazily
  loaded Dataset) as global arrays, each process reading only the slices its
  devices hold (:func:`jax.make_array_from_callback`);
* :func:`write_sharded` writes global arrays to Zarr without gathering: one
  process writes the metadata and the coordinates, then every process writes
  its own blocks with ``to_zarr(region=...)``;
* :func:`gather` is the explicit way to get the whole array on every process
  (``.values`` of a global array raises JAX's non-addressable error).

:func:`make_devices` builds the device mesh with ``Auto`` axes that the
sharded backend wants.  In one process, all of this works on one or several
local devices, which is how the doctests below run.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
import xarray as xr
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from xstencil._backends.shard import check_divides, device_axes, make_mesh
from xstencil._engine.call import precision
from xstencil._errors import XStencilError
from xstencil._labelled.dtypes import PrecisionWarning

__all__ = ["gather", "make_devices", "open_sharded", "write_sharded"]

_UNNAMED = "__xarray_dataarray_variable__"  # xarray's name for an unnamed DataArray on disk


def make_devices(axes: Mapping[str, int] | Sequence[str],
                 devices: Sequence[Any] | None = None) -> Mesh:
    """A device mesh with ``Auto`` axes, for ``devices=`` and sharded data.

    :func:`jax.make_mesh` creates ``Explicit`` axes by default, under which
    padded slices of sharded dims fail; this builds ``Auto`` ones.  Name the
    axes after the dims they split, so that the mesh can be passed as
    ``devices=`` directly.

    Parameters
    ----------
    axes
        Axis names mapped to sizes (``{"y": 2, "x": 2}``), or a sequence of
        names: one name takes every device, two names split them as squarely
        as possible.
    devices
        The devices to use; defaults to :func:`jax.devices`, which under
        :func:`jax.distributed.initialize` lists the devices of every process.

    Returns
    -------
    jax.sharding.Mesh

    Examples
    --------
    >>> import jax, xstencil
    >>> mesh = xstencil.make_devices(("x",))
    >>> mesh.axis_names, mesh.shape["x"] == jax.device_count()
    (('x',), True)
    """
    return make_mesh(axes, devices)


def _mesh_and_names(call: str, devices: Any, dims: Sequence[Hashable]
                    ) -> tuple[Mesh, dict[Hashable, str]]:
    names = device_axes(call, devices, dims)
    mesh = devices if isinstance(devices, Mesh) else make_mesh(tuple(names.values()))
    return mesh, names


def _global(call: str, name: Hashable, var: xr.Variable, mesh: Mesh,
            names: Mapping[Hashable, str]) -> Any:
    """``var`` as a global array: the callback reads one block at a time."""
    spec = P(*[names.get(d) for d in var.dims])
    for d, n in zip(var.dims, var.shape, strict=True):
        if d in names:
            check_divides(call, f"variable {name!r} has {n} points along {d!r}", d, n,
                          int(mesh.shape[names[d]]), names[d])

    def read(index: tuple[slice, ...]) -> np.ndarray:
        return np.asarray(var[index].values)

    with precision(np.empty(0, var.dtype)):
        return jax.make_array_from_callback(var.shape, NamedSharding(mesh, spec), read)


def open_sharded(source: Any, devices: Any, *, engine: str | None = None) -> Any:
    """Open a dataset as global sharded JAX arrays, each process reading only
    its own blocks.

    Every data variable that spans a sharded dim becomes a
    :class:`jax.Array` sharded over ``devices``.  It is built with
    :func:`jax.make_array_from_callback`, which asks each process only for
    the blocks of its own devices, and each block is read from the lazily
    opened file as one slice, so no process reads the whole field.  Other
    variables and the coordinates are read into numpy arrays on every process
    (a DataArray or Dataset passed in is not loaded itself), and a file opened
    from a path is closed before it returns.  Call it on every process with
    the same arguments.

    Parameters
    ----------
    source
        A path to a Zarr store or a NetCDF file (opened lazily with
        :func:`xarray.open_dataset`), or a DataArray or Dataset, in memory,
        lazily loaded or dask-backed.
    devices
        ``{dim: mesh_axis}``, for a mesh over all devices of all processes
        (:func:`make_devices`), or a :class:`jax.sharding.Mesh` with axes
        named after dims.  Each sharded dim's length must divide by its axis.
    engine
        The :func:`xarray.open_dataset` engine for a path; by default
        ``"zarr"`` for a directory or a ``.zarr`` path and xarray's choice
        otherwise.

    Returns
    -------
    Dataset or DataArray
        A DataArray when ``source`` is one, else a Dataset, with the same
        dims, coords, attrs and names; ``.stencil.map`` and ``.stencil.scan``
        on it run sharded and keep the sharding.

    Warns
    -----
    PrecisionWarning
        When a 64-bit variable is sharded over several devices while JAX's
        x64 flag is off: xstencil keeps it 64-bit, but JAX operations on it
        outside xstencil (``.sum()``, ``+ 1``) would truncate it or fail.
        Enable x64 first (``jax.config.update("jax_enable_x64", True)``).

    Examples
    --------
    >>> import numpy as np, xarray as xr, xstencil
    >>> T = xr.DataArray(np.arange(8.0), dims="x", name="T")
    >>> Ts = xstencil.open_sharded(T, devices={"x": "i"})
    >>> Ts.data.sharding.spec, Ts.dtype
    (P('i',), dtype('float64'))
    """
    call = "xstencil.open_sharded(...)"
    if isinstance(source, str | os.PathLike):
        path = os.fspath(source)
        if engine is None and (path.rstrip("/").endswith(".zarr") or os.path.isdir(path)):
            engine = "zarr"
        # zarr: consolidated=False, as write_sharded writes (consolidated metadata is not
        # part of Zarr format 3, and reading without it otherwise warns)
        kw = {"consolidated": False} if engine == "zarr" else {}
        # every read happens inside _shard, so the file is closed when it returns
        with xr.open_dataset(path, engine=engine, chunks=None, **kw) as ds:
            return _shard(call, ds, devices)
    if isinstance(source, xr.DataArray | xr.Dataset):
        return _shard(call, source, devices)
    raise XStencilError(
        f"{call}: source={source!r:.80} must be a path to a Zarr store or NetCDF file, or a "
        f"DataArray or Dataset; open other formats with xarray.open_dataset first")


def _warn_wide(call: str, out: Any) -> None:
    """Warn about 64-bit arrays sharded over several devices while JAX's x64
    flag is off: JAX operations outside xstencil would truncate or fail."""
    if jax.config.read("jax_enable_x64"):
        return
    das = [out] if isinstance(out, xr.DataArray) else list(out.data_vars.values())
    wide = {str(da.name): str(da.dtype) for da in das
            if isinstance(da.data, jax.Array) and len(da.data.sharding.device_set) > 1
            and np.dtype(da.dtype).itemsize >= 8}
    if wide:
        warnings.warn(
            f"{call}: {wide} are 64-bit JAX arrays sharded over several devices while "
            f"JAX's x64 flag is off. xstencil keeps them 64-bit (its maps and "
            f"scans, xstencil.gather, xstencil.write_sharded), but JAX operations on them "
            f"outside xstencil (result.sum(), result + 1) truncate them to 32 bits or fail "
            f"with JAX's 'If `dtype` is provided to `jax.make_array_from_callback`, it must "
            f"match' ValueError. To keep 64 bits, enable x64 on every process before opening: "
            f"jax.config.update('jax_enable_x64', True); or open 32-bit data "
            f"(.astype('float32'))", PrecisionWarning, stacklevel=3)


def _shard(call: str, ds: Any, devices: Any) -> Any:
    """``ds`` with every variable along a sharded dim as a global array, the rest in
    memory; ``ds`` itself is not loaded (``compute``, not ``load``)."""
    out = _shard_vars(call, ds, devices)
    _warn_wide(call, out)
    return out


def _shard_vars(call: str, ds: Any, devices: Any) -> Any:
    """:func:`_shard` without the warning."""
    mesh, names = _mesh_and_names(call, devices, tuple(ds.dims))
    if isinstance(ds, xr.DataArray):
        var = ds.variable
        if not any(d in names for d in var.dims):
            return ds.compute()
        return ds.copy(data=_global(call, ds.name, var, mesh, names)).compute()
    out = {}
    for name, da in ds.data_vars.items():
        if any(d in names for d in da.dims):
            out[name] = da.copy(data=_global(call, name, da.variable, mesh, names))
        else:
            out[name] = da.compute()
    return xr.Dataset(out, coords=ds.coords.to_dataset().compute().coords, attrs=ds.attrs)


def _is_jax(x: Any) -> bool:
    return isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer)


def gather(obj: Any) -> Any:
    """The whole of every global array, as numpy, on every process.

    ``.values`` of a result that spans devices of other processes raises
    JAX's ``RuntimeError`` (xarray converts with ``numpy.asarray``, which
    xstencil cannot intercept).  ``gather`` collects the blocks with
    :func:`jax.experimental.multihost_utils.process_allgather`.  It is a
    collective: every process must call it.  Every process then holds the
    whole field, so for large results write them with :func:`write_sharded`
    instead.

    Parameters
    ----------
    obj
        A DataArray or Dataset whose variables may be JAX arrays.

    Returns
    -------
    DataArray or Dataset
        The same object with numpy data.

    Examples
    --------
    >>> import numpy as np, xarray as xr, xstencil
    >>> Ts = xstencil.open_sharded(xr.DataArray(np.arange(4.0), dims="x"), {"x": "i"})
    >>> xstencil.gather(Ts).values
    array([0., 1., 2., 3.])
    """
    call = "xstencil.gather(...)"

    def host(x: Any) -> Any:
        if not _is_jax(x):
            return x
        with precision(x):
            return np.asarray(multihost_utils.process_allgather(x, tiled=True))

    if isinstance(obj, xr.DataArray):
        return obj.copy(data=host(obj.data))
    if isinstance(obj, xr.Dataset):
        return obj.map(lambda da: da.copy(data=host(da.data)), keep_attrs=True)
    raise XStencilError(f"{call}: expected a DataArray or Dataset, got {type(obj).__name__}: "
                        f"{obj!r:.80}; wrap arrays with xarray.DataArray first")


def _region(index: tuple[slice, ...], shape: tuple[int, ...]) -> tuple[slice, ...]:
    return tuple(slice(*s.indices(n)[:2]) for s, n in zip(index, shape, strict=True))


def write_sharded(obj: Any, store: Any, *, mode: str = "w-") -> None:
    """Write global sharded arrays to a Zarr store without gathering them.

    Process 0 writes the store's metadata, the coordinates and every variable
    that is not a JAX array; then each process writes the blocks of its own
    devices with ``to_zarr(region=...)``.  The Zarr chunks are the blocks, so
    no two processes write one chunk.  No process ever holds more than its
    own blocks.  Call it on every process with the same arguments; it returns
    when every process has written.

    Parameters
    ----------
    obj
        A DataArray or Dataset, typically the result of a sharded
        ``.stencil.map`` or ``.stencil.scan`` or of :func:`open_sharded`.
    store
        A path (or zarr store) that every process can write to.
    mode
        ``"w-"`` (the default, as in :meth:`xarray.Dataset.to_zarr`) to
        refuse an existing store, ``"w"`` to overwrite it.

    Examples
    --------
    >>> import numpy as np, xarray as xr, xstencil, tempfile, os
    >>> T = xr.DataArray(np.arange(8.0), dims="x", coords={"x": np.arange(8)}, name="T")
    >>> lap = xstencil.open_sharded(T, {"x": "i"}).stencil.map(
    ...     lambda u: u(x=1) - 2 * u() + u(x=-1), boundary="periodic")
    >>> path = os.path.join(tempfile.mkdtemp(), "lap.zarr")
    >>> xstencil.write_sharded(lap, path)
    >>> xr.open_dataarray(path, engine="zarr", consolidated=False).values
    array([ 8.,  0.,  0.,  0.,  0.,  0.,  0., -8.])
    """
    call = "xstencil.write_sharded(...)"
    if mode not in ("w-", "w"):
        raise XStencilError(f"{call}: mode={mode!r} must be 'w-' (refuse an existing store) or "
                            f"'w' (overwrite it)")
    if isinstance(obj, xr.DataArray):
        ds = obj.to_dataset(name=_UNNAMED if obj.name is None else obj.name)
    elif isinstance(obj, xr.Dataset):
        ds = obj
    else:
        raise XStencilError(f"{call}: expected a DataArray or Dataset, got {type(obj).__name__}: "
                            f"{obj!r:.80}; wrap arrays with xarray.DataArray first")
    template, encoding, jaxvars = _template(call, ds)
    path = os.fspath(store) if isinstance(store, str | os.PathLike) else None
    exists = XStencilError(f"{call}: store={path!r} already exists; pass mode='w' to "
                           f"overwrite it, or choose a new path")
    failure: Exception | None = None
    if jax.process_index() == 0:
        # only process 0 looks for an existing store: another process looking for it
        # could find the metadata process 0 has just written, and refuse its own store
        try:
            if mode == "w-" and path is not None and os.path.exists(path):
                failure = exists
            else:
                template.to_zarr(store, mode=mode, compute=False, encoding=encoding,
                                 consolidated=False)
        except Exception as e:  # re-raised below, after telling the other processes
            failure = e
    # a collective that doubles as the barrier: no process waits forever on a failed process 0
    state = 0 if failure is None else 1 if failure is exists else 2
    state = int(multihost_utils.broadcast_one_to_all(np.int32(state)))
    if failure is not None:
        raise failure
    if state == 1:
        raise exists
    if state:
        raise XStencilError(f"{call}: process 0 could not write the store's metadata to "
                            f"{store!r}; see the error on process 0")
    failure = _write_blocks(ds, jaxvars, store)
    # the closing barrier, and every process learns whether all of them wrote their blocks
    oks = np.asarray(multihost_utils.process_allgather(np.int32(failure is None)))
    if failure is not None:
        raise failure
    if not oks.all():
        bad = [int(i) for i in np.flatnonzero(oks == 0)]
        raise XStencilError(f"{call}: process(es) {bad} could not write their blocks to "
                            f"{store!r}; see the errors there")


def _template(call: str, ds: xr.Dataset) -> tuple[xr.Dataset, dict[Any, Any], list[Any]]:
    """The store's layout without data: ``ds`` with every JAX variable as
    lazy dask zeros chunked like its blocks, their encodings, and their names."""
    try:
        import dask.array as dsa
    except ImportError as e:  # pragma: no cover - dask is in the test and dask extras
        raise XStencilError(f"{call}: needs dask to write the store's metadata without data; "
                            f"pip install 'xstencil[dask,io]'") from e
    bad = [k for k, v in ds.coords.items() if _is_jax(v.data)]
    if bad:
        raise XStencilError(f"{call}: coordinate {bad[0]!r} is a JAX array; coordinates must be "
                            f"numpy (gather it, or assign numpy values)")
    jaxvars = [k for k, v in ds.data_vars.items() if _is_jax(v.data)]
    template = ds.copy()
    encoding = {}
    for k in jaxvars:
        x = ds[k].data
        chunks = tuple(int(c) for c in x.sharding.shard_shape(x.shape))
        var = xr.Variable(ds[k].dims, dsa.zeros(x.shape, dtype=np.dtype(x.dtype), chunks=chunks),
                          ds[k].attrs)
        template[k] = var
        encoding[k] = {"chunks": chunks}
    return template, encoding, jaxvars


def _write_blocks(ds: xr.Dataset, jaxvars: list[Any], store: Any) -> Exception | None:
    """Write this process's blocks of every JAX variable; the error, if any
    (re-raised by the caller after telling the other processes)."""
    try:
        for k in jaxvars:
            x = ds[k].data
            dims = ds[k].dims
            for shard in x.addressable_shards:
                if shard.replica_id != 0:  # a replicated block is written once
                    continue
                region = dict(zip(dims, _region(shard.index, x.shape), strict=True))
                block = xr.Dataset({k: xr.Variable(dims, np.asarray(shard.data))})
                block.to_zarr(store, region=region, mode="r+", consolidated=False)
    except Exception as e:  # re-raised by the caller, after telling the other processes
        return e
    return None

"""Streamed saves of data sharded over JAX devices (see :mod:`xstencil._labelled.stream`).

A sharded streamed scan runs every segment on the devices, as the sharded
backend does (:mod:`xstencil._backends.shard_scan`: a deep halo exchanged
every ``halo_every`` steps), and writes the segment's saved positions to the
store between segments.  The next segment starts from the last ``k``
positions, still on the devices; after a resume they are read back from the
store and put on the devices again with the input's layout
(:func:`reshard`), so a resumed run computes on the same devices and the
same blocks as an uninterrupted one and is bitwise equal to it.

A segment is written without gathering it to the host (:func:`write_blocks`):
the store's chunks are the devices' blocks, one position deep along ``dim``,
and each block is copied from its device and written on its own, so the host
holds one block at a time.  A global array spanning several processes
(:func:`jax.distributed.initialize`) streams the same way: process 0 alone
creates, checks, cuts back and marks the store (:func:`lead`, which also
hands its answer to the others), each process writes its own devices'
blocks, and a resume reads back each process's own blocks (:func:`reshard`).

The layout (mesh shape and the mesh axis of each dim) is part of the store's
fingerprint: resuming with the data laid out differently, or in memory, is
refused, since a different layout may round differently.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
import xarray as xr
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from xstencil._backends.shard import sharded_axes
from xstencil._engine.call import precision
from xstencil._errors import XStencilError

__all__ = ["Layout", "lead", "layout_of", "on_devices", "reshard", "spans_processes",
           "write_blocks"]


@dataclass(frozen=True)
class Layout:
    """Where the input's variables live: the device mesh and, per dim, the
    mesh axis it is sharded over (dims not listed are not split)."""

    mesh: Mesh
    axes: Mapping[Hashable, str]

    def describe(self) -> str:
        """The layout as text, for the store's fingerprint."""
        shape = {str(k): int(v) for k, v in self.mesh.shape.items()}
        return f"mesh {shape}, dims {dict(sorted((str(d), a) for d, a in self.axes.items()))}"


def _variables(obj: Any) -> list[xr.DataArray]:
    return [obj] if isinstance(obj, xr.DataArray) else list(obj.data_vars.values())


def layout_of(call: str, obj: Any) -> Layout | None:
    """The layout of ``obj``'s sharded variables, or ``None`` when none is
    sharded over several devices."""
    out: Layout | None = None
    for v in _variables(obj):
        got = sharded_axes(call, v.data, v.dims)
        if got is None:
            continue
        mesh, names = got
        axes = {d: a for d, a in zip(v.dims, names, strict=True) if a is not None}
        if out is None:
            out = Layout(mesh, axes)
        elif mesh != out.mesh or any(out.axes.get(d, a) != a for d, a in axes.items()):
            raise XStencilError(
                f"{call}: variable {v.name!r} is sharded as {v.data.sharding.spec!r} over "
                f"{mesh!r}, unlike the other variables ({out.describe()}); store= needs one "
                f"layout: put every variable on the same mesh (xstencil.open_sharded does)")
        else:
            out = Layout(out.mesh, {**out.axes, **axes})
    return out


def reshard(obj: Any, lay: Layout) -> Any:
    """``obj`` (read lazily from the store) with every variable put on the
    devices of ``lay``, keeping its dtype: each process reads only the blocks
    of its own devices (:func:`jax.make_array_from_callback`)."""

    def put(v: xr.DataArray) -> xr.DataArray:
        var = v.variable
        sharding = NamedSharding(lay.mesh, P(*[lay.axes.get(d) for d in v.dims]))

        def read(index: tuple[slice, ...]) -> np.ndarray:
            return np.asarray(var[index].values)

        with precision(np.empty(0, var.dtype)):
            return v.copy(data=jax.make_array_from_callback(var.shape, sharding, read))

    if isinstance(obj, xr.DataArray):
        return put(obj)
    return obj.assign({n: put(v) for n, v in obj.data_vars.items()})


def on_devices(obj: Any) -> bool:
    """Whether a variable of ``obj`` is a JAX array spread over several devices
    (sharded input, or in-memory input scanned with ``devices=``)."""
    return any(isinstance(v.data, jax.Array) and len(v.data.sharding.device_set) > 1
               for v in _variables(obj))


def spans_processes(obj: Any) -> bool:
    """Whether a variable of ``obj`` is a global array holding devices of
    other processes (under :func:`jax.distributed.initialize`)."""
    return any(isinstance(v.data, jax.Array) and not v.data.is_fully_addressable
               for v in _variables(obj))


def lead(call: str, fn: Callable[[], int], together: bool) -> int:
    """``fn()`` (an int >= 0) run by process 0 alone and handed to every
    process when ``together`` (the data spans several processes); else just
    ``fn()``.  A collective, so also a barrier: every process calls it at the
    same point.  An error on process 0 is raised there, and on the others as an
    error that points to it (none waits forever on a failed process 0)."""
    if not together:
        return fn()
    failure, value = None, 0
    if jax.process_index() == 0:
        try:
            value = int(fn())
        except Exception as e:  # noqa: BLE001 - re-raised below, after telling the others
            failure = e
    got = int(multihost_utils.broadcast_one_to_all(np.int32(-1 if failure else value)))
    if failure is not None:
        raise failure
    if got < 0:
        raise XStencilError(f"{call}: process 0 failed on the store; see the error on "
                            f"process 0")
    return got


def _all_ok(call: str, failure: Exception | None, what: str, together: bool) -> None:
    """Every process learns whether all of them succeeded (a barrier too)."""
    if together:
        oks = np.asarray(multihost_utils.process_allgather(np.int32(failure is None)))
    else:
        oks = np.ones(1)
    if failure is not None:
        raise failure
    if not oks.all():
        bad = [int(i) for i in np.flatnonzero(oks == 0)]
        raise XStencilError(f"{call}: process(es) {bad} could not {what}; see the errors "
                            f"there")


def write_blocks(ds: xr.Dataset, path: str, dim: str, first: bool,
                 call: str = "scan(..., store=...)") -> None:
    """Write (``first``) or append ``ds`` along ``dim`` to the Zarr store at
    ``path``, block by block: the metadata and the numpy variables first
    (``compute=False`` with lazy zeros standing in for the JAX variables),
    then each device's block of each JAX variable with ``to_zarr(region=...)``.
    The Zarr chunks are the blocks (one position deep along ``dim``), so no
    chunk is written twice and none is read back to be updated.  Under
    :func:`jax.distributed.initialize` process 0 writes the metadata and each
    process its own devices' blocks (call it on every process)."""
    import dask.array as dsa  # noqa: PLC0415 - optional (the dask extra), needed here only

    names = [n for n, v in ds.data_vars.items() if isinstance(v.data, jax.Array)]
    template, enc = ds.copy(), {}
    for n in names:
        v = ds[n].variable
        shard = v.data.sharding.shard_shape(v.shape)
        chunks = tuple(1 if d == dim else int(c) for d, c in zip(v.dims, shard, strict=True))
        template[n] = xr.Variable(v.dims, dsa.zeros(v.shape, dtype=v.dtype, chunks=chunks),
                                  v.attrs)
        enc[n] = {"chunks": chunks}
    if first:
        enc.update({n: {"chunks": tuple(1 if d == dim else s
                                        for d, s in zip(v.dims, v.shape, strict=True))}
                    for n, v in ds.variables.items() if dim in v.dims and n not in enc})

        def meta() -> int:
            template.to_zarr(path, mode="w-", encoding=enc, consolidated=False, compute=False)
            return 0
    else:
        keep = [n for n, v in ds.variables.items() if dim not in v.dims]

        def meta() -> int:
            n = int(xr.open_zarr(path, consolidated=False).sizes[dim])
            template.drop_vars(keep).to_zarr(path, append_dim=dim, consolidated=False,
                                             compute=False)
            return n

    together = spans_processes(ds)
    start = lead(call, meta, together)  # the positions in the store before this write
    failure = None
    try:
        _blocks(ds, names, path, dim, first, start)
    except Exception as e:  # noqa: BLE001 - re-raised by _all_ok, after telling the others
        failure = e
    _all_ok(call, failure, "write their blocks", together)


def _blocks(ds: xr.Dataset, names: list[Any], path: str, dim: str, first: bool,
            start: int) -> None:
    """Write this process's blocks of the JAX variables ``names``."""
    for n in names:
        v = ds[n].variable
        if not first and dim not in v.dims:  # constant: written with the first segment
            continue
        for sh in v.data.addressable_shards:
            if sh.replica_id != 0:  # a replicated block is written once
                continue
            region = {d: slice(*s.indices(size)[:2])
                      for d, s, size in zip(v.dims, sh.index, v.shape, strict=True)}
            if dim in region:
                region[dim] = slice(region[dim].start + start, region[dim].stop + start)
            with precision(sh.data):
                block = np.asarray(sh.data)
            xr.Dataset({n: xr.Variable(v.dims, block)}).to_zarr(
                path, region=region, mode="r+", consolidated=False)

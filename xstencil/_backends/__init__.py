"""Backends, chosen by the type of the raw arrays; no xarray here.

* ``memory``: NumPy or single-device JAX arrays; the labelled layer runs the
  engine directly (jit + evaluate / mesh_evaluate / tscan).
* ``dask``: dask arrays, lazily, one task per chunk and its neighbours' edge
  strips (:mod:`xstencil._backends.dask_halo`, :mod:`xstencil._backends.dask`,
  :mod:`xstencil._backends.dask_scan`; what the map and the scan share, the
  per-process compile cache among it, is in :mod:`xstencil._backends.dask_base`).
* ``shard``: JAX arrays sharded over several devices, under ``shard_map``
  (:mod:`xstencil._backends.shard`, :mod:`xstencil._backends.shard_scan`).

The dask and sharded scans share the K-step block stepping of
:mod:`xstencil._backends.halo` and the rebuilding of a block's halo on a
global edge (:mod:`xstencil._backends.edges`).  :func:`backend_for` picks one from the
arrays, as xarray's ``get_chunked_array_type`` picks a chunk manager.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from xstencil._backends.dask_base import is_dask
from xstencil._backends.shard import is_sharded
from xstencil._errors import XStencilError

__all__ = ["Backend", "backend_for"]

Backend = Literal["memory", "dask", "shard"]


def backend_for(arrays: Sequence[Any], call: str = "xstencil", devices: Any = None) -> Backend:
    """The backend for ``arrays``: ``"dask"`` if any is a dask array,
    ``"shard"`` if any is a JAX array split over several devices (or
    ``devices=`` asks for sharding), else ``"memory"``.

    Raises
    ------
    XStencilError
        When dask arrays and sharded JAX arrays are mixed, or ``devices=`` is
        given for dask data: no backend runs both.

    Examples
    --------
    >>> import numpy as np
    >>> from xstencil._backends import backend_for
    >>> backend_for([np.zeros(3)])
    'memory'
    """
    dask = [k for k, x in enumerate(arrays) if is_dask(x)]
    sharded = [k for k, x in enumerate(arrays) if is_sharded([x])]
    if dask and sharded:
        raise XStencilError(
            f"{call}: array {dask[0]} is a dask array but array {sharded[0]} is a JAX array "
            f"sharded over devices; one call runs on one backend, so .compute() the dask data "
            f"or gather the sharded data with np.asarray(...) first")
    if dask:
        if devices is not None:
            raise XStencilError(
                f"{call}: devices={devices!r} shards JAX arrays over devices, but the data is "
                f"a dask array; drop devices= (dask distributes the chunks), or load the data "
                f"with .compute() to shard it")
        return "dask"
    if sharded or devices is not None:
        return "shard"
    return "memory"

"""``xstencil.clear_caches``: empty every cache xstencil owns."""

from __future__ import annotations

from xstencil._backends.bufpool import clear as _clear_buffers
from xstencil._backends.dask import clear_cache as _clear_dask
from xstencil._engine.kcache import clear as _clear_kernels
from xstencil._labelled.loop_scan import clear as _clear_loop_scans

__all__ = ["clear_caches"]


def clear_caches() -> None:
    """Drop every compiled function and per-kernel entry xstencil keeps.

    xstencil caches compiled code per kernel structure (see
    :doc:`/performance`, "When xstencil compiles"): the in-memory and sharded
    maps and scans, the inferred windows, the repeat-call fast path, and the
    per-process block functions of dask graphs (in this process; run it on
    dask workers with ``client.run(xstencil.clear_caches)``), and the idle
    output memory the CPU loop backend keeps for reuse.  A cache only
    makes calls faster, so clearing it never changes a result; the next call
    of each kernel compiles again.  JAX's own caches are left alone
    (:func:`jax.clear_caches` clears those), and so is numba's disk cache of
    the loop nests, which later processes share (delete the directory
    ``$XSTENCIL_CACHE_DIR/loops``, by default ``~/.cache/xstencil/loops``, or
    set ``XSTENCIL_CACHE_DIR=off``; see :doc:`/performance`).

    Examples
    --------
    >>> import numpy as np, xarray as xr, xstencil
    >>> da = xr.DataArray(np.arange(4.0), dims="x")
    >>> a = da.stencil.map(lambda u: 2 * u())
    >>> xstencil.clear_caches()
    >>> bool((da.stencil.map(lambda u: 2 * u()) == a).all())
    True
    """
    _clear_kernels()
    _clear_dask()
    _clear_buffers()
    _clear_loop_scans()

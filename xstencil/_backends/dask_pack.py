"""Several output variables of different dtypes in one dask array.

A dask map computes all of a kernel's outputs in one task per block, and a
task returns one array.  Outputs of one dtype are stacked along a trailing
axis; outputs of different dtypes travel as their raw bytes (:func:`pack` on
the worker, :func:`unpack` lazily on the client), so none is cast to a
common dtype: an int64 beyond 2**53 would be rounded through float64.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

__all__ = ["byte_width", "pack", "unpack"]


def byte_width(dtype: np.dtype) -> int:
    """Bytes per element that :func:`pack` writes for ``dtype``."""
    return 1 if dtype == np.bool_ else dtype.itemsize


def pack(out: Any, nfield: int) -> Any:
    """The leaves of ``out`` (each ``nfield`` field axes, then its own), each
    as its raw bytes, concatenated along one trailing ``uint8`` axis.

    Parameters
    ----------
    out : pytree of jax arrays
        The kernel's outputs for one block.
    nfield : int
        The number of leading (field) axes every leaf shares.

    Returns
    -------
    jax.Array
        ``uint8``, shape ``(*field, sum of each leaf's bytes per point)``.
    """
    flat = []
    for x in jax.tree_util.tree_leaves(out):
        if x.dtype == np.bool_:
            x = x.astype(jnp.uint8)
        elif jnp.issubdtype(x.dtype, jnp.complexfloating):
            x = jnp.stack([x.real, x.imag], axis=-1)  # bitcast takes no complex
        if x.dtype != jnp.uint8:
            x = lax.bitcast_convert_type(x, jnp.uint8)
        flat.append(x.reshape(x.shape[:nfield] + (-1,)))
    return jnp.concatenate(flat, axis=-1)


def _unpack_block(block: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """One block of one leaf's bytes back in its dtype, flat along the last axis."""
    raw = np.ascontiguousarray(block)
    if dtype == np.bool_:
        return raw.astype(np.bool_)
    if dtype.kind == "c":
        part = raw.view(np.dtype(f"f{dtype.itemsize // 2}"))
        return (part[..., 0::2] + 1j * part[..., 1::2]).astype(dtype)
    return raw.view(dtype)


def unpack(raw: Any, dtype: np.dtype, shape: tuple[int, ...], nfield: int) -> Any:
    """One leaf from :func:`pack`'s bytes, lazily.

    Parameters
    ----------
    raw : dask.array.Array
        ``uint8``, ``(*field, bytes)``: this leaf's slice of the packed array.
    dtype : numpy.dtype
        The leaf's dtype.
    shape : tuple of int
        The leaf's per-point shape (``()`` for one value per point).
    nfield : int
        The number of field axes.

    Returns
    -------
    dask.array.Array
        ``(*field, *shape)`` in ``dtype``.
    """
    raw = raw.rechunk({nfield: -1})
    n = math.prod(shape)
    part = raw.map_blocks(_unpack_block, dtype, dtype=dtype, chunks=raw.chunks[:nfield] + ((n,),))
    if shape == ():
        return part[(slice(None),) * nfield + (0,)]
    return part.reshape(part.shape[:nfield] + shape)

"""Compile-cache keys by content for xarray and pandas objects that kernels
and step functions read (see :data:`xstencil._engine.kwalk.VALUE_KEYS`).

A step function that closes over the image it denoises, or a kernel that
reads a coefficient DataArray as a global, bakes that object's values into
the compiled code.  Keyed by identity, as any other library object was, the
cache went stale when the object was changed in place (``coef[...] = 2``
kept the old values) and compiled again for an equal object built anew (a
step function written inside the function that calls ``scan``: about a
second per call).  Keyed by content (data, dims, coords, attrs, name), an
equal object reuses the compiled code and a changed one compiles again.

A value whose content cannot be read without running something is not
keyed here: a tracer (it cannot change), or data of another array type.
dask-backed data (and a bare dask array) is keyed by its computed content:
dask reads its sources again on every compute, so a store rewritten in place
gives new numbers under the same graph name (keyed by that name, the old
ones came back).  A scipy.sparse matrix or array is keyed by the arrays it
stores (``M.data[:] = 3`` was stale: it was keyed by identity).  A
:class:`~xstencil.Mesh` (a step function calling ``iterate(s, m)`` or
``m.map()``) is keyed by its data, options, regions and kernels (their
:func:`~xstencil._engine.kcache.values_key`): keyed by identity, a region
assigned or an array changed in place after a call reused the old loop.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Hashable, Mapping
from typing import Any

import jax
import numpy as np
import pandas as pd
import xarray as xr

from xstencil._engine.kcache import values_key
from xstencil._engine.kwalk import VALUE_KEYS, Identity, digest, freeze
from xstencil._labelled.mesh import Mesh
from xstencil._labelled.mesh_regions import region_key

__all__ = ["content_key", "sparse_key"]


class _Unreadable(Exception):
    """Content that cannot be read here (a tracer, an unknown array type)."""


def _data(a: Any) -> Hashable:
    if isinstance(a, np.ndarray):
        if a.dtype.kind == "O":  # objects (arrays among them) by content, not repr
            return ("objects", a.shape, tuple(_value(x) for x in a.ravel()))
        return digest(a)
    if isinstance(a, jax.core.Tracer):
        raise _Unreadable
    if isinstance(a, jax.Array):
        return digest(np.asarray(a))
    if _is_dask(a):
        return _dask(a)
    raise _Unreadable


def _is_dask(a: Any) -> bool:
    return type(a).__module__.startswith("dask.") and hasattr(a, "to_delayed")


def _dask(a: Any) -> Hashable:
    """A dask array by its computed content, block by block (never the whole
    array in memory), in the calling thread: dask reads its sources afresh on
    every compute (a zarr store rewritten in place, a numpy array changed
    under ``from_array``), and the same graph name can then hold new numbers."""
    dask = sys.modules["dask"]
    blocks = a.to_delayed().ravel()
    parts = dask.compute(*[dask.delayed(digest)(b) for b in blocks], scheduler="sync")
    return ("dask", tuple(a.shape), str(a.dtype), tuple(map(tuple, a.chunks)), tuple(parts))


def _value(v: Any) -> Hashable:
    """An attribute's value by content, arrays in it too (inside dicts,
    lists and tuples): a ``repr`` elides the middle of a long array."""
    if isinstance(v, np.ndarray | jax.Array):
        return _data(v)
    if isinstance(v, Mapping):
        return ("map", tuple((repr(k), _value(x)) for k, x in v.items()))
    if isinstance(v, list | tuple):
        return (type(v).__name__, tuple(_value(x) for x in v))
    got = content_key(v)
    return got if got is not None else repr(v)


def _attrs(attrs: Mapping[Any, Any]) -> Hashable:
    return tuple((repr(k), _value(v)) for k, v in attrs.items())


def _variable(v: xr.Variable) -> Hashable:
    return (tuple(map(str, v.dims)), _data(v.data), _attrs(v.attrs))


def _coords(obj: xr.DataArray | xr.Dataset) -> Hashable:
    return tuple((repr(n), _variable(c.variable)) for n, c in obj.coords.items())


def _sparse_part(x: Any) -> Hashable:
    if isinstance(x, np.ndarray):
        return digest(x)
    if isinstance(x, tuple):  # a COO matrix's coords
        return tuple(_sparse_part(y) for y in x)
    if isinstance(x, dict):  # a DOK matrix's entries
        return ("dict", tuple(sorted((repr(k), repr(y)) for k, y in x.items())))
    return repr(x)


def sparse_key(v: Any) -> Hashable | None:
    """A scipy.sparse matrix or array by content: its format, shape, dtype and
    the arrays it stores (``data``, ``indices``, ``indptr``, ``coords``,
    ``offsets``, a LIL's rows, a DOK's entries), so that ``M.data[:] = 3``
    between two calls is seen.  scipy is found among the loaded modules (a
    sparse matrix exists only once scipy.sparse is)."""
    sparse = sys.modules.get("scipy.sparse")
    if sparse is None or not sparse.issparse(v):
        return None
    held = vars(v) if isinstance(getattr(v, "__dict__", None), dict) else {}
    return ("sparse", v.format, tuple(v.shape), str(v.dtype),
            tuple((k, _sparse_part(x)) for k, x in sorted(held.items())))


_KEYING = threading.local()  # meshes being keyed (a kernel closing over its own mesh)


def mesh_key(m: Any) -> Hashable | None:
    """A :class:`~xstencil.Mesh` by content: its data, options, regions (by
    their cells) and kernels (by :func:`~xstencil._engine.kcache.values_key`:
    structure, and the arrays they close over by content)."""
    if type(m) is not Mesh:
        return None
    busy = _KEYING.__dict__.setdefault("ids", set())
    if id(m) in busy:
        return ("Mesh", "cycle", Identity(m))
    data = content_key(m._obj)
    if data is None:  # traced data: not read here
        return None
    busy.add(id(m))
    try:
        kernels = [k for _, k in m._regions]
        return ("Mesh", data, freeze(dict(m._options)),
                tuple(region_key(r) for r, _ in m._regions), values_key(kernels))
    finally:
        busy.discard(id(m))


def content_key(v: Any) -> Hashable | None:
    """``v`` by content, or ``None`` for a value this module does not key."""
    try:
        if isinstance(v, xr.DataArray):
            return ("DataArray", repr(v.name), _variable(v.variable), _coords(v))
        if isinstance(v, xr.Dataset):
            return ("Dataset", tuple((repr(n), _variable(x.variable))
                                     for n, x in v.data_vars.items()),
                    _coords(v), _attrs(v.attrs))
        if isinstance(v, xr.Variable):
            return ("Variable", _variable(v))
        if isinstance(v, pd.Index):
            return ("Index", repr(v.name), str(v.dtype), _data(np.asarray(v)))
        if isinstance(v, pd.Series):
            return ("Series", repr(v.name), content_key(v.index), str(v.dtype),
                    _data(np.asarray(v)), _attrs(v.attrs))
        if isinstance(v, pd.DataFrame):
            return ("DataFrame", content_key(v.index), content_key(v.columns),
                    tuple(content_key(v[c]) for c in v.columns))
        mod = type(v).__module__
        if mod == "xstencil._labelled.mesh":
            return mesh_key(v)
        if mod.startswith("dask.") and hasattr(v, "to_delayed"):  # a bare dask array
            return ("dask array", _dask(v))
        return sparse_key(v) if mod.startswith("scipy.sparse") else None
    except _Unreadable:
        return None
    return None


VALUE_KEYS.append(content_key)

"""The fingerprint of a streamed run (:mod:`xstencil._labelled.stream`).

A store written by ``scan(..., store=...)`` keeps hashes, stable across
processes, of what determines its numbers: the kernel's structure
(:func:`xstencil._engine.kcache.describe`: the code, the constants and
closed-over arrays it reads), the kernel's arguments and the initial state,
and the options as text (with the layout of sharded data).  ``resume=True``
compares them with the new call's and refuses a store written by another run.
"""

from __future__ import annotations

import functools
import hashlib
import re
import types
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
import xarray as xr
from jax.experimental import multihost_utils

from xstencil._backends.dask_base import any_dask
from xstencil._engine.kcache import Identity, describe
from xstencil._labelled.stream_shard import Layout

__all__ = ["fingerprint"]

_DA = "__xarray_dataarray_variable__"
#: Options that do not change the numbers (left out of the fingerprint).
_FREE = ("progress", "checkpoint", "blocking")  # the same numbers either way
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def fingerprint(obj: Any, kernel: Any, dim: str, args: Any, kwargs: Any,
                 options: Mapping[str, Any], layout: Layout | None = None) -> dict[str, Any]:
    """Hashes, stable across processes, of what determines the numbers: the
    kernel, its arguments, the initial state; and the options (as text), with
    the layout of sharded data among them."""
    fn = options["step"] if kernel is None else kernel
    lifted = describe([fn])
    text = {n: _text(v) for n, v in sorted(options.items()) if n not in _FREE and n != "step"}
    if layout is not None:
        text["sharded"] = layout.describe()
    return {"kernel": _hash((lifted.key, [np.asarray(x) for x in lifted.leaves],
                             _partial(fn))),
            "arguments": _hash((args, sorted(kwargs.items()))), "initial": _hash(obj),
            "options": text}


def _partial(fn: Any) -> Any:
    """What a ``functools.partial`` kernel binds (the kernel walk sees the
    partial object only): its function and bound values, else ``None``."""
    if not isinstance(fn, functools.partial):
        return None
    inner = describe([fn.func])
    return ("partial", inner.key, [np.asarray(x) for x in inner.leaves], _partial(fn.func),
            fn.args, sorted(fn.keywords.items()))


def _text(v: Any) -> str:
    """An option as text (an array, whose repr elides, by shape and hash)."""
    if isinstance(v, np.ndarray | jax.Array) or (isinstance(v, list | tuple) and len(v) > 8):
        a = np.asarray(v)
        return f"<array {a.shape} {a.dtype} sha256 {_hash(a)[:16]}>"
    return _ADDRESS.sub("", repr(v))


def _hash(v: Any) -> str:
    h = hashlib.sha256()
    _feed(h, v)
    return h.hexdigest()


def _digest(block: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(block).tobytes()).hexdigest()


def _global_digests(x: jax.Array) -> np.ndarray:
    """The digest of every block of a global array spanning several processes,
    without gathering it: each process digests the blocks of its own devices
    into its rows of a table (one row per block, in block order), and the
    tables of all processes are combined (a collective: every process calls
    it).  The result depends on the values and the blocks, not on which
    process holds which block."""
    shard = x.sharding.shard_shape(x.shape)
    grid = tuple(-(-n // max(b, 1)) for n, b in zip(x.shape, shard, strict=True))
    own = np.zeros((int(np.prod(grid)), 32), np.uint8)
    for sh in x.addressable_shards:
        if sh.replica_id != 0:  # a replicated block is digested once
            continue
        at = tuple(s.indices(n)[0] // max(b, 1)
                   for s, n, b in zip(sh.index, x.shape, shard, strict=True))
        own[np.ravel_multi_index(at, grid)] = np.frombuffer(
            bytes.fromhex(_digest(np.asarray(sh.data))), np.uint8)
    every = np.asarray(multihost_utils.process_allgather(own))
    return np.bitwise_or.reduce(every.reshape(-1, *own.shape), axis=0)


def _feed(h: Any, v: Any) -> None:  # noqa: C901 - one case per kind of value
    """Feed a canonical, process-independent form of ``v`` to the hash ``h``."""
    if isinstance(v, xr.DataArray | xr.Dataset):
        ds = v.to_dataset(name=_DA) if isinstance(v, xr.DataArray) else v
        for n in sorted(ds.variables, key=str):
            var = ds.variables[n]
            _feed(h, ("var", str(n), var.dims, dict(sorted(var.attrs.items()))))
            if any_dask([var.data]):  # block by block: never the whole array at once
                _feed(h, ("blocks", var.shape, str(var.dtype), var.chunks))
                import dask  # noqa: PLC0415 - optional; the data is dask-backed here

                blocks = var.data.to_delayed().ravel()
                _feed(h, list(dask.compute(*[dask.delayed(_digest)(b) for b in blocks])))
            elif isinstance(var.data, jax.Array) and not var.data.is_fully_addressable:
                _feed(h, ("global", var.shape, str(var.dtype), _global_digests(var.data)))
            else:
                _feed(h, np.asarray(var.values))
        _feed(h, ("attrs", sorted(v.attrs.items(), key=lambda x: str(x[0])), v.name
                  if isinstance(v, xr.DataArray) else None))
    elif isinstance(v, np.ndarray | jax.Array | np.generic):
        a = np.asarray(v)
        h.update(f"array{a.shape}{a.dtype}".encode())
        h.update(a.tobytes() if a.dtype.kind != "O" else repr(a.tolist()).encode())
    elif isinstance(v, tuple | list):
        h.update(f"{type(v).__name__}{len(v)}(".encode())
        for x in v:
            _feed(h, x)
        h.update(b")")
    elif isinstance(v, dict):
        _feed(h, sorted(v.items(), key=lambda x: repr(x[0])))
    elif isinstance(v, types.CodeType):
        h.update(b"code")
        h.update(v.co_code)
        _feed(h, (v.co_names, v.co_varnames, v.co_freevars, v.co_cellvars, v.co_consts))
    elif isinstance(v, type):
        h.update(f"type {v.__module__}.{v.__qualname__}".encode())
    elif isinstance(v, Identity) and isinstance(v.obj, np.ndarray | jax.Array):
        _feed(h, v.obj)  # an array read through an attribute: by its values
    elif isinstance(v, Identity):
        o = v.obj
        h.update(f"id {type(o).__module__}.{type(o).__qualname__} "
                 f"{getattr(o, '__module__', '')}.{getattr(o, '__qualname__', '')} "
                 f"{getattr(o, '__name__', '')}".encode())
    elif isinstance(v, types.FunctionType):
        _feed(h, describe([v]).key)
    elif isinstance(v, bool | int | float | complex | str | bytes | type(None)):
        h.update(f"{type(v).__name__}:{v!r};".encode())
    else:  # an address in a repr differs between processes
        text = _ADDRESS.sub("", repr(v))
        h.update(f"{type(v).__module__}.{type(v).__qualname__}:{text};".encode())

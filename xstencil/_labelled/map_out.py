"""``map(..., out=)``: write a map's result into a preallocated numpy array.

A map on large numpy data spends as long getting fresh memory for its result
from the kernel (page faults, zeroing) as it spends computing: numpy's own
copy into a new array takes about twice as long as ``np.copyto`` into an
existing one.  Loops that step in time, and the peers a CPU user compares
with (numba, pystencils, devito, ``scipy.ndimage(output=)``), write into
buffers they keep.  ``out=`` does the same:

* the loop backend (:mod:`xstencil._backends.loops`) writes straight into it;
* every other path (XLA, a kernel the loops cannot express) computes a new
  result and copies it in, after checking its dims, shape and dtype.

:func:`out_target` checks everything that can be checked before the run and
:func:`check_alias` refuses an ``out`` that shares memory with anything the
kernel reads (a stencil that reads its own output is silently wrong);
:func:`deliver` checks the result against ``out``, copies where needed and
returns the DataArray that wraps ``out``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

import jax
import numpy as np
import xarray as xr

from xstencil._engine.call import outside_transforms, split_static
from xstencil._errors import XStencilError
from xstencil._labelled.result import replace_data

__all__ = ["Target", "out_target", "check_alias", "deliver"]

_FIX = "pass out=None to get a new array"


class Target(NamedTuple):
    """The checked ``out=``: the numpy buffer, the dims of a DataArray ``out``,
    and that DataArray (its labels are checked against the result's)."""

    buf: np.ndarray
    dims: tuple[str, ...] | None
    labelled: xr.DataArray | None = None


def _show(x: Any) -> str:
    """A short ``!r``-style description of an array argument."""
    shape, dtype = getattr(x, "shape", None), getattr(x, "dtype", None)
    if shape is None:
        return f"{x!r:.60}"
    return f"{type(x).__module__}.{type(x).__qualname__}(shape={shape!r}, dtype={str(dtype)!r})"


def same_labels(call: str, out: xr.DataArray, like: Any) -> None:
    """Refuse a DataArray ``out`` whose labels differ from ``like``'s (the
    data's, or the result's): the result is written by position, so the
    ``out`` the caller holds would show each value under another label."""
    for d, want in like.indexes.items():
        got = out.indexes.get(d)
        if got is not None and not got.equals(want):
            raise XStencilError(
                f"{call}: out= has {d!r} labels {list(got[:4])!r}..., but the result's are "
                f"{list(want[:4])!r}...; the result is written by position, so out= would "
                f"label it wrongly. Pass a DataArray with the result's labels "
                f"(xr.zeros_like(da)), or its numpy array (out=buf.values), or {_FIX}")


def out_target(call: str, obj: Any, out: Any, *, devices: Any, grid: Any, at: Any,
               trims: bool = False) -> Target | None:
    """Check ``out=`` before the run: a writeable, C-contiguous numpy array
    (or a DataArray holding one), for a DataArray map on in-memory data
    outside JAX transforms.  ``None`` when ``out`` is ``None``.  ``trims``:
    the map trims or subsamples the labels (``valid``, ``stride``), so they
    are checked against the result's afterwards instead (:func:`deliver`)."""
    if out is None:
        return None
    if not isinstance(obj, xr.DataArray):
        raise XStencilError(
            f"{call}: out={_show(out)} given for a {type(obj).__name__}; out= takes one array, "
            f"and a Dataset map returns one per variable. Map each DataArray with its own "
            f"out= (ds['u'].stencil.map(kernel, out=buf)), or {_FIX}")
    if grid is not None or at is not None:
        raise XStencilError(
            f"{call}: out= with grid={grid!r:.40} / at={at!r:.40} is not supported (a staggered "
            f"map changes dims and coords); copy the result instead (buf[...] = res.values), "
            f"or {_FIX}")
    if devices is not None:
        raise XStencilError(
            f"{call}: out= with devices={devices!r:.60} is not supported (a sharded result "
            f"lives on several devices); drop devices= to run in memory, or {_FIX}")
    dims = None
    buf = out
    if isinstance(out, xr.DataArray):
        dims = tuple(str(d) for d in out.dims)
        buf = out.variable._data
        if not isinstance(buf, np.ndarray):
            raise XStencilError(
                f"{call}: out= is a DataArray holding {_show(buf)}; out= needs one whose .data "
                f"is a writeable numpy array (load it with out.load(), or allocate "
                f"xr.zeros_like(da, dtype=...)), or {_FIX}")
        if dims[:obj.ndim] != tuple(str(d) for d in obj.dims):
            raise XStencilError(
                f"{call}: out= has dims {dims!r}, but the result's dims start with the data's "
                f"{tuple(obj.dims)!r}; pass a DataArray with the result's dims (transpose it "
                f"with out.transpose(...) only if its memory is laid out that way), or {_FIX}")
        if not trims:
            same_labels(call, out, obj)
    if not isinstance(buf, np.ndarray) or isinstance(buf, np.ma.MaskedArray | np.matrix):
        raise XStencilError(
            f"{call}: out={_show(buf)} is not a numpy array; out= takes a numpy.ndarray (or a "
            f"DataArray holding one) that the result is written into; dask and JAX arrays "
            f"cannot be written in place, so {_FIX}")
    if not buf.flags.writeable:
        raise XStencilError(
            f"{call}: out={_show(buf)} is read-only; pass a writeable array "
            f"(np.empty(shape, dtype)), or {_FIX}")
    if not buf.flags.c_contiguous:
        raise XStencilError(
            f"{call}: out={_show(buf)} is not C-contiguous (strides {buf.strides!r}); pass a "
            f"C-contiguous array of the result's shape (np.empty(shape, dtype)), or {_FIX}")
    data = obj.variable._data
    if isinstance(data, jax.core.Tracer) or not outside_transforms([data]):
        raise XStencilError(
            f"{call}: out= cannot be used inside jax.jit, grad or vmap (it writes into a "
            f"numpy array, which a traced computation cannot do); return the result from "
            f"the transformed function instead, or {_FIX}")
    chunked = not isinstance(data, np.ndarray | jax.Array) and (
        hasattr(data, "chunks") or hasattr(data, "__dask_graph__"))
    if chunked or (isinstance(data, jax.Array) and len(data.sharding.device_set) > 1):
        raise XStencilError(
            f"{call}: out= needs in-memory data on one device, but the data is "
            f"{_show(data)}; a dask or sharded map returns a lazy or distributed result. "
            f"Load the data first (da.load()), or {_FIX}")
    return Target(buf, dims, out if isinstance(out, xr.DataArray) else None)


def _arrays(values: Iterable[Any]) -> list[Any]:
    return [x for x in jax.tree_util.tree_leaves(list(values))
            if isinstance(x, np.ndarray | jax.Array)]


def _overlaps(buf: np.ndarray, x: Any) -> bool:
    if isinstance(x, np.ndarray):
        return bool(np.shares_memory(buf, x))
    if isinstance(x, jax.core.Tracer) or not isinstance(x, jax.Array):
        return False
    try:  # a JAX array on the CPU may share a numpy buffer (device_put does not copy)
        ptr = x.unsafe_buffer_pointer()
    except Exception:  # noqa: BLE001 - sharded, deleted or not on the host: not our memory
        return False
    lo = buf.__array_interface__["data"][0]
    return ptr < lo + buf.nbytes and lo < ptr + x.nbytes


def _coord_array(v: xr.Variable) -> Any:
    """A coordinate's memory: its numpy data, or the values of the pandas
    index behind an index coordinate (which may be the array it was built from)."""
    data = v._data
    if isinstance(data, np.ndarray):
        return data
    values = getattr(getattr(data, "array", None), "values", None)
    return values if isinstance(values, np.ndarray) else None


def check_alias(call: str, target: Target, obj: xr.DataArray, args: Any, kwargs: Any,
                leaves: Any) -> None:
    """Refuse an ``out`` that shares memory with the data, a coordinate, an
    argument of the kernel or an array it closes over (``leaves``)."""
    dyn = split_static(call, (args, kwargs))[0] if args or kwargs else []
    named = [("the data", obj.variable._data)]
    named += [(f"coordinate {k!r}", _coord_array(v)) for k, v in obj.coords.variables.items()]
    named += [("an argument of the kernel", x) for x in _arrays(dyn)]
    named += [("an array the kernel closes over", x) for x in _arrays(leaves)]
    for what, x in named:
        if _overlaps(target.buf, x):
            raise XStencilError(
                f"{call}: out={_show(target.buf)} shares memory with {what}; a stencil that "
                f"writes where it reads gives silently wrong results, and the input is never "
                f"mutated. Pass a separate buffer (np.empty_like(da.values)), or {_FIX}")


def deliver(call: str, target: Target | None, res: Any) -> Any:
    """``res`` with its data in ``target.buf``: checked, copied unless the
    loop backend already wrote it there, and rewrapped."""
    if target is None:
        return res
    buf = target.buf
    if target.labelled is not None:
        same_labels(call, target.labelled, res)
    if res.variable._data is buf:
        return res
    if target.dims is not None and target.dims != tuple(str(d) for d in res.dims):
        raise XStencilError(
            f"{call}: out= has dims {target.dims!r}, but the result has dims {res.dims!r}; "
            f"pass a DataArray with the result's dims, or {_FIX}")
    if buf.shape != res.shape:
        raise XStencilError(
            f"{call}: out={_show(buf)} has shape {buf.shape!r}, but the result has shape "
            f"{res.shape!r} (dims {res.dims!r}); allocate np.empty({res.shape!r}, "
            f"{str(res.dtype)!r}), or {_FIX}")
    if buf.dtype != res.dtype:
        cast = (f"pass dtype={str(buf.dtype)!r} to the map to cast the result, "
                if buf.dtype.isnative else "")  # results are in native byte order
        raise XStencilError(
            f"{call}: out={_show(buf)} has dtype {str(buf.dtype)!r}, but the result has dtype "
            f"{str(res.dtype)!r} (no silent cast); allocate it with dtype "
            f"{str(res.dtype)!r}, {cast}or {_FIX}")
    np.copyto(buf, np.asarray(res.variable._data), casting="no")
    return replace_data(res, buf)

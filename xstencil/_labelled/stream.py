"""Streamed saves and restart: ``scan(..., steps=N, save_every=s, store="run.zarr")``.

The scan runs segment by segment.  A segment is one compiled scan of
``segment`` saved positions (``segment * s`` steps), started from the last
``k`` positions of the previous one (``k``: the window depth along ``dim``).
Each segment's saved positions are appended to a Zarr store, so memory holds
the window depth plus one segment, whatever the number of steps.

Crash safety: each segment's data is written first, and only then a small
marker in the store's attributes (``xstencil_stream["complete"]``: the number
of saved positions completely written).  A run killed at any point leaves a
store whose marker counts only whole positions; ``resume=True`` cuts the
arrays back to the marker (dropping a half-written segment) and continues from
its last ``k`` positions.  The continued run is bitwise equal to an
uninterrupted one: each step computes the same operations on the same values,
and the ``dim`` coordinate of the whole run is computed once, up front, and
handed to every segment (datetimes as timedeltas since the first position, as
a kernel reads them).

The store also holds a fingerprint of what determines the result: the
kernel's structure (:func:`xstencil._engine.kcache.describe`, the code, the
constants and closed-over arrays it reads), the options, the arguments and the
initial state (:mod:`xstencil._labelled.stream_fingerprint`).  A resume whose
fingerprint differs is refused.

The call returns the result opened lazily from the store (``xr.open_zarr``),
so the trajectory is never in memory at once: dask-backed for dask-backed
input (the store's chunks in space, ``segment`` positions along ``dim``), else
numpy read from the store on first use (:func:`_open`).

Dask-backed data streams the same way: each segment is the dask scan
(:mod:`xstencil._backends.dask`) of the last ``k`` positions, read lazily back
from the store, and is computed by its ``to_zarr`` write, chunk by chunk (the
store's chunks follow the dask chunks, one position deep along ``dim``).

Data sharded over JAX devices (or ``devices=``) streams too: each segment is
the sharded scan (a deep halo every ``halo_every`` steps), its saved
positions are written between segments, and the next segment starts from the
last ``k`` positions on the devices (after a resume, read back and put on
the devices with the input's layout: :mod:`xstencil._labelled.stream_shard`).
Each device's block is written on its own (never the whole segment on the
host), and a global array spanning several processes streams with process 0
alone looking at and changing the store's metadata (``run.together``).

Zarr writes each chunk and each metadata document atomically (a temporary
file renamed), so a kill leaves every file either old or new.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import xarray as xr

from xstencil._backends.dask_base import any_dask
from xstencil._engine.call import precision
from xstencil._errors import XStencilError
from xstencil._labelled.dispatch import devices_arg
from xstencil._labelled.scan_setup import grown_coord
from xstencil._labelled.stream_fingerprint import fingerprint
from xstencil._labelled.stream_shard import (
    Layout,
    layout_of,
    lead,
    on_devices,
    reshard,
    spans_processes,
    write_blocks,
)

__all__ = ["streamed", "STORE_KEY", "SEGMENT_BYTES"]

#: The key of the store attribute holding the fingerprint and the marker.
STORE_KEY = "xstencil_stream"
#: The default size of a segment's saved positions, in bytes.
SEGMENT_BYTES = 64 * 2**20
_DA = "__xarray_dataarray_variable__"


@dataclasses.dataclass(frozen=True)
class _Run:
    """What one streamed run needs besides the data."""

    call: str
    dim: str
    k: int
    steps: int
    every: int
    tvals: np.ndarray  # the whole trajectory's dim coordinate (all positions)
    saves: int  # saved positions in all, the k initial ones included
    segment: int  # saved positions per segment
    chunks: dict[str, int] | None = None  # dask-backed: the store's chunk size per dim
    # dask-backed: the input's own chunks per dim, which each segment's input keeps
    # (the store's uniform ones, the largest, could leave a last chunk under the halo)
    state_chunks: dict[str, tuple[int, ...]] | None = None
    layout: Layout | None = None  # sharded over devices: the input's layout
    together: bool = False  # global arrays over several processes: collective store access


def streamed(scan: Callable[..., Any], call: str, obj: Any, kernel: Any, dim: str,
             args: tuple[Any, ...], kwargs: dict[str, Any], options: dict[str, Any], *,
             store: Any, resume: bool, segment: int | None) -> Any:
    """Run ``scan(obj, kernel, dim, *args, **options, **kwargs)`` segment by
    segment into the Zarr ``store``; return the result opened from it."""
    if options.get("mesh") is not None:  # the old name of devices=: warned about once
        options = {**options, "devices": devices_arg(call, options.get("devices"),
                                                     options["mesh"]), "mesh": None}
    run = _plan(call, obj, dim, options, store, segment)
    path = os.fspath(store)
    meta = {"version": 1, **fingerprint(obj, kernel, dim, args, kwargs, options, run.layout),
            "kind": "DataArray" if isinstance(obj, xr.DataArray) else "Dataset",
            "name": None if isinstance(obj, xr.Dataset) else _name(obj.name),
            "order": [str(n) for n in obj.data_vars] if isinstance(obj, xr.Dataset) else [],
            "taken": [] if isinstance(obj, xr.Dataset) else sorted(
                {str(n) for n in obj.coords} | {str(d) for d in obj.dims} | {dim}),
            "dim": dim, "saves": run.saves, "complete": 0}
    # over several processes, process 0 alone looks at and changes the store's metadata
    # (another process could see what process 0 has just written), and tells the others
    exists = bool(lead(call, lambda: int(os.path.exists(path)), run.together))
    if exists and not resume:
        raise XStencilError(
            f"{call}: store={path!r} already exists; pass resume=True to continue the run "
            f"saved there, or remove it (shutil.rmtree) to start again")
    done = lead(call, lambda: _reopen(call, path, meta), run.together) if exists else 0
    meta["complete"] = done
    if done == run.saves:
        return _open(path, meta, run)

    def step(o: Any, a: int, b: int) -> Any:
        return _segment(scan, run, o, kernel, args, kwargs, options, a, b)

    if done == 0:
        if exists:  # killed in its first write: ours (it has our attribute)
            lead(call, lambda: shutil.rmtree(path) or 0, run.together)
        b = min(run.saves, run.k + run.segment)
        out = step(obj, 0, b)
        _write(_encode(out, meta, run), path, run, first=True)
        done = out.sizes[dim]
        _marked(call, path, meta, done, run)
        state = _next_state(out, path, meta, run, done)
        del out
    else:
        state = _next_state(None, path, meta, run, done)
    while done < run.saves:
        b = min(run.saves, done + run.segment)
        out = step(state, done, b)
        with precision(*_datas(out)):
            new = out.isel({dim: slice(run.k, None)})
        _write(_encode(new, meta, run), path, run, first=False)
        _marked(call, path, meta, b, run)
        done = b
        state = _next_state(out, path, meta, run, done)
        del out, new
    return _open(path, meta, run)


def _zarr() -> Any:
    """The zarr package (an optional dependency: the ``io`` extra)."""
    import zarr  # noqa: PLC0415 - optional, needed only for store=

    return zarr


def _plan(call: str, obj: Any, dim: str, options: Mapping[str, Any], store: Any,
          segment: Any) -> _Run:
    """Validate the options a streamed run supports."""
    if not isinstance(store, str | os.PathLike):
        raise XStencilError(f"{call}: store={store!r:.60} must be a path (str or os.PathLike) "
                            f"of a Zarr store, e.g. store='run.zarr' (resume= and segment= "
                            f"go with store=)")
    try:
        _zarr()
    except ImportError as e:
        raise XStencilError(f"{call}: store= writes a Zarr store and needs the zarr package; "
                            f"install it (pip install 'xstencil[io]' or pip install zarr)") from e
    steps = options.get("steps")
    every = options.get("save_every", 1)
    if steps is None:
        raise XStencilError(
            f"{call}: store= streams a trajectory grown with steps=N; pass steps=N (with the "
            f"initial state as input), or scan the input's own trajectory without store=")
    if every == "last" or isinstance(every, bool) or not isinstance(every, int):
        raise XStencilError(
            f"{call}: store= needs save_every=s (an int), got save_every={every!r}; "
            f"save_every='last' keeps one state, so run it without store=")
    for opt in ("grid", "at"):
        if options.get(opt) is not None:
            raise XStencilError(
                f"{call}: store= is not available with {opt}= (a staggered scan); scan "
                f"without store= and write the result with .to_zarr(...)")
    datas = [v.data for v in obj.data_vars.values()] if isinstance(obj, xr.Dataset) \
        else [obj.data]
    layout = layout_of(call, obj)
    together = layout is not None and spans_processes(obj)
    chunks = state_chunks = None
    if any_dask(datas):
        chunks = {str(d): max(c) for d, c in obj.chunksizes.items() if d != dim}
        state_chunks = {str(d): tuple(c) for d, c in obj.chunksizes.items() if d != dim}
    k = obj.sizes[dim] if dim in obj.dims else 1
    if k > 1 and every > 1:
        raise XStencilError(
            f"{call}: store= with save_every={every!r} needs a window reaching one position "
            f"back along {dim!r}; this input holds {k} initial positions, and a segment must "
            f"start from the last {k} positions, which save_every>1 does not save. Use "
            f"save_every=1")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1 or every < 1 \
            or steps % every:
        raise XStencilError(
            f"{call}: steps={steps!r} must be an int >= 1 and a multiple of "
            f"save_every={every!r} (an int >= 1); e.g. steps={max(every, 1) * 10}, "
            f"save_every={max(every, 1)}")
    n0 = obj.sizes[dim] if dim in obj.dims else 0
    tvals = grown_coord(call, obj, dim, options.get("coord"), options.get("dt"), steps, n0,
                        k + steps)
    saves = k + steps // every
    if segment is None:
        per = sum(int(np.prod([n for d, n in v.sizes.items() if d != dim]))
                  * v.dtype.itemsize for v in _evolving(obj, dim))
        segment = max(1, min(saves, SEGMENT_BYTES // max(per, 1)))
    elif isinstance(segment, bool) or not isinstance(segment, int) or segment < 1:
        raise XStencilError(f"{call}: segment={segment!r} must be an int >= 1 (saved "
                            f"positions per segment written to the store)")
    return _Run(call, dim, k, steps, every, np.asarray(tvals), saves, segment, chunks,
                state_chunks, layout, together)


def _evolving(obj: Any, dim: str) -> list[Any]:
    if isinstance(obj, xr.DataArray):
        return [obj]
    have = [v for v in obj.data_vars.values() if dim in v.dims]
    return have or list(obj.data_vars.values())


def _segment(scan: Callable[..., Any], run: _Run, state: Any, kernel: Any,
             args: tuple[Any, ...], kwargs: dict[str, Any], options: dict[str, Any],
             a: int, b: int) -> Any:
    """Saved positions ``a .. b - 1`` (and the ``k`` before ``a`` when ``a > 0``):
    one in-memory scan started from ``state``."""
    k, dim = run.k, run.dim
    first = a if a == 0 else a - k  # saved index of the segment's first position
    p0 = _position(run, first)
    p1 = _position(run, b - 1)
    tv = _numeric(run.tvals)
    opts = {**options, "steps": p1 - p0 - k + 1, "dt": None}
    if dim in state.dims:  # the k initial positions, labelled; coord= the new ones
        state = state.assign_coords({dim: tv[p0:p0 + k]})
        opts["coord"] = tv[p0 + k:p1 + 1]
    else:  # one initial state: coord= all positions
        state = state.drop_vars(dim) if dim in state.coords else state
        opts["coord"] = tv[p0:p1 + 1]
    try:
        out = scan(state, kernel, dim, *args, **opts, **kwargs)
    except XStencilError as e:
        raise XStencilError(
            f"{e} (store=: in the segment starting at position {p0} along {dim!r}, "
            f"{dim}={run.tvals[p0]}; positions and {dim!r} values above count from that "
            f"segment's start)") from e
    pos = [_position(run, i) for i in range(first, b)]
    assert out.sizes[dim] == len(pos), (out.sizes[dim], pos)
    return out.assign_coords({dim: xr.Variable(dim, run.tvals[pos])})


def _position(run: _Run, i: int) -> int:
    """The position along ``dim`` of saved index ``i``."""
    return i if i < run.k else run.k - 1 + (i - run.k + 1) * run.every


def _numeric(tvals: np.ndarray) -> np.ndarray:
    """Datetimes as timedeltas since the first (a kernel reads them so)."""
    return tvals - tvals[0] if tvals.dtype.kind == "M" else tvals


def _next_state(out: Any, path: str, meta: dict[str, Any], run: _Run, done: int) -> Any:
    """The last ``k`` positions, the next segment's input: copied from the
    segment in memory or on the devices (not a view holding it), or read
    lazily from the store for dask-backed data (so the segment's graph is not
    computed again).  After a resume, sharded data is put back on the
    devices with the input's layout."""
    if out is not None and run.chunks is None:
        with precision(*_datas(out)):
            last = out.isel({run.dim: slice(-run.k, None)})
        # a slice of a JAX array is a new array; of numpy, a view holding the segment
        return last if on_devices(last) else last.copy(deep=True)
    state = _open(path, meta, run).isel({run.dim: slice(done - run.k, done)})
    if run.layout is not None:  # each process reads its own blocks
        return reshard(state, run.layout)
    if run.chunks is None:
        return state.load()
    return state.chunk({d: c for d, c in (run.state_chunks or run.chunks).items()
                        if d in state.dims})


def _encode(out: Any, meta: dict[str, Any], run: _Run) -> xr.Dataset:
    ds = out.to_dataset(name=_stored_name(meta)) if isinstance(out, xr.DataArray) else out
    return ds.assign_attrs({STORE_KEY: meta})


def _write(ds: xr.Dataset, path: str, run: _Run, first: bool) -> None:
    """Write (``first``) or append one segment's saved positions."""
    dim = run.dim
    if on_devices(ds):  # sharded: each device's blocks, never the whole segment
        write_blocks(ds, path, dim, first)
        return
    if run.chunks is not None:  # dask: zarr chunks aligned with the dask chunks
        ds = ds.chunk({d: 1 if d == dim else run.chunks.get(d, -1) for d in ds.dims})
    if first:
        along = 1 if run.chunks is not None else run.segment
        enc = {n: {"chunks": tuple(along if d == dim else (run.chunks or {}).get(d, s)
                                   for d, s in zip(v.dims, v.shape, strict=True))}
               for n, v in ds.variables.items() if dim in v.dims}
        enc.setdefault(dim, {}).update(_time_encoding(run.tvals))
        ds.to_zarr(path, mode="w-", encoding=enc, consolidated=False)
    else:
        keep = [n for n, v in ds.variables.items() if dim not in v.dims]
        ds.drop_vars(keep).to_zarr(path, append_dim=dim, consolidated=False)


_UNITS = {"D": "days", "h": "hours", "m": "minutes", "s": "seconds", "ms": "milliseconds",
          "us": "microseconds", "ns": "nanoseconds"}


def _time_encoding(tvals: np.ndarray) -> dict[str, Any]:
    """CF units for the ``dim`` coordinate that hold every position of the
    run exactly, fixed by the first segment's write: xarray picks units from
    the first segment's values alone (days for steps of a day), and appended
    positions that need finer ones (60 hours) were read back in those units
    (60 days), silently."""
    if tvals.dtype.kind not in "Mm":
        return {}
    unit, count = np.datetime_data(tvals.dtype)
    if unit not in _UNITS or count != 1:
        return {}
    if tvals.dtype.kind == "m":
        return {"units": _UNITS[unit], "dtype": "int64"}
    first = np.datetime_as_string(tvals[~np.isnat(tvals)][0], unit=unit) if (
        ~np.isnat(tvals)).any() else "1970-01-01"
    return {"units": f"{_UNITS[unit]} since {first}", "calendar": "proleptic_gregorian",
            "dtype": "int64"}


def _datas(obj: Any) -> list[Any]:
    return [v.data for v in obj.data_vars.values()] if isinstance(obj, xr.Dataset) \
        else [obj.data]


def _marked(call: str, path: str, meta: dict[str, Any], done: int, run: _Run) -> None:
    """:func:`_mark`, by process 0 alone when the data spans several processes."""
    lead(call, lambda: _mark(path, meta, done) or 0, run.together)
    meta["complete"] = int(done)


def _mark(path: str, meta: dict[str, Any], done: int) -> None:
    """The marker: ``done`` saved positions are completely written."""
    meta["complete"] = int(done)
    _zarr().open_group(path, mode="r+").attrs[STORE_KEY] = meta


def _reopen(call: str, path: str, meta: dict[str, Any]) -> int:
    """Check the store against this run; cut it back to its marker; return it."""
    try:
        g = _zarr().open_group(path, mode="r+")
        have = dict(g.attrs).get(STORE_KEY)
    except Exception as e:  # noqa: BLE001 - any unreadable store gets the same advice
        raise XStencilError(f"{call}: store={path!r} exists but is not a Zarr store written "
                            f"by a streamed scan ({e}); remove it or pick another path") from e
    if have is None:
        raise XStencilError(f"{call}: store={path!r} exists but was not written by a streamed "
                            f"scan (no {STORE_KEY!r} attribute); remove it or pick another path")
    for key, what in (("kernel", "the kernel (its code, constants or closed-over arrays)"),
                      ("options", "the options"), ("arguments", "the kernel's arguments"),
                      ("initial", "the initial state"), ("dim", "dim"),
                      ("saves", "steps/save_every"), ("kind", "the input type")):
        if have.get(key) != meta[key]:
            diff = ""
            if key == "options":
                old, new = have.get(key) or {}, meta[key]
                diff = ": " + ", ".join(f"{n}={old.get(n)} in the store, {n}={new.get(n)} now"
                                        for n in sorted(set(old) | set(new))
                                        if old.get(n) != new.get(n))
            raise XStencilError(
                f"{call}: resume=True, but store={path!r} was written by a different run: "
                f"{what} differ{diff}; resume with the same kernel, arguments, options and "
                f"input, or remove the store to start again")
    done = int(have["complete"])
    short = _short(g, meta["dim"], done)
    if short is not None or done > meta["saves"]:
        held = f"{short[1]} saved positions along {meta['dim']!r} (array {short[0]!r})" \
            if short is not None else f"a run of {meta['saves']} saved positions"
        raise XStencilError(
            f"{call}: resume=True, but store={path!r} holds {held} while its marker says "
            f"{done} are complete: the store was changed or damaged after it was written; "
            f"remove it (shutil.rmtree) to start again")
    _truncate(g, meta["dim"], done)
    meta["complete"] = done
    return done


def _short(g: Any, dim: str, n: int) -> tuple[str, int] | None:
    """An array holding fewer than ``n`` positions along ``dim`` (its name and
    length), or ``None``."""
    for name, arr in g.arrays():
        names = getattr(arr.metadata, "dimension_names", None) \
            or arr.attrs.get("_ARRAY_DIMENSIONS")
        if names and dim in names and arr.shape[list(names).index(dim)] < n:
            return str(name), int(arr.shape[list(names).index(dim)])
    return None


def _truncate(g: Any, dim: str, n: int) -> None:
    """Cut every array along ``dim`` back to ``n`` (a half-written segment)."""
    for _, arr in g.arrays():
        names = getattr(arr.metadata, "dimension_names", None) \
            or arr.attrs.get("_ARRAY_DIMENSIONS")
        if names and dim in names:
            ax = list(names).index(dim)
            if arr.shape[ax] != n:
                arr.resize(tuple(n if i == ax else s for i, s in enumerate(arr.shape)))


def _open(path: str, meta: dict[str, Any], run: _Run) -> Any:
    """The result, opened lazily from the store.  Dask-backed input: dask
    chunks that are the store's chunks (the input's chunks) in space and
    ``segment`` positions along ``dim``, so a later lazy step reads the store
    chunk by chunk.  In memory or sharded: xarray's lazy backend arrays, read
    into numpy on first use, as an in-memory scan returns numpy (a sharded
    trajectory, which the devices need not hold, is not put back on them)."""
    chunks = {run.dim: run.segment} if run.chunks is not None else None
    ds = xr.open_zarr(path, consolidated=False, chunks=chunks)
    attrs = {n: v for n, v in ds.attrs.items() if n != STORE_KEY}
    if meta["kind"] == "DataArray":
        da = ds[_stored_name(meta)]
        da.name = meta["name"]
        return da
    ds.attrs = attrs  # the marker stays in the store only
    order = [n for n in meta.get("order", ()) if n in ds.data_vars]  # the input's order (the
    # store lists its variables in no fixed order)
    return ds[order + [n for n in ds.data_vars if n not in order]]


def _stored_name(meta: dict[str, Any]) -> str:
    """The store's variable of a DataArray: its name, or xarray's own for an
    unnamed one, and also for one named like a coordinate or dim (``x``),
    which a Dataset cannot hold next to that coordinate."""
    return _DA if meta["name"] is None or meta["name"] in meta.get("taken", ()) \
        else meta["name"]


def _name(name: Any) -> str | None:
    return None if name is None else str(name)

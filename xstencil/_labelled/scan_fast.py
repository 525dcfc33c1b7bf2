"""The repeat-call fast path of ``scan``: a repeated scan skips its setup.

A labelled scan validates its options, reads the data's layout into a
:class:`~xstencil._labelled.scan_plan.ScanPlan`, finds the state's dtype,
traces the kernel to see what it reads, pads the coordinates, looks up the
compiled loop and rewraps the saved slabs: milliseconds of Python for a loop
that may run in tens of microseconds.  The first call (the slow path, where
every error is raised) records an :class:`Entry` under a *signature* of the
call and the kernel's :func:`~xstencil._engine.kcache.describe` key (so a
changed closed-over global is a different key, and closed-over arrays are
read afresh); a later call with the same signature goes straight to the
compiled loop and a cheap rewrap.

The signature holds the data's type, each variable's name, dims, shape and
dtype, the coordinates' names, dims and dtypes, every option, the static
kernel arguments and the shapes, dtypes and weak types of the dynamic ones,
and JAX's x64 flag.  Coordinate *values* are checked on every hit: the indexed
coordinates (by the identity of their index objects, else by value) and the
coordinates along the scanned dim (by value), because the compiled loop's
padded coordinates, the time coordinate and the labels of the saved
positions were made from them; so are these coordinates' attrs (those
along the scanned dim are the result's).  Other coordinates, the name and
the attrs are taken from the call's own object.

Only in-memory data takes the fast path (numpy or single-device JAX data, or
tracers), with one kernel (with or without a ``progress`` bar) and no ``devices=`` or
``halo_every=``; for a Dataset, every variable must be advanced or have no
scanned dim.  Anything else takes the full path every time.

A scan that ran as numba loops (:mod:`xstencil._labelled.loop_scan`) is
recorded the same way, its ``fn`` a :class:`~xstencil._labelled.loop_scan.Repeat`
that reruns the compiled step on the call's data.  The signature holds
whether the call may run as loops (:func:`~xstencil._labelled.loop_scan.candidate`:
numpy data, options, size, no trace in progress), so an entry recorded on one
route (loops or XLA, whose float results differ in the last bits) never serves
a call that a fresh run would send down the other.

Per call, the fast path costs a few microseconds each for the kernel's key,
the signature and the coordinate checks, one dispatch of the compiled loop
(plus one of ``post`` where the layout changes) and a rewrap that copies the
result's few coordinate variables without re-validating them (``_copy``);
nothing is moved to the host, checked for NaN or run under x64 unless the
entry's dtypes or options need it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Hashable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import xarray as xr
from xarray.core.utils import dict_equiv

from xstencil._engine.call import is_weak, is_wide, narrowed_here, precision, settled, split_static
from xstencil._engine.coords import coord_values, numeric_coord, repeated_period
from xstencil._engine.kcache import Lifted, freeze_each, peek, put
from xstencil._errors import XStencilError
from xstencil._labelled.result import host64
from xstencil._labelled.scan_plan import ScanPlan
from xstencil._labelled.scan_result import call_with_progress, finite, initial_finite

__all__ = ["Entry", "signature", "lookup", "run", "remember"]

_TOKEN = np.int32(0)  # the progress token of a loop without a bar


class Entry(NamedTuple):
    plan: ScanPlan
    fn: Callable[..., Any]  # the compiled loop
    post: Callable[..., Any] | None  # the loop's outputs in the result's layout (jitted)
    casts: tuple[Any, ...]  # per variable, the state's dtype (None: kept)
    state: list[np.ndarray]  # per variable, an empty array of the state's dtype (precision)
    perms: tuple[tuple[int, ...] | None, ...]  # per variable, its own dims to the loop's
    coords: list[Any]  # padded spatial coordinates on the device
    tcoord: Any  # the padded time coordinate (or its stand-in, or None)
    checked: tuple[tuple[str, tuple[str, ...], Any, np.ndarray, dict[Any, Any]], ...]
    # name, dims, index, values, attrs
    recipe: Any  # how the result is put together (_DataArrayRecipe or _DatasetRecipe)
    wide: bool  # a state dtype is 64-bit: the loop runs under x64
    host: bool  # a state dtype has 8-byte items: host64 may move results to the host
    masks: list[Any]  # a function mesh's mask regions on the device (the XLA loop's input)


class _Coords(NamedTuple):
    fixed: dict[str, tuple[xr.Variable, Any]]  # coords made by the scan: variable, index
    live: tuple[str, ...]  # coords taken from the call's object as they are
    order: tuple[str, ...]  # the result's coordinates, in order


class _DataArrayRecipe(NamedTuple):
    dims: tuple[str, ...]
    coords: _Coords


class _DatasetRecipe(NamedTuple):
    variables: tuple[tuple[str, int | None, tuple[str, ...]], ...]  # name, output index, dims
    coords: _Coords
    sizes: dict[str, int]
    order: tuple[Hashable, ...]  # the result's variables, in order


def _local(data: Any) -> bool:
    """In memory on one device (or a tracer): the in-memory scan's data, in
    native byte order (the full path converts a big-endian array)."""
    if isinstance(data, np.ndarray):
        return data.dtype.isnative
    if isinstance(data, jax.core.Tracer):
        return True
    return isinstance(data, jax.Array) and len(data.sharding.device_set) == 1


def _coord_vars(obj: Any) -> dict[Hashable, Any]:
    """The coordinate variables of a DataArray or Dataset, in order."""
    if type(obj) is xr.DataArray:
        return obj._coords
    names = obj._coord_names
    return {n: v for n, v in obj._variables.items() if n in names}


def signature(obj: Any, options: tuple[Any, ...], args: Any, kwargs: Any) -> Hashable | None:
    """The call's signature, or None where the fast path does not apply."""
    if narrowed_here():
        return None
    if type(obj) is xr.DataArray:
        variables = [(None, obj.variable)]
    elif type(obj) is xr.Dataset:
        variables = [(n, obj._variables[n]) for n in obj.data_vars]
    else:
        return None
    if not all(_local(v._data) for _, v in variables):
        return None
    if args or kwargs:
        try:
            dyn, static = split_static("scan", (args, kwargs))
        except XStencilError:  # an unhashable argument: the full path says so
            return None
        arg_key: Any = (static, tuple((np.shape(x), str(getattr(x, "dtype", "")), is_weak(x))
                                      for x in dyn))
    else:
        arg_key = None
    # str(dtype) as well where .str is not the whole dtype: a timezone-aware dtype's
    # .str has no timezone, a structured one's no fields (str() is slow: numpy's not)
    coords = tuple((n, v.dims, dt.str, None if isinstance(dt, np.dtype) and dt.kind != "V"
                    else str(dt)) for n, v in _coord_vars(obj).items() for dt in (v.dtype,))
    try:
        key = (type(obj), tuple((n, v.dims, v.shape, v.dtype.str) for n, v in variables),
               coords, freeze_each(options), arg_key, bool(jax.config.read("jax_enable_x64")))
        hash(key)
    except TypeError:
        return None
    return key


def _checked(obj: Any, dim: str
             ) -> tuple[tuple[str, tuple[str, ...], Any, np.ndarray, dict[Any, Any]], ...]:
    """The coordinates whose values (and attrs: those along ``dim`` are the
    result's) the cached entry depends on, as they are now."""
    out = []
    for n, v in _coord_vars(obj).items():
        index = obj._indexes.get(n)
        if index is not None or n == dim or dim in v.dims or n in obj.dims:
            out.append((n, v.dims, index, np.array(coord_values(v), copy=True),
                        copy.deepcopy(v.attrs)))
    return tuple(out)


def lookup(lifted: Lifted, sig: Hashable, obj: Any) -> Entry | None:
    """The entry recorded for this kernel and signature, if the coordinates
    it depends on still have the same values."""
    entry = peek(("scan-fast", lifted.key, sig))
    if entry is None:
        return None
    indexes, coords = obj._indexes, _coord_vars(obj)
    try:
        for name, dims, index, values, attrs in entry.checked:
            v = coords.get(name)
            if v is None or not dict_equiv(v.attrs, attrs):
                return None
            if index is not None and indexes.get(name) is index:
                continue
            if v.dims != dims or not np.array_equal(coord_values(v), values):
                return None
    except (TypeError, ValueError):  # values that do not compare (cftime calendars): a miss
        return None
    return entry


def run(entry: Entry, obj: Any, args: Any, kwargs: Any, lifted: Lifted) -> Any:
    """The scan of ``obj`` with the cached plan, loop and coordinates."""
    sp = entry.plan
    names = sp.plan.var_names
    datas = [obj.variable._data] if names is None else [obj._variables[n]._data for n in names]
    dyn = split_static("scan", (args, kwargs))[0] if args or kwargs else []
    leaves = list(lifted.leaves)
    if (entry.wide or dyn and is_wide(dyn)) and not jax.config.read("jax_enable_x64"):
        with jax.enable_x64(True):  # as precision(state, dyn) would
            outs, bad = _call(entry, sp, datas, dyn, leaves)
    else:
        outs, bad = _call(entry, sp, datas, dyn, leaves)
    if entry.host:
        outs = host64(outs)  # outside the x64 context: float64 stays float64 on the host
    if sp.check_finite:  # else the loop reports no position (-1)
        finite(sp.call, bad, sp.tvals, sp.dim)
    if isinstance(entry.recipe, _DataArrayRecipe):
        return _dataarray(entry.recipe, obj, outs[0])
    return _dataset(entry.recipe, obj, outs)


def _call(entry: Entry, sp: ScanPlan, datas: list[Any], dyn: list[Any], leaves: list[Any]
          ) -> tuple[Any, Any]:
    """The compiled loop (and its jitted ``post``) on the variables' data:
    ``(outputs, first bad position)``."""
    datas = [x if c is None else x.astype(c) for x, c in zip(datas, entry.casts, strict=True)]
    arrays, init = _inputs(sp, datas, entry.perms)
    if sp.check_finite:
        initial_finite(sp.call, init, sp.dim, sp.k)
    runargs = (arrays, init, entry.coords, entry.tcoord, entry.masks, dyn, leaves)
    if sp.loop.progress_every:  # under its bar, computed before returning
        outs, bad = call_with_progress(entry.fn, runargs, sp.loop.progress_every,
                                       sp.loop.steps, sp.call)
    else:
        outs, bad = entry.fn(*runargs, _TOKEN)
    if entry.post is not None:  # dispatched before waiting: it runs right after the loop
        outs = entry.post(outs)
    # a numpy input may be read in place, and changed right after the call
    return settled((outs, bad), (datas, dyn, leaves))


def _inputs(sp: ScanPlan, datas: Sequence[Any], perms: Sequence[tuple[int, ...] | None]
            ) -> tuple[list[Any], list[list[Any]]]:
    """As :func:`xstencil._labelled.scan_loop.inputs` on the variables' own data
    (``perms`` puts each in the loop's layout: dim first, then the plan's
    order), without copying numpy data to the device first (the compiled
    call takes it as it is)."""
    k = sp.k
    xs = [x if p is None else (np.transpose if isinstance(x, np.ndarray) else jnp.transpose)(
        x, p) for x, p in zip(datas, perms, strict=True)]
    init = []
    for i in sp.evolving:
        x, v = xs[i], sp.variables[i]
        if k == 0:
            init.append([jnp.zeros(x.shape[1:], x.dtype)])
        elif not v.has_time and sp.grown and x.ndim == len(v.axes):
            init.append([x])
        else:
            init.append([x[j] for j in range(k)])
    return [a if v.has_time or v.state is None else None
            for a, v in zip(xs, sp.variables, strict=True)], init


def _coords_of(rc: _Coords, obj: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The result's coordinate variables and indexes."""
    coords: dict[str, Any] = {}
    indexes: dict[str, Any] = {}
    have = _coord_vars(obj)
    for n in rc.live:
        coords[n] = _copy(have[n], deep=False)
        if n in obj._indexes:
            indexes[n] = obj._indexes[n]
    for n, (v, index) in rc.fixed.items():
        coords[n] = _copy(v, deep=index is None)  # index variables are immutable
        if index is not None:
            indexes[n] = index
    return {n: coords[n] for n in rc.order}, indexes


def _copy(v: xr.Variable, deep: bool) -> xr.Variable:
    """``v.copy(deep=deep)`` without re-validating what ``v`` already holds
    (a new variable of the same class, its attrs and encoding copied as
    ``copy`` copies them, its data shared or, ``deep``, copied): a quarter of
    the time, for the few coordinates of every result."""
    data = v._data
    if deep:
        if type(data) is not np.ndarray:
            return v.copy(deep=True)
        data = data.copy()
    new = object.__new__(type(v))
    new._dims = v._dims
    new._data = data
    new._attrs = _dict_copy(v._attrs, deep)
    new._encoding = _dict_copy(v._encoding, deep)
    return new


def _dict_copy(d: dict[Any, Any] | None, deep: bool) -> dict[Any, Any] | None:
    """A variable's attrs or encoding as ``Variable.copy`` copies them (an
    empty one without ``deepcopy``'s bookkeeping)."""
    if d is None:
        return None
    return copy.deepcopy(d) if deep and d else dict(d)


def _dataarray(recipe: _DataArrayRecipe, obj: xr.DataArray, data: Any) -> xr.DataArray:
    coords, indexes = _coords_of(recipe.coords, obj)
    var = xr.Variable(recipe.dims, data, dict(obj.attrs), fastpath=True)
    return xr.DataArray._construct_direct(var, coords, obj.name, indexes)


def _dataset(recipe: _DatasetRecipe, obj: xr.Dataset, outs: Sequence[Any]) -> xr.Dataset:
    coords, indexes = _coords_of(recipe.coords, obj)
    variables: dict[Hashable, Any] = dict(coords)
    for n, j, dims in recipe.variables:
        own = obj._variables[n]
        variables[n] = own.copy(deep=False) if j is None else xr.Variable(
            dims, outs[j], dict(own.attrs), fastpath=True)
    variables = {n: variables[n] for n in recipe.order}
    return xr.Dataset._construct_direct(variables, set(coords), dict(recipe.sizes),
                                        dict(obj.attrs), indexes)


def _coord_recipe(sp: ScanPlan, obj: Any, out: Any) -> _Coords | None:
    dim = sp.dim
    fixed, live = {}, []
    have = _coord_vars(obj)
    along = {n for n, v in have.items() if n == dim or dim in v.dims}
    for n, v in _coord_vars(out).items():
        if n in along or n == dim or dim in v.dims:
            fixed[n] = (v.copy(deep=True), out._indexes.get(n))
        elif n in have and have[n].dims == v.dims:
            live.append(n)
        else:
            return None
    if set(live) != set(have) - along:
        return None
    return _Coords(fixed, tuple(live), tuple(_coord_vars(out)))


def _perm(sp: ScanPlan, i: int, own: Sequence[Hashable]) -> tuple[int, ...] | None:
    """The transposition of variable ``i``'s own data (dims ``own``) into the
    loop's layout: ``dim`` first (where it has it), then the plan's order."""
    vd = sp.plan.var_dims[i]
    want = ((sp.dim,) if sp.dim in own else ()) + tuple(d for d in vd if d != sp.dim)
    perm = tuple(list(own).index(d) for d in want)
    return None if perm == tuple(range(len(own))) else perm


def _post(sp: ScanPlan, dims_out: Sequence[tuple[str, ...]], squeezed: bool
          ) -> tuple[tuple[tuple[int, ...], ...], bool] | None:
    """How the loop's outputs (dim first, then the variable's other dims in
    plan order) become the result's: per output the transposition, and
    whether only its first position is kept (``save_every="last"``, unless
    the loop already dropped that axis: ``squeezed``); None where they
    already are."""
    last = sp.every == 0 and not squeezed
    perms, needed = [], last
    for i, dims in zip(sp.evolving, dims_out, strict=True):
        have = (sp.dim,) + tuple(d for d in sp.plan.var_dims[i] if d != sp.dim)
        if sp.every == 0:
            have = have[1:]
        perm = tuple(have.index(d) for d in dims)
        needed |= perm != tuple(range(len(perm)))
        perms.append(perm)
    if not needed:
        return None
    return tuple(perms), last


def _jitted_post(perms: tuple[tuple[int, ...], ...], last: bool) -> Callable[..., Any]:
    """:func:`_post`'s recipe as a jitted function of the loop's outputs."""

    def post(outs: Sequence[Any]) -> list[Any]:
        return [jnp.transpose(x[0] if last else x, p) for x, p in zip(outs, perms, strict=True)]

    return jax.jit(post)


def _warns(sp: ScanPlan, obj: Any) -> bool:
    """Whether the full call warned that a periodic coordinate repeats its
    endpoint (a repeat would not say it again: it takes the full path)."""
    plan = sp.plan
    assert plan is not None
    for d, s in zip(plan.dims, plan.specs, strict=True):
        # any numeric coordinate of the dim, read by the kernel or not (the
        # plan's coord_dims hold only the coordinates the kernel reads)
        if d != sp.dim and s.mode == "periodic" and (s.pad_lo or s.pad_hi) \
                and d in obj.coords and obj.coords[d].dims == (d,) \
                and obj.coords[d].dtype.kind in "iuf":
            c = numeric_coord(sp.call, d, coord_values(obj.coords[d].variable))
            period = None if sp.period is None else sp.period.get(d)
            if repeated_period(c) is not None or repeated_period(c, period) is not None:
                return True
    return False


def remember(lifted: Lifted, sig: Hashable | None, obj: Any, cast: Any, sp: ScanPlan,
             fn: Callable[..., Any], coords: Sequence[Any], tcoord: Any, arguments: Any,
             outs: Sequence[Any], out: Any, masks: Sequence[Any] = ()) -> None:
    """Record the entry for ``sig`` after a successful full call on ``obj``
    (``cast``: ``obj`` with the state's dtype, as scanned; ``arguments``: the
    kernel's ``(args, kwargs)``; ``outs``: what the loop returned; ``out``:
    the result; ``masks``: a function mesh's masks as the loop read them)."""
    if sig is None or any(isinstance(c, jax.core.Tracer) for c in [*coords, tcoord, *masks]) \
            or _warns(sp, obj):
        return
    names = sp.plan.var_names
    keys = [None] if names is None else list(names)
    rc = _coord_recipe(sp, obj, out)
    if rc is None:
        return
    if names is None:
        dims_out: list[tuple[str, ...]] = [tuple(out.dims)]
        recipe: Any = _DataArrayRecipe(tuple(out.dims), rc)
    else:
        evolving = {names[i]: j for j, i in enumerate(sp.evolving)}
        if any(n not in evolving and sp.dim in obj[n].dims for n in names) \
                or list(out.data_vars) != list(names):
            return  # a variable along dim read but not advanced: the full path
        dims_out = [tuple(out[names[i]].dims) for i in sp.evolving]
        recipe = _DatasetRecipe(tuple((n, evolving.get(n), tuple(out[n].dims)) for n in names),
                                rc, dict(out.sizes), tuple(out._variables))
    before = [np.dtype((obj if n is None else obj[n]).dtype) for n in keys]
    after = [np.dtype((cast if n is None else cast[n]).dtype) for n in keys]
    casts = tuple(None if a == b else a for a, b in zip(after, before, strict=True))
    state = [np.zeros(0, a) for a in after]
    perms = tuple(_perm(sp, i, (obj if n is None else obj[n]).dims) for i, n in enumerate(keys))
    posted = getattr(fn, "posted", None)
    # the XLA loop (scan_loop.build_loop) drops the axis along dim of a "last" save
    layout, post = _post(sp, dims_out, squeezed=posted is None), None
    if layout is not None and posted is not None:  # a loop scan's: done on the host
        fn = posted(*layout)
    elif layout is not None:
        post = _jitted_post(*layout)
    if post is not None and not any(isinstance(x, jax.core.Tracer) for x in outs):
        # compile it now, in the first call, rather than in the first repeat
        with precision(state, split_static("scan", arguments)[0]):
            jax.block_until_ready(post(outs))
    put(("scan-fast", lifted.key, sig), Entry(
        sp, fn, post, casts, state, perms, list(coords), tcoord, _checked(obj, sp.dim), recipe,
        is_wide(state), any(a.itemsize == 8 for a in after), list(masks)))

"""Fresh views of the 64-bit numpy arrays a traced user function reads.

With JAX's x64 flag off, JAX 0.10 converts a float64 (or int64) numpy array
that a trace reads as a constant to 32 bits, and keeps that copy in a cache
keyed by the array object.  A kernel or step function traced again after
``w[...] = 3`` (xstencil retraces: its cache keys hold the array's digest)
then read the old copy: the old result came back, silently.  A view is a new
object over the same memory, so its conversion is made afresh.

:func:`fresh` returns the function reading views, where it can be rebuilt:
closures and globals (:func:`~xstencil._engine.kcache.rebuild`), the
arguments and keywords of a ``functools.partial``.  Arrays reached further
(attributes of a bound method's object, of a callable instance, of objects,
classes and modules the function or its helpers name, at any depth, and in
the dicts, lists, tuples and ``__slots__`` found there; a DataArray's data
through :data:`LENDERS`) are lent as views only while the function runs (the
trace), then put back unless something assigned the slot meanwhile.  Views
are lent whatever the x64 flag: JAX's copy is kept by the array alone, so a
trace under x64 (the loop backends') read an old 32-bit copy too.

Not covered: ``obj.w is stored`` is false during the trace (the view shares
the memory, so values, shapes and writes are the same; only identity
differs); an array a ``functools.lru_cache`` helper returns (the helper's
cache holds the array itself, so no view can be lent), and anything past
:data:`_BUDGET` values searched.
"""

from __future__ import annotations

import collections
import functools
import threading
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from xstencil._engine.kcache import describe, rebuild
from xstencil._engine.kwalk import is_library

__all__ = ["fresh", "LENDERS"]

_ATOMS = (bool, int, float, complex, str, bytes, type(None))


#: The dtypes JAX narrows with x64 off.  Its copy is kept by the array object
#: whatever the flag: a trace under x64 (the loop backends' own) reads an old
#: 32-bit copy too, so views are lent under x64 as well.
_WIDE = frozenset(map(np.dtype, ("float64", "int64", "uint64", "complex128")))


def _converted(v: Any) -> bool:
    """Whether JAX converts ``v`` (a numpy array of a 64-bit dtype, x64 off)."""
    return isinstance(v, np.ndarray) and v.dtype in _WIDE


def _view(v: Any) -> Any:
    return v.view() if isinstance(v, np.ndarray) else v


def fresh(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` reading fresh views of the 64-bit numpy arrays it reaches, when
    JAX may hold a 32-bit copy of them (see the module docstring)."""
    if type(fn) is functools.partial:  # a subclass may change the call: an instance
        inner = fresh(fn.func)
        if not any(_converted(v) for v in (*fn.args, *fn.keywords.values())):
            return fn if inner is fn.func else functools.partial(inner, *fn.args,
                                                                 **fn.keywords)
        return functools.partial(inner, *map(_view, fn.args),
                                 **{k: _view(v) for k, v in fn.keywords.items()})
    if isinstance(fn, types.MethodType):
        inner = fresh(fn.__func__) if isinstance(fn.__func__, types.FunctionType) \
            else fn.__func__
        bound = fn if inner is fn.__func__ else types.MethodType(inner, fn.__self__)
        return _swapping(bound, [fn.__self__])
    if isinstance(fn, types.FunctionType):
        return _swapping(_rebuilt(fn), [fn])
    return _swapping(fn, [fn])  # a callable instance


def _rebuilt(fn: types.FunctionType) -> Callable[..., Any]:
    """``fn`` reading views of the arrays in its closure and globals."""
    # walked afresh (no shared record: it would hold every traced kernel alive,
    # and kmap's transforms keep records of their own for that reason)
    lifted = describe([fn], memo=False)
    if not any(_converted(v) for v in lifted.leaves):  # only a converted copy is stale
        return fn
    try:
        return rebuild(lifted, [_view(v) for v in lifted.leaves])[0]
    except Exception:  # noqa: BLE001 - a function the walk cannot copy: as it is
        return fn


def _read_objects(fn: types.FunctionType) -> list[Any]:
    """The values ``fn`` names in its closure or globals (objects, modules,
    user classes, helpers), where arrays may be reached (``h.w``,
    ``othermod.W``, ``cfg.inner.w``, ``Cfg.table["w"]``)."""
    cells = [c.cell_contents for c in fn.__closure__ or () if _has_contents(c)]
    names = [fn.__globals__[n] for n in fn.__code__.co_names if n in fn.__globals__]
    return [v for v in cells + names if not isinstance(v, types.BuiltinFunctionType)]


def _has_contents(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises
    except ValueError:
        return False
    return True


def _swapping(fn: Callable[..., Any], owners: list[Any]) -> Callable[..., Any]:
    """``fn`` run with the 64-bit arrays reachable from ``owners`` through
    attributes, dicts and lists (:func:`_slots`) replaced by views (``fn``
    itself where they hold none)."""
    held = _slots(owners)
    return _Lending(fn, held) if held else fn


class _Lending:
    """``fn`` called with views lent at ``held``.  An object, not a closure:
    the kernel walk (a ``fresh`` of a function wrapping this one) would copy
    a closure's list of holders, and lend into the copies."""

    def __init__(self, fn: Callable[..., Any], held: list[tuple[Any, Any]]):
        functools.update_wrapper(self, fn)
        self.fn, self.held = fn, held

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with _swapped(self.held):
            return self.fn(*args, **kwargs)


#: Lenders for library types that hold arrays out of sight of the walk
#: below (the labelled layer registers xarray's: a DataArray's data is in
#: its Variable): each takes a value and returns the ``(holder, name)``
#: slots of the 64-bit arrays it holds (read with ``getattr``), or ``None``
#: for a value it does not know.
LENDERS: list[Callable[[Any], list[tuple[Any, Any]] | None]] = []
_BUDGET = 2000  # values visited per trace when looking for arrays to lend
_MUTABLE = (dict, list, collections.OrderedDict, collections.defaultdict)


def _slots(roots: list[Any]) -> list[tuple[Any, Any]]:
    """Where the 64-bit numpy arrays (and tuples holding them) reachable from
    ``roots`` are stored: ``(holder, key)``, ``holder[key]`` for a dict or
    list (an object's ``__dict__``), else ``getattr(holder, key)`` (a class
    attribute, a ``__slots__`` member, a lender's slot).  Arrays held
    directly by a function's closure or globals are not lent (the rebuilt
    function reads views of those); what they hold is searched."""
    out: list[tuple[Any, Any]] = []
    seen: set[int] = set()
    todo = list(reversed(roots))
    budget = _BUDGET
    while todo and budget > 0:
        v = todo.pop()
        budget -= 1
        if id(v) in seen:
            continue
        seen.add(id(v))
        for holder, key, x in _held(v):
            if holder is not None and _stale(x):
                out.append((holder, key))
            elif type(x) not in _ATOMS:
                todo.append(x)
    return out


def _held(v: Any) -> list[tuple[Any, Any, Any]]:
    """``(holder, key, value)`` for each value ``v`` holds where a view can
    be lent; the values of a tuple or a function (its cells and the globals
    it names) with no holder: searched, not lent."""
    if isinstance(v, _MUTABLE) and type(v).__module__ in ("builtins", "collections"):
        return [(v, k, x) for k, x in (v.items() if isinstance(v, dict) else enumerate(v))]
    if type(v) is tuple:
        return [(None, None, x) for x in v]
    mod = v.__name__ if isinstance(v, types.ModuleType) else getattr(
        v if isinstance(v, type | types.FunctionType) else type(v), "__module__", None)
    if is_library(mod):
        for lender in LENDERS:
            got = lender(v)
            if got is not None:
                return [(h, k, getattr(h, k)) for h, k in got]
        d = getattr(v, "__dict__", None)  # a library object's own arrays (a sparse matrix's)
        if not isinstance(d, dict) or isinstance(v, types.ModuleType | type | types.FunctionType):
            return []
        return [(d, k, x) for k, x in d.items() if _stale(x)]
    if isinstance(v, types.FunctionType):
        return [(None, None, x) for x in _read_objects(v)]
    if isinstance(v, type):
        return [(c, k, x) for c in v.__mro__ if not is_library(c.__module__)
                for k, x in list(vars(c).items()) if not k.startswith("__")]
    d = getattr(v, "__dict__", None)
    out = [(d, k, x) for k, x in d.items()] if isinstance(d, dict) else []
    for k in _slot_names(type(v)):
        if hasattr(v, k):
            out.append((v, k, getattr(v, k)))
    return out


def _slot_names(klass: type) -> list[str]:
    names = (getattr(c, "__slots__", ()) for c in klass.__mro__ if not is_library(c.__module__))
    return [n for s in names for n in ((s,) if isinstance(s, str) else s)
            if n not in ("__dict__", "__weakref__")]


def _stale(x: Any) -> bool:
    """Whether ``x`` is a converted array, or a tuple (a NamedTuple) holding
    one, whose views can be lent (:func:`_lent`)."""
    if _converted(x):
        return True
    if isinstance(x, tuple) and (type(x) is tuple or hasattr(type(x), "_make")):
        return any(_stale(y) for y in x)
    return False


def _lent(x: Any) -> Any:
    """``x`` with each converted array replaced by a view (tuples rebuilt)."""
    if isinstance(x, np.ndarray):
        return x.view()
    items = [_lent(y) if _stale(y) else y for y in x]
    return tuple(items) if type(x) is tuple else type(x)._make(items)


def _get(holder: Any, key: Any) -> Any:
    if isinstance(holder, _MUTABLE):
        try:
            return holder[key]
        except (KeyError, IndexError):
            return None
    return getattr(holder, key, None)


def _set(holder: Any, key: Any, value: Any) -> None:
    if isinstance(holder, _MUTABLE):
        holder[key] = value
    else:
        setattr(holder, key, value)


#: The slots lent views now: ``(id(holder), key) -> [stored value, its
#: lent copy, how many traces hold it]``, under :data:`_LOCK`, so that traces
#: running at once (dask's threads) share one view and the last puts the
#: stored value back.
_LENT: dict[tuple[int, Any], list[Any]] = {}
_LOCK = threading.Lock()


@contextmanager
def _swapped(held: list[tuple[Any, Any]]) -> Iterator[None]:
    mine = []
    with _LOCK:
        for h, k in held:
            entry = _LENT.get((id(h), k))
            if entry is None or _get(h, k) is not entry[1]:
                stored = _get(h, k)
                if not _stale(stored):  # changed since it was found
                    continue
                entry = _LENT[(id(h), k)] = [stored, _lent(stored), 0]
                _set(h, k, entry[1])
            entry[2] += 1
            mine.append((h, k, entry))
    try:
        yield
    finally:
        with _LOCK:
            for h, k, entry in mine:
                entry[2] -= 1
                if entry[2] == 0:
                    if _LENT.get((id(h), k)) is entry:
                        del _LENT[(id(h), k)]
                    if _get(h, k) is entry[1]:  # not reassigned meanwhile
                        _set(h, k, entry[0])

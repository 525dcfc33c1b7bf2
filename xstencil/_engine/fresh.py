"""Fresh views of the 64-bit numpy arrays a traced user function reads.

With JAX's x64 flag off, JAX 0.10 converts a float64 (or int64) numpy array
that a trace reads as a constant to 32 bits, and keeps that copy in a cache
keyed by the array object.  A kernel or step function traced again after
``w[...] = 3`` (xstencil retraces: its cache keys hold the array's digest)
then read the old copy: the old result came back, silently.  A view is a new
object over the same memory, so its conversion is made afresh.

:func:`fresh` returns the function reading views, where it can be rebuilt:
closures and globals (:func:`~xstencil._engine.kcache.rebuild`), the
arguments and keywords of a ``functools.partial``, and the direct array
attributes of a bound method's object, a callable instance, or an object or
module the function names, which are lent as views only while the function
runs (the trace), then put back unless something assigned the attribute
meanwhile.  During that time ``obj.w is stored`` is false (the view shares
the memory).  Arrays further inside (``obj.cfg.w``, ``__slots__``, lists in
attributes) are not reached: those can still be stale with x64 off.
"""

from __future__ import annotations

import functools
import threading
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import jax
import numpy as np

from xstencil._engine.kcache import describe, rebuild
from xstencil._engine.x64flag import x64

__all__ = ["fresh"]


def _converted(v: Any) -> bool:
    """Whether JAX converts ``v`` (a numpy array of a 64-bit dtype, x64 off)."""
    return isinstance(v, np.ndarray) and jax.dtypes.canonicalize_dtype(v.dtype) != v.dtype


def _view(v: Any) -> Any:
    return v.view() if isinstance(v, np.ndarray) else v


def fresh(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` reading fresh views of the 64-bit numpy arrays it reaches, when
    x64 is off (see the module docstring); ``fn`` itself otherwise."""
    if x64():
        return fn
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
        return _swapping(_rebuilt(fn), _read_objects(fn))
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
    """The objects (and modules) ``fn`` names in its closure or globals, whose
    attributes it may read (``h.w``, ``othermod.W``)."""
    cells = [c.cell_contents for c in fn.__closure__ or () if _has_contents(c)]
    names = [fn.__globals__[n] for n in fn.__code__.co_names if n in fn.__globals__]
    return [v for v in cells + names
            if not isinstance(v, type | types.FunctionType | types.BuiltinFunctionType)]


def _has_contents(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises
    except ValueError:
        return False
    return True


def _swapping(fn: Callable[..., Any], owners: list[Any]) -> Callable[..., Any]:
    """``fn`` run with the 64-bit array attributes of ``owners`` replaced by
    views (``fn`` itself where they hold none)."""
    held = [(o, [k for k, v in vars(o).items() if _converted(v)]) for o in owners
            if isinstance(getattr(o, "__dict__", None), dict)]
    held = [(o, names) for o, names in held if names]
    if not held:
        return fn

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        with _swapped(held):
            return fn(*args, **kwargs)

    return call


#: The attributes lent as views now: ``(id(owner), name) -> [stored array,
#: its view, how many traces hold it]``, under :data:`_LOCK`, so that traces
#: running at once (dask's threads) share one view and the last puts the
#: stored array back.
_LENT: dict[tuple[int, str], list[Any]] = {}
_LOCK = threading.Lock()


@contextmanager
def _swapped(held: list[tuple[Any, list[str]]]) -> Iterator[None]:
    mine = []
    with _LOCK:
        for o, names in held:
            for k in names:
                entry = _LENT.get((id(o), k))
                if entry is None or o.__dict__.get(k) is not entry[1]:
                    stored = o.__dict__[k]
                    entry = _LENT[(id(o), k)] = [stored, stored.view(), 0]
                    o.__dict__[k] = entry[1]
                entry[2] += 1
                mine.append((o, k, entry))
    try:
        yield
    finally:
        with _LOCK:
            for o, k, entry in mine:
                entry[2] -= 1
                if entry[2] == 0:
                    if _LENT.get((id(o), k)) is entry:
                        del _LENT[(id(o), k)]
                    if o.__dict__.get(k) is entry[1]:  # not reassigned meanwhile
                        o.__dict__[k] = entry[0]

"""A memo of :func:`~xstencil._engine.kcache.describe` for a kernel object
called again: what the key was read from, checked by identity.

``describe`` walks a kernel, its defaults, closure cells, the globals its
code names and the helpers among them, and builds a key from their values.
A time-stepping loop calls ``map`` with the same kernel object every step,
and the walk (a few hundred Python objects touched, 40-60 µs right after a
loop nest has evicted them from the caches) gives the same key every time.

For a kernel whose walk met only values that cannot change in place (None,
numbers, strings, tuples of them, library modules, classes and functions,
plain user functions made of the same) and arrays, :class:`Memo` records
every *slot* the key was read from: each function's ``__code__``,
``__defaults__`` and ``__kwdefaults__`` (and that dict's items), each
closure cell's contents, each global the code names (present or absent),
and each numpy array's shape and dtype (numpy lets both be reassigned in
place).  A later ``describe`` of the same kernel objects re-reads those
slots and compares them by identity: if all still hold the same objects,
the key (and the lifted arrays, which are those same objects) would be
the same, and the recorded result is returned.  Any difference (a rebound
global or cell, new defaults, a new ``__code__``, a reshaped array) is a
miss, and ``describe`` walks again.  Kernels that reach anything else (a
list, dict, user object, bound method, ``functools.partial``, an opaque
value) are never memoised: their contents can change without any slot
changing.  A kernel is recorded on its second sighting, so an inline
lambda, new on every call, costs one table insert and no recording walk.
"""

from __future__ import annotations

import functools
import threading
import types
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = ["Memo"]

_MISSING = object()
_PENDING = object()  # seen once: recorded when seen again
_NEVER = object()  # reaches something mutable: never recorded
_IMMUTABLE = (bool, int, str, bytes, type(None), type(Ellipsis), float, complex)
#: A kernel whose recorded slots changed this many times (a global rebound on
#: every step) is not recorded again: each record would be a wasted walk.
_STRIKES = 3
_LRU = functools._lru_cache_wrapper  # keyed by content of what it reads: never memoised
_LIMIT = 400  # values visited when recording before a kernel is not memoised


class _Refuse(Exception):
    """The kernel reaches something that can change without a slot changing."""


class Memo:
    """Recorded ``describe`` results per tuple of kernel objects (at most
    ``size`` of them, oldest dropped first).

    ``names(code)`` gives the global names ``code`` reads, ``library(module)``
    whether a module name is a library's, ``is_array(v)`` whether ``describe``
    lifts ``v`` as a dynamic input: the same rules ``describe`` uses.
    """

    def __init__(self, names: Callable[[types.CodeType], tuple[str, ...]],
                 library: Callable[[str | None], bool], is_array: Callable[[Any], bool],
                 size: int = 64):
        self.names, self.library, self.is_array = names, library, is_array
        self.size = size
        # ids -> (the kernels, the recorded slots or a mark, the result, misses)
        self.table: dict[tuple[int, ...], tuple[tuple[Any, ...], Any, Any, int]] = {}
        self.lock = threading.Lock()

    def get(self, kernels: Sequence[Any]) -> Any:
        """The recorded result for these kernel objects if every slot it was
        read from still holds the same object, else ``None``."""
        got = self.table.get(tuple(map(id, kernels)))
        if got is None or got[1] is _PENDING or got[1] is _NEVER:
            return None
        objs, checks, result, _ = got
        for a, b in zip(objs, kernels, strict=True):
            if a is not b:
                return None
        return result if _holds(checks) else None

    def put(self, kernels: Sequence[Any], result: Any) -> None:
        """After a full ``describe``: note the kernels on their first
        sighting, record the slots on the next (``result.key`` holds one
        key per kernel; a non-``"fn"`` key, opaque or not a plain function,
        is never recorded)."""
        ident = tuple(map(id, kernels))
        objs = tuple(kernels)
        got = self.table.get(ident)
        checks: Any = _PENDING
        strikes = 0
        if got is not None and all(a is b for a, b in zip(got[0], objs, strict=True)):
            checks = _NEVER
            strikes = got[3] + (type(got[1]) is tuple)  # a recorded one that failed
            if got[1] is not _NEVER and strikes <= _STRIKES \
                    and all(type(k) is types.FunctionType for k in objs) \
                    and all(type(key) is tuple and key[0] == "fn" for key in result.key):
                try:
                    checks = self._record(objs)
                except (_Refuse, ValueError, RecursionError):
                    checks = _NEVER  # never memoised: later calls skip the recording
        with self.lock:
            self.table.pop(ident, None)
            self.table[ident] = (objs, checks, result, strikes)
            while len(self.table) > self.size:
                del self.table[next(iter(self.table))]

    def clear(self) -> None:
        with self.lock:
            self.table.clear()

    def _record(self, kernels: tuple[Any, ...]) -> tuple[Any, ...]:
        fns: list[tuple[Any, ...]] = []
        cells: list[tuple[Any, Any]] = []
        globs: list[tuple[dict[str, Any], str, Any]] = []
        arrays: list[tuple[np.ndarray, tuple[int, ...], Any]] = []
        own: list[tuple[Any, tuple[tuple[str, Any], ...]]] = []
        seen: set[int] = set()
        budget = [_LIMIT]

        def visit(v: Any) -> None:
            budget[0] -= 1
            if budget[0] < 0:
                raise _Refuse
            if type(v) in _IMMUTABLE:  # a subclass (``class Cint(int)``) may carry attributes
                return
            if isinstance(v, np.generic) and v.dtype.kind in "biufc":
                return
            if self.is_array(v):
                if isinstance(v, np.ndarray):
                    arrays.append((v, v.shape, v.dtype))
                return
            if type(v) is tuple:
                for x in v:
                    visit(x)
                return
            if type(v) is types.FunctionType:
                if not self.library(v.__module__):
                    function(v)
                return
            if isinstance(v, types.MethodType | functools.partial | _LRU):  # state that can change
                raise _Refuse
            if isinstance(v, types.BuiltinFunctionType):
                return
            if isinstance(v, types.ModuleType):
                if self.library(v.__name__):
                    return
                raise _Refuse
            if isinstance(v, type) or callable(v):
                if self.library(getattr(v if isinstance(v, type) else type(v),
                                        "__module__", None)):
                    return
            raise _Refuse

        def function(fn: types.FunctionType) -> None:
            if id(fn) in seen:
                return
            seen.add(id(fn))
            # its own attributes (k.alpha, keyed by value; set later too): a slot each
            items = tuple(fn.__dict__.items())
            own.append((fn, items))
            for n, x in items:
                if n != "__wrapped__":  # not keyed (functools.wraps)
                    visit(x)
            kwd = fn.__kwdefaults__
            fns.append((fn, fn.__code__, fn.__defaults__, kwd,
                        None if kwd is None else tuple(kwd.items())))
            visit(fn.__defaults__)
            if kwd is not None:
                for x in kwd.values():
                    visit(x)
            for c in fn.__closure__ or ():
                x = c.cell_contents  # ValueError when empty: not recorded
                cells.append((c, x))
                visit(x)
            g = fn.__globals__
            for n in self.names(fn.__code__):
                x = g.get(n, _MISSING)
                globs.append((g, n, x))
                if x is not _MISSING:
                    visit(x)

        for k in kernels:
            function(k)
        return tuple(fns), tuple(cells), tuple(globs), tuple(arrays), tuple(own)


def _holds(checks: tuple[Any, ...]) -> bool:
    """Whether every recorded slot still holds the object it held."""
    fns, cells, globs, arrays, own = checks
    for fn, items in own:
        d = fn.__dict__
        if not d and not items:
            continue
        now = tuple(d.items())
        if len(now) != len(items) or any(
                a != c or b is not d for (a, b), (c, d) in zip(now, items, strict=True)):
            return False
    for fn, code, defaults, kwd, items in fns:
        if fn.__code__ is not code or fn.__defaults__ is not defaults \
                or fn.__kwdefaults__ is not kwd:
            return False
        if items is not None:
            now = tuple(kwd.items())
            if len(now) != len(items) or any(
                    a != c or b is not d for (a, b), (c, d) in zip(now, items, strict=True)):
                return False
    try:
        for c, x in cells:
            if c.cell_contents is not x:
                return False
    except ValueError:  # a cell emptied (``del`` of a closed-over name)
        return False
    for g, n, x in globs:
        if g.get(n, _MISSING) is not x:
            return False
    for a, shape, dtype in arrays:
        if a.shape != shape or a.dtype != dtype:
            return False
    return True

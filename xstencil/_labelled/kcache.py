"""The compile cache, per kernel.

Compiled functions (and inferred windows, and the map fast path's entries)
are cached per *owner*: a kernel or a mesh, held weakly so that the code of
a kernel nobody references any more is dropped with it.

A kernel written inline, ``da.stencil.map(lambda u: u(x=1) - u(x=-1))``, is a
new function object on every call, so caching by identity alone would
recompile it every time (about 40 ms; a Python loop of such calls spends all
its time compiling).  Plain functions are therefore keyed by what decides
their trace: the code object, the defaults, the closure's values and the
global names the code reads, when all of these are hashable values (numbers,
strings, tuples of them) or long-lived objects compared by identity
(modules, functions, classes).  Functions with equal keys share one cache
entry, kept alive for the most recent :data:`SHARED` such keys.  A kernel
that closes over an array, a list or anything else unhashable is cached by
identity, as before.

Like ``jax.jit``, the cache assumes that a global a kernel reads by name
keeps its value: its trace is reused after the global changes only if it is
a module, function or class (identity), never for changed numbers.
"""

from __future__ import annotations

import functools
import threading
import types
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

import numpy as np

__all__ = ["compiled", "table_of", "canonical", "SHARED"]

_CACHE: weakref.WeakKeyDictionary[Any, dict[Any, Any]] = weakref.WeakKeyDictionary()

#: How many structurally keyed kernels stay alive (with their compiled code).
SHARED = 64
_SHAPES: OrderedDict[Hashable, Callable[..., Any]] = OrderedDict()
_LOCK = threading.Lock()
_MISSING = object()
_SCALARS = (bool, int, float, complex, str, bytes, type(None), type(Ellipsis))
_BY_IDENTITY = (types.ModuleType, types.FunctionType, types.BuiltinFunctionType, type,
                types.MethodType)


def _frozen(v: Any) -> Hashable:
    """A hashable stand-in for ``v`` that is equal only for values that trace alike."""
    if isinstance(v, _SCALARS):
        return (type(v), v)
    if isinstance(v, np.generic) and v.dtype.kind in "biufc":
        return (type(v), v.item())
    if isinstance(v, tuple | frozenset):
        return (type(v), tuple(_frozen(x) for x in v))
    if isinstance(v, _BY_IDENTITY):
        # safe: the canonical kernel keeps its own referents alive, so no other
        # live object can share the id
        return ("id", id(v))
    raise TypeError(f"not keyed by value: {type(v).__name__}")


@functools.lru_cache(maxsize=1024)
def _names(code: types.CodeType) -> tuple[str, ...]:
    """Global (and attribute) names read by ``code`` and the code nested in it,
    sorted (cached: this runs on every labelled call)."""
    out = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            out.update(_names(c))
    return tuple(sorted(out))


def _structure(fn: Any) -> Hashable | None:
    """The key that decides ``fn``'s trace, or ``None`` when it has none."""
    if type(fn) is not types.FunctionType:
        return None
    code = fn.__code__
    try:
        g = fn.__globals__
        key = (code, id(g), _frozen(fn.__defaults__),
               _frozen(tuple(sorted((fn.__kwdefaults__ or {}).items()))),
               tuple(_frozen(c.cell_contents) for c in fn.__closure__ or ()),
               tuple((n, _frozen(g[n])) for n in _names(code) if n in g))
        hash(key)
    except (TypeError, ValueError):  # unhashable parts, or an empty closure cell
        return None
    return key


def canonical(owner: Any) -> Any:
    """The object ``owner``'s cache entries live under: ``owner`` itself, or
    the first live function with the same :func:`_structure`."""
    key = _structure(owner)
    if key is None:
        return owner
    with _LOCK:
        first = _SHAPES.get(key)
        if first is None:
            _SHAPES[key] = first = owner
            while len(_SHAPES) > SHARED:
                _SHAPES.popitem(last=False)
        else:
            _SHAPES.move_to_end(key)
    return first


def table_of(owner: Any, create: bool = False) -> dict[Any, Any] | None:
    """The cache table of ``owner`` (``None`` if it has none, or cannot have one)."""
    owner = canonical(owner)
    try:
        return _CACHE.setdefault(owner, {}) if create else _CACHE.get(owner)
    except TypeError:  # not weak-referenceable
        return None


def compiled(owner: Any, key: Any, build: Callable[[], Callable[..., Any]]) -> Callable[..., Any]:
    """A jitted function cached per ``owner`` (a kernel or a mesh) and ``key``.

    ``build`` runs on a miss; it may close over ``owner`` (weakly), which is
    then the canonical owner, since the first call with a structure builds.
    """
    table = table_of(owner, create=True)
    if table is None:  # not weak-referenceable: compile per call
        return build()
    fn = table.get(key)
    if fn is None:
        fn = table[key] = build()
    return fn

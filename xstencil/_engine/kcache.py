"""The compile cache: a cache may only make things faster, never different.

A labelled call compiles its kernels once per *structure* and runs that
compiled function on every later call whose kernels have the same structure,
however they were built (an inline lambda, a kernel defined inside a
function, a mesh rebuilt in a Python loop).  Correctness never rests on the
kernel object being the same; it rests on the rules below.

What a kernel's compiled code may depend on, and how each is treated
(:func:`describe` walks the kernel, the values it closes over, its
defaults, the globals its code reads by name, and the plain functions found
among those, recursively):

* **Arrays** (numpy, JAX, tracers) closed over, used as defaults or read as
  globals (also inside tuples, lists and dicts) are *dynamic inputs* of the
  compiled function, as in equinox's ``filter_jit``: the key holds only their
  shape and dtype, and each call passes the current arrays.  So
  ``lambda u: (u * w).sum()`` with a new ``w`` of the same shape reuses the
  compiled code, and an array changed in place is read afresh.
* **Numbers, strings and other scalars** are part of the key, by exact value
  (``0.0`` and ``-0.0``, or two NaNs with different payloads, are different):
  a new value compiles again, an equal one reuses.  Pass a parameter that
  sweeps many values as a JAX array argument (``map(k, nu)``) to trace it.
* **Plain functions** (helpers) found there are walked the same way, so a
  helper reading a changed global is seen.
* **Modules, classes and other objects** are part of the key by identity, and
  the attributes that any code the walk reaches names (``Cfg.nu``,
  ``config.NU``; ``o.alpha`` in a helper given ``o``; the string constants,
  for ``getattr(o, "alpha")``) are read without running descriptors and
  keyed by value (arrays read this way are keyed by identity and content).
  Library modules, functions and classes (numpy, jax, the standard
  library...) are constants.
* What cannot be seen (a library's descriptor, an unhashable library
  object, a callable that is not a plain function) makes the kernel
  *opaque*: its key then holds the kernel object itself, so no other kernel
  object shares its code (a fresh lambda compiles again), while the values
  that could be seen are still keyed for the same object.  A walk that
  grows too large (:data:`~xstencil._engine.kwalk.BUDGET` values) or too
  deep keys the kernel as *uncached*: every call traces afresh, since a
  value it reads that the walk did not reach may have changed.  An instance of a
  user class with a ``__call__`` method is keyed by identity and by the
  attributes its class's methods name, by value (``k.nu = 0.1`` is seen);
  so are a bound method (``model.step``: the attributes its code names) and
  a ``functools.partial`` (its function and arguments), arrays by content,
  but by their function and object, not their own identity: ``map(m.k)``
  makes a new bound method each call, and reuses the compiled code.
* Arrays reached through an attribute or a bound method are keyed by
  identity and content, not lifted: the kernel's rebuilt copy calls the
  attribute itself, so it would not read a lifted stand-in.

Compiled functions live in one bounded LRU table (:data:`SIZE` entries);
:func:`clear` (public as :func:`xstencil.clear_caches`) empties it.
"""

from __future__ import annotations

import types
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from xstencil._engine.kmemo import Memo
from xstencil._engine.kwalk import (
    BUDGET,
    LOCK,
    SINKS,
    Identity,
    Opaque,
    Walk,
    code_names,
    digest,
    freeze,
    freeze_each,
    instance_key,
    is_array,
    is_library,
    read_names,
    uncached,
)
from xstencil._engine.x64flag import x64

__all__ = ["Lifted", "freeze", "freeze_each", "describe", "rebuild", "snapshot", "cached",
           "current_copy",
           "lru_get", "peek", "put", "compiled", "table_of", "canonical", "clear", "settle",
           "SIZE", "SHARED"]

#: How many compiled functions (and other per-structure entries: inferred
#: windows, fast-path entries; about three per kernel and data layout) stay alive.
SIZE = 128
#: Kept for the sharded backends' per-owner tables (see :func:`compiled`).
SHARED = SIZE
_TABLE: OrderedDict[Hashable, Any] = OrderedDict()
_SINKS = SINKS  # the walker's, written by settle
_LOCK = LOCK

@dataclass(frozen=True)
class Lifted:
    """Kernels split into a hashable ``key`` and their dynamic ``leaves``.

    ``templates`` are the kernels themselves: :func:`rebuild` makes copies
    of them that read given leaves (tracers, inside a trace) instead.
    """

    key: Hashable
    leaves: tuple[Any, ...]
    templates: tuple[Any, ...]
    containers: tuple[tuple[Any, tuple[Any, ...]], ...] = ()  # lists/dicts, their items
    counts: tuple[int, ...] = ()  # how many of ``leaves`` each kernel added, in order


def describe(kernels: Sequence[Any], memo: Any = True) -> Lifted:
    """Split ``kernels`` into a key and dynamic leaves (see the module notes).
    A kernel object described again is checked against a record of what its
    key was read from (:mod:`~xstencil._engine.kmemo`) instead of walked.
    ``memo``: ``True`` the shared record, or a :func:`new_memo` of the caller's
    own (the shared one holds the kernels alive), or ``False``: none."""
    table = _MEMO if memo is True else memo or None
    got = table.get(kernels) if table is not None else None
    if got is None:
        got = _describe(kernels)
        if table is not None:
            table.put(kernels, got)
    _latest(got)
    return got


#: The latest :func:`describe` results of each key, held weakly, newest last:
#: what :func:`rebuild` copies (the newest still alive).  A compiled function
#: cached under a key keeps the kernels it was built from, and JAX traces it
#: again when a later call's other inputs differ in shape (a kernel argument of
#: a new length); that trace must copy the calling kernels, not the first ones,
#: which may read a list, a dict, a DataArray or a mesh (keyed by content)
#: changed in place since: it ran with the first kernel's new values, silently.
#: Several per key: a short-lived description of the same key (a copy traced
#: inside the call) must not hide the calling one once it is gone.
_LATEST: OrderedDict[Hashable, list[weakref.ref[Lifted]]] = OrderedDict()


def _latest(lifted: Lifted) -> None:
    try:
        refs = _LATEST.get(lifted.key)
    except TypeError:  # a key that does not hash (cannot be cached either)
        return
    if refs and refs[-1]() is lifted:  # already the newest: a repeated call
        return
    with _LOCK:
        refs = [r for r in _LATEST.pop(lifted.key, ()) if r() is not None and r() is not lifted]
        refs.append(weakref.ref(lifted))
        _LATEST[lifted.key] = refs[-4:]
        while len(_LATEST) > 4 * SIZE:
            _LATEST.popitem(last=False)


def _newest(lifted: Lifted) -> Lifted:
    """The newest live :func:`describe` result of ``lifted.key`` (``lifted``
    itself if none)."""
    try:
        with _LOCK:
            refs = list(_LATEST.get(lifted.key, ()))
    except TypeError:
        return lifted
    for r in reversed(refs):
        got = r()
        if got is not None:
            return got
    return lifted


def new_memo() -> Memo:
    """A small :func:`describe` record of one owner's own (it lives as long as
    the owner, and holds only the owner's kernels)."""
    return Memo(code_names, is_library, is_array, size=4)


def _describe(kernels: Sequence[Any]) -> Lifted:
    w = Walk()
    keys: list[Hashable] = []
    counts: list[int] = []
    for k in kernels:
        if type(k) is not types.FunctionType:
            keys.append(instance_key(w, k))
            counts.append(0)
            continue
        start = len(w.leaves)
        w.opaque = False
        w.budget = BUDGET
        try:
            key = w.late(w.function(k)[0])
        except (Opaque, TypeError, RecursionError):
            del w.leaves[start:]
            key = uncached(k)
        if w.opaque:
            key = ("opaque", Identity(k), key)
        keys.append(key)
        counts.append(len(w.leaves) - start)
    return Lifted(tuple(keys), tuple(w.leaves), tuple(kernels), tuple(w.containers),
                  tuple(counts))


_MEMO = Memo(code_names, is_library, is_array)


def settle(lifted: Lifted) -> None:
    """After a call that may have traced: a list or dict the trace wrote to
    (``calls.append(1)`` in a kernel) becomes a sink, keyed by identity from
    now on, so that the write does not make every later call a miss."""
    for v, items in lifted.containers:
        now = list(v.items()) if isinstance(v, dict) else list(enumerate(v))
        if len(now) != len(items) or any(
                a != c or b is not d for (a, b), (c, d) in zip(now, items, strict=True)):
            with _LOCK:
                _SINKS[id(v)] = (v,)
                while len(_SINKS) > SIZE:
                    _SINKS.popitem(last=False)


def rebuild(lifted: Lifted, leaves: Sequence[Any]) -> list[Any]:
    """Copies of ``lifted.templates`` reading ``leaves`` instead of their own:
    those of the kernels described last under the same key (see :data:`_LATEST`)."""
    lifted = _newest(lifted)
    it = iter(leaves)
    w = Walk(subst=it)
    out = []
    for k, key in zip(lifted.templates, lifted.key, strict=True):  # type: ignore[arg-type]
        if key[0] == "callable":
            out.append(k)
        else:
            out.append(w.function(k)[1])
    return out


def current_copy(lifted: Lifted) -> list[Any]:
    """Copies of the newest kernels described under ``lifted.key`` (see
    :data:`_LATEST`) reading copies, taken now, of their numpy arrays: for a
    compiled function that bakes a kernel's arrays in, called at trace time
    (a trace of a cached function for new shapes must bake the calling
    kernel's values, not the first's, changed in place since)."""
    new = _newest(lifted)
    return rebuild(new, [v.copy() if isinstance(v, np.ndarray) else v for v in new.leaves])


def snapshot(kernels: Sequence[Any]) -> tuple[Any, ...]:
    """Copies of ``kernels`` that read copies, taken now, of the numpy arrays
    they close over: for a lazy graph, computed later.  An array changed in
    place after the call must change neither the result (an in-memory call
    reads it when called) nor the compiled code cached under the token of
    its old values (dask.py keys blocks by the arrays' contents)."""
    lifted = describe(kernels)
    if not any(isinstance(v, np.ndarray) for v in lifted.leaves):
        return tuple(kernels)
    return tuple(rebuild(lifted, [v.copy() if isinstance(v, np.ndarray) else v
                                  for v in lifted.leaves]))


def lru_get(table: OrderedDict[Any, Any], lock: Any, size: int, key: Hashable,
            build: Callable[[], Any]) -> Any:
    """The entry for ``key`` in the LRU ``table`` (at most ``size`` entries,
    guarded by ``lock``), built on a miss outside the lock."""
    with lock:
        got = table.get(key, table)
        if got is not table:
            table.move_to_end(key)
            return got
    value = build()
    with lock:
        value = table.setdefault(key, value)
        while len(table) > size:
            table.popitem(last=False)
    return value


def cached(key: Hashable, build: Callable[[], Any]) -> Any:
    """The entry for ``key`` in the shared LRU table, built on a miss.  JAX's
    x64 flag is part of every key: an entry traced with it off (inside a
    caller's transform) holds 32-bit traces that a 64-bit call must not reuse."""
    return lru_get(_TABLE, _LOCK, SIZE, (key, x64()), build)


def peek(key: Hashable) -> Any:
    """The entry for ``key``, or ``None``."""
    with _LOCK:
        return _TABLE.get((key, x64()))


def put(key: Hashable, value: Any) -> None:
    with _LOCK:
        _TABLE[(key, x64())] = value
        while len(_TABLE) > SIZE:
            _TABLE.popitem(last=False)


def clear() -> None:
    """Empty the compile cache (compiled functions, windows, fast-path entries)."""
    with _LOCK:
        _TABLE.clear()
        _SINKS.clear()
        _LATEST.clear()
    _MEMO.clear()
    code_names.cache_clear()
    read_names.cache_clear()


# -- the per-owner API of the sharded backends ------------------------------------------

def canonical(owner: Any) -> Any:
    """``owner`` itself: code is shared between kernel objects only through
    :func:`describe` keys, never by substituting one kernel for another."""
    return owner


def table_of(owner: Any, create: bool = False) -> dict[Any, Any] | None:
    """A per-owner table inside the shared LRU table, keyed by the owner's
    :func:`describe` key (so a changed global or attribute gives a new table)."""
    if hasattr(owner, "_regions"):  # a mesh: its kernels may change
        key: Hashable = ("owner", Identity(owner))
    else:
        lifted = describe([owner])
        # the code built on a miss bakes in the owner's own arrays: no sharing then
        key = ("owner", lifted.key, Identity(owner) if lifted.leaves else None)
    return cached(key, dict) if create else peek(key)


def compiled(owner: Any, key: Any, build: Callable[[], Callable[..., Any]]) -> Callable[..., Any]:
    """A function cached per ``owner`` (a kernel or a mesh) and ``key``."""
    table = table_of(owner, create=True)
    assert table is not None
    key = (key, x64())
    fn = table.get(key)
    if fn is None:
        fn = table[key] = build()
    return fn


def values_key(kernels: Sequence[Any], lifted: Lifted | None = None) -> Any:
    """What ``kernels`` read, by value: their :func:`describe`
    key (globals and closed-over values) and a digest of each array they close
    over.  The loops of ``iterate`` and ``solve`` trace the body with those
    arrays as constants, so an array changed in place or a global rebound to
    a new array of the same shape must give a new key (it reused the loop
    compiled with the old values); a traced array is keyed by identity.
    ``lifted``: ``describe(kernels)`` if the caller has it."""
    if lifted is None:
        lifted = describe(list(kernels))
    leaves = []
    for v in lifted.leaves:
        if isinstance(v, jax.core.Tracer):
            leaves.append(Identity(v))
            continue
        leaves.append(digest(v))
    return lifted.key, tuple(leaves)

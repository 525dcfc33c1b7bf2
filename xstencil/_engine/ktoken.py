"""A deterministic dask token for kernels (see :mod:`xstencil._engine.kcache`).

dask tokenizes an importable module-level function by its name, so a graph
of a kernel reading a changed module global would keep its name, and the
per-process compiled block function keyed by it would be stale.  Kernels are
therefore tokenized by their :func:`~xstencil._engine.kcache.describe` key
and the arrays they close over.
"""

from __future__ import annotations

import hashlib
import itertools
import marshal
import types
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

from xstencil._engine.kcache import SIZE, Identity, describe

__all__ = ["token_parts"]

_SERIALS: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
_STRONG: OrderedDict[int, tuple[Any, int]] = OrderedDict()
_COUNT = itertools.count()


def _serial(obj: Any) -> int:
    """A number never reused for another object in this process."""
    try:
        got = _SERIALS.get(obj)
        if got is None:
            got = _SERIALS[obj] = next(_COUNT)
        return got
    except TypeError:  # not weak-referenceable (or unhashable): kept alive
        held = _STRONG.get(id(obj))
        if held is None or held[0] is not obj:
            held = _STRONG[id(obj)] = (obj, next(_COUNT))
            while len(_STRONG) > 4 * SIZE:
                _STRONG.popitem(last=False)
        return held[1]


def _plain(key: Any) -> Any:
    if isinstance(key, tuple):
        return tuple(_plain(k) for k in key)
    if isinstance(key, types.CodeType):
        return ("code", hashlib.sha1(marshal.dumps(key)).hexdigest())
    if isinstance(key, Identity):
        return ("id", type(key.obj).__qualname__, _serial(key.obj))
    if isinstance(key, type):
        return ("type", key.__module__, key.__qualname__, _serial(key))
    return key


def token_parts(part: Any) -> Any:
    """``part`` with kernels (a callable, or a sequence of them) replaced by a
    tokenizable description: their :func:`describe` key as a string, and the
    arrays they close over.  dask tokenizes a module-level function by its
    name, which would miss a changed global it reads."""
    if callable(part) and not isinstance(part, type):
        kernels: Sequence[Any] = [part]
    elif isinstance(part, tuple | list) and part and all(callable(p) for p in part):
        kernels = part
    else:
        return part
    lifted = describe(kernels)
    return ("xstencil-kernels", repr(_plain(lifted.key)),
            tuple(np.asarray(x) for x in lifted.leaves))

"""What the dask map and the dask scan share: detection, the per-process
compile cache, graph tokens, chunk advice and the progress display.

The block functions dask runs on workers (:class:`~xstencil._backends.dask.
BlockMap`, :class:`~xstencil._backends.dask_scan.BlockScan`) look their
compiled code up here, keyed by a token of the kernel and the options computed
once on the client (:func:`token`).  A kernel pickled to a worker is a new
object on every task; keying by the token, not by the object, is what keeps a
worker at one compile per block geometry.
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from xstencil._engine.kcache import lru_get
from xstencil._engine.ktoken import token_parts
from xstencil._errors import XStencilError

__all__ = ["any_dask", "cached", "clear_cache", "compile_count", "is_dask", "merged",
           "note_trace", "token", "with_progress"]

# The per-process compile cache: token -> jitted block function.  It is the one
# piece of module state in xstencil, and exists because dask ships kernels to
# worker processes as fresh objects on every task (see the module docstring).
_CACHE_SIZE = 64
_cache: OrderedDict[Any, Callable[..., Any]] = OrderedDict()
_lock = threading.Lock()
_traces = [0]


def is_dask(x: Any) -> bool:
    """Whether ``x`` is a dask array (without importing dask)."""
    if "dask.array" not in sys.modules:
        return False
    import dask.array as dsa

    return isinstance(x, dsa.Array)


def any_dask(arrays: Sequence[Any]) -> bool:
    """Whether any of ``arrays`` is a dask array."""
    return any(is_dask(x) for x in arrays)


def compile_count() -> int:
    """How many block functions this process has traced (and so compiled):
    jitted XLA block functions and, for map blocks on the CPU loop backend,
    their loop nests.

    Run it on workers with ``client.run(xstencil.compile_count)`` to
    check that a graph compiles once per block geometry, not once per task.
    """
    return _traces[0]


def note_trace() -> None:
    """Count one trace of a block function (call it inside the traced code)."""
    _traces[0] += 1


def clear_cache() -> None:
    """Drop this process's compiled block functions."""
    with _lock:
        _cache.clear()


def cached(key: Any, build: Callable[[], Callable[..., Any]]) -> Callable[..., Any]:
    """The compiled block function for ``key``, built on a miss."""
    fn: Callable[..., Any] = lru_get(_cache, _lock, _CACHE_SIZE, key, build)
    return fn


def token(call: str, *parts: Any) -> str:
    """A deterministic name for the graph and the compile cache.

    dask tokenizes functions by pickling them; an object it cannot tokenize
    deterministically (an unpicklable kernel, say one closing over a lock)
    would get a random token, so every call would recompile and name a new
    graph.  That is an error here, not a silent slowdown.  Kernels are
    tokenized by what they read (:func:`~xstencil._engine.ktoken.token_parts`):
    dask tokenizes a module-level function by its name, which would miss a
    changed global it reads.
    """
    import dask
    from dask.base import tokenize

    try:
        with dask.config.set({"tokenize.ensure-deterministic": True}):
            return tokenize(*[token_parts(p) for p in parts])
    except Exception as e:  # dask raises RuntimeError, or the pickler's own error
        raise XStencilError(
            f"{call}: the kernel or its arguments cannot be tokenized deterministically by "
            f"dask ({type(e).__name__}: {e}), so the compiled code could not be reused and "
            f"the graph would get a new name on every call; make the kernel picklable (a "
            f"module-level function, closing over picklable values), or .compute() the data "
            f"and run in memory") from e


def merged(chunks: tuple[int, ...], depth: int) -> tuple[int, ...] | int:
    """``chunks`` with every chunk smaller than ``depth`` merged into a neighbour
    (the chunks an error message suggests)."""
    out: list[int] = []
    for c in chunks:
        if out and (c < depth or out[-1] < depth):
            out[-1] += c
        else:
            out.append(c)
    return tuple(out) if len(out) > 1 else out[0]


def with_progress(obj: Any) -> Any:
    """``obj`` computed now and kept chunked, under dask's progress display.

    ``obj`` is a dask collection (a dask array, or a DataArray or Dataset
    backed by them); anything else is returned as it is.  With a distributed
    ``Client`` as the default scheduler, the result is persisted on the
    cluster under ``distributed.progress`` (a text bar, or a widget in a
    notebook); otherwise it is persisted with the local scheduler under a
    :class:`dask.diagnostics.ProgressBar` (printed to stdout).
    """
    import dask

    if not dask.is_dask_collection(obj):
        return obj
    client = None
    if "distributed" in sys.modules:
        from distributed import default_client

        try:
            client = default_client()
        except ValueError:  # no client: a local scheduler
            client = None
    if client is not None:
        from distributed import progress

        out = client.persist(obj)
        progress(out)
        return out
    from dask.diagnostics import ProgressBar

    with ProgressBar():
        return dask.persist(obj)[0]

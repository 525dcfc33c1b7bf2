"""A warning when the process forks after JAX has started.

JAX's runtime is multithreaded, so a child made by ``os.fork`` (the default
start method of ``multiprocessing`` and ``ProcessPoolExecutor`` on Linux)
after JAX has run can deadlock: a JAX call in the child may hang forever.
xstencil cannot make that safe; it warns in the parent, naming the fix: the
``spawn`` (or ``forkserver``) start method, see :doc:`/performance`.
"""

from __future__ import annotations

import os
import warnings

from jax._src import xla_bridge

__all__ = ["ForkAfterJaxWarning", "warn_fork"]


class ForkAfterJaxWarning(RuntimeWarning):
    """The process forks after JAX has started; JAX calls in the child may hang."""


def warn_fork() -> None:
    """``os.register_at_fork(before=...)`` hook: warn if JAX's runtime is up."""
    try:
        started = xla_bridge.backends_are_initialized()
    except Exception:  # a private JAX helper: never break a fork
        return
    if started:
        warnings.warn(
            "os.fork() after JAX has started: JAX calls (and xstencil maps and scans) in "
            "the child process may hang (JAX's runtime is multithreaded). Use the 'spawn' "
            "start method: multiprocessing.get_context('spawn'), or "
            "ProcessPoolExecutor(mp_context=multiprocessing.get_context('spawn'))",
            ForkAfterJaxWarning, stacklevel=2)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=warn_fork)

"""Progress bars fed from inside compiled loops.

A scan with ``progress=True`` opens a :class:`Progress` around the compiled
call.  The loop calls :func:`report` through ``jax.debug.callback`` every few
steps, with the bar's integer token as an argument, so the compiled code does
not depend on which bar is open and is reused between calls.  Bars are
registered only while their call runs; the bar is closed, and unregistered,
when the call returns, fails or is interrupted (``KeyboardInterrupt``), after
``jax.effects_barrier()`` has flushed every pending callback.
"""

from __future__ import annotations

import itertools
import threading
from types import TracebackType
from typing import Any

import jax

__all__ = ["Progress", "report", "every"]

# open bars by token; entries live only inside a ``with Progress(...)`` block
_OPEN: dict[int, Any] = {}
_TOKENS = itertools.count(1)
_LOCK = threading.Lock()


#: A callback from compiled code measured about 1 ms on this project's 2-core
#: CPU machine (more when it is loaded: the host thread must be scheduled),
#: while a 5-point stencil step costs about 0.2 ns per cell there.  A chunk of
#: steps between updates does at least this many cell updates (~200 ms of
#: such work), so that updates stay under 1% of the run time; with 10^8 the
#: 2-D heat benchmark (512², 5,000 steps) paid +7% for its 13 updates.
CELLS_PER_UPDATE = 1_000_000_000


def every(steps: int, cells: int = 1, updates: int = 25) -> int:
    """Steps between updates: at most ``updates`` over the run, and no more
    often than every :data:`CELLS_PER_UPDATE` cell updates (``cells`` per
    step).  The bar is completed when the call returns in any case."""
    by_count = -(-steps // updates)
    by_work = -(-CELLS_PER_UPDATE // max(cells, 1))
    return max(1, by_count, by_work)


def report(token: Any, done: Any) -> None:
    """Move bar ``token`` to ``done`` steps (called from compiled code)."""
    with _LOCK:
        bar = _OPEN.get(int(token))
    if bar is not None:
        done = int(done)
        if done > bar.n:
            bar.update(done - bar.n)


def callback(token: Any, done: Any) -> None:
    """What compiled loops call back: :func:`report`, noting on the bar a
    Ctrl-C that arrives inside it (the runtime re-raises it wrapped in its own
    error; :attr:`Progress.interrupted` tells the caller to raise a
    KeyboardInterrupt instead)."""
    try:
        report(token, done)
    except KeyboardInterrupt:
        with _LOCK:
            bar = _OPEN.get(int(token))
        if bar is not None:
            bar.interrupted = True
        raise


class Progress:
    """A tqdm bar of ``total`` steps, open for the duration of a ``with`` block.

    Examples
    --------
    >>> from xstencil._progress import Progress, report
    >>> with Progress(10, "demo", disable=True) as p:
    ...     report(p.token, 10)
    >>> p.closed
    True
    """

    def __init__(self, total: int, desc: str, disable: bool = False):
        self.total = total
        self.desc = desc
        self.disable = disable
        self.token = next(_TOKENS)
        self.bar: Any = None
        self.closed = False

    def __enter__(self) -> Progress:
        from tqdm.auto import tqdm

        class _Bar(tqdm):  # type: ignore[misc, valid-type]
            monitor_interval = 0  # no monitor thread left behind

        self.bar = _Bar(total=self.total, desc=self.desc, unit="step", disable=self.disable,
                        leave=True)
        with _LOCK:
            _OPEN[self.token] = self.bar
        return self

    @property
    def interrupted(self) -> bool:
        """Whether a KeyboardInterrupt arrived inside a progress callback."""
        return bool(getattr(self.bar, "interrupted", False))

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            if kind is None:
                jax.effects_barrier()
                if self.bar.n < self.total:
                    self.bar.update(self.total - self.bar.n)
        finally:
            with _LOCK:
                _OPEN.pop(self.token, None)
            self.bar.close()
            self.closed = True

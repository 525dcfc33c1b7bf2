"""Progress bars fed from inside compiled loops.

A scan with ``progress=True`` opens a :class:`Progress` around the compiled
call.  The loop calls :func:`report` through ``jax.debug.callback`` every few
steps, with the bar's integer token as an argument, so the compiled code does
not depend on which bar is open and is reused between calls.

The scans adapt the update rate to the run (:func:`advance`,
:func:`report_if_due`): the loop tests for a due report every
:func:`check_every` steps in memory, after each block of ``halo_every``
steps when sharded (a scalar compare), and at a report the host answers,
from the measured speed, the step count of the next one, about
:data:`INTERVAL` seconds ahead.  So the bar
moves every 0.1-0.5 s whatever the grid size, kernel or device, and the
callbacks (1-2 ms each on a loaded 2-core CPU, about 5 per second) cost
about 1 % of the run (``benchmarks/progress.py`` measures it).  Bars are
registered only while their call runs; the bar is closed, and unregistered,
when the call returns, fails or is interrupted (``KeyboardInterrupt``), after
``jax.effects_barrier()`` has flushed every pending callback.

Scans that run as numba loops (:mod:`xstencil._labelled.loop_scan`) drive
their time loop from Python and call :func:`advance` there, between two
steps, when the step count it answered comes due: the same bar, label and
update rule, without a compiled callback (so without its cost).

Ctrl-C: while a bar is open in the main thread, SIGINT only sets the bar's
``interrupted`` flag; the next :func:`report` from the loop then raises
:class:`Interrupted`, which aborts the compiled call (within one update
interval, instead of at the end of the run), and the caller turns the failed
call into ``KeyboardInterrupt`` by that flag (never by an error's text).  A
second Ctrl-C interrupts at once, as Python does by default.
"""

from __future__ import annotations

import importlib.util
import itertools
import logging
import signal
import sys
import threading
import time
from types import TracebackType
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import io_callback

__all__ = ["Progress", "Interrupted", "Ticker", "report", "callback", "advance", "report_if_due",
           "check_every", "label"]

# open bars by token; entries live only inside a ``with Progress(...)`` block
_OPEN: dict[int, Any] = {}
_TOKENS = itertools.count(1)
_LOCK = threading.Lock()


class Interrupted(Exception):
    """Raised from a progress callback to abort a compiled loop after Ctrl-C."""


class _QuietInterrupt(logging.Filter):
    """Drop JAX's log of the :class:`Interrupted` raised to abort a loop."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, Interrupted)


# jax.debug.callback (report) and jax.experimental.io_callback (advance, the
# adaptive loops) each log a failed callback with its own logger
for _name in ("jax._src.debugging", "jax._src.callback"):
    logging.getLogger(_name).addFilter(_QuietInterrupt())


#: Seconds between bar updates that :func:`advance` aims for.
INTERVAL = 0.2

#: Cell updates between two tests for a due report in an adaptive loop: about
#: 2 ms of 5-point work on a CPU core, so the scalar test costs nothing.
CELLS_PER_CHECK = 10_000_000

_NEVER = np.int32(np.iinfo(np.int32).max)


def check_every(steps: int, cells: int = 1) -> int:
    """Steps between the loop's tests for a due report (:func:`advance`):
    about :data:`CELLS_PER_CHECK` cell updates (``cells`` per step), and at
    least 200 tests over the run when the run is long enough."""
    by_work = -(-CELLS_PER_CHECK // max(cells, 1))
    return max(1, min(by_work, -(-steps // 200)))


def advance(token: Any, done: Any) -> np.int32:
    """Move bar ``token`` to ``done`` steps (:func:`report`) and return the
    step count at which the loop should report next (called from compiled
    code): :data:`INTERVAL` seconds ahead at the speed measured since the last
    report (since the bar opened, for the first report: so a run shorter than
    :data:`INTERVAL` makes one callback, not two), and at the next test while
    the speed is not known."""
    callback(token, done)
    with _LOCK:
        bar = _OPEN.get(int(token))
    if bar is None:
        return _NEVER
    done, now = int(done), time.perf_counter()
    last = getattr(bar, "_xstencil_last", None)
    bar._xstencil_last = (done, now)
    if last is None or done <= last[0] or now <= last[1]:
        return np.int32(done + 1)
    rate = (done - last[0]) / (now - last[1])
    return np.int32(min(done + max(1, int(rate * INTERVAL)), int(_NEVER)))


def report_if_due(token: Any, done: Any, due: Any, gate: Any = True) -> Any:
    """In compiled code, after ``done`` steps: if a report is ``due`` (and
    ``gate``), call :func:`advance` on the host, which moves the bar and
    answers the step count of the next report; return that count (``due``
    when no report was due).  A ``while_loop`` of zero or one trip, not a
    ``cond``: JAX cannot vmap a ``cond`` holding an ``io_callback``."""
    done = jnp.asarray(done, jnp.int32)
    return lax.while_loop(lambda d: gate & (done >= d), lambda d: io_callback(
        advance, jax.ShapeDtypeStruct((), jnp.int32), token, done, ordered=False), due)


def label(call: str) -> str:
    """The bar's label for a call: ``"da.stencil.mesh(...).scan()"`` reads
    ``"da.stencil.mesh(...).scan"``, ``"da.stencil.scan(...)"`` reads
    ``"da.stencil.scan"``."""
    for tail in ("(...)", "()"):
        if call.endswith(tail):
            return call[: -len(tail)]
    return call


def _bar_class() -> Any:
    """tqdm's widget bar in a Jupyter kernel with ipywidgets, else its text bar
    (``tqdm.auto`` warns with a ``TqdmWarning`` in a notebook without
    ipywidgets)."""
    from tqdm.std import tqdm as text_bar

    shell = sys.modules.get("IPython")
    ip = shell.get_ipython() if shell is not None else None  # type: ignore[attr-defined]
    if ip is None or "IPKernelApp" not in getattr(ip, "config", {}):
        return text_bar
    if importlib.util.find_spec("ipywidgets") is None:
        return text_bar
    try:
        from tqdm.notebook import IProgress
        from tqdm.notebook import tqdm as widget_bar
    except ImportError:
        return text_bar
    return text_bar if IProgress is None else widget_bar


def report(token: Any, done: Any) -> None:
    """Move bar ``token`` to ``done`` steps (called from compiled code); raise
    :class:`Interrupted` if Ctrl-C was pressed while the bar was open."""
    with _LOCK:
        prog = _OPEN.get(int(token))
    if prog is not None:
        if prog.interrupted:
            raise Interrupted("interrupted by Ctrl-C")
        bar = prog.bar
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
            prog = _OPEN.get(int(token))
        if prog is not None:
            prog.interrupted = True
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
        self.interrupted = False
        self._handler: Any = None

    def __enter__(self) -> Progress:
        base = _bar_class()
        widget = base.__module__ == "tqdm.notebook"

        class _Bar(base):  # type: ignore[misc, valid-type]
            monitor_interval = 0  # no monitor thread left behind

        self.bar = _Bar(total=self.total, desc=self.desc, unit="step", disable=self.disable,
                        leave=True, **({"display": False} if widget else {}))
        if widget and not self.disable:
            # shown with a display id, so that closing updates the saved text too
            from IPython.display import display

            self._shown = display(self.bar.container, display_id=True)
        self._xstencil_last = (0, time.perf_counter())  # the clock of advance()
        with _LOCK:
            _OPEN[self.token] = self
        if threading.current_thread() is threading.main_thread():
            self._handler = signal.getsignal(signal.SIGINT)
            signal.signal(signal.SIGINT, self._sigint)
        return self

    def _sigint(self, signum: int, frame: Any) -> None:
        if self.interrupted:  # a second Ctrl-C: at once
            raise KeyboardInterrupt
        self.interrupted = True

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            if kind is None and not self.interrupted:
                jax.effects_barrier()
                if self.bar.n < self.total:
                    self.bar.update(self.total - self.bar.n)
        finally:
            with _LOCK:
                _OPEN.pop(self.token, None)
            if self._handler is not None:
                signal.signal(signal.SIGINT, self._handler)
                self._handler = None
            self.bar.close()
            self.closed = True
            shown = getattr(self, "_shown", None)
            if shown is not None:
                shown.update(self.bar.container)  # the saved text/plain reads 100 %


class Ticker:
    """When a Python time loop (the loop backend's) moves bar ``token``:
    called after step ``done`` when the step count it last returned comes
    due, it returns the next one.

    It reports (:func:`advance`, the XLA loop's rule: the next report about
    :data:`INTERVAL` seconds ahead at the speed measured since the last) when
    that report is due, and in between reads the clock four times per
    interval at that speed, to report early once ``INTERVAL`` seconds have
    passed: a loop that slows down by a factor ``f`` mid-interval still
    reports within about ``INTERVAL * (1 + f / 4)`` seconds, not
    ``INTERVAL * f``.  A Ctrl-C noted by the bar ends the loop as
    ``KeyboardInterrupt`` (the XLA loop's caller turns the aborted call into
    the same).
    """

    __slots__ = ("token", "at", "next", "every")

    def __init__(self, token: int):
        self.token, self.at, self.next, self.every = token, 0.0, 1, 1

    def __call__(self, done: int) -> int:
        now = time.perf_counter()
        if done >= self.next or now - self.at >= INTERVAL:
            try:
                self.next = int(advance(self.token, done))
            except Interrupted:
                raise KeyboardInterrupt from None
            self.at, self.every = now, max(1, (self.next - done) // 4)
        return min(self.next, done + self.every)

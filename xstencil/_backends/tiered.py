"""Loop nests that run serially until their parallel build is ready.

numba compiles a nest with ``parallel=True`` in two to three times the time
of the same nest compiled serially: its parfor passes outline the loop body
into a gufunc and optimise it again.  Measured on the shared 2-core machine
(session 20, AMD EPYC host, numba already started), a map's first call,
compile included: the 5-point periodic Laplacian at 1024², 0.83 s parallel
against 0.27 s serial; a 5 x 5 weighted sum, nest alone, 1.14-1.16 s
against 0.42-0.43 s.  Most maps in a script or a test run a few times, where
the compile is the whole cost; a map in a time loop runs thousands of times,
where the parallel nest's speed is (0.75 against 1.33 ms for the 5 x 5 at
1024²).

:class:`Tiered` serves both.  Its first call compiles the nest serially
(``nogil``, so dask's threads still run blocks side by side) and runs it.
Once the serial runs have taken :func:`promote_after` seconds in all
(:data:`PROMOTE_AFTER`; ``XSTENCIL_PROMOTE_AFTER`` overrides it, and ``0``
compiles the parallel nest on the first call, as before), a background
thread compiles the parallel nest for every argument-type signature the
serial one has, and the calls after it is ready run it (the serial time
counts runs, not the serial compile).  Both builds come
from the same source and compute every output element with the same
operations in the same order (no reduction crosses rows, numba contracts
no FMA without ``fastmath``), so the results are bitwise the same whichever
ran: promotion changes the speed, never the numbers (the tests check this).

The background thread is one for the process, compiles one nest at a time,
and ends when its queue is empty.  It is not a daemon: at exit it finishes the compile
under way (a thread killed inside LLVM can crash the exit) and drops the
rest.  ``os.fork`` waits for the compile under way (numba's compiler lock
must not be held in the child), and the child forgets the queue: its nests
are promoted again as they run.  :func:`settle` promotes every nest that has
run and waits for the queue to empty, for benchmarks that measure the steady
state.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from xstencil._backends.loopcache import njit_source

try:
    import numba
except ImportError:  # pragma: no cover - exercised where numba is absent
    numba = None

__all__ = ["ENV", "PROMOTE_AFTER", "Tiered", "eager", "from_source", "promote_after", "settle"]

#: The environment variable that sets :func:`promote_after`.
ENV = "XSTENCIL_PROMOTE_AFTER"
#: Seconds of serial run time after which a nest's parallel build is made.
PROMOTE_AFTER = 0.25

_LOG = logging.getLogger("xstencil.loops")


def promote_after() -> float:
    """The serial run time, in seconds, after which a nest is promoted:
    ``XSTENCIL_PROMOTE_AFTER`` where set, else :data:`PROMOTE_AFTER`."""
    text = os.environ.get(ENV)
    if text is None or not text.strip():
        return PROMOTE_AFTER
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value >= 0:  # NaN too
        raise ValueError(f"{ENV}={text!r} is not a number of seconds >= 0; set it to e.g. "
                         f"'{PROMOTE_AFTER}' (the default), or '0' to compile loop nests "
                         "in parallel on their first call")
    return value


class Tiered:
    """A loop nest, called as its numba function is: serial first, parallel
    once promoted (see the module notes).

    ``make(parallel)`` makes the numba dispatcher of the nest, serial or
    parallel; ``after`` is :func:`promote_after` when the nest was made.
    """

    def __init__(self, make: Callable[[bool], Any], after: float):
        self._make = make
        self.after = after
        self.serial: Any = None
        self.parallel: Any = None  # the parallel dispatcher, once it has a signature
        self.spent = 0.0  # seconds the serial build has run
        self.failed = False  # the parallel build failed: serial for good
        self.ran: str | None = None  # the build the last call ran ("serial", "parallel")
        self._queued = False
        self._par: Any = None  # the parallel dispatcher while it is being built
        self._lock = threading.Lock()

    def __call__(self, *args: Any) -> Any:
        par = self.parallel
        if par is not None:
            try:
                res = par(*args)
            except TypeError:  # argument types it has no build for (compile is disabled)
                pass
            else:
                self.ran = "parallel"
                return res
        if self.after <= 0 and not self.failed:
            fn = self.dispatcher(args)
            res = fn(*args)
            self.ran = "parallel" if fn is self.parallel else "serial"
            return res
        serial = self._serial()
        known = len(serial.overloads)
        t0 = time.perf_counter()
        res = serial(*args)
        took = time.perf_counter() - t0
        self.ran = "serial"
        if len(serial.overloads) == known:  # a run, not a compile: it counts
            self.spent += took
            if self.spent >= self.after and not self.failed:
                self._request()
        return res

    def _serial(self) -> Any:
        serial = self.serial
        if serial is None:
            with self._lock:
                if self.serial is None:
                    self.serial = self._make(False)
                    _RAN.add(self)
                serial = self.serial
        return serial

    def _request(self) -> None:
        with self._lock:
            if self._queued:
                return
            self._queued = True
        _submit(self)

    def _build(self) -> None:
        """Compile the parallel nest for every signature of the serial one
        (the background thread's work)."""
        try:
            t0 = time.perf_counter()
            par = self._parallel_for([] if self.serial is None else list(self.serial.signatures))
            if par is not None and par.signatures:
                self.parallel = par
                _LOG.debug("parallel loop nest ready in %.2f s", time.perf_counter() - t0)
        finally:
            with self._lock:
                self._queued = False

    def _parallel_for(self, sigs: list[Any]) -> Any:
        """The parallel dispatcher, built for every signature in ``sigs``
        (after another build under way, and holding off ``os.fork``), or
        ``None`` where that fails: the nest then stays serial for good."""
        try:
            with _BUILDING:
                with self._lock:
                    if self._par is None:
                        self._par = self._make(True)
                    par = self._par
                for sig in sigs:
                    if sig not in par.overloads:
                        _compile(par, sig)
            return par
        except Exception as e:  # noqa: BLE001 - the serial nest stays, and is right
            self.failed = True
            _LOG.info("loop nest stays serial: its parallel build failed: %s: %s",
                      type(e).__name__, e)
            return None

    def dispatcher(self, args: tuple[Any, ...]) -> Any:
        """The numba dispatcher built now for ``args``' types: the parallel
        one (after the background build under way, if any), or the serial
        one where the parallel build fails (the same numbers); for callers
        that compile code around the nest (the loop scans' time-loop
        driver) and for a threshold of 0."""
        types = tuple(numba.typeof(a) for a in args)
        par = None if self.failed else self._parallel_for([types])
        if par is not None:
            self.parallel = par
            return par
        serial = self._serial()
        if types not in serial.overloads:
            serial.compile(types)
        return serial


_EAGER: contextvars.ContextVar[bool] = contextvars.ContextVar("xstencil_tiered_eager",
                                                              default=False)


@contextlib.contextmanager
def eager(on: bool = True) -> Iterator[None]:
    """Within it (where ``on``), :func:`from_source` makes nests that take
    their parallel build on their first call: for a scan long enough for its
    time-loop driver, which needs that build anyway, so that its first step
    does not compile a serial one too."""
    token = _EAGER.set(on)
    try:
        yield
    finally:
        _EAGER.reset(token)


def from_source(source: str, label: str) -> Tiered:
    """The :class:`Tiered` nest of a generated source (``label`` names it
    in tracebacks): each build compiles on first use, or loads from numba's
    disk cache (:func:`~xstencil._backends.loopcache.njit_source`)."""
    def make(parallel: bool) -> Any:
        if parallel:
            return njit_source(source, label, parallel=True, error_model="numpy")
        return njit_source(source, label, error_model="numpy", nogil=True)

    after = promote_after()
    return Tiered(make, 0.0 if _EAGER.get() else after)


def _compile(par: Any, types: Any) -> None:
    """Build ``par`` for argument ``types``; new types at call time stay
    refused (a ``TypeError``: :class:`Tiered` runs the serial nest)."""
    par.disable_compile(False)
    try:
        par.compile(types)
    finally:
        par.disable_compile(True)


_QUEUE: collections.deque[Tiered] = collections.deque()
_COND = threading.Condition()
_BUILDING = threading.RLock()  # held while a parallel build runs (and across os.fork)
_WORKER: list[threading.Thread] = []
_RAN: weakref.WeakSet[Tiered] = weakref.WeakSet()  # nests that have run (for settle)


def _submit(t: Tiered) -> None:
    with _COND:
        _QUEUE.append(t)
        if not _WORKER or not _WORKER[0].is_alive():
            worker = threading.Thread(target=_work, name="xstencil-promote", daemon=False)
            _WORKER[:] = [worker]
            worker.start()
        _COND.notify_all()


def _work() -> None:
    while True:
        with _COND:
            if not _QUEUE or not threading.main_thread().is_alive():  # done, or exiting
                for t in _QUEUE:
                    t._queued = False
                _QUEUE.clear()
                _WORKER.clear()
                _COND.notify_all()
                return
            t = _QUEUE.popleft()
        t._build()
        with _COND:
            _COND.notify_all()


def settle(timeout: float | None = None) -> bool:
    """Promote every nest that has run serially and wait until the
    background builds are done (at most ``timeout`` seconds); whether they
    are."""
    for t in list(_RAN):
        if t.serial is not None and not t.failed and t.parallel is None:
            t._request()
    end = None if timeout is None else time.monotonic() + timeout
    with _COND:
        while _QUEUE or any(t._queued for t in list(_RAN)):
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                return False
            _COND.wait(0.05 if left is None else min(left, 0.05))
    return True


def _before_fork() -> None:
    _BUILDING.acquire()


def _after_fork_parent() -> None:
    _BUILDING.release()


def _after_fork_child() -> None:
    global _COND, _BUILDING
    _COND = threading.Condition()
    _BUILDING = threading.RLock()
    for t in _QUEUE:
        t._queued = False
    _QUEUE.clear()
    _WORKER.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_parent,
                        after_in_child=_after_fork_child)

"""Many steps of a loop scan in one compiled call (the time-loop driver).

A grown loop scan (:mod:`xstencil._labelled.loop_scan`) runs one compiled
loop nest per step.  Driven from Python, every step paid the Python loop's
bookkeeping and numba's dispatch (about 20 us a step on the shared 2-core
machine, as much as the arithmetic of a 512 x 512 heat step).  The driver
here is a small serial numba function, generated per structure (how many
advanced variables, which nest arguments are the state and which constants,
how many fixed arguments), that calls the nest for steps ``t1 .. t2`` in a
compiled loop: it picks each step's output buffer exactly as the Python loop
does (the saved position ``t // every`` when ``t`` is saved, the last
position's frame for ``save_every="last"``, else the spare that does not
hold the current state), swaps the state, and with ``check_finite`` reads
the nest's per-row flags after each step and stops at the first step whose
new state holds a NaN or Inf.  The nest and its arguments are the ones the
Python loop passes, so every step computes the same values (bitwise).

The driver runs in chunks (:func:`run`): each call stops at the next
progress report that is due, and takes about :data:`CHUNK_SECONDS`, so that
a Ctrl-C (which Python sees between calls) still stops a long scan within a
fraction of a second.  It calls the variant of the nest (see
:class:`~xstencil._backends.loop_variants.Nest`) that wrote the step before
it, which the Python loop ran; a ``plain`` variant that refuses (a weight of
0: it writes nothing) hands the step back to Python.

The driver compiles once per nest variant and structure (about 0.1 s of
CPU time: it calls the nest by its address, see :class:`Driver`; the nest
itself is not compiled again), so it is made only
for a nest that scans have asked for :data:`HOT_STEPS` steps in all (a
first call of that many steps, or repeated shorter ones), and scans of
fewer than :data:`MIN_STEPS` steps keep the Python loop.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from xstencil._backends.loop_variants import Nest
from xstencil._backends.tiered import Tiered

try:  # optional: the ``cpu`` extra
    import numba
except ImportError:  # pragma: no cover - exercised where numba is absent
    numba = None

__all__ = ["CHUNK_SECONDS", "HOT_STEPS", "MIN_STEPS", "Driver", "Stepped", "Threads", "driver",
           "hot", "run"]

#: Scans of fewer steps keep the per-step Python loop.
MIN_STEPS = 16
#: A nest gets a driver once scans have asked it for this many steps in all
#: (this call's included): the driver's compile (about 0.2-0.4 s) then costs
#: less than the Python loop's bookkeeping it saves (about 10-20 us a step).
HOT_STEPS = 1000
#: About how long one driver call runs before Python gets control back.
CHUNK_SECONDS = 0.05

_LOG = logging.getLogger("xstencil.loops")
_LOCK = threading.Lock()
# per nest: per (variant, structure) the compiled driver; dies with the nest
_DRIVERS: weakref.WeakKeyDictionary[Any, dict[Any, Any]] = weakref.WeakKeyDictionary()

# per driver (or per step stepped from Python: Stepped): its thread choice (see
# Threads); dies with it
_TUNES: weakref.WeakKeyDictionary[Any, Threads] = weakref.WeakKeyDictionary()
_COUNTS: weakref.WeakKeyDictionary[Nest, int] = weakref.WeakKeyDictionary()  # steps asked
Source = tuple[str, int]  # ("c", j): advanced variable j's state; ("k", m): constant m


def _source(nvar: int, order: Sequence[int], srcs: Sequence[Source], nfixed: int,
            check: bool, plain: bool) -> str:
    """The driver's Python source (see the module notes)."""
    cs = [f"c{j}" for j in range(nvar)]
    os_ = [f"o{j}" for j in range(nvar)]
    as_ = [f"a{j}" for j in range(nvar)]
    bs = [f"b{j}" for j in range(nvar)]
    ks = sorted({m for kind, m in srcs if kind == "k"})
    head = ["t1", "t2", "every", "steps", "flag", "fz", *cs, *os_, *as_, *bs,
            *[f"k{m}" for m in ks], *[f"x{i}" for i in range(nfixed)]]
    call = ([("fz" if check else None)] + [f"n{j}" for j in order]
            + [f"c{m}" if kind == "c" else f"k{m}" for kind, m in srcs]
            + [f"x{i}" for i in range(nfixed)])
    args = ", ".join(a for a in call if a is not None)

    def assign(what: Callable[[int], str], nf: int) -> list[str]:
        return [f"            n{j} = {what(j)}" for j in range(nvar)] + [f"            nf = {nf}"]

    lines = [f"def drive(fn, {', '.join(head)}):",
             "    for t in range(t1, t2 + 1):",
             "        if every != 0 and t % every == 0:",
             "            i = t // every",
             *assign(lambda j: f"o{j}[i]", 2),
             "        elif every == 0 and t == steps:",
             *assign(lambda j: f"o{j}[0]", 2),
             "        elif flag == 0:",
             *assign(lambda j: f"b{j}", 1),
             "        else:",
             *assign(lambda j: f"a{j}", 0)]
    if plain:  # refuses (returns False, writes nothing) where a weight is 0
        lines += [f"        if not fn({args}):", "            return t, flag, 2"]
    else:
        lines += [f"        fn({args})"]
    lines += [f"        c{j} = n{j}" for j in range(nvar)] + ["        flag = nf"]
    if check:
        lines += ["        for r in range(fz.shape[0]):",
                  "            if not fz[r]:",
                  "                return t, flag, 1"]
    lines += ["    return t2, flag, 0"]
    return "\n".join(lines) + "\n"


def hot(nest: Any, steps: int) -> bool:
    """Whether a scan of ``steps`` steps by ``nest`` (a map's
    :class:`~xstencil._backends.loop_variants.Nest`; anything else never is)
    runs on a driver: at least :data:`MIN_STEPS` steps, and
    :data:`HOT_STEPS` asked of the nest so far, these included."""
    if numba is None or not isinstance(nest, Nest) or steps < MIN_STEPS:
        return False
    with _LOCK:
        n = _COUNTS[nest] = _COUNTS.get(nest, 0) + steps
    if n < HOT_STEPS:
        return False
    nest.prefer_parallel()  # the driver's build: the first step runs it too, no serial compile
    return True


def driver(nest: Any, nvar: int, order: Sequence[int], srcs: Sequence[Source], nfixed: int,
           check: bool) -> Driver | None:
    """The driver of ``nest``'s variant that ran last (a
    :class:`~xstencil._backends.loop_variants.Nest` that has run a step), or
    ``None`` where there is none (numba absent, no variant ran)."""
    which = getattr(nest, "last", None)
    fns = getattr(nest, "fns", None)
    if numba is None or which is None or not isinstance(fns, dict) or which not in fns:
        return None
    key = (which, nvar, tuple(order), tuple(srcs), nfixed, check)
    with _LOCK:
        per = _DRIVERS.setdefault(nest, {})
        drive = per.get(key)
        if drive is None:
            drive = per[key] = Driver(fns[which], nvar, order, srcs, nfixed, check,
                                      which == "plain")
    return drive


class Driver:
    """A driver (:func:`_source`) and the nest function it calls, compiled on
    its first call for the argument types of that call.  The nest is passed
    as a first-class function (``numba.types.FunctionType`` of the nest's
    compiled signature for the arguments the driver hands it), so the driver
    calls the nest's machine code by its address: linking the parallel nest
    into the driver made numba optimize and compile it again (0.4-0.8 s of
    CPU time for a 5-point nest, against about 0.1 s this way).  A nest not
    compiled yet for those types (the first step read a read-only input) is
    compiled for them, as the Python loop's second step would."""

    def __init__(self, fn: Any, nvar: int, order: Sequence[int], srcs: Sequence[Source],
                 nfixed: int, check: bool, plain: bool):
        self.fn, self.nvar, self.order, self.srcs = fn, nvar, tuple(order), tuple(srcs)
        self.nfixed, self.check = nfixed, check
        namespace: dict[str, Any] = {}
        src = _source(nvar, order, srcs, nfixed, check, plain)
        exec(compile(src, "<xstencil time-loop driver>", "exec"), namespace)  # noqa: S102
        self.py = namespace["drive"]
        self.compiled: Any = None

    def __call__(self, *args: Any) -> Any:
        if self.compiled is None:
            with _LOCK:
                if self.compiled is None:
                    self.compiled = self._compile(args)
        return self.compiled(self.fn, *args)

    def _compile(self, args: Sequence[Any]) -> Any:
        nvar = self.nvar
        fz, rest = args[5], list(args[6:])
        spares = rest[2 * nvar:3 * nvar]
        ks = sorted({m for kind, m in self.srcs if kind == "k"})
        consts = dict(zip(ks, rest[4 * nvar:4 * nvar + len(ks)], strict=True))
        fixed = rest[4 * nvar + len(ks):]
        nest_args = ([fz] if self.check else []) + [spares[j] for j in self.order] + [
            spares[m] if kind == "c" else consts[m] for kind, m in self.srcs] + list(fixed)
        types = tuple(numba.typeof(x) for x in nest_args)
        if isinstance(self.fn, Tiered):  # the parallel build, made now where it is not yet
            self.fn = self.fn.dispatcher(tuple(nest_args))
        elif types not in self.fn.overloads:  # e.g. the first step read a read-only input:
            self.fn.compile(types)  # as the Python loop's second step would compile it
        cres = self.fn.overloads[types]
        fty = numba.types.FunctionType(cres.signature)
        sig = numba.types.UniTuple(numba.types.int64, 3)(
            fty, *[numba.typeof(x) for x in args])
        return numba.njit(sig, error_model="numpy")(self.py)


def run(drive: Any, t: int, steps: int, every: int, cur: list[np.ndarray],
        fz: np.ndarray | None, outs: Sequence[np.ndarray],
        spares: Sequence[tuple[np.ndarray, np.ndarray]], consts: Sequence[np.ndarray],
        fixed: Sequence[Any], due: int, tick: Callable[[int], int]
        ) -> tuple[int, list[np.ndarray], int, int]:
    """Run steps ``t + 1 .. steps`` with ``drive`` from the state ``cur``
    (each advanced variable's slab after step ``t``: a spare, a saved
    position, never the input), in chunks that end at each due progress
    report (``due``, then what ``tick(done)`` returns) and take about
    :data:`CHUNK_SECONDS`.

    Returns ``(t, cur, status, due)``: the last step run, the state after
    it, and ``status``: 0, all steps run; 1, step ``t``'s new state is not
    finite; 2, the nest refused the next step (a ``plain`` variant), or 3,
    the driver failed to compile: the caller runs the rest."""
    nvar = len(cur)
    flag = 0 if cur[0] is spares[0][0] else 1 if cur[0] is spares[0][1] else 2
    fz_ = fz if fz is not None else np.ones(1, np.bool_)
    head = [*cur, *outs, *[a for a, _ in spares], *[b for _, b in spares], *consts, *fixed]
    chunk, first = 1, True
    full = numba.get_num_threads()  # the caller's setting: never more threads than that
    with _LOCK:
        tune = _TUNES.setdefault(drive, Threads(full))
    while t < steps:
        stop = min(steps, t + chunk, max(due, t + 1))
        threads = min(full, tune.pick() if stop - t >= Threads.MIN_SAMPLE else tune.best())
        began = time.perf_counter()
        if first:  # the first call compiles: a failure there has run no step
            try:
                t2, flag, status = _call(drive, threads, t + 1, stop, every, steps, flag, fz_,
                                         head)
            except Exception as e:  # noqa: BLE001 - the Python loop runs the rest
                _LOG.debug("the time-loop driver did not compile: %s", e)
                return t, cur, 3, due
            first = False  # (a chunk of one step: not a timing sample)
        else:
            t2, flag, status = _call(drive, threads, t + 1, stop, every, steps, flag, fz_,
                                     head)
        took = time.perf_counter() - began
        t2 = int(t2)
        if status == 2:  # step t2 not run: the state is still the one after t2 - 1
            return t2 - 1, list(head[:nvar]), 2, due
        done, t = t2 - t, t2
        if done >= Threads.MIN_SAMPLE and not status:
            tune.record(threads, took / done)
        head[:nvar] = cur = _state(int(flag), t, every, outs, spares)
        if status:
            return t, cur, int(status), due
        if t >= due:
            due = tick(t)
        # the next chunk: about CHUNK_SECONDS at this speed, growing at most 8x a call
        rate = done / took if took > 0 else float("inf")
        chunk = max(1, min(chunk * 8, int(min(rate * CHUNK_SECONDS, steps))))
    return t, cur, 0, due


def _call(drive: Any, threads: int, *args: Any) -> Any:
    """``drive(*args)`` (the last argument: the array arguments) with the
    nest's parallel loops on ``threads`` threads; the caller's setting is
    restored after."""
    *scalars, head = args
    before = numba.get_num_threads()
    if threads == before:
        return drive(*scalars, *head)
    numba.set_num_threads(threads)
    try:
        return drive(*scalars, *head)
    finally:
        numba.set_num_threads(before)


class Threads:
    """How many threads a time loop's nests run on: all of numba's, or one,
    whichever took less time per step in the chunks measured so far (an
    exponential average of each).  The other count is tried again after
    :data:`EXPLORE` timed chunks, an interval that doubles (up to
    :data:`MAX_EXPLORE`) each time that re-try loses and starts over when it
    wins, so a change of load is seen while a host whose answer does not
    change pays for few re-tries.  Every cell's value is computed the same
    way on any number of threads, so the choice changes the speed only: on
    a shared machine whose cores are busy, a parallel loop waits at every
    step for the thread that another process holds up, and on a field so
    small that waking the other threads every step costs about as much as
    it saves (tens of microseconds a step on the 2-core machine, about a
    512 x 512 heat step's arithmetic), one thread can win.  A step that
    takes more than :data:`SMALL` seconds on all threads (a timed chunk of
    :data:`MIN_SAMPLE` such steps would run past :data:`CHUNK_SECONDS`) is
    never tried on one.

    Measured on the shared 2-core machine while another job loaded it (the
    old rule never tried one thread once a step took 0.25 ms on both, which
    the load itself brought about): a 1024² heat scan took 794 µs a step on
    both threads and 516 µs on one; a 512² function mesh scan (stepped from
    Python, :class:`Stepped`) 407 against 157 µs."""

    MIN_SAMPLE = 8  # chunks of fewer steps are not timed
    EXPLORE = 16
    MAX_EXPLORE = 1024
    SMALL = CHUNK_SECONDS / MIN_SAMPLE

    __slots__ = ("options", "per_step", "every", "wait", "trial")

    def __init__(self, full: int):
        self.options = (full, 1) if full > 1 else (full,)
        self.per_step: dict[int, float] = {}
        self.every = self.wait = self.EXPLORE
        self.trial: int | None = None  # the count being re-tried, until its chunk is timed

    def best(self) -> int:
        """The thread count with the lowest time per step (all: none measured)."""
        full = self.options[0]
        if not self.per_step or self.per_step.get(full, 0.0) > self.SMALL:
            return full
        return min(self.per_step, key=self.per_step.__getitem__)

    def pick(self) -> int:
        """The thread count for the next timed chunk."""
        full = self.options[0]
        if self.per_step.get(full, 0.0) > self.SMALL:
            return full
        fresh = [n for n in self.options if n not in self.per_step]
        if fresh:
            return fresh[0]
        self.wait -= 1
        if self.wait <= 0:
            self.wait = self.every
            self.trial = next(n for n in self.options if n != self.best())
            return self.trial
        return self.best()

    def record(self, threads: int, seconds: float) -> None:
        """A timed chunk: ``seconds`` per step on ``threads`` threads."""
        if threads == self.trial:  # a re-try: sooner again if it won, else later
            self.trial = None
            won = seconds < self.per_step.get(self.best(), float("inf"))
            self.every = self.EXPLORE if won else min(2 * self.every, self.MAX_EXPLORE)
            self.wait = self.every
        old = self.per_step.get(threads)
        self.per_step[threads] = seconds if old is None else 0.5 * (old + seconds)


def _state(flag: int, t: int, every: int, outs: Sequence[np.ndarray],
           spares: Sequence[tuple[np.ndarray, np.ndarray]]) -> list[np.ndarray]:
    """The buffers that hold the state after step ``t`` (``flag``: 0 or 1,
    the first or second spare; 2, the saved position)."""
    if flag == 0:
        return [a for a, _ in spares]
    if flag == 1:
        return [b for _, b in spares]
    return [out[t // every] if every else out[0] for out in outs]


class Stepped:
    """The thread choice (:class:`Threads`) of a time loop stepped from
    Python (a function mesh's nests, which have no compiled driver, or a
    scan too short for one): the steps run in groups of
    :data:`Threads.MIN_SAMPLE`, each group on the thread count
    :meth:`Threads.pick` gives and timed for it; used as a context manager,
    which restores the caller's setting on the way out.  ``key``: what the
    choice is kept for (the step's compiled nests), as a driver keeps its
    own.

    Measured on the shared 2-core machine while another job loaded it: a
    512² mesh scan (heat everywhere, a damped strip) took 407 µs a step on
    both threads (the Python loop had no choice before) and 157 µs forced
    onto one; tuned here, 141 µs (one thread: 143 µs in the same run).  On
    a quiet host both threads win, and the choice stays there."""

    __slots__ = ("tune", "full", "threads", "done", "began")

    def __init__(self, key: Any):
        self.full = numba.get_num_threads()
        with _LOCK:
            self.tune = _TUNES.setdefault(key, Threads(self.full))
        self.threads, self.done, self.began = self.full, 0, 0.0

    def before(self) -> None:
        """Called before each step: at the start of a group, set its threads."""
        if self.done == 0:
            threads = min(self.full, self.tune.pick())
            if threads != self.threads:
                numba.set_num_threads(threads)
                self.threads = threads
            self.began = time.perf_counter()

    def after(self) -> None:
        """Called after each step: at the end of a group, record its time."""
        self.done += 1
        if self.done == Threads.MIN_SAMPLE:
            self.tune.record(self.threads, (time.perf_counter() - self.began) / self.done)
            self.done = 0

    def __enter__(self) -> Stepped:
        return self

    def __exit__(self, *exc: Any) -> None:
        """Restore the caller's thread count."""
        if self.threads != self.full:
            numba.set_num_threads(self.full)
            self.threads = self.full

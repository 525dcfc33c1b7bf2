"""Timing helpers shared by the benchmark scripts.

* :func:`time_jax` compiles ahead of time (``jax.jit(f).lower(*a).compile()``,
  timed on its own), warms up, then times the compiled executable over at least
  ``runs`` runs, each ending in ``block_until_ready``.
* :func:`time_py` does the same for plain Python/NumPy callables (scipy).
* :func:`interleave` times several prepared :class:`Runner` objects in
  round-robin order, so that load from other jobs on a shared machine hits
  every column of a case alike and mostly cancels in their ratios.
* Calls much shorter than :data:`MIN_RUN_S` are batched: one run calls the
  function ``number`` times back to back and reports the mean per call, so the
  timer's resolution and jitter do not dominate.  Such a run starts with one
  untimed call, so that it is not charged for caches that the previously timed
  function evicted.  The figure reported is the
  median per-call time over the runs, with its interquartile range.
* :func:`memory` reads XLA's buffer assignment (``compiled.memory_analysis()``),
  which is exact for the compiled program and free to obtain.

Nothing here runs at import time.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from xstencil._backends import tiered

__all__ = ["MIN_RUN_S", "Timing", "Memory", "Runner", "interleave", "block", "compile_jax",
           "time_jax", "time_py", "memory", "fmt_time"]

#: A run shorter than this is made of several back-to-back calls.
MIN_RUN_S = 0.01


@dataclasses.dataclass
class Timing:
    """Per-call run time (seconds) and compile time of one benchmarked function."""

    median: float
    q1: float
    q3: float
    runs: int
    number: int
    compile_s: float | None = None
    note: str = ""

    @property
    def iqr(self) -> float:
        return self.q3 - self.q1

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Timing:
        return cls(**d)


@dataclasses.dataclass
class Memory:
    """XLA's buffer sizes (bytes) for one compiled program."""

    argument: int
    output: int
    temp: int
    alias: int

    @property
    def peak(self) -> int:
        """Live bytes at the worst point, as an upper bound: inputs, outputs and
        the temporary pool all held at once (donated/aliased bytes counted once)."""
        return self.argument + self.output + self.temp - self.alias


def block(out: Any) -> Any:
    """``jax.block_until_ready``."""
    import jax

    return jax.block_until_ready(out)


def _quartiles(xs: list[float]) -> tuple[float, float, float]:
    if len(xs) == 1:
        return xs[0], xs[0], xs[0]
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[1], q[0], q[2]


@dataclasses.dataclass
class Runner:
    """One prepared function: ``call()`` runs it once to completion."""

    call: Callable[[], Any]
    runs: int
    warmup: int
    batch: bool = True
    compile_s: float | None = None
    number: int = 1
    single: float | None = None  # fastest warm-up call
    samples: list[float] = dataclasses.field(default_factory=list)

    def warm(self) -> None:
        for _ in range(self.warmup):
            t0 = time.perf_counter()
            self.call()
            t = time.perf_counter() - t0
            self.single = t if self.single is None else min(self.single, t)
        if self.batch and self.single is not None and self.single < MIN_RUN_S:
            self.number = max(1, int(MIN_RUN_S / max(self.single, 1e-7)))

    def run_once(self) -> None:
        if self.single is not None and self.single < MIN_RUN_S:
            # Short calls: one untimed call first, so that the caches another
            # function left behind (interleaving) are not charged to this one.
            self.call()
        t0 = time.perf_counter()
        for _ in range(self.number):
            self.call()
        self.samples.append((time.perf_counter() - t0) / self.number)

    def timing(self) -> Timing:
        med, q1, q3 = _quartiles(self.samples)
        return Timing(median=med, q1=q1, q3=q3, runs=len(self.samples), number=self.number,
                      compile_s=self.compile_s)


def settle() -> None:
    """Let every loop nest that has run serially reach its parallel build
    (``xstencil/_backends/tiered.py``), after the first calls and before the
    timed ones: the warm columns then time the steady state that a long
    loop of calls reaches, while first calls keep the default path."""
    tiered.settle()


def interleave(runners: list[Runner]) -> list[Timing]:
    """Warm every runner up, then time them in round-robin order (run 1 of each,
    then run 2 of each, ...), so that a slow drift in machine load affects every
    column alike and cancels in their ratios."""
    for r in runners:
        r.warm()
    settle()
    for r in runners:
        r.warm()
    for i in range(max((r.runs for r in runners), default=0)):
        for r in runners:
            if i < r.runs:
                r.run_once()
    return [r.timing() for r in runners]


def round_robin(cases: dict[str, Callable[[], Any]], rounds: int, per_round: int
                ) -> dict[str, float]:
    """Median seconds per call of each case: ``rounds`` rounds, each calling
    every case ``per_round`` times in turn (so load hits all cases alike)."""
    times: dict[str, list[float]] = {k: [] for k in cases}
    for f in cases.values():
        f()
    settle()
    for _ in range(rounds):
        for name, f in cases.items():
            t0 = time.perf_counter()
            for _ in range(per_round):
                f()
            times[name].append((time.perf_counter() - t0) / per_round)
    return {k: statistics.median(v) for k, v in times.items()}


def compile_jax(f: Callable[..., Any], *args: Any) -> tuple[Any, float]:
    """``jax.jit(f).lower(*args).compile()`` and the seconds it took (trace,
    lowering and XLA compilation together)."""
    import jax

    t0 = time.perf_counter()
    compiled = jax.jit(f).lower(*args).compile()
    return compiled, time.perf_counter() - t0


def time_jax(
    f: Callable[..., Any],
    *args: Any,
    runs: int = 7,
    warmup: int = 2,
    batch: bool = True,
    compiled: Any = None,
    compile_s: float | None = None,
) -> Timing:
    """Compile ``f`` ahead of time, then time the executable on ``args``.

    Pass ``compiled`` (and ``compile_s``) to reuse an executable already built
    with :func:`compile_jax`, e.g. one whose memory was inspected.
    """
    if compiled is None:
        compiled, compile_s = compile_jax(f, *args)

    def call() -> Any:
        return block(compiled(*args))

    (t,) = interleave([Runner(call, runs, warmup, batch, compile_s)])
    return t


def time_py(
    f: Callable[..., Any], *args: Any, runs: int = 7, warmup: int = 1, batch: bool = True
) -> Timing:
    """Time a plain Python callable (e.g. scipy.ndimage on NumPy arrays)."""
    (t,) = interleave([Runner(lambda: f(*args), runs, warmup, batch)])
    return t


def memory(compiled: Any) -> Memory | None:
    """XLA's buffer sizes for a compiled executable, or None if the backend
    does not report them."""
    try:
        m = compiled.memory_analysis()
    except Exception:  # not every backend implements it
        return None
    if m is None:
        return None
    return Memory(
        argument=int(m.argument_size_in_bytes),
        output=int(m.output_size_in_bytes),
        temp=int(m.temp_size_in_bytes),
        alias=int(m.alias_size_in_bytes),
    )


def fmt_time(t: float | None) -> str:
    """A duration with a unit that keeps three significant figures."""
    if t is None:
        return "—"
    if t >= 1:
        return f"{t:.3g} s"
    if t >= 1e-3:
        return f"{t * 1e3:.3g} ms"
    return f"{t * 1e6:.3g} µs"


RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def write_section(name: str, text: str, path: Path = RESULTS) -> None:
    """Replace one script's section of RESULTS.md (between its
    ``<!-- NAME:start -->``/``<!-- NAME:end -->`` markers), keeping the rest."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    block = f"{start}\n{text.rstrip()}\n{end}"
    if path.exists():
        old = path.read_text()
        if start in old and end in old:
            head, rest = old.split(start, 1)
            _, tail = rest.split(end, 1)
            new = head + block + tail
        else:
            new = old.rstrip() + "\n\n" + block + "\n"
    else:
        new = ("# Benchmark results\n\nWritten by the scripts in `benchmarks/`; see README.md.\n\n"
               + block + "\n")
    path.write_text(new)


def add_output_flags(p: Any, quick_help: str = "small sizes; print only") -> None:
    """The flags every benchmark script shares: ``--quick``, ``--write``, ``--no-write``."""
    p.add_argument("--quick", action="store_true", help=quick_help)
    p.add_argument("--write", action="store_true", help="write RESULTS.md even with --quick")
    p.add_argument("--no-write", action="store_true", help="do not write RESULTS.md")


def publish(name: str, text: str, args: Any, log: Callable[[str], None] = print,
            partial: bool = False) -> None:
    """Print a script's section and, for a full run, write it to RESULTS.md
    (``--write`` forces it, ``--no-write`` or a ``partial`` run prevents it)."""
    print(text)
    if (not args.quick or args.write) and not args.no_write and not partial:
        write_section(name, text)
        log(f"wrote {RESULTS}")


def sized_main(argv: list[str] | None, doc: str, name: str, title: str,
               table: Callable[[list[int], int], str], environment: Callable[[], str],
               sizes: tuple[list[int], list[int]], rounds: tuple[int, int]) -> None:
    """The command line of a script that times a table over image sizes:
    ``sizes`` and ``rounds`` are (full run, ``--quick``)."""
    import argparse

    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    add_output_flags(p, ", ".join(f"{n}²" for n in sizes[1]) + " only, fewer rounds; "
                     "print only")
    args = p.parse_args(argv)
    quick = int(bool(args.quick))
    body = (f"### {title} (`benchmarks/{name}.py`)\n\n" + environment() + "\n\n"
            + table(sizes[quick], rounds[quick]))
    publish(name, body, args)


def convection_rows(x: Any, r: float) -> Any:
    """The hand-written baseline for the kernex README's linear convection,
    shared by ``engine.py`` and ``scan.py``: a ``lax.scan`` over time rows
    carrying only the previous row, starting from ``x[0]``, walls held at
    their initial values."""
    import jax.numpy as jnp
    from jax import lax

    def step(prev: Any, _: Any) -> tuple[Any, Any]:
        inner = prev[1:-1] - r * (prev[1:-1] - prev[:-2])
        new = jnp.concatenate([prev[:1], inner, prev[-1:]])
        return new, new

    _, rows = lax.scan(step, x[0], None, length=x.shape[0] - 1)
    return jnp.concatenate([x[:1], rows])

"""The run-time overhead of ``progress=True`` on the 2-D heat scan (issue 16).

Run from the repository root::

    PYTHONPATH=. python benchmarks/progress.py            # 512², 5,000 steps; writes RESULTS.md
    PYTHONPATH=. python benchmarks/progress.py --quick    # 256², 2,000 steps; prints only

The target: a bar costs at most 2 % of the run, and on a scan longer than
2 s it moves at least every 0.5 s.

The calls are the ones a user writes, ``xstencil.scan(da, ..., progress=p)``
on a NumPy-backed DataArray, not wrapped in ``jax.jit`` (under ``jax.jit`` the
bar opens and closes while tracing, so the compiled loop would find no bar
and stop reporting: that would measure nothing).  Two routes are measured:
the user's default call (no ``backend=``: ``"auto"``, which runs this scan as
numba loops, the bar moved by the Python time loop between steps; the route
actually taken is checked and printed), the main row, and the same call with
``backend="xla"`` (the bar fed by a host callback from inside the compiled
loop).  For each, both variants are compiled
first; then each round times one call without and one with a bar, in
alternating order, in one process.  The overhead is the median over rounds
of the per-round ratio (with/without), so a drift in machine load affects
both sides alike; its 90 % bootstrap interval is printed next to it.  Wall
time and process CPU time are both reported: on a shared machine the CPU
time ratio is the steadier of the two.  The bar updates are counted from
inside the timed calls.  A second measurement runs one scan per route sized
to about 4 s and reports the largest gap between two bar updates.

Importing this module does no work; ``main(argv)`` runs it.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

try:  # run as ``python benchmarks/progress.py``: benchmarks/ is sys.path[0]
    import _harness as H
except ImportError:  # imported as ``benchmarks.progress`` from the repository root
    from benchmarks import _harness as H

TARGET = 0.02  # at most 2 % overhead
MAX_GAP = 0.5  # seconds between two bar updates on a scan longer than 2 s


#: The routes measured: ``backend=`` of the call (``None``: the user's default).
BACKENDS = (None, "xla")


def heat_call(n: int, steps: int, backend: str | None = None) -> Callable[[bool], Any]:
    """``f(progress)``: the 2-D heat scan of ``benchmarks/scan.py`` (explicit
    Euler, zero Dirichlet halo, final state), ``n``², ``steps`` steps, as a
    user calls it (with ``backend=backend`` when given); returns the computed
    array."""
    import jax
    import numpy as np
    import xarray as xr

    import xstencil

    a = 0.2
    u0 = xr.DataArray(np.random.default_rng(0).random((n, n)).astype(np.float32),
                      dims=("y", "x"))

    def kernel(u: Any) -> Any:
        c = u(time=-1)
        return c + a * (u(time=-1, x=1) + u(time=-1, x=-1) + u(time=-1, y=1)
                        + u(time=-1, y=-1) - 4 * c)

    opts = {} if backend is None else {"backend": backend}

    def f(progress: bool) -> Any:
        # with and without a bar take the same route (both loops, or both XLA)
        out = xstencil.scan(u0, kernel, "time", steps=steps, save_every="last",
                            boundary="fill", fill_value=0.0, progress=progress, **opts)
        return jax.block_until_ready(out.data)

    return f


@contextlib.contextmanager
def loop_runs() -> Any:
    """Count the time loops run as numba loops (``loop_scan._steps``, full
    and repeated calls alike); an XLA scan runs none."""
    from xstencil._labelled import loop_scan

    seen: list[int] = []
    real = loop_scan._steps

    def steps(*a: Any, **k: Any) -> Any:
        seen.append(1)
        return real(*a, **k)

    loop_scan._steps = steps
    try:
        yield seen
    finally:
        loop_scan._steps = real


def route_name(backend: str | None, loops: int, calls: int) -> str:
    """The row's label: the call, and the route its ``calls`` took (``loops``
    of them as numba loops)."""
    took = "numba loops" if loops == calls else "XLA" if loops == 0 \
        else f"{loops} of {calls} calls on loops"
    return f"default (auto: {took})" if backend is None else f'`backend="{backend}"` ({took})'


@contextlib.contextmanager
def counted_reports() -> Any:
    """Count the bar updates made from inside compiled loops (``_progress.report``)."""
    from xstencil import _progress

    stamps: list[tuple[float, int]] = []
    real = _progress.report

    def report(token: Any, done: Any) -> None:
        stamps.append((time.perf_counter(), int(done)))
        real(token, done)

    _progress.report = report
    try:
        yield stamps
    finally:
        _progress.report = real


def _bootstrap(ratios: list[float], seed: int = 0, draws: int = 2000) -> tuple[float, float]:
    """A 90 % bootstrap interval of the median of ``ratios``."""
    import numpy as np

    r = np.asarray(ratios)
    idx = np.random.default_rng(seed).integers(0, len(r), (draws, len(r)))
    meds = np.median(r[idx], axis=1)
    return float(np.quantile(meds, 0.05)), float(np.quantile(meds, 0.95))


def overhead(n: int, steps: int, rounds: int, backend: str | None = None) -> dict[str, Any]:
    """Paired, interleaved timings of ``progress=False``/``True`` (see the module doc)."""
    import os

    load = os.getloadavg()[0]
    f = heat_call(n, steps, backend)
    off_wall: list[float] = []
    on_wall: list[float] = []
    off_cpu: list[float] = []
    on_cpu: list[float] = []
    with contextlib.redirect_stderr(io.StringIO()):  # the bars
        for p in (False, True, False, True):  # compile both, then warm up
            f(p)
        with counted_reports() as stamps, loop_runs() as loops:
            for i in range(rounds):
                for p in ((False, True) if i % 2 == 0 else (True, False)):
                    w0, c0 = time.perf_counter(), time.process_time()
                    f(p)
                    w, c = time.perf_counter() - w0, time.process_time() - c0
                    (on_wall if p else off_wall).append(w)
                    (on_cpu if p else off_cpu).append(c)
    wall = [b / a for a, b in zip(off_wall, on_wall, strict=True)]
    cpu = [b / a for a, b in zip(off_cpu, on_cpu, strict=True)]
    return {"n": n, "steps": steps, "rounds": rounds,
            "route": route_name(backend, len(loops), 2 * rounds),
            "off": statistics.median(off_wall), "on": statistics.median(on_wall),
            "wall": statistics.median(wall) - 1,
            "wall_ci": tuple(x - 1 for x in _bootstrap(wall)),
            "cpu": statistics.median(cpu) - 1, "cpu_ci": tuple(x - 1 for x in _bootstrap(cpu)),
            "updates": len(stamps) / rounds, "cpus": os.cpu_count(),
            "load": (load + os.getloadavg()[0]) / 2}


def callback_cost(n: int, steps: int, rounds: int, backend: str | None = None
                  ) -> dict[str, Any]:
    """The cost of one bar update, from paired calls with a bar: one as
    shipped, one with ``INTERVAL = 0`` (the host asks for a report at every
    test, a few hundred per call); per round, the time difference over the
    difference in update counts.  The overhead of the shipped bar is then
    about its update count times this cost, a figure that does not drown in
    machine noise as a 1 % difference of run times does.  (On the loops,
    ``INTERVAL = 0`` reports after every step.)"""
    from xstencil import _progress

    f = heat_call(n, steps, backend)
    interval = _progress.INTERVAL
    costs: list[float] = []
    counts: list[int] = []
    with contextlib.redirect_stderr(io.StringIO()):
        f(True)
        for i in range(rounds):
            t: dict[float, float] = {}
            u: dict[float, int] = {}
            for iv in ((interval, 0.0) if i % 2 == 0 else (0.0, interval)):
                _progress.INTERVAL = iv
                try:
                    with counted_reports() as stamps:
                        w0 = time.perf_counter()
                        f(True)
                        t[iv] = time.perf_counter() - w0
                finally:
                    _progress.INTERVAL = interval
                u[iv] = len(stamps)
            costs.append((t[0.0] - t[interval]) / max(1, u[0.0] - u[interval]))
            counts.append(u[0.0])
    return {"cost": statistics.median(costs), "many": statistics.median(counts)}


def gaps(n: int, seconds: float, backend: str | None = None) -> dict[str, Any]:
    """One scan sized to about ``seconds``: the largest gap between two bar
    updates (and between the last one and the end of the call)."""
    import numpy as np

    probe = 500
    f = heat_call(n, probe, backend)
    f(False)
    t0 = time.perf_counter()
    f(False)
    steps = max(probe, int(seconds / ((time.perf_counter() - t0) / probe)))
    g = heat_call(n, steps, backend)
    with contextlib.redirect_stderr(io.StringIO()):
        g(True)  # compile
        with counted_reports() as stamps, loop_runs() as loops:
            g(True)
            end = time.perf_counter()
    times = [s for s, _ in stamps] + [end]
    return {"n": n, "steps": steps, "route": route_name(backend, len(loops), 1),
            "run": end - stamps[0][0], "updates": len(stamps),
            "max_gap": float(np.max(np.diff(times))) if len(times) > 1 else float("inf")}


def section(rows: list[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]],
            quick: bool) -> str:
    """RESULTS.md's section: one ``(overhead, callback_cost, gaps)`` per route,
    the user's default call first."""
    import jax

    pct = "{:+.2%}".format
    o0 = rows[0][0]
    lines = [
        "## progress: the overhead of `progress=True`",
        "",
        f"Generated by `benchmarks/progress.py{' --quick' if quick else ''}` on "
        f"{platform.machine()} ({jax.devices()[0].device_kind}, jax {jax.__version__}), "
        f"{o0['rounds']} rounds of one call without and one with a bar (alternating order), "
        "eager calls as a user writes them, per route: the user's default call (no "
        "`backend=`; on numba loops the Python time loop moves the bar between steps) and "
        "`backend=\"xla\"` (the bar fed by a host callback from inside the compiled "
        "loop); overhead = median of the per-round ratios, with its "
        f"90 % bootstrap interval. {o0['cpus']} CPUs, load average about "
        f"{o0['load']:.1f} during the run: with more runnable processes than CPUs, the "
        "wall-time ratio mostly measures the scheduler, and the CPU-time ratio and the "
        "update cost below are the figures to go by.",
        "",
        "| case | route | without | with | overhead (wall) | overhead (CPU time) | bar "
        "updates per call | ≤ 2 % |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for o, _, _ in rows:
        ok = "yes" if o["wall"] <= TARGET and o["cpu"] <= TARGET else "**no**"
        lines.append(
            f"| 2-D heat {o['n']}², {o['steps']:,} steps | {o['route']} | "
            f"{H.fmt_time(o['off'])} | {H.fmt_time(o['on'])} | {pct(o['wall'])} "
            f"[{pct(o['wall_ci'][0])}, {pct(o['wall_ci'][1])}] | {pct(o['cpu'])} "
            f"[{pct(o['cpu_ci'][0])}, {pct(o['cpu_ci'][1])}] | {o['updates']:.1f} | {ok} |")
    lines.append("")
    for o, c, _ in rows:
        lines.append(
            f"- {o['route']}: one bar update costs {H.fmt_time(c['cost'])} (paired calls with "
            f"{c['many']:.0f} updates and with the shipped rule, see `callback_cost`), so the "
            f"{o['updates']:.1f} updates per call cost about "
            f"{o['updates'] * c['cost'] / o['off']:.2%} of the run.")
    lines.append("")
    lines.append("Update gaps (target ≤ " f"{MAX_GAP} s):")
    lines.append("")
    for _, _, g in rows:
        gap_ok = "yes" if g["max_gap"] <= MAX_GAP else "**no**"
        lines.append(
            f"- {g['route']}: 2-D heat {g['n']}², {g['steps']:,} steps ({g['run']:.1f} s "
            f"after the first update): {g['updates']} updates, largest gap "
            f"{g['max_gap']:.3f} s ({gap_ok}).")
    lines.append("")
    return "\n".join(lines)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    H.add_output_flags(p, "256², 2,000 steps, 10 rounds; print only")
    p.add_argument("--rounds", type=int, default=None,
                   help="paired rounds (default 40, or 10 with --quick)")
    p.add_argument("--size", type=int, default=None, help="grid side (default 512)")
    p.add_argument("--steps", type=int, default=None, help="steps per call (default 5000)")
    args = p.parse_args(argv)
    n = args.size or (256 if args.quick else 512)
    steps = args.steps or (2000 if args.quick else 5000)
    rounds = args.rounds or (10 if args.quick else 40)
    rows = []
    for backend in BACKENDS:
        _log(f"progress overhead, backend={backend}: {n}², {steps} steps, {rounds} rounds ...")
        o = overhead(n, steps, rounds, backend)
        _log(f"  {o['route']}: wall {o['wall']:+.2%} [{o['wall_ci'][0]:+.2%}, "
             f"{o['wall_ci'][1]:+.2%}], CPU {o['cpu']:+.2%} [{o['cpu_ci'][0]:+.2%}, "
             f"{o['cpu_ci'][1]:+.2%}]")
        c = callback_cost(n, steps, max(3, rounds // 4), backend)
        _log(f"  one bar update: {c['cost'] * 1e3:.3f} ms")
        g = gaps(n, 1.0 if args.quick else 4.0, backend)
        _log(f"  largest gap: {g['max_gap']:.3f} s ({g['updates']} updates, {g['run']:.1f} s)")
        rows.append((o, c, g))
    H.publish("progress", section(rows, args.quick), args, _log,
              partial=args.size is not None or args.steps is not None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

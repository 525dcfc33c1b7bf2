"""Benchmark ``xstencil.scan`` (labelled time stepping) against hand-written ``lax.scan``.

Run from the repository root::

    PYTHONPATH=. python benchmarks/scan.py            # full sizes, writes RESULTS.md
    PYTHONPATH=. python benchmarks/scan.py --quick    # small sizes, prints only

Each case runs the labelled call (``xstencil.scan`` on a DataArray or Dataset
holding the traced input) and a hand-written ``lax.scan``/``fori_loop`` doing
the same arithmetic with ``jnp`` slicing, side by side in one process.  Both
are compiled ahead of time (compile time reported separately), checked to
agree, and timed in alternating runs (at least 7 each, short calls batched);
the ratio is the median of the per-run ratios, which keeps it meaningful on a
machine with other load.  Also measured: XLA's peak memory for 10,000 steps
of a 512² field saving every 1,000th (``memory_analysis()`` of the compiled
program, so nothing is run), the run-time overhead of ``progress=True``
(measured by ``benchmarks/progress.py``, which has the full measurement), and
warm repeated eager calls (``da.stencil.scan`` of 10 steps at 64², all saved
or the last only, and a two-variable Dataset) against one jitted hand
``lax.scan`` call each: the labelled per-call cost (target ≤ 3×).

kernex's kscan on the same linear convection problems is timed with
``--kernex-python PY`` (an interpreter that has kernex; also read from
``XSTENCIL_KERNEX_PYTHON``), in a subprocess running the kernex README mesh
from ``benchmarks/engine.py``.  A kernex mesh can be called only once, so
every kernex call builds a fresh mesh and its time includes kernex's
tracing and compilation; the 500×1000 figure is a single call (about 27 s).

Importing this module does no work; ``main(argv)`` runs it.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import platform
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

try:  # run as ``python benchmarks/scan.py``: benchmarks/ is sys.path[0]
    import _harness as H
    import progress as P
except ImportError:  # imported as ``benchmarks.scan`` from the repository root
    from benchmarks import _harness as H
    from benchmarks import progress as P

HERE = Path(__file__).resolve().parent
TARGET = 1.3


# -- cases: each returns (name, input, xstencil fn, hand fn) ------------------------------

def convection(nt: int, nx: int) -> tuple[str, Any, Callable[..., Any], Callable[..., Any]]:
    """The kernex README's 1-D linear convection (upwind), full trajectory,
    walls by position in a mesh."""
    import numpy as np
    import xarray as xr

    import xstencil

    r = 0.5 * (0.5 / (nt - 1)) / (2.0 / (nx - 1))
    lo, hi = (nx - 1) // 4 + 1, (nx - 1) // 2
    x0 = np.ones((nt, nx), np.float32)
    x0[0, lo:hi] = 2

    def upwind(u: Any) -> Any:
        return u(t=-1) - r * (u(t=-1) - u(t=-1, x=-1))

    def wall(u: Any) -> Any:
        return u(t=-1)

    def xs(x: Any) -> Any:
        m = xstencil.mesh(xr.DataArray(x, dims=("t", "x")), boundary="extend")
        m[...] = upwind
        m[{"x": 0}] = m[{"x": -1}] = wall
        return m.scan(dim="t").data

    def hand(x: Any) -> Any:
        return H.convection_rows(x, r)

    return f"1-D linear convection {nt}×{nx} (mesh, full trajectory)", x0, xs, hand


def heat(n: int, steps: int, progress: bool = False) -> tuple[str, Any, Any, Any]:
    """2-D heat equation, explicit Euler, zero Dirichlet halo, final state."""
    import jax.numpy as jnp
    import numpy as np
    import xarray as xr
    from jax import lax

    import xstencil

    a = 0.2
    rng = np.random.default_rng(0)
    x0 = rng.random((n, n)).astype(np.float32)

    def kernel(u: Any) -> Any:
        c = u(time=-1)
        return c + a * (u(time=-1, x=1) + u(time=-1, x=-1) + u(time=-1, y=1)
                        + u(time=-1, y=-1) - 4 * c)

    def xs(x: Any) -> Any:
        return xstencil.scan(xr.DataArray(x, dims=("y", "x")), kernel, "time", steps=steps,
                             save_every="last", boundary="fill", fill_value=0.0,
                             progress=progress).data

    def hand(x: Any) -> Any:
        def step(_: Any, u: Any) -> Any:
            p = jnp.pad(u, 1)
            return u + a * (p[1:-1, 2:] + p[1:-1, :-2] + p[2:, 1:-1] + p[:-2, 1:-1] - 4 * u)

        return lax.fori_loop(0, steps, step, x)

    tag = " progress=True" if progress else ""
    return f"2-D heat {n}², {steps} steps (last){tag}", x0, xs, hand


def wave(n: int, steps: int) -> tuple[str, Any, Any, Any]:
    """2-D wave equation, leapfrog (window 2 deep in time), periodic, final state."""
    import jax.numpy as jnp
    import numpy as np
    import xarray as xr
    from jax import lax

    import xstencil

    c2 = 0.2
    yy, xx = np.meshgrid(np.linspace(-1, 1, n), np.linspace(-1, 1, n), indexing="ij")
    g = np.exp(-20 * (xx**2 + yy**2)).astype(np.float32)
    x0 = np.stack([g, g])

    def kernel(u: Any) -> Any:
        c = u(time=-1)
        lap = u(time=-1, x=1) + u(time=-1, x=-1) + u(time=-1, y=1) + u(time=-1, y=-1) - 4 * c
        return 2 * c - u(time=-2) + c2 * lap

    def xs(x: Any) -> Any:
        return xstencil.scan(xr.DataArray(x, dims=("time", "y", "x")), kernel, "time",
                             steps=steps, save_every="last", boundary="periodic").data

    def hand(x: Any) -> Any:
        def roll(u: Any, s: int, ax: int) -> Any:
            return jnp.roll(u, s, ax)

        def step(_: Any, c: Any) -> Any:
            prev, cur = c
            lap = (roll(cur, 1, 0) + roll(cur, -1, 0) + roll(cur, 1, 1) + roll(cur, -1, 1)
                   - 4 * cur)
            return cur, 2 * cur - prev + c2 * lap

        return lax.fori_loop(0, steps, step, (x[0], x[1]))[1]

    return f"2-D wave {n}², {steps} steps, periodic (last)", x0, xs, hand


def shallow_water(n: int, steps: int) -> tuple[str, Any, Any, Any]:
    """Linearised shallow water (u, v, h; a Dataset), forward Euler, periodic."""
    import jax.numpy as jnp
    import numpy as np
    import xarray as xr
    from jax import lax

    import xstencil

    g, depth, k = 9.81, 10.0, 0.001  # k = dt / (2 dx)
    yy, xx = np.meshgrid(np.linspace(-1, 1, n), np.linspace(-1, 1, n), indexing="ij")
    h0 = (0.01 * np.exp(-20 * (xx**2 + yy**2))).astype(np.float32)
    x0 = np.stack([np.zeros_like(h0), np.zeros_like(h0), h0])

    def kernel(s: Any) -> Any:
        u, v, h = s["u"], s["v"], s["h"]
        return {
            "u": u(time=-1) - g * k * (h(time=-1, x=1) - h(time=-1, x=-1)),
            "v": v(time=-1) - g * k * (h(time=-1, y=1) - h(time=-1, y=-1)),
            "h": h(time=-1) - depth * k * (u(time=-1, x=1) - u(time=-1, x=-1)
                                           + v(time=-1, y=1) - v(time=-1, y=-1)),
        }

    def xs(x: Any) -> Any:
        ds = xr.Dataset({n_: (("y", "x"), x[i]) for i, n_ in enumerate("uvh")})
        out = xstencil.scan(ds, kernel, "time", steps=steps, save_every="last",
                            boundary="periodic")
        return jnp.stack([out[n_].data for n_ in "uvh"])

    def hand(x: Any) -> Any:
        def dx(a: Any) -> Any:
            return jnp.roll(a, -1, 1) - jnp.roll(a, 1, 1)

        def dy(a: Any) -> Any:
            return jnp.roll(a, -1, 0) - jnp.roll(a, 1, 0)

        def step(_: Any, c: Any) -> Any:
            u, v, h = c
            return (u - g * k * dx(h), v - g * k * dy(h), h - depth * k * (dx(u) + dy(v)))

        return jnp.stack(lax.fori_loop(0, steps, step, (x[0], x[1], x[2])))

    return f"shallow water (u, v, h) {n}², {steps} steps, periodic (last)", x0, xs, hand


# -- warm repeated calls: the labelled per-call cost (issue 17 item 4) ---------------------

#: A warm ``da.stencil.scan`` call (10 steps at 64²) must cost at most this many
#: hand ``lax.scan`` calls (jitted) doing the same update.
WARM_TARGET = 3.0


def warm_cases(n: int = 64, steps: int = 10) -> list[tuple[str, Any, Any]]:
    """(name, labelled call, hand call): eager, warm, repeated calls on the same
    DataArray/Dataset, as a time-stepping driver makes them.  The labelled
    call returns a DataArray/Dataset (setup, cache look-up and rewrap
    included); the hand call is one jitted ``lax.scan`` on the raw array."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import xarray as xr
    from jax import lax

    import xstencil  # noqa: F401

    a = 0.2
    x0 = np.random.default_rng(0).random((n, n)).astype(np.float32)
    coords = {"y": np.arange(n) * 0.1, "x": np.arange(n) * 0.1}
    da = xr.DataArray(x0, dims=("y", "x"), coords=coords, name="T", attrs={"units": "K"})
    ds = xr.Dataset({"T": da, "S": da * 2})

    def kernel(u: Any) -> Any:
        c = u(time=-1)
        return c + a * (u(time=-1, x=1) + u(time=-1, x=-1) + u(time=-1, y=1)
                        + u(time=-1, y=-1) - 4 * c)

    def kernel_ds(s: Any) -> Any:
        return {"T": kernel(s["T"]), "S": kernel(s["S"])}

    def kernel_coords(u: Any) -> Any:  # reads the x coordinate (uniform: a factor of 1)
        c, x = u(time=-1), u.coord("x")
        return c + a * (u(time=-1, x=1) + u(time=-1, x=-1) + u(time=-1, y=1)
                        + u(time=-1, y=-1) - 4 * c) * ((x(x=1) - x(x=-1)) / 0.2)

    def update(u: Any) -> Any:
        p = jnp.pad(u, 1)
        return u + a * (p[1:-1, 2:] + p[1:-1, :-2] + p[2:, 1:-1] + p[:-2, 1:-1] - 4 * u)

    @jax.jit
    def hand(x: Any) -> Any:  # the full trajectory, as save_every=1 returns it
        def step(u: Any, _: Any) -> tuple[Any, Any]:
            u = update(u)
            return u, u

        return jnp.concatenate([x[None], lax.scan(step, x, None, length=steps)[1]])

    @jax.jit
    def hand_last(x: Any) -> Any:
        return lax.fori_loop(0, steps, lambda _, u: update(u), x)

    @jax.jit
    def hand_ds(x: Any, y: Any) -> Any:
        return hand(x), hand(y)

    raw = jnp.asarray(x0)
    opts = dict(steps=steps, boundary="fill", fill_value=0.0)
    tag = f"{n}², {steps} steps"
    return [
        (f"warm da.stencil.scan {tag}",
         lambda: da.stencil.scan(kernel, "time", **opts).data, lambda: hand(raw)),
        (f"warm da.stencil.scan {tag}, save_every='last'",
         lambda: da.stencil.scan(kernel, "time", save_every="last", **opts).data,
         lambda: hand_last(raw)),
        (f"warm ds.stencil.scan {tag} (2 variables)",
         lambda: ds.stencil.scan(kernel_ds, "time", **opts)["S"].data,
         lambda: hand_ds(raw, 2 * raw)[1]),
        (f"warm da.stencil.scan {tag}, kernel reads the x coordinate",
         lambda: da.stencil.scan(kernel_coords, "time", **opts).data, lambda: hand(raw)),
    ]


def warm_pair(case: tuple[str, Any, Any], runs: int) -> dict[str, Any]:
    """Time a warm labelled call against its hand ``lax.scan`` call in
    alternating runs (short calls batched); checked to agree first."""
    import numpy as np

    name, xs, hand = case
    np.testing.assert_allclose(np.asarray(xs()), np.asarray(hand()), rtol=2e-5, atol=2e-6)
    tx, th, ratio = _interleaved(lambda _: xs(), lambda _: hand(), None, runs)
    return {"name": name, "xstencil": tx, "hand": th, "ratio": ratio}


def _warm_row(r: dict[str, Any]) -> str:
    ok = "yes" if r["ratio"] <= WARM_TARGET else "**no**"
    return (f"| {r['name']} | {H.fmt_time(r['xstencil'].median)} | "
            f"{H.fmt_time(r['hand'].median)} | {r['ratio']:.2f}× | {ok} |")


# -- running ------------------------------------------------------------------------------

def _time_pair(case: tuple[str, Any, Any, Any], runs: int) -> dict[str, Any]:
    import jax.numpy as jnp
    import numpy as np

    name, x0, xs, hand = case
    x = jnp.asarray(x0)
    sink = io.StringIO()
    with contextlib.redirect_stderr(sink):  # progress bars
        cx, sx = H.compile_jax(xs, x)
        ch, sh = H.compile_jax(hand, x)
        np.testing.assert_allclose(np.asarray(cx(x)), np.asarray(ch(x)), rtol=2e-4, atol=2e-5)
        tx, th, ratio = _interleaved(cx, ch, x, runs)
    tx.compile_s, th.compile_s = sx, sh
    return {"name": name, "xstencil": tx, "hand": th, "ratio": ratio}


def _interleaved(fa: Any, fb: Any, x: Any, runs: int) -> tuple[Any, Any, float]:
    """Time two compiled functions in alternating runs (each run batched to at
    least ``H.MIN_RUN_S``), so that load from other processes hits both alike.
    Returns both timings and the median of the per-run ratios ``a / b``."""
    import statistics
    import time

    import jax

    def once(f: Any, number: int) -> float:
        t0 = time.perf_counter()
        for _ in range(number):
            jax.block_until_ready(f(x))
        return (time.perf_counter() - t0) / number

    numbers = []
    for f in (fa, fb):
        once(f, 1)  # warm-up
        single = once(f, 1)
        numbers.append(max(1, int(H.MIN_RUN_S / max(single, 1e-7))))
    ta, tb = [], []
    for _ in range(runs):
        ta.append(once(fa, numbers[0]))
        tb.append(once(fb, numbers[1]))

    def timing(ts: list[float], number: int) -> Any:
        q = statistics.quantiles(ts, n=4, method="inclusive")
        return H.Timing(median=statistics.median(ts), q1=q[0], q3=q[2], runs=runs,
                        number=number)

    ratios = [a / b for a, b in zip(ta, tb, strict=True)]
    return timing(ta, numbers[0]), timing(tb, numbers[1]), statistics.median(ratios)


_KERNEX = """
import json, statistics, sys, time
sys.path.insert(0, {here!r})
import jax, jax.numpy as jnp, kernex
import engine
out = {{}}
for nt, nx, runs in {sizes!r}:
    u = jnp.ones((nt, nx), jnp.float32)
    F = engine._convection_mesh(kernex, nt, nx)  # a kernex mesh can be called only once
    t0 = time.perf_counter(); jax.block_until_ready(F(u)); first = time.perf_counter() - t0
    ts = []
    for _ in range(runs):
        F = engine._convection_mesh(kernex, nt, nx)
        t0 = time.perf_counter(); jax.block_until_ready(F(u)); ts.append(time.perf_counter() - t0)
    out[f"{{nt}}x{{nx}}"] = [statistics.median(ts) if ts else first, len(ts)]
print(json.dumps(out))
"""


def kernex_times(python: str, sizes: list[tuple[int, int, int]]) -> dict[str, Any]:
    """kernex kscan on the README convection mesh (``engine._convection_mesh``),
    run under ``python`` (an interpreter with kernex): ``{"NTxNX": [s, runs]}``
    (``runs == 0``: one call, compile included)."""
    import json
    import subprocess

    code = _KERNEX.format(here=str(HERE), sizes=sizes)
    res = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True,
                         timeout=900)
    return json.loads(res.stdout.strip().splitlines()[-1])


def _memory(n: int, steps: int, every: int) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp
    import xarray as xr

    import xstencil

    def kernel(u: Any) -> Any:
        c = u(time=-1)
        return c + 0.2 * (u(time=-1, x=1) + u(time=-1, x=-1) + u(time=-1, y=1)
                          + u(time=-1, y=-1) - 4 * c)

    def f(x: Any) -> Any:
        return xstencil.scan(xr.DataArray(x, dims=("y", "x")), kernel, "time", steps=steps,
                             save_every=every, boundary="periodic").data

    x = jnp.zeros((n, n), jnp.float32)
    compiled = jax.jit(f).lower(x).compile()
    mem = H.memory(compiled)
    field = n * n * 4
    return {"steps": steps, "every": every, "n": n, "mem": mem, "field": field,
            "saved": (steps // every + 1) * field, "trajectory": (steps + 1) * field}


def run(quick: bool, kernex_python: str | None = None
        ) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    runs = 7
    conv = [(151, 51, 3)] if quick else [(151, 51, 3), (500, 1000, 0)]
    kx = {}
    if kernex_python:
        _log(f"kernex under {kernex_python} ...")
        kx = kernex_times(kernex_python, conv)
    if quick:
        cases = [convection(151, 51), convection(100, 200), heat(128, 200),
                 wave(128, 100), shallow_water(64, 200)]
        memory = _memory(64, 1000, 100)
    else:
        cases = [convection(151, 51), convection(500, 1000), heat(512, 1000),
                 wave(1024, 500), shallow_water(256, 1000)]
        memory = _memory(512, 10_000, 1_000)
    rows = []
    for c in cases:
        rows.append(_time_pair(c, runs))
        for nt, nx, _ in conv:
            if c[0].startswith(f"1-D linear convection {nt}×{nx} ") and f"{nt}x{nx}" in kx:
                rows[-1]["kernex"] = kx[f"{nt}x{nx}"]
        _log(_row(rows[-1]))
    # eager calls, as a user makes them (benchmarks/progress.py has the full measurement)
    n_steps, n = (200, 128) if quick else (5000, 512)
    overhead = P.overhead(n, n_steps, rounds=9)
    _log(f"progress overhead: {overhead['wall']:+.1%}")
    warm = []
    for c in warm_cases():
        warm.append(warm_pair(c, 15))
        _log(_warm_row(warm[-1]))
    return rows, overhead, memory, warm


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _row(r: dict[str, Any]) -> str:
    tx, th = r["xstencil"], r["hand"]
    ok = "yes" if r["ratio"] <= TARGET else "**no**"
    kx = "—"
    if "kernex" in r:
        t, n = r["kernex"]
        note = f"median of {n} calls" if n else "1 call"
        kx = f"{H.fmt_time(t)} ({note}): {t / tx.median:,.0f}× slower"
    return (f"| {r['name']} | {H.fmt_time(tx.median)} | {H.fmt_time(th.median)} | "
            f"{r['ratio']:.2f}× | {ok} | {kx} | {H.fmt_time(tx.compile_s)} / "
            f"{H.fmt_time(th.compile_s)} |")


def _mb(b: float) -> str:
    return f"{b / 2**20:,.1f} MiB"


def section(rows: list[dict[str, Any]], overhead: dict[str, Any], memory: dict[str, Any],
            quick: bool, warm: list[dict[str, Any]] = ()) -> str:
    import jax

    lines = [
        "## scan: `xstencil.scan` vs hand-written `lax.scan`",
        "",
        f"Generated by `benchmarks/scan.py{' --quick' if quick else ''}` on "
        f"{platform.machine()} ({jax.devices()[0].device_kind}, jax {jax.__version__}). "
        "Median of ≥7 alternating runs per call after warm-up (ratio: median of the per-run "
        "ratios); compile time measured on its own. "
        f"Target: ≤ {TARGET}× hand-written.",
        "",
        "| case | xstencil | hand `lax.scan` | ratio | ≤ 1.3× | kernex kscan | "
        "compile (xstencil / hand) |",
        "|---|---|---|---|---|---|---|",
        *[_row(r) for r in rows],
        "",
        f"`progress=True` overhead on 2-D heat {overhead['n']}², {overhead['steps']:,} steps, "
        f"{overhead['route']} ({overhead['updates']:.1f} bar updates per call from inside the "
        f"loop; "
        f"{overhead['rounds']} alternating rounds of eager calls): "
        f"{H.fmt_time(overhead['off'])} without, {H.fmt_time(overhead['on'])} with a bar, "
        f"{overhead['wall']:+.1%} as the median of per-round ratios "
        f"(target < 2%; on a loaded machine both carry a few % of noise).",
        "",
    ]
    m = memory["mem"]
    if m is not None:
        lines += [
            f"Peak memory, {memory['steps']:,} steps of a {memory['n']}² float32 field saving "
            f"every {memory['every']:,}th (XLA `memory_analysis`): "
            f"{_mb(m.peak)} (arguments {_mb(m.argument)}, outputs {_mb(m.output)}, temporaries "
            f"{_mb(m.temp)}); the saved slabs are {_mb(memory['saved'])} and the full "
            f"trajectory would be {_mb(memory['trajectory'])}.",
            "",
        ]
    if warm:
        lines += [
            "Warm repeated eager calls (the labelled per-call cost: setup, cache look-up, "
            "rewrap), each against one jitted hand `lax.scan` call doing the same update; "
            f"median of 15 alternating runs. Target: ≤ {WARM_TARGET:g}×.",
            "",
            f"| case | xstencil | hand `lax.scan` (jit) | ratio | ≤ {WARM_TARGET:g}× |",
            "|---|---|---|---|---|",
            *[_warm_row(r) for r in warm],
            "",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    H.add_output_flags(p)
    p.add_argument("--kernex-python", default=os.environ.get("XSTENCIL_KERNEX_PYTHON"),
                   help="an interpreter with kernex, to time its kscan on the convection "
                        "cases (default: $XSTENCIL_KERNEX_PYTHON; skipped when unset)")
    args = p.parse_args(argv)
    rows, overhead, memory, warm = run(args.quick, args.kernex_python)
    H.publish("scan", section(rows, overhead, memory, args.quick, warm), args, _log)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

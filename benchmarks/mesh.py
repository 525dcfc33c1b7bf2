"""Per-call and compile cost of a function mesh against its region count
(issue 17, item 4).

On a 64x64 float32 DataArray with coordinates, a mesh of R regions (R = 1,
8, 32: a periodic 5-point Laplacian everywhere, then R-1 single rows with a
second kernel) is timed against a plain ``da.stencil.map`` of the Laplacian,
each already compiled:

* ``map``: ``da.stencil.map(lap, boundary="periodic")``;
* ``mesh R``: ``m.map()`` on one mesh, called again;
* ``rebuilt R``: the mesh built again before each call (by position), as a
  Python loop over an iterative solve does;
* ``rebuilt-loc R``: the same by coordinate label (``m.loc[...]``).

The columns are timed in interleaved rounds (so load on a shared machine hits
them alike), each call ends in ``block_until_ready``, and the figure is the
median per-call time.  Compile time is the first call after
:func:`xstencil.clear_caches`, per R.  The target is ``mesh 32 <= 2x map``.

Run: ``PYTHONPATH=. python benchmarks/mesh.py [--rounds 15] [--calls 300]``.

``--loops`` times the CPU loop backend instead (issue 17, item 1): a mesh of
2 and of 4 regions at 2048² (a periodic Laplacian everywhere, then a column,
a row and a mask with other kernels) and a Dataset map of 2 and of 3
variables (a linear shallow-water tendency), each ``backend="loops"`` against
``backend="xla"`` in interleaved rounds, median per call; the first call
(numba's or XLA's compile included) is printed too, and the results are
checked against each other.  ``--quick`` runs it at 512²::

    NUMBA_NUM_THREADS=2 OMP_WAIT_POLICY=PASSIVE PYTHONPATH=. \
        python benchmarks/mesh.py --loops [--quick]

``--masked`` times masked meshes of R = 2, 8 and 32 regions (a periodic
Laplacian everywhere, then R-1 random masks, each a tenth of the cells, with
two other kernels in turn) at ``--n`` (64 by default) on the loop backend and
on XLA, warm, against a plain map: a DataArray mesh called again (the
repeat-call fast path) and a Dataset mesh of two variables (every call
resolves its regions; its per-call cost should not grow with R beyond the
loop nests' own work).  Loop-backend results are checked against XLA's::

    PYTHONPATH=. python benchmarks/mesh.py --masked --n 2048 --rounds 5

``--first`` times the first call (numba's compile included) of meshes of
R = 1, 4 and 8 regions on the loop backend at ``--n``: a periodic Laplacian
everywhere, then R-1 rows and columns (edges first) with two boundary
kernels in turn, after :func:`xstencil.clear_caches` each, and the number of
loop nests numba compiled::

    PYTHONPATH=. python benchmarks/mesh.py --first --n 512
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import xarray as xr

import xstencil

try:  # run as ``python benchmarks/mesh.py``: benchmarks/ is sys.path[0]
    import _harness as H
except ImportError:  # imported as ``benchmarks.mesh`` from the repository root
    from benchmarks import _harness as H

REGIONS = (1, 8, 32)


def lap(u: Any) -> Any:
    return u(x=1) + u(x=-1) + u(y=1) + u(y=-1) - 4 * u()


def edge(u: Any) -> Any:
    return 0.5 * u()


def build(da: xr.DataArray, r: int, label: bool = False) -> Any:
    m = da.stencil.mesh(boundary="periodic")
    m[...] = lap
    ys = da.indexes["y"]
    for i in range(1, r):
        if label:
            m.loc[{"y": float(ys[2 * i - 1])}] = edge
        else:
            m[{"y": 2 * i - 1}] = edge
    return m


def loop_cases(n: int) -> dict[str, tuple[Callable[[], Any], Callable[[], Any]]]:
    """Per case, its ``(loops, xla)`` calls on ``n`` x ``n`` float32 data."""
    rng = np.random.default_rng(1)
    da = xr.DataArray(rng.random((n, n), dtype=np.float32), dims=("y", "x"))
    land = da > 0.97

    def mesh_of(r: int, backend: str) -> Callable[[], Any]:
        # built once and called again (a rebuilt mesh adds the same
        # region bookkeeping to both columns: see the R-region table above)
        m = da.stencil.mesh(boundary="periodic", backend=backend)
        m[...] = lap
        m[{"x": 0}] = lambda u: u(x=1)
        if r > 2:
            m[{"y": -1}] = lambda u: u(y=-1) - u()
            m[land] = edge
        return lambda: m.map().data.block_until_ready()

    g, depth = 9.81, 0.5
    ds = xr.Dataset({v: (("y", "x"), rng.random((n, n), dtype=np.float32))
                     for v in ("u", "v", "h")})

    def tend3(s: Any) -> Any:
        return {"u": -g * (s["h"](x=1) - s["h"](x=-1)),
                "v": -g * (s["h"](y=1) - s["h"](y=-1)),
                "h": -depth * (s["u"](x=1) - s["u"](x=-1) + s["v"](y=1) - s["v"](y=-1))}

    def tend2(s: Any) -> Any:
        return {"u": -g * (s["h"](x=1) - s["h"](x=-1)),
                "h": -depth * (s["u"](x=1) - s["u"](x=-1))}

    def ds_map(kernel: Callable[..., Any], data: xr.Dataset, backend: str) -> Callable[[], Any]:
        def run() -> Any:
            out = data.stencil.map(kernel, boundary="periodic", backend=backend)
            for v in out.data_vars.values():
                v.data.block_until_ready()
            return out

        return run

    two = ds[["u", "h"]]
    return {f"mesh 2 regions {n}^2": (mesh_of(2, "loops"), mesh_of(2, "xla")),
            f"mesh 4 regions {n}^2": (mesh_of(4, "loops"), mesh_of(4, "xla")),
            f"Dataset 2 vars {n}^2": (ds_map(tend2, two, "loops"), ds_map(tend2, two, "xla")),
            f"Dataset 3 vars {n}^2": (ds_map(tend3, ds, "loops"), ds_map(tend3, ds, "xla"))}


def loops_main(n: int, rounds: int) -> None:
    """Mesh and Dataset maps on the loop backend against XLA (see the module doc)."""
    cases = loop_cases(n)
    first: dict[str, float] = {}
    columns: dict[str, Callable[[], Any]] = {}
    for name, (loops, xla) in cases.items():
        outs = []
        for label, f in (("loops", loops), ("xla", xla)):
            t0 = time.perf_counter()
            outs.append(f())
            first[f"{name} {label}"] = time.perf_counter() - t0
            columns[f"{name} {label}"] = f
        a, b = outs
        pairs = [(np.asarray(a), np.asarray(b))] if not isinstance(a, xr.Dataset) else \
            [(a[v].values, b[v].values) for v in a.data_vars]
        diff = max(float(np.abs(x - y).max()) for x, y in pairs)
        scale = max(float(np.abs(y).max()) for _, y in pairs)
        print(f"{name}: max |loops - xla| = {diff:.3g} (of max |xla| {scale:.3g})")
    for f in columns.values():  # warm
        f()
    med = H.round_robin(columns, rounds, 1)
    print(f"median per call of {rounds} interleaved rounds (first call: compile included)")
    for name in cases:
        lo, xl = med[f"{name} loops"], med[f"{name} xla"]
        print(f"  {name:24s} loops {lo * 1e3:8.2f} ms   xla {xl * 1e3:8.2f} ms   "
              f"xla/loops {xl / lo:5.2f}x   first call: loops {first[name + ' loops']:.2f} s, "
              f"xla {first[name + ' xla']:.2f} s")


MASKED = (2, 8, 32)


def masked_cases(n: int) -> dict[str, Callable[[], Any]]:
    """The ``--masked`` columns on ``n`` x ``n`` float32 data (see the module doc)."""
    rng = np.random.default_rng(2)
    da = xr.DataArray(rng.random((n, n), dtype=np.float32), dims=("y", "x"))
    ds = xr.Dataset({"u": da, "h": da * 2})
    masks = [xr.DataArray(rng.random((n, n)) > 0.9, dims=("y", "x"))
             for _ in range(max(MASKED) - 1)]
    others = [edge, lambda u: u(x=1) - u()]
    ds_others = [lambda s: {"u": 0.5 * s["u"](), "h": s["h"](y=1)},
                 lambda s: {"u": s["h"](x=1) - s["u"](), "h": 2 * s["h"]()}]

    def ds_lap(s: Any) -> Any:
        return {"u": lap(s["u"]), "h": s["h"](x=1) - s["u"]()}

    def build_masked(obj: Any, r: int, backend: str) -> Any:
        m = obj.stencil.mesh(boundary="periodic", backend=backend)
        m[...] = lap if isinstance(obj, xr.DataArray) else ds_lap
        kernels = others if isinstance(obj, xr.DataArray) else ds_others
        for i in range(r - 1):
            m[masks[i]] = kernels[i % 2]
        return m

    def ready(out: Any) -> Any:
        for v in ([out] if isinstance(out, xr.DataArray) else out.data_vars.values()):
            v.data.block_until_ready()
        return out

    cases: dict[str, Callable[[], Any]] = {
        "map xla": lambda: ready(da.stencil.map(lap, boundary="periodic", backend="xla")),
        "map loops": lambda: ready(da.stencil.map(lap, boundary="periodic", backend="loops"))}
    for backend in ("loops", "xla"):
        for r in MASKED:
            for kind, obj in (("mesh", da), ("ds mesh", ds)):
                m = build_masked(obj, r, backend)
                cases[f"{kind} {r} {backend}"] = lambda m=m: ready(m.map())
    return cases


def masked_main(n: int, rounds: int) -> None:
    """Masked meshes of 2, 8 and 32 regions, loops and XLA (see the module doc)."""
    cases = masked_cases(n)
    first, outs = {}, {}
    for name, f in cases.items():
        t0 = time.perf_counter()
        outs[name] = f()
        first[name] = time.perf_counter() - t0
    for name, out in outs.items():
        if name.endswith("loops") and not name.startswith("map"):
            want = outs[name[:-len("loops")] + "xla"]
            pairs = [(out, want)] if isinstance(out, xr.DataArray) else \
                [(out[v], want[v]) for v in out.data_vars]
            for a, b in pairs:
                np.testing.assert_array_equal(a.values, b.values)
    for f in cases.values():  # warm
        f()
    med = H.round_robin(cases, rounds, 1 if n > 512 else 20)
    print(f"masked meshes on {n}x{n} float32: median per call of {rounds} interleaved rounds")
    for name, v in med.items():
        floor = med["map loops" if name.endswith("loops") else "map xla"]
        print(f"  {name:18s} {v * 1e3:9.3f} ms   {v / floor:7.2f}x map   "
              f"first call {first[name]:.2f} s")


FIRST = (1, 4, 8)
EDGES = ({"x": 0}, {"x": -1}, {"y": 0}, {"y": -1}, {"x": 1}, {"x": -2}, {"y": slice(10, 20)})


def first_main(n: int) -> None:
    """First calls of meshes of 1, 4 and 8 regions on the loop backend (module doc)."""
    from xstencil._backends import loops_mesh

    rng = np.random.default_rng(3)
    da = xr.DataArray(rng.random((n, n), dtype=np.float32), dims=("y", "x"))
    kernels = [lambda u: 0.5 * u() + u(y=1), lambda u: u() - 0.1 * (u(x=1) - u(x=-1))]
    real = loops_mesh._compile
    compiled: list[int] = []

    def counting(source: str, parallel: bool) -> Any:
        compiled.append(1)
        return real(source, parallel)

    loops_mesh._compile = counting  # type: ignore[assignment]
    try:
        print(f"first call of a mesh on the loop backend, {n}x{n} float32")
        for r in FIRST:
            xstencil.clear_caches()
            compiled.clear()
            m = da.stencil.mesh(boundary="periodic", backend="loops")
            m[...] = lap
            for i in range(r - 1):
                m[EDGES[i]] = kernels[i % 2]
            t0, c0 = time.perf_counter(), time.process_time()
            out = m.map()
            out.data.block_until_ready()
            t, c = time.perf_counter() - t0, time.process_time() - c0
            x = da.stencil.mesh(boundary="periodic", backend="xla")
            x[...] = lap
            for i in range(r - 1):
                x[EDGES[i]] = kernels[i % 2]
            np.testing.assert_allclose(out.values, x.map().values, rtol=1e-6, atol=1e-6)
            print(f"  mesh {r} regions: {t:6.2f} s ({c:6.2f} s of CPU), "
                  f"{len(compiled)} nests compiled")
    finally:
        loops_mesh._compile = real  # type: ignore[assignment]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=64)
    p.add_argument("--calls", type=int, default=300, help="calls per column in all")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--loops", action="store_true",
                   help="the CPU loop backend against XLA: meshes and Dataset maps at 2048^2")
    p.add_argument("--quick", action="store_true", help="with --loops: 512^2, 5 rounds")
    p.add_argument("--masked", action="store_true",
                   help="masked meshes of 2, 8, 32 regions at --n, loops and XLA")
    p.add_argument("--first", action="store_true",
                   help="first calls of meshes of 1, 4, 8 regions on the loop backend at --n")
    a = p.parse_args(argv)
    if a.first:
        first_main(a.n)
        return
    if a.masked:
        masked_main(a.n, a.rounds)
        return
    if a.loops:
        loops_main(512 if a.quick else 2048, 5 if a.quick else max(5, min(a.rounds, 9)))
        return

    n = a.n
    da = xr.DataArray(np.random.default_rng(0).random((n, n), dtype=np.float32),
                      dims=("y", "x"), coords={"y": np.arange(n) * 0.1, "x": np.arange(n) * 0.1},
                      attrs={"units": "K"}, name="T")

    def ready(out: xr.DataArray) -> xr.DataArray:
        out.data.block_until_ready()
        return out

    ready(build(da.isel(x=slice(1, None)), 2).map())  # JAX's own first-use costs
    compile_s = {}
    for r in REGIONS:
        xstencil.clear_caches()
        t0 = time.perf_counter()
        ready(build(da, r).map())
        compile_s[r] = time.perf_counter() - t0
    cases: dict[str, Callable[[], Any]] = {
        "map": lambda: ready(da.stencil.map(lap, boundary="periodic"))}
    for r in REGIONS:
        m = build(da, r)
        cases[f"mesh {r}"] = lambda m=m: ready(m.map())
        cases[f"rebuilt {r}"] = lambda r=r: ready(build(da, r).map())
        cases[f"rebuilt-loc {r}"] = lambda r=r: ready(build(da, r, label=True).map())
    want = np.array(da.stencil.map(lap, boundary="periodic").values)
    got = build(da, 32).map().values
    rows = [2 * i - 1 for i in range(1, 32)]
    want[rows] = 0.5 * da.values[rows]
    np.testing.assert_allclose(got, want, rtol=1e-6)
    for f in cases.values():  # compile and warm up
        for _ in range(5):
            f()

    per_round = max(1, a.calls // a.rounds)
    med = H.round_robin(cases, a.rounds, per_round)
    floor = med["map"]
    print(f"per-call time on {n}x{n} float32, median of {a.rounds} rounds x {per_round} calls")
    for k, v in med.items():
        print(f"  {k:16s} {v * 1e6:9.1f} us   {v / floor:6.2f}x map")
    print("first call (compile included), after clear_caches:")
    for r, t in compile_s.items():
        print(f"  mesh {r:<11d} {t * 1e3:9.1f} ms   {t / compile_s[1]:6.2f}x R=1")
    print(f"target: mesh 32 <= 2.00x map -> "
          f"{'met' if med['mesh 32'] <= 2 * floor else 'NOT met'}")


if __name__ == "__main__":
    main()

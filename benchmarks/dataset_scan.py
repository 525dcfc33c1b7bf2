"""A coupled two-field Dataset scan on the numba loop backend against numba and XLA.

CFD Python's step 8 (2-D Burgers: ``u`` and ``v``, upwind advection and
central diffusion, periodic), 512 x 512 float32, 500 steps, the last state
saved.  Columns: ``ds.stencil.scan`` with ``backend="auto"`` (the loops at
this size), with ``backend="xla"``, and a hand-written numba ``prange`` time
loop with the same operations in the same order.  Run from the repository
root (about 20 s on two cores)::

    NUMBA_NUM_THREADS=2 OMP_WAIT_POLICY=PASSIVE PYTHONPATH=. python benchmarks/dataset_scan.py

Every column is compiled once, then timed in interleaved rounds; the script
prints medians, the ratio to numba ``prange`` and every round, and how far
each column's result is from the numba loop's.  ``--mesh`` times a function
mesh scan instead: heat in the interior, edges held at 1 (five regions),
against the same hand loop.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import xarray as xr

import xstencil

try:
    from numba import njit, prange
except ImportError:  # pragma: no cover
    njit = None

C = 0.2  # dt / dx (dx = dy)
D = 0.05  # nu dt / dx**2


def burgers(s: Any) -> Any:
    u, v = s["u"], s["v"]
    uc, vc = u(time=-1), v(time=-1)
    un = (uc - C * uc * (uc - u(time=-1, x=-1)) - C * vc * (uc - u(time=-1, y=-1))
          + D * (u(time=-1, x=1) - 2 * uc + u(time=-1, x=-1))
          + D * (u(time=-1, y=1) - 2 * uc + u(time=-1, y=-1)))
    vn = (vc - C * uc * (vc - v(time=-1, x=-1)) - C * vc * (vc - v(time=-1, y=-1))
          + D * (v(time=-1, x=1) - 2 * vc + v(time=-1, x=-1))
          + D * (v(time=-1, y=1) - 2 * vc + v(time=-1, y=-1)))
    return {"u": un, "v": vn}


if njit is not None:
    @njit(parallel=True)
    def hand(u0: Any, v0: Any, steps: int, c: float, d: float) -> Any:
        """The numba peer: two double-buffered fields, periodic wrap by index."""
        u, v = u0.copy(), v0.copy()
        un, vn = np.empty_like(u), np.empty_like(v)
        ny, nx = u.shape
        f = u.dtype.type
        c, d, two = f(c), f(d), f(2)
        for _ in range(steps):
            for i in prange(ny):
                im = i - 1 if i > 0 else ny - 1
                ip = i + 1 if i < ny - 1 else 0
                for j in range(nx):
                    jm = j - 1 if j > 0 else nx - 1
                    jp = j + 1 if j < nx - 1 else 0
                    uc, vc = u[i, j], v[i, j]
                    un[i, j] = (uc - c * uc * (uc - u[i, jm]) - c * vc * (uc - u[im, j])
                                + d * (u[i, jp] - two * uc + u[i, jm])
                                + d * (u[ip, j] - two * uc + u[im, j]))
                    vn[i, j] = (vc - c * uc * (vc - v[i, jm]) - c * vc * (vc - v[im, j])
                                + d * (v[i, jp] - two * vc + v[i, jm])
                                + d * (v[ip, j] - two * vc + v[im, j]))
            u, un = un, u
            v, vn = vn, v
        return u, v


    @njit(parallel=True)
    def hand_mesh(a: Any, steps: int, nu: float) -> Any:
        """The numba peer of the mesh: heat inside, edges set to 1."""
        u, v = a.copy(), np.empty_like(a)
        ny, nx = a.shape
        f = a.dtype.type
        c, four, one = f(nu), f(4), f(1)
        for _ in range(steps):
            for i in prange(ny):
                for j in range(nx):
                    if i == 0 or j == 0 or i == ny - 1 or j == nx - 1:
                        v[i, j] = one
                    else:
                        w = u[i, j]
                        v[i, j] = w + c * (u[i, j + 1] + u[i, j - 1] + u[i + 1, j]
                                           + u[i - 1, j] - four * w)
            u, v = v, u
        return u


NU = 0.2


def heat(u: Any) -> Any:
    c = u(time=-1)
    return c + NU * (u(time=-1, x=1) + u(time=-1, x=-1) + u(time=-1, y=1) + u(time=-1, y=-1)
                     - 4 * c)


def _timed(title: str, cols: dict[str, Callable[[], Any]], ref_key: str, reps: int,
           cells: float) -> None:
    first = {}
    for k, f in cols.items():
        t = time.perf_counter()
        first[k] = f()
        print(f"  first call {k:24s} {time.perf_counter() - t:6.2f} s")
    for k in cols:
        diff = max(float(np.abs(np.asarray(a) - np.asarray(b)).max())
                   for a, b in zip(np.atleast_3d(first[k]), np.atleast_3d(first[ref_key]),
                                   strict=True))
        print(f"  max |{k} - {ref_key}| = {diff:.3g}")
    times: dict[str, list[float]] = {k: [] for k in cols}
    for _ in range(reps):
        for k, f in cols.items():
            t = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(title)
    for k in cols:
        print(f"  {k:24s} {med[k] * 1e3:8.1f} ms  {cells / 1e6 / med[k]:7.0f} Mcell-updates/s  "
              f"{med[k] / med[ref_key]:.2f}x numba  rounds {[round(x * 1e3) for x in times[k]]}")


def mesh_case(n: int, steps: int, reps: int) -> None:
    a = np.random.default_rng(9).random((n, n), dtype=np.float32)
    da = xr.DataArray(a, dims=("y", "x"))
    m = da.stencil.mesh(boundary="extend")
    m[...] = heat
    for edge in ({"x": 0}, {"x": -1}, {"y": 0}, {"y": -1}):
        m[edge] = lambda u: 1.0

    def run(backend: str) -> np.ndarray:
        out = m.scan("time", steps=steps, save_every="last", backend=backend)
        return np.asarray(jax.block_until_ready(out.data))

    _timed(f"mesh scan (heat, 4 edge regions) {n}^2 x {steps}, float32:",
           {"xstencil auto (loops)": lambda: run("auto"), "xstencil XLA": lambda: run("xla"),
            "numba prange (hand)": lambda: hand_mesh(a, steps, NU)},
           "numba prange (hand)", reps, n * n * steps)


def case(n: int, steps: int, reps: int) -> None:
    rng = np.random.default_rng(8)
    u0 = (1 + (rng.random((n, n)) > 0.7)).astype(np.float32)
    v0 = (1 + (rng.random((n, n)) > 0.7)).astype(np.float32)
    ds = xr.Dataset({"u": (("y", "x"), u0), "v": (("y", "x"), v0)})

    def run(backend: str) -> tuple[np.ndarray, np.ndarray]:
        out = ds.stencil.scan(burgers, "time", steps=steps, save_every="last",
                              boundary="periodic", backend=backend)
        jax.block_until_ready([out.u.data, out.v.data])
        return np.asarray(out.u.data), np.asarray(out.v.data)

    _timed(f"burgers (u, v) {n}^2 x {steps}, float32, periodic, save_every='last':",
           {"xstencil auto (loops)": lambda: run("auto"), "xstencil XLA": lambda: run("xla"),
            "numba prange (hand)": lambda: hand(u0, v0, steps, C, D)},
           "numba prange (hand)", reps, 2 * n * n * steps)


if __name__ == "__main__":
    if njit is None:
        sys.exit("numba is not installed (pip install xstencil[cpu])")
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=512)
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--mesh", action="store_true", help="time the function mesh scan")
    a = p.parse_args()
    print(f"xstencil {xstencil.__file__}")
    (mesh_case if a.mesh else case)(a.n, a.steps, a.reps)

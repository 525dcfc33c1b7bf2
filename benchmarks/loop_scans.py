"""Grown heat scans on the numba loop backend against numba ``prange`` and XLA.

Run from the repository root (about 30 s on two cores)::

    NUMBA_NUM_THREADS=2 OMP_WAIT_POLICY=PASSIVE python benchmarks/loop_scans.py

Each case compiles every column once, then times them in interleaved rounds
and prints medians, the ratio to numba ``prange`` and every round.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np
import xarray as xr

import xstencil

sys.path.insert(0, str(Path(__file__).parent))
import _peer_kernels as P  # noqa: E402 - the benchmarks folder is not a package
from _harness import settle  # noqa: E402


def heat_case(n: int, steps: int, reps: int) -> None:
    """Time ``steps`` heat steps on an ``n`` x ``n`` float32 field, zero fill."""
    a = np.random.default_rng(1).random((n, n), dtype=np.float32)
    da = xr.DataArray(a, dims=("y", "x"))
    alpha = P.HEAT_A

    def kernel(u: Any) -> Any:
        c = u(time=-1)
        return c + alpha * (u(time=-1, x=1) + u(time=-1, x=-1) + u(time=-1, y=1)
                            + u(time=-1, y=-1) - 4 * c)

    def run(backend: str) -> np.ndarray:
        return np.asarray(jax.block_until_ready(xstencil.scan(
            da, kernel, "time", steps=steps, save_every="last", boundary="fill",
            fill_value=0.0, backend=backend).data))

    cols: dict[str, Callable[[], Any]] = {
        "xstencil loops": lambda: run("loops"),
        "numba prange": lambda: P._heat(a, steps, alpha),
        "xstencil XLA (blocked default)": lambda: run("xla")}
    first = {k: f() for k, f in cols.items()}  # compiles
    settle()  # the steady state: loop nests on their parallel builds
    diff = float(abs(first["xstencil loops"] - first["xstencil XLA (blocked default)"]).max())
    print(f"heat {n}^2 x {steps}: max |loops - XLA| = {diff:.3g}")
    times: dict[str, list[float]] = {k: [] for k in cols}
    for _ in range(reps):
        for k, f in cols.items():
            t = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    for k in cols:
        print(f"  {k:32s} {med[k] * 1e3:8.1f} ms  {med[k] / med['numba prange']:.2f}x numba  "
              f"rounds {[round(x * 1e3) for x in times[k]]}")


if __name__ == "__main__":
    if P.numba is None:
        sys.exit("numba is not installed (pip install xstencil[cpu])")
    heat_case(512, 1000, 5)
    heat_case(2048, 200, 3)

"""C-grid vorticity on a staggered grid (issue 14).

The relative vorticity at the cell corners of an Arakawa C-grid,
``zeta = dv/dx - du/dy`` with ``u`` on the x faces and ``v`` on the y faces,
doubly periodic, float32, 2048² by default, three ways:

* ``xstencil``: ``ds.stencil.map(kernel, grid=G, at={"X": "left", "Y": "left"})``,
  the whole labelled call (grid parsing, the translation to a plain map, the
  compiled kernel, the result's dims and coords), on JAX-backed data;
* ``jnp``: a hand-written ``jax.jit`` of ``jnp.roll`` differences on the raw
  arrays (the baseline; target: xstencil <= 1.2x);
* ``xgcm``: ``grid.diff(v, "X") - grid.diff(u, "Y")`` with xgcm 0.10.1 on
  numpy-backed data (target: xstencil >= 3x faster).

Compilation is excluded (warm-up calls); the columns are timed round-robin and
each call ends in ``block_until_ready``; the figure is the median per call.
The xstencil result is checked against the jnp one before timing.

Run: ``PYTHONPATH=. python benchmarks/staggered.py [--n 2048] [--quick]``.
"""

from __future__ import annotations

import argparse
import os

import jax
import jax.numpy as jnp
import numpy as np
import xarray as xr

import xstencil  # noqa: F401

try:  # run as ``python benchmarks/staggered.py``: benchmarks/ is sys.path[0]
    import _harness as H
except ImportError:  # imported as ``benchmarks.staggered`` from the repository root
    from benchmarks import _harness as H

COORDS = {"X": {"center": "x_c", "left": "x_g"}, "Y": {"center": "y_c", "left": "y_g"}}
CORNERS = {"X": "left", "Y": "left"}


def vorticity(s):
    return s.v(X=0.5) - s.v(X=-0.5) - s.u(Y=0.5) + s.u(Y=-0.5)


@jax.jit
def vorticity_jnp(u, v):
    # at corner (j, i): v at (j, i) minus v at (j, i - 1), u at (j, i) minus u at (j - 1, i)
    return v - jnp.roll(v, 1, axis=1) - u + jnp.roll(u, 1, axis=0)


def dataset(n: int, backend: str) -> xr.Dataset:
    rng = np.random.default_rng(0)
    u = rng.standard_normal((n, n), dtype=np.float32)
    v = rng.standard_normal((n, n), dtype=np.float32)
    wrap = jnp.asarray if backend == "jax" else np.asarray
    return xr.Dataset(
        {"u": (("y_c", "x_g"), wrap(u)), "v": (("y_g", "x_c"), wrap(v))},
        coords={"x_c": np.arange(n) + 0.5, "x_g": np.arange(n) * 1.0,
                "y_c": np.arange(n) + 0.5, "y_g": np.arange(n) * 1.0})


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=2048)
    p.add_argument("--runs", type=int, default=15)
    H.add_output_flags(p, "512² and 5 runs; print only")
    a = p.parse_args(argv)
    n, runs = (512, 5) if a.quick else (a.n, a.runs)

    import xgcm  # the oracle and the baseline; not a dependency of xstencil

    ds_jax, ds_np = dataset(n, "jax"), dataset(n, "numpy")
    grid = xgcm.Grid(ds_np, coords=COORDS, padding="periodic", autoparse_metadata=False)
    u, v = ds_jax.u.data, ds_jax.v.data

    def run_xstencil():
        out = ds_jax.stencil.map(vorticity, grid=grid, at=CORNERS)
        return jax.block_until_ready(out.data)

    def run_jnp():
        return jax.block_until_ready(vorticity_jnp(u, v))

    def run_xgcm():
        return (grid.diff(ds_np.v, "X") - grid.diff(ds_np.u, "Y")).values

    ref = np.asarray(run_jnp())
    got = ds_jax.stencil.map(vorticity, grid=grid, at=CORNERS)
    assert got.dims == ("y_g", "x_g"), got.dims
    np.testing.assert_allclose(np.asarray(got.values), ref, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(run_xgcm(), ref, rtol=1e-5, atol=1e-5)

    names = ["xstencil (labelled, grid=)", "hand-written jnp (jit)", "xgcm diff on numpy"]
    timings = H.interleave([H.Runner(f, runs, 3) for f in (run_xstencil, run_jnp, run_xgcm)])
    tx, tj, tg = (t.median for t in timings)
    rows = "\n".join(f"| {name} | {H.fmt_time(t.median)} | {t.median / tj:.2f}× |"
                     for name, t in zip(names, timings, strict=True))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    text = f"""## Staggered grids (`benchmarks/staggered.py`)

C-grid relative vorticity at the corners with an `xgcm.Grid` (periodic), {n}² float32:
`ds.stencil.map(kernel, grid=G, at={{"X": "left", "Y": "left"}})`.  Machine: {os.cpu_count()} CPU
cores, load average {load:.1f} (the columns are timed round-robin).  Medians of {runs} runs,
compile excluded.

| how | time | vs jnp |
|---|---|---|
{rows}

- xstencil / hand-written jnp: **{tx / tj:.2f}×** (target ≤ 1.2×)
- xgcm on numpy / xstencil: **{tg / tx:.1f}×** faster (target ≥ 3×)
"""
    H.publish("staggered", text, a)


if __name__ == "__main__":
    main()

"""Staggered kernels on dask-backed data: lazy, chunked per position, and
equal to the in-memory results (maps and a scan with one kernel per
position, whose halos cross chunk edges along every position's dim)."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

import xstencil  # noqa: F401

dask = pytest.importorskip("dask")

GRID = {"X": {"center": "x_c", "left": "x_g"}, "Y": {"center": "y_c", "left": "y_g"}}
CHUNKS = {"x_c": 5, "x_g": 5, "y_c": 4, "y_g": 4}
DT, GRAV = 0.05, 9.81


def c_grid(nx: int = 15, ny: int = 12) -> xr.Dataset:
    rng = np.random.default_rng(1)
    return xr.Dataset(
        {"u": (("y_c", "x_g"), 0.1 * rng.standard_normal((ny, nx))),
         "v": (("y_g", "x_c"), 0.1 * rng.standard_normal((ny, nx))),
         "h": (("y_c", "x_c"), 1 + 0.1 * rng.standard_normal((ny, nx)))},
        coords={"x_c": np.arange(nx) + 0.5, "x_g": np.arange(nx) * 1.0,
                "y_c": np.arange(ny) + 0.5, "y_g": np.arange(ny) * 1.0})


@pytest.mark.parametrize("boundary", ["periodic", "fill", "extend"])
def test_dask_map_equals_memory(x64: None, boundary: str) -> None:
    ds = c_grid()

    def vort(s):
        return s.v(X=0.5) - s.v(X=-0.5) - s.u(Y=0.5) + s.u(Y=-0.5)

    at = {"X": "left", "Y": "left"}
    ref = ds.stencil.map(vort, grid=GRID, at=at, boundary=boundary)
    with dask.config.set(scheduler="synchronous"):
        lazy = ds.chunk(CHUNKS).stencil.map(vort, grid=GRID, at=at, boundary=boundary)
        assert isinstance(lazy.data, dask.array.Array)
        assert lazy.dims == ("y_g", "x_g")
        np.testing.assert_allclose(lazy.values, ref.values, rtol=1e-13, atol=1e-13)


def h_next(s, x: float = 0, y: float = 0):
    h = lambda a, b: s.h(time=-1, X=x + a, Y=y + b)  # noqa: E731
    fe = 0.5 * (h(0, 0) + h(1, 0)) * s.u(time=-1, X=x + 0.5, Y=y)
    fw = 0.5 * (h(0, 0) + h(-1, 0)) * s.u(time=-1, X=x - 0.5, Y=y)
    fn = 0.5 * (h(0, 0) + h(0, 1)) * s.v(time=-1, X=x, Y=y + 0.5)
    fs = 0.5 * (h(0, 0) + h(0, -1)) * s.v(time=-1, X=x, Y=y - 0.5)
    return h(0, 0) - DT * (fe - fw + fn - fs)


KERNELS = {
    "h": h_next,
    "u": lambda s: s.u(time=-1) - DT * GRAV * (h_next(s, x=0.5) - h_next(s, x=-0.5)),
    "v": lambda s: s.v(time=-1) - DT * GRAV * (h_next(s, y=0.5) - h_next(s, y=-0.5)),
}


def test_dask_scan_one_kernel_per_position_equals_memory(x64: None) -> None:
    ds = c_grid()
    kw = dict(dim="time", steps=12, grid=GRID, boundary="periodic", save_every=4)
    ref = ds.stencil.scan(KERNELS, **kw)
    with dask.config.set(scheduler="synchronous"):
        lazy = ds.chunk(CHUNKS).stencil.scan(KERNELS, halo_every=2, **kw)
        assert isinstance(lazy.h.data, dask.array.Array)
        out = lazy.compute()
    for n in ("u", "v", "h"):
        assert out[n].dims == ref[n].dims
        np.testing.assert_allclose(out[n].values, ref[n].values, rtol=1e-13, atol=1e-13)
    mass = out.h.sum(("y_c", "x_c")).values
    np.testing.assert_allclose(mass, mass[0], rtol=1e-14)

"""Staggered kernels on dask-backed data: lazy, chunked per position, and
equal to the in-memory results (maps and a scan with one kernel per
position, whose halos cross chunk edges along every position's dim)."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

import xstencil  # noqa: F401
from xstencil import XStencilError

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


def test_a_grid_coordinate_read_on_dask_says_what_to_do():
    # session 27's ocean port: f(y) read as s.coord("Y") on a chunked C-grid named a
    # hidden variable ('__xs_c_y_c') and advised xr.broadcast, which cannot help
    n = 8
    ds = xr.Dataset({"h": (("y_c", "x_c"), np.ones((n, n))),
                     "u": (("y_c", "x_g"), np.zeros((n, n)))},
                    coords={"x_c": np.arange(n) + .5, "x_g": np.arange(n) + 0.,
                            "y_c": np.arange(n) + .5})
    grid = {"X": {"center": "x_c", "left": "x_g"}, "Y": {"center": "y_c"}}

    def k(s):
        return s.u(time=-1) + 1e-4 * s.coord("Y")() * (s.h(time=-1, X=0.5) - s.h(time=-1, X=-0.5))

    lazy = ds.chunk({"x_c": 4, "x_g": 4})
    with pytest.raises(XStencilError, match=r"cannot read a grid coordinate.*data variable") as e:
        lazy.stencil.scan({"u": k}, dim="time", grid=grid, boundary="periodic", steps=2)
    assert "__xs_" not in str(e.value)
    with pytest.raises(XStencilError, match=r"cannot read a grid coordinate") as e:
        lazy.stencil.map(lambda s: s.coord("Y")() * s.u(), grid=grid,
                         at={"X": "left", "Y": "center"}, boundary="periodic")
    assert "__xs_" not in str(e.value)
    # the advised way: f as a variable over the field's dims, bitwise the in-memory run
    f = xr.broadcast(ds.y_c * 1e-4, ds.u)[0].rename("f")
    ds2 = ds.assign(f=f)

    def k2(s):
        return s.u(time=-1) + s.f(time=-1) * (s.h(time=-1, X=0.5) - s.h(time=-1, X=-0.5))

    kw = dict(dim="time", grid=grid, boundary="periodic", steps=2)
    mem = ds2.stencil.scan({"u": k2}, **kw)
    got = ds2.chunk({"x_c": 4, "x_g": 4}).stencil.scan({"u": k2}, **kw).compute()
    np.testing.assert_array_equal(got.u.values, mem.u.values)

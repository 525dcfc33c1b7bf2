"""On a grid, a result is placed on the output's full dims for ``at`` (docs/staggered.rst),
even when the kernel reads only coordinates (the plain Dataset rule would give it only
the dims it read)."""

from __future__ import annotations

import numpy as np
import xarray as xr

import xstencil  # noqa: F401 - the .stencil accessor

GRID = {"X": {"center": "x_c", "left": "x_g"}, "Y": {"center": "y_c", "left": "y_g"}}
U_AT = {"X": "left", "Y": "center"}


def c_grid(nx: int = 6, ny: int = 4) -> xr.Dataset:
    rng = np.random.default_rng(1)
    x_g = np.cumsum(rng.uniform(0.5, 1.5, nx))
    return xr.Dataset(
        {"u": (("y_c", "x_g"), rng.standard_normal((ny, nx))),
         "h": (("y_c", "x_c"), rng.standard_normal((ny, nx)))},
        coords={"x_g": x_g, "x_c": x_g + 0.25, "y_c": np.arange(ny) + 0.5,
                "y_g": np.arange(ny) * 1.0})


def test_coordinate_only_result_gets_the_full_output_dims() -> None:
    ds = c_grid()
    out = ds.stencil.map(lambda s: {"x": s.coord("X")(), "dx": s.h.coord("X")(X=0.5)
                                    - s.h.coord("X")(X=-0.5)},
                         grid=GRID, at=U_AT, boundary="extend", new_vars=("x", "dx"))
    assert out["x"].dims == ("y_c", "x_g")
    assert out["dx"].dims == ("y_c", "x_g")
    np.testing.assert_array_equal(out["x"].values, np.broadcast_to(ds.x_g.values, (4, 6)))
    x_c = ds.x_c.values
    # past the edge the coordinate continues linearly (as a plain map's u.coord does):
    # the first face's x_c(X=-0.5) is x_c[0] - (x_c[1] - x_c[0]), not x_c[0] again
    dx = np.concatenate([[x_c[1] - x_c[0]], np.diff(x_c)])
    np.testing.assert_allclose(out["dx"].values, np.broadcast_to(dx, (4, 6)), rtol=1e-12)
    out["x"].values[0, 0] = -1.0  # a result of its own, not a read-only broadcast view
    assert out["x"].values[1, 0] == ds.x_g.values[0]
    xr.testing.assert_identical(out["u"], ds["u"])
    xr.testing.assert_identical(out["x"].x_g, ds.x_g)


def test_dataarray_coordinate_only_result_gets_the_full_output_dims() -> None:
    ds = c_grid()
    out = ds.h.stencil.map(lambda h: h.coord("Y")(), grid=GRID, boundary="extend")
    assert out.dims == ds.h.dims
    np.testing.assert_array_equal(out.values, np.broadcast_to(ds.y_c.values[:, None], (4, 6)))


def test_result_reading_one_axis_is_constant_along_the_other() -> None:
    ds = c_grid()
    out = ds.stencil.map(lambda s: {"w": s.u.coord("X")() * 2.0}, grid=GRID, at=U_AT,
                         boundary="extend", new_vars="w")
    assert out["w"].dims == ("y_c", "x_g")
    np.testing.assert_allclose(out["w"].values, np.tile(2 * ds.x_g.values, (4, 1)))

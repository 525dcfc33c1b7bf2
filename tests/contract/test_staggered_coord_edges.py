"""Coordinates read past a non-periodic edge on a grid continue linearly.

A plain map's ``u.coord`` extrapolates the coordinate into the halo for
``fill`` and ``extend`` (docs/window.rst).  On a grid, coordinates travel as
hidden variables and were padded like the data: the fill value, or the edge
value repeated, so a derivative at the first face came out twice too large
(``fill``) or 0/0 (``extend``).  Checked against plain maps and numpy, on
numpy and dask data.
"""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

import xstencil  # noqa: F401 - the .stencil accessor

GRID = {"X": {"center": "x_c", "left": "x_g"}}


def _ds(n: int = 7) -> xr.Dataset:
    x_g = np.cumsum(np.random.default_rng(2).uniform(0.2, 0.4, n))  # uneven faces
    x_c = x_g + 0.1
    return xr.Dataset({"h": ("x_c", x_c ** 2), "u": ("x_g", np.zeros(n))},
                      coords={"x_c": x_c, "x_g": x_g})


def _extended(c: np.ndarray) -> np.ndarray:
    """``c`` with one more point at each end, continued linearly."""
    return np.concatenate([[2 * c[0] - c[1]], c, [2 * c[-1] - c[-2]]])


@pytest.mark.parametrize("mode", ["fill", "extend"])
@pytest.mark.parametrize("chunked", [False, True])
def test_coordinate_past_the_edge_continues_linearly(mode, chunked):
    ds = _ds()
    if chunked:
        ds = ds.chunk({"x_c": 4, "x_g": 4})
    x_c, x_g = ds.x_c.values, ds.x_g.values
    opts = dict(grid=GRID, boundary={"X": mode}, fill_value=0.0)
    west = ds.stencil.map(lambda s: s.h.coord("X")(X=-0.5), at={"X": "left"}, **opts)
    np.testing.assert_allclose(np.asarray(west), _extended(x_c)[:-2], rtol=1e-14)
    east = ds.stencil.map(lambda s: s.u.coord("X")(X=1.5), at={"X": "center"}, **opts)
    xg = _extended(_extended(x_g))  # two points past the high end
    np.testing.assert_allclose(np.asarray(east), xg[4:], rtol=1e-14)
    # a plain map on the same coordinate agrees
    plain = ds.h.stencil.map(lambda u: u.coord("x_c")(x_c=-1), boundary=mode, fill_value=0.0)
    np.testing.assert_allclose(np.asarray(plain), _extended(x_c)[:-2], rtol=1e-14)


@pytest.mark.parametrize("mode", ["fill", "extend"])
def test_derivative_at_the_first_face(mode):
    ds = _ds()
    x_c, h = ds.x_c.values, ds.h.values
    got = ds.stencil.map(lambda s: (s.h(X=0.5) - s.h(X=-0.5))
                         / (s.h.coord("X")(X=0.5) - s.h.coord("X")(X=-0.5)),
                         grid=GRID, at={"X": "left"}, boundary={"X": mode}, fill_value=0.0)
    west = 0.0 if mode == "fill" else h[0]  # the data's own halo
    want0 = (h[0] - west) / (x_c[0] - (2 * x_c[0] - x_c[1]))
    assert np.isfinite(got.values).all()
    np.testing.assert_allclose(got.values[0], want0, rtol=1e-13)
    np.testing.assert_allclose(got.values[1:], np.diff(h) / np.diff(x_c), rtol=1e-13)


def test_periodic_coordinate_still_wraps_by_the_period():
    ds = _ds()
    x_c = ds.x_c.values
    got = ds.stencil.map(lambda s: s.h.coord("X")(X=-0.5), grid=GRID, at={"X": "left"},
                         boundary={"X": "periodic"}, period={"X": 3.0})
    np.testing.assert_allclose(got.values, np.concatenate([[x_c[-1] - 3.0], x_c[:-1]]))


def test_a_mesh_mask_on_another_position_is_refused():
    """A mask on the centres of an axis whose output is on its faces selected
    the face with the same index, half a cell away; the output's own dims
    work."""
    from xstencil import XStencilError

    nx, ny = 6, 2
    ds = xr.Dataset({"u": (("y_c", "x_g"), np.ones((ny, nx)))},
                    coords={"x_c": np.arange(nx) + 0.5, "x_g": np.arange(nx) * 1.0,
                            "y_c": np.arange(ny) + 0.5})
    grid = {"X": {"center": "x_c", "left": "x_g"}, "Y": {"center": "y_c"}}
    m = ds.stencil.mesh(grid=grid, at={"X": "left", "Y": "center"}, boundary="extend")
    m[...] = lambda s: s.u()
    land = xr.DataArray(np.zeros((ny, nx), bool), dims=("y_c", "x_c"))
    land[:, 2] = True
    with pytest.raises(XStencilError, match=r"dim 'x_c' .* output at 'left'.*\('x_g'\)"):
        m[land] = lambda s: 0.0
    m[land.rename(x_c="x_g")] = lambda s: 0.0
    out = m.map()
    want = np.ones((ny, nx))
    want[:, 2] = 0.0
    np.testing.assert_array_equal(out.values, want)
    assert out.dims == ("y_c", "x_g")


def test_integer_coordinates_beyond_2_53_are_refused_on_a_grid():
    """As in a plain map (read_coord): their differences would be rounded to 256."""
    from xstencil import XStencilError

    big = 1_700_000_000_000_000_000 + 1000 * np.arange(6, dtype=np.int64)
    ds = xr.Dataset({"h": ("x_c", np.arange(6.0)), "u": ("x_g", np.zeros(6))},
                    coords={"x_c": big + 500, "x_g": big})
    with pytest.raises(XStencilError, match=r"'x_c' holds integers beyond 2\*\*53"):
        ds.stencil.map(lambda s: s.h.coord("X")(X=0.5) - s.h.coord("X")(X=-0.5), grid=GRID,
                       at={"X": "left"}, boundary={"X": "extend"})

"""Coordinate windows ``u.coord("x")``: halo values per boundary mode, the
periodic seam, non-uniform grids and datetime coordinates."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

import xstencil
from tests.labelled.reference import pad_coord, ref_map


def dx_back(u):
    x = u.coord("x")
    return x() - x(x=-1)


def dx_fwd(u):
    x = u.coord("x")
    return x(x=1) - x()


def ddx(u):
    x = u.coord("x")
    return (u(x=1) - u(x=-1)) / (x(x=1) - x(x=-1))


def coord_patch(u):
    return u.coord("x").array


X = np.array([0.0, 0.5, 1.5, 3.0, 3.5, 5.0])  # non-uniform


@pytest.mark.parametrize("boundary", ["fill", "extend", "periodic", "reflect", "symmetric",
                                      "valid"])
def test_coordinate_halo_matches_reference(boundary):
    x = np.linspace(0.0, 2.5, 6) if boundary == "periodic" else X
    da = xr.DataArray(np.zeros(6), dims="x", coords={"x": x})
    out = da.stencil.map(coord_patch, window={"x": 5}, boundary=boundary, output_dims="w")
    expect, _ = ref_map(da.values, ("x",), coord_patch, window={"x": 5}, boundary=boundary,
                        coords={"x": x})
    np.testing.assert_allclose(out.values, expect)


def test_periodic_seam_inferred_period():
    x = np.arange(8) * 0.25  # period 2.0
    da = xr.DataArray(np.sin(np.pi * x), dims="x", coords={"x": x})
    fwd = da.stencil.map(dx_fwd, boundary="periodic")
    back = da.stencil.map(dx_back, boundary="periodic")
    # the neighbour of the last point reads as first + period
    np.testing.assert_allclose(fwd.values, 0.25)
    np.testing.assert_allclose(back.values, 0.25)
    d = da.stencil.map(ddx, boundary="periodic")
    u = da.values
    np.testing.assert_allclose(d.values, (np.roll(u, -1) - np.roll(u, 1)) / 0.5)


def test_periodic_seam_given_period_on_non_uniform_grid():
    da = xr.DataArray(np.arange(6.0), dims="x", coords={"x": X})
    with pytest.raises(xstencil.XStencilError,
                       match=r"coordinate 'x' is not uniformly spaced.*period=\{'x': \.\.\.\}"):
        da.stencil.map(dx_fwd, boundary="periodic")
    out = da.stencil.map(dx_fwd, boundary="periodic", period={"x": 6.0})
    np.testing.assert_allclose(out.values, np.diff(np.r_[X, X[0] + 6.0]))
    m = da.stencil.mesh(boundary="periodic", period={"x": 6.0})
    m[...] = dx_back
    np.testing.assert_allclose(m.map().values, np.diff(np.r_[X[-1] - 6.0, X]))


@pytest.mark.parametrize("boundary", ["reflect", "symmetric"])
def test_mirrored_coordinates_keep_distances(boundary):
    da = xr.DataArray(np.zeros(6), dims="x", coords={"x": X})
    fwd = da.stencil.map(dx_fwd, boundary=boundary).values
    back = da.stencil.map(dx_back, boundary=boundary).values
    # reflect mirrors about the edge point, symmetric about the point half a
    # spacing beyond it: either way the ghost neighbour sits one edge spacing away
    assert back[0] == pytest.approx(X[1] - X[0])
    assert fwd[-1] == pytest.approx(X[-1] - X[-2])
    np.testing.assert_allclose(fwd[:-1], np.diff(X))


@pytest.mark.parametrize("boundary", ["reflect", "symmetric"])
@pytest.mark.parametrize("x", [X[:3], X[:2], X], ids=["n3", "n2", "n6"])
def test_mirrored_coordinates_unfold_past_one_reflection(boundary, x):
    # a window deeper than the grid: the data's index bounces between the ends,
    # while the coordinate keeps unfolding (it once read back the same values,
    # so a derivative divided by a wrong or zero distance)
    n = len(x)
    da = xr.DataArray(np.zeros(n), dims="x", coords={"x": x})
    w = 4 * n + 1
    out = da.stencil.map(coord_patch, window={"x": w}, boundary=boundary, output_dims="w")
    expect, _ = ref_map(da.values, ("x",), coord_patch, window={"x": w}, boundary=boundary,
                        coords={"x": x})
    np.testing.assert_allclose(out.values, expect)
    assert (np.diff(out.values, axis=-1) > 0).all()  # strictly increasing across the halo
    # the mirrored spacings: one fold below the grid is its mirror image
    left = out.values[0, : w // 2 + 1]
    steps = np.diff(left)[::-1]
    mirror = np.diff(x) if boundary == "reflect" else np.r_[x[1] - x[0], np.diff(x)]
    np.testing.assert_allclose(steps[: len(mirror)], mirror)


def test_non_uniform_derivative_is_exact_for_linear_data():
    da = xr.DataArray(3.0 * X + 1.0, dims="x", coords={"x": X})
    out = da.stencil.map(ddx, boundary="valid")
    np.testing.assert_allclose(out.values, 3.0)
    np.testing.assert_array_equal(out.x.values, X[1:-1])
    ext = da.stencil.map(ddx, boundary="extend")  # edge values repeat, coords extrapolate
    assert ext.values[0] == pytest.approx((da.values[1] - da.values[0]) / (2 * (X[1] - X[0])))


def test_coordinates_in_2d_and_float32_data():
    y = np.array([0.0, 1.0, 3.0])
    da = xr.DataArray(np.zeros((3, 6), np.float32), dims=("y", "x"), coords={"y": y, "x": X})

    def k(u):
        return u.coord("y")(y=1) - u.coord("x")(x=-1)

    out = da.stencil.map(k, boundary="extend")
    assert out.dtype == np.float32
    yp = pad_coord(y, 1, 1, "extend")
    xp = pad_coord(X, 1, 1, "extend")
    np.testing.assert_allclose(out.values, yp[2:, None] - xp[None, :-2], rtol=1e-6)


def test_datetime_coordinate_becomes_float_seconds():
    t = np.datetime64("2020-01-01T00:00") + np.array([0, 1, 3, 6], dtype="timedelta64[h]")
    da = xr.DataArray(np.array([0.0, 1.0, 3.0, 6.0]), dims="t", coords={"t": t})

    def rate(u):
        tt = u.coord("t")
        return (u(t=1) - u(t=-1)) / (tt(t=1) - tt(t=-1))

    out = da.stencil.map(rate, boundary="valid")
    np.testing.assert_allclose(out.values, 1 / 3600)
    absolute = da.stencil.map(lambda u: u.coord("t")(), window={"t": 1}, boundary="valid")
    np.testing.assert_allclose(absolute.values, [0.0, 3600.0, 3 * 3600.0, 6 * 3600.0])


def test_coord_of_a_dim_outside_the_window_or_without_coordinate():
    da = xr.DataArray(np.zeros((3, 4)), dims=("y", "x"), coords={"x": np.arange(4.0)})
    with pytest.raises(xstencil.XStencilError,
                       match=r"u\.coord\('y'\): no coordinate 'y' is available; available are "
                             r"\('x',\)"):
        da.stencil.map(lambda u: u.coord("y")(y=1) + u(x=1))

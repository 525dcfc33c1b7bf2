"""Terrain analysis ported from xarray-spatial, as a raster user would write it.

xarray-spatial (``xrspatial``) is what an xarray user reaches for to get
slope, aspect, hillshade and curvature from a DEM.  Each function here is
the user's xstencil version of one of them, written from its documented
definition: Horn's 3 x 3 finite differences for slope and aspect, central
differences (``np.gradient``) for hillshade, the 4-neighbour Laplacian for
curvature, with NaN on the border ring, where xrspatial writes NaN.  The
cell size comes from the coordinates inside the kernel (``u.coord``).  Each
result is compared with xrspatial's own, on numpy and dask-backed rasters,
on both backends; north-up rasters (y decreasing) included.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr

import xstencil  # noqa: F401 - registers .stencil

xrs = pytest.importorskip("xrspatial")

NAN_RING = dict(boundary="fill", fill_value=np.nan)  # reads past the edge are NaN


def dem(ny: int = 40, nx: int = 56, north_up: bool = True, res: float = 30.0,
        dtype: Any = np.float32) -> xr.DataArray:
    """Smooth synthetic terrain (hills and a ridge), in metres, on a projected grid;
    a flat plateau in one corner (aspect's flat-cell rule)."""
    y = np.arange(ny) * res + 4.5e6
    x = np.arange(nx) * res + 5.0e5
    if north_up:
        y = y[::-1]
    yy, xx = np.meshgrid(np.arange(ny), np.arange(nx), indexing="ij")
    z = (400 + 120 * np.exp(-((xx - 20) ** 2 + (yy - 15) ** 2) / 60)
         + 60 * np.sin(xx / 6.0) * np.cos(yy / 9.0) + 2.0 * xx)
    z[:8, :8] = 500.0
    return xr.DataArray(z.astype(dtype), dims=("y", "x"), coords={"y": y, "x": x},
                        name="elevation", attrs={"units": "m"})


def _spacing(u: Any, d: str) -> Any:
    c = u.coord(d)
    return jnp.abs(c(**{d: 1}) - c(**{d: -1})) / 2


def _horn(u: Any) -> tuple[Any, Any]:
    """Horn's (1981) weighted differences along x and down the rows."""
    a, b, c = u(y=-1, x=-1), u(y=-1), u(y=-1, x=1)
    d, f = u(x=-1), u(x=1)
    g, h, i = u(y=1, x=-1), u(y=1), u(y=1, x=1)
    return ((c + 2 * f + i) - (a + 2 * d + g)) / 8, ((g + 2 * h + i) - (a + 2 * b + c)) / 8


def slope_kernel(u: Any) -> Any:
    """Slope in degrees."""
    dx, dy = _horn(u)
    p = jnp.sqrt((dx / _spacing(u, "x")) ** 2 + (dy / _spacing(u, "y")) ** 2)
    return jnp.degrees(jnp.arctan(p))


def aspect_kernel(u: Any) -> Any:
    """Compass aspect in degrees (0 north, clockwise); -1 on flat cells.
    Cells are taken as square, as xrspatial's planar aspect does."""
    dx, dy = _horn(u)
    theta = jnp.degrees(jnp.arctan2(dy, -dx))
    compass = jnp.where(theta < 0, 90 - theta, jnp.where(theta > 90, 450 - theta, 90 - theta))
    return jnp.where((dx == 0) & (dy == 0), -1.0, compass)


def hillshade_kernel(u: Any, azimuth: float = 225.0, altitude: float = 25.0) -> Any:
    gy = (u(y=1) - u(y=-1)) / 2  # np.gradient's axis 0 and 1, in cells
    gx = (u(x=1) - u(x=-1)) / 2
    slope = np.pi / 2 - jnp.arctan(jnp.sqrt(gy * gy + gx * gx))
    aspect = jnp.arctan2(-gy, gx)
    az, alt = np.radians(360.0 - azimuth), np.radians(altitude)
    shaded = (np.sin(alt) * jnp.sin(slope)
              + np.cos(alt) * jnp.cos(slope) * jnp.cos(az - np.pi / 2 - aspect))
    return (shaded + 1) / 2


def curvature_kernel(u: Any) -> Any:
    """Curvature in 1/100 z-units, on square cells of the x spacing."""
    d = (u(y=1) + u(y=-1)) / 2 - u()
    e = (u(x=1) + u(x=-1)) / 2 - u()
    return -2 * (d + e) * 100 / _spacing(u, "x") ** 2


def _compare(mine: xr.DataArray, theirs: xr.DataArray, *, atol: float,
             circular: bool = False) -> None:
    a, b = np.asarray(mine.values, np.float64), np.asarray(theirs.values, np.float64)
    np.testing.assert_array_equal(np.isnan(a), np.isnan(b))  # the NaN ring, exactly
    ok = ~np.isnan(b)
    diff = np.abs(a[ok] - b[ok])
    if circular:  # 0 and 360 degrees are one direction
        diff = np.minimum(diff, 360 - diff)
    assert diff.max() <= atol, diff.max()
    for d in mine.dims:
        np.testing.assert_array_equal(mine[d].values, theirs[d].values)


@pytest.mark.parametrize("backend", ["loops", "xla"])
@pytest.mark.parametrize("north_up", [True, False])
def test_slope_matches_xrspatial(backend, north_up):
    z = dem(north_up=north_up)
    mine = z.stencil.map(slope_kernel, backend=backend, **NAN_RING)
    _compare(mine, xrs.slope(z), atol=2e-4)
    assert mine.dtype == np.float32 and mine.name == "elevation"
    assert float(mine.max()) > 20  # real relief, not a flat comparison


@pytest.mark.parametrize("backend", ["loops", "xla"])
def test_aspect_matches_xrspatial(backend):
    # xrspatial reads float32 and sums in float64 (numba promotes ``2 * f``):
    # near-flat cells' angles are sensitive to the sums' rounding, so the port
    # sums the same float32 values in float64 too, and rounds at the end
    z = dem().astype(np.float64)
    mine = z.stencil.map(aspect_kernel, backend=backend, **NAN_RING)
    assert mine.dtype == np.float64
    _compare(mine.astype(np.float32), xrs.aspect(z), atol=1e-4, circular=True)
    inner = mine.values[1:-1, 1:-1]
    assert (inner == -1).sum() == 6 * 6  # the plateau's interior is flat
    assert np.nanmax(inner) > 300 and np.nanmin(inner[inner >= 0]) < 60  # all around


@pytest.mark.parametrize("backend", ["loops", "xla"])
def test_hillshade_and_curvature_match_xrspatial(backend):
    z = dem(res=1.0)  # xrspatial's hillshade differences in cells
    shade = z.stencil.map(hillshade_kernel, backend=backend, **NAN_RING)
    _compare(shade, xrs.hillshade(z), atol=2e-6)
    z30 = dem()
    curv = z30.stencil.map(curvature_kernel, backend=backend, **NAN_RING)
    _compare(curv, xrs.curvature(z30), atol=2e-5)
    assert np.nanstd(curv.values) > 0.01


def test_dask_raster_matches_xrspatial_and_stays_lazy():
    dask = pytest.importorskip("dask")
    z = dem(ny=64, nx=80).chunk({"y": 24, "x": 32})
    mine = z.stencil.map(slope_kernel, **NAN_RING)
    assert isinstance(mine.data, dask.array.Array)
    _compare(mine.compute(), xrs.slope(z).compute(), atol=2e-4)


def test_float64_dem_stays_float64_and_is_closer_to_exact():
    """A float64 DEM gives float64 slopes, against the exact slope of a plane
    (xrspatial computes in float32 whatever the input)."""
    z = dem(dtype=np.float64)
    yy, xx = np.meshgrid(z.y.values, z.x.values, indexing="ij")
    plane = z.copy(data=0.3 * (xx - xx.min()) + 0.4 * (yy - yy.min()))
    got = plane.stencil.map(slope_kernel, **NAN_RING)
    assert got.dtype == np.float64
    exact = np.degrees(np.arctan(0.5))
    inner = got.values[1:-1, 1:-1]
    np.testing.assert_allclose(inner, exact, rtol=1e-12)
    assert np.abs(xrs.slope(plane).values[1:-1, 1:-1] - exact).max() > 1e-7  # float32 there

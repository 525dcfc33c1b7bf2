"""A periodic dim's coordinate is needed only by a kernel that reads it.

A periodic boundary continues a coordinate across the seam by its period,
inferred from a uniform grid.  Kernels that never call ``u.coord`` used to be
refused on a non-uniform coordinate too ("pass period="), and a uniform grid
stored in float32 (a 0.1 degree longitude from a file) was refused as
non-uniform, by float32's rounding of its values.
"""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

from xstencil import XStencilError

BACKENDS = ["loops", "xla"]
X_UNEVEN = np.array([0.0, 1.0, 3.0, 4.0, 7.0, 9.0, 10.5, 12.0])


def _uneven(n_y: int = 5) -> xr.DataArray:
    rng = np.random.default_rng(0)
    return xr.DataArray(rng.random((n_y, X_UNEVEN.size)), dims=("y", "x"),
                        coords={"x": X_UNEVEN, "y": np.arange(n_y) * 0.5})


def _slope(u):
    return (u(x=1) - u(x=-1)) / (u.coord("x")(x=1) - u.coord("x")(x=-1))


@pytest.mark.parametrize("backend", BACKENDS)
def test_uneven_periodic_coordinate_not_read(backend):
    da = _uneven()
    out = da.stencil.map(lambda u: u(x=1) - 2 * u() + u(x=-1), boundary="periodic",
                         backend=backend)
    a = da.values
    ref = np.roll(a, -1, 1) - 2 * a + np.roll(a, 1, 1)
    np.testing.assert_allclose(out.values, ref, rtol=1e-13, atol=1e-14)
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out.x.values, X_UNEVEN)


@pytest.mark.parametrize("backend", BACKENDS)
def test_uneven_periodic_coordinate_read_still_needs_period(backend):
    da = _uneven()
    with pytest.raises(XStencilError, match=r"period=\{'x'"):
        da.stencil.map(_slope, boundary="periodic", backend=backend)
    out = da.stencil.map(_slope, boundary="periodic", period={"x": 13.5}, backend=backend)
    a, x = da.values, X_UNEVEN
    xp = np.concatenate([[x[-1] - 13.5], x, [x[0] + 13.5]])
    ref = (np.roll(a, -1, 1) - np.roll(a, 1, 1)) / (xp[2:] - xp[:-2])
    np.testing.assert_allclose(out.values, ref, rtol=1e-13)


def test_uneven_periodic_mesh_and_scan_without_coordinate_reads():
    da = _uneven()
    m = da.stencil.mesh(boundary="periodic")
    m[...] = lambda u: u(x=-1)
    m[{"y": 0}] = lambda u: u(x=1)
    out = m.map()
    a = da.values
    ref = np.roll(a, 1, 1)
    ref[0] = np.roll(a[0], -1)
    np.testing.assert_array_equal(out.values, ref)
    traj = da.stencil.scan(lambda u: u(time=-1, x=-1), dim="time", steps=3,
                           boundary={"x": "periodic", "y": "extend", "time": "fill"})
    np.testing.assert_array_equal(traj.isel(time=-1).values, np.roll(a, 3, 1))


def _lon(start: float, stop: float, step: float) -> np.ndarray:
    n = round((stop - start) / step)
    return np.linspace(start, stop, n + 1)[:-1].astype(np.float32)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("start", [-180.0, 0.0])
def test_float32_longitude_is_uniform_to_its_rounding(backend, start):
    lon = _lon(start, start + 360.0, 0.1)
    d = np.diff(lon.astype(np.float64))
    assert not np.allclose(d, d[0], rtol=1e-6, atol=0)  # what used to be refused
    rad = np.deg2rad(lon.astype(np.float64))
    da = xr.DataArray(np.sin(rad), dims="lon", coords={"lon": lon})
    out = da.stencil.map(
        lambda u: (u(lon=1) - u(lon=-1)) / (u.coord("lon")(lon=1) - u.coord("lon")(lon=-1)),
        boundary="periodic", backend=backend)
    err = np.abs(out.values - np.cos(rad) * np.pi / 180)
    # the seam (first and last cells) is as accurate as the cells next to it,
    # whose float32 longitudes are rounded alike: the period is 360 to float32's
    # precision, not 3600 times the rounding of d[0] (0.027 degrees from -180)
    near = np.r_[err[1:20], err[-20:-1]].max()
    assert err.max() < 1e-6
    assert err[[0, -1]].max() <= 1.5 * near


def test_float64_coordinate_off_uniform_beyond_rounding_is_refused():
    x = np.arange(8) * 0.1
    x[3] += 1e-5  # not float32-representable, and uneven by far more than rounding
    da = xr.DataArray(np.arange(8.0), dims="x", coords={"x": x})
    with pytest.raises(XStencilError, match="not uniformly spaced"):
        da.stencil.map(_slope, boundary="periodic")


def test_uneven_float32_grid_beyond_rounding_is_refused():
    x = np.array([0, 1, 2, 3.5, 4, 5], dtype=np.float32)
    da = xr.DataArray(np.arange(6.0), dims="x", coords={"x": x})
    with pytest.raises(XStencilError, match="not uniformly spaced"):
        da.stencil.map(_slope, boundary="periodic")


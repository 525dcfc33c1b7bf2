"""Coordinate precision: differences of coordinate reads are exact to the
read dtype's precision (about 1e-7 relative in float32), however large the
values: long datetime records, epoch seconds.  A single position has no
spacing, and none is invented."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from xstencil import XStencilError

# 100 years, 6-hourly: seconds since the start reach 3.2e9 (float32 spacing: 256 s)
TIMES = pd.date_range("1925-01-01", periods=4 * 36525, freq="6h")


def forward_difference(name):
    return lambda u: u.coord(name)(**{name: 1}) - u.coord(name)()


def test_datetime_spacing_exact_in_a_float32_map():
    a = xr.DataArray(np.zeros((len(TIMES), 2), np.float32), dims=("time", "x"),
                     coords={"time": TIMES})
    d = a.stencil.map(forward_difference("time"), window={"time": (0, 1)}, boundary="extend")
    assert d.dtype == np.float32
    np.testing.assert_allclose(d.values, 21600.0, rtol=1e-6, atol=0)


@pytest.mark.parametrize("grown", [False, True])
def test_datetime_spacing_exact_in_a_float32_scan(grown):
    """``u.coord("time")() - u.coord("time")(time=-1)`` per step of a scan,
    over the input's trajectory or a grown one (dt=6 hours)."""
    a = xr.DataArray(np.zeros((len(TIMES), 2), np.float32), dims=("time", "x"),
                     coords={"time": TIMES})

    def k(u):
        t = u.coord("time")
        return u(time=-1) * 0 + (t() - t(time=-1))

    if grown:
        out = a.isel(time=[0]).stencil.scan(k, dim="time", steps=len(TIMES) - 1,
                                            dt=np.timedelta64(6, "h"), save_every=1)
    else:
        out = a.stencil.scan(k, dim="time")
    np.testing.assert_allclose(out.values[1:], 21600.0, rtol=1e-6, atol=0)


@pytest.mark.parametrize("origin", [1e8, 1.7e9])
def test_epoch_seconds_spacing_in_float32(origin):
    """float32 data on a coordinate near 1e8 s used to read a spacing of 0
    or 8 (and derivatives became inf)."""
    t = origin + np.arange(200.0)
    a = xr.DataArray(np.sin(np.arange(200.0)).astype(np.float32), dims="t", coords={"t": t})
    central = a.stencil.map(lambda u: (u.coord("t")(t=1) - u.coord("t")(t=-1)) / 2,
                            boundary="extend")
    np.testing.assert_allclose(central.values, 1.0, rtol=1e-6, atol=0)
    deriv = a.stencil.map(lambda u: (u(t=1) - u(t=-1))
                          / (u.coord("t")(t=1) - u.coord("t")(t=-1)), boundary="extend")
    ref = (np.sin(np.arange(200.0) + 1) - np.sin(np.arange(200.0) - 1)) / 2
    np.testing.assert_allclose(deriv.values[1:-1], ref[1:-1], atol=1e-6)


def test_absolute_reads_are_the_coordinate_in_the_data_dtype():
    """A read alone is the value, as before, in the data's dtype."""
    x = np.linspace(-3.0, 7.0, 11) ** 3
    a = xr.DataArray(np.zeros(11, np.float32), dims="x", coords={"x": x})
    got = a.stencil.map(lambda u: u.coord("x")() * 1, window={"x": 1}, boundary="extend")
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got.values, x.astype(np.float32))
    # arithmetic mixing reads and numbers behaves as on the values
    mixed = a.stencil.map(lambda u: 2.0 * u.coord("x")() - u.coord("x")(x=-1) / 4 + 1,
                          boundary="extend")
    prev = np.concatenate([[x[0] - (x[1] - x[0])], x[:-1]])
    np.testing.assert_allclose(mixed.values, 2 * x - prev / 4 + 1, rtol=1e-6)


def test_non_uniform_coordinate_differences_match_float64(x64):
    """float32 kernels read the same differences as a float64 numpy reference
    (to float32 precision), also across a periodic seam with a period."""
    rng = np.random.default_rng(0)
    x = 1e7 + np.cumsum(rng.uniform(0.5, 1.5, 40))
    a = xr.DataArray(np.zeros(40, np.float32), dims="x", coords={"x": x})
    period = 45.0
    d = a.stencil.map(lambda u: u.coord("x")(x=1) - u.coord("x")(x=-1), boundary="periodic",
                      period={"x": period})
    ext = np.concatenate([[x[-1] - period], x, [x[0] + period]])
    np.testing.assert_allclose(d.values, ext[2:] - ext[:-2], rtol=1e-6)


def test_size_one_dim_invents_no_spacing():
    a = xr.DataArray(np.ones((1, 4), np.float32), dims=("y", "x"),
                     coords={"y": [45.0], "x": [0.0, 1.0, 2.0, 3.0]})
    with pytest.raises(XStencilError, match=r"u\.coord\('y'\) read at offset 1 along 'y': "
                                            r"'y' has a single position, so its coordinate has "
                                            r"no spacing"):
        a.stencil.map(forward_difference("y"), boundary="periodic")
    with pytest.raises(XStencilError, match=r"'y' has a single position"):
        a.stencil.map(lambda u: u.coord("y")(y=-1) + u(), window={"y": 3, "x": 1},
                      boundary="extend")
    # its value alone is fine, and other dims are unaffected
    out = a.stencil.map(lambda u: u.coord("y")() + u.coord("x")(x=1) - u.coord("x")(),
                        window={"y": 3, "x": 3}, boundary="periodic")
    np.testing.assert_allclose(out.values, 46.0)


TZ_TIMES = pd.date_range("2000-01-01", periods=4, freq="6h", tz="Europe/Paris")


def test_timezone_aware_time_coordinate_reads_as_seconds():
    """Used to fail with a TypeError inside coords.py."""
    a = xr.DataArray(np.zeros((4, 2), np.float32), dims=("time", "x"),
                     coords={"time": TZ_TIMES})
    d = a.stencil.map(forward_difference("time"), window={"time": (0, 1)}, boundary="extend")
    np.testing.assert_allclose(d.values, 21600.0)
    out = a.stencil.scan(lambda u: u(time=-1) + u.coord("time")(), dim="time")
    np.testing.assert_allclose(out.values[:, 0], np.cumsum([0.0, 21600, 43200, 64800]))


def test_timezone_aware_time_coordinate_is_not_grown_silently():
    a = xr.DataArray(np.zeros((4, 2)), dims=("time", "x"), coords={"time": TZ_TIMES})
    with pytest.raises(XStencilError, match=r"'time' coordinate is timezone-aware; continuing "
                                            r"it with steps= would silently drop the timezone"
                                            r".*tz_convert\(None\)"):
        a.isel(time=[-1]).stencil.scan(lambda u: u(time=-1) + 1, dim="time", steps=2,
                                       dt=np.timedelta64(6, "h"))


def test_a_coordinate_that_is_not_numeric_is_named():
    a = xr.DataArray(np.zeros((3, 2)), dims=("time", "x"),
                     coords={"time": np.array([1, 2, 3], object)})
    a["time"] = ("time", np.array(["a", "b", "c"], object))
    out = a.stencil.map(lambda u: u(time=1), boundary="extend")  # not read: fine
    np.testing.assert_allclose(out.values, 0.0)

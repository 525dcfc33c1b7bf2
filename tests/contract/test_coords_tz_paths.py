"""A timezone-aware time coordinate reads as seconds on every path (in memory with
the coordinate cache, dask, periodic, a staggered grid) without pandas'
deprecated ``DatetimeIndex.values`` (a Pandas4Warning, an error under the test
settings)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import xarray as xr

import xstencil  # noqa: F401 - the .stencil accessor

T = pd.date_range("2000-03-25", periods=8, freq="7h", tz="Europe/Paris")  # crosses DST


def step(u):
    return u.coord("time")(time=1) - u.coord("time")()


def expected() -> np.ndarray:
    utc = T.tz_convert(None).to_numpy()
    return (np.diff(utc) / np.timedelta64(1, "s")).astype(np.float64)


@pytest.mark.parametrize("chunked", [False, True])
def test_tz_aware_coordinate_in_memory_and_dask(x64: None, chunked: bool) -> None:
    da = xr.DataArray(np.arange(8.0), dims="time", coords={"time": T})
    src = da.chunk(time=4) if chunked else da
    for _ in range(2):  # the second call reuses the cached coordinates
        out = src.stencil.map(step, boundary="extend").compute()
        np.testing.assert_allclose(out.values[:-1], expected(), rtol=1e-12)


def test_tz_aware_coordinate_periodic(x64: None) -> None:
    da = xr.DataArray(np.arange(8.0), dims="time", coords={"time": T})
    period = 8 * 7 * 3600.0
    out = da.stencil.map(step, boundary="periodic", period={"time": period})
    np.testing.assert_allclose(out.values[:-1], expected(), rtol=1e-12)
    np.testing.assert_allclose(out.values[-1], period - expected().sum(), rtol=1e-12)


def test_tz_aware_coordinate_on_a_grid(x64: None) -> None:
    ds = xr.Dataset({"h": ("t_c", np.arange(8.0))}, coords={"t_c": T})
    out = ds.stencil.map(lambda s: s.coord("T")(T=1) - s.coord("T")(),
                         grid={"T": {"center": "t_c"}}, boundary="extend")
    np.testing.assert_allclose(out.values[:-1], expected(), rtol=1e-12)

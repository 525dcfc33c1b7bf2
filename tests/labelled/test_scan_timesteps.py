"""``steps=`` with ``dt=`` on datetime and timedelta coordinates: the new
positions are exact or an error, never wrapped (``xstencil/_labelled/timesteps.py``).

numpy's datetime arithmetic wraps silently: a picosecond ``dt`` on a
nanosecond coordinate of 2026 promoted it to picoseconds and gave positions
in 1969; a long run of large steps overflowed int64."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import xarray as xr

import xstencil  # noqa: F401 - registers the accessor
from xstencil._errors import XStencilError

T0 = np.datetime64("2026-01-01T00:00:00", "ns")


def _step(u: Any) -> Any:
    return u(time=-1) + 1.0


def _grow(u0: xr.DataArray, dt: Any, steps: int = 3) -> xr.DataArray:
    return u0.stencil.scan(_step, dim="time", steps=steps, dt=dt, backend="xla")


def _dated() -> xr.DataArray:
    return xr.DataArray(np.zeros((1, 4)), dims=("time", "x"), coords={"time": [T0]})


def _python_ns(start: int, step: int, n: int) -> list[int]:
    """The positions in Python integers (no wrap possible)."""
    return [start + step * k for k in range(n)]


@pytest.mark.parametrize("dt", [np.timedelta64(1, "ps"), np.timedelta64(1500, "ps"),
                                np.timedelta64(1, "fs")])
def test_a_sub_nanosecond_dt_raises(dt: np.timedelta64) -> None:
    with pytest.raises(XStencilError, match=r"dt=.* is not a whole number of 'ns'"):
        _grow(_dated(), dt)
    with pytest.raises(XStencilError, match=r"dt=.* is not a whole number of 'ns'"):
        _grow(xr.DataArray(np.zeros(4), dims="x"), dt)


@pytest.mark.parametrize("dt", [np.timedelta64(1000, "ps"), np.timedelta64(1, "ns"),
                                np.timedelta64(3, "h"), np.timedelta64(2, "D")])
def test_whole_nanoseconds_give_exact_positions(dt: np.timedelta64) -> None:
    out = _grow(_dated(), dt)
    step = int(dt.astype("m8[ns]").astype(np.int64))
    assert out.time.dtype == np.dtype("M8[ns]")
    assert out.time.values.astype(np.int64).tolist() == _python_ns(
        int(T0.astype(np.int64)), step, 4)
    np.testing.assert_array_equal(out.isel(x=0).values, [0.0, 1.0, 2.0, 3.0])


def test_timedelta_positions_from_zero() -> None:
    out = _grow(xr.DataArray(np.zeros(4), dims="x"), np.timedelta64(1000, "ps"))
    assert out.time.values.astype("m8[ns]").astype(np.int64).tolist() == [0, 1, 2, 3]


def test_positions_past_int64_raise() -> None:
    big = np.timedelta64(10**18, "ns")
    with pytest.raises(XStencilError, match=r"run past the range of m8\[ns\]"):
        _grow(xr.DataArray(np.zeros(4), dims="x"), big, steps=30)
    with pytest.raises(XStencilError, match=r"run past the range of M8\[ns\]"):
        _grow(_dated(), big, steps=8)
    # up to the end of the range is fine: 2026 + 7 * 1e18 ns is in 2248
    out = _grow(_dated(), big, steps=7)
    assert out.time.values.astype(np.int64).tolist() == _python_ns(
        int(T0.astype(np.int64)), 10**18, 8)


def _two_back(u: Any) -> Any:
    return u(time=-1) + 0.5 * u(time=-2)


def test_continuing_the_input_spacing_checks_the_range_too() -> None:
    t = np.array([T0, T0 + np.timedelta64(10**18, "ns")])
    u0 = xr.DataArray(np.zeros((2, 3)), dims=("time", "x"), coords={"time": t})
    with pytest.raises(XStencilError, match="run past the range"):
        u0.stencil.scan(_two_back, dim="time", steps=8, backend="xla")
    out = u0.stencil.scan(_two_back, dim="time", steps=3, backend="xla")
    assert out.time.values.astype(np.int64).tolist() == _python_ns(
        int(T0.astype(np.int64)), 10**18, 5)


def test_a_time_span_of_360_seconds_is_no_repeated_periodic_endpoint() -> None:
    """``boundary="periodic"`` for every dim reached the time coordinate,
    whose span in seconds (0 to 360) was taken for a longitude's period: a
    false warning, an error under ``-W error``."""
    out = _dated().stencil.scan(lambda u: u(time=-1, x=1), dim="time", steps=4,
                                dt=np.timedelta64(90, "s"), boundary="periodic")
    assert out.sizes["time"] == 5
    with pytest.warns(UserWarning, match="one period"):  # a longitude still warns
        xr.DataArray(np.zeros(5), dims="lon", coords={"lon": np.linspace(0, 360, 5)}
                     ).stencil.map(lambda u: u(lon=1), boundary="periodic")

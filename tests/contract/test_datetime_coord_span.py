"""Datetime coordinates read in a kernel, as seconds since the first label:
exact for spans beyond int64 nanoseconds (``xstencil/_engine/coords.py``).

``values - values[0]`` wraps in int64 for nanosecond times more than 292
years apart: on a 1700-1900-2100 coordinate the kernel read the 1900-2100
step as -1.2e10 s instead of +6.3e9 s, silently."""

from __future__ import annotations

import numpy as np
import xarray as xr

import xstencil  # noqa: F401 - registers the accessor
from xstencil._engine.coords import numeric_coord

SPAN = np.array(["1700-01-01", "1900-01-01", "2100-01-01T00:00:00.000000001",
                 "2200-06-30T12:00:00"], "M8[ns]")


def _python_seconds(values: np.ndarray) -> list[float]:
    """Seconds since the first label, in Python integers (no wrap)."""
    ticks = [int(t) for t in values.view(np.int64)]
    return [(t - ticks[0]) / 1e9 for t in ticks]


def test_spans_beyond_292_years_do_not_wrap() -> None:
    np.testing.assert_allclose(numeric_coord("c", "t", SPAN), _python_seconds(SPAN),
                               rtol=1e-15, atol=0)
    da = xr.DataArray(np.arange(4.0), dims="t", coords={"t": SPAN})
    got = da.stencil.map(lambda u: u.coord("t")(t=1) - u.coord("t")(),
                         boundary="extend").values
    want = np.diff(_python_seconds(SPAN))
    np.testing.assert_allclose(got[:-1], want, rtol=1e-15)
    assert (got[:-1] > 0).all()


def test_short_spans_and_not_a_time_are_unchanged() -> None:
    w = np.array(["2026-01-01T00:00:00", "2026-01-01T00:00:01.5", "NaT",
                  "2025-12-31T23:59:59.999999999"], "M8[ns]")
    got = numeric_coord("c", "t", w)
    np.testing.assert_array_equal(got, (w - w[0]) / np.timedelta64(1, "s"))
    assert got[-1] == -1e-9 and np.isnan(got[2])
    # a NaT first label: seconds since the first known label (session 29; it
    # made every position NaN), on the wrapping span and on a short one
    first_nat = np.array(["NaT", "1700-01-01", "2100-01-01"], "M8[ns]")
    got = numeric_coord("c", "t", first_nat)
    assert np.isnan(got[0])
    np.testing.assert_allclose(got[1:], _python_seconds(first_nat[1:]), rtol=1e-15, atol=0)
    short = np.array(["NaT", "2026-01-01", "2026-01-02"], "M8[ns]")
    np.testing.assert_array_equal(numeric_coord("c", "t", short), [np.nan, 0.0, 86400.0])
    assert np.isnan(numeric_coord("c", "t", np.array(["NaT", "NaT"], "M8[ns]"))).all()

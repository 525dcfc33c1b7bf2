"""scan(step=) hands the time to a step that asks for it (``def step(s, time)``).

A devito-style wave port needed a time-dependent source (a Ricker wavelet)
inside ``scan(step=)``, whose state carries no time: the hunter kept a
counter variable in the state.  A step with a parameter named like the scan
dim now gets the coordinate value of the state it steps from, as a traced
scalar: the values are an input of the compiled loop, so a new ``dt=`` is
read, not the old one.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr

import xstencil  # noqa: F401
from xstencil import XStencilError

U0 = xr.DataArray(np.zeros(5, np.float32), dims="x")


def forced(s, time):
    return s + 0.1 * jnp.sin(time).astype(s.dtype)


@pytest.mark.parametrize("dt", [0.5, 0.25])
def test_the_step_reads_the_time_it_steps_from(dt):
    out = U0.stencil.scan(None, "time", step=forced, steps=6, dt=dt)
    want = np.cumsum([0.0] + [0.1 * np.sin(dt * k) for k in range(6)])
    np.testing.assert_allclose(out.isel(x=0).values, want, rtol=1e-6)
    np.testing.assert_allclose(out.time.values, dt * np.arange(7))


def test_without_a_coordinate_the_time_is_the_position_and_datetimes_are_seconds():
    out = U0.stencil.scan(None, "time", step=lambda s, time: s + time.astype(s.dtype), steps=3)
    np.testing.assert_array_equal(out.isel(x=0).values, [0, 0, 1, 3])
    t0 = np.array(["2020-01-01T00"], dtype="datetime64[ns]")
    d = xr.DataArray(np.zeros((1, 3), np.float32), dims=("time", "x"), coords={"time": t0})
    out = d.stencil.scan(None, "time", step=lambda s, time: s + time.astype(s.dtype), steps=2,
                         dt=np.timedelta64(1, "h"))
    np.testing.assert_array_equal(out.isel(x=0).values, [0, 0, 3600])


def test_a_step_that_takes_no_time_is_called_as_before_and_cftime_is_refused():
    out = U0.stencil.scan(None, "time", step=lambda s: s + 1, steps=2)
    np.testing.assert_array_equal(out.isel(x=0).values, [0, 1, 2])
    cftime = pytest.importorskip("cftime")
    d = xr.DataArray(np.zeros((1, 3), np.float32), dims=("time", "x"),
                     coords={"time": [cftime.Datetime360Day(2000, 1, 1)]})
    import datetime
    with pytest.raises(XStencilError, match="cftime calendar"):
        d.stencil.scan(None, "time", step=lambda s, time: s + 1, steps=2,
                       dt=datetime.timedelta(days=1))


def test_a_time_given_by_the_caller_wins_and_float32_times_that_blur_warn():
    out = U0.stencil.scan(None, "time", step=lambda s, time: s + time, steps=2, time=5.0)
    np.testing.assert_array_equal(out.isel(x=0).values, [0, 5, 10])
    d = xr.DataArray(np.zeros((1, 3), np.float32), dims=("time", "x"), coords={"time": [1e6]})
    with pytest.warns(xstencil.PrecisionWarning, match="over 1% of a step"):
        d.stencil.scan(None, "time", step=lambda s, time: s, steps=3, dt=0.01)

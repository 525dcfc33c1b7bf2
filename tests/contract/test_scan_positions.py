"""Scan positions and the grown time coordinate: every position asked for is
computed and returned, or the call raises; ``dt=`` and ``steps=`` are checked
before anything is built; memory and dask agree on each case."""

from __future__ import annotations

import datetime

import numpy as np
import pandas as pd
import pytest
import xarray as xr

import xstencil
from xstencil import XStencilError


def step(u):
    return u(time=-1) + 0.5 * u()


def reference(a: np.ndarray) -> np.ndarray:
    """The full trajectory of ``step`` over an input trajectory, by a loop."""
    out = a.copy()
    for t in range(1, len(a)):
        out[t] = out[t - 1] + 0.5 * a[t]
    return out


TRAJ = xr.DataArray(np.arange(10.0).reshape(5, 2), dims=("time", "x"))
SIX_HOURS = np.timedelta64(6, "h")


@pytest.fixture(params=["memory", "dask"])
def traj(request):
    pytest.importorskip("dask")
    return TRAJ if request.param == "memory" else TRAJ.chunk({"x": 1})


@pytest.mark.parametrize("every", [1, 2, 4])
def test_save_every_that_divides_returns_every_saved_position(traj, every):
    out = traj.stencil.scan(step, dim="time", save_every=every)
    full = reference(TRAJ.values)
    np.testing.assert_allclose(out.values, full[::every])


def test_save_every_leaving_positions_uncomputed_raises(traj):
    """5 positions, 4 to compute: save_every=3 used to return [0, 3] and never
    compute position 4."""
    with pytest.raises(XStencilError, match=r"the 4 positions to compute along 'time' .* "
                                            r"not a multiple of save_every=3.*trim the input "
                                            r"\(obj\.isel\(time=slice\(0, 4\)\)\)"):
        traj.stencil.scan(step, dim="time", save_every=3)


def test_save_every_larger_than_the_positions_raises(traj):
    """save_every=10 on 5 positions used to compute nothing in memory."""
    with pytest.raises(XStencilError, match=r"save_every=10 is larger than the 4 positions "
                                            r"to compute.*save_every='last'"):
        traj.stencil.scan(step, dim="time", save_every=10)


def test_kernel_reading_no_earlier_position_raises_on_every_backend(traj):
    with pytest.raises(XStencilError, match=r"reads no earlier position along 'time'.*"
                                            r"there is nothing to scan"):
        traj.stencil.scan(lambda u: 2 * u(), dim="time")


def test_dataset_with_every_variable_advanced_and_no_dim_coordinate():
    """Used to raise a raw xarray ValueError while rewrapping."""
    ds = xr.Dataset({"u": TRAJ, "v": 2 * TRAJ})
    out = ds.stencil.scan(lambda s: {"u": s.u(time=-1) + 0.5 * s.u(), "v": s.v(time=-1)},
                          dim="time")
    np.testing.assert_allclose(out.u.values, reference(TRAJ.values))
    np.testing.assert_allclose(out.v.values, np.broadcast_to(2 * TRAJ.values[0], (5, 2)))
    assert list(out.data_vars) == ["u", "v"] and out.u.dims == ("time", "x")


def test_growing_from_a_scalar_datetime_continues_from_the_date():
    """``isel(time=-1)`` keeps the date as a scalar coordinate: the grown
    trajectory used to restart at 0 seconds."""
    t = pd.date_range("2001-03-01", periods=4, freq="6h")
    a = xr.DataArray(np.arange(8.0).reshape(4, 2), dims=("time", "x"), coords={"time": t})
    kernel = lambda u: u(time=-1) + 1  # noqa: E731
    out = a.isel(time=-1).stencil.scan(kernel, dim="time", steps=2, dt=SIX_HOURS)
    want = np.array([t[-1] + k * pd.Timedelta("6h") for k in range(3)], "datetime64[ns]")
    np.testing.assert_array_equal(out["time"].values.astype("datetime64[ns]"), want)
    same_as_list = a.isel(time=[-1]).stencil.scan(kernel, dim="time", steps=2, dt=SIX_HOURS)
    np.testing.assert_array_equal(out["time"].values, same_as_list["time"].values)
    np.testing.assert_allclose(out.values, [[6, 7], [7, 8], [8, 9]])


def test_growing_from_a_scalar_coordinate_without_dt_raises():
    a = xr.DataArray([1.0, 2.0], dims="x").assign_coords(time=5.0)
    with pytest.raises(XStencilError, match=r"pass dt= \(a spacing\) or coord="):
        a.stencil.scan(lambda u: u(time=-1), dim="time", steps=2)
    out = a.stencil.scan(lambda u: u(time=-1), dim="time", steps=2, dt=0.5)
    np.testing.assert_allclose(out["time"].values, [5.0, 5.5, 6.0])


U0 = xr.DataArray([1.0, 2.0, 3.0], dims="x")


@pytest.mark.parametrize("dt", [-1.0, 0, 0.0, float("nan"), float("inf"), 1j, "6h",
                                np.array([1.0, 2.0]), True, np.timedelta64(-6, "h"),
                                np.timedelta64("NaT", "ns"), datetime.timedelta(0)])
def test_bad_dt_raises_naming_dt(dt):
    with pytest.raises(XStencilError, match=r"dt=.* must be one positive, finite spacing"):
        U0.stencil.scan(lambda u: u(time=-1), steps=2, dt=dt)


def test_dt_of_the_wrong_kind_for_the_coordinate_raises():
    t = pd.date_range("2001-03-01", periods=1, freq="6h")
    a = U0.expand_dims(time=t)
    with pytest.raises(XStencilError, match=r"dt=1\.0 does not fit the 'time' coordinate of "
                                            r"dtype datetime64.*dt=np\.timedelta64"):
        a.stencil.scan(lambda u: u(time=-1), steps=2, dt=1.0)
    b = U0.expand_dims(time=[0.0])
    with pytest.raises(XStencilError, match=r"does not fit the 'time' coordinate of dtype "
                                            r"float64; pass a number"):
        b.stencil.scan(lambda u: u(time=-1), steps=2, dt=SIX_HOURS)
    out = a.stencil.scan(lambda u: u(time=-1), steps=2, dt=datetime.timedelta(hours=6))
    np.testing.assert_array_equal(out["time"].values, t.values[0] + np.arange(3) * SIX_HOURS)


@pytest.mark.parametrize(("steps", "size"), [(2**63, "PiB"), (10**12, "7.3 TiB")])
def test_huge_steps_refused_up_front_with_the_size(steps, size):
    with pytest.raises(XStencilError, match=rf"steps={steps} is more than a scan can run.*"
                                            rf"{size}"):
        U0.stencil.scan(lambda u: u(time=-1), steps=steps)


def test_saved_trajectory_larger_than_memory_refused_up_front():
    from xstencil._labelled.sizes import memory_limit

    u0 = xr.DataArray(np.zeros((100, 100), np.float32), dims=("y", "x"))
    steps = memory_limit() // u0.nbytes + 10
    with pytest.raises(XStencilError, match=r"the saved trajectory .* would need .* more than "
                                            r"the .* of memory available.*save_every"):
        u0.stencil.scan(lambda u: u(time=-1), steps=steps)


def test_broadcast_input_of_huge_logical_size_refused_before_the_copy():
    from xstencil._labelled.sizes import memory_limit

    n = int(np.sqrt(memory_limit() / 4)) + 1000
    big = xr.DataArray(np.broadcast_to(np.float32(1), (n, n)), dims=("y", "x"))
    with pytest.raises(XStencilError, match=r"the data \(shape .* a broadcast view is copied "
                                            r"whole\) would need .*GiB"):
        big.stencil.scan(lambda u: u(time=-1), steps=2, boundary="periodic")
    with pytest.raises(XStencilError, match=r"da\.stencil\.map\(\.\.\.\): the data .* would need"):
        big.stencil.map(lambda u: u(x=1), boundary="periodic")


@pytest.mark.parametrize("kw", [dict(kernel=lambda u: u(time=-1) * 0.5),
                                dict(step=lambda s: s * 0.5)], ids=["kernel", "step"])
def test_nan_in_the_initial_state_is_reported_as_such(kw):
    a = xr.DataArray([1.0, np.nan, 2.0], dims="x")
    with pytest.raises(XStencilError, match=r"the initial state \(position 0 along 'time'\) "
                                            r"already holds a NaN or Inf, before any step"):
        xstencil.scan(a, steps=3, check_finite=True, **kw)


def test_nan_from_a_step_still_names_its_position():
    a = xr.DataArray(np.array([1.0, 2.0, 3.0], np.float32), dims="x")
    with pytest.raises(XStencilError, match=r"first appeared at position 2 along 'time'"):
        a.stencil.scan(lambda u: u(time=-1) * 1e20, steps=4, check_finite=True)

"""Review of the repeat-call scan fast path (xstencil._labelled.scan_fast):
a second call that differs from the first in something the cache key or
the per-hit checks missed must give what a fresh call gives.

Each test makes the second call's result both ways (after the first call,
and again with the caches cleared) and compares them with
``xr.testing.assert_identical`` (values, dtypes, coordinates and their
attributes), plus an independent numpy reference where values matter.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest
import xarray as xr

import xstencil
from xstencil._labelled import scan_fast


@pytest.fixture
def fast(monkeypatch):
    """How many calls took the fast path."""
    n = {"fast": 0}
    run = scan_fast.run

    def counted(*a, **k):
        n["fast"] += 1
        return run(*a, **k)

    monkeypatch.setattr(scan_fast, "run", counted)
    xstencil.clear_caches()
    return n


def _fresh(call):
    xstencil.clear_caches()
    return call()


def heat(u):
    c = u(time=-1)
    return c + 0.2 * (u(time=-1, x=1) + u(time=-1, x=-1) - 2 * c)


def np_heat_own(x: np.ndarray) -> np.ndarray:
    """``heat`` along axis 0 of ``x`` (zero halo along axis 1); row 0 kept."""
    out = [x[0]]
    for _ in range(1, len(x)):
        u = out[-1]
        p = np.pad(u, 1)
        out.append(u + 0.2 * (p[2:] + p[:-2] - 2 * u))
    return np.stack(out)


def test_time_coordinate_attrs_are_the_calls_own(fast):
    values = np.random.default_rng(0).random((3, 6))

    def traj(units):
        t = xr.Variable("time", [0.0, 1.0, 2.0], {"units": units})
        return xr.DataArray(values, dims=("time", "x"), coords={"time": t})

    traj("s").stencil.scan(heat, dim="time", fill_value=0.0)
    out = traj("h").stencil.scan(heat, dim="time", fill_value=0.0)
    assert out["time"].attrs == {"units": "h"}
    np.testing.assert_allclose(out.values, np_heat_own(values), rtol=1e-12)
    xr.testing.assert_identical(out, _fresh(lambda: traj("h").stencil.scan(
        heat, dim="time", fill_value=0.0)))


def test_timezone_of_the_time_coordinate_is_the_calls_own(fast):
    values = np.random.default_rng(1).random((3, 6))

    def traj(tz):
        t = pd.date_range("2000-01-01", periods=3, freq="h", tz="UTC").tz_convert(tz)
        return xr.DataArray(values, dims=("time", "x"), coords={"time": t})

    def kern(u):  # reads the time coordinate (seconds since the first position)
        t = u.coord("time")
        return u(time=-1) + 1e-4 * (t() - t(time=-1))

    traj("UTC").stencil.scan(kern, dim="time")
    out = traj("Europe/Paris").stencil.scan(kern, dim="time")
    assert str(out["time"].dtype) == str(traj("Europe/Paris")["time"].dtype)
    xr.testing.assert_identical(out, _fresh(lambda: traj("Europe/Paris").stencil.scan(
        kern, dim="time")))


def test_weakly_typed_argument_does_not_decide_a_strong_ones_dtype(fast):
    """float16 state times a float32 argument: a weakly typed one (a Python
    number made a JAX array) keeps float16, a strong one promotes to float32."""
    u0 = xr.DataArray(np.ones((1, 4), np.float16), dims=("time", "x"))

    def grow(u, a):
        return u(time=-1) * a

    strong = jnp.ones((), jnp.float32) * 1.5
    with jax.numpy_dtype_promotion("standard"):  # JAX's default (the tests run strict)
        weak = u0.stencil.scan(grow, "time", jnp.asarray(1.5), steps=2)
        out = u0.stencil.scan(grow, "time", strong, steps=2)
        ref = _fresh(lambda: u0.stencil.scan(grow, "time", strong, steps=2))
    assert weak.dtype == np.float16
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out.values[:, 0], 1.5 ** np.arange(3))
    xr.testing.assert_identical(out, ref)


def test_repeated_endpoint_warning_is_not_dropped_on_a_repeat(fast):
    x = np.linspace(0, 2 * np.pi, 9)  # the last point repeats the first
    u0 = xr.DataArray(np.sin(x), dims="x", coords={"x": x})
    for _ in range(3):
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            u0.stencil.scan(heat, dim="time", steps=2, boundary="periodic")
        assert any("repeats the first" in str(w.message) for w in got)
    # a grid without the repeated endpoint still takes the fast path
    y = np.linspace(0, 2 * np.pi, 8, endpoint=False)
    v0 = xr.DataArray(np.sin(y), dims="x", coords={"x": y})
    for _ in range(2):
        v0.stencil.scan(heat, dim="time", steps=2, boundary="periodic")
    assert fast["fast"] == 1


@pytest.mark.parametrize("path", ["scan", "map"])
def test_static_minus_zero_argument_is_not_zero(fast, path):
    """``0.0 == -0.0``, but ``1 / -0.0 == -inf``: a static argument ``-0.0``
    must not reuse the code (or the fast-path entry) made for ``0.0``."""
    u0 = xr.DataArray(np.ones(3), dims="x")

    def run(a):
        if path == "map":
            return u0.stencil.map(lambda u, a: u() + np.float64(1.0) / a, a).values
        return u0.stencil.scan(lambda u, a: u(time=-1) + np.float64(1.0) / a, "time", a,
                               steps=1).values[-1]

    with np.errstate(divide="ignore"):
        np.testing.assert_array_equal(run(0.0), np.inf)
        np.testing.assert_array_equal(run(-0.0), -np.inf)
        np.testing.assert_array_equal(run(0.0), np.inf)


class _Diffuse:
    """A kernel object with a mutable coefficient."""

    def __init__(self, nu: float):
        self.nu = nu

    def rate(self):
        return self.nu

    def __call__(self, u):
        c = u(time=-1)
        return c + self.rate() * (u(time=-1, x=1) + u(time=-1, x=-1) - 2 * c)


def test_callable_instance_with_a_changed_attribute_is_not_stale(fast):
    values = np.random.default_rng(2).random(6)
    u0 = xr.DataArray(values, dims="x")
    k = _Diffuse(0.2)
    first = u0.stencil.scan(k, dim="time", steps=2, fill_value=0.0)
    k.nu = 0.1  # read through a helper method
    out = u0.stencil.scan(k, dim="time", steps=2, fill_value=0.0)
    traj = np_heat_own(np.stack([values] * 3))  # rows 1, 2: nu = 0.2 steps
    np.testing.assert_allclose(first.values, traj, rtol=1e-12)
    want = [values]
    for _ in range(2):
        p = np.pad(want[-1], 1)
        want.append(want[-1] + 0.1 * (p[2:] + p[:-2] - 2 * want[-1]))
    np.testing.assert_allclose(out.values, np.stack(want), rtol=1e-12)
    m = u0.stencil.map(lambda u: u() * 0 + k.rate())  # map sees it too
    np.testing.assert_array_equal(m.values, 0.1)


_W = np.array(1.0)


class _Cfg:
    @staticmethod
    def scale(x):
        return x * _W  # a global array read by a helper reached through a class


def test_global_array_read_by_a_helper_behind_an_attribute_is_read_afresh(fast):
    global _W
    u0 = xr.DataArray(np.ones(3), dims="x")
    k = lambda u: _Cfg.scale(u(time=-1))  # noqa: E731
    try:
        assert u0.stencil.scan(k, dim="time", steps=1).values[-1].tolist() == [1.0] * 3
        assert u0.stencil.map(lambda u: _Cfg.scale(u())).values.tolist() == [1.0] * 3
        _W = np.array(5.0)  # same shape and dtype, another array
        assert u0.stencil.scan(k, dim="time", steps=1).values[-1].tolist() == [5.0] * 3
        assert u0.stencil.map(lambda u: _Cfg.scale(u())).values.tolist() == [5.0] * 3
    finally:
        _W = np.array(1.0)


class _Date:
    """A date of a calendar that refuses comparison with other calendars (as
    cftime's dates do)."""

    def __init__(self, calendar: str, day: int):
        self.calendar, self.day = calendar, day

    def __eq__(self, other):
        if self.calendar != other.calendar:
            raise TypeError("cannot compare dates of different calendars")
        return self.day == other.day

    def __hash__(self):
        return hash(self.day)


def test_time_labels_that_do_not_compare_are_a_miss_not_an_error(fast):
    def traj(calendar):
        t = np.empty(3, object)
        t[:] = [_Date(calendar, i) for i in range(3)]
        return xr.DataArray(np.ones((3, 4)), dims=("time", "x"), coords={"time": ("time", t)})

    halve = lambda u: u(time=-1) * 0.5  # noqa: E731
    traj("noleap").stencil.scan(halve, dim="time")
    out = traj("360_day").stencil.scan(halve, dim="time")
    assert [d.calendar for d in out["time"].values] == ["360_day"] * 3
    np.testing.assert_array_equal(out.values[:, 0], [1.0, 0.5, 0.25])


def test_dt_in_another_unit_with_the_same_count_is_a_miss(fast):
    """``np.timedelta64(5, 'ns').item()`` is the int 5 (and a sub-nanosecond
    unit raises, see test_scan_timesteps.py): the key must hold the unit."""
    u0 = xr.DataArray(np.ones(3), dims="x")
    halve = lambda u: u(time=-1) * 0.5  # noqa: E731
    u0.stencil.scan(halve, dim="time", steps=2, dt=np.timedelta64(5, "ns"))
    out = u0.stencil.scan(halve, dim="time", steps=2, dt=np.timedelta64(5, "us"))
    assert fast["fast"] == 0
    assert out.time.values[-1] == np.timedelta64(10, "us")
    xr.testing.assert_identical(out, _fresh(lambda: u0.stencil.scan(
        halve, dim="time", steps=2, dt=np.timedelta64(5, "us"))))


@pytest.mark.parametrize("path", ["scan", "map"])
def test_fill_value_minus_zero_is_not_zero(fast, path):
    """A fill of ``-0.0`` read as ``1 / fill`` is ``-inf``: neither the fast
    paths nor the compile cache (the plan is its key) may reuse ``0.0``'s."""
    u0 = xr.DataArray(np.ones(3), dims="x")

    def run(fill):
        if path == "map":
            return u0.stencil.map(lambda u: 1.0 / u(x=1), fill_value=fill).values[-1]
        return u0.stencil.scan(lambda u: 1.0 / u(time=-1, x=1), dim="time", steps=1,
                               fill_value=fill).values[-1, -1]

    with np.errstate(divide="ignore"):
        assert run(0.0) == np.inf
        assert run(-0.0) == -np.inf
        assert run(np.float64(-0.0)) == -np.inf
        assert run(0.0) == np.inf

"""Session 26's attack as an experienced xarray user: each case was silently
wrong, crashed or misled before, and is checked here against plain xarray,
numpy or the same call made once.
"""

from __future__ import annotations

import datetime

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from xstencil import LabelError, XStencilError

# -- big-endian data (netCDF3 files): the repeated call took the fast path raw --


@pytest.mark.parametrize("dtype", [">f8", ">f4", ">i4", ">c16"])
def test_big_endian_map_repeated(dtype: str) -> None:
    da = xr.DataArray(np.arange(1, 7).astype(dtype), dims="x")
    k = lambda u: u(x=1) + u()  # noqa: E731
    want = np.roll(np.arange(1, 7), -1) + np.arange(1, 7)
    for _ in range(3):
        np.testing.assert_array_equal(da.stencil.map(k, boundary="periodic").values, want)


def test_big_endian_scan_and_mesh_repeated() -> None:
    u0 = xr.DataArray(np.arange(1.0, 7.0), dims="x").astype(">f8")
    for _ in range(2):
        traj = u0.stencil.scan(lambda u: u(time=-1, x=1), dim="time", steps=2, dt=1.0,
                               boundary="periodic")
        np.testing.assert_array_equal(traj.values[-1], np.roll(np.arange(1.0, 7.0), -2))
    for _ in range(2):
        m = u0.stencil.mesh(boundary="periodic")
        m[...] = lambda u: u(x=1) + u()
        m[{"x": 0}] = lambda u: -u()
        np.testing.assert_array_equal(m.map().values, [-1.0, 5, 7, 9, 11, 7])


# -- step= results are taken by label, as xarray's arithmetic aligns them --


def test_step_result_in_another_label_order_is_aligned() -> None:
    u0 = xr.DataArray([1.0, 2.0, 3.0], dims="lat", coords={"lat": [60.0, 0.0, -60.0]})
    step = lambda s: (s * 2).sortby("lat")  # noqa: E731
    want = step(u0).sel(lat=60.0).item()  # plain xarray: 2.0
    traj = u0.stencil.scan(None, "time", step=step, steps=1)
    assert traj.isel(time=1).sel(lat=60.0).item() == want
    it = u0.stencil.iterate(step=step, tol=None, max_steps=1)
    assert it.field.sel(lat=60.0).item() == want


def test_dataset_step_rolled_with_its_labels_is_unchanged() -> None:
    u = xr.DataArray([1.0, 2.0, 3.0, 4.0], dims="x", coords={"x": [0.0, 1, 2, 3]})
    ds = xr.Dataset({"a": u, "b": u * 10})
    traj = ds.stencil.scan(None, "t", step=lambda s: s.roll(x=1, roll_coords=True) * 2,
                           steps=1)
    np.testing.assert_array_equal(traj.a.values[1], [2.0, 4, 6, 8])  # by label: no shift
    it = ds.stencil.iterate(step=lambda s: s.isel(x=slice(None, None, -1)) * 2, tol=None,
                            max_steps=1)
    np.testing.assert_array_equal(it.field.b.values, [20.0, 40, 60, 80])


def test_step_result_with_new_labels_is_refused() -> None:
    u0 = xr.DataArray([1.0, 2.0, 3.0], dims="lat", coords={"lat": [60.0, 0.0, -60.0]})
    with pytest.raises(XStencilError, match="'lat' labels .* not the state's"):
        u0.stencil.scan(None, "time", step=lambda s: s.assign_coords(lat=s.lat + 1), steps=1)


def test_solve_x0_aligned_by_label() -> None:
    rhs = xr.DataArray(np.random.default_rng(0).random(9), dims="x",
                       coords={"x": np.arange(9.0)})
    lap = lambda u: u(x=1) - 2 * u() + u(x=-1)  # noqa: E731
    opts = dict(method="cg", boundary="fill", fill_value=0.0, tol=1e-12)
    sol = rhs.stencil.solve(lap, **opts).field
    again = rhs.stencil.solve(lap, x0=sol.isel(x=slice(None, None, -1)), **opts)
    assert again.iterations == 0  # the exact answer, reordered by label
    with pytest.raises(XStencilError, match="x0 has 'x' labels"):
        rhs.stencil.solve(lap, x0=sol.assign_coords(x=sol.x + 50), **opts)


# -- map(out=DataArray): its labels must be the result's --


def test_out_with_other_labels_is_refused() -> None:
    da = xr.DataArray(np.arange(5.0), dims="x", coords={"x": np.arange(5.0)})
    out = xr.zeros_like(da.isel(x=slice(None, None, -1)))
    with pytest.raises(XStencilError, match="out= has 'x' labels"):
        da.stencil.map(lambda u: 10 * u(), out=out)
    assert not out.values.any()  # refused before anything was written
    trimmed = da.stencil.map(lambda u: u(x=1), boundary="valid")
    good = xr.zeros_like(trimmed)
    da.stencil.map(lambda u: u(x=1), boundary="valid", out=good)
    np.testing.assert_array_equal(good.values, [1.0, 2, 3, 4])
    with pytest.raises(XStencilError, match="out= has 'x' labels"):
        da.stencil.map(lambda u: u(x=1), boundary="valid", out=good.assign_coords(x=good.x + 1))


# -- dask: a chunk with no output points --


@pytest.mark.parametrize("opts", [dict(boundary="valid"), dict(boundary="periodic", stride=8)])
def test_dask_dataset_map_with_an_empty_block(opts: dict) -> None:
    pytest.importorskip("dask")
    x = np.arange(16.0)
    ds = xr.Dataset({"a": ("x", x), "b": ("x", 2 * x)}, coords={"x": x})
    k = lambda s: {"a": s.a(x=2), "b": s.b(x=2)}  # noqa: E731
    want = ds.stencil.map(k, **opts)
    got = ds.chunk(x=7).stencil.map(k, **opts).compute()
    xr.testing.assert_identical(got, want)


# -- time coordinates --


def test_timedelta_period_is_refused_with_the_seconds() -> None:
    t = np.array(["2000-01-01", "2000-01-02", "2000-01-03", "2000-01-04"],
                 dtype="datetime64[ns]")
    da = xr.DataArray(np.zeros(4), dims="time", coords={"time": t})
    k = lambda u: u.coord("time")(time=1) - u.coord("time")(time=-1)  # noqa: E731
    np.testing.assert_array_equal(
        da.stencil.map(k, boundary="periodic", period={"time": 4 * 86400.0}).values, 172800.0)
    for p in (np.timedelta64(4, "D"), datetime.timedelta(days=4), pd.Timedelta(days=4)):
        with pytest.raises(XStencilError, match="345600.0"):
            da.stencil.map(k, boundary="periodic", period={"time": p})


def test_grown_scan_keeps_time_attrs() -> None:
    u0 = xr.DataArray(np.zeros(3), dims="x", coords={"time": 0.0})
    u0.time.attrs.update(standard_name="time", units="s")
    for save in (1, "last"):
        a = u0.stencil.scan(lambda u: u(time=-1) + 1, dim="time", steps=2, dt=1.0,
                            save_every=save)
        b = u0.stencil.scan(None, "time", step=lambda s: s + 1, steps=2, dt=1.0,
                            save_every=save)
        assert a.time.attrs == b.time.attrs == {"standard_name": "time", "units": "s"}


def test_descending_time_with_positive_dt_is_refused() -> None:
    u0 = xr.DataArray(np.zeros((2, 3)), dims=("time", "x"), coords={"time": [10.0, 9.0]})
    k = lambda u: u(time=-1) + u(time=-2) * 0 + 1  # noqa: E731
    with pytest.raises(XStencilError, match="runs down"):
        u0.stencil.scan(k, dim="time", steps=2, dt=1.0)
    np.testing.assert_array_equal(u0.stencil.scan(k, dim="time", steps=2).time, [10, 9, 8, 7])


def test_cftime_calendar_scans() -> None:
    pytest.importorskip("cftime")
    t = xr.date_range("2000-02-27", periods=4, calendar="noleap", use_cftime=True)
    full = xr.DataArray(np.zeros((4, 3)), dims=("time", "x"), coords={"time": t})
    # kernels read the calendar's own seconds: no 29 February in noleap
    got = full.stencil.map(lambda u: u.coord("time")(time=1) - u.coord("time")(),
                           boundary="valid")
    np.testing.assert_array_equal(got.values[:, 0], 86400.0)
    grown = full.isel(time=[0]).stencil.scan(
        lambda u: u(time=-1) + (u.coord("time")() - u.coord("time")(time=-1)) / 86400,
        dim="time", steps=3, dt=datetime.timedelta(days=1))
    np.testing.assert_array_equal(grown.values[:, 0], [0.0, 1, 2, 3])
    assert [str(v) for v in grown.time.values] == [str(v) for v in t.values]
    with pytest.raises(XStencilError, match="cftime calendar"):
        full.isel(time=[0]).stencil.scan(lambda u: u(time=-1), dim="time", steps=1,
                                         dt=86400.0)


# -- meshes --


def test_multiindex_level_selects_like_sel() -> None:
    mi = pd.MultiIndex.from_product([[0, 1], [10, 20, 30]], names=["a", "b"])
    md = xr.DataArray(np.arange(6.0), dims="z",
                      coords=xr.Coordinates.from_pandas_multiindex(mi, "z"))
    m = md.stencil.mesh()
    m.loc[{"a": 1}] = lambda u: -1.0
    want = md.copy()
    want.loc[{"a": 1}] = -1.0  # xarray's own .loc by level
    np.testing.assert_array_equal(m.map().values, want.values)
    with pytest.raises(LabelError, match="level"):
        m.loc[{"a": 5}] = lambda u: 0.0


def test_mask_message_names_the_labels_that_differ() -> None:
    da = xr.DataArray(np.arange(6.0), dims="x", coords={"x": np.arange(6.0)})
    m = da.stencil.mesh()
    with pytest.raises(XStencilError, match=r"the mask has \[6.0\] that the data lacks"):
        m[(da > 2).assign_coords(x=[0.0, 1, 2, 3, 4, 6])] = lambda u: -1.0


def test_added_variable_message_names_the_variables() -> None:
    ds = xr.Dataset({"a": ("x", np.arange(6.0))}, coords={"x": np.arange(6.0)})
    m = ds.stencil.mesh()
    m.loc[{"x": 2.0}] = lambda s: {"a": s.a() * 0}
    ds["b"] = ("x", np.ones(6))
    with pytest.raises(XStencilError, match=r"data variables changed .*\('a', 'b'\) now"):
        m.map()


def test_repeated_cftime_map_with_another_calendar() -> None:
    """The repeat-call check compared the stored labels with the new ones, and
    cftime refuses to compare two calendars: a TypeError, not a miss."""
    pytest.importorskip("cftime")

    def step(u):
        t = u.coord("time")
        return t() - t(time=-1) + 0 * u()

    for cal in ("360_day", "noleap", "360_day"):
        tc = xr.date_range("2000-01-01", periods=5, calendar=cal, use_cftime=True)
        u = xr.DataArray(np.zeros(5), dims="time", coords={"time": tc})
        np.testing.assert_array_equal(u.stencil.map(step, boundary="extend").values, 86400.0)

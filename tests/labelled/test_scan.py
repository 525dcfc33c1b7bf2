"""``xstencil.scan`` / ``da.stencil.scan`` against plain numpy time loops."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr
from hypothesis import given, settings
from hypothesis import strategies as st

import xstencil

NP_MODES = {"fill": "constant", "extend": "edge", "periodic": "wrap",
            "reflect": "reflect", "symmetric": "symmetric"}
C = 0.2


def heat(u):
    return u(time=-1) + C * (u(time=-1, x=1) - 2 * u(time=-1) + u(time=-1, x=-1))


def heat2(u):
    c = u(time=-1)
    return c + C / 2 * (u(time=-1, x=1) + u(time=-1, x=-1) + u(time=-1, y=1)
                        + u(time=-1, y=-1) - 4 * c)


def np_heat(u0, steps, mode, fill=np.nan):
    out = [np.asarray(u0, float)]
    for _ in range(steps):
        p = out[-1]
        kw = {"constant_values": fill} if mode == "fill" else {}
        q = np.pad(p, 1, mode=NP_MODES[mode], **kw)
        if p.ndim == 1:
            out.append(p + C * (q[2:] - 2 * p + q[:-2]))
        else:
            out.append(p + C / 2 * (q[1:-1, 2:] + q[1:-1, :-2] + q[2:, 1:-1] + q[:-2, 1:-1]
                                    - 4 * p))
    return np.stack(out)


def trajectory(u0, nt, dims=("time", "x")):
    a = np.zeros((nt,) + np.shape(u0))
    a[0] = u0
    coords = {"time": np.arange(nt) * 0.1}
    return xr.DataArray(a, dims=dims, coords=coords, name="T", attrs={"units": "K"})


@pytest.mark.parametrize("mode", ["fill", "extend", "periodic", "reflect", "symmetric"])
def test_heat_1d_full_trajectory_matches_numpy(x64, mode):
    u0 = np.random.default_rng(0).random(12)
    U = trajectory(u0, 9)
    out = U.stencil.scan(heat, dim="time", boundary={"x": mode}, fill_value=0.0)
    ref = np_heat(u0, 8, mode, fill=0.0)
    np.testing.assert_allclose(out.values, ref, rtol=1e-13, atol=1e-14)
    assert out.dims == U.dims and out.name == "T" and out.attrs == {"units": "K"}
    np.testing.assert_array_equal(out["time"].values, U["time"].values)
    assert out.dtype == np.float64
    # the input is not mutated
    assert np.all(U.values[1:] == 0)


@pytest.mark.parametrize("mode", ["periodic", "extend"])
def test_heat_2d_grown_matches_numpy(x64, mode):
    u0 = np.random.default_rng(1).random((6, 7))
    da = xr.DataArray(u0, dims=("y", "x"), coords={"x": np.arange(7.0)})
    out = da.stencil.scan(heat2, dim="time", steps=10, dt=0.5, boundary=mode)
    ref = np_heat(u0, 10, mode)
    assert out.dims == ("time", "y", "x")
    np.testing.assert_allclose(out.values, ref, rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(out["time"].values, 0.5 * np.arange(11))
    np.testing.assert_array_equal(out["x"].values, np.arange(7.0))


def test_function_and_accessor_agree(x64):
    u0 = np.random.default_rng(2).random(8)
    da = xr.DataArray(u0, dims="x")
    a = xstencil.scan(da, heat, "time", steps=4, boundary="periodic")
    b = da.stencil.scan(heat, dim="time", steps=4, boundary="periodic")
    xr.testing.assert_identical(a, b)


def test_upwind_advection_matches_numpy_exactly(x64):
    nx, nt, r = 40, 30, 0.4
    u0 = np.where((np.arange(nx) > 5) & (np.arange(nx) < 15), 2.0, 1.0)

    def upwind(u):
        return u(time=-1) - r * (u(time=-1) - u(time=-1, x=-1))

    out = xr.DataArray(u0, dims="x").stencil.scan(upwind, dim="time", steps=nt,
                                                  boundary="periodic")
    ref = [u0]
    for _ in range(nt):
        p = ref[-1]
        ref.append(p - r * (p - np.roll(p, 1)))
    np.testing.assert_array_equal(out.values, np.stack(ref))


def test_float32_stays_float32_and_float64_without_x64():
    u0 = np.random.default_rng(3).random(8)
    out64 = xr.DataArray(u0, dims="x").stencil.scan(heat, dim="time", steps=3,
                                                    boundary="periodic")
    assert out64.dtype == np.float64
    out32 = xr.DataArray(u0.astype(np.float32), dims="x").stencil.scan(
        heat, dim="time", steps=3, boundary="periodic")
    assert out32.dtype == np.float32
    np.testing.assert_allclose(out32.values, out64.values, rtol=1e-5)


def test_offsets_ahead_see_the_input(x64):
    """A read at offset >= 0 along the scanned dim sees the input (forcing)."""
    nt, nx = 6, 5
    rng = np.random.default_rng(4)
    a = rng.random((nt, nx))

    def k(u):
        return u(time=-1) * 0.5 + u() + u(time=1)

    out = xr.DataArray(a, dims=("time", "x")).stencil.scan(k, dim="time", boundary="extend")
    ref = a.copy()
    for t in range(1, nt):
        ahead = a[t + 1] if t + 1 < nt else a[-1]  # extend past the end
        ref[t] = ref[t - 1] * 0.5 + a[t] + ahead
    np.testing.assert_allclose(out.values, ref, rtol=1e-13)


def test_read_ahead_past_end_fills_nan_by_default(x64):
    a = np.ones((3, 4))
    out = xr.DataArray(a, dims=("time", "x")).stencil.scan(
        lambda u: u(time=-1) + u(time=1), dim="time", boundary={"x": "periodic"})
    assert np.isnan(out.values[-1]).all() and np.isfinite(out.values[:-1]).all()


def test_wave_equation_two_deep_initial_conditions(x64):
    """k = 2: the first two positions are kept; leapfrog matches numpy."""
    nx, c2 = 16, 0.3
    x = np.linspace(0, 1, nx, endpoint=False)
    g = np.sin(2 * np.pi * x)
    init = xr.DataArray(np.stack([g, g]), dims=("time", "x"))

    def wave(u):
        c = u(time=-1)
        return 2 * c - u(time=-2) + c2 * (u(time=-1, x=1) - 2 * c + u(time=-1, x=-1))

    out = init.stencil.scan(wave, dim="time", steps=12, boundary="periodic")
    ref = [g, g]
    for _ in range(12):
        p, c = ref[-2], ref[-1]
        ref.append(2 * c - p + c2 * (np.roll(c, -1) - 2 * c + np.roll(c, 1)))
    np.testing.assert_allclose(out.values, np.stack(ref), rtol=1e-12, atol=1e-13)
    assert out.sizes["time"] == 14


@pytest.mark.parametrize("every", [1, 2, 3, 6])
def test_save_every_and_last_agree_with_full(x64, every):
    u0 = np.random.default_rng(5).random(9)
    da = xr.DataArray(u0, dims="x")
    full = da.stencil.scan(heat, dim="time", steps=6, dt=0.25, boundary="periodic")
    some = da.stencil.scan(heat, dim="time", steps=6, dt=0.25, boundary="periodic",
                           save_every=every)
    xr.testing.assert_allclose(some, full.isel(time=slice(None, None, every)))
    last = da.stencil.scan(heat, dim="time", steps=6, dt=0.25, boundary="periodic",
                           save_every="last")
    xr.testing.assert_allclose(last, full.isel(time=-1))


def test_save_every_on_full_trajectory_input(x64):
    U = trajectory(np.random.default_rng(6).random(7), 10)
    full = U.stencil.scan(heat, dim="time", boundary="periodic")
    some = U.stencil.scan(heat, dim="time", boundary="periodic", save_every=3)
    xr.testing.assert_allclose(some, full.isel(time=[0, 3, 6, 9]))
    last = U.stencil.scan(heat, dim="time", boundary="periodic", save_every="last")
    xr.testing.assert_allclose(last, full.isel(time=-1))


def test_steps_agrees_with_full_trajectory_input(x64):
    u0 = np.random.default_rng(7).random(7)
    U = trajectory(u0, 8)
    full = U.stencil.scan(heat, dim="time", boundary="periodic")
    grown = U.isel(time=[0]).stencil.scan(heat, dim="time", steps=7, dt=0.1,
                                          boundary="periodic")
    xr.testing.assert_allclose(grown, full)
    grown2 = U.isel(time=0, drop=True).stencil.scan(heat, dim="time", steps=7, dt=0.1,
                                                    boundary="periodic")
    np.testing.assert_allclose(grown2.values, full.values)
    np.testing.assert_allclose(grown2["time"].values, full["time"].values)


def test_coord_array_and_datetime_coordinates(x64):
    da = xr.DataArray(np.ones(4), dims="x")
    t = np.array([0.0, 0.1, 0.3, 0.7])
    out = da.stencil.scan(heat, dim="time", steps=3, coord=t, boundary="periodic")
    np.testing.assert_array_equal(out["time"].values, t)
    start = np.datetime64("2020-01-01T00:00")
    dated = da.expand_dims(time=[start])
    out = dated.stencil.scan(heat, dim="time", steps=2, dt=np.timedelta64(1, "h"),
                             boundary="periodic")
    assert out["time"].values[-1] == start + np.timedelta64(2, "h")


def test_time_dependent_boundary_reads_time_coordinate(x64):
    nx, nt = 8, 6
    t = np.linspace(0, 1, nt)
    U = xr.DataArray(np.zeros((nt, nx)), dims=("time", "x"),
                     coords={"time": t, "x": np.arange(nx) * 0.5})
    m = U.stencil.mesh(boundary="extend")
    m[...] = heat
    m.loc[{"x": 0.0}] = lambda u: jnp.sin(u.coord("time")())
    out = m.scan(dim="time")
    np.testing.assert_allclose(out.isel(x=0).values[1:], np.sin(t[1:]), rtol=1e-12)
    assert out.values[0, 0] == 0  # initial conditions are kept as they are
    ref = np.zeros((nt, nx))
    for k in range(1, nt):
        p = np.pad(ref[k - 1], 1, mode="edge")
        ref[k] = ref[k - 1] + C * (p[2:] - 2 * ref[k - 1] + p[:-2])
        ref[k, 0] = np.sin(t[k])
    np.testing.assert_allclose(out.values, ref, rtol=1e-12, atol=1e-14)


def test_mesh_inflow_by_label_and_outflow_by_position(x64):
    nx, nt, r, inflow = 12, 10, 0.5, 3.0
    x = np.linspace(0.0, 1.1, nx)
    U = xr.DataArray(np.ones((nt, nx)), dims=("time", "x"), coords={"x": x})

    def upwind(u):
        return u(time=-1) - r * (u(time=-1) - u(time=-1, x=-1))

    m = U.stencil.mesh(boundary="extend")
    m[...] = upwind
    m.loc[{"x": 0.0}] = lambda u: inflow
    m[{"x": -1}] = lambda u: u(time=-1, x=-1)
    out = m.scan(dim="time")
    ref = np.ones((nt, nx))
    for k in range(1, nt):
        p = ref[k - 1]
        ref[k, 1:] = p[1:] - r * (p[1:] - p[:-1])
        ref[k, 0] = inflow
        ref[k, -1] = p[-2]
    np.testing.assert_allclose(out.values, ref, rtol=1e-13)


def test_mesh_region_limited_in_time_and_uncovered_cells_keep_input(x64):
    nt, nx = 6, 4
    a = np.arange(nt * nx, dtype=float).reshape(nt, nx)
    U = xr.DataArray(a, dims=("time", "x"))
    m = U.stencil.mesh(boundary="periodic")
    m[{"time": slice(2, 4)}] = lambda u: u(time=-1) + 100.0
    out = m.scan(dim="time")
    ref = a.copy()
    for t in (2, 3):
        ref[t] = ref[t - 1] + 100
    np.testing.assert_allclose(out.values, ref)


def test_mesh_scan_grown_with_mask(x64):
    nx = 6
    da = xr.DataArray(np.zeros(nx), dims="x")
    m = da.stencil.mesh(boundary="periodic")
    m[...] = lambda u: u(time=-1) + 1.0
    m[da.x >= 0] = lambda u: u(time=-1) + 1.0  # a mask covering everything
    m[xr.DataArray(np.arange(nx) % 2 == 0, dims="x")] = lambda u: u(time=-1) + 2.0
    out = m.scan(dim="time", steps=3)
    np.testing.assert_allclose(out.values[-1], np.where(np.arange(nx) % 2 == 0, 6.0, 3.0))


def test_dataset_coupled_fields_and_constants(x64):
    nx, nt, dt = 16, 12, 0.01
    x = np.linspace(0, 1, nx, endpoint=False)
    dx = x[1]
    ds = xr.Dataset({"u": ("x", np.sin(2 * np.pi * x)),
                     "h": ("x", 1 + 0.1 * np.cos(2 * np.pi * x)),
                     "depth": ("x", 1 + 0.5 * x)},
                    coords={"x": x}, attrs={"title": "sw"})
    ds["u"].attrs["units"] = "m/s"

    def sw(s):
        u, h = s["u"], s["h"]
        return {"u": u(time=-1) - dt * (h(time=-1, x=1) - h(time=-1, x=-1)) / (2 * dx),
                "h": h(time=-1) - dt * s["depth"]() * (u(time=-1, x=1) - u(time=-1, x=-1))
                / (2 * dx)}

    out = ds.stencil.scan(sw, dim="time", steps=nt, dt=dt, boundary="periodic")
    u, h, d = ds.u.values.copy(), ds.h.values.copy(), ds.depth.values
    us, hs = [u], [h]
    for _ in range(nt):
        u, h = (u - dt * (np.roll(h, -1) - np.roll(h, 1)) / (2 * dx),
                h - dt * d * (np.roll(u, -1) - np.roll(u, 1)) / (2 * dx))
        us.append(u)
        hs.append(h)
    np.testing.assert_allclose(out.u.values, np.stack(us), rtol=1e-12)
    np.testing.assert_allclose(out.h.values, np.stack(hs), rtol=1e-12)
    assert out.u.dims == ("time", "x") and out.depth.dims == ("x",)
    assert list(out.data_vars) == ["u", "h", "depth"]
    assert out.attrs == {"title": "sw"} and out.u.attrs == {"units": "m/s"}
    # the full-trajectory form gives the same numbers
    traj = xr.Dataset({"u": out.u * 0 + out.u.isel(time=[0]).values,
                       "h": out.h * 0 + out.h.isel(time=[0]).values, "depth": ds.depth})
    again = traj.stencil.scan(sw, dim="time", boundary="periodic")
    np.testing.assert_allclose(again.u.values, out.u.values, rtol=1e-12)


def test_dataset_forcing_variable_along_time_is_read_not_advanced(x64):
    nt, nx = 5, 3
    f = np.arange(nt, dtype=float)[:, None] * np.ones(nx)
    ds = xr.Dataset({"u": (("time", "x"), np.zeros((nt, nx))), "f": (("time", "x"), f)})
    out = ds.stencil.scan(lambda s: {"u": s["u"](time=-1) + s["f"]()}, dim="time",
                          boundary="extend")
    np.testing.assert_allclose(out.u.values[:, 0], np.cumsum(np.arange(nt)) )
    np.testing.assert_array_equal(out.f.values, f)


def test_integer_cellular_automaton():
    """Rule 90 on int data: no fill value needed with a periodic boundary."""
    a = np.zeros(11, dtype=np.int32)
    a[5] = 1
    out = xr.DataArray(a, dims="x").stencil.scan(
        lambda u: (u(time=-1, x=-1) + u(time=-1, x=1)) % 2, dim="time", steps=5,
        boundary="periodic")
    ref = [a]
    for _ in range(5):
        ref.append((np.roll(ref[-1], 1) + np.roll(ref[-1], -1)) % 2)
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out.values, np.stack(ref))


def test_dim_not_first_and_extra_args(x64):
    u0 = np.random.default_rng(8).random((5, 3))
    U = xr.DataArray(np.zeros((5, 4, 3)), dims=("x", "time", "y"))
    U[:, 0, :] = u0

    def k(u, c, w):
        return u(time=-1) + c * (u(time=-1, x=1) - u(time=-1)) * w

    out = U.stencil.scan(k, "time", 0.5, w=np.float64(2.0), boundary="periodic")
    assert out.dims == ("x", "time", "y")
    p = u0
    for t in range(1, 4):
        p = p + 0.5 * (np.roll(p, -1, 0) - p) * 2.0
        np.testing.assert_allclose(out.values[:, t, :], p, rtol=1e-13)


def test_scan_inside_jit(x64):
    import jax

    da = xr.DataArray(np.random.default_rng(9).random(6), dims="x")

    @jax.jit
    def f(a):
        return xr.DataArray(a, dims="x").stencil.scan(heat, dim="time", steps=4,
                                                      boundary="periodic").data

    np.testing.assert_allclose(f(da.data), da.stencil.scan(heat, dim="time", steps=4,
                                                           boundary="periodic").values)


def _lin(u, a, b, c):
    return a * u(time=-1, x=-1) + b * u(time=-1) + c * u(time=-1, x=1)


@settings(max_examples=15, deadline=None)
@given(mode=st.sampled_from(sorted(NP_MODES)),
       coef=st.tuples(*[st.floats(-1, 1, allow_nan=False)] * 3),
       seed=st.integers(0, 2**16))
def test_property_linear_scan_matches_numpy(mode, coef, seed):
    import jax

    with jax.enable_x64(True):
        u0 = np.random.default_rng(seed).standard_normal(8)
        a, b, c = (np.float64(v) for v in coef)
        out = xr.DataArray(u0, dims="x").stencil.scan(_lin, "time", a, b, c, steps=4,
                                                      boundary=mode, fill_value=0.5)
        ref = [u0]
        for _ in range(4):
            kw = {"constant_values": 0.5} if mode == "fill" else {}
            q = np.pad(ref[-1], 1, mode=NP_MODES[mode], **kw)
            ref.append(a * q[:-2] + b * q[1:-1] + c * q[2:])
        np.testing.assert_allclose(out.values, np.stack(ref), rtol=1e-12, atol=1e-12)

"""The repeat-call fast path of ``scan`` (xstencil._labelled.scan_fast).

A repeated scan with the same layout, kernel and options skips the setup;
these tests check that it is taken, and that nothing that could change the
result (a closed-over global, coordinate values, attrs, name, dtype,
chunking, the arrays read) ever gives a stale one.  Results are checked
against plain numpy loops.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
import xarray as xr

import xstencil
from tests.compiles import compiles
from xstencil._labelled import scan as scan_mod
from xstencil._labelled import scan_fast

NU = 0.2


def heat(u):
    c = u(time=-1)
    return c + NU * (u(time=-1, x=1) + u(time=-1, x=-1) - 2 * c)


def np_heat(x0: np.ndarray, steps: int, nu: float = 0.2) -> np.ndarray:
    """The trajectory of ``heat`` with a zero halo along the last axis."""
    out = [np.asarray(x0, dtype=np.float64)]
    for _ in range(steps):
        u = out[-1]
        p = np.pad(u, [(0, 0)] * (u.ndim - 1) + [(1, 1)])
        out.append(u + nu * (p[..., 2:] + p[..., :-2] - 2 * u))
    return np.stack(out)


@pytest.fixture
def counts(monkeypatch):
    """How many calls took the fast path and the full path."""
    n = {"fast": 0, "full": 0}
    fast_run, full_run = scan_fast.run, scan_mod._run

    def fast(*a, **k):
        n["fast"] += 1
        return fast_run(*a, **k)

    def full(*a, **k):
        n["full"] += 1
        return full_run(*a, **k)

    monkeypatch.setattr(scan_fast, "run", fast)
    monkeypatch.setattr(scan_mod, "_run", full)
    xstencil.clear_caches()
    return n


def _da(values=None, x=None, **kw):
    v = np.random.default_rng(0).random((3, 8)) if values is None else values
    x = np.arange(8) * 0.5 if x is None else x
    return xr.DataArray(v, dims=("y", "x"), coords={"y": [10, 20, 30], "x": x,
                                                      "label": ("y", ["a", "b", "c"])},
                        name=kw.pop("name", "T"), attrs=kw.pop("attrs", {"units": "K"}))


OPTS = dict(dim="time", steps=4, boundary="fill", fill_value=0.0)


def test_repeat_takes_the_fast_path_and_matches_numpy(counts):
    da = _da()
    first = da.stencil.scan(heat, **OPTS)
    second = da.stencil.scan(heat, **OPTS)
    assert counts == {"fast": 1, "full": 1}
    want = np_heat(da.values, 4).transpose(0, 1, 2)
    np.testing.assert_allclose(second.values, want, rtol=1e-12)
    xr.testing.assert_identical(first, second)
    assert second.dims == ("time", "y", "x") and second.name == "T"
    assert second.attrs == {"units": "K"}
    np.testing.assert_array_equal(second["time"].values, np.arange(5))
    np.testing.assert_array_equal(second["label"].values, ["a", "b", "c"])


@pytest.mark.parametrize("save_every", [2, "last"])
def test_save_every_takes_the_fast_path(counts, save_every):
    da = _da()
    for _ in range(3):
        out = da.stencil.scan(heat, save_every=save_every, **OPTS)
    assert counts == {"fast": 2, "full": 1}
    full = np_heat(da.values, 4)
    if save_every == "last":
        np.testing.assert_allclose(out.values, full[-1], rtol=1e-12)
        assert out.dims == ("y", "x") and int(out["time"]) == 4
    else:
        np.testing.assert_allclose(out.values, full[::2], rtol=1e-12)
        np.testing.assert_array_equal(out["time"].values, [0, 2, 4])
    xstencil.clear_caches()
    xr.testing.assert_identical(out, da.stencil.scan(heat, save_every=save_every, **OPTS))


def test_changed_global_is_not_stale(counts):
    global NU
    da = _da()
    da.stencil.scan(heat, **OPTS)
    try:
        NU = 0.1
        out = da.stencil.scan(heat, **OPTS)
    finally:
        NU = 0.2
    np.testing.assert_allclose(out.values, np_heat(da.values, 4, nu=0.1), rtol=1e-12)
    back = da.stencil.scan(heat, **OPTS)
    np.testing.assert_allclose(back.values, np_heat(da.values, 4), rtol=1e-12)


def test_changed_closed_over_array_and_input_are_read_afresh(counts):
    w = np.array(0.2)

    def kern(u):
        c = u(time=-1)
        return c + w * (u(time=-1, x=1) + u(time=-1, x=-1) - 2 * c)

    values = np.random.default_rng(1).random((3, 8))
    da = _da(values)
    da.stencil.scan(kern, **OPTS)
    w[...] = 0.1
    values[0, 0] = 5.0  # in place, in the input
    out = da.stencil.scan(kern, **OPTS)
    assert counts["fast"] == 1
    np.testing.assert_allclose(out.values, np_heat(values, 4, nu=0.1), rtol=1e-12)


def test_changed_coordinate_values_are_not_stale(counts):
    def ddx(u):  # reads the x coordinate (non-uniform grids)
        x = u.coord("x")
        return u(time=-1) + 0.1 * (u(time=-1, x=1) - u(time=-1, x=-1)) / (x(x=1) - x(x=-1))

    def ref(v, x):
        out = [v]
        xp = np.concatenate([[2 * x[0] - x[1]], x, [2 * x[-1] - x[-2]]])
        for _ in range(4):
            u = out[-1]
            p = np.pad(u, [(0, 0), (1, 1)])
            out.append(u + 0.1 * (p[:, 2:] - p[:, :-2]) / (xp[2:] - xp[:-2]))
        return np.stack(out)

    v = np.random.default_rng(2).random((3, 8))
    x1, x2 = np.arange(8) * 0.5, np.cumsum(np.linspace(0.1, 1.0, 8))
    first = _da(v, x1).stencil.scan(ddx, **OPTS)
    second = _da(v, x2).stencil.scan(ddx, **OPTS)
    np.testing.assert_allclose(first.values, ref(v, x1), rtol=1e-12)
    np.testing.assert_allclose(second.values, ref(v, x2), rtol=1e-12)
    np.testing.assert_array_equal(second["x"].values, x2)
    # a coordinate the kernel does not read: the result's labels are the new ones
    da = _da(v, x1).assign_coords(label=("y", ["p", "q", "r"]))
    out = da.stencil.scan(heat, **OPTS)
    out2 = da.assign_coords(label=("y", ["s", "t", "u"])).stencil.scan(heat, **OPTS)
    np.testing.assert_array_equal(out["label"].values, ["p", "q", "r"])
    np.testing.assert_array_equal(out2["label"].values, ["s", "t", "u"])
    assert counts["fast"] >= 1


def test_changed_attrs_and_name_are_not_stale(counts):
    da = _da()
    da.stencil.scan(heat, **OPTS)
    out = _da(name="S", attrs={"units": "degC"}).stencil.scan(heat, **OPTS)
    assert counts["fast"] == 1
    assert out.name == "S" and out.attrs == {"units": "degC"}
    np.testing.assert_allclose(out.values, np_heat(da.values, 4), rtol=1e-12)


def test_changed_dtype_is_not_stale(counts):
    v = np.random.default_rng(3).random((3, 8))
    out64 = _da(v).stencil.scan(heat, **OPTS)
    out32 = _da(v.astype(np.float32)).stencil.scan(heat, **OPTS)
    assert out64.dtype == np.float64 and out32.dtype == np.float32
    np.testing.assert_allclose(out32.values, np_heat(v.astype(np.float32), 4), rtol=1e-5)
    again = _da(v).stencil.scan(heat, **OPTS)
    assert again.dtype == np.float64
    np.testing.assert_allclose(again.values, np_heat(v, 4), rtol=1e-12)
    # dtype= is an option of the call: a different one is a different entry
    as32 = _da(v).stencil.scan(heat, dtype="float32", **OPTS)
    assert as32.dtype == np.float32
    np.testing.assert_allclose(as32.values, np_heat(v, 4), rtol=1e-5)
    as64 = _da(v.astype(np.float32)).stencil.scan(heat, dtype="float64", **OPTS)
    as64b = _da(v.astype(np.float32)).stencil.scan(heat, dtype="float64", **OPTS)
    assert as64.dtype == as64b.dtype == np.float64
    np.testing.assert_allclose(as64b.values, np_heat(v.astype(np.float32), 4), rtol=1e-12)


def test_chunked_data_takes_the_full_path(counts):
    pytest.importorskip("dask")
    da = _da()
    mem = da.stencil.scan(heat, **OPTS)
    lazy = da.chunk({"y": 1}).stencil.scan(heat, **OPTS)
    lazy2 = da.chunk({"y": 2}).stencil.scan(heat, **OPTS)
    assert counts["fast"] == 0
    assert lazy.chunks is not None and lazy2.chunks[1] == (2, 1)
    np.testing.assert_allclose(lazy.values, mem.values, rtol=1e-12)
    np.testing.assert_allclose(lazy2.values, mem.values, rtol=1e-12)
    xr.testing.assert_identical(da.stencil.scan(heat, **OPTS), mem)
    assert counts["fast"] == 1


def test_dataset_takes_the_fast_path_with_constants_read_afresh(counts):
    v = np.random.default_rng(4).random((3, 8))

    def kern(s):
        return {"T": heat(s["T"]) + s["k"](), "S": heat(s["S"])}

    def ds(k):
        return xr.Dataset({"T": (("y", "x"), v, {"units": "K"}), "S": (("y", "x"), 2 * v),
                           "k": (("y", "x"), np.broadcast_to(k, (3, 8)))},
                          coords={"x": np.arange(8.0)}, attrs={"title": "t"})

    k1, k2 = np.zeros(8), np.linspace(0, 1, 8)
    ds(k1).stencil.scan(kern, **OPTS)
    out = ds(k2).stencil.scan(kern, **OPTS)
    assert counts == {"fast": 1, "full": 1}
    want_t = [v]
    for _ in range(4):
        want_t.append(np_heat(want_t[-1], 1)[-1] + k2)
    np.testing.assert_allclose(out["T"].values, np.stack(want_t), rtol=1e-12)
    np.testing.assert_allclose(out["S"].values, np_heat(2 * v, 4), rtol=1e-12)
    np.testing.assert_array_equal(out["k"].values, np.broadcast_to(k2, (3, 8)))
    assert list(out.data_vars) == ["T", "S", "k"] and out.attrs == {"title": "t"}
    assert out["T"].attrs == {"units": "K"} and out["T"].dims == ("time", "y", "x")
    xstencil.clear_caches()
    xr.testing.assert_identical(out, ds(k2).stencil.scan(kern, **OPTS))


def test_dataset_with_a_forcing_falls_back(counts):
    v = np.random.default_rng(5).random((5, 8))

    def kern(s):
        return {"T": s["T"](time=-1) + s["F"]()}

    ds = xr.Dataset({"T": (("time", "x"), v), "F": (("time", "x"), v * 0 + 1.0)})
    for _ in range(2):
        out = ds.stencil.scan(kern, "time", boundary="fill", fill_value=0.0)
    assert counts == {"fast": 0, "full": 2}
    np.testing.assert_allclose(out["T"].values, v[0] + np.arange(5)[:, None], rtol=1e-12)


def test_time_coordinate_read_by_the_kernel(counts):
    def growth(u):  # u(t) = u(t-1) * (1 + (t - t_prev))
        t = u.coord("time")
        return u(time=-1) * (1 + t() - t(time=-1))

    u0 = xr.DataArray(np.ones(3), dims="x")
    a = u0.stencil.scan(growth, steps=3, dt=0.5)
    b = u0.stencil.scan(growth, steps=3, dt=0.5)
    c = u0.stencil.scan(growth, steps=3, dt=0.25)
    assert counts == {"fast": 1, "full": 2}
    np.testing.assert_allclose(b.values[:, 0], 1.5 ** np.arange(4))
    np.testing.assert_allclose(c.values[:, 0], 1.25 ** np.arange(4))
    np.testing.assert_array_equal(b["time"].values, [0, 0.5, 1.0, 1.5])
    xr.testing.assert_identical(a, b)
    # the input's own trajectory: new time labels are not stale
    traj = xr.DataArray(np.ones((4, 3)), dims=("time", "x"), coords={"time": [0., 1, 2, 3]})
    traj.stencil.scan(growth)
    out = traj.assign_coords(time=[0., 2, 4, 6]).stencil.scan(growth)
    np.testing.assert_allclose(out.values[:, 0], 3.0 ** np.arange(4))
    np.testing.assert_array_equal(out["time"].values, [0, 2, 4, 6])


def test_continued_time_coordinate_is_not_stale(counts):
    u0 = xr.DataArray(np.ones(3), dims="x")
    b = u0.assign_coords(time=7.0).stencil.scan(heat, **{**OPTS, "dt": 1.0})
    c = u0.assign_coords(time=9.0).stencil.scan(heat, **{**OPTS, "dt": 1.0})
    np.testing.assert_array_equal(b["time"].values, 7.0 + np.arange(5))
    np.testing.assert_array_equal(c["time"].values, 9.0 + np.arange(5))


def test_check_finite_raises_on_the_fast_path(counts):
    da = _da()
    da.stencil.scan(heat, check_finite=True, **OPTS)
    bad = da.copy(data=np.where(np.arange(8) == 3, np.inf, da.values))
    with pytest.raises(xstencil.XStencilError, match="initial state"):
        bad.stencil.scan(heat, check_finite=True, **OPTS)
    assert counts["fast"] == 1


def test_result_mutation_does_not_reach_the_cache(counts):
    da = _da()
    da.stencil.scan(heat, **OPTS)
    out = da.stencil.scan(heat, **OPTS)
    out["time"].attrs["units"] = "s"
    out.attrs["units"] = "mK"
    again = da.stencil.scan(heat, **OPTS)
    assert counts["fast"] == 2
    assert "units" not in again["time"].attrs and again.attrs == {"units": "K"}
    np.testing.assert_allclose(again.values, np_heat(da.values, 4), rtol=1e-12)


def test_inside_jit(counts):
    def f(v):
        return xstencil.scan(xr.DataArray(v, dims=("y", "x")), heat, **OPTS).data

    v = np.random.default_rng(6).random((3, 8)).astype(np.float32)
    g = jax.jit(f)
    np.testing.assert_allclose(np.asarray(g(v)), np_heat(v, 4), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(jax.jit(f)(v + 1)), np_heat(v + 1, 4), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(f(v)), np_heat(v, 4), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(f(v)), np_heat(v, 4), rtol=1e-5)
    assert counts["fast"] >= 1


def test_nan_fill_value_and_kernel_arguments(counts):
    def kern(u, c, scale=1.0):
        return u(time=-1) + scale * c * (u(time=-1, x=1) - u(time=-1))

    da = _da()
    opts = dict(steps=2, boundary="fill", fill_value=np.nan)
    a = da.stencil.scan(kern, "time", np.float64(0.5), scale=2.0, **opts)
    b = da.stencil.scan(kern, "time", np.float64(0.25), scale=2.0, **opts)  # a traced argument
    c = da.stencil.scan(kern, "time", np.float64(0.25), scale=1.0, **opts)  # a static one
    assert counts == {"fast": 1, "full": 2}

    def ref(c):
        out = [da.values]
        for _ in range(2):
            u = out[-1]
            right = np.concatenate([u[:, 1:], np.full((3, 1), np.nan)], axis=1)
            out.append(u + c * (right - u))
        return np.stack(out)

    np.testing.assert_allclose(a.values, ref(1.0), rtol=1e-12)
    np.testing.assert_allclose(b.values, ref(0.5), rtol=1e-12)
    np.testing.assert_allclose(c.values, ref(0.25), rtol=1e-12)
    with pytest.raises(xstencil.XStencilError, match="neither an array nor hashable"):
        da.stencil.scan(kern, "time", np.float64(0.5), scale={1.0}, **opts)


def test_fast_result_keeps_the_full_results_order(counts):
    v = np.random.default_rng(7).random((3, 8))
    ds = xr.Dataset({"b": (("y", "x"), v), "a": (("y", "x"), v)},
                    coords={"x": np.arange(8.0), "lat": ("y", [1.0, 2, 3]), "y": [5, 6, 7]})

    def kern(s):
        return {"a": heat(s["a"]), "b": heat(s["b"])}

    full = ds.stencil.scan(kern, **OPTS)
    fast = ds.stencil.scan(kern, **OPTS)
    assert counts == {"fast": 1, "full": 1}
    assert list(fast.variables) == list(full.variables)
    assert list(fast.coords) == list(full.coords) and list(fast.data_vars) == ["b", "a"]
    xr.testing.assert_identical(fast, full)
    da = ds["b"]
    full = da.stencil.scan(heat, **OPTS)
    fast = da.stencil.scan(heat, **OPTS)
    assert list(fast.coords) == list(full.coords)
    assert repr(fast) == repr(full)


@pytest.mark.parametrize("save_every", [1, 2, "last"])
def test_repeats_do_not_compile(counts, save_every):
    da = _da().transpose("x", "y")  # the result's dims differ from the loop's
    ds = xr.Dataset({"a": da, "b": da.T})
    kern = lambda s: {"a": heat(s["a"]), "b": heat(s["b"])}  # noqa: E731
    da.stencil.scan(heat, save_every=save_every, **OPTS)
    ds.stencil.scan(kern, save_every=save_every, **OPTS)
    with compiles() as got:
        for _ in range(2):
            a = da.stencil.scan(heat, save_every=save_every, **OPTS)
            b = ds.stencil.scan(kern, save_every=save_every, **OPTS)
    assert not got["compiles"] and counts["fast"] == 4
    assert a.dims[-2:] == ("x", "y") and b["b"].dims[-2:] == ("y", "x")
    full = np_heat(da.values.T, 4)
    want = full[-1] if save_every == "last" else full[::save_every]
    np.testing.assert_allclose(a.transpose(..., "y", "x").values, want, rtol=1e-12)
    np.testing.assert_allclose(b["b"].values, want, rtol=1e-12)


def test_dataset_variables_in_other_dim_orders_square(counts):
    """Square variables stored in different dim orders: a transposition
    missed on the fast path would give a wrong result of the right shape."""
    v = np.random.default_rng(8).random((6, 6))
    ds = xr.Dataset({"a": (("y", "x"), v), "b": (("x", "y"), v)})
    kern = lambda s: {"a": heat(s["a"]), "b": heat(s["b"])}  # noqa: E731
    for _ in range(2):
        out = ds.stencil.scan(kern, **OPTS)
    assert counts == {"fast": 1, "full": 1}
    np.testing.assert_allclose(out["a"].transpose("time", "y", "x").values, np_heat(v, 4),
                               rtol=1e-12)
    np.testing.assert_allclose(out["b"].transpose("time", "y", "x").values, np_heat(v.T, 4),
                               rtol=1e-12)
    traj = xr.Dataset({"a": (("x", "time", "y"), np.stack([v, v], 1)),
                       "b": (("time", "y", "x"), np.stack([v, v]))})
    for _ in range(2):
        out = traj.stencil.scan(kern, boundary="fill", fill_value=0.0)
    assert counts == {"fast": 2, "full": 2}
    np.testing.assert_allclose(out["a"].transpose("time", "y", "x").values, np_heat(v.T, 1),
                               rtol=1e-12)
    np.testing.assert_allclose(out["b"].values, np_heat(v, 1), rtol=1e-12)

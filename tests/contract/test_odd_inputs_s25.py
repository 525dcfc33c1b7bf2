"""Odd inputs from session 25's adversarial pass: each was a silently wrong
result, a raw JAX error, or a message that blamed the user's kernel.  Every
case is checked against plain numpy or against the same call on ordinary
(native, float64, well-named) data."""

from __future__ import annotations

import dask.array
import numpy as np
import pandas as pd
import pytest
import xarray as xr

import xstencil
from xstencil import XStencilError

BACKENDS = [None, "loops", "xla"]


def _opts(backend):
    return {} if backend is None else {"backend": backend}


# -- integer coordinates beyond 2**53 -----------------------------------------------------

EPOCH_NS = 1_700_000_000_000_000_000 + 1000 * np.arange(8, dtype=np.int64)  # 1 us steps


def _dx(u):
    return u.coord("x")(x=1) - u.coord("x")(x=-1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_huge_integer_coordinates_are_refused_when_read(backend):
    """Read as float64 they were rounded to 256: differences of 2048 and 1792
    for a step of 2000, with no error.  A kernel that does not read them, and
    integer coordinates float64 holds exactly, are fine."""
    da = xr.DataArray(np.zeros(8), dims="x", coords={"x": EPOCH_NS})
    with pytest.raises(XStencilError, match=r"'x' holds integers beyond 2\*\*53.*datetime64"):
        da.stencil.map(_dx, boundary="extend", **_opts(backend))
    out = da.stencil.map(lambda u: u(x=1) - u(x=-1), boundary="extend", **_opts(backend))
    np.testing.assert_array_equal(out.x.values, EPOCH_NS)
    as_time = da.assign_coords(x=EPOCH_NS.astype("datetime64[ns]"))
    np.testing.assert_allclose(
        as_time.stencil.map(_dx, boundary="extend", **_opts(backend)).values, 2e-6,
        rtol=1e-14)  # seconds, from the first time: exact to float64
    exact = da.assign_coords(x=2**52 + 1000 * np.arange(8, dtype=np.int64))
    np.testing.assert_array_equal(exact.stencil.map(_dx, boundary="extend").values, 2000.0)


def test_huge_integer_time_coordinate_of_a_scan_is_refused():
    t = xr.DataArray(np.zeros((1, 4)), dims=("time", "x"), coords={"time": EPOCH_NS[:1]})
    with pytest.raises(XStencilError, match=r"'time' holds integers beyond 2\*\*53"):
        t.stencil.scan(lambda u: u(time=-1) + (u.coord("time")() - u.coord("time")(time=-1)),
                       dim="time", steps=2, dt=1000)


# -- big-endian arrays (read from netCDF or HDF5 files) ------------------------------------

def _field():
    return np.random.default_rng(0).random((10, 12)).astype("float32")


@pytest.mark.parametrize("backend", BACKENDS)
def test_big_endian_weights_closed_over_or_passed(backend):
    da = xr.DataArray(_field(), dims=("y", "x"))
    w = np.linspace(0.1, 0.9, 9, dtype="f4").reshape(3, 3)
    wb = w.astype(">f4")
    opts = dict(window={"y": 3, "x": 3}, boundary="reflect", **_opts(backend))
    want = da.stencil.map(lambda u: (u * w).sum(), **opts)
    for got in (da.stencil.map(lambda u: (u * wb).sum(), **opts),
                da.stencil.map(lambda u: (u * wb.astype("f4")).sum(), **opts),
                da.stencil.map(lambda u, ww: (u * ww).sum(), ww=wb, **opts)):
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got.values, want.values)
    np.testing.assert_array_equal(wb, w)  # the closed-over array is untouched


def test_big_endian_data_in_iterate_solve_dask_and_dtype():
    a = _field().astype(np.float64)
    native = xr.DataArray(a, dims=("y", "x"))
    big = xr.DataArray(a.astype(">f8"), dims=("y", "x"))

    def jacobi(u):
        return 0.25 * (u(x=1) + u(x=-1)) + 0.5 * u()

    r0 = native.stencil.iterate(jacobi, boundary="periodic", tol=1e-3)
    r1 = big.stencil.iterate(jacobi, boundary="periodic", tol=1e-3)
    np.testing.assert_array_equal(r1.field.values, r0.field.values)

    def helmholtz(u):
        return 4.5 * u() - u(x=1) - u(x=-1) - u(y=1) - u(y=-1)

    s0 = xstencil.solve(helmholtz, native, boundary="periodic", tol=1e-10)
    s1 = xstencil.solve(helmholtz, big, boundary="periodic", tol=1e-10)
    np.testing.assert_array_equal(s1.field.values, s0.field.values)

    lazy = big.copy(data=dask.array.from_array(a.astype(">f8"), chunks=(5, 6)))
    got = lazy.stencil.map(lambda u: u(x=1) + u(x=-1) - 2 * u(), boundary="periodic")
    want = native.stencil.map(lambda u: u(x=1) + u(x=-1) - 2 * u(), boundary="periodic")
    np.testing.assert_array_equal(got.compute().values, want.values)

    cast = big.stencil.map(lambda u: u(x=1), boundary="periodic", dtype=">f8")
    assert cast.dtype == np.float64 and cast.dtype.isnative
    np.testing.assert_array_equal(cast.values, np.roll(a, -1, 1))
    with pytest.raises(XStencilError, match="allocate it with dtype 'float64', or") as e:
        big.stencil.map(lambda u: u(x=1), boundary="periodic", out=np.empty(a.shape, ">f8"))
    assert "pass dtype=" not in str(e.value)  # that would not help: results are native


# -- names, empty dims, extension dtypes, 0-d fill values ------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_a_dim_named_self(backend):
    a = np.arange(12.0).reshape(3, 4)
    da = xr.DataArray(a, dims=("self", "x"))
    out = da.stencil.map(lambda u: u(self=1) - u(), boundary="extend", **_opts(backend))
    np.testing.assert_array_equal(out.values, np.r_[a[1:], a[-1:]] - a)


def test_a_scan_over_an_empty_dim_is_refused():
    u0 = xr.DataArray(np.zeros((0, 4), "float32"), dims=("y", "x"))
    with pytest.raises(XStencilError, match="dim 'y' has size 0, so there is nothing to step"):
        u0.stencil.scan(lambda u: u(time=-1, x=1), dim="time", steps=2, dt=1.0,
                        boundary="extend")


@pytest.mark.parametrize("dtype", ["Float64", "Int64"])
def test_pandas_extension_dtypes_get_a_clear_error(dtype):
    da = xr.DataArray(pd.array([1, 2, 3, 4], dtype=dtype), dims="x")
    with pytest.raises(XStencilError, match=rf"dtype {dtype} \(a pandas extension type\).*"
                                            r"\.astype\(float\)"):
        da.stencil.map(lambda u: u(x=1), boundary="extend")
    ok = da.astype(float).stencil.map(lambda u: u(x=1), boundary="extend")
    np.testing.assert_array_equal(ok.values, [2.0, 3.0, 4.0, 4.0])


def test_a_zero_d_array_fill_value_gets_a_hint():
    da = xr.DataArray(np.arange(4.0, dtype="f4"), dims="x")
    with pytest.raises(XStencilError, match=r"a 0-d array: pass fill_value=x\.item\(\)"):
        da.stencil.map(lambda u: u(x=1), fill_value=da.min().values)
    out = da.stencil.map(lambda u: u(x=1), fill_value=da.min().values.item())
    np.testing.assert_array_equal(out.values, [1.0, 2.0, 3.0, 0.0])


@pytest.mark.parametrize("bad", [0, 2.5, True, "2"])
def test_halo_every_must_be_a_positive_int(bad):
    """In memory, halo_every was taken as given (0, 2.5, True, "2")."""
    u = xr.DataArray(np.zeros(8), dims="x")
    with pytest.raises(XStencilError, match=r"halo_every=.* must be an int >= 1"):
        u.stencil.scan(lambda u: u(time=-1, x=1), dim="time", steps=2, halo_every=bad,
                       boundary="periodic")

"""Streamed saves (``scan(..., store=)``): what session 25's adversarial pass
found, each against the same scan run in one piece."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

import xstencil  # noqa: F401 - the .stencil accessor
from xstencil import XStencilError

pytest.importorskip("zarr")


def heat(u):
    return u(time=-1) + 0.25 * (u(time=-1, x=1) - 2 * u(time=-1) + u(time=-1, x=-1))


def heat2(u):
    return u(time=-1) + 0.1 * (u(time=-1, x=1) + u(time=-1, x=-1) + u(time=-1, y=1)
                               + u(time=-1, y=-1) - 4 * u(time=-1))


def test_irregular_datetimes_keep_their_labels(tmp_path):
    """The first segment fixed the store's CF units from its own values (days);
    a later position 60 hours in was read back as 60 days."""
    u0 = xr.DataArray(np.sin(np.arange(8.0)), dims="x", coords={"x": np.arange(8.0)}, name="T")
    coord = np.datetime64("2001-01-01T00:00:00", "s") + np.array([0, 24, 48, 60, 72],
                                                                  "timedelta64[h]")
    want = u0.stencil.scan(heat, dim="time", steps=4, coord=coord, boundary="periodic")
    got = u0.stencil.scan(heat, dim="time", steps=4, coord=coord, boundary="periodic",
                          store=tmp_path / "t.zarr", segment=1)
    np.testing.assert_array_equal(got.time.values, want.time.values)
    np.testing.assert_array_equal(got.values, want.values)


def test_dask_chunks_of_unequal_size(tmp_path):
    """Later segments were rechunked to the largest chunk, (8, 15, 8) to
    (15, 15, 1), and the 1-point chunk was refused as under the halo."""
    def heat4(u):  # reach 2 along y
        return u(time=-1) + 0.02 * (-u(time=-1, y=2) + 16 * u(time=-1, y=1) - 30 * u(time=-1)
                                    + 16 * u(time=-1, y=-1) - u(time=-1, y=-2))

    src = xr.DataArray(np.random.default_rng(1).random((31, 6)), dims=("y", "x"), name="T")
    want = src.stencil.scan(heat4, dim="time", steps=8, boundary="periodic")
    got = src.chunk({"y": (8, 15, 8)}).stencil.scan(
        heat4, dim="time", steps=8, boundary="periodic", store=tmp_path / "d.zarr", segment=2)
    np.testing.assert_allclose(got.compute().values, want.values, rtol=1e-14, atol=1e-15)


@pytest.mark.parametrize("backend", ["loops", "xla"])
def test_backend_reaches_every_segment(tmp_path, backend):
    """store= dropped backend=: the segments ran on the default route, an ulp
    away from the one-piece scan on the other."""
    da = xr.DataArray(np.random.default_rng(22).random((10, 12)).astype("float32"),
                      dims=("y", "x"), name="T")
    kw = dict(dim="time", steps=10, save_every=2, boundary="periodic", backend=backend)
    want = da.stencil.scan(heat2, **kw)
    got = da.stencil.scan(heat2, store=tmp_path / "b.zarr", segment=2, **kw)
    np.testing.assert_array_equal(got.values, want.values)


def test_resume_under_another_backend_is_refused(tmp_path, monkeypatch):
    da = xr.DataArray(np.random.default_rng(3).random((6, 7)), dims=("y", "x"), name="T")
    path = tmp_path / "r.zarr"
    da.stencil.scan(heat2, dim="time", steps=4, boundary="periodic", store=path,
                    backend="xla")
    monkeypatch.setenv("XSTENCIL_BACKEND", "loops")
    with pytest.raises(XStencilError, match="other"):
        da.stencil.scan(heat2, dim="time", steps=4, boundary="periodic", store=path,
                        resume=True)


def test_a_dataarray_named_like_its_coordinate(tmp_path):
    x = np.arange(8.0)
    a = xr.DataArray(np.sin(x), dims="x", coords={"x": x}, name="x")
    want = a.stencil.scan(heat, dim="time", steps=4, boundary="periodic")
    got = a.stencil.scan(heat, dim="time", steps=4, boundary="periodic",
                         store=tmp_path / "n.zarr")
    assert got.name == "x"
    np.testing.assert_array_equal(got.values, want.values)
    np.testing.assert_array_equal(got.x.values, x)


def test_months_are_no_fixed_spacing():
    u = xr.DataArray(np.zeros(4), dims="x", coords={"time": np.datetime64("2020-01-31")})
    with pytest.raises(XStencilError, match="counts months or years.*coord="):
        u.stencil.scan(heat, dim="time", steps=3, dt=np.timedelta64(1, "M"),
                       boundary="periodic")


def test_a_dataset_keeps_its_variable_order(tmp_path):
    """The store lists its variables in no fixed order; the result has the input's."""
    rng = np.random.default_rng(4)
    ds = xr.Dataset({n: ("x", rng.random(8)) for n in ("h", "c", "b", "u")})

    def k(s):
        return {n: s[n](time=-1, x=1) for n in ("h", "c", "b", "u")}

    got = ds.stencil.scan(k, dim="time", steps=3, boundary="periodic",
                          store=tmp_path / "o.zarr")
    assert list(got.data_vars) == ["h", "c", "b", "u"]
    want = ds.stencil.scan(k, dim="time", steps=3, boundary="periodic")
    for n in ds.data_vars:
        np.testing.assert_array_equal(got[n].values, want[n].values)

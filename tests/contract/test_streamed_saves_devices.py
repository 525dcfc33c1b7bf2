"""Streamed saves with the scale-out options that used to be refused with
``store=``: ``devices=`` (here on the one device of the test process; the
4-device runs, SIGKILL included, are in tests/backends/test_shard_store.py) and
``halo_every=`` on dask-backed data.  The reference is the same scan run
uninterrupted, and the in-memory scan."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

from xstencil._errors import XStencilError

pytest.importorskip("zarr")

C = np.float32(0.2)


def diffuse(u):
    return u(time=-1) + C * (u(time=-1, x=1) + u(time=-1, x=-1) + u(time=-1, y=1)
                             + u(time=-1, y=-1) - 4 * u(time=-1))


def _u0() -> xr.DataArray:
    x = np.random.default_rng(7).random((12, 16)).astype(np.float32)
    return xr.DataArray(x, dims=("y", "x"), name="h", attrs={"units": "m"})


OPTS = dict(dim="time", steps=12, save_every=2, dt=0.5,
            boundary={"x": "periodic", "y": "reflect"})


def test_devices_on_one_device(tmp_path):
    u0 = _u0()
    ref = u0.stencil.scan(diffuse, **OPTS, devices={"x": "i"})
    out = u0.stencil.scan(diffuse, **OPTS, devices={"x": "i"}, store=tmp_path / "d", segment=2)
    xr.testing.assert_identical(out.load(), ref.copy(data=np.asarray(ref.values)))
    np.testing.assert_allclose(out.values, u0.stencil.scan(diffuse, **OPTS).values, rtol=1e-6)
    with pytest.raises(XStencilError, match=r"the options differ: devices=\{'x': 'i'\} in the "
                                            r"store, devices=None now"):
        u0.stencil.scan(diffuse, **OPTS, store=tmp_path / "d", resume=True)


def test_halo_every_on_dask(tmp_path):
    u0 = _u0()
    ref = u0.chunk({"y": 6, "x": 8}).stencil.scan(diffuse, **OPTS, halo_every=2)
    out = u0.chunk({"y": 6, "x": 8}).stencil.scan(diffuse, **OPTS, halo_every=2,
                                                   store=tmp_path / "h", segment=3)
    xr.testing.assert_identical(out.load(), ref.load())
    xr.testing.assert_identical(out.load(), u0.stencil.scan(diffuse, **OPTS))


def test_devices_with_dask_data_is_refused_before_writing(tmp_path):
    with pytest.raises(XStencilError, match=r"devices=\{'x': 'i'\} shards JAX arrays over "
                                            r"devices, but the data is a dask array"):
        _u0().chunk({"x": 8}).stencil.scan(diffuse, **OPTS, devices={"x": "i"},
                                           store=tmp_path / "x")
    assert not (tmp_path / "x").exists()

"""What a streamed scan (``scan(..., store=...)``) returns, per backend.

Dask-backed input: dask chunks that follow the store's chunks (the input's
spatial chunks) and ``segment`` positions along ``dim``, never one chunk of the
whole trajectory.  In memory, and sharded over devices: numpy, read lazily
from the store on first use.  The reference is the in-memory scan, bitwise.
"""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

import xstencil  # noqa: F401 - the .stencil accessor

pytest.importorskip("zarr")
pytest.importorskip("dask")


def heat(u):
    return u(time=-1) + np.float32(0.2) * (u(time=-1, x=1) + u(time=-1, x=-1) + u(time=-1, y=1)
                                           + u(time=-1, y=-1) - 4 * u(time=-1))


def _t() -> xr.DataArray:
    rng = np.random.default_rng(1)
    return xr.DataArray(rng.random((64, 96), dtype=np.float32), dims=("y", "x"), name="T",
                        attrs={"units": "K"})


OPTS = dict(dim="time", steps=40, save_every=10, boundary="periodic")


@pytest.mark.parametrize("segment", [1, 2, 4])
def test_dask_result_is_chunked_like_the_store(tmp_path, segment):
    T = _t()
    ref = T.stencil.scan(heat, **OPTS)
    out = T.chunk({"y": 16, "x": 32}).stencil.scan(heat, **OPTS, store=tmp_path / "r.zarr",
                                                   segment=segment)
    # the store: the input's chunks, one position deep along time
    z = xr.open_zarr(tmp_path / "r.zarr", consolidated=False)
    assert z["T"].encoding["chunks"] == (1, 16, 32)
    # the result: the same spatial chunks, `segment` positions along time (the last short)
    along = (segment,) * (5 // segment) + ((5 % segment,) if 5 % segment else ())
    assert out.chunks == (along, (16,) * 4, (32,) * 3)
    assert max(c for c in out.data.chunksize) <= 32
    xr.testing.assert_identical(out.load(), ref)
    np.testing.assert_array_equal(out.values, ref.values)  # bitwise


def test_dask_result_after_resume_of_a_complete_store(tmp_path):
    T = _t().chunk({"y": 32, "x": 48})
    T.stencil.scan(heat, **OPTS, store=tmp_path / "r.zarr", segment=3)
    again = T.stencil.scan(heat, **OPTS, store=tmp_path / "r.zarr", segment=3, resume=True)
    assert again.chunks == ((3, 2), (32, 32), (48, 48))
    np.testing.assert_array_equal(again.values, _t().stencil.scan(heat, **OPTS).values)


def test_in_memory_result_is_numpy(tmp_path):
    T = _t()
    out = T.stencil.scan(heat, **OPTS, store=tmp_path / "m.zarr", segment=2)
    assert out.chunks is None  # not dask: read from the store on first use
    assert type(out.data) is np.ndarray
    xr.testing.assert_identical(out, T.stencil.scan(heat, **OPTS))


def test_sharded_result_is_numpy(tmp_path):
    T = _t()
    out = T.stencil.scan(heat, **OPTS, devices={"x": "i"}, store=tmp_path / "s.zarr",
                         segment=2)
    assert out.chunks is None
    assert type(out.data) is np.ndarray  # the trajectory is not put back on the devices
    np.testing.assert_array_equal(out.values, T.stencil.scan(heat, **OPTS).values)

"""open_sharded closes what it opens, reads each block once and never loads its input.

The per-process reads of two processes (each reads only its own blocks) are
checked in tests/backends/test_multiprocess.py; here one process.
"""

from __future__ import annotations

import gc
import os
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from xarray.backends import BackendArray
from xarray.core import indexing

import xstencil

pytest.importorskip("zarr")
pytest.importorskip("dask")


def _ds() -> xr.Dataset:
    rng = np.random.default_rng(5)
    return xr.Dataset(
        {"T": (("y", "x"), rng.random((4, 6)), {"units": "K"}),
         "depth": ("y", np.arange(4.0), {"units": "m"})},
        coords={"y": np.arange(4.0), "x": np.linspace(0.0, 1.0, 6),
                "lat": ("y", np.linspace(-1.0, 1.0, 4))},
        attrs={"title": "t"})


def _open_files() -> set[str]:
    """The files this process holds open (Linux: /proc/self/fd)."""
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            out.add(os.path.realpath(os.readlink(f"/proc/self/fd/{fd}")))
        except OSError:  # closed while listing
            pass
    return out


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
@pytest.mark.parametrize("fmt", ["nc", "zarr"])
def test_the_file_is_closed_on_return(tmp_path: Path, fmt: str) -> None:
    ds = _ds()
    path = tmp_path / f"in.{fmt}"
    if fmt == "nc":
        ds.to_netcdf(path)
    else:
        ds.to_zarr(path, consolidated=False)
    with xr.set_options(warn_for_unclosed_files=True):  # filterwarnings=error: would fail
        got = xstencil.open_sharded(path, {"x": "i"})
        gc.collect()
        held = {f for f in _open_files() if f.startswith(os.path.realpath(tmp_path))}
        assert held == set(), f"open_sharded left {sorted(held)} open"
        # everything it returns was read before the file closed
        xr.testing.assert_identical(xstencil.gather(got), ds)
        del got
        gc.collect()


def test_a_lazy_input_is_not_loaded() -> None:
    """Variables and coords off the sharded dims are computed into the result, not
    loaded into the caller's (dask-backed) Dataset or DataArray."""
    ds = _ds().chunk({"y": 2})
    got = xstencil.open_sharded(ds, {"x": "i"})
    assert ds["depth"].chunks is not None and ds["lat"].chunks is not None
    assert ds["T"].chunks is not None
    assert isinstance(got["depth"].data, np.ndarray) and isinstance(got["lat"].data, np.ndarray)
    xr.testing.assert_identical(xstencil.gather(got), ds.compute())
    # a DataArray: its lazy coords are computed into the result, not into the input
    da = ds["T"]
    one = xstencil.open_sharded(da, {"x": "i"})
    assert da.chunks is not None and da["lat"].chunks is not None
    assert isinstance(one["lat"].data, np.ndarray)
    xr.testing.assert_identical(xstencil.gather(one), da.compute())


class _Recorder(BackendArray):
    """A lazily indexed array that records every slice read from it."""

    def __init__(self, array: np.ndarray) -> None:
        self.array, self.shape, self.dtype = array, array.shape, array.dtype
        self.reads: list[tuple[tuple[int, int], ...]] = []

    def __getitem__(self, key):  # noqa: ANN001, ANN204
        return indexing.explicit_indexing_adapter(key, self.shape,
                                                  indexing.IndexingSupport.BASIC, self._read)

    def _read(self, key):  # noqa: ANN001, ANN202
        self.reads.append(tuple(tuple(k.indices(n)[:2]) for k, n in
                                zip(key, self.shape, strict=True)))
        return self.array[key]


def test_each_block_is_read_once_as_one_slice() -> None:
    """One slice per local block, each read once: never the whole variable first.
    (One process holds every block here; with two, each reads only its own.)"""
    values = np.arange(24.0).reshape(4, 6)
    rec = _Recorder(values)
    lazy = xr.DataArray(xr.Variable(("y", "x"), indexing.LazilyIndexedArray(rec)), name="T")
    got = xstencil.open_sharded(lazy, {"x": "i"})
    blocks = sorted(tuple((s.start or 0, values.shape[d] if s.stop is None else s.stop)
                          for d, s in enumerate(sh.index))
                    for sh in got.data.addressable_shards)
    assert sorted(rec.reads) == blocks
    np.testing.assert_array_equal(xstencil.gather(got).values, values)

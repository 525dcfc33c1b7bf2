"""``xstencil.compile_count`` counts the block functions the dask backend
traces (test_multihost only checks that it returns an int)."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

import xstencil
import xstencil._backends.dask as xd

pytest.importorskip("dask.array")


def test_compile_count_counts_new_block_functions_once() -> None:
    da = xr.DataArray(np.arange(64.0).reshape(8, 8), dims=("y", "x")).chunk({"y": 4})
    def kernel(u):
        return u(y=1) - u(y=-1) + 0.125

    xd.clear_cache()  # no kernel compiled by an earlier test is reused
    first = xstencil.compile_count()
    a = da.stencil.map(kernel, boundary="periodic").values
    second = xstencil.compile_count()
    assert second > first, (first, second)
    b = da.stencil.map(kernel, boundary="periodic").values
    assert xstencil.compile_count() == second  # the same function and chunks: no new compile
    v = da.values
    np.testing.assert_allclose(a, np.roll(v, -1, 0) - np.roll(v, 1, 0) + 0.125)
    np.testing.assert_array_equal(a, b)

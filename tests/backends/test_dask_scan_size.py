"""A dask-backed scan's saved trajectory need not fit in memory.

The in-memory scan refuses a saved trajectory larger than the memory there
is (and advises dask-backed data); the dask-backed scan used to run that
same check (in the dtype setup before the backend is chosen) and refused the
very scan it advised."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

import xstencil._labelled.sizes as sizes
from xstencil import XStencilError


def halve(u):
    return 0.5 * u(time=-1)


def test_dask_scan_larger_than_memory_runs(monkeypatch):
    monkeypatch.setattr(sizes, "memory_limit", lambda: 100_000)  # bytes
    u0 = xr.DataArray(np.arange(64.0).reshape(8, 8), dims=("y", "x"))
    # 401 positions of 512 bytes: more than the limit
    with pytest.raises(XStencilError, match=r"the saved trajectory \(401 positions along "
                                            r"'time'\) would need .*dask-backed data"):
        u0.stencil.scan(halve, "time", steps=400, boundary="periodic")
    out = u0.chunk({"x": 4}).stencil.scan(halve, "time", steps=400, boundary="periodic")
    assert out.chunks is not None and out.sizes["time"] == 401
    got = out.isel(time=[0, 1, 7, 400]).values
    ref = u0.values[None] * 0.5 ** np.array([0, 1, 7, 400])[:, None, None]
    np.testing.assert_allclose(got, ref, rtol=1e-12)

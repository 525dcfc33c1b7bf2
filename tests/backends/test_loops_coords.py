"""The loop backend on float32 data with numeric dimension coordinates.

Such coordinates reach the engine as packed complex64 ``hi + lo`` pairs
(``xstencil._engine.coords.pack_coord``).  A kernel that never reads them
must still run as loops (before, every float32 DataArray with coordinates
silently ran with XLA); a kernel that reads them falls back to XLA with the
same result.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import xarray as xr

import xstencil  # noqa: F401 - registers the accessor

pytest.importorskip("numba")


def _da() -> xr.DataArray:
    rng = np.random.default_rng(5)
    x = np.cumsum(rng.random(14)) + 1e4  # non-uniform, large values: packed pairs matter
    return xr.DataArray(rng.random((9, 14), dtype=np.float32), dims=("y", "x"),
                        coords={"x": x, "y": np.arange(9.0)})


def test_a_kernel_that_ignores_coords_runs_as_loops(ran: list[int]) -> None:
    da = _da()
    res = da.stencil.map(lambda u: u(x=1) - 2 * u() + u(x=-1), boundary="fill",
                         fill_value=0.0, backend="loops")
    p = np.pad(da.values, ((0, 0), (1, 1)))
    want = p[:, 2:] - 2 * p[:, 1:-1] + p[:, :-2]
    assert ran == [1]
    np.testing.assert_array_equal(np.asarray(res), want)
    assert res.dtype == np.float32


def test_a_kernel_that_reads_coords_falls_back_with_the_same_result(ran: list[int]) -> None:
    da = _da()

    def ddx(u: Any) -> Any:
        c = u.coord("x")
        return (u(x=1) - u(x=-1)) / (c(x=1) - c(x=-1))

    loops = da.stencil.map(ddx, boundary="extend", backend="loops")
    xla = da.stencil.map(ddx, boundary="extend", backend="xla")
    assert ran == []
    np.testing.assert_array_equal(np.asarray(loops), np.asarray(xla))
    x, a = da.x.values, da.values.astype(np.float64)
    xp, ap = np.pad(x, 1, mode="edge"), np.pad(a, ((0, 0), (1, 1)), mode="edge")
    xp[0], xp[-1] = 2 * x[0] - x[1], 2 * x[-1] - x[-2]  # extend: the spacing continues
    want = (ap[:, 2:] - ap[:, :-2]) / (xp[2:] - xp[:-2])
    np.testing.assert_allclose(np.asarray(xla), want, rtol=1e-5, atol=1e-4)

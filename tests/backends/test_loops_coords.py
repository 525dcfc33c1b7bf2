"""The loop backend on float32 data with numeric dimension coordinates.

Such coordinates reach the engine as packed complex64 ``hi + lo`` pairs
(``xstencil._engine.coords.pack_coord``).  A kernel that never reads them
must still run as loops (before, every float32 DataArray with coordinates
silently ran with XLA); a kernel that reads them runs as loops too (it fell
back to XLA before), reading each pair through its real and imaginary
parts, with XLA's result, bitwise.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr

import xstencil  # noqa: F401 - registers the accessor
from xstencil._engine.coords import pack_coord

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


def test_a_kernel_that_reads_coords_runs_on_the_loops(ran: list[int]) -> None:
    """A float32 kernel reads its coordinates as float32 pairs (complex64
    sources, read through their real and imaginary parts); the loops do the
    pair arithmetic as written (they fell back to XLA before)."""
    da = _da()

    def ddx(u: Any) -> Any:
        c = u.coord("x")
        return (u(x=1) - u(x=-1)) / (c(x=1) - c(x=-1))

    loops = da.stencil.map(ddx, boundary="extend", backend="loops")
    assert len(ran) == 1
    xla = da.stencil.map(ddx, boundary="extend", backend="xla")
    np.testing.assert_allclose(np.asarray(loops), np.asarray(xla), rtol=2.5e-7, atol=0)
    x, a = da.x.values, da.values.astype(np.float64)
    xp, ap = np.pad(x, 1, mode="edge"), np.pad(a, ((0, 0), (1, 1)), mode="edge")
    xp[0], xp[-1] = 2 * x[0] - x[1], 2 * x[-1] - x[-2]  # extend: the spacing continues
    want = (ap[:, 2:] - ap[:, :-2]) / (xp[2:] - xp[:-2])
    np.testing.assert_allclose(np.asarray(xla), want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("mode", ["extend", "periodic", "reflect", "fill"])
def test_coordinate_values_and_differences_on_the_loops(ran: list[int], mode: str) -> None:
    """Every way a kernel uses a coordinate: a difference of reads (exact
    pair arithmetic), a value (``hi + lo`` in float32), a comparison, with
    datetimes along y.  The loops round each operation as written, as numpy
    does; XLA may regroup the pair sums, so the two agree to an ulp or two."""
    da = _da().assign_coords(y=np.datetime64("2020-01-01") + np.arange(9) * np.timedelta64(6, "h"))
    opts: dict[str, Any] = {"boundary": mode}
    if mode == "periodic":
        opts["period"] = {"x": float(da.x[-1] - da.x[0]) * 1.1}

    def k(u: Any) -> Any:
        x, t = u.coord("x"), u.coord("y")
        dt = t(y=1) - t(y=-1)
        return ((u(x=1) - u(x=-1)) / (x(x=1) - x(x=-1)) + u(y=1) / dt
                + jnp.where(x() > 1e4 + 3, x() * 1e-4, -t() * 1e-9))

    got = da.stencil.map(k, backend="loops", **opts)
    assert len(ran) == 1
    want = da.stencil.map(k, backend="xla", **opts)
    assert got.dtype == want.dtype == np.float32
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=4e-7, atol=0)


def test_coordinate_difference_on_the_loops_is_numpys_pair_arithmetic(ran: list[int]) -> None:
    """``(u(x=1) - u(x=-1)) / (x(x=1) - x(x=-1))`` on the loops is, bitwise,
    numpy's float32 arithmetic on the packed pairs: ``(hi - hi) + (lo - lo)``."""
    da = _da()

    def ddx(u: Any) -> Any:
        c = u.coord("x")
        return (u(x=1) - u(x=-1)) / (c(x=1) - c(x=-1))

    got = np.asarray(da.stencil.map(ddx, boundary="extend", backend="loops"))
    assert len(ran) == 1
    x = da.x.values
    c = pack_coord(np.concatenate([[2 * x[0] - x[1]], x, [2 * x[-1] - x[-2]]]), np.float32)
    dx = (c.real[2:] - c.real[:-2]) + (c.imag[2:] - c.imag[:-2])
    up = np.pad(da.values, ((0, 0), (1, 1)), mode="edge")
    np.testing.assert_array_equal(got, (up[:, 2:] - up[:, :-2]) / dx)

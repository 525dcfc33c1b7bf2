"""Dense windows of constant weights on the loop backend (``loops.py``,
``hostfft.py``): a box mean or any rank-1 2-D weights written in the kernel
run as the host's separable passes, other large constant windows as the host
FFT or XLA's separable passes, never as a nest that reads every window cell
at every point (a 15 x 15 box mean at 1024² float32 took 3.8 s to compile
and 29 ms a call that way).  Checked against the float64 direct sum.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import xarray as xr

import xstencil  # noqa: F401 - registers the accessor
from tests.backends.test_hostfft import _direct
from tests.reference import extend

pytest.importorskip("numba")


@pytest.mark.parametrize("mode", ["reflect", "periodic", "fill", "extend", "symmetric"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.uint8])
def test_a_box_mean_runs_as_the_host_passes(calls: dict[str, list[Any]], nests: list[int],
                                            mode: str, dtype: Any) -> None:
    rng = np.random.default_rng(20)
    a = (rng.random((60, 75)) * 200).astype(dtype)
    da = xr.DataArray(a, dims=("y", "x"), name="a")
    got = da.stencil.map(lambda u: u.mean(), window={"y": 15, "x": 11}, boundary=mode,
                         fill_value=3, backend="loops")
    assert calls == {"host": [True], "passes": [True]} and nests == []
    want = _direct(a, np.full((15, 11), 1 / 165), mode, 3.0)
    assert got.dtype == (np.float64 if dtype == np.float64 else np.float32)
    assert got.name == "a"
    tol = 1e-12 if dtype == np.float64 else 2e-5
    np.testing.assert_allclose(got.values, want, rtol=0, atol=tol * 200)


def test_rank_one_weights_written_in_the_kernel_with_strides(
        calls: dict[str, list[Any]], nests: list[int]) -> None:
    """A binomial blur spelled out cell by cell (constant weights, rank 1),
    strided: the host passes, the direct sum's values."""
    g = tuple(c / 1024 for c in (1.0, 10, 45, 120, 210, 252, 210, 120, 45, 10, 1))

    def blur(u: Any) -> Any:  # numbers, not an array: constants of the kernel
        return sum(g[i] * g[j] * u(y=i - 5, x=j - 5) for i in range(11) for j in range(11))

    rng = np.random.default_rng(21)
    a = rng.standard_normal((50, 64)).astype(np.float32)
    da = xr.DataArray(a, dims=("y", "x"))
    got = da.stencil.map(blur, window={"y": 11, "x": 11}, boundary="reflect",
                         stride={"y": 2, "x": 3}, backend="loops")
    assert calls["passes"] == [True] and nests == []
    want = _direct(a, np.outer(g, g), "reflect", stride=(2, 3))
    np.testing.assert_allclose(got.values, want, rtol=0, atol=1e-5)


def test_small_separable_windows_stay_loop_nests(calls: dict[str, list[Any]],
                                                 nests: list[int]) -> None:
    """Up to ``dense.FFT_TAPS`` cells a nest reads the window faster than
    passes run: a 3 x 3 and a 9 x 9 box mean stay nests."""
    a = np.random.default_rng(23).standard_normal((40, 50)).astype(np.float32)
    da = xr.DataArray(a, dims=("y", "x"))
    for k in (3, 9):
        got = da.stencil.map(lambda u: u.mean(), window={"y": k, "x": k},
                             boundary="periodic", backend="loops")
        np.testing.assert_allclose(got.values, _direct(a, np.full((k, k), 1 / k**2),
                                                       "periodic"), rtol=0, atol=1e-5)
    assert nests == [1, 1] and calls["host"] == []


def test_a_three_dimensional_box_and_a_large_constant_disk(
        calls: dict[str, list[Any]], nests: list[int]) -> None:
    """A 7 x 7 x 7 box mean (rank 1, but in 3-D the host has no passes) runs
    as XLA's separable passes; a disk of 1s over 21 x 21 cells (constant, not
    rank 1) as the host FFT; neither as a nest."""
    rng = np.random.default_rng(22)
    cube = rng.standard_normal((20, 24, 28)).astype(np.float32)
    got = xr.DataArray(cube, dims=("z", "y", "x")).stencil.map(
        lambda u: u.mean(), window={"z": 7, "y": 7, "x": 7}, boundary="periodic",
        backend="loops")
    assert nests == [] and calls["host"] == []
    p = extend(cube.astype(np.float64), [(3, 3)] * 3, ["periodic"] * 3, 0.0)
    want = np.zeros(cube.shape)
    for c in np.ndindex(7, 7, 7):
        want += p[c[0]:c[0] + 20, c[1]:c[1] + 24, c[2]:c[2] + 28] / 343
    np.testing.assert_allclose(got.values, want, rtol=0, atol=1e-5)

    yy, xx = np.mgrid[-10:11, -10:11]
    disk = (yy**2 + xx**2 <= 100).astype(np.float64)
    cells = [(int(i) - 10, int(j) - 10) for i, j in np.argwhere(disk)]

    def inside(u: Any) -> Any:
        return sum(u(y=i, x=j) for i, j in cells)

    a = rng.standard_normal((64, 70)).astype(np.float32)
    got = xr.DataArray(a, dims=("y", "x")).stencil.map(
        inside, window={"y": 21, "x": 21}, boundary="extend", backend="loops")
    assert nests == [] and calls["host"] == [True] and calls["passes"] == []
    np.testing.assert_allclose(got.values, _direct(a, disk, "extend"), rtol=0, atol=2e-4)

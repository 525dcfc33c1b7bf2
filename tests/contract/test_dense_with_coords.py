"""A weighted sum over a DataArray with coordinates takes the dense lowering.

Every labelled kernel is handed its coordinates too; the dense lowering used
to give up on seeing them (packed coordinates are complex), so a 21x21 window
on data with dim coordinates raised the 1 GiB gather error that the same data
without coordinates did not, and 9x9 ran the slow general path."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.ndimage as ndi
import xarray as xr

import xstencil  # noqa: F401


@pytest.mark.parametrize("k, mode, scipy_mode", [(21, "periodic", "wrap"),
                                                 (9, "nearest", "nearest")])
def test_large_window_on_data_with_coords(k, mode, scipy_mode):
    rng = np.random.default_rng(1)
    n = 1030 if k == 21 else 200
    a = rng.random((n, n)).astype(np.float32)
    w = rng.random((k, k)).astype(np.float32)
    da = xr.DataArray(a, dims=("y", "x"), name="T", attrs={"units": "K"},
                      coords={"y": np.arange(n) * 0.5, "x": np.arange(n) * 2.0})
    out = da.stencil.map(lambda u: (u * w).sum(), window={"y": k, "x": k}, boundary=mode)
    ref = ndi.correlate(a.astype(np.float64), w.astype(np.float64), mode=scipy_mode)
    np.testing.assert_allclose(out.values, ref, rtol=2e-5 * k)
    assert out.dtype == np.float32
    xr.testing.assert_identical(out.coords.to_dataset(), da.coords.to_dataset())
    assert out.name == "T" and out.attrs == {"units": "K"}


def test_a_kernel_reading_a_coordinate_is_not_taken_for_a_constant_sum():
    # the weights depend on x: not a constant-weight sum (general path), still right
    n, k = 64, 5
    a = np.random.default_rng(2).random((n, n))
    x = np.arange(n) * 1.0
    da = xr.DataArray(a, dims=("y", "x"), coords={"x": x})
    out = da.stencil.map(lambda u: (u * u.coord("x")).sum(), window={"y": k, "x": k},
                         boundary="nearest")
    xp = np.concatenate([x[0] - np.arange(2, 0, -1), x, x[-1] + np.arange(1, 3)])
    ap = np.pad(a, 2, mode="edge")
    ref = np.zeros_like(a)
    for i in range(k):
        for j in range(k):
            ref += ap[i:i + n, j:j + n] * xp[j:j + n][None, :]
    np.testing.assert_allclose(out.values, ref, rtol=1e-12)

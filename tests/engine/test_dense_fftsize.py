"""The FFT sizes of the dense lowering (xstencil._engine.dense): a padded block is
transformed at the smallest 2^a 3^b 5^c size per axis, and the result is the
direct sum's wherever that size lands.  A whole periodic field is transformed at
its own size, whatever its factors.

References: a brute-force search for the size, ``scipy.ndimage.correlate``."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.ndimage as ndi
import xarray as xr

import xstencil  # noqa: F401  (registers the accessor)
from xstencil._engine import dense


def _smooth(m: int) -> bool:
    for p in (2, 3, 5):
        while m % p == 0:
            m //= p
    return m == 1


def test_fast_size_is_the_smallest_5_smooth_size_at_least_n() -> None:
    for n in range(1, 2200):
        want = next(m for m in range(n, 2 * n + 2) if _smooth(m))
        assert dense.fast_size(n) == want, n


# padded lengths n + k - 1 on a fast size (64 = 2^6, 75 = 3 * 5^2) and one past it
# (65 -> 72, 76 -> 80), different per axis
@pytest.mark.parametrize(("shape", "k"), [((50, 61), 15), ((51, 62), 15), ((45, 46), 31),
                                          ((13, 14), 63)])
def test_fill_mode_matches_scipy_at_and_past_a_fast_size(x64: None, shape: tuple[int, int],
                                                          k: int) -> None:
    rng = np.random.default_rng(k + shape[0])
    a = rng.standard_normal(shape)
    w = rng.standard_normal((k, k))
    assert dense.choose(w) == "fft"
    out = xr.DataArray(a, dims=("y", "x")).stencil.map(
        lambda u: (u * w).sum(), window={"y": k, "x": k}, boundary="fill",
        fill_value=0.0).values
    ref = ndi.correlate(a, w, mode="constant", cval=0.0)
    np.testing.assert_allclose(out, ref, rtol=1e-10, atol=1e-10 * np.abs(w).sum())


@pytest.mark.parametrize("shape", [(97, 101), (64, 75), (30, 1)])
def test_periodic_field_of_any_size_float32(shape: tuple[int, int]) -> None:
    """Prime, smooth and degenerate field sizes: the periodic FFT runs at the
    field's own size (no padding), float32 kept, to float32 FFT rounding."""
    rng = np.random.default_rng(shape[0])
    a = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal((15, 15)).astype(np.float32)
    out = xr.DataArray(a, dims=("y", "x")).stencil.map(
        lambda u: (u * w).sum(), window={"y": 15, "x": 15}, boundary="periodic").values
    ref = ndi.correlate(a.astype(np.float64), w.astype(np.float64), mode="wrap")
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, ref, rtol=0, atol=2e-5 * np.abs(w).sum() * np.abs(a).max())

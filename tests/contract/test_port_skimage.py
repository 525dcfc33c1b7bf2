"""scikit-image filters ported to xstencil as a new user would write them, and
checked against scikit-image itself (issue 11: port public codes, keep them as
tests).

- ``skimage.filters.sobel``: the edge magnitude of a uint8 image, computed in
  the kernel in float32 (the kernel's dtype is the result's, so nothing is
  clipped to 255); scikit-image's ``mode="reflect"`` is scipy's, which is
  xstencil's ``"symmetric"`` (and its alias ``"grid-mirror"``).
- ``skimage.filters.gaussian``: a 17×17 window of Gaussian weights as
  ``(u * w).sum()`` with ``boundary="nearest"`` (scipy's name for ``extend``).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr

import xstencil  # noqa: F401

skimage_filters = pytest.importorskip("skimage.filters")


def _image() -> xr.DataArray:
    rng = np.random.default_rng(3)
    img = rng.integers(0, 60, size=(48, 64)).astype(np.uint8)
    img[10:30, 20:40] = 250  # a bright block: strong edges
    img[35:, :8] = 180
    return xr.DataArray(img, dims=("row", "col"), coords={"row": np.arange(48),
                                                          "col": np.arange(64)},
                        name="camera", attrs={"units": "counts"})


def sobel(u):
    """The Sobel edge magnitude, as scikit-image defines it."""
    f = lambda **o: u(**o).astype(jnp.float32) / 255  # noqa: E731 - img_as_float

    def smooth(axis, **o):
        return (f(**{axis: -1}, **o) + 2 * f(**o) + f(**{axis: 1}, **o)) / 4

    g_row = smooth("col", row=1) - smooth("col", row=-1)
    g_col = smooth("row", col=1) - smooth("row", col=-1)
    return jnp.sqrt((g_row**2 + g_col**2) / 2)


@pytest.mark.parametrize("boundary", ["symmetric", "grid-mirror"])
def test_sobel_matches_skimage(boundary: str) -> None:
    img = _image()
    out = img.stencil.map(sobel, boundary=boundary)
    ref = skimage_filters.sobel(img.values)
    assert out.dtype == np.float32  # the kernel's dtype: not clipped back to uint8
    assert out.dims == img.dims and out.name == "camera" and out.attrs == img.attrs
    np.testing.assert_allclose(out.values, ref, rtol=1e-5, atol=1e-6)
    assert float(out.max()) > 0.5  # the block's edges are there, not clipped


def test_sobel_reflect_is_not_scipys_reflect() -> None:
    """xstencil's "reflect" is numpy's (edge not repeated): it differs from
    scikit-image's default at the border, and only there."""
    img = _image()
    out = img.stencil.map(sobel, boundary="reflect").values
    ref = skimage_filters.sobel(img.values)
    np.testing.assert_allclose(out[1:-1, 1:-1], ref[1:-1, 1:-1], rtol=1e-5, atol=1e-6)
    assert not np.allclose(out, ref, rtol=1e-5, atol=1e-6)


def test_gaussian_matches_skimage() -> None:
    img = _image().astype(np.float32) / 255
    sigma, truncate = 2.0, 4.0
    radius = int(truncate * sigma + 0.5)
    x = np.arange(-radius, radius + 1)
    g = np.exp(-0.5 * x**2 / sigma**2)
    g /= g.sum()
    w = np.outer(g, g).astype(np.float32)
    out = img.stencil.map(lambda u: (u * w).sum(), window={"row": w.shape[0], "col": w.shape[1]},
                          boundary="nearest")
    ref = skimage_filters.gaussian(img.values, sigma=sigma, mode="nearest", truncate=truncate,
                                   preserve_range=True)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out.values, ref, rtol=1e-4, atol=1e-5)

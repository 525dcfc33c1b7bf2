"""scikit-image's rank filters over a disk, ported to xstencil as a new user
would write them, and checked against scikit-image itself: focal statistics
of a ``uint8`` image over ``skimage.morphology.disk(r)``, the footprint's
cells outside the image not counted.

- ``rank.pop`` (how many footprint cells lie inside the image): a count over
  the disk on a mask of ones, zero outside;
- ``rank.sum``: the integer sum over the disk in ``uint8`` arithmetic
  (scikit-image's result wraps modulo 256, and so does the kernel's);
- ``rank.mean``: ``sum // pop``, both exact integer sums (scikit-image
  floors the mean).

Fields of 600² take the loop backend, whose exact integer FFTs run these
sums (``hostfft.py``); ``backend="xla"`` runs one fused integer sum of
slices (``affine.integer_affine``).
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr

import xstencil  # noqa: F401

rank = pytest.importorskip("skimage.filters.rank")
morphology = pytest.importorskip("skimage.morphology")
pytest.importorskip("numba")


def _image(n: int) -> xr.DataArray:
    rng = np.random.default_rng(8)
    img = rng.integers(0, 256, size=(n, n + 13)).astype(np.uint8)
    img[n // 4:n // 2, n // 3:n // 2] = 250
    return xr.DataArray(img, dims=("row", "col"), name="camera")


def _sum(img: xr.DataArray, footprint: np.ndarray, dtype: Any, backend: str | None
         ) -> xr.DataArray:
    k = footprint.shape[0]
    w = footprint.astype(dtype)

    def kernel(u: Any) -> Any:
        return (u.astype(dtype) * w).sum(dtype=dtype)

    return img.stencil.map(kernel, window={"row": k, "col": k}, boundary="fill",
                           fill_value=0, backend=backend)


@pytest.mark.parametrize("backend", [None, "xla"])
@pytest.mark.parametrize("r", [5, 9])
def test_rank_pop_sum_and_mean_match_skimage(r: int, backend: str | None) -> None:
    img = _image(600 if backend is None else 150)
    fp = morphology.disk(r)
    ones = xr.ones_like(img)
    pop = _sum(ones, fp, jnp.int32, backend)
    total = _sum(img, fp, jnp.int32, backend)
    wrapped = _sum(img, fp, jnp.uint8, backend)
    np.testing.assert_array_equal(pop.values, rank.pop(img.values, fp))
    np.testing.assert_array_equal(wrapped.values, rank.sum(img.values, fp))
    mean = (total // pop).astype(np.uint8)
    np.testing.assert_array_equal(mean.values, rank.mean(img.values, fp))
    assert mean.dims == img.dims and mean.name == "camera"

"""A port of scikit-image's total-variation denoising (Chambolle's projection
algorithm, ``skimage.restoration.denoise_tv_chambolle``) to xstencil, as a
user would write it, checked against scikit-image itself.

Each iteration of the original, for ``p`` (one component per axis):

* ``d = -div p``: ``d = -sum_a p_a`` plus ``p_a`` shifted one cell along
  axis ``a`` (nothing enters at the first cell);
* ``out = image + d`` and ``g_a`` its forward difference along ``a`` (0 at
  the last cell);
* ``p = (p - tau g) / (1 + tau / weight |g|)`` with ``tau = 1 / (2 ndim)``.

It returns ``out`` of its last iteration, computed from ``p`` after
``n - 1`` updates.  Here ``-div p`` is a map with ``boundary="fill"`` (0
before the first cell), the forward difference a map with
``boundary="extend"`` (a zero difference at the last cell), and the
iterations a ``scan(step=...)``, so the whole loop is one compiled program
that ``jax.grad`` differentiates: the test fits nothing, but checks the
gradient with respect to ``weight`` against finite differences.

``eps=0`` makes scikit-image run all ``max_num_iter`` iterations (its
energy test ``|E_prev - E| < eps * E_0`` never passes), which is what the
scan does.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr

import xstencil  # noqa: F401 - registers the .stencil accessor

skimage_restoration = pytest.importorskip("skimage.restoration")


def _names(dims: tuple[str, ...]) -> list[str]:
    return [f"p_{d}" for d in dims]


def negative_divergence(p: xr.Dataset, dims: tuple[str, ...]) -> xr.DataArray:
    """``d = -div p``: the backward difference of each component, with
    nothing entering before the first cell."""
    def kernel(s):
        return sum(s[f"p_{d}"](**{d: -1}) - s[f"p_{d}"]() for d in dims)
    return p.stencil.map(kernel, boundary="fill", fill_value=0.0)


def forward_differences(out: xr.DataArray, dims: tuple[str, ...]) -> xr.Dataset:
    """``g_a``: the forward difference along each dim, 0 at the last cell."""
    def kernel(s):
        return {f"p_{d}": s["u"](**{d: 1}) - s["u"]() for d in dims}
    return out.to_dataset(name="u").stencil.map(
        kernel, boundary="extend", new_vars=tuple(_names(dims)))[_names(dims)]


def tv_step(p: xr.Dataset, image: xr.DataArray, weight) -> xr.Dataset:
    dims = tuple(image.dims)
    g = forward_differences(image + negative_divergence(p, dims), dims)
    tau = 1.0 / (2 * len(dims))
    sq = sum(g[n] ** 2 for n in _names(dims))
    # |g| with a gradient at |g| = 0 (sqrt's derivative is infinite there)
    norm = (sq.where(sq > 0, 1.0) ** 0.5).where(sq > 0, 0.0)
    return (p - tau * g) / (1 + tau / weight * norm)


def denoise(image: xr.DataArray, weight, n: int) -> xr.DataArray:
    """``denoise_tv_chambolle(image, weight, eps=0, max_num_iter=n)``."""
    dims = tuple(image.dims)
    p0 = xr.Dataset({name: xr.zeros_like(image) for name in _names(dims)})
    p = p0.stencil.scan(None, "iteration", step=lambda p: tv_step(p, image, weight),
                        steps=n - 1, save_every="last")
    return image + negative_divergence(p.drop_vars("iteration"), dims)


def _noisy(shape: tuple[int, ...], dtype=np.float64) -> np.ndarray:
    rng = np.random.default_rng(0)
    grids = np.meshgrid(*[np.arange(n) for n in shape], indexing="ij")
    r2 = sum((g - n / 2) ** 2 for g, n in zip(grids, shape, strict=True))
    clean = (r2 < (min(shape) / 3) ** 2).astype(np.float64)
    return (clean + 0.3 * rng.standard_normal(shape)).astype(dtype)


def _labelled(a: np.ndarray, dims: tuple[str, ...]) -> xr.DataArray:
    return xr.DataArray(a, dims=dims, coords={d: np.arange(n) * 0.5
                                              for d, n in zip(dims, a.shape, strict=True)},
                        name="image", attrs={"units": "counts"})


def test_tv_2d_float64_matches_skimage() -> None:
    a = _noisy((24, 30))
    got = denoise(_labelled(a, ("y", "x")), 0.1, 50)
    want = skimage_restoration.denoise_tv_chambolle(a, weight=0.1, eps=0.0, max_num_iter=50)
    assert got.dtype == np.float64 and got.dims == ("y", "x")
    np.testing.assert_allclose(got.values, want, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(got.x.values, np.arange(30) * 0.5)


def test_tv_2d_float32_matches_skimage() -> None:
    a = _noisy((24, 30), np.float32)
    got = denoise(_labelled(a, ("y", "x")), 0.2, 30)
    want = skimage_restoration.denoise_tv_chambolle(a, weight=0.2, eps=0.0, max_num_iter=30)
    assert got.dtype == want.dtype == np.float32
    np.testing.assert_allclose(got.values, want, rtol=0, atol=2e-6)


def test_tv_3d_matches_skimage() -> None:
    a = _noisy((10, 12, 14))
    got = denoise(_labelled(a, ("z", "y", "x")), 0.15, 20)
    want = skimage_restoration.denoise_tv_chambolle(a, weight=0.15, eps=0.0, max_num_iter=20)
    np.testing.assert_allclose(got.values, want, rtol=0, atol=1e-12)


def test_tv_gradient_with_respect_to_weight(x64) -> None:
    a = _noisy((16, 18))
    image = _labelled(a, ("y", "x"))
    clean = (a > 0.5).astype(np.float64)

    def loss(weight):
        return ((denoise(image, weight, 15) - clean) ** 2).sum().data

    w = jnp.float64(0.2)
    g = jax.grad(loss)(w)
    h = 1e-6
    fd = (loss(w + h) - loss(w - h)) / (2 * h)
    assert np.isfinite(float(g))
    assert float(g) == pytest.approx(float(fd), rel=1e-6)
    assert float(jax.jit(loss)(w)) == pytest.approx(float(loss(w)), rel=1e-12)


def test_tv_called_again_compiles_nothing() -> None:
    """``denoise`` builds its step function on every call, closing over the
    image DataArray: equal content must reuse the compiled loop (it compiled
    again, about a second a call, while DataArrays were keyed by identity)."""
    from tests.compiles import compiles  # here: benchmarks/denoise.py loads this file

    a = _noisy((16, 18))
    denoise(_labelled(a, ("y", "x")), 0.1, 10)
    with compiles() as got:
        again = denoise(_labelled(a.copy(), ("y", "x")), 0.1, 10)
    assert got["compiles"] == 0
    want = skimage_restoration.denoise_tv_chambolle(a, weight=0.1, eps=0.0, max_num_iter=10)
    np.testing.assert_allclose(again.values, want, rtol=0, atol=1e-12)

"""A differentiated mesh keeps each rectangular region's kernel to its own
cells: a kernel singular on finite data where it is not used (``1 / h`` over
land, where ``h == 0``) must not turn the gradient into NaN."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import xarray as xr

import xstencil


def _loss(h: jax.Array, x: np.ndarray) -> jax.Array:
    da = xr.DataArray(h, dims=("x",), coords={"x": x})
    m = da.stencil.mesh(boundary="nearest")
    m[{"x": slice(0, 6)}] = lambda u: 1.0 / u()  # ocean: depth > 0
    m[{"x": slice(6, None)}] = lambda u: u() * 0.0  # land: depth 0
    return jnp.sum(m.map().data)


def test_gradient_finite_where_a_kernel_is_singular_outside_its_region():
    x = np.arange(10.0)
    h = np.where(x < 6, 1.0 + x, 0.0).astype(np.float32)
    g = np.asarray(jax.grad(_loss)(jnp.asarray(h), x))
    ref = np.where(x < 6, -1.0 / (1.0 + x) ** 2, 0.0)
    assert np.isfinite(g).all(), g
    np.testing.assert_allclose(g, ref, rtol=1e-6)


def test_untraced_call_gives_the_same_values():
    x = np.arange(10.0)
    h = np.where(x < 6, 1.0 + x, 0.0).astype(np.float32)
    da = xr.DataArray(h, dims=("x",), coords={"x": x})
    m = xstencil.mesh(da, boundary="nearest")
    m[{"x": slice(0, 6)}] = lambda u: 1.0 / u()
    m[{"x": slice(6, None)}] = lambda u: u() * 0.0
    np.testing.assert_allclose(m.map().values, np.where(x < 6, 1.0 / (1.0 + x), 0.0), rtol=1e-6)

"""Guarded mesh kernels (the NaN-safe derivative of a region's kernel) trace
the kernel once and need no closure conversion unless the kernel closes over
a traced value; gradients stay exact either way."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr

import xstencil


def _da() -> xr.DataArray:
    return xr.DataArray(np.linspace(0.5, 2.0, 24, dtype=np.float32).reshape(4, 6), dims=("y", "x"))


def _mesh(da: xr.DataArray, nu) -> xstencil.Mesh:
    m = da.stencil.mesh(boundary="extend")
    m[...] = lambda u: u(x=1) - u(x=-1)
    m[da > 1.2] = lambda u: u() * nu  # a mask region: evaluated under a guard
    return m


def _ref(a: np.ndarray, nu: float) -> np.ndarray:
    ap = np.concatenate([a[:, :1], a, a[:, -1:]], axis=1)
    out = ap[:, 2:] - ap[:, :-2]
    return np.where(a > 1.2, a * nu, out)


@pytest.fixture
def conversions(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    count: list[int] = []
    real = jax.closure_convert

    def counting(*a, **k):
        count.append(1)
        return real(*a, **k)

    monkeypatch.setattr(jax, "closure_convert", counting)
    return count


def test_no_closure_conversion_without_traced_closures(conversions: list[int]) -> None:
    da = _da()
    xstencil.clear_caches()
    out = _mesh(da, 3.0).map()
    np.testing.assert_allclose(out.values, _ref(da.values, 3.0), rtol=1e-6)
    assert conversions == []


def test_gradient_through_a_closed_over_traced_value(conversions: list[int]) -> None:
    da = _da()
    xstencil.clear_caches()

    def loss(nu):
        return jnp.sum(_mesh(da, nu).map().data ** 2)

    nu = 1.5
    g = jax.grad(loss)(nu)
    a = da.values
    want = np.sum(2 * (a * nu) * a * (a > 1.2))  # d/dnu of sum((a*nu)^2) over the mask
    np.testing.assert_allclose(float(g), want, rtol=1e-5)
    assert 0 < len(conversions) <= 2  # a traced closure: hoisted (values and derivative)


def test_gradient_ignores_nan_outside_the_region() -> None:
    a = _da().values.copy()
    a[0, 0] = np.nan  # outside the mask, read by no kept value's derivative
    da = xr.DataArray(a, dims=("y", "x"))
    mask = xr.DataArray(np.arange(24).reshape(4, 6) >= 12, dims=("y", "x"))

    def loss(data):
        m = da.copy(data=data).stencil.mesh(boundary="extend")
        m[mask] = lambda u: u() ** 2
        return jnp.sum(m.map().data[2:])

    g = np.asarray(jax.grad(loss)(jnp.asarray(a)))
    want = np.zeros_like(a)
    want[2:] = 2 * a[2:]
    np.testing.assert_allclose(g, want, rtol=1e-6)

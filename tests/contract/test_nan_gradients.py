"""Gradients through NaN land (issue 12): with NaN only on land cells and a
sea kernel ``u() * nu``, a finite loss has a finite ``d/dnu`` whatever the
region type.  A branch must not pass NaN into the gradient from cells whose
result is discarded (the ``where`` pitfall)."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr

from xstencil._labelled.mesh import Mesh

NY, NX = 5, 7
LAND = np.zeros((NY, NX), bool)
LAND[:, 5:] = True
LAND[0, 0] = True  # a land cell that is not in the land slab


def _data() -> xr.DataArray:
    data = (np.random.default_rng(1).random((NY, NX)) + 0.5).astype(np.float32)
    data[LAND] = np.nan
    return xr.DataArray(data, dims=("y", "x"),
                        coords={"y": np.arange(NY) * 1.0, "x": np.arange(NX) * 1.0})


def _assign(how: str, T: xr.DataArray) -> Mesh:
    sea = xr.DataArray(~LAND, dims=("y", "x"), coords=T.coords)
    m = T.stencil.mesh(boundary="extend")
    if how == "mask":  # the sea by a mask; land uncovered (keeps NaN)
        m[sea] = lambda u, nu: u() * nu
    elif how == "mask_over_all":  # everywhere land, then the sea mask on top
        m[...] = lambda u, nu: u() * 0.0
        m[sea] = lambda u, nu: u() * nu
    elif how == "slab":  # the sea kernel everywhere, the land slab on top
        m[...] = lambda u, nu: u() * nu
        m[{"x": slice(5, None)}] = lambda u, nu: u() * 0.0
        m[{"y": 0, "x": 0}] = lambda u, nu: u() * 0.0
    elif how == "slab_pieces":  # sea slabs; land partly in an overwritten slab
        m[{"x": slice(0, 6)}] = lambda u, nu: u() * nu
        m[{"x": slice(5, 7)}] = lambda u, nu: jnp.zeros_like(u())
        m[{"y": 0, "x": 0}] = lambda u, nu: jnp.zeros_like(u())
    return m


CASES = ["mask", "mask_over_all", "slab", "slab_pieces"]


def _loss(how: str, T: xr.DataArray) -> Callable[[jax.Array], jax.Array]:
    keep = jnp.asarray(~LAND)

    def loss(nu: jax.Array) -> jax.Array:
        out = _assign(how, T).map(nu)
        return jnp.sum(jnp.where(keep, out.data, 0.0) ** 2)  # land masked out of the loss

    return loss


@pytest.mark.parametrize("how", CASES)
def test_the_gradient_through_nan_land_is_finite_and_right(how: str) -> None:
    T = _data()
    nu = jnp.float32(1.5)
    loss = _loss(how, T)
    sea = np.where(LAND, 0.0, T.values)
    # numpy reference: loss = nu^2 * sum(sea^2), d/dnu = 2 nu sum(sea^2)
    np.testing.assert_allclose(loss(nu), 1.5 ** 2 * np.sum(sea ** 2), rtol=1e-5)
    g = jax.grad(loss)(nu)
    assert np.isfinite(g)
    np.testing.assert_allclose(g, 2 * 1.5 * np.sum(sea ** 2), rtol=1e-5)
    eps = 1e-2  # a central difference is exact for a quadratic, up to rounding
    fd = (loss(nu + eps) - loss(nu - eps)) / (2 * eps)
    np.testing.assert_allclose(g, fd, rtol=1e-3)


@pytest.mark.parametrize("how", CASES)
def test_nan_is_still_nan_where_the_kernel_keeps_it(how: str) -> None:
    T = _data()
    out = _assign(how, T).map(jnp.float32(2.0))
    sea = ~LAND
    np.testing.assert_allclose(out.values[sea], 2.0 * T.values[sea], rtol=1e-6)
    if how == "mask":  # uncovered land keeps its input, NaN
        assert np.isnan(out.values[LAND]).all()


def test_a_kept_cell_that_reads_land_is_still_nan() -> None:
    """The guard hides only discarded cells: a sea cell reading NaN land stays NaN."""
    T = _data()
    sea = xr.DataArray(~LAND, dims=("y", "x"), coords=T.coords)
    m = T.stencil.mesh(boundary="extend")
    m[sea] = lambda u, nu: u(x=1) * nu
    out = m.map(jnp.float32(2.0)).values
    right = np.concatenate([T.values[:, 1:], T.values[:, -1:]], axis=1)
    np.testing.assert_array_equal(np.isnan(out[~LAND]), np.isnan(right[~LAND]))
    assert np.isnan(right[~LAND]).any()
    np.testing.assert_allclose(out[~LAND], 2.0 * right[~LAND], rtol=1e-6)


@pytest.mark.parametrize("how", ["mask", "slab"])
def test_a_kernel_closing_over_the_parameter(how: str) -> None:
    """``lambda u: u() * nu`` with ``nu`` captured, not passed: the usual way
    to write a loss; the derivative rule must handle the captured value."""
    T = _data()
    sea = xr.DataArray(~LAND, dims=("y", "x"), coords=T.coords)
    keep = jnp.asarray(~LAND)

    def loss(nu: jax.Array) -> jax.Array:
        m = T.stencil.mesh(boundary="extend")
        if how == "mask":
            m[sea] = lambda u: u() * nu
        else:
            m[...] = lambda u: u() * nu
            m[{"x": slice(5, None)}] = lambda u: u() * 0.0
            m[{"y": 0, "x": 0}] = lambda u: u() * 0.0
        return jnp.sum(jnp.where(keep, m.map().data, 0.0))

    g = jax.grad(loss)(jnp.float32(3.0))
    np.testing.assert_allclose(g, np.sum(np.where(LAND, 0.0, T.values)), rtol=1e-5)
    second = jax.grad(jax.grad(lambda nu: loss(nu) ** 2))(jnp.float32(3.0))
    np.testing.assert_allclose(second, 2 * np.sum(np.where(LAND, 0.0, T.values)) ** 2,
                               rtol=1e-4)


# -- session 27: NaN land through a mesh *scan* ----------------------------------------
# An ocean modeller's diffusion with NaN land: m.map() and scan(step=) kept the
# gradient finite, but m.scan() gave NaN (its slabs evaluated regions unguarded).

def _mesh_scan_loss(nu, T0, land, steps, **kw):
    da = xr.DataArray(T0, dims="x")

    def safe(c, v):
        return jnp.where(jnp.isnan(v), c, v)

    m = da.stencil.mesh(boundary="extend")
    m[...] = lambda u, nu: u(time=-1) + nu * (safe(u(time=-1), u(time=-1, x=1)) - 2 * u(time=-1)
                                              + safe(u(time=-1), u(time=-1, x=-1)))
    m[land] = lambda u, nu: u(time=-1)
    return jnp.nansum(m.scan("time", nu, steps=steps, save_every="last", **kw).data ** 2)


@pytest.mark.parametrize("kw", [{}, {"checkpoint": True}])
@pytest.mark.parametrize("steps", [1, 3])
def test_mesh_scan_gradient_through_nan_land_matches_finite_differences(x64, kw, steps):
    T0 = np.array([1.0, 2.0, 3.0, np.nan, np.nan, 2.0, 1.0, 0.5])
    land = xr.DataArray(np.isnan(T0), dims="x")
    g = float(jax.grad(lambda n: _mesh_scan_loss(n, T0, land, steps, **kw))(0.1))
    h = 1e-6
    fd = (float(_mesh_scan_loss(0.1 + h, T0, land, steps))
          - float(_mesh_scan_loss(0.1 - h, T0, land, steps))) / (2 * h)
    assert np.isfinite(g)
    np.testing.assert_allclose(g, fd, rtol=1e-6)

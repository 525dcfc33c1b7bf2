"""Session 26's attack under JAX transforms: vmap's axes and 64-bit data with
JAX's x64 flag off.  Each result is checked against numpy on the same
numbers, or against the same call without the transform.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr

import xstencil
from xstencil import PrecisionWarning, XStencilError


@pytest.fixture(autouse=True)
def _x64_off():
    """These cases are about JAX's default: x64 off."""
    with jax.enable_x64(False):
        yield


# -- vmap: in_axes and out_axes other than 0 --


def _recording(dim: str) -> tuple[list, object]:
    """A function of a DataArray that differences along ``dim`` and records
    the dims it was given."""
    seen: list = []

    def f(d: xr.DataArray) -> xr.DataArray:
        seen.append(d.dims)
        return d.stencil.map(lambda u: u(**{dim: 1}) - u(), boundary="periodic")

    return seen, f


def test_vmap_in_axes_removes_the_mapped_dim() -> None:
    a = np.random.default_rng(0).uniform(size=(4, 5, 6)).astype(np.float32)
    da = xr.DataArray(a, dims=("t", "y", "x"))
    seen, f = _recording("t")
    out = jax.vmap(f, in_axes=1)(da)  # maps over y
    assert seen[-1] == ("t", "x")
    want = np.moveaxis(np.roll(a, -1, 0) - a, 1, 0)
    np.testing.assert_allclose(np.asarray(out), want, rtol=1e-6)
    with pytest.raises(XStencilError, match="dimension 'y' not found"):
        jax.vmap(lambda d: d.stencil.map(lambda u: u(y=1) - u(), boundary="periodic"),
                 in_axes=1)(da)


def test_nested_vmap_removes_both_mapped_dims() -> None:
    a = np.random.default_rng(1).uniform(size=(3, 4, 5)).astype(np.float32)
    da = xr.DataArray(a, dims=("a", "b", "c"))
    seen, f = _recording("a")
    jax.vmap(jax.vmap(f, in_axes=1), in_axes=2)(da)
    assert seen[-1] == ("a",)


def test_vmap_out_axes_names_the_batch_where_it_is() -> None:
    a = np.arange(20, dtype=np.float32).reshape(4, 5)
    da = xr.DataArray(a, dims=("t", "x"))
    f = lambda d: d.stencil.map(lambda u: u(x=1) - u(), boundary="periodic")  # noqa: E731
    out = jax.vmap(f, out_axes=1)(da)
    assert out.dims == ("x", "batch")
    for t in range(4):
        np.testing.assert_array_equal(out.isel(batch=t).values, np.roll(a[t], -1) - a[t])


# -- 64-bit data closed over, x64 off: 32 bits inside the transform, no crash --


def _field() -> xr.DataArray:
    return xr.DataArray(np.random.default_rng(0).uniform(0.5, 1.5, size=(6, 8)),
                        dims=("y", "x"))


def _numpy_map(a: np.ndarray, c: np.ndarray) -> np.ndarray:
    right = np.concatenate([a[:, 1:], a[:, -1:]], axis=1)  # extend
    return c[0] * right + c[1] * a


def test_jacrev_hessian_linearize_on_float64_data() -> None:
    da = _field()
    f = lambda c: da.stencil.map(lambda u: c[0] * u(x=1) + c[1] * u(),  # noqa: E731
                                 boundary="extend").data
    c = jnp.array([0.2, 0.3], jnp.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PrecisionWarning)
        jax.grad(lambda c: f(c).sum())(c)  # records a fast path for 64-bit data
        jr = jax.jacrev(f)(c)
        jf = jax.jacfwd(f)(c)
        h = jax.hessian(lambda c: (f(c) ** 2).sum())(c)
        y, lin = jax.linearize(f, c)
        tangent = lin(jnp.array([1.0, 0.0], jnp.float32))
    a = da.values
    right = np.concatenate([a[:, 1:], a[:, -1:]], axis=1)
    np.testing.assert_allclose(np.asarray(jr[..., 0]), right, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(jr), np.asarray(jf), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(tangent), right, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(y), _numpy_map(a, np.array([0.2, 0.3])), rtol=1e-5)
    want_h = 2 * np.array([[np.sum(right * right), np.sum(right * a)],
                           [np.sum(right * a), np.sum(a * a)]])
    np.testing.assert_allclose(np.asarray(h), want_h, rtol=1e-5)


def test_transform_warns_and_leaves_jax_usable() -> None:
    da = _field()
    a = da.values
    assert jnp.asarray(a).dtype == jnp.float32

    def loss(c):
        return jnp.sum(da.stencil.map(lambda u: c * u(x=1), boundary="extend").data)

    with pytest.warns(PrecisionWarning, match="computed in 32 bits"):
        jax.jit(loss)(jnp.float32(1.0))
    assert jnp.asarray(a).dtype == jnp.float32  # was float64 afterwards: a cache poisoned
    np.testing.assert_allclose(np.asarray(jnp.sin(a)), np.sin(a), rtol=1e-6)
    # outside transforms nothing changes: float64 stays float64
    out = da.stencil.map(lambda u: 2 * u(x=1), boundary="extend")
    assert out.dtype == np.float64


def test_vmap_over_numpy_float64_parameters() -> None:
    da = _field()

    def f(nu):
        return da.stencil.map(lambda u, nu: u() + nu * (u(x=1) - 2 * u() + u(x=-1)), nu,
                              boundary="periodic").data

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PrecisionWarning)
        got = jax.vmap(f)(np.array([0.3, 0.4]))
        primal, tangent = jax.jvp(f, (0.3,), (1.0,))
    a = da.values
    lap = np.roll(a, -1, 1) - 2 * a + np.roll(a, 1, 1)
    np.testing.assert_allclose(np.asarray(got[1]), a + 0.4 * lap, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(tangent), lap, rtol=1e-5, atol=1e-6)


def test_grad_through_complex128_data() -> None:
    ac = (np.random.default_rng(2).normal(size=(4, 5))
          + 1j * np.random.default_rng(3).normal(size=(4, 5)))
    dcx = xr.DataArray(ac, dims=("y", "x"))

    def loss(nu):
        out = dcx.stencil.map(lambda u, nu: u() + nu * u(x=1), nu, boundary="periodic")
        return jnp.sum(out.data.real)

    # a real parameter times complex data: standard promotion, as users run
    with warnings.catch_warnings(), jax.numpy_dtype_promotion("standard"):
        warnings.simplefilter("ignore", PrecisionWarning)
        g = jax.grad(loss)(jnp.float32(0.3))
    np.testing.assert_allclose(float(g), np.roll(ac, -1, 1).real.sum(), rtol=1e-5)


def test_x64_on_keeps_float64_under_transforms() -> None:
    da = _field()
    with jax.enable_x64(True):
        f = lambda c: da.stencil.map(lambda u: c * u(x=1), boundary="extend").data  # noqa: E731
        jr = jax.jacrev(lambda c: f(c).sum())(jnp.float64(0.5))
    assert jr.dtype == jnp.float64
    a = da.values
    assert float(jr) == pytest.approx(np.concatenate([a[:, 1:], a[:, -1:]], axis=1).sum(),
                                      rel=1e-14)


def _mesh_map(da: xr.DataArray, c: object) -> xr.DataArray:
    m = da.stencil.mesh(boundary="extend")
    m[...] = lambda u: c * u(x=1)
    m[{"x": 0}] = lambda u: u()
    return m.map()


_CALLS = {
    "map": lambda da, c: da.stencil.map(lambda u: c * u(x=1), boundary="extend"),
    "mesh": _mesh_map,
    "scan": lambda da, c: da.stencil.scan(lambda u: c * u(t=-1, x=1), dim="t", steps=2,
                                          boundary="extend", save_every="last"),
    "scan_step": lambda da, c: da.stencil.scan(None, "t", step=lambda s: s * c, steps=2,
                                               save_every="last"),
    "iterate": lambda da, c: da.stencil.iterate(
        lambda u: 0.5 * (u(x=1) + u(x=-1)) * c, boundary="extend", tol=None,
        max_steps=3).field,
    "dataset": lambda da, c: da.to_dataset(name="a").stencil.map(
        lambda s: {"a": c * s.a(x=1)}, boundary="extend").a,
}


@pytest.mark.parametrize("name", list(_CALLS))
def test_eager_float64_after_a_transform_of_the_same_array(name: str) -> None:
    """A jit of the call (x64 off: 32 bits) and then the call itself on the
    same numpy array (float64): JAX kept the array's 32-bit conversion from
    inside the trace, and the eager call failed with RuntimeProgramInputMismatch."""
    fn = _CALLS[name]
    da = _field()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PrecisionWarning)
        traced = jax.jit(lambda c: jnp.sum(fn(da, c).data))(jnp.float32(1.0))
    eager = fn(da, 1.0)
    assert eager.dtype == np.float64
    assert float(traced) == pytest.approx(float(eager.sum()), rel=1e-5)


def test_float64_map_inside_our_own_loops_keeps_float64() -> None:
    """xstencil's own scan(step=)/iterate trace is not the caller's transform:
    a map on float64 data inside the step keeps float64 (a first version of
    the change computed it in float32, and 1e8 + k lost its k)."""
    c64 = xr.DataArray(1e8 + np.arange(8.0), dims="x")
    s0 = xr.DataArray(np.zeros(8, np.float32), dims="x")

    def step(s):
        return s + c64.stencil.map(lambda u: u(x=1) - u(), boundary="extend").astype(np.float32)

    want = [3.0] * 7 + [0.0]
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrecisionWarning)
        got = s0.stencil.scan(step=step, dim="time", steps=3)[-1]
        it = xstencil.iterate(s0, step=step, tol=None, max_steps=3)
    np.testing.assert_array_equal(got.values, want)
    np.testing.assert_array_equal(it.field.values, want)

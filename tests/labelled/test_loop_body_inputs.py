"""The arrays a kernel of ``iterate`` or ``solve`` (or a ``scan(step=)``
function) closes over are inputs of
the compiled loop (DESIGN 3b: "arrays closed over by a kernel are dynamic
inputs, not baked-in constants"): a kernel written inline in a loop reuses
the loop compiled for the first (it compiled on every call, 0.2 s at 64²),
an array changed in place is read as it is now, and gradients flow to a
closed-over JAX array."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as spla
import xarray as xr

import xstencil
from tests.compiles import compiles

N = 24


def _smooth_ref(u0: np.ndarray, w: np.ndarray, steps: int) -> np.ndarray:
    u = u0.copy()
    for _ in range(steps):
        p = np.pad(u, 1, mode="edge")
        u = w[0] * p[:-2] + w[1] * p[1:-1] + w[2] * p[2:]
    return u


def _iterate(u0: xr.DataArray, w: np.ndarray) -> xstencil.Converged:
    return xstencil.iterate(u0, lambda u: w[0] * u(x=-1) + w[1] * u() + w[2] * u(x=1),
                            boundary="extend", tol=None, max_steps=7)


def test_inline_iterate_kernels_compile_once_and_read_their_arrays():
    u0 = xr.DataArray(np.random.default_rng(0).random(N), dims="x")
    ws = [np.array([0.25, 0.5, 0.25]), np.array([0.1, 0.6, 0.3]), np.array([0.5, 0.0, 0.5])]
    _iterate(u0, ws[0])  # compiles the loop
    with compiles() as got:
        outs = [_iterate(u0, w) for w in ws]  # a new lambda and a new array each time
    assert got["compiles"] == 0
    for w, out in zip(ws, outs, strict=True):
        assert out.iterations == 7
        np.testing.assert_allclose(out.field.values, _smooth_ref(u0.values, w, 7), rtol=1e-12)


def test_a_closed_over_array_changed_in_place_is_read_now():
    u0 = xr.DataArray(np.random.default_rng(1).random(N), dims="x")
    w = np.array([0.25, 0.5, 0.25])

    def k(u):
        return w[0] * u(x=-1) + w[1] * u() + w[2] * u(x=1)

    a = xstencil.iterate(u0, k, boundary="extend", tol=None, max_steps=5)
    w[:] = [0.5, 0.0, 0.5]
    b = xstencil.iterate(u0, k, boundary="extend", tol=None, max_steps=5)
    np.testing.assert_allclose(a.field.values, _smooth_ref(u0.values, [0.25, 0.5, 0.25], 5),
                               rtol=1e-12)
    np.testing.assert_allclose(b.field.values, _smooth_ref(u0.values, w, 5), rtol=1e-12)


def _matrix(w: np.ndarray) -> sp.csr_matrix:
    """w0 u_i - w1 (u_{i-1} + u_{i+1}) with zero fill."""
    off = np.full(N - 1, -w[1])
    return sp.diags([np.full(N, w[0]), off, off], [0, -1, 1], format="csr")


def _solve(rhs: xr.DataArray, w: np.ndarray | jax.Array) -> xr.DataArray:
    return xstencil.solve(lambda u: w[0] * u() - w[1] * (u(x=-1) + u(x=1)), rhs,
                          method="cg", tol=1e-12, boundary="fill", fill_value=0.0).field


@pytest.mark.parametrize("way", ["inline", "changed"])
def test_solve_with_closed_over_coefficients(x64, way):
    rng = np.random.default_rng(2)
    rhs = xr.DataArray(rng.random(N), dims="x")
    ws = [np.array([2.0 + rng.random(), rng.random()]) for _ in range(3)]
    _solve(rhs, ws[0])
    first = ws[0]
    with compiles() as got:
        for w in ws[1:]:
            if way == "changed":
                first[:] = w
                w = first
            out = _solve(rhs, w)
            np.testing.assert_allclose(out.values, spla.spsolve(_matrix(w), rhs.values),
                                       rtol=1e-9, atol=1e-12)
    assert got["compiles"] == 0


def test_gradient_reaches_a_closed_over_jax_array(x64):
    rng = np.random.default_rng(3)
    rhs = xr.DataArray(rng.random(N), dims="x")
    w0 = jnp.asarray([2.5, 0.7])

    def loss(w):
        return jnp.sum(jnp.asarray(_solve(rhs, w).data) ** 2)

    g = np.asarray(jax.grad(loss)(w0))
    for k in range(2):
        e = np.zeros(2)
        e[k] = 1e-6
        fd = (loss(w0 + e) - loss(w0 - e)) / 2e-6
        np.testing.assert_allclose(g[k], float(fd), rtol=1e-5)


def _scan_step(u0: xr.DataArray, w: np.ndarray | jax.Array) -> xr.DataArray:
    def step(s):
        return s.stencil.map(lambda u: w[0] * u(x=-1) + w[1] * u() + w[2] * u(x=1),
                             boundary="extend")

    return u0.stencil.scan(step=step, steps=4, dim="time")


def test_inline_scan_steps_compile_once_and_read_their_arrays():
    u0 = xr.DataArray(np.random.default_rng(4).random(N), dims="x")
    ws = [np.array([0.25, 0.5, 0.25]), np.array([0.1, 0.6, 0.3]), np.array([0.5, 0.0, 0.5])]
    _scan_step(u0, ws[0])
    with compiles() as got:
        outs = [_scan_step(u0, w) for w in ws]
    assert got["compiles"] == 0
    for w, out in zip(ws, outs, strict=True):
        for k in range(5):
            np.testing.assert_allclose(out.isel(time=k).values, _smooth_ref(u0.values, w, k),
                                       rtol=1e-12)
    w = ws[0]
    before = _scan_step(u0, w)
    w[:] = [0.5, 0.0, 0.5]  # changed in place: read as it is now
    np.testing.assert_allclose(before.isel(time=4).values,
                               _smooth_ref(u0.values, [0.25, 0.5, 0.25], 4), rtol=1e-12)
    np.testing.assert_allclose(_scan_step(u0, w).isel(time=4).values,
                               _smooth_ref(u0.values, w, 4), rtol=1e-12)


def test_scan_step_gradient_reaches_a_closed_over_jax_array(x64):
    u0 = xr.DataArray(np.random.default_rng(5).random(N), dims="x")
    w0 = jnp.asarray([0.2, 0.5, 0.3])

    def loss(w):
        return jnp.sum(jnp.asarray(_scan_step(u0, w).isel(time=-1).data) ** 2)

    g = np.asarray(jax.grad(loss)(w0))
    for k in range(3):
        e = np.zeros(3)
        e[k] = 1e-6
        np.testing.assert_allclose(g[k], float((loss(w0 + e) - loss(w0 - e)) / 2e-6),
                                   rtol=1e-6)


def _mesh(u0: xr.DataArray, w: np.ndarray, b: np.ndarray) -> xstencil.Mesh:
    m = u0.stencil.mesh(boundary="extend")
    k = lambda u: w[0] * u(x=-1) + w[1] * u() + w[2] * u(x=1)  # noqa: E731
    m[...] = k
    m[{"x": 0}] = lambda u: b[0] + 0 * u()
    m[{"x": -1}] = lambda u: b[1] * u()
    m[{"x": 5}] = k  # the same kernel in two regions
    return m


def _mesh_ref(u0: np.ndarray, w: np.ndarray, b: np.ndarray, steps: int) -> np.ndarray:
    u = u0.copy()
    for _ in range(steps):
        p = np.pad(u, 1, mode="edge")
        new = w[0] * p[:-2] + w[1] * p[1:-1] + w[2] * p[2:]
        new[0], new[-1] = b[0], b[1] * u[-1]
        u = new
    return u


def test_a_rebuilt_mesh_over_new_arrays_compiles_once():
    u0 = xr.DataArray(np.random.default_rng(6).random(N), dims="x")
    cases = [(np.array([0.25, 0.5, 0.25]), np.array([1.0, 0.9])),
             (np.array([0.1, 0.6, 0.3]), np.array([2.0, 0.5])),
             (np.array([0.5, 0.0, 0.5]), np.array([0.0, 1.0]))]
    xstencil.iterate(None, _mesh(u0, *cases[0]), tol=None, max_steps=3)
    with compiles() as got:
        outs = [xstencil.iterate(None, _mesh(u0, w, b), tol=None, max_steps=3)
                for w, b in cases]
    assert got["compiles"] == 0
    for (w, b), out in zip(cases, outs, strict=True):
        np.testing.assert_allclose(out.field.values, _mesh_ref(u0.values, w, b, 3),
                                   rtol=1e-12)

"""Gradients through ``xstencil.solve`` where the transposed system is not the
forward one, each against a dense reference.

- CG on an operator that is not symmetric (``reflect`` boundaries): CG can
  converge there, and its gradient solved with A instead of Aᵀ (a 25 %
  error, silently).
- A singular operator (a periodic or Neumann Laplacian) with a zero-mean
  right-hand side: the forward solve converges, but the transposed solve
  got the loss's cotangent, whose mean is not zero, and diverged to inf,
  NaN or 1e30 without a word.  The gradient is now (Aᵀ)⁺ w.
- multigrid in float32 on such an operator with unequal spacings, where the
  fitted ``c`` rounded to -1.5e-5 and hid the singularity (100 V-cycles,
  no convergence).
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr

import xstencil

N = 8


def _reflect_matrix(n: int, kappa: float) -> np.ndarray:
    """``kappa * lap(u) - u`` in 2-D with numpy's ``reflect`` ghost cells."""
    a = np.zeros((n * n, n * n))
    idx = np.arange(n * n).reshape(n, n)

    def ref(i: int) -> int:
        return -i if i < 0 else 2 * (n - 1) - i if i > n - 1 else i

    for i in range(n):
        for j in range(n):
            a[idx[i, j], idx[i, j]] += -4 * kappa - 1
            for di, dj in ((1, 0), (-1, 0), (0, 1), (0, -1)):
                a[idx[i, j], idx[ref(i + di), ref(j + dj)]] += kappa
    return a


@pytest.mark.parametrize("method", ["cg", "bicgstab", "gmres"])
def test_gradient_of_a_nonsymmetric_operator_solves_the_transpose(method):
    a = _reflect_matrix(N, 0.7)
    assert not np.allclose(a, a.T)
    rng = np.random.default_rng(0)
    b0, w = rng.standard_normal((N, N)), rng.standard_normal((N, N))

    def k(u):
        return 0.7 * (u(y=1) + u(y=-1) + u(x=1) + u(x=-1) - 4 * u()) - u()

    def loss(b):
        r = xstencil.solve(k, xr.DataArray(b, dims=("y", "x")), method=method,
                           boundary="reflect", tol=1e-12)
        return jnp.sum(r.field.data * w)

    with jax.enable_x64(True):
        fwd = xstencil.solve(k, xr.DataArray(b0, dims=("y", "x")), method=method,
                             boundary="reflect", tol=1e-12)
        g = np.asarray(jax.grad(loss)(jnp.asarray(b0)))
    assert bool(fwd.converged)
    np.testing.assert_allclose(fwd.field.values.ravel(), np.linalg.solve(a, b0.ravel()),
                               atol=1e-9)
    np.testing.assert_allclose(g.ravel(), np.linalg.solve(a.T, w.ravel()), atol=1e-9)


def _second_difference(n: int, mode: str) -> np.ndarray:
    a = -2 * np.eye(n) + np.eye(n, k=1) + np.eye(n, k=-1)
    if mode == "periodic":
        a[0, -1] = a[-1, 0] = 1
    else:  # extend: Neumann
        a[0, 0] = a[-1, -1] = -1
    return a


@pytest.mark.parametrize("mode", ["periodic", "extend"])
@pytest.mark.parametrize("method", ["cg", "bicgstab", "gmres", "multigrid"])
def test_gradient_through_a_singular_laplacian(mode, method):
    n = 16
    rng = np.random.default_rng(0)
    b = rng.standard_normal(n)
    b -= b.mean()
    w = rng.standard_normal(n) + 1.0  # a loss whose cotangent has a non-zero mean
    pinv = np.linalg.pinv(_second_difference(n, mode))

    def lap(u):
        return u(x=-1) - 2 * u() + u(x=1)

    def loss(bb):
        r = xstencil.solve(lap, xr.DataArray(bb, dims="x"), method=method, boundary=mode,
                           tol=1e-11)
        return jnp.sum(r.field.data * w)

    with jax.enable_x64(True), warnings.catch_warnings():
        warnings.simplefilter("error")  # no ConvergenceWarning either way
        fwd = xstencil.solve(lap, xr.DataArray(b, dims="x"), method=method, boundary=mode,
                             tol=1e-11)
        g = np.asarray(jax.grad(loss)(jnp.asarray(b)))
    np.testing.assert_allclose(fwd.field.values, pinv @ b, atol=1e-9)
    assert np.all(np.isfinite(g))
    # the gradient (A^T)^+ w: its zero-mean part is what moves a zero-mean rhs
    want = pinv.T @ w
    np.testing.assert_allclose(g - g.mean(), want - want.mean(), atol=1e-8)


def test_a_regular_operator_keeps_its_cotangent_mean():
    """A Dirichlet Laplacian is not singular: nothing is projected away."""
    n = 12
    a = -2 * np.eye(n) + np.eye(n, k=1) + np.eye(n, k=-1)
    w = np.linspace(1.0, 2.0, n)

    def loss(bb):
        r = xstencil.solve(lambda u: u(x=-1) - 2 * u() + u(x=1), xr.DataArray(bb, dims="x"),
                           boundary="fill", fill_value=0.0, tol=1e-12)
        return jnp.sum(r.field.data * w)

    with jax.enable_x64(True):
        g = np.asarray(jax.grad(loss)(jnp.zeros(n)))
    np.testing.assert_allclose(g, np.linalg.solve(a.T, w), atol=1e-9)


@pytest.mark.parametrize("mode", ["periodic", "extend"])
def test_multigrid_float32_unequal_spacing_is_still_singular(mode):
    n = 64
    x = np.arange(n) / n
    b = (np.sin(2 * np.pi * x)[:, None] * np.cos(2 * np.pi * x)[None, :] + 0.3).astype("f4")
    dy2, dx2 = np.float32(0.1) ** 2, np.float32(0.07) ** 2

    def k(u):
        return (u(y=1) - 2 * u() + u(y=-1)) / dy2 + (u(x=1) - 2 * u() + u(x=-1)) / dx2

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = xstencil.solve(k, xr.DataArray(b, dims=("y", "x")), method="multigrid",
                             boundary=mode, tol=1e-5)
    f = res.field.values.astype(np.float64)
    assert bool(res.converged) and int(res.iterations) < 20
    assert abs(f.mean()) < 1e-6 * np.abs(f).max()  # the zero-mean solution
    # it solves A f = b - mean(b): check with the float64 operator
    bb = b.astype(np.float64) - b.mean(dtype=np.float64)
    pad = "wrap" if mode == "periodic" else "edge"
    p = np.pad(f, 1, mode=pad)
    af = ((p[2:, 1:-1] - 2 * f + p[:-2, 1:-1]) / float(dy2)
          + (p[1:-1, 2:] - 2 * f + p[1:-1, :-2]) / float(dx2))
    assert np.abs(af - bb).max() < 1e-3 * np.abs(bb).max()


@pytest.mark.parametrize("method", ["bicgstab", "gmres"])
def test_gradient_to_a_traced_coefficient_with_a_transposed_solve(method):
    """bicgstab and gmres transpose the operator; a coefficient passed as a
    JAX array lowered to a sum that branches on the unknown (NaN masking
    under weights of 0), which JAX cannot transpose: a bare AssertionError."""
    rng = np.random.default_rng(3)
    b0 = rng.standard_normal((6, 7))

    def k(u, kap):
        return kap * (u(y=1) + u(y=-1) + u(x=1) + u(x=-1) - 4 * u()) - u()

    def loss(kap, m):
        r = xstencil.solve(k, xr.DataArray(b0, dims=("y", "x")), kap, method=m,
                           boundary="fill", fill_value=0.0, tol=1e-12)
        return jnp.sum(r.field.data ** 2)

    with jax.enable_x64(True):
        kap = jnp.asarray(0.7)
        g = float(jax.grad(loss)(kap, method))
        h = 1e-6
        fd = (float(loss(kap + h, "cg")) - float(loss(kap - h, "cg"))) / (2 * h)
    np.testing.assert_allclose(g, fd, rtol=1e-6)


def test_cg_restarts_when_its_recursive_residual_drifts():
    """In float32, CG's recursive residual fell below tol while the true one
    was 3.4e-5 (tol 1e-5): it stopped, then warned to raise maxiter.  It
    restarts from its iterate now, and the reported residual is the true one."""
    n = 200
    b = np.random.default_rng(0).standard_normal((n, n)).astype("f4")

    def k(u):
        return u(x=1) + u(x=-1) + u(y=1) + u(y=-1) - 4 * u()

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = xstencil.solve(k, xr.DataArray(b, dims=("y", "x")), boundary="fill",
                           fill_value=0.0, tol=1e-5)
    assert bool(r.converged) and r.residual <= 1e-5
    x = r.field.values.astype(np.float64)
    p = np.pad(x, 1)
    ax = p[2:, 1:-1] + p[:-2, 1:-1] + p[1:-1, 2:] + p[1:-1, :-2] - 4 * x
    true = np.linalg.norm(b - ax) / np.linalg.norm(b.astype(np.float64))
    assert true <= 1.5e-5  # the float32 residual's own rounding aside

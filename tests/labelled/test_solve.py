"""``xstencil.solve``: matrix-free Krylov and geometric multigrid solves."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as spl
import xarray as xr
from jax.test_util import check_grads

import xstencil

GHOST = {"fill": "dirichlet", "extend": "neumann", "periodic": "periodic"}


def second_difference(n: int, mode: str) -> sp.lil_matrix:
    t = sp.diags([np.ones(n - 1), -2 * np.ones(n), np.ones(n - 1)], [-1, 0, 1]).tolil()
    if mode == "periodic":
        t[0, n - 1] = t[n - 1, 0] = 1
    elif mode == "extend":
        t[0, 0] = t[n - 1, n - 1] = -1
    return t


def operator_matrix(shape, a, c, modes) -> sp.csr_matrix:
    """``sum_d a_d D2_d + c I`` with each dim's ghost rule (the reference)."""
    out = c * sp.identity(int(np.prod(shape)))
    for ax, (n, m) in enumerate(zip(shape, modes, strict=True)):
        k = sp.identity(1)
        for bx, nb in enumerate(shape):
            k = sp.kron(k, second_difference(n, m) if bx == ax else sp.identity(nb))
        out = out + a[ax] * k
    return out.tocsr()


def field(shape, seed=0):
    dims = ("z", "y", "x")[-len(shape):]
    coords = {d: np.arange(n) * 0.1 for d, n in zip(dims, shape, strict=True)}
    return xr.DataArray(np.random.default_rng(seed).standard_normal(shape), dims=dims,
                        coords=coords, attrs={"units": "m"}, name="f")


def laplacian(dims, a, c):
    def k(u):
        out = c * u()
        for d, ad in zip(dims, a, strict=True):
            out = out + ad * (u(**{d: 1}) - 2 * u() + u(**{d: -1}))
        return out
    return k


CASES = [  # boundary x dims x coefficients; the last case of each method is cg
    # 12-34 s a case on a loaded 2-core host: the 2-D fill and periodic multigrid cases and
    # the second cg case run with the slow tests (the 3-D case has all three modes)
    pytest.param((31, 31), ("fill", "fill"), (1.0, 1.0), 0.0, "multigrid", marks=pytest.mark.slow),
    pytest.param((32, 48), ("periodic", "periodic"), (2.0, 1.0), 0.0, "multigrid",
                 marks=pytest.mark.slow),
    ((24, 31), ("extend", "fill"), (1.0, 3.0), -0.5, "multigrid"),
    ((15, 16, 16), ("fill", "periodic", "extend"), (1.0, 1.0, 2.0), -0.1, "multigrid"),
    ((20, 22), ("periodic", "extend"), (1.0, 1.0), -2.0, "cg"),
    pytest.param((16, 16), ("extend", "extend"), (1.0, 3.0), 0.0, "cg", marks=pytest.mark.slow),
]


@pytest.mark.parametrize(("shape", "modes", "a", "c", "method"), CASES)
def test_against_spsolve(x64, shape, modes, a, c, method):
    rhs = field(shape)
    dims = rhs.dims
    mat = operator_matrix(shape, a, c, modes)
    singular = c == 0 and "fill" not in modes
    b = rhs.values - rhs.values.mean() if singular else rhs.values
    boundary = dict(zip(dims, modes, strict=True))
    res = xstencil.solve(laplacian(dims, a, c), rhs.copy(data=b), method=method,
                         boundary=boundary, fill_value=0.0, tol=1e-10, maxiter=10_000)
    assert res.converged and res.residual <= 1e-10
    x = res.field.values.ravel()
    assert np.linalg.norm(b.ravel() - mat @ x) <= 1e-9 * np.linalg.norm(b)
    if not singular:
        want = spl.spsolve(mat.tocsc(), b.ravel())
        np.testing.assert_allclose(x, want, atol=1e-8 * np.abs(want).max())
    assert res.field.dims == dims and res.field.attrs == {"units": "m"}
    assert res.field.dtype == np.float64


@pytest.mark.parametrize("method", ["bicgstab", "gmres"])
def test_nonsymmetric_operator(x64, method):
    """Advection-diffusion, Dirichlet: not symmetric, so bicgstab/gmres."""
    rhs = field((20, 20))
    k = lambda u: (u(x=1) - 2 * u() + u(x=-1) + u(y=1) - 2 * u() + u(y=-1)  # noqa: E731
                   - 0.4 * (u(x=1) - u(x=-1)))
    mat = operator_matrix((20, 20), (1.0, 1.0), 0.0, ("fill", "fill")).tolil()
    idx = np.arange(400).reshape(20, 20)
    for i in range(20):
        for j in range(20):
            if j + 1 < 20:
                mat[idx[i, j], idx[i, j + 1]] -= 0.4
            if j > 0:
                mat[idx[i, j], idx[i, j - 1]] += 0.4
    want = spl.spsolve(mat.tocsc(), rhs.values.ravel())
    res = rhs.stencil.solve(k, method=method, boundary="fill", fill_value=0.0, tol=1e-11)
    assert res.converged
    np.testing.assert_allclose(res.field.values.ravel(), want, atol=1e-8 * np.abs(want).max())


@pytest.mark.slow  # grids up to the largest: 70 s on a loaded 2-core host
def test_multigrid_is_order_n():
    """V-cycles to a fixed tolerance do not grow with the grid (O(N) work)."""
    cycles = []
    for n in (31, 63, 127):
        rhs = field((n, n)).astype(np.float64)
        res = xstencil.solve(laplacian(("y", "x"), (1.0, 1.0), 0.0), rhs, method="multigrid",
                             boundary="fill", fill_value=0.0, tol=1e-8)
        assert res.converged
        cycles.append(res.iterations)
    assert max(cycles) <= min(cycles) + 1 and max(cycles) <= 10, cycles


@pytest.mark.parametrize("method", ["multigrid", "cg", "bicgstab"])
def test_gradient_wrt_rhs(x64, method):
    rhs = field((15, 15))
    k = laplacian(rhs.dims, (1.0, 1.0), -0.3)

    def loss(b):
        x = xstencil.solve(k, rhs.copy(data=b), method=method, boundary="fill",
                           fill_value=0.0, tol=1e-12).field
        return jnp.sum(jnp.sin(x.data))

    check_grads(loss, (jnp.asarray(rhs.values),), order=1, modes=["rev"], atol=1e-5,
                rtol=1e-5)


def test_gradient_wrt_a_kernel_coefficient(x64):
    """Implicit differentiation through a traced kernel argument, against
    central finite differences of the solve."""
    rhs = field((12, 12))

    def solve(kappa):
        k = lambda u, kappa: (u(x=1) - 2 * u() + u(x=-1) + u(y=1) - 2 * u()  # noqa: E731
                              + u(y=-1)) - kappa * u()
        x = xstencil.solve(k, rhs, kappa, method="cg", boundary="periodic", tol=1e-13).field
        return jnp.sum(x.data**2)

    kappa = jnp.asarray(0.7)
    g = jax.grad(solve)(kappa)
    h = 1e-5
    fd = (solve(kappa + h) - solve(kappa - h)) / (2 * h)
    np.testing.assert_allclose(float(g), float(fd), rtol=1e-6)


def test_inside_jit_and_float32():
    rhs = field((31, 31)).astype(np.float32)
    k = laplacian(rhs.dims, (1.0, 1.0), 0.0)

    @jax.jit
    def run(b):
        r = xstencil.solve(k, rhs.copy(data=b), method="multigrid", boundary="fill",
                           fill_value=0.0, tol=1e-5)
        return r.field.data, r.converged

    x, ok = run(rhs.values)
    assert bool(ok) and x.dtype == np.float32
    mat = operator_matrix((31, 31), (1.0, 1.0), 0.0, ("fill", "fill"))
    r = np.linalg.norm(rhs.values.ravel() - mat @ np.asarray(x, np.float64).ravel())
    assert r <= 2e-5 * np.linalg.norm(rhs.values)


def test_x0_and_maxiter_warning():
    rhs = field((31, 31))
    k = laplacian(rhs.dims, (1.0, 1.0), 0.0)
    with pytest.warns(xstencil.ConvergenceWarning, match=r"not converged after 3 iterations"):
        res = xstencil.solve(k, rhs, method="cg", boundary="fill", fill_value=0.0,
                             tol=1e-12, maxiter=3)
    assert res.iterations == 3 and not res.converged
    again = xstencil.solve(k, rhs, method="cg", boundary="fill", fill_value=0.0, tol=1e-8,
                           x0=res.field)
    assert again.converged


def test_mesh_operator_supplies_boundary_rows(x64):
    """Non-homogeneous Dirichlet rows from a mesh: u = 1 at x = 0, u = 0 at x = -1."""
    rhs = xr.DataArray(np.zeros(17), dims="x")
    rhs[0] = 1.0
    m = rhs.stencil.mesh(boundary="extend")
    m[...] = lambda u: u(x=1) - 2 * u() + u(x=-1)
    m[{"x": 0}] = lambda u: u()
    m[{"x": -1}] = lambda u: u()
    res = xstencil.solve(m, rhs, method="bicgstab", tol=1e-12)
    np.testing.assert_allclose(res.field.values, np.linspace(1, 0, 17), atol=1e-10)


def test_accessor_and_function_agree():
    rhs = field((15, 15))
    k = laplacian(rhs.dims, (1.0, 1.0), -1.0)
    a = rhs.stencil.solve(k, method="cg", boundary="periodic")
    b = xstencil.solve(k, rhs, method="cg", boundary="periodic")
    np.testing.assert_array_equal(a.field.values, b.field.values)


def test_errors():
    rhs = field((15, 15))
    lap = laplacian(rhs.dims, (1.0, 1.0), 0.0)
    with pytest.raises(xstencil.XStencilError, match=r"fill_value=0.0"):
        xstencil.solve(lap, rhs, boundary="fill")
    with pytest.raises(xstencil.XStencilError, match=r"not linear: operator\(0\) is not 0"):
        xstencil.solve(lap, rhs, boundary="fill", fill_value=1.0)
    with pytest.raises(xstencil.XStencilError, match=r"not linear: A\(2v\) != 2 A\(v\)"):
        xstencil.solve(lambda u: u() ** 2, rhs, boundary="periodic")
    with pytest.raises(xstencil.XStencilError, match=r"method='lu' is not a solver"):
        xstencil.solve(lap, rhs, method="lu", boundary="periodic")
    with pytest.raises(xstencil.XStencilError, match=r"differs from that form"):
        xstencil.solve(lambda u: u(x=1) - u(x=-1) + u(y=1) - 2 * u() + u(y=-1), rhs,
                       method="multigrid", boundary="periodic")
    with pytest.raises(xstencil.XStencilError, match=r"supports boundaries"):
        xstencil.solve(lap, rhs, method="multigrid", boundary="reflect")
    with pytest.raises(xstencil.XStencilError, match=r"x0 has shape"):
        xstencil.solve(lap, rhs, boundary="periodic", x0=np.zeros(3))
    with pytest.raises(xstencil.XStencilError, match=r"rhs must be a DataArray"):
        xstencil.solve(lap, rhs.to_dataset())
    m = rhs.stencil.mesh(boundary="periodic")
    m[...] = lap
    with pytest.raises(xstencil.XStencilError, match=r"not a mesh"):
        xstencil.solve(m, rhs, method="multigrid")


def test_input_not_mutated():
    rhs = field((15, 15))
    before = rhs.copy(deep=True)
    res = rhs.stencil.solve(laplacian(rhs.dims, (1.0, 1.0), -1.0), boundary="periodic")
    xr.testing.assert_identical(rhs, before)
    assert res.field.name == "f" and res.field.coords.equals(rhs.coords)

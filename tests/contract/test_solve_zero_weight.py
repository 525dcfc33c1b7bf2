"""``xstencil.solve`` with an operator holding a term of weight 0
(``0.0 * u()``).  A product with a zero weight reads a NaN or inf window value
as 0 (``elements.unread_zero_weight``), through a ``where`` whose condition
depends on the window values; in a solve those are the unknown, and JAX
cannot transpose such a ``where``: bicgstab and gmres, whose
``custom_linear_solve`` transposes the operator, failed with a bare
``AssertionError``.  A solve now lowers its operator as the plain product
(``elements.linear_operator``); maps keep the rule."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr

import xstencil

N = 24


def _tridiag(lo: float, diag: float, hi: float, n: int) -> np.ndarray:
    """The matrix of ``lo * u(x=-1) + diag * u() + hi * u(x=1)`` with zero fill."""
    return (np.diag(np.full(n, diag)) + np.diag(np.full(n - 1, hi), 1)
            + np.diag(np.full(n - 1, lo), -1))


def _rhs() -> xr.DataArray:
    x = np.linspace(0.0, 1.0, N)
    return xr.DataArray(np.sin(np.pi * x) + 0.3 * x, dims=("x",), coords={"x": x},
                        attrs={"units": "m"}, name="b")


def symmetric(u: Any) -> Any:
    return u(x=1) + u(x=-1) - 2.5 * u() + 0.0 * u()


def upwind(u: Any) -> Any:  # not symmetric: bicgstab and gmres only
    return 1.2 * u(x=-1) - 3.0 * u() + 0.7 * u(x=1) + 0.0 * u(x=1)


@pytest.mark.parametrize(("operator", "stencil", "method"), [
    (symmetric, (1.0, -2.5, 1.0), "cg"),
    (symmetric, (1.0, -2.5, 1.0), "bicgstab"),
    (symmetric, (1.0, -2.5, 1.0), "gmres"),
    (upwind, (1.2, -3.0, 0.7), "bicgstab"),
    (upwind, (1.2, -3.0, 0.7), "gmres"),
])
def test_zero_weight_term_in_the_operator(operator: Any, stencil: tuple[float, float, float],
                                          method: str) -> None:
    rhs = _rhs()
    got = xstencil.solve(operator, rhs, method=method, boundary="fill", fill_value=0.0,
                         tol=1e-12)
    x = got[0] if isinstance(got, tuple) else got
    want = np.linalg.solve(_tridiag(*stencil, N), rhs.values)
    np.testing.assert_allclose(np.asarray(x), want, rtol=1e-8, atol=1e-9)


def test_maps_still_do_not_read_cells_of_weight_zero() -> None:
    """Outside a solve a NaN under a zero weight still counts as 0."""
    a = np.arange(10.0)
    a[4] = np.nan
    da = xr.DataArray(a, dims=("x",))
    for backend in ("xla", "loops"):
        out = da.stencil.map(lambda u: 0.0 * u() + 2.0 * u(x=1), boundary="fill",
                             fill_value=0.0, backend=backend)
        want = np.append(2.0 * a[1:], 0.0)
        np.testing.assert_array_equal(np.asarray(out), want)


def test_a_solve_does_not_change_later_maps_of_its_operator() -> None:
    """The solve's lowering (no unread-zero-weight rule) is cached apart: a
    map of the same operator afterwards, jitted with the same shapes and
    dtypes as the solve's trace, still counts a NaN under weight 0 as 0
    (it returned NaN when the solve's trace was reused)."""
    def op(u: Any) -> Any:
        return u(x=1) + u(x=-1) + 0.0 * u()

    rhs = _rhs()
    xstencil.solve(op, rhs, method="bicgstab", boundary="fill", fill_value=0.0)
    a = rhs.values.copy()
    a[5] = np.nan
    want = np.append(a[1:], 0.0) + np.insert(a[:-1], 0, 0.0)  # u(x=1) + u(x=-1), zero fill
    with jax.enable_x64(True):
        f = jax.jit(lambda v: xr.DataArray(v, dims=("x",), coords=rhs.coords).stencil.map(
            op, boundary="fill", fill_value=0.0).data)
        got = np.asarray(f(jnp.asarray(a)))
    assert np.isfinite(got[5])
    np.testing.assert_allclose(got, want, rtol=1e-15, equal_nan=True)
    plain = xr.DataArray(a, dims=("x",), coords=rhs.coords).stencil.map(
        op, boundary="fill", fill_value=0.0, backend="xla")
    np.testing.assert_allclose(np.asarray(plain), want, rtol=1e-15, equal_nan=True)

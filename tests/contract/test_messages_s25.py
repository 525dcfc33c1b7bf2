"""Messages and refusals found by session 25's adversarial pass over staggered
grids and solves: each names what went wrong and the fix."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import xarray as xr

import xstencil
from xstencil import XStencilError

GRID = {"X": {"center": "x_c", "left": "x_g"}}


def test_a_coordinate_only_dim_takes_no_boundary_mode():
    """A 1-D slice keeps y_c as a coordinate-only dim; boundary='periodic'
    gave it a mode the plain call could not find (quoting a dict the user
    never wrote)."""
    ds = xr.Dataset({"u": (("x_g",), np.arange(6.0) ** 2)},
                    coords={"x_c": np.arange(6) + 0.5, "x_g": np.arange(6.0),
                            "y_c": np.arange(5) + 0.5})
    out = ds.stencil.map(lambda s: s.u(X=0.5) - s.u(X=-0.5), grid=GRID, at={"X": "center"},
                         boundary="periodic")
    u = ds.u.values
    np.testing.assert_array_equal(out.values, np.roll(u, -1) - u)
    assert out.dims == ("x_c",)


def test_an_unknown_result_name_lists_only_the_users_variables():
    ds = xr.Dataset({"h": (("x_c",), np.ones(5)), "u": (("x_g",), np.ones(5))},
                    coords={"x_c": np.arange(5) + 0.5, "x_g": np.arange(5.0)})
    with pytest.raises(XStencilError, match=r"not a data variable of the Dataset \('h', 'u'\);"):
        ds.stencil.map(lambda s: {"he": s.h() * s.u(X=0.5)}, grid=GRID, at={"X": "center"},
                       boundary="extend")


def test_outer_product_message_points_at_interpolation_and_grids():
    ds = xr.Dataset({"a": ("x", np.ones(4)), "b": ("y", np.ones(3))})
    with pytest.raises(XStencilError, match=r"outer product over \('x', 'y'\)\. Combine "
                       r"variables that share their dims.*grid= and at="):
        ds.stencil.map(lambda s: s.a(x=1) + s.b(y=1), boundary="extend")


@pytest.mark.parametrize("kernel", [
    lambda u: u(x=1) + u(x=-1) + u(y=1) + u(y=-1) - 4 * u() + 2.0 * u(),  # Helmholtz c > 0
    lambda u: (u(x=1) + u(x=-1) - 2 * u()) - (u(y=1) + u(y=-1) - 2 * u()),  # mixed signs
])
def test_multigrid_refuses_an_indefinite_operator(kernel):
    rhs = xr.DataArray(np.random.default_rng(0).standard_normal((31, 31)), dims=("y", "x"))
    with pytest.raises(XStencilError, match="needs a definite operator.*use method='gmres'"):
        xstencil.solve(kernel, rhs, method="multigrid", boundary="fill", fill_value=0.0)


def test_multigrid_takes_the_negated_laplacian():
    rhs = xr.DataArray(np.random.default_rng(0).standard_normal((31, 31)), dims=("y", "x"))
    pos = xstencil.solve(lambda u: u(x=1) + u(x=-1) + u(y=1) + u(y=-1) - 4 * u(), rhs,
                         method="multigrid", boundary="fill", fill_value=0.0, tol=1e-10)
    neg = xstencil.solve(lambda u: 4 * u() - u(x=1) - u(x=-1) - u(y=1) - u(y=-1), -rhs,
                         method="multigrid", boundary="fill", fill_value=0.0, tol=1e-10)
    np.testing.assert_allclose(neg.field.values, pos.field.values, atol=1e-8)


def test_convergence_warnings_name_the_solvers_knob():
    b = xr.DataArray(np.sin(np.arange(32.0)), dims="x")
    with pytest.warns(xstencil.ConvergenceWarning,
                      match=r"not converged \(GMRES reports no iteration count\): .*raise "
                            r"maxiter or loosen tol"):
        xstencil.solve(lambda u: u(x=1) + u(x=-1) - 1.5 * u(), b, method="gmres",
                       boundary="fill", fill_value=0.0, tol=1e-10, maxiter=5)
    with pytest.warns(xstencil.ConvergenceWarning, match=r"after 3 iterations: .*raise maxiter"):
        xstencil.solve(lambda u: u(x=1) + u(x=-1) - 2.5 * u(), b, boundary="fill",
                       fill_value=0.0, tol=1e-14, maxiter=3)
    bad = b.copy(data=np.where(np.arange(32) == 3, np.nan, b.values))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        xstencil.solve(lambda u: u(x=1) + u(x=-1) - 2.5 * u(), bad, boundary="fill",
                       fill_value=0.0)
    msgs = [str(w.message) for w in caught if w.category is xstencil.ConvergenceWarning]
    assert msgs and "the iteration diverged" in msgs[0] and "raise maxiter" not in msgs[0]

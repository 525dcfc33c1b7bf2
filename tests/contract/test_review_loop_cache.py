"""The compiled loops of ``iterate``, ``solve`` and ``scan(step=)``, keyed by
the body's structure with its closed-over arrays as inputs (session of the
loop-cache change): inputs where a cached loop was wrongly reused, or where
something that worked stopped working; and the wins kept (an inline body
over new arrays compiles once, an array changed in place is read).
References are plain numpy loops."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

import xstencil
from tests.compiles import compiles
from xstencil import XStencilError

N = 8
X = np.linspace(0.0, 1.0, N)
U0 = xr.DataArray(X, dims="x")


def _scaled(a: float) -> object:
    """A kernel whose factor is its own attribute (``k.alpha``): one code for all."""
    def k(u):
        return k.alpha * u()

    k.alpha = a
    return k


def test_kernels_of_one_code_with_different_own_attributes_do_not_share_a_loop():
    # the structure key left out a function's own attributes: the second
    # iterate ran the first kernel's alpha (2 * 2 * x instead of 3 * 3 * x)
    for a in (2.0, 3.0):
        out = xstencil.iterate(U0, _scaled(a), tol=None, max_steps=2, boundary="periodic")
        np.testing.assert_allclose(out.field.values, a * a * X)
    np.testing.assert_allclose(U0.stencil.map(_scaled(5.0)).values, 5.0 * X)


def test_a_kernels_own_attribute_changed_after_a_call_is_read():
    k = _scaled(2.0)
    for a in (2.0, 3.0, 4.0):  # the third call would be served by the walk's memo
        k.alpha = a
        out = xstencil.iterate(U0, k, tol=None, max_steps=1, boundary="periodic")
        np.testing.assert_allclose(out.field.values, a * X)
        np.testing.assert_allclose(U0.stencil.map(k).values, a * X)


def test_mesh_kernels_with_different_own_attributes_do_not_share_a_loop():
    for a in (2.0, 3.0):
        m = U0.stencil.mesh(boundary="periodic")
        m[...] = _scaled(a)
        m[{"x": 0}] = lambda u: -1.0
        want = a * X
        want[0] = -1.0
        np.testing.assert_allclose(
            xstencil.iterate(None, m, tol=None, max_steps=1).field.values, want)

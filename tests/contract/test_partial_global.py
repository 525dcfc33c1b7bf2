"""A ``functools.partial`` reached from a kernel (a global or a closure cell)
is keyed by its function and arguments, not by identity: changing its
``keywords`` in place between calls must not reuse code traced with the old
value (found by the percall2 review, session 7)."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import xarray as xr

import xstencil  # noqa: F401


def _scaled(v, c=1.0):
    return v * c


SCALE = functools.partial(_scaled, c=2.0)


def _kernel_global(u):
    return SCALE(u(x=1) - u(x=-1))


@pytest.mark.parametrize("backend", ["xla", "loops"])
def test_partial_in_a_global_changed_in_place(backend: str) -> None:
    a = np.arange(24, dtype=np.float32).reshape(4, 6) ** 2
    da = xr.DataArray(a, dims=("y", "x"))
    ref = np.roll(a, -1, 1) - np.roll(a, 1, 1)
    SCALE.keywords["c"] = 2.0
    first = da.stencil.map(_kernel_global, boundary="periodic", backend=backend)
    np.testing.assert_allclose(first.values, 2.0 * ref)
    SCALE.keywords["c"] = 3.0
    try:
        second = da.stencil.map(_kernel_global, boundary="periodic", backend=backend)
    finally:
        SCALE.keywords["c"] = 2.0
    np.testing.assert_allclose(second.values, 3.0 * ref)


def test_partial_in_a_closure_with_an_array_argument_changed_in_place() -> None:
    w = np.array([1.0, 2.0], np.float32)
    f = functools.partial(lambda v, w: v * w[0] + w[1], w=w)

    def kernel(u):
        return f(u(x=1))

    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    da = xr.DataArray(a, dims=("y", "x"))
    first = da.stencil.map(kernel, boundary="periodic")
    np.testing.assert_allclose(first.values, np.roll(a, -1, 1) * 1.0 + 2.0)
    f.keywords["w"] = np.array([3.0, -1.0], np.float32)
    second = da.stencil.map(kernel, boundary="periodic")
    np.testing.assert_allclose(second.values, np.roll(a, -1, 1) * 3.0 - 1.0)

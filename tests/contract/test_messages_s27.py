"""Messages found by session 27's ports (a devito-style wave equation).

A numpy user closes over the velocity field ``c(y, x)``; the kernel then
returns the whole field at every point.  The message used to advise
``output_dims=``, which, followed, returned an outer product (y, x, k0, k1)
instead of ``c * lap``.  It now says how to pass a field, and still names
``output_dims`` for kernels that do return an array per point.
"""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

import xstencil  # noqa: F401
from xstencil import XStencilError


def lap(u):
    return u(x=1) + u(x=-1) + u(y=1) + u(y=-1) - 4 * u()


def test_a_closed_over_field_is_named_as_one_and_the_dataset_way_is_right():
    rng = np.random.default_rng(0)
    da = xr.DataArray(rng.random((4, 5)), dims=("y", "x"), name="u")
    c2 = rng.random((4, 5))
    with pytest.raises(XStencilError) as err:
        da.stencil.map(lambda u: c2 * lap(u), boundary="periodic")
    msg = str(err.value)
    assert "the data's own sizes along ('y', 'x')" in msg
    assert "xr.Dataset({'u': da, 'c': c})" in msg and "s['c']()" in msg
    # what the message advises gives c2 * lap
    ds = xr.Dataset({"u": da, "c": (("y", "x"), c2)})
    out = ds.stencil.map(lambda s: s["c"]() * lap(s["u"]), boundary="periodic")
    u = da.values
    want = c2 * (np.roll(u, -1, 1) + np.roll(u, 1, 1) + np.roll(u, -1, 0) + np.roll(u, 1, 0)
                 - 4 * u)
    np.testing.assert_allclose(out.values, want, rtol=1e-12)


def test_a_field_along_one_dim_of_two_is_named():
    da = xr.DataArray(np.ones((4, 5)), dims=("y", "x"))
    prof = np.arange(5.0)
    with pytest.raises(XStencilError, match=r"sizes along \('x',\)"):
        da.stencil.map(lambda u: prof * u(x=1), boundary="periodic")


def test_a_per_point_array_of_other_sizes_keeps_the_output_dims_advice():
    da = xr.DataArray(np.ones((4, 5)), dims=("y", "x"))
    with pytest.raises(XStencilError) as err:
        da.stencil.map(lambda u: np.arange(3.0) * u(), boundary="periodic")
    assert "output_dims=('k0',)" in str(err.value)
    assert "Dataset" not in str(err.value)


def test_closed_over_numpy_offsets_are_told_to_be_lists_and_lists_work():
    # scikit-image's local_binary_pattern samples at offsets computed with numpy
    da = xr.DataArray(np.random.default_rng(1).random((6, 7)), dims=("y", "x"))
    rr = np.array([1, -1])
    with pytest.raises(xstencil.KernelError, match=r"rr = rr\.tolist\(\)"):
        da.stencil.map(lambda u: sum(u(y=int(rr[i])) for i in range(2)), boundary="periodic")
    rl = rr.tolist()
    out = da.stencil.map(lambda u: sum(u(y=rl[i]) for i in range(2)), boundary="periodic")
    np.testing.assert_allclose(out.values, np.roll(da.values, -1, 0) + np.roll(da.values, 1, 0))


def test_a_window_patch_per_point_is_not_called_a_field():
    # data (band: 3, x: 50) and a kernel returning its 3-cell window along x
    da = xr.DataArray(np.ones((3, 50)), dims=("band", "x"))
    with pytest.raises(XStencilError) as err:
        da.stencil.map(lambda u: u.array, window={"x": 3}, boundary="extend")
    assert "output_dims=('k0',)" in str(err.value) and "Dataset" not in str(err.value)

"""The window as an array has its axes in the order of ``window=``, whatever
order the data's dims are stored in.

Found by an attack with transposed inputs (session 11): a Sobel-x filter,
``(u * w).sum()`` with ``window={"y": 3, "x": 3}`` and ``w`` laid out
``[y, x]``, computed Sobel-y on a DataArray stored as ``(x, y)`` (max error
12 on unit-normal data, no error raised): the window's axes followed the
data's dim order, so the same call on ``da`` and ``da.transpose()`` gave
different numbers.  A window of unequal sizes failed with a broadcasting
error instead, and a Dataset's variables stored in different orders each
paired ``w`` with other axes.  xarray's ``rolling(x=3, y=3).construct(...)``
orders its window dims by its arguments, and so does xstencil now.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import scipy.ndimage as ndi
import xarray as xr

import xstencil  # noqa: F401

BACKENDS = ["xla", "loops"]


def _data(ny: int = 9, nx: int = 11, seed: int = 0) -> xr.DataArray:
    a = np.random.default_rng(seed).standard_normal((ny, nx))
    return xr.DataArray(a, dims=("y", "x"), coords={"y": np.arange(ny), "x": np.arange(nx)})


def _correlate(a: np.ndarray, w: np.ndarray, mode: str) -> np.ndarray:
    """scipy's correlation with xstencil's centre ((size - 1) // 2)."""
    origin = [-1 if n % 2 == 0 else 0 for n in w.shape]
    return ndi.correlate(a, w, mode=mode, origin=origin)


SOBEL_X = np.array([[-1.0, 0.0, 1.0], [-2.0, 0.0, 2.0], [-1.0, 0.0, 1.0]])  # [y, x]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("order", [("y", "x"), ("x", "y")])
def test_sobel_x_is_sobel_x_in_either_dim_order(backend: str, order: tuple[str, str]) -> None:
    da = _data()
    ref = _correlate(da.values, SOBEL_X, "nearest")
    got = da.transpose(*order).stencil.map(lambda u: (u * SOBEL_X).sum(),
                                           window={"y": 3, "x": 3}, boundary="extend",
                                           backend=backend)
    assert got.dims == order
    np.testing.assert_allclose(got.transpose("y", "x").values, ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_window_order_is_the_argument_order(backend: str) -> None:
    da = _data()
    wxy = SOBEL_X.T  # laid out [x, y]: the same filter
    got = da.stencil.map(lambda u: (u * wxy).sum(), window={"x": 3, "y": 3},
                         boundary="extend", backend=backend)
    np.testing.assert_allclose(got.values, _correlate(da.values, SOBEL_X, "nearest"),
                               rtol=1e-12, atol=1e-12)
    dims = []
    pos = da.stencil.map(lambda u: dims.append(u.dims) or u[0, 1], window={"x": 3, "y": 3},
                         boundary="extend", backend=backend)
    assert dims[0] == ("x", "y")
    by_name = da.stencil.map(lambda u: u(y=1), boundary="extend", backend=backend)
    np.testing.assert_array_equal(pos.values, by_name.values)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("k", [(3, 5), (15, 17)])  # (15, 17): the FFT lowering
def test_unequal_sizes_on_transposed_data(backend: str, k: tuple[int, int]) -> None:
    da = _data(40, 50, seed=1)
    w = np.random.default_rng(2).standard_normal(k)  # [y, x]
    ref = _correlate(da.values, w, "wrap")
    for d in (da, da.transpose("x", "y")):
        got = d.stencil.map(lambda u: (u * w).sum(), window={"y": k[0], "x": k[1]},
                            boundary="periodic", backend=backend)
        np.testing.assert_allclose(got.transpose("y", "x").values, ref, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("backend", BACKENDS)
def test_dataset_variables_stored_in_other_orders_share_the_window_order(backend: str) -> None:
    da = _data()
    ds = xr.Dataset({"a": da, "b": (da * 2).transpose("x", "y")})
    got = ds.stencil.map(lambda s: {"a": (s["a"] * SOBEL_X).sum(), "b": (s["b"] * SOBEL_X).sum()},
                         window={"y": 3, "x": 3}, boundary="extend", backend=backend)
    ref = _correlate(da.values, SOBEL_X, "nearest")
    np.testing.assert_allclose(got["a"].transpose("y", "x").values, ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got["b"].transpose("y", "x").values, 2 * ref, rtol=1e-12,
                               atol=1e-12)


def test_mesh_regions_use_the_window_order() -> None:
    da = _data().transpose("x", "y")
    m = da.stencil.mesh(window={"y": 3, "x": 3}, boundary="extend")
    m[...] = lambda u: (u * SOBEL_X).sum()
    m[{"x": 0}] = lambda u: 0.0 * u[0, 0]
    got = m.map().transpose("y", "x").values
    ref = _correlate(da.transpose("y", "x").values, SOBEL_X, "nearest")
    ref[:, 0] = 0.0
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kernel, extra", [
    (lambda u: (u * np.array([1.0, 2.0, 3.0])).sum(), {}),  # broadcast along the last axis
    (lambda u: u.sum(axis=0).max(), {}),  # a reduction over the first axis
    (lambda u: u.array, {"output_dims": ("wy", "wx")}),  # the window itself, per point
])
def test_axis_positions_do_not_depend_on_the_storage_order(kernel, extra) -> None:  # noqa: ANN001
    da = _data()
    ref = da.stencil.map(kernel, window={"y": 3, "x": 3}, boundary="periodic", **extra)
    got = da.transpose("x", "y").stencil.map(kernel, window={"y": 3, "x": 3},
                                             boundary="periodic", **extra)
    np.testing.assert_allclose(got.transpose(*ref.dims).values, ref.values, rtol=1e-12,
                               atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_storage_order_of_3d_data(backend: str) -> None:
    """All six storage orders of (z, y, x) data, a window written (x, z, y) with three
    different sizes: one answer, scipy's correlation with the weights in data order."""
    rng = np.random.default_rng(7)
    a = rng.standard_normal((6, 7, 8))
    da = xr.DataArray(a, dims=("z", "y", "x"))
    window = {"x": 2, "z": 3, "y": 1}
    w = rng.standard_normal((2, 3, 1))  # laid out [x, z, y], as window= is written
    ref = _correlate(a, np.transpose(w, (1, 2, 0)), "wrap")
    for order in itertools.permutations(("z", "y", "x")):
        got = da.transpose(*order).stencil.map(lambda u: (u * w).sum(), window=window,
                                               boundary="periodic", backend=backend)
        np.testing.assert_allclose(got.transpose("z", "y", "x").values, ref, rtol=1e-10,
                                   atol=1e-10, err_msg=str(order))

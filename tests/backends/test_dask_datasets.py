"""dask-backed Datasets (issue 12, section 2): a kernel returning a dict of one
variable gives a Dataset (not a DataArray named after a graph key), and
variables of different dtypes keep their own dtype through the dask graph
(int64 beyond 2**53 is not rounded through float64)
(xstencil._backends.dask.map_dask)."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

import xstencil  # noqa: F401 - registers .stencil

pytest.importorskip("dask.array")

BIG = 1152921504606846979  # 2**60 + 3: not a float64


def _grid() -> np.ndarray:
    return np.arange(64.0).reshape(8, 8) * 0.5 - 3.0


def _roll(a: np.ndarray, dim: str, off: int) -> np.ndarray:
    """The periodic neighbour ``off`` cells along ``dim`` (x: axis 0, y: axis 1)."""
    return np.roll(a, -off, axis=0 if dim == "x" else 1)


def _dask_matches_memory(ds: xr.Dataset, kernel, **kw) -> xr.Dataset:
    """The dask map, after compute, identical to the in-memory map; returned."""
    ref = ds.stencil.map(kernel, **kw)
    for n, v in ref.data_vars.items():  # in memory, complex results come back as jax
        ref[n] = v.copy(data=np.asarray(v.data))  # arrays (a separate defect, not dask's)
    lazy = ds.chunk({"x": 4, "y": 4}).stencil.map(kernel, **kw)
    assert isinstance(lazy, xr.Dataset), type(lazy)
    out = lazy.compute()
    xr.testing.assert_identical(out, ref)
    return out


@pytest.mark.parametrize("boundary", ["periodic", "fill"])
def test_dict_of_one_new_variable_is_a_dataset(boundary):
    a = _grid()
    ds = xr.Dataset({"a": (("x", "y"), a), "b": (("x", "y"), 2 * a)},
                    attrs={"title": "t"})
    out = _dask_matches_memory(
        ds, lambda s: {"s": s["a"]() + s["b"](x=1)}, new_vars=("s",), boundary=boundary)
    want = a + _roll(2 * a, "x", 1)
    if boundary == "fill":
        want[-1, :] = np.nan
    np.testing.assert_array_equal(out["s"].values, want)
    np.testing.assert_array_equal(out["a"].values, a)


def test_dict_of_one_existing_variable_is_a_dataset():
    a = _grid()
    ds = xr.Dataset({"a": (("x", "y"), a), "b": (("x", "y"), 2 * a)})
    out = _dask_matches_memory(ds, lambda s: {"b": s["a"](y=-1) * 3.0}, boundary="periodic")
    np.testing.assert_array_equal(out["b"].values, 3.0 * _roll(a, "y", -1))
    np.testing.assert_array_equal(out["a"].values, a)


def test_int64_beyond_float64_keeps_every_digit():
    a = _grid()
    big = np.full((8, 8), BIG, np.int64) + np.arange(64, dtype=np.int64).reshape(8, 8)
    ds = xr.Dataset({"i": (("x", "y"), big), "f": (("x", "y"), a)})
    out = _dask_matches_memory(
        ds, lambda s: {"i": s["i"](x=1), "f": s["f"](y=1) + 1.0}, boundary="periodic")
    assert out["i"].dtype == np.int64
    np.testing.assert_array_equal(out["i"].values, _roll(big, "x", 1))
    assert int(out["i"].values[0, 0]) == BIG + 8  # exact, not ...976 + 8
    np.testing.assert_array_equal(out["f"].values, _roll(a, "y", 1) + 1.0)


@pytest.mark.parametrize("other", [np.float32, np.int32, np.bool_, np.complex128, np.uint8])
def test_mixed_dtypes_each_keep_their_own(other):
    a = _grid()
    o = (a > 0) if other is np.bool_ else (
        (a + 1j * a) if other is np.complex128 else np.abs(a) * 2)
    o = o.astype(other)
    big = np.full((8, 8), BIG, np.int64)
    ds = xr.Dataset({"i": (("x", "y"), big), "o": (("x", "y"), o), "f": (("x", "y"), a)})
    out = _dask_matches_memory(
        ds, lambda s: {"i": s["i"](y=1), "o": s["o"](x=-1), "f": s["f"]()},
        boundary="periodic")
    assert {n: out[n].dtype for n in ("i", "o", "f")} == {
        "i": np.dtype(np.int64), "o": np.dtype(other), "f": np.dtype(np.float64)}
    np.testing.assert_array_equal(out["o"].values, _roll(o, "x", -1))
    np.testing.assert_array_equal(out["i"].values, big)


def test_mixed_dtypes_with_a_window_output_dim():
    a = _grid()
    big = np.full((8, 8), BIG, np.int64) - np.arange(64, dtype=np.int64).reshape(8, 8)
    ds = xr.Dataset({"i": (("x", "y"), big), "f": (("x", "y"), a)})
    out = _dask_matches_memory(
        ds, lambda s: {"i": s["i"].array, "f": s["f"].array * 2.0}, window={"x": 3},
        boundary="periodic", output_dims="k")
    assert out["i"].dtype == np.int64
    for j, off in enumerate((-1, 0, 1)):
        np.testing.assert_array_equal(out["i"].isel(k=j).transpose("x", "y").values,
                                      _roll(big, "x", off))


def _mesh_map(obj: xr.Dataset, one: bool) -> xr.Dataset:
    m = obj.stencil.mesh(boundary="periodic")
    if one:
        m[...] = lambda s: {"i": s["i"](x=1)}
        m[{"y": slice(0, 3)}] = lambda s: {"i": s["i"]() + 1}
    else:
        m[...] = lambda s: {"i": s["i"](x=1), "f": s["f"]()}
        m[{"y": slice(0, 3)}] = lambda s: {"i": s["i"]() + 1, "f": s["f"](y=1) * 2.0}
    return m.map()


@pytest.mark.parametrize("one", [True, False])
def test_mesh_map_of_a_dataset(one):
    a = _grid()
    big = np.full((8, 8), BIG, np.int64) + np.arange(64, dtype=np.int64).reshape(8, 8)
    ds = xr.Dataset({"i": (("x", "y"), big), "f": (("x", "y"), a)})
    ref = _mesh_map(ds, one)
    lazy = _mesh_map(ds.chunk({"x": 4, "y": 4}), one)
    assert isinstance(lazy, xr.Dataset), type(lazy)
    out = lazy.compute()
    xr.testing.assert_identical(out, ref)
    want = _roll(big, "x", 1)
    want[:, :3] = big[:, :3] + 1
    np.testing.assert_array_equal(out["i"].values, want)
    if not one:
        fw = a.copy()
        fw[:, :3] = 2.0 * _roll(a, "y", 1)[:, :3]
        np.testing.assert_array_equal(out["f"].values, fw)

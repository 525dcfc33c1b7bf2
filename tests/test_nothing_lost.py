"""Nothing is lost or changed behind the user's back.

* Inputs are never mutated: numpy and JAX data, coords, attrs, encoding.
* dtype, dims, coords, attrs and name survive every call; ``encoding`` is
  dropped (it describes how the *input* was stored on disk, e.g. int16 with a
  ``scale_factor``, which would silently quantize a derived field).
* float64 stays float64 with JAX's x64 flag off, and no flag change leaks out.
* int and bool kernels work (Game of Life); complex data works.
* NaN propagates exactly as the same numpy expression propagates it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr

import xstencil  # noqa: F401  (registers the accessor)


def lap(u: Any) -> Any:
    return u(x=1) + u(x=-1) + u(y=1) + u(y=-1) - 4 * u()


def _field(dtype: Any = np.float64, jax_data: bool = False) -> xr.DataArray:
    rng = np.random.default_rng(0)
    data = rng.random((6, 7)).astype(dtype)
    da = xr.DataArray(
        jnp.asarray(data) if jax_data else data, dims=("y", "x"), name="T",
        coords={"y": np.arange(6.0), "x": np.linspace(0.0, 1.2, 7),
                "lat": (("y", "x"), rng.random((6, 7))), "label": "run-1"},
        attrs={"units": "K", "history": ["made"]},
    )
    da.encoding = {"dtype": "int16", "scale_factor": 0.1}
    da["x"].attrs["units"] = "m"
    da["x"].encoding = {"units": "m"}
    return da


def _dataset() -> xr.Dataset:
    da = _field()
    ds = xr.Dataset({"u": da, "h": (("x",), np.linspace(1.0, 2.0, 7), {"units": "m"})},
                    attrs={"title": "test"})
    ds["u"].encoding = {"zlib": True}
    return ds


def _mesh_map(obj: Any, **options: Any) -> Any:
    m = obj.stencil.mesh(boundary="periodic", **options)
    m[...] = lap
    m[{"x": 0}] = lambda u: u(x=1)
    return m.map()


CALLS: dict[str, Callable[[xr.DataArray], Any]] = {
    "map-periodic": lambda da: da.stencil.map(lap, boundary="periodic"),
    "map-fill": lambda da: da.stencil.map(lap),
    "map-valid": lambda da: da.stencil.map(lap, boundary="valid"),
    "map-stride": lambda da: da.stencil.map(lap, boundary="reflect", stride={"x": 2}),
    "map-window-array": lambda da: da.stencil.map(lambda u: u.max(), window={"y": 3, "x": 3},
                                                  boundary="extend"),
    "map-coord": lambda da: da.stencil.map(
        lambda u: (u(x=1) - u(x=-1)) / (u.coord("x")(x=1) - u.coord("x")(x=-1)),
        boundary="periodic"),
    "mesh": _mesh_map,
    "scan": lambda da: da.stencil.scan(lambda u: 2 * u(y=-1) - u(y=-1, x=1), dim="y",
                                       boundary={"x": "periodic"}),
    "dataset": lambda da: xr.Dataset({"u": da}).stencil.map(
        lambda s: {"u": s["u"](x=1)}, boundary="symmetric"),
}


def _snapshot(obj: xr.DataArray | xr.Dataset) -> dict[str, Any]:
    return {
        "obj": obj.copy(deep=True),
        "attrs": copy.deepcopy(obj.attrs),
        "encoding": copy.deepcopy(obj.encoding),
        "coord_attrs": {k: copy.deepcopy(v.attrs) for k, v in obj.coords.items()},
        "coord_encoding": {k: copy.deepcopy(v.encoding) for k, v in obj.coords.items()},
    }


def _assert_unchanged(obj: xr.DataArray | xr.Dataset, snap: dict[str, Any]) -> None:
    xr.testing.assert_identical(obj, snap["obj"])
    assert obj.attrs == snap["attrs"]
    assert obj.encoding == snap["encoding"]
    assert {k: v.attrs for k, v in obj.coords.items()} == snap["coord_attrs"]
    assert {k: v.encoding for k, v in obj.coords.items()} == snap["coord_encoding"]


@pytest.mark.parametrize("jax_data", [False, True], ids=["numpy", "jax"])
@pytest.mark.parametrize("name", list(CALLS))
def test_input_not_mutated(name: str, jax_data: bool) -> None:
    da = _field(jax_data=jax_data)
    raw = da.data
    before = np.array(raw, copy=True)
    snap = _snapshot(da)
    out = CALLS[name](da)
    assert da.data is raw  # not replaced or converted in place
    if jax_data:
        assert not raw.is_deleted()  # not donated
    np.testing.assert_array_equal(np.asarray(raw), before)
    _assert_unchanged(da, snap)
    # the output owns its metadata: changing it does not reach the input
    out.attrs["touched"] = True
    if isinstance(out, xr.DataArray):
        out.coords["x"].attrs["touched"] = True
    _assert_unchanged(da, snap)


def test_dataset_input_not_mutated() -> None:
    ds = _dataset()
    snap = _snapshot(ds)
    var_snaps = {k: _snapshot(v) for k, v in ds.data_vars.items()}
    out = ds.stencil.map(lambda s: {"u": s["u"](x=1) * s["h"]()}, boundary="periodic")
    out["u"].attrs["touched"] = True
    out.attrs["touched"] = True
    _assert_unchanged(ds, snap)
    for k, v in ds.data_vars.items():
        _assert_unchanged(v, var_snaps[k])


@pytest.mark.parametrize("name", list(CALLS))
def test_metadata_survives(name: str) -> None:
    da = _field()
    out = CALLS[name](da)
    if isinstance(out, xr.Dataset):
        out = out["u"]
    assert out.dims == da.dims
    assert out.dtype == da.dtype
    assert out.attrs == da.attrs
    if name != "dataset":  # a Dataset kernel names its outputs by their keys
        assert out.name == da.name
    assert set(out.coords) == set(da.coords)
    # coords are the input's, trimmed or subsampled where the output is
    sub = da.isel({d: out.indexes[d].map(list(da.indexes[d]).index) for d in ("y", "x")})
    xr.testing.assert_identical(out.coords.to_dataset(), sub.coords.to_dataset())
    assert out["x"].attrs == {"units": "m"}
    # the encoding describes how the input was stored; it is dropped
    assert out.encoding == {}
    assert out["x"].encoding == da["x"].encoding


def test_dataset_metadata_survives() -> None:
    ds = _dataset()
    out = ds.stencil.map(lambda s: {"u": s["u"](x=1), "h": s["h"](x=1)}, boundary="periodic")
    assert isinstance(out, xr.Dataset)
    assert out.attrs == ds.attrs
    for n in ("u", "h"):
        assert out[n].dtype == ds[n].dtype
        assert out[n].attrs == ds[n].attrs
        assert out[n].encoding == {}
    assert set(out.coords) == set(ds.coords)
    # a single value from a Dataset kernel is a DataArray with the Dataset's attrs
    one = ds.stencil.map(lambda s: s["u"](x=1) * s["h"](), boundary="periodic")
    assert isinstance(one, xr.DataArray)
    assert one.dims == ("y", "x") and one.dtype == np.float64


# -- precision ------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.complex128, np.int64, np.int16])
@pytest.mark.parametrize("name", ["map-periodic", "mesh", "dataset", "scan"])
def test_dtype_kept_and_x64_flag_not_leaked(name: str, dtype: Any) -> None:
    assert not jax.config.read("jax_enable_x64")  # the suite runs as users do
    da = (_field() * 10).astype(dtype)
    out = CALLS[name](da)
    if isinstance(out, xr.Dataset):
        out = out["u"]
    assert out.dtype == dtype
    assert not jax.config.read("jax_enable_x64")
    # and the numbers are float64-accurate, not float32 in disguise
    ref = sum(np.roll(da.values, s, a) for s in (1, -1) for a in (0, 1)) - 4 * da.values
    if name == "map-periodic":
        rtol = {np.float32: 1e-5}.get(dtype, 1e-13)
        np.testing.assert_allclose(out.values, ref, rtol=rtol, atol=0)


def test_x64_flag_not_leaked_on_error() -> None:
    da = _field()
    with pytest.raises(xstencil.KernelError):
        da.stencil.map(lambda u: u.array @ jnp.ones(7), window={"x": 3})
    assert not jax.config.read("jax_enable_x64")


def test_x64_on_stays_on(x64: None) -> None:
    out = _field(np.float32).stencil.map(lap, boundary="periodic")
    assert out.dtype == np.float32
    assert jax.config.read("jax_enable_x64")


def test_float64_resolution() -> None:
    """A difference of 1e-12 on values near 1 survives (it is 0 in float32)."""
    x = np.full(8, 1.0)
    x[3] += 1e-12
    da = xr.DataArray(x, dims="x")
    out = da.stencil.map(lambda u: u(x=1) - u(), boundary="periodic")
    assert out.dtype == np.float64
    assert out.values[2] == pytest.approx(1e-12, rel=1e-3)


# -- int, bool and complex kernels -------------------------------------------------------

def _life_reference(board: np.ndarray) -> np.ndarray:
    b = board.astype(np.int64)
    n = sum(np.roll(np.roll(b, i, 0), j, 1) for i in (-1, 0, 1) for j in (-1, 0, 1)
            if (i, j) != (0, 0))
    return (n == 3) | ((b == 1) & (n == 2))


def life(u: Any) -> Any:
    n = sum(u(x=i, y=j).astype(jnp.int32) for i in (-1, 0, 1) for j in (-1, 0, 1)
            if (i, j) != (0, 0))
    alive = u().astype(bool)
    return ((n == 3) | (alive & (n == 2))).astype(u.dtype)


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.bool_])
def test_game_of_life(dtype: Any) -> None:
    rng = np.random.default_rng(1)
    board = rng.random((9, 11)) < 0.4
    da = xr.DataArray(board.astype(dtype), dims=("y", "x"))
    state = da
    expected = board
    for _ in range(3):
        state = state.stencil.map(life, boundary="periodic")
        expected = _life_reference(expected)
        assert state.dtype == dtype
        np.testing.assert_array_equal(state.values.astype(bool), expected)
    # a glider on a fill boundary with an explicit integer fill value
    glider = np.zeros((6, 6), dtype)
    glider[0, 1] = glider[1, 2] = glider[2, 0] = glider[2, 1] = glider[2, 2] = 1
    g = xr.DataArray(glider, dims=("y", "x"))
    for _ in range(4):
        g = g.stencil.map(life, fill_value=0)
    np.testing.assert_array_equal(g.values, np.roll(glider, (1, 1), (0, 1)))


def test_game_of_life_array_api() -> None:
    board = np.random.default_rng(2).random((8, 8)) < 0.4

    @xstencil.kmap(kernel_size=(3, 3), padding="same", boundary="periodic", relative=True)
    def step(x: Any) -> Any:
        n = x.astype(jnp.int32).sum() - x[0, 0].astype(jnp.int32)
        return (n == 3) | (x[0, 0] & (n == 2))

    out = step(jnp.asarray(board))
    assert out.dtype == jnp.bool_
    np.testing.assert_array_equal(np.asarray(out), _life_reference(board))


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
def test_complex_data(dtype: Any) -> None:
    rng = np.random.default_rng(3)
    z = (rng.random((5, 6)) + 1j * rng.random((5, 6))).astype(dtype)
    da = xr.DataArray(z, dims=("y", "x"), coords={"x": np.arange(6.0)})
    out = da.stencil.map(lambda u: u(x=1) * jnp.conj(u(x=-1)), boundary="periodic")
    assert out.dtype == dtype
    np.testing.assert_allclose(out.values, np.roll(z, -1, 1) * np.conj(np.roll(z, 1, 1)),
                               rtol=1e-6)
    # a coordinate window on complex data is real; under strict promotion (as in
    # these tests) the kernel casts it to mix it with complex values
    def ddx(u: Any) -> Any:
        x = u.coord("x")
        return (u(x=1) - u(x=-1)) / (x(x=1) - x(x=-1)).astype(u.dtype)

    d = da.stencil.map(ddx, boundary="periodic")
    assert d.dtype == dtype
    np.testing.assert_allclose(d.values, (np.roll(z, -1, 1) - np.roll(z, 1, 1)) / 2, rtol=1e-6)
    # the default fill is NaN (as a complex value, nan+0j), as xarray's rolling uses
    filled = da.stencil.map(lambda u: u(x=1))
    assert np.isnan(filled.values[:, -1]).all()
    # a complex fill value, and gradients of a real loss of complex data
    assert da.stencil.map(lambda u: u(x=1), fill_value=1 + 2j).values[0, -1] == 1 + 2j


# -- NaN propagation ----------------------------------------------------------------------

def test_nan_propagates_as_numpy() -> None:
    rng = np.random.default_rng(4)
    a = rng.random((7, 9))
    a[2, 3] = np.nan
    a[5, 0] = np.inf
    a[0, 8] = -np.inf
    da = xr.DataArray(a, dims=("y", "x"))
    out = da.stencil.map(lap, boundary="periodic").values
    ref = (np.roll(a, -1, 1) + np.roll(a, 1, 1) + np.roll(a, -1, 0) + np.roll(a, 1, 0)
           - 4 * a)
    np.testing.assert_array_equal(out, ref)  # equal_nan: same NaN, same inf positions
    # reductions: max propagates NaN, nanmax skips it, exactly as numpy
    pad = np.pad(a, 1, mode="edge")
    win = np.lib.stride_tricks.sliding_window_view(pad, (3, 3))
    for fn, ref_fn in [(jnp.max, np.max), (jnp.nanmax, np.nanmax), (jnp.sum, np.sum),
                       (jnp.nanmean, np.nanmean)]:
        got = da.stencil.map(lambda u, fn=fn: fn(u), window={"y": 3, "x": 3},
                             boundary="extend").values
        np.testing.assert_allclose(got, ref_fn(win, axis=(-2, -1)), rtol=1e-12)
    # the fill boundary's NaN halo reaches exactly the edge cells
    edge = da.stencil.map(lap).values
    inner = np.isnan(ref)
    expect = inner.copy()
    expect[[0, -1], :] = True
    expect[:, [0, -1]] = True
    np.testing.assert_array_equal(np.isnan(edge), expect)

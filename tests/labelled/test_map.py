"""``xstencil.map`` / ``da.stencil.map`` against the numpy loop reference and
against xarray's own ``rolling(...).construct()``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr

import xstencil
from tests.labelled.reference import ref_map

MODES = ["fill", "extend", "periodic", "reflect", "symmetric", "valid"]


# Module-level kernels: the compile cache is keyed by the kernel object, so
# sharing them across parametrizations keeps the compile count down.
def lap_x(u):
    return u(x=1) - 2 * u() + u(x=-1)


def lap_xy(u):
    return u(x=1) + u(x=-1) + u(y=1) + u(y=-1) - 4 * u()


def box_sum(u):
    return u.sum()


def box_max(u):
    return u.max()


def box_mean(u):
    return jnp.mean(u)


def asym(u):
    return u(x=-2) + 3 * u(x=1)


def positional(u):
    return u[1, -1] - u[-1, 0]


def patches(u):
    return u.array


def centre(u):
    return u()


def _data(dims: tuple[str, ...], dtype: str = "float64", seed: int = 0) -> xr.DataArray:
    sizes = {"t": 2, "y": 5, "x": 6}
    shape = tuple(sizes[d] for d in dims)
    rng = np.random.default_rng(seed)
    values = rng.standard_normal(shape).astype(dtype)
    coords = {d: np.arange(sizes[d], dtype=float) * 0.5 for d in dims}
    return xr.DataArray(values, dims=dims, coords=coords, name="T", attrs={"units": "K"})


def _tol(dtype: str) -> dict[str, float]:
    return {"rtol": 1e-5, "atol": 1e-5} if dtype == "float32" else {"rtol": 1e-12, "atol": 1e-12}


# -- boundary x dims x dtype against the numpy reference ---------------------------------

DIMS = [("x",), ("y", "x"), ("t", "y", "x")]


@pytest.mark.parametrize("boundary", MODES)
@pytest.mark.parametrize("dims", DIMS, ids=lambda d: "".join(d))
@pytest.mark.parametrize("dtype", ["float32", "float64", "float64-x64"])
def test_map_matches_reference(boundary, dims, dtype):
    np_dtype = dtype.split("-")[0]
    da = _data(dims, np_dtype)
    kernel, window = (lap_x, {"x": 3}) if dims == ("x",) else (lap_xy, {"y": 3, "x": 3})
    with jax.enable_x64(dtype.endswith("x64")):
        out = da.stencil.map(kernel, boundary=boundary)
    ref, pos = ref_map(da.values, dims, kernel, window=window, boundary=boundary)
    assert out.dtype == np.dtype(np_dtype)
    assert out.dims == dims
    np.testing.assert_allclose(out.values, ref, **_tol(np_dtype))
    for d in dims:
        np.testing.assert_array_equal(out[d].values, da[d].values[pos[d]])


@pytest.mark.parametrize("boundary", MODES)
def test_window_as_array_per_dim_boundary(boundary):
    da = _data(("y", "x"))
    bnd = {"x": boundary, "y": "periodic"}
    out = da.stencil.map(box_sum, window={"y": 3, "x": 2}, boundary=bnd)
    ref, _ = ref_map(da.values, da.dims, box_sum, window={"y": 3, "x": 2}, boundary=bnd)
    np.testing.assert_allclose(out.values, ref, rtol=1e-12)


def test_float64_precision_kept_with_x64_off():
    assert not jax.config.read("jax_enable_x64")
    da = xr.DataArray(np.full(8, 1.0) + np.arange(8) * 1e-12, dims="x")
    out = da.stencil.map(lambda u: u(x=1) - u(), boundary="periodic")
    assert out.dtype == np.float64
    np.testing.assert_allclose(out.values[:-1], 1e-12, rtol=1e-3)
    assert not jax.config.read("jax_enable_x64")


def test_weighted_window_float32_and_float64(x64):
    w = np.arange(9.0).reshape(3, 3)
    for dt in ("float32", "float64"):
        da = _data(("y", "x"), dt)
        ww = w.astype(dt)
        out = da.stencil.map(lambda u, ww=ww: (u * ww).sum(), window={"y": 3, "x": 3},
                             boundary="extend")
        ref, _ = ref_map(da.values, da.dims, lambda u, ww=ww: (u * ww).sum(),
                         window={"y": 3, "x": 3}, boundary="extend")
        assert out.dtype == np.dtype(dt)
        np.testing.assert_allclose(out.values, ref, **_tol(dt))


def test_asymmetric_window_and_positional_reads():
    da = _data(("y", "x"))
    out = da.stencil.map(asym, window={"x": (2, 1)}, boundary="extend")
    ref, _ = ref_map(da.values, da.dims, asym, window={"x": (2, 1)}, boundary="extend")
    np.testing.assert_allclose(out.values, ref)
    out = da.stencil.map(positional, window={"y": 3, "x": 3}, boundary="periodic")
    ref, _ = ref_map(da.values, da.dims, positional, window={"y": 3, "x": 3},
                     boundary="periodic")
    np.testing.assert_allclose(out.values, ref)


def test_window_leaves_other_dims_mapped_over():
    da = _data(("t", "y", "x"))
    out = da.stencil.map(box_sum, window={"y": 3, "x": 3}, boundary="fill", fill_value=0.0)
    for t in range(da.sizes["t"]):
        ref, _ = ref_map(da.values[t], ("y", "x"), box_sum, window={"y": 3, "x": 3},
                         fill_value=0.0)
        np.testing.assert_allclose(out.values[t], ref)


# -- against xarray's rolling ------------------------------------------------------------

@pytest.mark.parametrize("k", [3, 4, 5])
@pytest.mark.parametrize("reduce", ["sum", "max", "mean"])
def test_matches_xarray_rolling_construct(k, reduce):
    da = _data(("y", "x"))
    kernel = {"sum": box_sum, "max": box_max, "mean": box_mean}[reduce]
    rolled = da.rolling(x=k, center=True).construct("w")
    expect = getattr(rolled, reduce)("w", skipna=False)
    # xarray centres an even window at k // 2, xstencil at (k - 1) // 2; a
    # (lo, hi) window reproduces xarray's choice.
    window = {"x": k} if k % 2 else {"x": (k // 2, k // 2 - 1)}
    out = da.stencil.map(kernel, window=window, boundary="fill")
    xr.testing.assert_allclose(out, expect.assign_attrs(da.attrs))
    if k % 2 == 0:  # the plain even window leans the other way
        out = da.stencil.map(kernel, window={"x": k})
        assert np.isnan(out.values[:, -(k // 2):]).all()
        assert not np.isnan(out.values[:, (k - 1) // 2]).any()


def test_matches_xarray_rolling_2d_and_valid():
    da = _data(("y", "x"))
    rolled = da.rolling(y=3, x=3, center=True).construct(y="wy", x="wx")
    expect = rolled.sum(["wy", "wx"], skipna=False)
    xr.testing.assert_allclose(da.stencil.map(box_sum, window={"y": 3, "x": 3}),
                               expect.assign_attrs(da.attrs))
    valid = da.stencil.map(box_sum, window={"y": 3, "x": 3}, boundary="valid")
    xr.testing.assert_allclose(valid, expect.isel(y=slice(1, -1), x=slice(1, -1))
                               .assign_attrs(da.attrs))


def test_rolling_fill_value_matches_xarray():
    da = _data(("x",))
    expect = da.rolling(x=3, center=True).construct("w", fill_value=0.0).sum("w")
    out = da.stencil.map(box_sum, window={"x": 3}, fill_value=0.0)
    xr.testing.assert_allclose(out, expect.assign_attrs(da.attrs))


# -- int / bool data ---------------------------------------------------------------------

@pytest.mark.parametrize("boundary", ["fill", "extend", "periodic", "valid"])
def test_int_data(boundary):
    da = xr.DataArray(np.arange(12, dtype=np.int32).reshape(3, 4), dims=("y", "x"))
    out = da.stencil.map(lap_xy, boundary=boundary, fill_value=-7)
    ref, _ = ref_map(da.values, da.dims, lap_xy, window={"y": 3, "x": 3},
                     boundary=boundary, fill_value=-7)
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out.values, ref)


def test_int64_data_stays_int64():
    da = xr.DataArray(np.arange(6, dtype=np.int64) * 2**40, dims="x")
    out = da.stencil.map(lambda u: u(x=1), boundary="periodic")
    assert out.dtype == np.int64
    np.testing.assert_array_equal(out.values, np.roll(da.values, -1))


def test_bool_data_game_of_life_step():
    rng = np.random.default_rng(3)
    board = xr.DataArray(rng.random((6, 7)) < 0.4, dims=("y", "x"))

    def life(u):
        n = u.astype(jnp.int32).sum() - u().astype(jnp.int32)
        return (n == 3) | (u() & (n == 2))

    out = board.stencil.map(life, window={"y": 3, "x": 3}, boundary="periodic")
    b = board.values.astype(int)
    n = sum(np.roll(b, (i, j), (0, 1)) for i in (-1, 0, 1) for j in (-1, 0, 1)) - b
    assert out.dtype == bool
    np.testing.assert_array_equal(out.values, (n == 3) | (board.values & (n == 2)))


def test_bool_data_with_fill():
    da = xr.DataArray(np.array([True, False, True, True]), dims="x")
    out = da.stencil.map(lambda u: u(x=1) & u(x=-1), fill_value=False)
    np.testing.assert_array_equal(out.values, [False, True, False, False])


def test_nan_propagates_like_numpy():
    v = np.arange(12.0).reshape(3, 4)
    v[1, 1] = np.nan
    da = xr.DataArray(v, dims=("y", "x"))
    out = da.stencil.map(lambda u: u(x=1) + u(x=-1), boundary="extend")
    p = np.pad(v, ((0, 0), (1, 1)), mode="edge")
    np.testing.assert_array_equal(out.values, p[:, 2:] + p[:, :-2])
    out = da.stencil.map(box_max, window={"x": 3}, boundary="extend")
    assert np.isnan(out.values[1, :3]).all() and not np.isnan(out.values[1, 3])


# -- output: dims, coords, attrs, name ---------------------------------------------------

def _rich() -> xr.DataArray:
    rng = np.random.default_rng(1)
    return xr.DataArray(
        rng.random((4, 5, 6)), dims=("t", "y", "x"),
        coords={"t": np.arange(4), "y": np.linspace(0, 1, 5), "x": np.linspace(0, 2, 6),
                "label": ("x", list("abcdef")), "lat": (("y", "x"), rng.random((5, 6))),
                "time_note": ("t", ["a", "b", "c", "d"]), "scalar": 3.0},
        attrs={"units": "m", "history": "made up"}, name="h",
    )


def test_output_keeps_dims_coords_attrs_name():
    da = _rich()
    out = da.stencil.map(lap_xy, boundary="periodic")
    assert out.dims == da.dims and out.shape == da.shape
    assert out.name == "h" and out.attrs == da.attrs
    xr.testing.assert_identical(out.coords.to_dataset(), da.coords.to_dataset())
    # float64 with JAX's x64 flag off comes back on the host, so that follow-up
    # JAX arithmetic cannot truncate it; 32-bit results stay JAX arrays.
    assert isinstance(out.data, np.ndarray) and out.dtype == np.float64
    out32 = da.astype(np.float32).stencil.map(lap_xy, boundary="periodic")
    assert isinstance(out32.data, jax.Array) and out32.dtype == np.float32
    assert ((out * 2 + 1).dtype, (out32 * 2).dtype) == (np.float64, np.float32)


def test_float64_results_are_jax_arrays_under_x64(x64):
    out = _rich().stencil.map(lap_xy, boundary="periodic")
    assert isinstance(out.data, jax.Array) and out.dtype == np.float64


def test_output_keeps_transposed_dim_order():
    da = _rich().transpose("x", "t", "y")
    out = da.stencil.map(lap_xy, boundary="periodic")
    assert out.dims == ("x", "t", "y")
    ref = _rich().stencil.map(lap_xy, boundary="periodic").transpose("x", "t", "y")
    np.testing.assert_allclose(out.values, ref.values)


def test_valid_trims_coords():
    da = _rich()
    out = da.stencil.map(lap_xy, boundary="valid")
    assert out.sizes == {"t": 4, "y": 3, "x": 4}
    expect = da.isel(y=slice(1, -1), x=slice(1, -1))
    xr.testing.assert_identical(out.coords.to_dataset(), expect.coords.to_dataset())
    assert out.attrs == da.attrs and out.name == "h"


def test_stride_subsamples_coords():
    da = _rich()
    out = da.stencil.map(box_max, window={"y": 2, "x": 2}, stride={"y": 2, "x": 2},
                         boundary="valid")
    assert out.sizes == {"t": 4, "y": 2, "x": 3}
    expect = da.isel(y=[0, 2], x=[0, 2, 4])
    xr.testing.assert_identical(out.coords.to_dataset(), expect.coords.to_dataset())
    ref, _ = ref_map(da.values, da.dims, box_max, window={"y": 2, "x": 2},
                     boundary="valid", stride={"y": 2, "x": 2})
    np.testing.assert_allclose(out.values, ref)


def test_stride_with_padding_and_int_stride():
    da = _rich()
    out = da.stencil.map(lap_xy, boundary="extend", stride=2)
    expect = da.isel(t=slice(None, None, 2), y=slice(None, None, 2), x=slice(None, None, 2))
    xr.testing.assert_identical(out.coords.to_dataset(), expect.coords.to_dataset())
    ref, _ = ref_map(da.values, da.dims, lap_xy, window={"y": 3, "x": 3}, boundary="extend",
                     stride={"t": 2, "y": 2, "x": 2})
    np.testing.assert_allclose(out.values, ref)


def test_output_dims_adds_trailing_dims():
    da = _rich()
    out = da.stencil.map(patches, window={"y": 3, "x": 3}, boundary="extend",
                         output_dims=("py", "px"))
    assert out.dims == ("t", "y", "x", "py", "px") and out.shape == (4, 5, 6, 3, 3)
    ref, _ = ref_map(da.values, da.dims, patches, window={"y": 3, "x": 3}, boundary="extend")
    np.testing.assert_allclose(out.values, ref)
    xr.testing.assert_identical(out.coords.to_dataset(), da.coords.to_dataset())
    one = da.stencil.map(lambda u: u.array.sum(0), window={"y": 3, "x": 3},
                         boundary="extend", output_dims="px")
    assert one.dims == ("t", "y", "x", "px")


def test_values_plot_and_netcdf(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    da = _rich().drop_vars("scalar")
    out = da.stencil.map(lap_xy, boundary="periodic")
    assert isinstance(out.values, np.ndarray)
    out.isel(t=0).plot()
    plt.close("all")
    path = tmp_path / "out.nc"
    out.to_netcdf(path, engine="h5netcdf")
    with xr.open_dataarray(path, engine="h5netcdf") as back:
        xr.testing.assert_allclose(back.load(), out.copy(data=np.asarray(out.data)))


def test_input_not_mutated():
    da = _rich()
    before = da.copy(deep=True)
    da.stencil.map(lap_xy, boundary="periodic")
    da.stencil.map(box_sum, window={"y": 3}, boundary="valid", stride=2)
    da.stencil.map(patches, window={"x": 3}, output_dims="w")
    xr.testing.assert_identical(da, before)


def test_accessor_and_function_agree():
    da = _rich()
    a = da.stencil.map(lap_xy, boundary="reflect")
    b = xstencil.map(da, lap_xy, boundary="reflect")
    xr.testing.assert_identical(a, b)


# -- extra arguments, tracing and compile reuse ------------------------------------------

def test_args_and_kwargs_reach_the_kernel():
    da = _data(("x",))

    def k(u, a, *, b):
        return a * u(x=1) + b

    out = da.stencil.map(k, 2.0, b=np.float64(1.0), boundary="periodic")
    np.testing.assert_allclose(out.values, 2 * np.roll(da.values, -1) + 1)


def test_repeated_call_does_not_retrace():
    traces = []

    def k(u, c):
        traces.append(1)
        return c * (u(x=1) - u(x=-1))

    da = _data(("y", "x"))
    for c in (1.0, 2.0, 3.0):
        out = da.stencil.map(k, np.float64(c), boundary="periodic")
    n = len(traces)
    for c in (4.0, 5.0):
        out = da.stencil.map(k, np.float64(c), boundary="periodic")
        out2 = da.copy(data=da.values + 1).stencil.map(k, np.float64(c), boundary="periodic")
    assert len(traces) == n
    np.testing.assert_allclose(out.values, 5 * (np.roll(da.values, -1, 1)
                                                - np.roll(da.values, 1, 1)))
    assert out2.shape == out.shape
    da.isel(x=slice(0, 4)).stencil.map(k, np.float64(1.0), boundary="periodic")
    assert len(traces) > n  # a new shape does compile again


def test_map_under_jit_and_grad_of_traced_data():
    def f(a):
        da = xr.DataArray(a, dims=("y", "x"))
        return da.stencil.map(lambda u: u(x=1) ** 2, boundary="periodic").data.sum()

    a = jnp.arange(12.0, dtype=jnp.float32).reshape(3, 4)
    np.testing.assert_allclose(jax.jit(f)(a), (a**2).sum())
    np.testing.assert_allclose(jax.grad(f)(a), 2 * a)


# -- the repeat-call fast path (xstencil/_labelled/fastpath.py) ---------------------------

def ddx(u):
    x = u.coord("x")
    return (u(x=1) - u(x=-1)) / (x(x=1) - x(x=-1))


@pytest.mark.parametrize("options", [
    {"boundary": "periodic"},
    {"boundary": "valid", "stride": {"x": 2}},
    {"boundary": "extend", "window": {"x": 3}, "output_dims": "w"},
], ids=["simple", "trimmed", "output_dims"])
def test_repeat_call_skips_planning_and_matches_first_call(monkeypatch, options):
    from xstencil._labelled import map as map_module

    da = _rich()
    kernel = patches if "output_dims" in options else ddx
    first = da.stencil.map(kernel, **options)
    calls = []
    real = map_module.prepare
    monkeypatch.setattr(map_module, "prepare", lambda *a, **k: calls.append(1) or real(*a, **k))
    again = da.stencil.map(kernel, **options)
    equal_coords = da.copy(deep=True).stencil.map(kernel, **options)  # new objects, same labels
    assert calls == []
    xr.testing.assert_identical(again, first)
    xr.testing.assert_identical(equal_coords, first)
    # other coordinate values (same shape) take the full path and give other numbers
    scaled = da.assign_coords(x=da.x * 2).stencil.map(kernel, **options)
    assert calls == [1]
    if kernel is ddx:
        np.testing.assert_allclose(scaled.values, first.values / 2)
    # the next call, on another dtype, plans again too
    da.astype(np.float32).stencil.map(kernel, **options)
    assert calls == [1, 1]


def test_fast_path_output_is_independent_of_input():
    da = _rich()
    da.stencil.map(lap_xy, boundary="periodic")
    out = da.stencil.map(lap_xy, boundary="periodic")
    out.attrs["new"] = 1
    out.coords["x"].attrs["units"] = "m"
    out.coords["label"].attrs["note"] = "changed"
    assert "new" not in da.attrs
    assert da.coords["x"].attrs == {} and da.coords["label"].attrs == {}
    assert out.encoding == {}


def test_fast_path_inside_and_outside_jit():
    da = _data(("y", "x"), "float32")
    step = jax.jit(lambda d: d.stencil.map(ddx, boundary="periodic"))
    inside = step(da)  # the first call happens under a trace
    outside = da.stencil.map(ddx, boundary="periodic")
    again = da.stencil.map(ddx, boundary="periodic")
    np.testing.assert_allclose(inside.values, outside.values, rtol=1e-6)
    xr.testing.assert_identical(again, outside)


@pytest.mark.parametrize("boundary", ["fill", "extend", "periodic", "reflect", "symmetric"])
def test_window_wider_than_the_dim_when_the_boundary_pads(boundary):
    da = xr.DataArray(np.arange(4.0), dims="x")
    out = da.stencil.map(box_sum, window={"x": 9}, boundary=boundary, fill_value=-1.0)
    ref, _ = ref_map(da.values, ("x",), box_sum, window={"x": 9}, boundary=boundary,
                     fill_value=-1.0)
    np.testing.assert_allclose(out.values, ref)

"""Regression tests for the dtype reproducers of issues 11 and 12.

Each case gave a silently wrong result (or a deep error) before: a uint8 sum
wrapped to 247, a float32 Sobel on uint8 was clipped to 255, a bool
neighbour count came back as True/False, kmap and map disagreed, float64
became float32 under ``jax.jit``/``lax.fori_loop``/``lax.while_loop`` without
a word, ``check_finite=True`` did nothing under ``jax.jit``, bfloat16 was "not
numeric", ``fill_value=1e300`` on float32 became inf, and a ``Decimal`` or
``Fraction`` fill value failed deep inside JAX.
"""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr
from jax import lax

import xstencil
from xstencil import PrecisionWarning, XStencilError

# the suite runs with strict promotion; these kernels use users' standard rules
pytestmark = pytest.mark.usefixtures("standard")


@pytest.fixture
def standard() -> Any:
    with jax.numpy_dtype_promotion("standard"):
        yield


def _box(x: np.ndarray) -> np.ndarray:
    """3x3 sums with numpy's 'reflect' padding, in int64 (no wrapping)."""
    p = np.pad(x.astype(np.int64), 1, mode="reflect")
    return sum(p[i:i + x.shape[0], j:j + x.shape[1]] for i in range(3) for j in range(3))


def test_uint8_sum_does_not_wrap() -> None:
    da = xr.DataArray(np.full((3, 3), 255, np.uint8), dims=("y", "x"))
    out = da.stencil.map(lambda u: u.sum(), window={"y": 3, "x": 3}, boundary="reflect")
    assert int(out[1, 1]) == 9 * 255  # was 247 (wrapped in uint8)
    assert out.dtype == jnp.sum(jnp.zeros(3, jnp.uint8)).dtype  # JAX's rule: uint32
    np.testing.assert_array_equal(np.asarray(out), _box(da.values))


def _sobel(u: Any) -> Any:
    f = lambda **k: u(**k).astype(jnp.float32)  # noqa: E731
    return (f(x=1, y=-1) + 2 * f(x=1) + f(x=1, y=1)) - (f(x=-1, y=-1) + 2 * f(x=-1)
                                                        + f(x=-1, y=1))


def test_uint8_sobel_in_float32_is_not_clipped() -> None:
    img = np.tile(np.array([0, 0, 200, 200], np.uint8), (4, 1))
    out = xr.DataArray(img, dims=("y", "x")).stencil.map(_sobel, boundary="extend")
    assert out.dtype == np.float32
    p = np.pad(img.astype(np.float64), 1, mode="edge")
    gx = (p[:-2, 2:] + 2 * p[1:-1, 2:] + p[2:, 2:]) - (p[:-2, :-2] + 2 * p[1:-1, :-2]
                                                       + p[2:, :-2])
    np.testing.assert_array_equal(np.asarray(out), gx)
    assert float(out[1, 1]) == 800.0  # was 255


def test_bool_neighbour_count_is_an_integer() -> None:
    land = np.array([[1, 0, 1], [0, 1, 0], [0, 0, 0]], bool)
    out = xr.DataArray(land, dims=("y", "x")).stencil.map(
        lambda u: u.sum(), window={"y": 3, "x": 3}, boundary="fill", fill_value=False)
    assert out.dtype.kind == "i"
    p = np.pad(land.astype(np.int64), 1)
    want = sum(p[i:i + 3, j:j + 3] for i in range(3) for j in range(3))
    np.testing.assert_array_equal(np.asarray(out), want)
    assert np.asarray(out)[0].tolist() == [2, 3, 2]  # was [True, True, True]


@pytest.mark.parametrize("case", ["uint8-sum", "float-compare", "int16-half"])
def test_kmap_and_map_agree(case: str) -> None:
    data = {"uint8-sum": np.arange(250, 256, dtype=np.uint8),
            "float-compare": np.linspace(0, 1, 6, dtype=np.float32),
            "int16-half": np.arange(6, dtype=np.int16)}[case]
    kernel = {"uint8-sum": lambda w: w[-1] + w[0] * 0 + jnp.sum(w[1]),
              "float-compare": lambda w: w[1] > w[-1],
              "int16-half": lambda w: w[0] * 0.5}[case]
    arr = xstencil.kmap(kernel_size=(3,), padding="same", relative=True)(kernel)(
        jnp.asarray(data))
    lab = xr.DataArray(data, dims="x").stencil.map(
        lambda u: kernel({-1: u(x=-1), 0: u(), 1: u(x=1)}), boundary="extend")
    assert arr.dtype == lab.dtype
    np.testing.assert_array_equal(np.asarray(arr)[1:-1], np.asarray(lab)[1:-1])


def test_python_scalar_takes_the_datas_dtype() -> None:
    da = xr.DataArray(np.arange(4, dtype=np.float32), dims="x")
    m = da.stencil.mesh(boundary="extend")
    m[...] = lambda u: u(x=1) - u(x=-1)
    m[{"x": 0}] = lambda u: 0.0
    assert m.map().dtype == np.float32
    assert da.stencil.map(lambda u: 1, boundary="extend").dtype == np.float32
    i16 = xr.DataArray(np.arange(4, dtype=np.int16), dims="x")
    assert i16.stencil.map(lambda u: u(x=1) + 1, boundary="extend").dtype == np.int16


def test_dataset_variables_keep_their_kernels_dtypes() -> None:
    ds = xr.Dataset({"a": ("x", np.full(4, 200, np.uint8)),
                     "b": ("x", np.arange(4, dtype=np.float32))})
    out = ds.stencil.map(lambda s: {"a": jnp.sum(s.a(x=1)) + s.a(), "b": s.b(x=1) > s.b()},
                         boundary="periodic")
    assert out.a.dtype == np.uint32 and out.b.dtype == bool
    np.testing.assert_array_equal(out.a.values, np.full(4, 400))
    np.testing.assert_array_equal(out.b.values, np.roll(ds.b.values, -1) > ds.b.values)


def test_dtype_option_casts_everywhere() -> None:
    da = xr.DataArray(np.arange(5, dtype=np.uint8), dims="x", coords={"x": np.arange(5)})
    k = lambda u: u(x=1) > u()  # noqa: E731
    a = da.stencil.map(k, boundary="extend", dtype="float32")
    b = xstencil.map(da, k, boundary="extend", dtype=np.float32)
    assert a.dtype == b.dtype == np.float32
    np.testing.assert_array_equal(a.values, (np.r_[da.values[1:], 4] > da.values) * 1.0)
    m = da.stencil.mesh(boundary="extend")
    m[...] = k
    assert m.map(dtype=np.int16).dtype == np.int16
    assert da.stencil.mesh(boundary="extend", dtype="int16").__class__ is xstencil.Mesh
    # float64 asked for with x64 off: kept (the kernel computes in its own
    # dtype, float32 here, and the result is cast, as numpy's astype does)
    wide = da.stencil.map(lambda u: u(x=1) / 3, boundary="extend", dtype=np.float64)
    assert wide.dtype == np.float64
    np.testing.assert_array_equal(
        wide.values, (np.r_[da.values[1:], 4] / np.float32(3)).astype(np.float32))
    with pytest.raises(XStencilError, match=r"dtype='text' is not a numeric dtype"):
        da.stencil.map(k, boundary="extend", dtype="text")


def test_scan_state_is_promoted_not_wrapped() -> None:
    s = xr.DataArray(np.full((3, 3), 200, np.uint8), dims=("time", "x"),
                     coords={"time": [0, 1, 2]})
    out = s.stencil.scan(lambda u: jnp.sum(u(time=-1)) + u(time=-1, x=1), boundary="periodic")
    assert out.dtype == np.uint32  # was uint8, wrapped: 144 instead of 400
    np.testing.assert_array_equal(out.values[:, 0], [200, 400, 800])
    half = s.stencil.scan(lambda u: u(time=-1) * 0.5, boundary="periodic")
    assert half.dtype == np.float32  # was uint8, truncated
    np.testing.assert_array_equal(half.values[:, 0], [200, 100, 50])
    cast = s.stencil.scan(lambda u: u(time=-1) * 0.5, boundary="periodic", dtype=np.float64)
    assert cast.dtype == np.float64
    # drop the scalar 'time' label: continuing a coordinate needs dt= (the scan rule)
    step = s.isel(time=0, drop=True).stencil.scan(
        step=lambda st: st.stencil.map(lambda u: u() * 0.5, boundary="periodic"), steps=2)
    assert step.dtype == np.float32  # was cast back to uint8
    np.testing.assert_array_equal(step.values[:, 0], [200, 100, 50])


def test_scan_mesh_state_is_promoted() -> None:
    s = xr.DataArray(np.full(4, 200, np.uint8), dims="x")
    m = s.stencil.mesh(boundary="periodic")
    m[...] = lambda u: u(time=-1) * 0.5
    out = m.scan(dim="time", steps=2)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out.values[:, 0], [200, 100, 50])


P64 = xr.DataArray(np.linspace(0.0, 1.0, 7), dims="x")


def _k(u: Any) -> Any:
    return u(x=1) - u()


@pytest.mark.parametrize("transform", ["jit", "fori_loop", "while_loop"])
def test_float64_narrowed_by_a_transform_warns(transform: str) -> None:
    run = {
        "jit": lambda p: jax.jit(lambda q: q.stencil.map(_k, boundary="extend"))(p),
        "fori_loop": lambda p: lax.fori_loop(
            0, 2, lambda i, q: q.stencil.map(_k, boundary="extend"), p),
        "while_loop": lambda p: lax.while_loop(
            lambda c: c[0] < 2, lambda c: (c[0] + 1, c[1].stencil.map(_k, boundary="extend")),
            (0, p))[1],
    }[transform]
    with pytest.warns(PrecisionWarning, match=r"float64 data became float32 inside a JAX "
                      r"transform.*x64 flag is off.*jax_enable_x64"):
        out = run(P64)
    assert out.dtype == np.float32  # JAX narrowed it at the boundary: said, not silent
    with jax.enable_x64(True):  # the remedy keeps float64
        kept = run(P64)
    assert kept.dtype == np.float64
    steps = 1 if transform == "jit" else 2
    want = P64.values
    for _ in range(steps):
        want = np.r_[want[1:], want[-1]] - want
    np.testing.assert_allclose(np.asarray(kept), want, rtol=1e-15)


def test_float64_outside_transforms_stays_float64() -> None:
    out = P64.stencil.map(_k, boundary="extend")
    assert out.dtype == np.float64 and not jax.config.read("jax_enable_x64")


U0 = xr.DataArray(np.array([1.0, 0.0, 0.0], np.float32), dims="x")


def _blowup(u: Any) -> Any:
    return u(time=-1) * 1e30


def test_check_finite_raises_under_jit() -> None:
    f = jax.jit(lambda u: u.stencil.scan(_blowup, steps=5, check_finite=True,
                                         boundary="periodic"))
    # was: inf returned silently
    with pytest.raises(jax.errors.JaxRuntimeError,
                       match=r"check_finite=True: a NaN or Inf first appeared at position 2"):
        jax.block_until_ready(f(U0))


def test_check_finite_raises_under_fori_loop() -> None:
    def body(i: Any, u: Any) -> Any:
        return u.stencil.scan(_blowup, steps=2, check_finite=True, boundary="periodic",
                              save_every="last").drop_vars("time")

    with pytest.raises(jax.errors.JaxRuntimeError, match=r"check_finite=True"):
        jax.block_until_ready(lax.fori_loop(0, 2, body, U0))


def test_check_finite_quiet_under_jit_when_finite() -> None:
    f = jax.jit(lambda u: u.stencil.scan(lambda u: u(time=-1) * 2, steps=3, check_finite=True,
                                         boundary="periodic"))
    np.testing.assert_array_equal(np.asarray(f(U0))[:, 0], [1, 2, 4, 8])


def test_bfloat16_is_a_float() -> None:
    x = np.arange(6, dtype=np.float32)
    da = xr.DataArray(jnp.asarray(x, jnp.bfloat16), dims="x")
    out = da.stencil.map(lambda u: u(x=1) + u(), boundary="periodic")
    assert out.dtype == jnp.bfloat16  # was: "not numeric"
    np.testing.assert_array_equal(np.asarray(out, np.float32), np.roll(x, -1) + x)
    nan = da.stencil.map(lambda u: u(x=1), boundary="fill")  # default NaN fill
    assert np.isnan(np.asarray(nan, np.float32)[-1])


def test_fill_value_out_of_float32_range_raises() -> None:
    da = xr.DataArray(np.ones(3, np.float32), dims="x")
    with pytest.raises(XStencilError, match=r"fill_value=1e\+300 cannot be stored in float32"):
        da.stencil.map(lambda u: u(x=1), fill_value=1e300)  # was: inf
    assert np.isinf(da.stencil.map(lambda u: u(x=1), fill_value=np.inf).values[-1])


@pytest.mark.parametrize("fill", [Decimal("0.5"), Fraction(1, 2)])
def test_exact_decimal_and_fraction_fill_values(fill: Any) -> None:
    da = xr.DataArray(np.ones(3, np.float32), dims="x")
    out = da.stencil.map(lambda u: u(x=1), fill_value=fill)  # was: a TypeError inside JAX
    np.testing.assert_array_equal(out.values, [1.0, 1.0, 0.5])


@pytest.mark.parametrize("fill", [Decimal("0.1"), Fraction(1, 3)])
def test_inexact_decimal_and_fraction_fill_values_raise(fill: Any) -> None:
    da = xr.DataArray(np.ones(3, np.float32), dims="x")
    with pytest.raises(XStencilError, match=r"fill_value=.* has no exact int or float value"):
        da.stencil.map(lambda u: u(x=1), fill_value=fill)


def test_dask_backed_map_and_scan_follow_the_rule() -> None:
    """The lazy (dask) backend gives the same dtypes and values as memory."""
    pytest.importorskip("dask")
    a = xr.DataArray(np.full((6, 6), 255, np.uint8), dims=("y", "x"))
    k = lambda u: u.sum()  # noqa: E731
    lazy = a.chunk({"y": 3}).stencil.map(k, window={"y": 3, "x": 3}, boundary="reflect")
    mem = a.stencil.map(k, window={"y": 3, "x": 3}, boundary="reflect")
    assert lazy.dtype == mem.dtype == np.uint32
    np.testing.assert_array_equal(lazy.compute().values, _box(a.values))
    cast = a.chunk({"y": 3}).stencil.map(k, window={"y": 3, "x": 3}, boundary="reflect",
                                         dtype=np.float64)
    assert cast.dtype == np.float64 and cast.compute().dtype == np.float64
    s = xr.DataArray(np.full(4, 200, np.uint8), dims="x").chunk({"x": 2})
    out = s.stencil.scan(lambda u: u(time=-1) * 0.5, steps=2, boundary="periodic")
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out.compute().values[:, 0], [200, 100, 50])

"""Property test: the result has the dtype the kernel returns (docs/dtypes.rst).

Random data of every supported dtype, kernels that return other dtypes (a
sum, an ``astype(float32)``, a comparison, a mean, a Python scalar), with and
without an explicit ``dtype=``, through ``map``, a mesh with uncovered points,
``xstencil.kmap`` and a scan, with JAX's x64 flag off and on.  The reference
is plain numpy on the periodic-padded array, computed exactly (int64,
float64, complex128) and cast to the dtype that plain JAX gives the same
expression on a plain array of the data's dtype (the numpy/JAX rule; 64-bit
data evaluated with x64 on, as xstencil keeps it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr
from hypothesis import given, settings

import xstencil

DTYPES = [np.dtype(d) for d in (bool, np.uint8, np.int16, np.float16, jnp.bfloat16,
                                np.float32, np.float64, np.complex64)]


@contextlib.contextmanager
def mode(x64: bool) -> Iterator[None]:
    """Users' promotion rules (the suite runs strict) and the x64 flag."""
    with jax.numpy_dtype_promotion("standard"), jax.enable_x64(x64):
        yield


def _data(dt: np.dtype, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dt.kind == "b":
        return rng.integers(0, 2, n).astype(bool)
    if dt == np.uint8:
        return rng.integers(0, 256, n).astype(dt)  # large enough that sums wrap in uint8
    if dt == np.int16:
        return rng.integers(-30000, 30000, n).astype(dt)
    x = rng.integers(-100, 100, n).astype(np.float64) / 2
    if dt.kind == "c":
        x = x + 1j * rng.integers(-100, 100, n) / 4
    return x.astype(dt)


def _exact(a: np.ndarray) -> np.ndarray:
    """The values in a wide type numpy computes exactly in."""
    if a.dtype.kind in "biu":
        return a.astype(np.int64)
    if a.dtype.kind == "c":
        return a.astype(np.complex128)
    return a.astype(np.float64)


# name -> (kernel on a window of 3 along x, numpy reference on (left, centre, right))
KERNELS: dict[str, tuple[Callable[..., Any], Callable[..., Any]]] = {
    "sum": (lambda u: u.sum(), lambda a, b, c: a + b + c),
    "astype_f32": (lambda u: jnp.real(u(x=1)).astype(jnp.float32) * 3,
                   lambda a, b, c: np.real(c) * 3),
    "compare": (lambda u: u(x=1) != u(x=-1), lambda a, b, c: a != c),
    "mean": (lambda u: u.mean(), lambda a, b, c: (a + b + c) / 3),
    "scalar": (lambda u: 2, lambda a, b, c: np.full(np.shape(b), 2)),
}


def _jax_dtype(name: str, dt: np.dtype, x64: bool) -> np.dtype:
    """The dtype plain JAX gives the kernel's expression on a plain array."""
    kernel = KERNELS[name][0]

    class Plain:  # the window's API on a plain array of 3 values
        def __init__(self, a: Any):
            self.a = a

        def __call__(self, x: int = 0) -> Any:
            return self.a[1 + x]

        def sum(self) -> Any:
            return self.a.sum()

        def mean(self) -> Any:
            return self.a.mean()

    wide = dt.itemsize == 8 or dt == np.complex128
    with jax.numpy_dtype_promotion("standard"), jax.enable_x64(x64 or wide):
        out = jax.eval_shape(lambda a: jnp.asarray(kernel(Plain(a))),
                             jax.ShapeDtypeStruct((3,), dt))
        if out.weak_type:  # a Python scalar takes the data's dtype, as in JAX
            return np.dtype(jnp.result_type(jnp.zeros((), dt),
                                            np.zeros((), out.dtype).item()))
        return np.dtype(out.dtype)


def _tolerance(dt: np.dtype) -> float:
    if dt.kind in "biu":
        return 0.0
    return float(jnp.finfo(dt).eps) * 8


def _check(got: Any, want: np.ndarray, dt: np.dtype) -> None:
    got_dt = np.dtype(got.dtype)
    assert got_dt == dt, (got_dt, dt)
    g = np.asarray(got).astype(np.complex128 if dt.kind == "c" else np.float64)
    w = want.astype(np.complex128 if dt.kind == "c" else np.float64)
    tol = _tolerance(dt)
    np.testing.assert_allclose(g, w, rtol=tol, atol=tol * 100)


def _reference(name: str, x: np.ndarray, dt: np.dtype) -> np.ndarray:
    e = _exact(x)
    want = KERNELS[name][1](np.roll(e, 1), e, np.roll(e, -1))
    if dt.kind == "b" or want.dtype.kind == "b":
        return np.asarray(want).astype(dt)
    return np.asarray(want).astype(np.complex128 if dt.kind == "c" else np.float64)


case = st.tuples(st.sampled_from(DTYPES), st.sampled_from(sorted(KERNELS)),
                 st.integers(3, 9), st.integers(0, 2**31 - 1))
# kmap <-> map: not for Python-scalar kernels.  The array API follows kernex
# exactly (a Python int is int32, or int64 with x64, as kernex gives it), the
# labelled API JAX's weak-type rule (a Python scalar takes the data's dtype);
# docs/kernex.rst and docs/dtypes.rst.  tests/engine/test_kernex_compat.py
# checks kmap's side against kernex.
array_case = st.tuples(st.sampled_from(DTYPES), st.sampled_from(sorted(set(KERNELS) - {"scalar"})),
                       st.integers(3, 9), st.integers(0, 2**31 - 1))
casts = st.sampled_from([None, np.dtype(np.float32), np.dtype(np.int32),
                         np.dtype(np.float64)])


#: x64 off in the fast run, on with the slow tests (each example compiles)
X64 = [pytest.param(False, id="x64_off"),
       pytest.param(True, id="x64_on", marks=pytest.mark.slow)]


@pytest.mark.parametrize("x64", X64)
@settings(max_examples=15)  # each example compiles
@given(c=case, cast=casts)
def test_map_has_the_kernels_dtype(x64: bool, c: tuple[Any, ...], cast: Any) -> None:
    dt, name, n, seed = c
    x = _data(dt, n, seed)
    da = xr.DataArray(x, dims="x", coords={"x": np.arange(n)}, name="v", attrs={"a": 1})
    want_dt = _jax_dtype(name, dt, x64)
    want = _reference(name, x, want_dt)
    if cast is not None and want_dt.kind == "c":
        cast = None  # complex -> real casts are not a numpy/JAX cast to test here
    with mode(x64):
        out = da.stencil.map(KERNELS[name][0], window={"x": 3}, boundary="periodic")
        cast_out = None if cast is None else da.stencil.map(
            KERNELS[name][0], window={"x": 3}, boundary="periodic", dtype=cast)
    _check(out.data, want, want_dt)
    assert out.dims == da.dims and out.name == "v" and out.attrs == {"a": 1}
    if cast_out is not None:  # dtype= casts the kernel's result, as numpy's astype does
        assert np.dtype(cast_out.dtype) == cast
        np.testing.assert_array_equal(np.asarray(cast_out), np.asarray(out).astype(cast))


@pytest.mark.parametrize("x64", X64)
@settings(max_examples=15)  # each example compiles
@given(c=array_case)
def test_kmap_and_map_agree(x64: bool, c: tuple[Any, ...]) -> None:
    dt, name, n, seed = c
    x = _data(dt, n, seed)
    kernel = KERNELS[name][0]
    with mode(x64):
        labelled = xr.DataArray(x, dims="x").stencil.map(kernel, window={"x": 3},
                                                          boundary="periodic")
        arr = xstencil.kmap(kernel_size=(3,), padding="same", relative=True,
                            named_axis={0: "x"})(
            lambda w: kernel(_Relative(w)))(_wrap(x))
    assert np.dtype(arr.dtype) == np.dtype(labelled.dtype)
    want = np.asarray(labelled)[1:-1]
    np.testing.assert_allclose(np.asarray(arr)[1:-1].astype(np.complex128),
                               want.astype(np.complex128), rtol=1e-2)


class _Relative:
    """kmap's relative window seen through the labelled window's calls."""

    def __init__(self, w: Any):
        self.w = w

    def __call__(self, x: int = 0) -> Any:
        return self.w[x]

    def sum(self) -> Any:
        return jnp.stack([self.w[-1], self.w[0], self.w[1]]).sum()

    def mean(self) -> Any:
        return jnp.stack([self.w[-1], self.w[0], self.w[1]]).mean()


def _wrap(x: np.ndarray) -> Any:
    """numpy in: ``jnp.asarray`` would already narrow float64 with x64 off."""
    return x


@pytest.mark.parametrize("x64", X64)
@settings(max_examples=15)  # each example compiles
@given(c=case)
def test_mesh_promotes_kernels_and_kept_input(x64: bool, c: tuple[Any, ...]) -> None:
    """Uncovered points keep the input, so the result holds both: the
    promoted dtype of the input and the kernel's result."""
    dt, name, n, seed = c
    x = _data(dt, n, seed)
    da = xr.DataArray(x, dims="x")
    kdt = _jax_dtype(name, dt, x64)
    with mode(x64 or dt.itemsize == 8):
        want_dt = np.dtype(jnp.result_type(jnp.zeros((), dt), jnp.zeros((), kdt)))
    with mode(x64):
        m = da.stencil.mesh(window={"x": 3}, boundary="periodic")
        m[{"x": slice(1, None)}] = KERNELS[name][0]
        out = m.map()
    assert np.dtype(out.dtype) == want_dt
    ref = _reference(name, x, kdt)
    kept = _exact(x)
    assert np.asarray(out)[0].astype(np.complex128) == pytest.approx(
        complex(kept[0]), rel=_tolerance(want_dt))
    np.testing.assert_allclose(np.asarray(out)[1:].astype(np.complex128),
                               ref[1:].astype(np.complex128), rtol=_tolerance(want_dt) + 1e-2)


SCAN_KERNELS: dict[str, tuple[Callable[..., Any], Callable[[np.ndarray], np.ndarray]]] = {
    "sum3": (lambda u: jnp.sum(u(time=-1, x=-1)) + jnp.sum(u(time=-1)) + jnp.sum(u(time=-1, x=1)),
             lambda p: np.roll(p, 1) + p + np.roll(p, -1)),
    "half": (lambda u: u(time=-1) * 0.5, lambda p: p * 0.5),
    "f32": (lambda u: jnp.real(u(time=-1)).astype(jnp.float32) + 1, lambda p: np.real(p) + 1),
}


@pytest.mark.parametrize("x64", X64)
@settings(max_examples=15)  # each example compiles
@given(dt=st.sampled_from(DTYPES), name=st.sampled_from(sorted(SCAN_KERNELS)),
       seed=st.integers(0, 2**31 - 1))
def test_scan_state_takes_the_promoted_dtype(x64: bool, dt: np.dtype, name: str,
                                             seed: int) -> None:
    """The state (carry) has the promoted dtype of the input and the kernel's
    result: nothing wraps or truncates, and a kernel that keeps the dtype
    keeps it."""
    x = _data(dt, 5, seed)
    if dt.kind in "iu" and name == "sum3":
        x = x // 4  # three steps of 3-point sums stay within int64/uint32
    kernel, ref = SCAN_KERNELS[name]
    u0 = xr.DataArray(x, dims="x")
    with mode(x64):
        out = u0.stencil.scan(kernel, dim="time", steps=3, boundary="periodic")
        wide = x64 or dt.itemsize == 8
        with jax.enable_x64(wide):
            kdt = jax.eval_shape(lambda a: kernel(_TimeWindow(a)),
                                 jax.ShapeDtypeStruct((3,), dt)).dtype
            want_dt = np.dtype(jnp.result_type(jnp.zeros((), dt), jnp.zeros((), kdt)))
            kdt2 = jax.eval_shape(lambda a: kernel(_TimeWindow(a)),
                                  jax.ShapeDtypeStruct((3,), want_dt)).dtype
            want_dt = np.dtype(jnp.result_type(jnp.zeros((), want_dt), jnp.zeros((), kdt2)))
    assert np.dtype(out.dtype) == want_dt
    p = _exact(x)
    states = [p]
    for _ in range(3):
        p = ref(p)
        states.append(p)
    want = np.stack(states)
    got = np.asarray(out)
    tol = _tolerance(want_dt)
    np.testing.assert_allclose(got.astype(np.complex128), want.astype(np.complex128),
                               rtol=tol * 4, atol=tol * 400)


class _TimeWindow:
    def __init__(self, a: Any):
        self.a = a

    def __call__(self, time: int = 0, x: int = 0) -> Any:
        return self.a[1 + x]

"""Adversarial checks of integer window sums: exact results, wrap included.

Integer sums run as exact float64 FFTs on the host (``hostfft.py``), as
runtime integer weights in XLA (``affine.integer_affine``), as integer
separable passes or as loop nests.  Every result here is compared exactly,
dtype included, with a plain numpy reference: the padded array (``np.pad``
with the boundary's mode) summed as shifted slices in int64, then cast to
the result's dtype with ``astype`` (which wraps as the kernel's integer
arithmetic does).  Kernels cast explicitly: the tests run JAX with strict
dtype promotion.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr

import xstencil  # noqa: F401 - registers the accessor
from tests.reference import integer_correlate

pytest.importorskip("numba")

MODES = ["fill", "periodic", "reflect", "symmetric", "extend"]


def _disk(r: int, dtype: Any = np.int32) -> np.ndarray:
    yy, xx = np.mgrid[-r:r + 1, -r:r + 1]
    return (yy**2 + xx**2 <= r * r).astype(dtype)


def _data(dtype: Any, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) < 0.4
    info = np.iinfo(dtype)
    return rng.integers(int(info.min), int(info.max) + 1, shape, dtype=np.int64).astype(dtype)


def _map(a: Any, kernel: Any, k: int | tuple[int, int], mode: Any, *args: Any,
         fill: Any = 0, dims: tuple[str, ...] = ("y", "x"), **kw: Any) -> np.ndarray:
    ky, kx = (k, k) if isinstance(k, int) else k
    opts: dict[str, Any] = {"boundary": mode}
    if mode == "fill":
        opts["fill_value"] = fill
    out = xr.DataArray(a, dims=dims).stencil.map(kernel, *args, window={"y": ky, "x": kx},
                                                 **opts, **kw)
    return np.asarray(out.values)


def _jit_map(a: np.ndarray, kernel: Any, k: int, mode: str, fill: Any = 0) -> np.ndarray:
    opts: dict[str, Any] = {"boundary": mode}
    if mode == "fill":
        opts["fill_value"] = fill

    def run(v: Any) -> Any:
        return xr.DataArray(v, dims=("y", "x")).stencil.map(kernel, window={"y": k, "x": k},
                                                            **opts).data

    return np.asarray(jax.jit(run)(jnp.asarray(a)))


def _same(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    np.testing.assert_array_equal(got, want)


# (data dtype, boundary, field shape, disk radius): odd and prime sizes, every mode
CASES = [
    (np.bool_, "fill", (53, 47), 8),
    (np.uint8, "periodic", (41, 59), 7),
    (np.int8, "reflect", (47, 43), 8),
    (np.uint16, "symmetric", (37, 61), 9),
    (np.int16, "extend", (59, 41), 2),  # a small loop nest
    (np.int32, "fill", (31, 37), 7),
]


@pytest.mark.parametrize(("dtype", "mode", "shape", "r"), CASES)
def test_signed_disk_sums_are_exact_on_both_backends(dtype: Any, mode: str,
                                                     shape: tuple[int, int], r: int) -> None:
    rng = np.random.default_rng(r * 7 + len(mode))
    a = _data(dtype, shape, rng)
    k = 2 * r + 1
    w = (_disk(r) * rng.integers(-3, 4, (k, k))).astype(np.int32)  # zeros, negatives
    fill = True if dtype == np.bool_ else int(_data(dtype, (), rng))

    def kernel(u: Any) -> Any:
        return (u.astype(jnp.int32) * w).sum()

    want = integer_correlate(a, w, mode, fill=int(fill)).astype(np.int32)  # int32 wraps
    for backend in ("loops", "xla"):
        _same(_map(a, kernel, k, mode, fill=fill, backend=backend), want)


def test_sums_past_the_result_dtype_wrap_exactly() -> None:
    rng = np.random.default_rng(1)
    # bool into int16: 700 x up to 253 cells, past 32767
    b = _data(np.bool_, (60, 61), rng)
    w16 = (_disk(9) * 700).astype(np.int16)
    want = integer_correlate(b, w16, "fill", fill=1)
    assert want.max() > 2**15
    got = _map(b, lambda u: (u.astype(jnp.int16) * w16).sum(dtype=jnp.int16), 19, "fill",
               fill=True, backend="loops")
    _same(got, want.astype(np.int16))
    # uint8 into int32 with weights near 2**16: sums past 2**31 (the host FFT's bound holds)
    a = np.full((40, 40), 250, np.uint8)
    a[::3] = rng.integers(0, 256, (14, 40), dtype=np.int64).astype(np.uint8)
    w = (_disk(7) * (70000 + rng.integers(0, 3, (15, 15)))).astype(np.int32)
    want = integer_correlate(a, w, "reflect")
    assert want.max() > 2**31
    for backend in ("loops", "xla"):
        _same(_map(a, lambda u: (u.astype(jnp.int32) * w).sum(), 15, "reflect",
                   backend=backend), want.astype(np.int32))
    # negative sums into an unsigned result
    c = _data(np.int8, (45, 52), rng)
    wu = (_disk(8) * rng.integers(-4, 5, (17, 17))).astype(np.uint32)  # negatives wrap
    got = _map(c.view(np.uint8), lambda u: (u.astype(jnp.uint32) * wu).sum(), 17,
               "symmetric", backend="loops")
    want = integer_correlate(c.view(np.uint8), wu.astype(np.int64), "symmetric")
    _same(got, want.astype(np.uint32))


def test_int8_products_in_int8_wrap_before_the_sum() -> None:
    rng = np.random.default_rng(2)
    a = _data(np.int8, (40, 43), rng)
    w8 = (_disk(4) * rng.integers(-3, 4, (9, 9))).astype(np.int8)
    want = integer_correlate(a, w8, "extend").astype(np.int8)
    for backend in ("loops", "xla"):
        _same(_map(a, lambda u: (u * w8).sum(dtype=jnp.int8), 9, "extend", backend=backend),
              want)
    wu8 = (_disk(4) * rng.integers(0, 9, (9, 9))).astype(np.uint8)
    b = _data(np.uint8, (40, 43), rng)
    pad = np.pad(b.astype(np.int64), 4, mode="reflect")
    want = np.zeros(b.shape, np.int64)
    for i, j in np.ndindex(9, 9):  # each uint8 product wraps at 256 first
        want += (pad[i:i + 40, j:j + 43] * int(wu8[i, j])) % 256
    _same(_map(b, lambda u: (u * wu8).sum(), 9, "reflect", backend="loops"),
          want.astype(np.uint32))


def test_weights_mutated_rebound_or_scaled_by_globals_never_go_stale() -> None:
    rng = np.random.default_rng(3)
    a = _data(np.uint8, (64, 70), rng)
    weights, scale = [_disk(8)], [3]

    def kernel(u: Any) -> Any:
        return (u.astype(jnp.int32) * weights[0]).sum() * scale[0]

    def check() -> None:
        want = (integer_correlate(a, weights[0], "reflect") * scale[0]).astype(np.int32)
        _same(_map(a, kernel, 17, "reflect", backend="loops"), want)

    check()
    weights[0][3, :] = 7  # in place
    check()
    weights[0] = _disk(8) * 2  # rebound
    check()
    scale[0] = -5
    check()
    weights[0] = (_disk(8) * rng.integers(-9, 9, (17, 17))).astype(np.int32)
    check()


def test_globals_rebound_between_calls() -> None:
    rng = np.random.default_rng(4)
    a = _data(np.int16, (50, 46), rng)
    global _W, _K
    _W, _K = _disk(7), 3

    def kernel(u: Any) -> Any:
        return (u.astype(jnp.int32) * _W).sum() * _K

    for backend in ("loops", "xla"):
        _W, _K = _disk(7), 3
        _same(_map(a, kernel, 15, "periodic", backend=backend),
              (integer_correlate(a, _W, "periodic") * 3).astype(np.int32))
        _W, _K = (_disk(7) * rng.integers(-5, 6, (15, 15))).astype(np.int32), -7
        _same(_map(a, kernel, 15, "periodic", backend=backend),
              (integer_correlate(a, _W, "periodic") * -7).astype(np.int32))


_W: np.ndarray = np.zeros((1, 1), np.int32)
_K: int = 0


def test_weights_passed_as_arguments_follow_each_call() -> None:
    rng = np.random.default_rng(5)
    a = _data(np.int16, (57, 61), rng)

    def kernel(u: Any, q: Any) -> Any:
        return (u.astype(jnp.int32) * q).sum()

    for backend in ("loops", "xla"):
        for _ in range(2):
            q = (_disk(7) * rng.integers(-6, 7, (15, 15))).astype(np.int32)
            _same(_map(a, kernel, 15, "periodic", q, backend=backend),
                  integer_correlate(a, q, "periodic").astype(np.int32))


@pytest.mark.parametrize(("k", "dtype", "mode"), [(9, np.uint16, "periodic"),
                                                  (21, np.bool_, "reflect"),
                                                  (23, np.int16, "symmetric")])
def test_under_jit_runtime_integer_weights_are_exact(k: int, dtype: Any, mode: str) -> None:
    rng = np.random.default_rng(k)
    a = _data(dtype, (70, 83), rng)
    w = (_disk(k // 2) * rng.integers(-5, 6, (k, k))).astype(np.int32)
    got = _jit_map(a, lambda u: (u.astype(jnp.int32) * w).sum(), k, mode)
    _same(got, integer_correlate(a, w, mode).astype(np.int32))


@pytest.mark.parametrize(("dtype", "out", "mode", "r", "stride"), [
    (np.int32, np.int32, "periodic", 11, (1, 1)),  # full-range int32: wraps, no float path
    (np.int8, np.int8, "fill", 12, (1, 1)),  # int8 products and sums wrap at 256
    (np.bool_, np.uint16, "symmetric", 15, (2, 3)),
])
def test_windows_over_441_cells_are_exact_integer_convolutions(
        dtype: Any, out: Any, mode: str, r: int, stride: tuple[int, int]) -> None:
    """Over 441 cells an XLA program's integer sum is one integer lax.conv."""
    rng = np.random.default_rng(r)
    k = 2 * r + 1
    a = _data(dtype, (67, 73), rng)
    w = (_disk(r) * rng.integers(-90, 91, (k, k))).astype(out)
    jo = jnp.dtype(out)
    fill = True if dtype == np.bool_ else -7

    def kernel(u: Any) -> Any:
        return (u.astype(jo) * w).sum(dtype=jo)

    want = integer_correlate(a, w.astype(np.int64), mode, fill=int(fill),
                             stride=stride).astype(out)
    st = {"y": stride[0], "x": stride[1]}
    _same(_map(a, kernel, k, mode, fill=fill, stride=st, backend="xla"), want)
    opts: dict[str, Any] = {"fill_value": fill} if mode == "fill" else {}

    def run(v: Any) -> Any:
        return xr.DataArray(v, dims=("y", "x")).stencil.map(
            kernel, window={"y": k, "x": k}, boundary=mode, stride=st, **opts).data

    _same(np.asarray(jax.jit(run)(jnp.asarray(a))), want)


def test_auto_backend_on_prime_fields() -> None:
    """Fields of over 512 x 512 points take the loop backend by default."""
    rng = np.random.default_rng(6)
    a = rng.random((1031, 523)) < 0.3
    w = _disk(15)  # 709 cells, periodic over prime sizes (Bluestein FFTs)
    got = _map(a, lambda u: (u.astype(jnp.int32) * w).sum(), 31, "periodic")
    _same(got, integer_correlate(a, w, "periodic").astype(np.int32))
    b = _data(np.uint8, (511, 769), rng)
    w16 = (_disk(8) * rng.integers(-4, 5, (17, 17))).astype(np.int16)
    want = integer_correlate(b, w16, "fill", fill=1)
    got = _map(b, lambda u: (u.astype(jnp.int16) * w16).sum(dtype=jnp.int16), 17, "fill",
               fill=1)
    _same(got, want.astype(np.int16))


def test_layouts_strides_and_windows_larger_than_the_field() -> None:
    rng = np.random.default_rng(7)
    # dims (x, y) with a window keyed (y, x): the weights follow the window's dims
    a = _data(np.uint8, (53, 67), rng)
    w = (rng.integers(-3, 4, (11, 13)) * (rng.random((11, 13)) < 0.85)).astype(np.int32)
    want = integer_correlate(a.T, w, "symmetric").T.astype(np.int32)
    got = _map(a, lambda u: (u.astype(jnp.int32) * w).sum(), (11, 13), "symmetric",
               dims=("x", "y"), backend="loops")
    _same(got, want)
    # strided, non-contiguous and big-endian data with strides of the output
    base = _data(np.int16, (120, 140), rng).astype(">i2")[::2, 1::2]
    w = (_disk(7) * rng.integers(-4, 5, (15, 15))).astype(np.int32)
    want = integer_correlate(base.astype(np.int16), w, "extend", stride=(2, 3))
    got = _map(base, lambda u: (u.astype(jnp.int32) * w).sum(), 15, "extend",
               stride={"y": 2, "x": 3}, backend="loops")
    _same(got, want.astype(np.int32))
    # a 31 x 31 window over a 7 x 40 field: halos wider than the field
    c = _data(np.uint8, (7, 40), rng)
    w = (_disk(15) * rng.integers(-2, 3, (31, 31))).astype(np.int32)
    for mode in ("periodic", "reflect"):
        _same(_map(c, lambda u: (u.astype(jnp.int32) * w).sum(), 31, mode, backend="loops"),
              integer_correlate(c, w, mode).astype(np.int32))


@pytest.mark.parametrize("dtype", [np.bool_, np.uint8, np.int8, np.uint16, np.int16, np.int32])
def test_plain_sums_have_jax_dtypes_and_cast_with_dtype(dtype: Any) -> None:
    rng = np.random.default_rng(8)
    a = _data(dtype, (33, 35), rng)
    expected = jnp.sum(jnp.zeros(3, dtype)).dtype
    exact = integer_correlate(a, np.ones((17, 17), np.int64), "reflect")
    got = _map(a, lambda u: u.sum(), 17, "reflect", backend="loops")
    _same(got, exact.astype(expected))
    got = _map(a, lambda u: u.sum(), 17, "reflect", backend="xla", dtype="int8")
    _same(got, exact.astype(expected).astype(np.int8))


@pytest.mark.parametrize("op", ["max", "min", "multiply"])
def test_integer_scatter_max_min_multiply_are_not_window_sums(op: str) -> None:
    """Only a scatter-add is a sum: ``.at[].max/.min/.multiply`` of an integer
    window sum was read as affine (one-hot weights gave ``sum(max(0, w) *
    u)`` for ``max(0, sum(w * u))``), a silently wrong result."""
    w = np.array([[1, -1, 1], [-1, 1, -1], [1, -1, 1]], np.int32)  # closed over: runtime

    def kernel(u: Any) -> Any:
        s = (u.astype(jnp.int32) * w).sum()
        start = jnp.zeros(1, jnp.int32) if op != "multiply" else jnp.full(1, 1, jnp.int32) * s
        return getattr(start.at[0], op)(s)[0]

    a = np.array([[1, 5, 1], [5, 0, 5], [1, 5, 1]], np.uint8)
    assert int(kernel(jnp.asarray(a))) == {"max": 0, "min": -16, "multiply": 256}[op]
    rng = np.random.default_rng(17)
    b = _data(np.uint8, (31, 29), rng)
    s = integer_correlate(b, w, "fill")
    want = {"max": np.maximum(s, 0), "min": np.minimum(s, 0), "multiply": s * s}[op]
    for data in (a, b):
        got = _map(data, kernel, 3, "fill", fill=0, backend="xla")
        if data is a:
            assert int(got[1, 1]) == {"max": 0, "min": -16, "multiply": 256}[op]
        else:
            _same(got, want.astype(np.int32))


def test_integer_coefficients_past_2_53_are_exact_in_xla() -> None:
    """linear.weights read integer coefficients in float64: products of
    constants past 2**53 rounded, and once they cancelled back under 2**31
    the dense lowering used wrong weights (27 for 36 here).  Such a kernel
    now keeps the exact lowering."""
    a = np.arange(1, 26, dtype=np.int32).reshape(5, 5)

    def kernel(u: Any) -> Any:  # per cell 4 * u in int32 arithmetic (literal constants)
        return (u * 67108865 * 134217729 - u * 67108864 * 134217731 + u * 3).sum()

    assert int(kernel(jnp.ones((3, 3), jnp.int32))) == 36
    want = (4 * integer_correlate(a, np.ones((3, 3), np.int64), "periodic")).astype(np.int32)
    _same(_map(a, kernel, 3, "periodic", backend="xla"), want)


def test_integer_coefficients_past_2_53_are_exact_on_the_host_fft() -> None:
    """The same on the host FFT, which reads closed-over arrays as constants."""
    rng = np.random.default_rng(9)
    a = _data(np.uint8, (40, 44), rng)
    w = _disk(8)
    big = np.full((17, 17), 2**26 + 1, np.int32)

    def kernel(u: Any) -> Any:
        c = u.astype(jnp.int32)
        # per cell (2**26 + 1)(2**27 + 1) - 2**26 (2**27 + 3) == 1 in int32 arithmetic
        extra = c * big * (2**27 + 1) - c * 2**26 * (2**27 + 3)
        return (c * w).sum() + extra.sum()

    want = integer_correlate(a, w.astype(np.int64) + 1, "reflect").astype(np.int32)
    _same(_map(a, kernel, 17, "reflect", backend="xla"), want)  # runtime weights: exact
    _same(_map(a, kernel, 17, "reflect", backend="loops"), want)

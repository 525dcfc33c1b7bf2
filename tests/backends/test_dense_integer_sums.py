"""Integer window sums over large windows (``linear.integer``, ``dense.py``):
``u.sum()`` over a ``uint8`` image or a ``bool`` mask is an integer sum,
exact and wrapping as the kernel's own arithmetic wraps, lowered as integer
separable passes instead of a term per window cell (31 x 31 at 1024²:
250-290 ms a call before, 1.5-2 ms now).  Checked for exact equality
against numpy's int64 sums cast to the result's dtype (two's complement
wrap), and on what must keep the cell-by-cell lowering.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr

import xstencil  # noqa: F401 - registers the accessor
from tests.reference import integer_correlate as _exact
from tests.spies import recorded
from xstencil._engine import dense
from xstencil._engine.linear import integer, weights

pytest.importorskip("numba")

MODES = ["periodic", "reflect", "symmetric", "extend", "fill"]


@pytest.fixture
def lowered(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The dense lowerings XLA's programs were built with."""
    return recorded(monkeypatch, dense, "correlate", keep=lambda args, out: args[-1])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.bool_])
def test_a_window_sum_of_an_image_is_the_exact_integer_sum(nests: list[int], lowered: list[str],
                                                           mode: str, dtype: Any) -> None:
    rng = np.random.default_rng(30)
    if dtype == np.bool_:
        a = rng.random((45, 52)) < 0.4
    else:
        info = np.iinfo(dtype)
        a = rng.integers(info.min, info.max, (45, 52), endpoint=True).astype(dtype)
    da = xr.DataArray(a, dims=("y", "x"), name="n")
    fill = True if dtype == np.bool_ else 5
    want = _exact(a, np.ones((15, 13), np.int64), mode, int(fill))
    for backend in ("loops", "xla"):
        got = da.stencil.map(lambda u: u.sum(), window={"y": 15, "x": 13}, boundary=mode,
                             fill_value=fill, backend=backend)
        assert np.issubdtype(got.dtype, np.integer) and got.name == "n"
        np.testing.assert_array_equal(got.values, want.astype(got.dtype))
    assert nests == [] and set(lowered) == {"separable"}


def test_sums_that_overflow_wrap_as_the_kernels_own_arithmetic() -> None:
    """int32 and uint32 data whose window sums leave the dtype's range: the
    result is the kernel's, modulo 2**32, on the loops, XLA, and under
    ``jit``; so with x64 on (int64)."""
    rng = np.random.default_rng(31)
    for dtype in (np.int32, np.uint32):
        info = np.iinfo(dtype)
        a = rng.integers(info.max // 4, info.max, (33, 40), endpoint=True).astype(dtype)
        da = xr.DataArray(a, dims=("y", "x"))
        want = _exact(a, np.ones((11, 11), np.int64), "periodic")
        for backend in ("loops", "xla"):
            got = da.stencil.map(lambda u: u.sum(), window={"y": 11, "x": 11},
                                 boundary="periodic", backend=backend)
            assert got.dtype == dtype
            np.testing.assert_array_equal(got.values, want.astype(dtype))
        jitted = jax.jit(lambda x: xr.DataArray(x, dims=("y", "x")).stencil.map(
            lambda u: u.sum(), window={"y": 11, "x": 11}, boundary="periodic").data)(a)
        np.testing.assert_array_equal(np.asarray(jitted), want.astype(dtype))
    with jax.enable_x64(True):
        a = rng.integers(2**40, 2**62, (20, 24)).astype(np.int64)
        got = xr.DataArray(a, dims=("y", "x")).stencil.map(
            lambda u: u.sum(), window={"y": 11, "x": 11}, boundary="reflect")
        want = _exact(a.astype(object), np.ones((11, 11), np.int64), "reflect")
        wrapped = np.array([[int(v) % 2**64 for v in row] for row in want], np.uint64)
        np.testing.assert_array_equal(got.values.view(np.uint64), wrapped)


def test_integer_weights_of_rank_one_with_strides(nests: list[int]) -> None:
    """Integer weights of rank 1 written with Python integers factor into
    integer passes whatever the gcds of their rows; strides subsample."""
    by = (2, 8, 12, 8, 2, 6, 4, 2, 2, 4, 6, 8, 2)
    bx = (3, 6, 3, 9, 3, 6, 3, 3, 12)

    def kernel(u: Any) -> Any:
        return sum(by[i] * bx[j] * u(y=i - 6, x=j - 4).astype(jnp.int32)
                   for i in range(13) for j in range(9))

    rng = np.random.default_rng(32)
    a = rng.integers(0, 256, (40, 50)).astype(np.uint8)
    got = xr.DataArray(a, dims=("y", "x")).stencil.map(
        kernel, window={"y": 13, "x": 9}, boundary="symmetric", stride={"y": 3, "x": 2})
    assert nests == [] and got.dtype == np.int32
    want = _exact(a, np.outer(by, bx), "symmetric", stride=(3, 2))
    np.testing.assert_array_equal(got.values, want.astype(np.int32))


def test_negative_weights_and_bias_of_an_unsigned_sum_wrap_as_the_kernel() -> None:
    """A uint32 sum with negative integer weights (a 9 x 9 table: JAX writes
    ``-3 * x`` on uint32 as a product with 2**32 - 3, beyond
    ``MAX_INTEGER_WEIGHT``, so the kernel keeps its own lowering) and a box
    sum with a negative bias, which takes the dense passes (a negative float
    cast to uint32 is undefined; the lowering casts through int64): every
    value the kernel's own modular arithmetic gives, on both backends."""
    rng = np.random.default_rng(35)
    table = rng.integers(-3, 4, (9, 9))
    rows = tuple(tuple(int(v) for v in r) for r in table)

    def kernel(u: Any) -> Any:
        cells = u.astype(jnp.uint32)
        return sum(rows[i][j] * cells[i, j] for i in range(9) for j in range(9)) - 7

    a = rng.integers(0, 256, (30, 36)).astype(np.uint8)
    want = (_exact(a, table, "reflect") - 7).astype(np.uint32)
    for backend in ("loops", "xla"):
        got = xr.DataArray(a, dims=("y", "x")).stencil.map(
            kernel, window={"y": 9, "x": 9}, boundary="reflect", backend=backend)
        assert got.dtype == np.uint32
        np.testing.assert_array_equal(got.values, want)
    box = xr.DataArray(a, dims=("y", "x")).stencil.map(
        lambda u: 2 * u.sum() - 100000, window={"y": 15, "x": 15}, boundary="periodic",
        backend="xla")
    want = (2 * _exact(a, np.ones((15, 15), np.int64), "periodic") - 100000).astype(np.uint32)
    np.testing.assert_array_equal(box.values, want)


@pytest.mark.parametrize(("kernel", "integral"), [
    (lambda u: u.sum(), True),
    (lambda u: 3 * u.astype(jnp.int32).sum() - 7, True),
    (lambda u: u.sum() // 2, False),  # a division
    (lambda u: (u + u).astype(jnp.int32).sum(), False),  # wraps at 256 first
    (lambda u: (u.astype(jnp.float32) * 0.5).astype(jnp.int32).sum(), False),  # truncates
    (lambda u: jnp.sum(u.astype(jnp.int16) * 3).astype(jnp.int32), False),  # wraps at 2**16
])
def test_only_arithmetic_in_the_results_dtype_is_read_as_an_integer_sum(
        kernel: Any, integral: bool) -> None:
    closed = jax.make_jaxpr(kernel)(jax.ShapeDtypeStruct((9, 9), np.uint8))
    assert integer(closed) is not None
    found = weights(closed, [(9, 9)])
    assert (found is not None) == integral
    if integral:
        cells = np.random.default_rng(33).integers(0, 256, (9, 9)).astype(np.uint8)
        want = int(np.asarray(jax.core.eval_jaxpr(closed.jaxpr, closed.consts, cells)[0]))
        w, bias = found[0]
        assert int(np.sum(w * cells.astype(np.int64)) + bias) == want


def test_integer_factors_are_exact_or_refused() -> None:
    w = np.outer([2, 8, 12, 8, 2], [3, 6, 3])
    f = dense.separable(w.astype(np.float64), integral=True)
    assert f is not None and all(np.array_equal(x, np.round(x)) for x in f)
    np.testing.assert_array_equal(np.multiply.outer(f[0], f[1]), w)
    cube = np.multiply.outer(np.outer([1, 2], [5, 10, 5]), [7, 14])
    g = dense.separable(cube.astype(np.float64), integral=True)
    assert g is not None
    np.testing.assert_array_equal(np.multiply.outer(np.multiply.outer(g[0], g[1]), g[2]), cube)
    assert dense.separable(np.outer([1, 2], [1, 3]) * 0.5, integral=True) is None
    assert dense.choose(np.ones((11, 11)), integral=True) == "separable"
    disk = np.ones((11, 11))
    disk[0, 0] = 0
    assert dense.choose(disk, integral=True) == "slices"  # 120 taps, not rank 1: one sum
    assert dense.choose(disk[:9, :9], integral=True) == "slices"
    big = np.ones((23, 23))
    big[0, 0] = 0
    assert dense.choose(big, integral=True) == "conv"  # 528 taps: over INTEGER_SLICES
    assert dense.choose(big, integral=True, integer_fft=dense.FFT_TAPS) == "fft"  # the host's


def test_a_large_window_that_is_not_rank_one_keeps_the_exact_lowering() -> None:
    yy, xx = np.mgrid[-6:7, -6:7]
    cells = [(int(i), int(j)) for i, j in zip(yy[yy**2 + xx**2 <= 36], xx[yy**2 + xx**2 <= 36],
                                              strict=True)]

    def count(u: Any) -> Any:
        return sum(u(y=i, x=j).astype(jnp.int32) for i, j in cells)

    rng = np.random.default_rng(34)
    a = rng.random((30, 35)) < 0.5
    got = xr.DataArray(a, dims=("y", "x")).stencil.map(
        count, window={"y": 13, "x": 13}, boundary="fill", fill_value=False)
    disk = (yy**2 + xx**2 <= 36).astype(np.int64)
    np.testing.assert_array_equal(got.values, _exact(a, disk, "fill", 0))


def test_the_integer_conv_is_for_the_cpu_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """XLA:CPU's integer convolution is checked exact; a GPU's (cuDNN's) is
    not, so there a large integer window keeps the kernel's own lowering."""
    big = np.ones((23, 23))
    big[0, 0] = 0
    runtime = jax.ShapeDtypeStruct((23, 23), np.int32)
    assert dense.choose(big, integral=True) == "conv"
    assert dense.choose(runtime, integral=True) == "conv"
    monkeypatch.setattr(dense.jax, "default_backend", lambda: "gpu")
    assert dense.choose(big, integral=True) is None
    assert dense.choose(runtime, integral=True) is None
    assert dense.choose(big) == "fft"  # float sums are unchanged

"""Integer window sums with weights closed over (so traced: runtime weights)
in the XLA program: ``affine.integer_affine`` reads the kernel as affine
modulo ``2**bits`` and ``runtime_weights`` takes its weights from one-hot
windows, so the sum is one fused sum of shifted slices of the padded block
(``dense.INTEGER_SLICES``) instead of the kernel's cell-by-cell lowering.
An 81-cell disk over a 1024² bool mask in XLA: 256-277 ms -> 5.4 ms a
call.  Results must be the exact integer sums, wrap included.
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
from tests.spies import recorded
from xstencil._engine import dense
from xstencil._engine.affine import integer_affine

MODES = ["fill", "periodic", "reflect", "symmetric", "extend"]


@pytest.fixture
def lowered(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The dense lowerings XLA's programs were built with."""
    return recorded(monkeypatch, dense, "correlate", keep=lambda args, out: args[-1])


def _disk(r: int, dtype: Any = np.int32) -> np.ndarray:
    yy, xx = np.mgrid[-r:r + 1, -r:r + 1]
    return (yy**2 + xx**2 <= r * r).astype(dtype)


def _data(dtype: Any, shape: tuple[int, int], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype == np.bool_:
        return rng.random(shape) < 0.4
    info = np.iinfo(dtype)
    return rng.integers(info.min, int(info.max) + 1, shape).astype(dtype)


def _map(a: Any, kernel: Any, k: int, mode: str, **kw: Any) -> xr.DataArray:
    opts: dict[str, Any] = {"boundary": mode, "backend": "xla"}
    if mode == "fill":
        opts["fill_value"] = 0
    return xr.DataArray(a, dims=("y", "x")).stencil.map(kernel, window={"y": k, "x": k},
                                                        **opts, **kw)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [np.bool_, np.uint8, np.int16])
def test_a_closed_over_disk_is_one_sum_of_slices(lowered: list[str], mode: str,
                                                 dtype: Any) -> None:
    a = _data(dtype, (47, 53), MODES.index(mode))
    w = _disk(5) * 3 - 1  # signed, not separable
    got = _map(a, lambda u: (u.astype(jnp.int32) * w).sum(), 11, mode)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got.values, integer_correlate(a, w, mode))
    assert lowered == ["slices"]


def test_weights_changed_in_place_give_new_sums_without_a_recompile(lowered: list[str]
                                                                    ) -> None:
    a = _data(np.uint8, (40, 45), 1)
    w = _disk(6)

    def kernel(u: Any) -> Any:
        return (u.astype(jnp.int32) * w).sum() + 7

    first = _map(a, kernel, 13, "reflect")
    np.testing.assert_array_equal(first.values, integer_correlate(a, w, "reflect") + 7)
    w[3, :] = -4
    again = _map(a, kernel, 13, "reflect")
    np.testing.assert_array_equal(again.values, integer_correlate(a, w, "reflect") + 7)
    assert lowered == ["slices"]  # traced once: the weights are the program's inputs


def test_a_sum_past_the_dtype_wraps_as_the_kernel_does() -> None:
    a = _data(np.uint8, (36, 41), 2)
    w = _disk(5, np.int16) * 9  # sums past 32767: int16 wraps

    def kernel(u: Any) -> Any:
        return (u.astype(jnp.int16) * w).sum(dtype=jnp.int16)

    got = _map(a, kernel, 11, "periodic")
    want = integer_correlate(a, w, "periodic")
    assert want.max() > 2**15
    np.testing.assert_array_equal(got.values, want.astype(np.int16))


def test_arithmetic_in_a_narrower_dtype_keeps_the_cell_lowering(lowered: list[str]) -> None:
    a = _data(np.uint8, (30, 33), 3)
    w = _disk(5, np.uint8) * 3  # u * w in uint8 wraps at 256 before the sum widens it

    got = _map(a, lambda u: (u * w).sum(), 11, "periodic")
    p = np.pad(a, 5, mode="wrap")
    want = np.zeros(a.shape, np.int64)
    for i, j in zip(*np.nonzero(w), strict=True):
        want += p[i:i + a.shape[0], j:j + a.shape[1]].astype(np.int64) * int(w[i, j]) % 256
    np.testing.assert_array_equal(got.values, want.astype(got.dtype))
    assert lowered == []


def test_a_division_keeps_the_cell_lowering(lowered: list[str]) -> None:
    a = _data(np.int16, (30, 33), 4)
    w = _disk(5)
    got = _map(a, lambda u: (u.astype(jnp.int32) * w).sum() // 3, 11, "extend")
    np.testing.assert_array_equal(got.values, integer_correlate(a, w, "extend") // 3)
    assert lowered == []


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype, out", [(np.bool_, jnp.int32), (np.int32, jnp.int32),
                                        (np.uint8, jnp.uint8), (np.int16, jnp.int16),
                                        (np.uint16, jnp.uint32)])
def test_a_window_over_the_slices_limit_is_one_integer_conv(lowered: list[str], mode: str,
                                                            dtype: Any, out: Any) -> None:
    """Over ``INTEGER_SLICES`` cells: one exact integer convolution (before:
    the cell lowering, which needs every window at once, 2.3 GiB for a 25 x
    25 window over 1000² int32 outputs, and refused).  Sums past the dtype
    wrap (uint8, int16: random full-range data), negative weights of an
    unsigned sum included."""
    a = _data(dtype, (37, 41), MODES.index(mode) + 20)
    w = _disk(11) * np.where(np.arange(23) % 3 == 0, -2, 1)[:, None]  # 529 cells, some < 0
    assert w.size > dense.INTEGER_SLICES
    got = _map(a, lambda u: (u.astype(out) * w.astype(out)).sum(dtype=out), 23, mode)
    assert got.dtype == np.dtype(out)
    want = integer_correlate(a, w, mode).astype(out)
    np.testing.assert_array_equal(got.values, want)
    assert lowered == ["conv"]


def test_a_large_integer_window_with_a_stride_and_weights_as_an_argument(
        lowered: list[str]) -> None:
    a = _data(np.int32, (61, 58), 31)
    w = np.random.default_rng(3).integers(-3, 4, (25, 25)).astype(np.int32)

    def kernel(u: Any, w: Any) -> Any:
        return (u * w).sum()

    got = _map(a, kernel, 25, "periodic", stride={"y": 3, "x": 2}, w=w)
    np.testing.assert_array_equal(
        got.values, integer_correlate(a, w, "periodic", stride=(3, 2)).astype(np.int32))
    assert lowered == ["conv"]
    w2 = w[::-1].copy()  # new runtime weights: new sums, no retrace needed
    got = _map(a, kernel, 25, "periodic", stride={"y": 3, "x": 2}, w=w2)
    np.testing.assert_array_equal(
        got.values, integer_correlate(a, w2, "periodic", stride=(3, 2)).astype(np.int32))


def test_a_large_integer_window_over_a_3d_field_in_jit(lowered: list[str]) -> None:
    a = _data(np.uint8, (14, 15, 16), 32)
    yy, xx, zz = np.mgrid[-4:5, -4:5, -4:5]
    ball = (yy**2 + xx**2 + zz**2 <= 16).astype(np.int32)  # 9³ = 729 cells
    da = xr.DataArray(jnp.asarray(a), dims=("z", "y", "x"))

    @jax.jit
    def f(u: Any) -> Any:
        return xr.DataArray(u, dims=("z", "y", "x")).stencil.map(
            lambda c: (c.astype(jnp.int32) * ball).sum(), window={"z": 9, "y": 9, "x": 9},
            boundary="reflect").data

    got = np.asarray(f(da.data))
    np.testing.assert_array_equal(got, integer_correlate(a, ball, "reflect").astype(np.int32))
    assert lowered == ["conv"]


def test_under_jit_on_a_jax_array(lowered: list[str]) -> None:
    a = _data(np.int16, (44, 39), 6)
    w = _disk(4)

    @jax.jit
    def count(da: xr.DataArray) -> xr.DataArray:
        return da.stencil.map(lambda u: (u.astype(jnp.int32) * w).sum(),
                              window={"y": 9, "x": 9}, boundary="symmetric")

    got = count(xr.DataArray(jnp.asarray(a), dims=("y", "x")))
    np.testing.assert_array_equal(np.asarray(got.data), integer_correlate(a, w, "symmetric"))
    assert lowered == ["slices"]


def _jaxpr(kernel: Any, *avals: Any) -> Any:
    return jax.make_jaxpr(kernel)(*avals)


@pytest.mark.parametrize(("kernel", "cell", "want"), [
    (lambda u, w: (u.astype(jnp.int32) * w).sum(), np.bool_, np.int32),
    (lambda u, w: (u.astype(jnp.int32) * w).sum() - 3 * u[0, 0].astype(jnp.int32),
     np.uint8, np.int32),
    (lambda u, w: jnp.where(w > 0, u, 0).astype(jnp.int32).sum(), np.int16, np.int32),
    (lambda u, w: (u * w.astype(jnp.uint8)).sum(), np.uint8, None),  # a product in uint8
    (lambda u, w: (u.astype(jnp.int32) * u.astype(jnp.int32)).sum(), np.int16, None),
    (lambda u, w: u.astype(jnp.int16).astype(jnp.int32).sum(), np.int32, None),  # narrows
    (lambda u, w: (u.astype(jnp.int32) * w).sum() // 2, np.uint8, None),
    (lambda u, w: jnp.where(u > 0, w, 0).sum(), np.uint8, None),  # a cell as a predicate
    (lambda u, w: jnp.zeros(4, jnp.int32).at[1].add(u.astype(jnp.int32)[0, 0]).sum(),
     np.uint8, np.int32),  # a scatter-add in the sum's dtype
    (lambda u, w: jnp.zeros(4, jnp.uint8).at[1].add(u[0, 0]).astype(jnp.int32).sum(),
     np.uint8, None),  # a scatter-add in uint8, which wraps apart
    (lambda u, w: (u.astype(jnp.float32) * w.astype(jnp.float32)).sum(), np.uint8,
     None),  # a float result
])
def test_integer_affine_reads_the_kernel(kernel: Any, cell: Any, want: Any) -> None:
    closed = _jaxpr(kernel, jax.ShapeDtypeStruct((3, 3), cell),
                    jax.ShapeDtypeStruct((3, 3), np.int32))
    got = integer_affine(closed, 1)
    assert got == (None if want is None else np.dtype(want))


@pytest.mark.parametrize("r, how", [(10, "slices"), (13, "conv")])
def test_constant_integer_weights_over_fft_taps(lowered: list[str], r: int, how: str) -> None:
    """Weights made inside the kernel are constants of its program: a
    non-separable integer window of more than ``FFT_TAPS`` nonzero cells is
    one sum of slices up to ``INTEGER_SLICES`` of them, else one integer
    convolution (before: the cell lowering, materializing every window)."""
    a = _data(np.int16, (33, 35), 40 + r)
    k = 2 * r + 1

    def kernel(u: Any) -> Any:
        return (u.astype(jnp.int32) * jnp.asarray(_disk(r, np.int32))).sum()

    assert dense.FFT_TAPS < np.count_nonzero(_disk(r)) and (
        np.count_nonzero(_disk(r)) <= dense.INTEGER_SLICES) == (how == "slices")
    got = _map(a, kernel, k, "symmetric")
    np.testing.assert_array_equal(got.values,
                                  integer_correlate(a, _disk(r), "symmetric").astype(np.int32))
    assert lowered == [how]

"""The 'rows' lowering of large dense windows on an accelerator.

Where the lowering is fused (a TPU or GPU; ``XSTENCIL_LOWERING=fused``
forces it here, as CI has no accelerator), a window of 101 to
``dense.ROW_TAPS`` cells that would have been one sum of every cell or an
FFT runs as a ``lax.fori_loop`` over its rows.  On a TPU v5e at 1024² the
FFT of a 15 x 15 window compiled in 16-25 s (46-49 s under a user's ``jit``)
and the loop in about a second.  These tests check the loop against plain
numpy sums: every boundary mode, strides, cells of weight 0 that must not be
read (NaN and inf), runtime weights, integers, float64, 3-D windows,
gradients and ``vmap``; and that the CPU lowering never takes it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr
from jax.test_util import check_grads

import xstencil
from tests.reference import direct_correlate, integer_correlate
from tests.spies import recorded
from xstencil._engine import boundary, dense

MODES = ["fill", "periodic", "reflect", "symmetric", "extend"]


@pytest.fixture
def fused(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The fused lowering, traced anew; yields the dense lowerings that
    XLA's programs were built with."""
    monkeypatch.setenv(boundary.LOWERING_ENV, "fused")
    xstencil.clear_caches()
    yield recorded(monkeypatch, dense, "correlate", keep=lambda args, out: args[-1])
    monkeypatch.delenv(boundary.LOWERING_ENV, raising=False)
    xstencil.clear_caches()


def _disk(r: int) -> np.ndarray:
    yy, xx = np.mgrid[-r:r + 1, -r:r + 1]
    return (yy**2 + xx**2 <= r * r).astype(np.float64)


def _map(a: Any, kernel: Callable[[Any], Any], shape: tuple[int, ...], mode: str,
         **kw: Any) -> xr.DataArray:
    dims = ("z", "y", "x")[-len(shape):]
    opts: dict[str, Any] = {"boundary": mode, "backend": "xla"}
    if mode == "fill":
        opts["fill_value"] = 0.0
    return xr.DataArray(a, dims=dims).stencil.map(kernel, window=dict(zip(dims, shape,
                                                                          strict=True)),
                                                  **opts, **kw)


@pytest.mark.parametrize("mode", MODES)
def test_constant_weights_match_the_direct_sum(x64: None, fused: list[str], mode: str) -> None:
    rng = np.random.default_rng(MODES.index(mode))
    a = rng.standard_normal((37, 44))
    w = rng.standard_normal((15, 13))
    w[3, 4] = 0.0
    got = _map(a, lambda u: (u * w).sum(), w.shape, mode)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got.values, direct_correlate(a, w, mode), rtol=1e-12, atol=1e-12)
    assert fused == ["rows"]


@pytest.mark.parametrize("steps", [(2, 3), (3, 1), (1, 4)])
def test_strides(x64: None, fused: list[str], steps: tuple[int, int]) -> None:
    rng = np.random.default_rng(7)
    a = rng.standard_normal((41, 50))
    w = rng.standard_normal((11, 11))
    got = _map(a, lambda u: (u * w).sum(), w.shape, "reflect",
               stride={"y": steps[0], "x": steps[1]})
    want = direct_correlate(a, w, "reflect", steps=steps)
    np.testing.assert_allclose(got.values, want, rtol=1e-12, atol=1e-12)
    assert fused == ["rows"]


def test_float32_is_kept_and_close(fused: list[str]) -> None:
    rng = np.random.default_rng(3)
    a = rng.standard_normal((64, 64)).astype(np.float32)
    w = rng.standard_normal((31, 31)).astype(np.float32)
    got = _map(a, lambda u: (u * w).sum(), w.shape, "periodic")
    assert got.dtype == np.float32
    scale = np.abs(w).sum() * np.abs(a).max()
    assert np.abs(got.values - direct_correlate(a, w, "periodic")).max() < 4e-7 * scale
    assert fused == ["rows"]


def test_cells_of_weight_zero_are_not_read(x64: None, fused: list[str]) -> None:
    """A disk's corners have weight 0: a NaN or inf there must not reach
    the output (``0 * nan`` would), and infinities give the direct sum's
    signs, NaN where they meet with opposite signs."""
    rng = np.random.default_rng(5)
    a = rng.standard_normal((40, 40))
    w = _disk(7) * rng.uniform(0.5, 1.5, (15, 15))
    w[7, 9] = -w[7, 9]
    a[10, 10] = np.nan
    a[25, 12] = np.inf
    a[30, 30] = -np.inf
    a[25, 14] = -np.inf
    got = _map(a, lambda u: (u * w).sum(), w.shape, "fill").values
    want = direct_correlate(a, w, "fill")
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isposinf(got), np.isposinf(want))
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want))
    ok = np.isfinite(want)
    np.testing.assert_allclose(got[ok], want[ok], rtol=1e-12, atol=1e-12)
    # the NaN's footprint is the disk (the infinities' windows start at row 18)
    assert np.isnan(got[:18, :18]).sum() == np.count_nonzero(w) < w.size
    assert fused == ["rows"]


def test_runtime_weights_under_jit_with_gradients(x64: None, fused: list[str]) -> None:
    """Weights closed over as a JAX array are inputs of the program; the
    loop is differentiated with respect to the data and to them."""
    rng = np.random.default_rng(9)
    a = rng.standard_normal((20, 18))
    w0 = rng.standard_normal((11, 11))

    def run(a: Any, w: Any) -> Any:
        da = xr.DataArray(a, dims=("y", "x"))
        return da.stencil.map(lambda u: (u * w).sum(), window={"y": 11, "x": 11},
                              boundary="symmetric").data

    got = jax.jit(run)(jnp.asarray(a), jnp.asarray(w0))
    np.testing.assert_allclose(np.asarray(got), direct_correlate(a, w0, "symmetric"), rtol=1e-12,
                               atol=1e-12)
    assert fused and set(fused) == {"rows"}
    check_grads(run, (jnp.asarray(a), jnp.asarray(w0)), order=1, modes=("fwd", "rev"),
                atol=1e-7, rtol=1e-7)


def test_vmap_matches_each_item(x64: None, fused: list[str]) -> None:
    rng = np.random.default_rng(11)
    batch = rng.standard_normal((3, 25, 30))
    w = rng.standard_normal((11, 12))

    def one(a: Any) -> Any:
        return _map(a, lambda u: (u * w).sum(), w.shape, "extend").data

    got = np.asarray(jax.vmap(one)(jnp.asarray(batch)))
    for i in range(3):
        np.testing.assert_allclose(got[i], direct_correlate(batch[i], w, "extend"), rtol=1e-12,
                                   atol=1e-12)
    assert "rows" in fused


def test_integer_sums_are_exact(fused: list[str]) -> None:
    rng = np.random.default_rng(13)
    a = rng.integers(0, 256, (33, 41)).astype(np.uint8)
    w = (_disk(6) * 3 - 1).astype(np.int32)  # signed, not separable, 169 cells
    got = _map(a, lambda u: (u.astype(jnp.int32) * w).sum(), w.shape, "reflect")
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got.values, integer_correlate(a, w, "reflect"))
    assert fused == ["rows"]


def test_three_dimensional_window(x64: None, fused: list[str]) -> None:
    rng = np.random.default_rng(17)
    a = rng.standard_normal((12, 14, 16))
    w = rng.standard_normal((5, 5, 5))
    got = _map(a, lambda u: (u * w).sum(), w.shape, "periodic")
    np.testing.assert_allclose(got.values, direct_correlate(a, w, "periodic"), rtol=1e-12,
                               atol=1e-12)
    assert fused == ["rows"]


def test_large_offsets_keep_their_digits(fused: list[str]) -> None:
    """Weights that cancel (a sum of 0) on data with a large offset: the
    loop is centred as the one sum of slices is, so the float32 result
    keeps the local spread's digits."""
    rng = np.random.default_rng(19)
    a = (1e4 + rng.standard_normal((48, 48))).astype(np.float32)
    w = rng.standard_normal((13, 13))
    w -= w.mean()
    got = _map(a, lambda u: (u * w.astype(np.float32)).sum(), w.shape, "extend").values
    want = direct_correlate(a, w.astype(np.float32), "extend")
    spread = np.abs(w).sum() * 5.0  # |a - 1e4| is below 5
    assert np.abs(got - want).max() < 1e-5 * spread  # 1e4 * eps * sum|w| would be 3e-2


def test_the_cpu_lowering_keeps_the_fft_and_small_windows_keep_slices(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(boundary.LOWERING_ENV, "cpu")
    assert dense.fused_rows("fft", np.ones((15, 15))) == "fft"
    monkeypatch.setenv(boundary.LOWERING_ENV, "fused")
    assert dense.fused_rows("fft", np.ones((15, 15))) == "rows"
    assert dense.fused_rows("slices", np.ones((9, 9))) == "slices"  # 81 cells
    assert dense.fused_rows("fft", np.ones((33, 33))) == "fft"  # over ROW_TAPS
    assert dense.fused_rows("separable", np.ones((15, 15))) == "separable"

"""Large and dense constant-weight windows (issue 17): the weights are read
from the jaxpr and the kernel is lowered as separable passes, one sum of
shifted slices or an FFT, with every boundary mode and stride honoured.

References are independent: ``scipy.ndimage.correlate`` and a numpy loop.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.ndimage as ndi
import xarray as xr
from jax.test_util import check_grads

import xstencil  # noqa: F401  (registers the accessor)
from xstencil._engine import dense, linear
from xstencil._engine.boundary import pad

SCIPY = {"fill": "constant", "extend": "nearest", "periodic": "wrap", "reflect": "mirror",
         "symmetric": "reflect"}
SIZES = [3, 5, 9, 15, 21, 31, 63]


def _gauss(k: int) -> np.ndarray:
    g = np.exp(-np.linspace(-2.0, 2.0, k) ** 2)
    return np.outer(g, g)


def _map(a: np.ndarray, kernel: Any, k: int, mode: str, **kw: Any) -> np.ndarray:
    da = xr.DataArray(a, dims=("y", "x"))
    return da.stencil.map(kernel, window={"y": k, "x": k}, boundary=mode, fill_value=0.0,
                          **kw).values


# 4-22 s a case on a loaded 2-core host: every mode at k = 3 and every size in one mode (a
# rotation over the modes) in the fast run; the other 24 pairs with the slow tests
@pytest.mark.parametrize(("mode", "k"), [
    pytest.param(mode, k, id=f"{mode}-{k}",
                 marks=() if k == 3 or (i + j) % len(SCIPY) == 0 else pytest.mark.slow)
    for i, mode in enumerate(SCIPY) for j, k in enumerate(SIZES)])
def test_dense_matches_scipy(x64: None, k: int, mode: str) -> None:
    rng = np.random.default_rng(k)
    a = rng.standard_normal((70, 80))
    w = rng.standard_normal((k, k))
    out = _map(a, lambda u: (u * w).sum(), k, mode)
    ref = ndi.correlate(a, w, mode=SCIPY[mode], cval=0.0)
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, ref, rtol=1e-10, atol=1e-10 * np.abs(w).sum())


@pytest.mark.parametrize("k", SIZES)
@pytest.mark.parametrize("mode", ["fill", "periodic", "symmetric"])
def test_separable_matches_scipy(x64: None, k: int, mode: str) -> None:
    a = np.random.default_rng(1).standard_normal((70, 80))
    w = _gauss(k)
    out = _map(a, lambda u: jnp.sum(w * u), k, mode)
    np.testing.assert_allclose(out, ndi.correlate(a, w, mode=SCIPY[mode], cval=0.0),
                               rtol=1e-10, atol=1e-12)


def _loop(a: np.ndarray, w: np.ndarray, mode: str, steps: tuple[int, int]) -> np.ndarray:
    """The direct sum, one output at a time, on a numpy-padded array."""
    numpy_mode = {"fill": "constant", "extend": "edge", "periodic": "wrap",
                  "reflect": "reflect", "symmetric": "symmetric"}[mode]
    ky, kx = w.shape
    p = np.pad(a, ((ky // 2, ky // 2), (kx // 2, kx // 2)), mode=numpy_mode)
    ny, nx = a.shape
    out = np.empty(((ny - 1) // steps[0] + 1, (nx - 1) // steps[1] + 1))
    for i in range(out.shape[0]):
        for j in range(out.shape[1]):
            y, x = i * steps[0], j * steps[1]
            out[i, j] = np.sum(p[y:y + ky, x:x + kx] * w)
    return out


@pytest.mark.parametrize("k", [9, 15, 31])
@pytest.mark.parametrize("mode", list(SCIPY))
def test_strided_matches_numpy_loop(x64: None, k: int, mode: str) -> None:
    rng = np.random.default_rng(2)
    a = rng.standard_normal((41, 50))
    for w in (rng.standard_normal((k, k)), _gauss(k)):
        out = _map(a, lambda u, w=w: (w * u).sum(), k, mode, stride={"y": 2, "x": 3})
        np.testing.assert_allclose(out, _loop(a, w, mode, (2, 3)), rtol=1e-10, atol=1e-10)


def test_float32_is_kept() -> None:
    a = np.random.default_rng(3).standard_normal((64, 64)).astype(np.float32)
    w = np.random.default_rng(4).standard_normal((15, 15)).astype(np.float32)
    out = _map(a, lambda u: (u * w).sum(), 15, "periodic")
    assert out.dtype == np.float32
    ref = ndi.correlate(a.astype(np.float64), w.astype(np.float64), mode="wrap")
    np.testing.assert_allclose(out, ref, atol=2e-5 * np.abs(w).sum())


def test_sum_of_offset_terms_and_bias(x64: None) -> None:
    """A 1-D window of 41 taps written as ``c * u(x=i)`` terms, plus a constant."""
    c = np.random.default_rng(5).standard_normal(41)

    def kernel(u: Any) -> Any:
        return sum(c[i + 20] * u(x=i) for i in range(-20, 21)) + 1.5

    a = np.random.default_rng(6).standard_normal((12, 90))
    out = xr.DataArray(a, dims=("y", "x")).stencil.map(kernel, boundary="periodic").values
    ref = ndi.correlate1d(a, c, axis=1, mode="wrap") + 1.5
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-12)


def test_weights_reader() -> None:
    """Weights come out of the jaxpr for linear kernels, and only for them."""
    w = np.arange(1.0, 37.0).reshape(6, 6)
    v = np.arange(6.0)

    def weights_of(kernel: Any, *args: Any) -> Any:
        closed = jax.make_jaxpr(kernel)(jnp.zeros((6, 6)), *args)
        return linear.weights(closed, [(6, 6)])

    (found,) = weights_of(lambda u: (u * w).sum() * 2.0 - 3.0)
    np.testing.assert_allclose(found[0], 2 * w)
    np.testing.assert_allclose(found[1], -3.0)
    (found,) = weights_of(lambda u: (u @ v).sum())  # dot_general with a constant
    np.testing.assert_allclose(found[0], np.broadcast_to(v, (6, 6)))
    (found,) = weights_of(lambda u: u[::-1].T[1:4, 2:5].mean())  # structural ops
    np.testing.assert_allclose(found[0], _structural_expect())
    assert weights_of(lambda u: (u * u).sum()) is None  # quadratic
    assert weights_of(lambda u: jnp.sin(u).sum()) is None
    assert weights_of(lambda u, t: (u * t).sum(), jnp.ones((6, 6))) is None  # traced weights


def _structural_expect() -> np.ndarray:
    """Weights of ``u[::-1].T[1:4, 2:5].mean()`` by brute force on unit windows."""
    out = np.zeros((6, 6))
    for i in range(6):
        for j in range(6):
            e = np.zeros((6, 6))
            e[i, j] = 1.0
            out[i, j] = e[::-1].T[1:4, 2:5].mean()
    return out


def test_nonlinear_large_window_still_correct(x64: None) -> None:
    """``(u * u * w).sum()`` is not linear: it keeps the general path."""
    rng = np.random.default_rng(7)
    a = rng.standard_normal((30, 30))
    w = rng.standard_normal((17, 17))
    out = _map(a, lambda u: (u * u * w).sum(), 17, "periodic")
    np.testing.assert_allclose(out, ndi.correlate(a * a, w, mode="wrap"), rtol=1e-10,
                               atol=1e-10)


@pytest.mark.parametrize("how", ["separable", "slices", "conv",
                                 pytest.param("fft", marks=pytest.mark.slow)])  # fft: 30 s
def test_lowerings_agree_and_differentiate(x64: None, how: str) -> None:
    rng = np.random.default_rng(8)
    a = jnp.asarray(rng.standard_normal((9, 11)))
    w = _gauss(5) if how == "separable" else rng.standard_normal((5, 5))

    def f(x: Any) -> Any:
        p = pad(x, [(2, 2), (2, 2)], ["periodic", "periodic"])
        return dense.correlate(p, w, [1, 1], [9, 11], how)

    np.testing.assert_allclose(f(a), ndi.correlate(np.asarray(a), w, mode="wrap"),
                               rtol=1e-10, atol=1e-10)
    check_grads(f, (a,), order=2, modes=["fwd", "rev"], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("k", [9, 15, 31])
def test_map_gradient_through_dense_path(x64: None, k: int) -> None:
    w = np.random.default_rng(k).standard_normal((k, k))

    def fn(a: Any) -> Any:
        return xr.DataArray(a, dims=("y", "x")).stencil.map(
            lambda u: (u * w).sum(), window={"y": k, "x": k}, boundary="symmetric").data

    check_grads(jax.jit(fn), (jnp.asarray(np.random.default_rng(0).standard_normal((20, 24))),),
                order=1, modes=["fwd", "rev"], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("k", [9, 15, 21])
def test_choice_by_cost(k: int) -> None:
    rng = np.random.default_rng(9)
    assert dense.choose(_gauss(k)) == "separable"
    full = rng.standard_normal((k, k))
    assert dense.choose(full) == ("slices" if k * k <= dense.FFT_TAPS else "fft")
    sparse = np.zeros((k, k))
    sparse[k // 2, :] = 1.0
    sparse[:, k // 2] = 1.0  # a cross: 2k - 1 taps, rank 2
    assert dense.choose(sparse) == ("shell" if 2 * k - 1 <= dense.SLICE_TAPS else "slices")


def test_huge_linear_window_runs_instead_of_being_refused(x64: None) -> None:
    """A 241x241 mean (58081 cells) used to be refused; it is a box filter."""
    a = np.random.default_rng(10).standard_normal((100, 100))
    out = _map(a, lambda u: u.mean(), 241, "extend")
    np.testing.assert_allclose(out, ndi.uniform_filter(a, 241, mode="nearest"), rtol=1e-9,
                               atol=1e-12)


@pytest.mark.parametrize("how", ["fft", "slices", "separable"])
@pytest.mark.parametrize("mode", ["fill", "periodic", "extend"])
def test_nans_stay_local(x64: None, mode: str, how: str) -> None:
    """A NaN in the data (or the default NaN fill) spoils only the outputs
    whose windows read it, as in the direct sum; an FFT alone would spread it."""
    rng = np.random.default_rng(11)
    a = rng.standard_normal((60, 70))
    a[30, 40] = np.nan
    w = {"fft": rng.standard_normal((15, 15)), "slices": rng.standard_normal((15, 15))[:9, :9],
         "separable": _gauss(15)}[how]
    w = np.pad(w, (15 - w.shape[0]) // 2)
    assert dense.choose(w) == how
    da = xr.DataArray(a, dims=("y", "x"))
    out = da.stencil.map(lambda u: (u * w).sum(), window={"y": 15, "x": 15},
                         boundary=mode).values  # fill: the default NaN fill_value
    padded = np.pad(a, 7, mode={"fill": "constant", "periodic": "wrap",
                                "extend": "edge"}[mode],
                    **({"constant_values": np.nan} if mode == "fill" else {}))
    ref = np.empty_like(a)
    read = w != 0  # cells with weight 0 are not read (documented)
    for i in range(60):
        for j in range(70):
            ref[i, j] = np.sum(padded[i:i + 15, j:j + 15][read] * w[read])
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
    assert np.isfinite(out).sum() > 0
    ok = np.isfinite(ref)
    np.testing.assert_allclose(out[ok], ref[ok], rtol=1e-9, atol=1e-9)


def test_half_precision_fft_computes_in_float32() -> None:
    a = np.random.default_rng(12).standard_normal((40, 40)).astype(np.float16)
    w = np.random.default_rng(13).standard_normal((15, 15)).astype(np.float16)
    out = _map(a, lambda u: (u * w).sum(), 15, "periodic")
    assert out.dtype == np.float16
    ref = ndi.correlate(a.astype(np.float64), w.astype(np.float64), mode="wrap")
    np.testing.assert_allclose(out.astype(np.float64), ref, rtol=2e-2, atol=0.05)

"""Precision of the dense lowerings on data with a large offset (session 29).

A sum whose terms cancel (an anomaly filter, a Laplacian over a large
window) over float32 temperatures near 280 K: XLA's one sum of shifted
slices (9-100 weights) took it uncentred, its partial sums reaching
``sum(|w|) * 280``, and was off by 0.005 against values near 1 at 9 x 9.
Each output is now summed from the data less its window's centre value
(``xstencil/_engine/dense_centre.py``).  References: ``scipy.ndimage``
in float64 on the same float32 data and weights, and a plain numpy loop
for the non-finite footprint.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.ndimage as ndi
import xarray as xr
from jax.test_util import check_grads

import xstencil
from xstencil._engine import dense

SCIPY = {"extend": "nearest", "periodic": "wrap", "reflect": "mirror",
         "symmetric": "reflect", "fill": "constant"}
MODES = list(SCIPY)
EPS32 = float(np.finfo(np.float32).eps)


def _temps(shape=(40, 36), seed=0, trend=0.0) -> np.ndarray:
    """float32 'temperatures': 280 K, a large-scale trend, noise of order 1."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:shape[0], 0:shape[1]]
    t = 280 + trend * np.sin(y / 7.0) * np.cos(x / 5.0) + rng.standard_normal(shape)
    return t.astype(np.float32)


def _corr(a: np.ndarray, w: np.ndarray, mode: str) -> np.ndarray:
    """The exact window sum in float64 (``fill`` is NaN outside)."""
    a, w = np.asarray(a, np.float64), np.asarray(w, np.float64)
    if mode == "fill":
        return ndi.correlate(a, w, mode="constant", cval=np.nan)
    return ndi.correlate(a, w, mode=SCIPY[mode])


def _direct(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Periodic ``out[j] = sum over w[c] != 0 of w[c] * a[j + c - k // 2]``
    term by term in float64: IEEE's NaN and inf, cells of weight 0 unread."""
    out = np.zeros(a.shape)
    with np.errstate(invalid="ignore"):  # inf - inf: NaN, as the sum gives
        for c in zip(*np.nonzero(w), strict=True):
            shift = [-(ci - k // 2) for ci, k in zip(c, w.shape, strict=True)]
            out = out + float(w[c]) * np.roll(a.astype(np.float64), shift, axis=(0, 1))
    return out


def _array(t: np.ndarray, backend: str) -> tuple[xr.DataArray, str]:
    if backend == "jax-input":  # JAX-backed data: XLA
        return xr.DataArray(jnp.asarray(t), dims=("y", "x")), "auto"
    return xr.DataArray(t, dims=("y", "x")), backend


def _literal(w: np.ndarray):
    """A kernel summing ``c * u(...)`` with each weight a Python float: the
    weights are constants of the program (not a closed-over array)."""
    wc = [((int(i), int(j)), float(w[i, j])) for i, j in zip(*np.nonzero(w), strict=True)]
    k0, k1 = w.shape

    def kern(u):
        return sum(c * u(y=i - k0 // 2, x=j - k1 // 2) for (i, j), c in wc)
    return kern


def _cancelling(k: int) -> np.ndarray:
    """``(u - u()).sum()``'s weights: ones, the centre ``1 - k * k``."""
    w = np.ones((k, k))
    w[k // 2, k // 2] -= k * k
    return w


@pytest.mark.parametrize("k,backend,mode", [(9, "xla", m) for m in MODES] + [
    (5, "xla", "periodic"), (5, "xla", "reflect"), (9, "jax-input", "extend"),
    (9, "loops", "periodic"), (9, "loops", "fill")])
def test_anomaly_sum_on_offset_data_keeps_its_digits(k, backend, mode):
    """``(u - u()).sum()`` on float32 data near 280 K: off by 0.0014 (5 x 5)
    and 0.005 (9 x 9) on XLA before (the loop nest runs the kernel as
    written, differences first, and was exact)."""
    t = _temps()
    da, be = _array(t, backend)
    win = {"y": k, "x": k}
    got = da.stencil.map(lambda u: (u - u()).sum(), window=win, boundary=mode, backend=be)
    ref = _corr(t, _cancelling(k), mode)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(np.isnan(got.values), np.isnan(ref))
    fin = np.isfinite(ref)
    # each difference is exact and the weight sum is 0: only the sum of the
    # anomalies rounds, a few ulps of values up to ~100
    assert np.abs(got.values[fin] - ref[fin]).max() <= 8 * EPS32 * np.abs(ref[fin]).max()


@pytest.mark.parametrize("k,mode", [(9, "periodic"), (9, "reflect"), (9, "fill"),
                                    (5, "symmetric")])
def test_closed_over_cancelling_weights_on_offset_data(k, mode):
    """Runtime weights (a closed-over array), random and summing to about
    0, over data with a 40 K trend: each output centred on its own window,
    so the error is the local spread's.  Uncentred: 2e-4 (5 x 5) and 7e-4
    (9 x 9) against values up to ~30."""
    t = _temps(trend=40.0, seed=1)
    w = np.random.default_rng(k).standard_normal((k, k)).astype(np.float32)
    w -= w.mean()
    da = xr.DataArray(t, dims=("y", "x"))
    got = da.stencil.map(lambda u: (u * w).sum(), window={"y": k, "x": k}, boundary=mode,
                         backend="xla")
    ref = _corr(t, w, mode)
    fin = np.isfinite(ref)
    np.testing.assert_array_equal(np.isfinite(got.values), fin)
    scale = np.abs(w).sum(dtype=np.float64) * 8.0  # |p - r| over a window: noise and trend
    assert np.abs(got.values[fin] - ref[fin]).max() <= 4 * EPS32 * scale


@pytest.mark.parametrize("runtime", [False, True])
def test_weight_sum_is_exact(runtime):
    """Weights whose float32 sum rounds (a 0.1 grid, -1/80 and 1): the
    share ``r * sum(w)`` added back uses their exact sum, so a field that
    is constant at 280 gives ``280 * sum(w)`` to the result's rounding."""
    k = 9
    w = np.full((k, k), -1 / 80, np.float32)
    w[k // 2, k // 2] = 1.0
    w[0, :] = 0.1
    t = np.full((24, 20), 280.0, np.float32)
    t[5, 7] = 281.5
    da = xr.DataArray(t, dims=("y", "x"))
    kern = (lambda u: (u * w).sum()) if runtime else _literal(w)
    got = da.stencil.map(kern, window={"y": k, "x": k}, boundary="periodic", backend="xla")
    ref = _corr(t, w, "periodic")
    assert np.abs(got.values - ref).max() <= 2 * EPS32 * np.abs(ref).max()


def _non_finite(seed: int, last_inf: tuple[int, int]) -> np.ndarray:
    """Offset temperatures with a NaN, an inf, a -inf and a second inf."""
    t = _temps((30, 28), seed=seed)
    t[4, 6] = np.nan
    t[15, 10] = np.inf
    t[17, 12] = -np.inf
    t[last_inf] = np.inf
    return t


@pytest.mark.parametrize("runtime", [False, True])
def test_nan_and_inf_footprint_with_zero_weights(runtime):
    """NaN and inf spoil exactly the outputs whose window holds them under a
    nonzero weight (a cell of weight 0 is not read), with the centring:
    the reference value is never a non-finite cell."""
    k = 9
    w = (np.random.default_rng(2).random((k, k)) + 0.5).astype(np.float32)
    w[::3, ::2] = 0  # zero weights, including the centre column's cells
    w[k // 2, k // 2] = 0
    t = _non_finite(3, (25, 20))
    da = xr.DataArray(t, dims=("y", "x"))
    kern = (lambda u: (u * w).sum()) if runtime else _literal(w)
    got = da.stencil.map(kern, window={"y": k, "x": k}, boundary="periodic", backend="xla")
    ref = _direct(t, w)
    for test in (np.isnan, np.isposinf, np.isneginf):
        np.testing.assert_array_equal(test(got.values), test(ref))
    fin = np.isfinite(ref)
    np.testing.assert_allclose(got.values[fin], ref[fin], rtol=4 * EPS32)


def test_huge_values_do_not_overflow_by_the_centring():
    """Where the reference value is huge, ``p - r`` or ``r * sum(w)`` could
    overflow where the plain sum does not: such outputs are summed plain."""
    k = 9
    w = np.random.default_rng(4).random((k, k)).astype(np.float32)
    w /= w.sum()
    t = np.full((24, 22), 2e38, np.float32)
    t[:, 11:] = -3e38
    da = xr.DataArray(t, dims=("y", "x"))
    got = da.stencil.map(lambda u: (u * w).sum(), window={"y": k, "x": k},
                         boundary="periodic", backend="xla")
    ref = _corr(t, w, "periodic")
    assert np.isfinite(ref).all()
    assert np.isfinite(got.values).all()
    np.testing.assert_allclose(got.values, ref, rtol=1e-5, atol=1e33)


def test_integer_sums_are_untouched():
    """An integer sum is exact and wrapping: not centred."""
    k = 9
    a = np.random.default_rng(5).integers(-2**30, 2**30, (20, 18)).astype(np.int32)
    da = xr.DataArray(a, dims=("y", "x"))
    got = da.stencil.map(lambda u: (u - u()).sum(), window={"y": k, "x": k},
                         boundary="periodic", backend="xla")
    want = _direct(a, _cancelling(k))  # float64, exact below 2**53
    want = ((want.astype(np.int64) + 2**31) % 2**32 - 2**31).astype(np.int32)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got.values, want)


@pytest.mark.slow
@pytest.mark.parametrize("runtime", [False, True])
def test_centred_slices_gradients(runtime):
    """The centring is the same function of the data: derivatives through
    the centred sum are the plain sum's (``check_grads``, float64)."""
    k = 5
    w64 = np.random.default_rng(6).standard_normal((k, k))
    with jax.enable_x64(True):
        t = jnp.asarray(_temps((12, 11)).astype(np.float64))
        if runtime:
            def f(x, w):
                da = xr.DataArray(x, dims=("y", "x"))
                return da.stencil.map(lambda u: (u * w).sum(), window={"y": k, "x": k},
                                      boundary="reflect").data
            check_grads(f, (t, jnp.asarray(w64)), order=1, modes=["rev"], eps=1e-3)
        else:
            def g(x):
                da = xr.DataArray(x, dims=("y", "x"))
                return da.stencil.map(lambda u: (u - u()).sum(), window={"y": k, "x": k},
                                      boundary="reflect").data
            check_grads(g, (t,), order=1, modes=["fwd", "rev"], eps=1e-3)


def test_slices_lowering_is_the_one_tested(monkeypatch):
    """The tests above run the one sum of slices: the plan of
    ``(u - u()).sum()`` over 9 x 9 is 'slices'."""
    seen = []
    real = dense.choose

    def spy(w, *a, **kw):
        out = real(w, *a, **kw)
        seen.append(out)
        return out

    monkeypatch.setattr(dense, "choose", spy)
    xstencil.clear_caches()
    da = xr.DataArray(_temps((20, 18), seed=8), dims=("y", "x"))
    da.stencil.map(lambda u: (u - u()).sum(), window={"y": 9, "x": 9}, backend="xla")
    da.stencil.map(lambda u: (u * _cancelling(9)).sum(), window={"y": 9, "x": 9},
                   backend="xla")
    assert seen == ["slices", "slices"]


# --- separable weights: float32 Gaussians, and centred passes -------------------------

def _gauss_1d(k: int, s: float, dtype) -> np.ndarray:
    x = (np.arange(k) - k // 2).astype(dtype)
    g = np.exp(-x * x / dtype(2 * s * s)).astype(dtype)
    return (g / g.sum()).astype(dtype)


def _gaussians(k: int, s: float, dtype) -> dict[str, np.ndarray]:
    """2-D Gaussian weights built the ways users build them, in ``dtype``."""
    g = _gauss_1d(k, s, dtype)
    x = (np.arange(k) - k // 2).astype(dtype)
    yy, xx = np.meshgrid(x, x, indexing="ij")
    two_d = np.exp(-(xx * xx + yy * yy) / dtype(2 * s * s)).astype(dtype)
    delta = np.zeros((k, k), dtype)
    delta[k // 2, k // 2] = 1
    out = {"np.outer": np.outer(g, g), "2-D exp": (two_d / two_d.sum()).astype(dtype),
           "ndimage": ndi.gaussian_filter(delta, s, truncate=(k // 2) / s)}
    if dtype == np.float32:  # x64 off: jnp computes in float32
        gj = jnp.exp(-jnp.asarray(x) ** 2 / (2 * s * s))
        out["jnp.outer"] = np.asarray(jnp.outer(gj / gj.sum(), gj / gj.sum()))
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("k,s", [(9, 1.5), (15, 2.5), (31, 5.0)])
def test_gaussians_are_separable(k, s, dtype):
    """Before, a float32 Gaussian was not rank 1 to 1e-12 and ran as 81
    slices (9 x 9) or an FFT; each construction is separable now, for a
    sum in its own dtype."""
    for name, w in _gaussians(k, s, dtype).items():
        assert dense.choose(np.asarray(w, np.float64), dtype=np.dtype(dtype)) == "separable", name


def test_near_rank_one_weights_beyond_rounding_are_not_separable():
    """A deviation from rank 1 larger than the sum's rounding keeps the
    direct sum: up to 1e-5 relative per cell in float32, 5e-13 in float64
    (off the pivot's row and column, so that the factors are exact: the
    former per-cell 1e-12 tolerance accepted it, and the answer was off by
    270-670 float64 ulps)."""
    g = _gauss_1d(9, 1.5, np.float64)
    noise = np.abs(np.random.default_rng(12).uniform(-1, 1, (9, 9)))
    noise[4, :] = noise[:, 4] = 0
    for dtype, size in ((np.float32, 1e-5), (np.float64, 5e-13)):
        w = np.outer(g, g) * (1 + size * noise)
        assert dense.choose(w, dtype=np.dtype(dtype)) != "separable"
    # and the float64 map gives the 2-D sum to float64's rounding
    w = np.outer(g, g) * (1 + 5e-13 * noise)
    with jax.enable_x64(True):
        t = 280 + np.random.default_rng(13).standard_normal((20, 18))
        got = xr.DataArray(t, dims=("y", "x")).stencil.map(
            _literal(w), window={"y": 9, "x": 9}, boundary="periodic", backend="xla")
    ref = _corr(t, w, "periodic")
    assert np.abs(got.values - ref).max() <= 8 * np.finfo(np.float64).eps * np.abs(ref).max()
    w = np.outer(g, g)
    w[0, 0] = 0.0  # a zero the product does not have: the passes would read it
    assert dense.choose(w, dtype=np.dtype(np.float32)) != "separable"


@pytest.mark.parametrize("backend,mode", [("xla", m) for m in MODES] + [
    ("jax-input", "reflect"), ("loops", "periodic"), ("loops", "fill")])
def test_float32_gaussian_blur_matches_the_2d_sum(backend, mode):
    """A float32 Gaussian (constant weights in the kernel) over offset data,
    now by separable passes: within a few ulps of the exact 2-D sum with
    the same float32 weights."""
    k = 15
    w = _gaussians(k, 2.5, np.float32)["np.outer"]
    t = _temps(seed=9, trend=40.0)
    da, be = _array(t, backend)
    got = da.stencil.map(_literal(w), window={"y": k, "x": k}, boundary=mode, backend=be)
    ref = _corr(t, w, mode)
    np.testing.assert_array_equal(np.isnan(got.values), np.isnan(ref))
    fin = np.isfinite(ref)
    assert np.abs(got.values[fin] - ref[fin]).max() <= 4 * EPS32 * np.abs(ref[fin]).max()


def _derivative(k: int, kind: str) -> np.ndarray:
    """Separable weights whose terms cancel: a binomial smoothing times a
    binomial derivative (dyadic, exactly rank 1 in any dtype), or a float32
    derivative of a Gaussian."""
    if kind == "binomial":
        b = np.array([1.0])
        for _ in range(k - 1):
            b = np.convolve(b, [1.0, 1.0])
        d = np.convolve(b[:-1] if k > 1 else b, [1.0, -1.0])  # a binomial difference
        return np.outer(b / b.sum(), d / np.abs(d).sum())
    x = np.arange(k) - k // 2
    g = np.exp(-x ** 2 / 8.0)
    return np.outer(g / g.sum(), -x * g / g.sum()).astype(np.float32)


@pytest.mark.parametrize("k,kind,mode", [(9, "binomial", m) for m in
                                         ("periodic", "reflect", "extend", "fill")] + [
    (9, "gauss", "symmetric"), (15, "gauss", "fill")])
def test_separable_passes_are_centred(k, kind, mode):
    """Separable weights whose terms cancel (a smoothed derivative) over data
    near 280 K: the uncentred passes (the binomial 9 x 9, separable before)
    and the uncentred slices (the float32 Gaussian's, not separable before)
    were off by 1.2e-5 to 1.5e-5 against values near 1; centred passes, by
    the local spread's rounding (3e-7 to 4e-7)."""
    w = _derivative(k, kind)
    assert dense.choose(w.astype(np.float64), dtype=np.dtype(np.float32)) == "separable"
    t = _temps(seed=10)
    da = xr.DataArray(t, dims=("y", "x"))
    got = da.stencil.map(_literal(w), window={"y": k, "x": k}, boundary=mode, backend="xla")
    ref = _corr(t, w, mode)
    fin = np.isfinite(ref)
    np.testing.assert_array_equal(np.isfinite(got.values), fin)
    # a few roundings of the local spread (noise of order 1, a few sigma) times sum|w|
    assert np.abs(got.values[fin] - ref[fin]).max() <= 2 * EPS32 * np.abs(w).sum() * 8


def test_separable_nan_and_inf_footprint():
    """NaN and inf through the centred passes (a binomial derivative, with
    a column of zero weights): the outputs whose window holds them under a
    nonzero weight, with the sign of an infinity, NaN where infinities of
    both signs meet."""
    k = 9
    w = _derivative(k, "binomial")
    w[:, 4] = 0.0
    assert dense.choose(w, dtype=np.dtype(np.float32)) == "separable"
    t = _non_finite(11, (25, 21))
    da = xr.DataArray(t, dims=("y", "x"))
    got = da.stencil.map(_literal(w), window={"y": k, "x": k}, boundary="periodic",
                         backend="xla")
    ref = _direct(t, w)
    for test in (np.isnan, np.isposinf, np.isneginf):
        np.testing.assert_array_equal(test(got.values), test(ref))
    fin = np.isfinite(ref)
    np.testing.assert_allclose(got.values[fin], ref[fin], rtol=4 * EPS32)


@pytest.mark.slow
def test_separable_centred_gradients():
    """Derivatives through the centred passes are the passes' (float64)."""
    k = 9
    g = _gauss_1d(k, 1.5, np.float64)
    w = np.outer(g, np.arange(k) - 4.0 + g)
    assert dense.choose(w, dtype=np.dtype(np.float64)) == "separable"
    with jax.enable_x64(True):
        t = jnp.asarray(_temps((14, 13)).astype(np.float64))

        def f(x):
            da = xr.DataArray(x, dims=("y", "x"))
            return da.stencil.map(_literal(w), window={"y": k, "x": k},
                                  boundary="symmetric").data
        check_grads(f, (t,), order=1, modes=["fwd", "rev"], eps=1e-3)


@pytest.mark.parametrize("kind,mode", [("slices", "periodic"), ("slices", "fill"),
                                       ("runtime", "reflect"), ("separable", "extend")])
def test_centred_sums_with_strides(kind, mode):
    """A strided output (``stride={'y': 2, 'x': 3}``): each output's reference
    is its own window's centre, read with the same strides as the terms."""
    k = 9
    w = _cancelling(k) if kind != "separable" else _derivative(k, "binomial")
    t = _temps((41, 50), seed=15, trend=40.0)
    da = xr.DataArray(t, dims=("y", "x"))
    kern = (lambda u: (u * w.astype(np.float32)).sum()) if kind == "runtime" else _literal(w)
    got = da.stencil.map(kern, window={"y": k, "x": k}, boundary=mode, backend="xla",
                         stride={"y": 2, "x": 3})
    ref = _corr(t, w, mode)[::2, ::3]
    assert got.shape == ref.shape
    fin = np.isfinite(ref)
    np.testing.assert_array_equal(np.isfinite(got.values), fin)
    assert np.abs(got.values[fin] - ref[fin]).max() <= 4 * EPS32 * np.abs(w).sum() * 8

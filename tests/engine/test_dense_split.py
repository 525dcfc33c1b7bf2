"""Large window sums under a non-linear function (issue 17, ``dense_split``):
``max(sum(w * u), 0)``, a gradient magnitude of two large windows, an
unsharp mask with a threshold.  The sums are lowered densely and the rest
applied point by point; the references are independent
(``scipy.ndimage.correlate`` in float64, then numpy), and the cell-by-cell
lowering of the same kernel (the split switched off) must agree.
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
from xstencil._engine import dense_split

SCIPY = {"extend": "nearest", "periodic": "wrap", "reflect": "mirror", "symmetric": "reflect"}
RNG = np.random.default_rng(7)
K = 15
W = RNG.random((K, K)) + 0.1  # not separable: the FFT lowering
GX = np.tile(np.linspace(-1.0, 1.0, 11), (11, 1))
GY = GX.T.copy()


def _data(dtype, shape=(40, 33)) -> xr.DataArray:
    return xr.DataArray(RNG.random(shape).astype(dtype), dims=("y", "x"),
                        coords={"y": np.arange(shape[0]), "x": 0.5 * np.arange(shape[1])},
                        name="t", attrs={"units": "K"})


def _corr(a: np.ndarray, w: np.ndarray, mode: str) -> np.ndarray:
    if mode == "fill":
        return ndi.correlate(a.astype(np.float64), w, mode="constant", cval=np.nan)
    return ndi.correlate(a.astype(np.float64), w, mode=SCIPY[mode])


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each lowering of a kernel took the split (True) or not."""
    taken: list[bool] = []
    original = dense_split.lower

    def counting(*args, **kwargs):
        out = original(*args, **kwargs)
        taken.append(out is not None)
        return out

    monkeypatch.setattr(dense_split, "lower", counting)
    return taken


# every mode on XLA, periodic on the loops in the fast run (4-23 s a case, loaded 2 cores)
@pytest.mark.parametrize(("backend", "mode"), [
    pytest.param(backend, mode, id=f"{backend}-{mode}",
                 marks=() if backend == "xla" or mode == "periodic" else pytest.mark.slow)
    for backend in ("xla", "loops")
    for mode in ("extend", "periodic", "reflect", "symmetric", "fill")])
def test_relu_of_a_dense_sum_matches_scipy(mode, backend, spy):
    xstencil.clear_caches()
    a = _data(np.float32)
    w = W.astype(np.float32)
    half = np.float32(0.5 * w.sum())
    out = a.stencil.map(lambda u: jnp.maximum((u * w).sum() - half, 0), window={"y": K, "x": K},
                        boundary=mode, backend=backend)
    ref = np.maximum(_corr(a.values, W, mode) - float(half), 0)
    assert out.dtype == np.float32 and out.attrs == a.attrs and out.name == "t"
    np.testing.assert_array_equal(out.x.values, a.x.values)
    np.testing.assert_array_equal(np.isnan(out.values), np.isnan(ref))
    np.testing.assert_allclose(out.values, ref, rtol=2e-6, atol=2e-5 * float(w.sum()))
    assert spy and spy[-1]


def test_float64_stays_float64_and_matches(x64, spy):
    xstencil.clear_caches()
    a = _data(np.float64)
    out = a.stencil.map(lambda u: jnp.tanh((u * W).sum() / 40.0) + u() ** 2,
                        window={"y": K, "x": K}, boundary="periodic", backend="xla")
    ref = np.tanh(_corr(a.values, W, "periodic") / 40.0) + a.values ** 2
    assert out.dtype == np.float64
    np.testing.assert_allclose(out.values, ref, rtol=1e-12, atol=1e-12)
    assert spy[-1]


def test_gradient_magnitude_of_two_windows(spy):
    a = _data(np.float32, (50, 47))
    gx, gy = GX.astype(np.float32), GY.astype(np.float32)
    out = a.stencil.map(lambda u: jnp.sqrt((u * gx).sum() ** 2 + (u * gy).sum() ** 2),
                        window={"y": 11, "x": 11}, boundary="reflect", backend="xla")
    ref = np.hypot(_corr(a.values, GX, "reflect"), _corr(a.values, GY, "reflect"))
    np.testing.assert_allclose(out.values, ref, rtol=1e-5, atol=1e-4)
    assert spy[-1]


def test_same_numbers_as_the_cell_by_cell_lowering(monkeypatch, spy):
    a = _data(np.float32, (24, 22))
    w = W[:7, :7].astype(np.float32)

    def kernel(u):
        s = (u * w).sum()
        return jnp.where(s > u() * 20, s, -s) * u(x=1)

    split = a.stencil.map(kernel, window={"y": 7, "x": 7}, boundary="extend", backend="xla")
    assert spy[-1]
    xstencil.clear_caches()
    monkeypatch.setattr(dense_split, "SPLIT_CELLS", 10**9)
    whole = a.stencil.map(kernel, window={"y": 7, "x": 7}, boundary="extend", backend="xla")
    assert not spy[-1]
    np.testing.assert_allclose(split.values, whole.values, rtol=1e-5, atol=1e-4)


def test_vector_cut_and_a_coordinate(spy):
    """A ``dot`` giving two sums at once, and the kernel reading a coordinate
    (a cut of its own, not a float window sum of the data)."""
    a = _data(np.float32, (26, 24))
    m = np.stack([W[:7, :7].ravel(), GX[:7, :7].ravel()], axis=1).astype(np.float32)

    def kernel(u):
        two = u.reshape(-1) @ m
        return jnp.abs(two[0]) * jnp.sign(two[1]) + u.coord("x")()

    out = a.stencil.map(kernel, window={"y": 7, "x": 7}, boundary="periodic", backend="xla")
    s0 = _corr(a.values, W[:7, :7], "periodic")
    s1 = _corr(a.values, GX[:7, :7], "periodic")
    ref = np.abs(s0) * np.sign(s1) + a.x.values[None, :]
    np.testing.assert_allclose(out.values, ref, rtol=1e-5, atol=1e-4)
    assert spy[-1]


def test_stride_and_integer_data():
    a = xr.DataArray(RNG.integers(0, 255, (41, 37), dtype=np.uint8), dims=("y", "x"))
    w = (W[:9, :9] / W[:9, :9].sum()).astype(np.float32)
    out = a.stencil.map(lambda u: jnp.floor((u.astype(jnp.float32) * w).sum()),
                        window={"y": 9, "x": 9}, boundary="reflect", stride={"y": 2, "x": 3},
                        backend="xla")
    full = np.floor(_corr(a.values.astype(np.float64), W[:9, :9] / W[:9, :9].sum(), "reflect"))
    got = out.values
    assert out.dtype == np.float32 and got.shape == full[::2, ::3].shape
    # a floor may tip where the sum is within rounding of an integer
    assert np.mean(got == full[::2, ::3]) > 0.99


def test_median_window_is_not_cut(spy):
    """A sort of the window cuts every cell: no split, the general lowering."""
    a = _data(np.float32, (20, 20))
    out = a.stencil.map(lambda u: jnp.median(u), window={"y": 5, "x": 5}, boundary="extend",
                        backend="xla")
    np.testing.assert_allclose(out.values, ndi.median_filter(a.values, 5, mode="nearest"))
    assert not any(spy)


def test_gradient_through_the_split(x64):
    a = RNG.random((12, 11))
    w = W[:5, :5]

    def loss(data):
        da = xr.DataArray(data, dims=("y", "x"))
        out = da.stencil.map(lambda u: jax.nn.softplus((u * w).sum() - 4.0) * u(),
                             window={"y": 5, "x": 5}, boundary="periodic", backend="xla")
        return jnp.sum(out.data ** 2)

    check_grads(loss, (a,), order=1, modes=["rev"], atol=1e-6, rtol=1e-6)


def test_dataset_fields_and_dask_blocks(spy):
    pytest.importorskip("dask")
    ds = xr.Dataset({"a": _data(np.float32, (36, 30)), "b": _data(np.float32, (36, 30))})
    w = W[:9, :9].astype(np.float32)
    kern = lambda s: jnp.maximum((s["a"] * w).sum(), s["b"]() * 25)  # noqa: E731
    out = ds.stencil.map(kern, window={"y": 9, "x": 9}, boundary="periodic", backend="xla")
    ref = np.maximum(_corr(ds.a.values, W[:9, :9], "periodic"), ds.b.values * 25)
    np.testing.assert_allclose(out.values, ref, rtol=1e-5, atol=1e-3)
    lazy = ds.chunk({"y": 18}).stencil.map(kern, window={"y": 9, "x": 9}, boundary="periodic")
    np.testing.assert_allclose(lazy.compute().values, ref, rtol=1e-5, atol=1e-3)
    assert any(spy)


def test_a_full_sum_is_cut_whole(monkeypatch):
    """``u() - (u * g).sum()`` is linear, but cut there it would be one
    window of 81 weights; the Gaussian sum is cut whole and stays separable
    passes, the difference taken point by point.  (The weights are built in
    the kernel, so they are constants: weights closed over are inputs of the
    program, which are never separated.)"""
    from xstencil._engine import dense

    hows: list[str] = []
    original = dense.correlate

    def recording(p, w, steps, counts, how):
        hows.append(how)
        return original(p, w, steps, counts, how)

    monkeypatch.setattr(dense, "correlate", recording)
    g = np.array([1.0, 8.0, 28.0, 56.0, 70.0, 56.0, 28.0, 8.0, 1.0]) / 256  # binomial
    gauss = np.outer(g, g).astype(np.float32)  # exact in float32: exactly rank 1
    a = _data(np.float32, (30, 26))

    table = gauss.tolist()

    def unsharp(u):
        detail = u() - (u * jnp.asarray(table, dtype=jnp.float32)).sum()
        return u() + jnp.where(jnp.abs(detail) > 0.05, 1.5 * detail, 0.0)

    out = a.stencil.map(unsharp, window={"y": 9, "x": 9}, boundary="reflect", backend="xla")
    detail = a.values - _corr(a.values, gauss.astype(np.float64), "reflect")
    ref = a.values + np.where(np.abs(detail) > 0.05, 1.5 * detail, 0.0)
    assert "separable" in hows and "slices" not in hows
    close = np.abs(np.abs(detail) - 0.05) > 1e-5  # a threshold met within rounding may tip
    np.testing.assert_allclose(out.values[close], ref[close], rtol=1e-5, atol=1e-5)


def test_effects_zero_size_fill_gathers_and_many_sums_are_not_cut(spy):
    """Kernels the cut would change or slow down keep the general lowering:
    a ``jax.debug.callback`` (it runs at every point, as written), a zero-size
    value, an out-of-bounds ``jnp.take`` (it reads the fill value, NaN), and
    more than ``SPLIT_VALUES`` small sums (each a correlation compiled apart)."""
    a = _data(np.float32, (8, 9))
    w = W[:5, :5].astype(np.float32)
    calls: list[int] = []

    def noisy(u):
        s = (u * w).sum()
        jax.debug.callback(lambda v: calls.append(1), s)
        return jnp.maximum(s, 12.0)

    out = a.stencil.map(noisy, window={"y": 5, "x": 5}, boundary="periodic", backend="xla")
    jax.block_until_ready(out.data)
    assert len(calls) == a.size and not spy[-1]
    ref = np.maximum(_corr(a.values, W[:5, :5], "periodic"), 12.0)
    np.testing.assert_allclose(out.values, ref, rtol=1e-5)

    empty = a.stencil.map(lambda u: jnp.maximum((u * w).sum(), 1.0)
                          + jnp.max(jnp.asarray(u)[0:0], initial=0.0),
                          window={"y": 5, "x": 5}, boundary="periodic", backend="xla")
    np.testing.assert_allclose(empty.values, np.maximum(_corr(a.values, W[:5, :5],
                                                              "periodic"), 1.0), rtol=1e-5)

    past = a.stencil.map(lambda u: jnp.maximum(jnp.take(u.reshape(-1) * w.reshape(-1),
                                                        jnp.arange(0, 30, 3)).sum(), 1.0),
                         window={"y": 5, "x": 5}, boundary="periodic", backend="xla")
    assert np.isnan(past.values).all()

    small = np.ones((3, 3), np.float32)

    def many(u):
        u = jnp.asarray(u)
        return sum(jnp.tanh((u[i:i + 3, j:j + 3] * small).sum() - 4.5)
                   for i in (0, 2, 4) for j in (0, 2, 4))

    big = a.stencil.map(many, window={"y": 7, "x": 7}, boundary="reflect", backend="xla")
    assert not any(spy)
    p = np.pad(a.values.astype(np.float64), 3, mode="reflect")
    want = sum(np.tanh(ndi.correlate(p, np.ones((3, 3)), mode="constant")[
        i + 1:i + 1 + a.shape[0], j + 1:j + 1 + a.shape[1]] - 4.5)
        for i in (0, 2, 4) for j in (0, 2, 4))
    np.testing.assert_allclose(big.values, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", ["xla", "loops"])
@pytest.mark.parametrize("mode", ["periodic", "reflect"])
@pytest.mark.parametrize("k", [K])
def test_offset_data_keep_their_digits(backend, mode, k):
    """A sum that cancels over data with a large offset (an anomaly filter on
    float32 temperatures in kelvin): the FFT runs on the data less their
    mean (``dense.centred``), so the error is that of the anomalies, not of
    ``sum(|w|) * 280`` (0.015 against values near 1 before).  XLA's one sum
    of slices (9-100 weights) is not centred: 0.004 at 9 x 9 there."""
    rng = np.random.default_rng(3)
    t = xr.DataArray((280 + 0.01 * rng.random((48, 44))).astype(np.float32), dims=("y", "x"))
    win = {"y": k, "x": k}
    ref = _corr(t.values, np.ones((k, k)), mode) - k * k * t.values.astype(np.float64)
    lin = t.stencil.map(lambda u: (u - u()).sum(), window=win, boundary=mode, backend=backend)
    nonlin = t.stencil.map(lambda u: jnp.abs((u - u()).sum()), window=win, boundary=mode,
                           backend=backend)
    assert np.abs(lin.values - ref).max() < 5e-6
    assert np.abs(nonlin.values - np.abs(ref)).max() < 5e-6
    w = W[:k, :k].astype(np.float32)
    blur = t.stencil.map(lambda u: (u * w).sum(), window=win, boundary=mode, backend=backend)
    np.testing.assert_allclose(blur.values, _corr(t.values, W[:k, :k], mode), rtol=1e-6)

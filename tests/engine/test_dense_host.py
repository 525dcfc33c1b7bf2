"""Dense FFT maps on host data (issue 17): scipy's FFT instead of XLA's.

A map whose output is one circular correlation (whole periodic field, weights
the kernel closes over) runs on the host with scipy's pocketfft when its data
are numpy or CPU JAX arrays outside transforms
(``xstencil._backends.hostfft``).  These tests check that it is taken where
it should be, gives the XLA path's answer at FFT precision, and declines
(reruns the exact XLA program) on NaN, inf and values whose FFT could
overflow.  References: ``scipy.ndimage.correlate`` in float64 (a direct
sum), the ``backend="xla"`` map, and an analytic gradient.

Tolerance (FFT precision): ``|err| <= TOL[dtype] * sum|w| * max|x|``, the
scale of the largest output; the two FFTs round in a different order.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.ndimage as ndi
import xarray as xr

from xstencil._backends import hostfft

TOL = {np.float32: 1e-6, np.float64: 1e-14}

pytestmark = pytest.mark.skipif(jax.default_backend() != "cpu",
                                reason="the host FFT serves CPU data only")


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[bool]]:
    """Each host run's outcome: True (computed on the host), False (declined)."""
    got: list[bool] = []
    run = hostfft.HostFFT.run
    monkeypatch.delenv(hostfft.ENV, raising=False)  # the default choice, "auto"

    def spying(self: Any, *args: Any) -> Any:
        out = run(self, *args)
        got.append(out is not None)
        return out

    monkeypatch.setattr(hostfft.HostFFT, "run", spying)
    yield got


def _direct(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):
        return ndi.correlate(np.asarray(a, np.float64), np.asarray(w, np.float64), mode="wrap")


def _loop(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The periodic direct sum as a numpy loop over the (odd-sized) window,
    in float64: it carries a non-finite weight through, as the map does
    (scipy's correlate does not)."""
    h0, h1 = w.shape[0] // 2, w.shape[1] // 2
    out = np.zeros(a.shape)
    with np.errstate(invalid="ignore", over="ignore"):
        for i in range(w.shape[0]):
            for j in range(w.shape[1]):
                out = out + float(w[i, j]) * np.roll(np.asarray(a, np.float64),
                                                     (h0 - i, h1 - j), axis=(0, 1))
    return out


def _da(a: Any) -> xr.DataArray:
    ny, nx = a.shape
    return xr.DataArray(a, dims=("y", "x"), name="v", attrs={"units": "m"},
                        coords={"y": np.arange(ny) * 0.5, "x": np.arange(nx) * 2.0})


def _map(da: xr.DataArray, w: np.ndarray, **kw: Any) -> xr.DataArray:
    k = w.shape
    return da.stencil.map(lambda u: (u * w).sum(), window={"y": k[0], "x": k[1]},
                          boundary="periodic", **kw)


def _scale(a: np.ndarray, w: np.ndarray) -> float:
    fa = np.asarray(a, np.float64)
    return float(np.abs(w).sum() * np.abs(fa[np.isfinite(fa)]).max())


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("shape", "k"), [((96, 75), (15, 13)), ((64, 64), (21, 21))])
def test_host_matches_xla_and_direct_sum(spy: list[bool], dtype: Any, shape: Any,
                                         k: Any) -> None:
    rng = np.random.default_rng(shape[0] + k[0])
    a = rng.standard_normal(shape).astype(dtype)
    w = rng.standard_normal(k).astype(dtype)
    da = _da(a)
    got = _map(da, w)
    assert spy == [True]
    ref = _map(da, w, backend="xla")
    assert spy == [True]  # backend="xla": the XLA program
    # the XLA path's kind of result: a JAX array (float64 with x64 off: numpy, as there)
    assert type(got.data) is type(ref.data) and got.dtype == ref.dtype == dtype
    assert isinstance(got.data, jax.Array) or dtype == np.float64
    assert got.name == "v" and got.attrs == {"units": "m"} and got.dims == ("y", "x")
    xr.testing.assert_identical(got.coords.to_dataset(), da.coords.to_dataset())
    atol = TOL[dtype] * _scale(a, w)
    np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=0, atol=atol)
    np.testing.assert_allclose(np.asarray(got), _direct(a, w), rtol=0, atol=atol)
    again = _map(da, w)  # the repeat call (fast path)
    assert spy == [True, True]
    np.testing.assert_array_equal(np.asarray(again), np.asarray(got))
    np.testing.assert_array_equal(a, np.random.default_rng(shape[0] + k[0]).standard_normal(
        shape).astype(dtype))  # the input is untouched


def test_new_weights_of_the_same_shape_give_new_answers(spy: list[bool]) -> None:
    rng = np.random.default_rng(3)
    a = rng.standard_normal((48, 40)).astype(np.float32)
    da = _da(a)
    for seed in range(3):
        w = np.random.default_rng(seed).standard_normal((11, 11)).astype(np.float32)
        got = _map(da, w)
        np.testing.assert_allclose(np.asarray(got), _direct(a, w), rtol=0,
                                   atol=1e-6 * _scale(a, w))
    assert spy == [True, True, True]


def test_stride_and_bias(spy: list[bool]) -> None:
    rng = np.random.default_rng(5)
    a = rng.standard_normal((60, 45)).astype(np.float32)
    w = rng.standard_normal((13, 11)).astype(np.float32)
    c = np.float32(2.5) * np.ones((), np.float32)
    da = _da(a)

    def kern(u: Any) -> Any:
        return (u * w).sum() + c

    kw = dict(window={"y": 13, "x": 11}, boundary="periodic", stride={"y": 2, "x": 3})
    got = da.stencil.map(kern, **kw)
    assert spy == [True]
    ref = da.stencil.map(kern, backend="xla", **kw)
    want = (_direct(a, w) + 2.5)[::2, ::3]
    assert got.shape == want.shape == ref.shape
    atol = 1e-6 * _scale(a, w)
    np.testing.assert_allclose(np.asarray(got), want, rtol=0, atol=atol)
    np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=0, atol=atol)
    np.testing.assert_array_equal(got.x.values, da.x.values[::3])


def test_cpu_jax_array_input_runs_on_the_host(spy: list[bool]) -> None:
    rng = np.random.default_rng(7)
    a = rng.standard_normal((50, 52)).astype(np.float32)
    w = rng.standard_normal((15, 15)).astype(np.float32)
    got = _map(_da(jnp.asarray(a)), w)
    assert spy == [True]
    np.testing.assert_allclose(np.asarray(got), _direct(a, w), rtol=0, atol=1e-6 * _scale(a, w))


def test_padded_fft_stays_on_xla_and_sums_combine(spy: list[bool]) -> None:
    rng = np.random.default_rng(9)
    a = rng.standard_normal((40, 40)).astype(np.float32)
    w = rng.standard_normal((15, 15)).astype(np.float32)
    da = _da(a)
    got = da.stencil.map(lambda u: (u * w).sum(), window={"y": 15, "x": 15}, boundary="extend")
    assert spy == []  # not a whole periodic field: the XLA program
    # two weighted sums are one (weights w + w.T): one circular FFT, on the host
    two = da.stencil.map(lambda u: (u * w).sum() + (u * w.T).sum(), window={"y": 15, "x": 15},
                         boundary="periodic")
    assert spy == [True]
    ref = ndi.correlate(a.astype(np.float64), w.astype(np.float64), mode="nearest")
    np.testing.assert_allclose(np.asarray(got), ref, rtol=0, atol=1e-6 * _scale(a, w))
    np.testing.assert_allclose(np.asarray(two), _direct(a, w) + _direct(a, w.T), rtol=0,
                               atol=2e-6 * _scale(a, w))


def _poisoned(dtype: Any, case: str) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(11)
    a = rng.standard_normal((48, 44)).astype(dtype)
    w = rng.standard_normal((15, 15)).astype(dtype)
    if case == "nan":
        a[30, 7] = np.nan
    elif case == "inf":
        a[3, 40] = np.inf
    elif case == "-inf":
        a[20, 20] = -np.inf
    elif case == "both inf":
        a[3, 40], a[10, 38] = np.inf, -np.inf
    elif case == "huge":  # finite, but its FFT's sums overflow
        a[17, 5] = 3e38 if dtype == np.float32 else 1e305
        w *= dtype(0.01)
    elif case == "huge weights":  # near 1e30: the host FFT's norm stays in range
        w = (w * dtype(1e30)).astype(dtype)
    elif case == "huger weights":  # the product spectrum's norm past the bound
        w = (w * dtype(1e33 if dtype == np.float32 else 1e303)).astype(dtype)
    elif case == "nan weight":
        w[2, 3] = np.nan
    return a, w


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", ["nan", "inf", "-inf", "both inf", "huge", "huge weights",
                                  "huger weights", "nan weight"])
def test_non_finite_and_overflow_take_the_exact_path(spy: list[bool], dtype: Any,
                                                     case: str) -> None:
    a, w = _poisoned(dtype, case)
    da = _da(a)
    clean = _da(np.random.default_rng(1).standard_normal(a.shape).astype(dtype))
    w0 = np.random.default_rng(2).standard_normal((15, 15)).astype(dtype)
    _map(clean, w0)  # a first call on finite data: the host path from now on
    assert spy == [True]
    got = np.asarray(_map(da, w))
    # declined (the exact XLA program ran), but for weights whose FFT is in range
    assert spy == [True, case == "huge weights"]
    ref = np.asarray(_map(da, w, backend="xla"))
    want = _loop(a, w)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isposinf(got), np.isposinf(want))
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want))
    fin = np.isfinite(want)
    atol = TOL[dtype] * _scale(a, w) if case != "nan weight" else 0
    np.testing.assert_allclose(got[fin], want[fin], rtol=0, atol=atol)
    np.testing.assert_allclose(got, ref, rtol=0, atol=atol)
    # clean data after: the host path again (once the exact path's retry count runs out)
    for _ in range(20):
        out = _map(clean, w0)
    assert spy[-1] is True
    np.testing.assert_allclose(np.asarray(out), _direct(clean.values, w0), rtol=0,
                               atol=TOL[dtype] * _scale(clean.values, w0))


def test_transforms_keep_using_xla(spy: list[bool]) -> None:
    rng = np.random.default_rng(13)
    a = rng.standard_normal((32, 36)).astype(np.float32)
    w = rng.standard_normal((15, 15)).astype(np.float32)
    da = _da(a)

    def total(w: Any) -> Any:
        return da.stencil.map(lambda u: (u * w).sum(), window={"y": 15, "x": 15},
                              boundary="periodic").data.sum()

    g = jax.grad(total)(jnp.asarray(w))  # periodic: d total / d w[c] = sum(a)
    np.testing.assert_allclose(np.asarray(g), np.full(w.shape, a.astype(np.float64).sum()),
                               rtol=1e-4, atol=1e-3)
    batch = np.stack([a, 2 * a])

    def one(x: Any) -> Any:
        return xr.DataArray(x, dims=("y", "x")).stencil.map(
            lambda u: (u * w).sum(), window={"y": 15, "x": 15}, boundary="periodic").data

    vm = jax.vmap(one)(jnp.asarray(batch))
    jt = jax.jit(one)(jnp.asarray(a))
    assert spy == []  # none of them ran on the host
    want = _direct(a, w)
    atol = 2e-6 * _scale(a, w)
    np.testing.assert_allclose(np.asarray(vm[0]), want, rtol=0, atol=atol)
    np.testing.assert_allclose(np.asarray(vm[1]), 2 * want, rtol=0, atol=atol)
    np.testing.assert_allclose(np.asarray(jt), want, rtol=0, atol=atol)
    host = _map(da, w)
    assert spy == [True]
    np.testing.assert_allclose(np.asarray(host), np.asarray(jt), rtol=0, atol=atol)


def test_l1_product_is_the_product_and_its_norm() -> None:
    rng = np.random.default_rng(17)
    big = (rng.standard_normal((70, 9)) + 1j * rng.standard_normal((70, 9))).astype(np.complex64)
    spec = (rng.standard_normal((70, 9)) + 1j * rng.standard_normal((70, 9))).astype(np.complex64)
    want = big.astype(np.complex128) * spec
    norm = hostfft.l1_product(big, spec)
    np.testing.assert_allclose(big, want, rtol=1e-6)
    np.testing.assert_allclose(norm, np.abs(want.real).sum() + np.abs(want.imag).sum(),
                               rtol=1e-6)
    big[69, 8] = np.nan
    assert np.isnan(hostfft.l1_product(big, spec))


def test_one_and_three_dims(spy: list[bool]) -> None:
    rng = np.random.default_rng(19)
    a1 = rng.standard_normal(300).astype(np.float32)
    w1 = rng.standard_normal(121).astype(np.float32)
    got1 = xr.DataArray(a1, dims="x").stencil.map(lambda u: (u * w1).sum(), window={"x": 121},
                                                  boundary="periodic")
    want1 = ndi.correlate(a1.astype(np.float64), w1.astype(np.float64), mode="wrap")
    np.testing.assert_allclose(np.asarray(got1), want1, rtol=0, atol=1e-6 * _scale(a1, w1))
    a3 = rng.standard_normal((12, 20, 18)).astype(np.float32)
    w3 = rng.standard_normal((5, 5, 5)).astype(np.float32)
    got3 = xr.DataArray(a3, dims=("z", "y", "x")).stencil.map(
        lambda u: (u * w3).sum(), window={"z": 5, "y": 5, "x": 5}, boundary="periodic")
    want3 = ndi.correlate(a3.astype(np.float64), w3.astype(np.float64), mode="wrap")
    np.testing.assert_allclose(np.asarray(got3), want3, rtol=0, atol=1e-6 * _scale(a3, w3))
    assert spy == [True, True]


def test_thread_count_follows_the_measured_times(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hostfft, "workers", lambda: 2)
    t = hostfft.Threads()
    first = []
    for _ in range(2 * hostfft.SAMPLES):  # each count timed SAMPLES times, alternating
        n = t.pick()
        first.append(n)
        t.record(n, 1.0 if n == 2 else 3.0)
    assert first.count(2) == first.count(1) == hostfft.SAMPLES
    picks = []
    for _ in range(2 * hostfft.EXPLORE):
        n = t.pick()
        picks.append(n)
        t.record(n, 1.0 if n == 2 else 3.0)
    assert picks.count(1) == 2 and picks.count(2) == 2 * hostfft.EXPLORE - 2  # 1 explored
    t.record(2, 50.0)  # one slow call does not move the choice (a median, not a mean)
    assert t.pick() == 2
    for _ in range(hostfft.SAMPLES):  # the machine got busy: 2 threads now slower
        t.record(2, 5.0)
    assert t.pick() == 1


@pytest.mark.parametrize("layout", ["strided view", "fortran"])
def test_non_contiguous_input(spy: list[bool], layout: str) -> None:
    rng = np.random.default_rng(23)
    base = rng.standard_normal((80, 70)).astype(np.float32)
    a = base[::2, 1::1] if layout == "strided view" else np.asfortranarray(base)
    w = rng.standard_normal((13, 13)).astype(np.float32)
    before = a.copy()
    got = _map(_da(a), w)
    assert spy == [True]
    np.testing.assert_allclose(np.asarray(got), _direct(np.ascontiguousarray(a), w), rtol=0,
                               atol=1e-6 * _scale(a, w))
    np.testing.assert_array_equal(a, before)


def test_environment_choice_of_xla_keeps_xla(spy: list[bool],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(29)
    a = rng.standard_normal((36, 30)).astype(np.float32)
    w = rng.standard_normal((11, 11)).astype(np.float32)
    monkeypatch.setenv(hostfft.ENV, "xla")
    got = _map(_da(a), w)
    assert spy == []
    monkeypatch.delenv(hostfft.ENV)
    again = _map(_da(a), w)
    assert spy == [True]
    atol = 1e-6 * _scale(a, w)
    np.testing.assert_allclose(np.asarray(got), _direct(a, w), rtol=0, atol=atol)
    np.testing.assert_allclose(np.asarray(again), np.asarray(got), rtol=0, atol=atol)


def test_private_binding_is_checked_against_numpy() -> None:
    """A pocketfft binding whose calls do not give numpy's transforms is not
    used (the public scipy functions are)."""
    class Swapped:  # a binding whose 'forward' flag means the opposite
        def r2c(self, a, axes, forward, inorm, out, nthreads):  # noqa: ANN001, ANN201
            out[...] = np.fft.rfft2(a) if not forward else np.conj(np.fft.rfft2(a))

        def c2c(self, a, axes, forward, inorm, out, nthreads):  # noqa: ANN001, ANN201
            out[...] = np.fft.ifft(a, axis=axes[0])

        def c2r(self, a, axes, n, forward, inorm, out, nthreads):  # noqa: ANN001, ANN201
            out[...] = np.fft.irfft(a, n, axis=axes[-1])

    assert hostfft._checked(Swapped()) is None
    assert hostfft._checked(None) is None
    assert hostfft._pocket is None or hostfft._checked(hostfft._pocket) is hostfft._pocket

"""Weight spectra of the FFT lowering computed outside the per-call program
(``xstencil._engine.dense_hoist``, issue 17 item 3).

The spectrum of runtime weights (a closed-over array) is cached by the
weights' *value*: a new array, a rebound global or an array changed in place
must give the new answer, never a stale spectrum; equal weights reuse it.
Inside transforms (``grad`` with respect to the weights, ``jit``, ``vmap``)
the plain program computes the spectrum itself.  References: a numpy loop /
``scipy.ndimage.correlate`` and ``check_grads``.
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

import xstencil
from xstencil._engine import dense_hoist, kcache

K = 13  # 169 cells: the FFT lowering
W_GLOBAL = np.random.default_rng(0).standard_normal((K, K))


def _staged() -> list[dense_hoist.Staged]:
    """The staged engine functions in the compile cache."""
    found = []
    for v in list(kcache._TABLE.values()):
        v = getattr(v, "jitted", v)
        if isinstance(v, dense_hoist.Staged):
            found.append(v)
    return found


def _map(a: Any, kernel: Any, mode: str = "periodic") -> Any:
    return xr.DataArray(a, dims=("y", "x")).stencil.map(
        kernel, window={"y": K, "x": K}, boundary=mode)


def _ref(a: np.ndarray, w: np.ndarray, mode: str = "periodic") -> np.ndarray:
    return ndi.correlate(a, w, mode={"periodic": "wrap", "extend": "nearest"}[mode])


def _global_kernel(u: Any) -> Any:
    return (u * W_GLOBAL).sum()


@pytest.mark.parametrize("mode", ["periodic", "extend"])
def test_new_weights_give_new_spectra_and_equal_ones_reuse_them(
        x64: None, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    xstencil.clear_caches()
    stored = []
    keep = dense_hoist.Staged._keep

    def counting(self: Any, key: Any, spectra: Any) -> None:
        stored.append(key)
        keep(self, key, spectra)

    monkeypatch.setattr(dense_hoist.Staged, "_keep", counting)
    rng = np.random.default_rng(1)
    a = rng.standard_normal((40, 36))
    seen = []
    for i in range(4):
        w = rng.standard_normal((K, K)) if i < 3 else seen[0]
        seen.append(w)
        out = _map(a, lambda u, w=w: (u * w).sum(), mode).values
        np.testing.assert_allclose(out, _ref(a, w, mode), rtol=1e-10, atol=1e-10)
    (staged,) = _staged()
    assert staged.split is True
    by_weights = [k for k in staged.spectra if k[0] != "inputs"]
    assert len(by_weights) == 3
    # three new spectra, each kept by the weights' and the inputs' values; the
    # fourth call (the first weights again) computed none
    assert len(stored) == 6 and len(set(stored)) == 6


def test_a_global_changed_in_place_or_rebound_is_not_stale(x64: None) -> None:
    global W_GLOBAL
    xstencil.clear_caches()
    a = np.random.default_rng(2).standard_normal((30, 32))
    keep = W_GLOBAL.copy()
    try:
        np.testing.assert_allclose(_map(a, _global_kernel).values, _ref(a, W_GLOBAL),
                                   rtol=1e-10, atol=1e-10)
        W_GLOBAL *= -2.0  # in place: the same object, new values
        np.testing.assert_allclose(_map(a, _global_kernel).values, _ref(a, W_GLOBAL),
                                   rtol=1e-10, atol=1e-10)
        W_GLOBAL = np.flipud(keep).copy()  # rebound
        np.testing.assert_allclose(_map(a, _global_kernel).values, _ref(a, W_GLOBAL),
                                   rtol=1e-10, atol=1e-10)
    finally:
        W_GLOBAL = keep


def test_float32_split_program_matches_the_plain_one() -> None:
    """The staged call (spectrum from outside) and the plain program inside
    a user's ``jit`` (spectrum in the program) agree to float32 rounding."""
    xstencil.clear_caches()
    rng = np.random.default_rng(3)
    a = rng.standard_normal((64, 60)).astype(np.float32)
    w = rng.standard_normal((K, K)).astype(np.float32)

    def kernel(u: Any) -> Any:
        return (u * w).sum()

    staged = np.asarray(_map(a, kernel).data)
    plain = np.asarray(jax.jit(lambda x: _map(x, kernel).data)(jnp.asarray(a)))
    assert staged.dtype == np.float32
    np.testing.assert_allclose(staged, plain, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(staged, _ref(a.astype(np.float64), w.astype(np.float64)),
                               rtol=1e-4, atol=1e-3)


@pytest.mark.slow  # gradient and vmap compiles: 48 s on a loaded 2-core host
def test_gradients_and_vmap_over_the_weights(x64: None) -> None:
    """Traced weights (grad, vmap) run the plain program: still correct."""
    rng = np.random.default_rng(4)
    a = rng.standard_normal((24, 26))
    w0 = rng.standard_normal((K, K))

    def f(w: Any) -> Any:
        return _map(a, lambda u: (u * w).sum()).data

    check_grads(f, (w0,), order=1, modes=("rev",))
    ws = rng.standard_normal((2, K, K))
    out = np.asarray(jax.vmap(f)(jnp.asarray(ws)))
    for i in range(2):
        np.testing.assert_allclose(out[i], _ref(a, ws[i]), rtol=1e-10, atol=1e-10)


def test_kernels_without_fft_weights_run_the_plain_program(x64: None) -> None:
    xstencil.clear_caches()
    a = np.random.default_rng(5).standard_normal((20, 20))
    w = np.random.default_rng(6).standard_normal((3, 3))
    da = xr.DataArray(a, dims=("y", "x"))
    out = da.stencil.map(lambda u: (u * w).sum(), window={"y": 3, "x": 3},
                         boundary="periodic").values
    np.testing.assert_allclose(out, ndi.correlate(a, w, mode="wrap"), rtol=1e-12)
    staged = _staged()
    assert staged and all(s.split is False for s in staged)


def test_data_turning_non_finite_after_a_finite_call(x64: None) -> None:
    """The staged program runs the all-finite FFT only; a later call whose
    data hold a NaN or an inf must still give the direct sum's footprint
    (it reruns as the plain program), and so must the calls after it."""
    xstencil.clear_caches()
    rng = np.random.default_rng(7)
    w = rng.standard_normal((K, K))
    a = rng.standard_normal((30, 34))

    def kernel(u: Any) -> Any:
        return (u * w).sum()

    np.testing.assert_allclose(_map(a, kernel).values, _ref(a, w), rtol=1e-10, atol=1e-10)
    (staged,) = _staged()
    assert staged.split is True and staged.skip == 0
    b = a.copy()
    b[4, 6], b[20, 20] = np.nan, np.inf
    for data in (b, a):
        out = _map(data, kernel).values
        with np.errstate(invalid="ignore"):
            ref = _ref(data, w)  # an FFT-free direct sum: NaN/inf only near them
        assert 0 < (~np.isfinite(ref)).sum() < ref.size // 2 or data is a
        np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
        np.testing.assert_array_equal(np.isinf(out), np.isinf(ref))
        ok = np.isfinite(ref)
        np.testing.assert_allclose(out[ok], ref[ok], rtol=1e-10, atol=1e-10)
    assert staged.skip == dense_hoist.RETRY - 1  # the plain program for a while

"""The per-call program of the FFT lowering with runtime weights (issue 17,
item 3): the staged all-finite program of ``xstencil._engine.dense_hoist``.

Each call outside JAX transforms runs one program that returns the FFT
correlation and whether it was right to take the all-finite path, read off
the correlation's first output (``xstencil._engine.dense_finite``); a call
whose data or weights hold a NaN or an infinity anywhere reruns as the exact
program.  These tests pin that check down: one non-finite value at any
position, of any sign, in the data or the weights, on the circular (whole
periodic field) and the padded FFT, in float32 and float64, must give the
direct sum's answer; numpy and JAX inputs, a user's ``jit`` and ``grad`` must
agree with the reference.  References: ``scipy.ndimage.correlate`` in
float64 (a direct sum) and ``check_grads``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.ndimage as ndi
import xarray as xr
from jax.test_util import check_grads

import xstencil
from xstencil._engine import dense, dense_hoist, kcache

K = 15  # 225 cells: the FFT lowering for runtime weights
SHAPE = (40, 46)
#: xstencil's boundary -> scipy.ndimage's mode (scipy's 'mirror' is numpy's
#: and xstencil's 'reflect'; scipy's 'reflect' is xstencil's 'symmetric')
SCIPY_MODE = {"periodic": "wrap", "extend": "nearest", "fill": "constant",
              "reflect": "mirror", "symmetric": "reflect"}


def _ref(a: np.ndarray, w: np.ndarray, mode: str) -> np.ndarray:
    """The direct sum in float64 (no weight is 0 here, so scipy's sum reads
    the same cells as the library's)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return ndi.correlate(np.asarray(a, np.float64), np.asarray(w, np.float64),
                             mode=SCIPY_MODE[mode], cval=0.0)


def _periodic_loop(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The periodic direct sum as a numpy loop over the window cells, in
    float64 (scipy's correlate does not carry a non-finite weight through)."""
    h = K // 2
    out = np.zeros(a.shape)
    with np.errstate(invalid="ignore", over="ignore"):
        for i in range(K):
            for j in range(K):
                out = out + float(w[i, j]) * np.roll(np.asarray(a, np.float64),
                                                     (h - i, h - j), axis=(0, 1))
    return out


def _weights(seed: int, dtype: Any = np.float64) -> np.ndarray:
    """Dense weights, none of them 0 (every cell is read)."""
    rng = np.random.default_rng(seed)
    w = rng.uniform(0.2, 1.0, (K, K)) * rng.choice([-1.0, 1.0], (K, K))
    return w.astype(dtype)


def _map(a: Any, kernel: Callable[[Any], Any], mode: str) -> xr.DataArray:
    fill = {"fill_value": 0.0} if mode == "fill" else {}  # the default fill is NaN
    return xr.DataArray(a, dims=("y", "x")).stencil.map(
        kernel, window={"y": K, "x": K}, boundary=mode, **fill)


def _staged() -> dense_hoist.Staged:
    """The one staged engine function in the compile cache."""
    found = [getattr(v, "jitted", v) for v in list(kcache._TABLE.values())]
    found = [v for v in found if isinstance(v, dense_hoist.Staged)]
    assert len(found) == 1
    return found[0]


def _tol(a: np.ndarray, w: np.ndarray, dtype: Any) -> float:
    """An absolute tolerance on the outputs: the FFT's rounding error grows
    with the sum of the magnitudes (float32: about 1e-6 of it)."""
    scale = float(np.abs(w).sum() * np.nanmax(np.abs(np.where(np.isfinite(a), a, 0))))
    return scale * (1e-5 if np.dtype(dtype) == np.float32 else 1e-12)


def _check(out: np.ndarray, ref: np.ndarray, atol: float) -> None:
    """The same NaN and +-inf footprint; the finite values agree."""
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
    np.testing.assert_array_equal(np.isposinf(out), np.isposinf(ref))
    np.testing.assert_array_equal(np.isneginf(out), np.isneginf(ref))
    ok = np.isfinite(ref)
    np.testing.assert_allclose(out[ok], ref[ok], rtol=0, atol=atol)


def test_runtime_weights_take_the_fft():
    assert dense.choose(jax.ShapeDtypeStruct((K, K), np.float32)) == "fft"


# every mode on numpy input, periodic on JAX input in the fast run (5 s each on 2 cores)
@pytest.mark.parametrize(("kind", "mode"), [
    pytest.param(kind, mode, id=f"{kind}-{mode}",
                 marks=() if kind == "numpy" or mode == "periodic" else pytest.mark.slow)
    for kind in ("numpy", "jax")
    for mode in ("periodic", "extend", "fill", "reflect", "symmetric")])
def test_float32_numpy_and_jax_inputs_match_scipy(mode: str, kind: str) -> None:
    """numpy and JAX data, every boundary mode the FFT lowering pads for
    (periodic: the circular FFT on the field itself), on repeated calls
    (the first one stages the program, the next ones run it)."""
    xstencil.clear_caches()
    rng = np.random.default_rng(1)
    a = rng.standard_normal(SHAPE).astype(np.float32)
    w = _weights(2, np.float32)
    data = a if kind == "numpy" else jnp.asarray(a)

    def kernel(u: Any) -> Any:
        return (u * w).sum()

    ref = _ref(a, w, mode)
    if mode == "periodic":  # the two references agree
        np.testing.assert_allclose(_periodic_loop(a, w), ref, rtol=1e-12, atol=1e-12)
    for _ in range(3):
        out = _map(data, kernel, mode)
        assert out.dtype == np.float32 and out.dims == ("y", "x")
        _check(np.asarray(out.values, np.float64), ref, _tol(a, w, np.float32))
    assert _staged().split is True


def test_float64_under_x64(x64: None) -> None:
    xstencil.clear_caches()
    rng = np.random.default_rng(3)
    a = rng.standard_normal(SHAPE)
    w = _weights(4)

    def kernel(u: Any) -> Any:
        return (u * w).sum()

    for mode in ("periodic", "extend"):
        for _ in range(2):
            out = _map(a, kernel, mode).values
            assert out.dtype == np.float64
            _check(out, _ref(a, w, mode), _tol(a, w, np.float64))


POSITIONS = [(0, 0), (0, SHAPE[1] - 1), (SHAPE[0] - 1, 0), (SHAPE[0] - 1, SHAPE[1] - 1),
             (SHAPE[0] // 2, SHAPE[1] // 2), (1, 17), (23, 0), (39, 30)]


# 15-20 s each on 2 cores: periodic float32 and extend float64 in the fast run
@pytest.mark.parametrize(("mode", "wide"), [
    pytest.param("periodic", False, id="periodic-float32"),
    pytest.param("periodic", True, id="periodic-float64", marks=pytest.mark.slow),
    pytest.param("extend", False, id="extend-float32", marks=pytest.mark.slow),
    pytest.param("extend", True, id="extend-float64")])
def test_one_non_finite_value_anywhere_reruns_the_exact_program(
        mode: str, wide: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """After a finite call has staged the all-finite program, a single NaN,
    +inf or -inf at any position (corners and edges included) must be
    caught by the program's check and rerun exactly: the direct sum's
    footprint, never an FFT's field of NaN.  ``RETRY = 0`` makes every call
    try the all-finite program first, so each one tests the check."""
    monkeypatch.setattr(dense_hoist, "RETRY", 0)
    dtype = np.float64 if wide else np.float32
    with jax.enable_x64(wide):
        xstencil.clear_caches()
        rng = np.random.default_rng(5)
        a = rng.standard_normal(SHAPE).astype(dtype)
        w = _weights(6, dtype)

        def kernel(u: Any) -> Any:
            return (u * w).sum()

        _map(a, kernel, mode)
        staged = _staged()
        plain_calls = []
        plain = staged.plain
        monkeypatch.setattr(staged, "plain", lambda *args: plain_calls.append(1) or plain(*args))
        _check(np.asarray(_map(a, kernel, mode).values, np.float64), _ref(a, w, mode),
               _tol(a, w, dtype))
        assert not plain_calls  # finite: the staged program only
        for i, pos in enumerate(POSITIONS):
            for value in (np.nan, np.inf, -np.inf):
                b = a.copy()
                b[pos] = value
                ref = _ref(b, w, mode)
                assert 0 < (~np.isfinite(ref)).sum() < ref.size // 2
                out = np.asarray(_map(b, kernel, mode).values, np.float64)
                _check(out, ref, _tol(b, w, dtype))
            assert len(plain_calls) == 3 * (i + 1)  # each one caught, rerun exactly


@pytest.mark.parametrize("value", [np.nan, pytest.param(np.inf, marks=pytest.mark.slow),
                                   -np.inf])  # 18-21 s each on 2 cores
def test_weights_turning_non_finite_in_place(value: float,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Weights changed in place after a finite call: their spectrum is new
    (keyed by value) and holds the non-finite value, which the check must
    catch; then back to finite values, the result follows them too."""
    monkeypatch.setattr(dense_hoist, "RETRY", 0)
    xstencil.clear_caches()
    rng = np.random.default_rng(7)
    a = rng.standard_normal(SHAPE).astype(np.float32)
    a[np.abs(a) < 0.05] = 0.0  # zeros under an infinite weight: NaN there
    w = _weights(8, np.float32)
    saved = w.copy()

    def kernel(u: Any) -> Any:
        return (u * w).sum()

    tol = _tol(a, saved, np.float32)
    _check(np.asarray(_map(a, kernel, "periodic").values, np.float64),
           _periodic_loop(a, w), tol)
    w[3, 11] = value
    ref = _periodic_loop(a, w)
    assert (~np.isfinite(ref)).any()
    _check(np.asarray(_map(a, kernel, "periodic").values, np.float64), ref, tol)
    w[...] = -saved
    _check(np.asarray(_map(a, kernel, "periodic").values, np.float64),
           _periodic_loop(a, w), tol)


def test_new_weights_between_calls_give_new_results() -> None:
    """Weights changed in place, rebound, or equal to earlier ones: every
    call gives the answer for the weights it sees (the spectrum table is
    keyed by the weights' values)."""
    xstencil.clear_caches()
    rng = np.random.default_rng(9)
    a = rng.standard_normal(SHAPE).astype(np.float32)
    box = {"w": _weights(10, np.float32)}

    def kernel(u: Any) -> Any:
        return (u * box["w"]).sum()

    first = box["w"].copy()
    seen = []
    for step in range(4):
        if step == 1:
            box["w"][...] = _weights(11, np.float32)  # in place
        elif step == 2:
            box["w"] = _weights(12, np.float32)  # rebound
        elif step == 3:
            box["w"] = first.copy()  # back to the first values
        out = np.asarray(_map(a, kernel, "periodic").values, np.float64)
        _check(out, _ref(a, box["w"], "periodic"), _tol(a, box["w"], np.float32))
        seen.append(out)
    assert not np.allclose(seen[0], seen[1]) and not np.allclose(seen[1], seen[2])
    np.testing.assert_array_equal(seen[3], seen[0])


def test_inside_a_users_jit() -> None:
    xstencil.clear_caches()
    rng = np.random.default_rng(13)
    a = rng.standard_normal(SHAPE).astype(np.float32)
    w = _weights(14, np.float32)

    @jax.jit
    def f(x: Any) -> Any:
        return _map(x, lambda u: (u * w).sum(), "periodic").data

    for data in (a, a[::-1].copy()):
        _check(np.asarray(f(data), np.float64), _ref(data, w, "periodic"),
               _tol(data, w, np.float32))
    b = a.copy()
    b[4, 9] = np.nan  # inside jit: the plain program's exact path
    _check(np.asarray(f(b), np.float64), _ref(b, w, "periodic"), _tol(a, w, np.float32))


def test_gradients_on_the_jax_path(x64: None) -> None:
    """``check_grads`` with respect to the data and the weights (traced
    inside the transform: the plain program), and ``grad`` of a loss against
    the adjoints of the periodic direct sum, written in numpy: with respect
    to the data, the correlation of the probe with the flipped weights; with
    respect to weight ``c``, the probe times the data shifted by ``c``."""
    rng = np.random.default_rng(15)
    small = rng.standard_normal((18, 20))
    w0 = _weights(16)

    def library(x: Any, w: Any) -> Any:
        return _map(x, lambda u: (u * w).sum(), "periodic").data

    check_grads(library, (small, w0), order=1, modes=("rev",))
    probe = rng.standard_normal(small.shape)
    got = jax.grad(lambda x, w: jnp.sum(library(x, w) * probe), argnums=(0, 1))(
        jnp.asarray(small), jnp.asarray(w0))
    h = K // 2
    want_x = ndi.correlate(probe, w0[::-1, ::-1], mode="wrap")
    want_w = np.array([[np.sum(probe * np.roll(small, (h - i, h - j), axis=(0, 1)))
                        for j in range(K)] for i in range(K)])
    np.testing.assert_allclose(np.asarray(got[0]), want_x, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(np.asarray(got[1]), want_w, rtol=1e-9, atol=1e-9)

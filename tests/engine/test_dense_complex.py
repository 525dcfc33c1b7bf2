"""Linear window sums over complex data, or with complex weights, take the
dense lowerings (:mod:`xstencil._engine.dense_complex`): the real
correlations of the real and imaginary parts, each lowered by cost.  Before,
``float_cells`` and ``linear.weights`` refused complex values and a 15 x 15
sum over complex64 data at 64² compiled cell by cell in about 12 s.

References are independent: numpy sums of shifted slices of the numpy-padded
real and imaginary parts, in float64, over the cells of nonzero weight only
(a cell of weight 0 is not read), and ``scipy.ndimage.correlate`` of each
part.  Complex NaN and inf footprints are those of the parts' sums (as
``scipy.ndimage`` gives them), not those of the kernel's own complex products
(``(inf + 0j) * 2`` is ``inf + nanj`` there).
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
from jax.test_util import check_grads

import xstencil
from tests.reference import direct_correlate
from tests.spies import recorded
from xstencil._engine import boundary, dense
from xstencil._engine.dense_complex import real_weights

MODES = ["fill", "periodic", "reflect", "symmetric", "extend"]
_NDI = {"fill": "constant", "periodic": "wrap", "reflect": "mirror", "symmetric": "reflect",
        "extend": "nearest"}
DENSE = {"fft", "slices", "separable", "rows", "circular"}


@pytest.fixture
def lowered(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The dense lowerings XLA's programs were built with ('circular': the
    FFT of a whole periodic field)."""
    seen = recorded(monkeypatch, dense, "correlate", keep=lambda args, out: args[-1])
    recorded(monkeypatch, dense, "_circular", keep=lambda args, out: seen.append("circular"))
    xstencil.clear_caches()
    return seen


def _direct(a: np.ndarray, w: np.ndarray, mode: str, fill: complex = 0,
            steps: tuple[int, ...] | None = None) -> np.ndarray:
    """The complex window sum as the real sums of the parts (float64)."""
    ar, ai = np.real(a), np.imag(a)
    wr, wi = np.real(w), np.imag(w)
    fr, fi = np.real(fill), np.imag(fill)
    with np.errstate(invalid="ignore"):  # inf - inf: NaN, as the sum gives it
        re = direct_correlate(ar, wr, mode, fr) - direct_correlate(ai, wi, mode, fi)
        im = direct_correlate(ar, wi, mode, fr) + direct_correlate(ai, wr, mode, fi)
    out = np.empty(re.shape, np.complex128)
    out.real, out.imag = re, im  # not re + 1j * im: 1j * inf has a NaN real part
    if steps is not None:
        out = out[tuple(slice(None, None, s) for s in steps)]
    return out


def _data(shape: tuple[int, ...], seed: int, dtype: Any = np.complex64) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)


def _gabor(k: int, dtype: Any = np.complex64) -> np.ndarray:
    yy, xx = np.mgrid[:k, :k] - (k - 1) / 2
    env = np.exp(-(yy**2 + xx**2) / (2 * (k / 4) ** 2))
    return (env * np.exp(1j * (0.7 * xx + 0.3 * yy))).astype(dtype)


def _map(a: Any, w: Any, mode: str, k: int, **kw: Any) -> xr.DataArray:
    opts: dict[str, Any] = {"boundary": mode}
    if mode == "fill":
        opts["fill_value"] = 0
    opts.update(kw)
    cdt = np.result_type(np.complex64, a.dtype, w.dtype)  # strict promotion: cast both

    def kernel(u: Any) -> Any:
        return (u.astype(cdt) * w.astype(cdt)).sum()

    return xr.DataArray(a, dims=("y", "x")).stencil.map(kernel, window={"y": k, "x": k},
                                                        **opts)


def _close(got: Any, want: np.ndarray, tol: float) -> None:
    got = np.asarray(got)
    scale = np.nanmax(np.abs(want[np.isfinite(want)])) if np.isfinite(want).any() else 1.0
    np.testing.assert_allclose(got.real, want.real, rtol=0, atol=tol * scale)
    np.testing.assert_allclose(got.imag, want.imag, rtol=0, atol=tol * scale)


@pytest.mark.parametrize("mode", MODES)
def test_real_weights_over_complex64_every_mode(lowered: list[str], mode: str) -> None:
    a = _data((40, 45), MODES.index(mode))
    w = np.random.default_rng(7).standard_normal((15, 15)).astype(np.float32)
    got = _map(a, w, mode, 15, backend="xla")
    assert got.dtype == np.complex64
    _close(got.values, _direct(a, w, mode), 2e-6)
    assert len(lowered) and set(lowered) <= DENSE


@pytest.mark.parametrize("mode", ["reflect", "periodic"])
def test_complex_weights_match_scipy_on_each_part(lowered: list[str], mode: str) -> None:
    a = _data((48, 40), 3)
    w = _gabor(13)
    got = _map(a, w, mode, 13, backend="xla")
    assert got.dtype == np.complex64
    ndm = _NDI[mode]
    a64, w64 = a.astype(np.complex128), w.astype(np.complex128)

    def corr(x: np.ndarray, v: np.ndarray) -> np.ndarray:
        return ndi.correlate(x, v, mode=ndm)

    want = (corr(a64.real, w64.real) - corr(a64.imag, w64.imag)
            + 1j * (corr(a64.real, w64.imag) + corr(a64.imag, w64.real)))
    _close(got.values, want, 2e-6)
    assert len(lowered) and set(lowered) <= DENSE


def test_default_backend_on_numpy_data_with_constant_complex_weights(lowered: list[str]
                                                                     ) -> None:
    a = _data((50, 44), 4)

    def kernel(u: Any) -> Any:
        return (u * _gabor(11)).sum() + (1 - 2j)  # constant weights and a complex bias

    got = xr.DataArray(a, dims=("y", "x")).stencil.map(kernel, window={"y": 11, "x": 11},
                                                       boundary="symmetric")
    assert got.dtype == np.complex64
    _close(got.values, _direct(a, _gabor(11), "symmetric") + (1 - 2j), 2e-6)
    assert len(lowered) and set(lowered) <= DENSE


def test_real_image_under_complex_weights_stays_real_until_the_sum(lowered: list[str]) -> None:
    rng = np.random.default_rng(5)
    img = rng.standard_normal((36, 41)).astype(np.float32)
    w = _gabor(11)
    got = _map(img, w, "extend", 11, backend="xla")
    assert got.dtype == np.complex64
    _close(got.values, _direct(img, w, "extend"), 2e-6)
    assert len(lowered) and set(lowered) <= DENSE
    u8 = rng.integers(0, 256, (36, 41)).astype(np.uint8)
    got8 = _map(u8, w, "reflect", 11, backend="xla")
    assert got8.dtype == np.complex64
    _close(got8.values, _direct(u8.astype(np.float64), w, "reflect"), 2e-6)


def test_stride(lowered: list[str]) -> None:
    a = _data((45, 52), 6)
    w = _gabor(13)
    got = _map(a, w, "reflect", 13, backend="xla", stride={"y": 2, "x": 3})
    _close(got.values, _direct(a, w, "reflect", steps=(2, 3)), 2e-6)
    assert len(lowered) and set(lowered) <= DENSE


@pytest.mark.parametrize("weights", ["real", pytest.param("complex", marks=pytest.mark.slow)])
def test_nan_and_inf_footprints_are_the_parts_sums(lowered: list[str], weights: str) -> None:
    a = _data((40, 40), 8)
    a[5, 7] = complex(np.nan, 1.0)
    a[20, 20] = complex(2.0, np.inf)
    a[30, 10] = complex(-np.inf, 0.5)
    w = np.random.default_rng(9).standard_normal((13, 13)).astype(np.float32)
    w[::3, :] = 0  # cells of weight 0 are not read
    if weights == "complex":
        w = (w * np.exp(1j * np.arange(13))[None, :]).astype(np.complex64)
        w[1, 1] = w[1, 1].real  # a cell whose imaginary weight is 0
    got = _map(a, w, "reflect", 13, backend="xla").values
    want = _direct(a, w, "reflect")
    for part in (np.real, np.imag):
        g, r = part(got), part(want)
        np.testing.assert_array_equal(np.isnan(g), np.isnan(r))
        np.testing.assert_array_equal(np.isposinf(g), np.isposinf(r))
        np.testing.assert_array_equal(np.isneginf(g), np.isneginf(r))
        fin = np.isfinite(r)
        np.testing.assert_allclose(g[fin], r[fin], rtol=0, atol=2e-5)
    assert len(lowered) and set(lowered) <= DENSE


def test_the_default_nan_fill_makes_both_parts_nan(lowered: list[str]) -> None:
    """The default fill (NaN) fills complex data's halo with ``nan + nanj``,
    as xarray's ``rolling`` does: both parts of an output whose window
    reaches it are NaN (the kernel's own products gave ``nan + nanj`` too);
    ``nan + 0j`` would leave finite imaginary sums there."""
    a = _data((30, 32), 15)
    w = np.random.default_rng(3).standard_normal((11, 11)).astype(np.float32)
    got = xr.DataArray(a, dims=("y", "x")).stencil.map(
        lambda u: (u * w.astype(np.complex64)).sum(), window={"y": 11, "x": 11},
        boundary="fill", backend="xla").values
    want = _direct(a, w, "fill", fill=complex(np.nan, np.nan))
    np.testing.assert_array_equal(np.isnan(got.real), np.isnan(want.real))
    np.testing.assert_array_equal(np.isnan(got.imag), np.isnan(want.real))
    assert np.isnan(got.real).sum() == 30 * 32 - 20 * 22
    fin = np.isfinite(want)
    _close(np.where(fin, got, 0), np.where(fin, want, 0), 2e-6)
    assert len(lowered) and set(lowered) <= DENSE


def test_complex128_under_x64_and_without(lowered: list[str]) -> None:
    a = _data((40, 38), 10, np.complex128)
    w = _gabor(15, np.complex128)
    want = _direct(a, w, "periodic")
    with jax.enable_x64(True):
        got = _map(a, w, "periodic", 15, backend="xla")
    assert got.dtype == np.complex128
    _close(got.values, want, 1e-13)
    # x64 off, numpy complex128 data: kept as the real path keeps float64
    got = _map(a, w, "periodic", 15)
    assert got.dtype == np.complex128
    _close(got.values, want, 1e-13)
    assert len(lowered) and set(lowered) <= DENSE


def test_runtime_weights_under_jit(lowered: list[str]) -> None:
    a = _data((30, 33), 11)
    w0 = _gabor(11)

    def run(a: Any, w: Any) -> Any:
        return _map(a, w, "symmetric", 11).data

    got = jax.jit(run)(jnp.asarray(a), jnp.asarray(w0))
    assert got.dtype == np.complex64
    _close(got, _direct(a, w0, "symmetric"), 2e-6)
    assert len(lowered) and set(lowered) <= DENSE


@pytest.mark.slow  # 8-16 s on 2 loaded cores, mostly compiling the derivatives
@pytest.mark.parametrize("k", [5, 11])  # slices, FFT
def test_gradient_of_a_real_loss_matches_finite_differences(x64: None, k: int) -> None:
    a = _data((14, 12), 12, np.complex128)
    w = _gabor(k, np.complex128) + np.random.default_rng(12).standard_normal((k, k))

    def loss(a: Any) -> Any:
        out = _map(a, w, "reflect", k, backend="xla").data
        return jnp.sum(jnp.abs(out) ** 2)

    check_grads(loss, (jnp.asarray(a),), order=1, modes=("rev",), atol=1e-6, rtol=1e-6)
    assert jax.grad(loss)(jnp.asarray(a)).dtype == np.complex128


@pytest.mark.slow
def test_forward_and_reverse_derivatives_of_the_field(x64: None) -> None:
    a = _data((14, 12), 13, np.complex128)
    w = _gabor(11, np.complex128)

    def field(a: Any) -> Any:
        return _map(a, w, "periodic", 11, backend="xla").data

    check_grads(field, (jnp.asarray(a),), order=1, modes=("fwd", "rev"), atol=1e-6, rtol=1e-6)


@pytest.fixture
def fused(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The fused lowering (an accelerator's), traced anew."""
    monkeypatch.setenv(boundary.LOWERING_ENV, "fused")
    xstencil.clear_caches()
    yield recorded(monkeypatch, dense, "correlate", keep=lambda args, out: args[-1])
    monkeypatch.delenv(boundary.LOWERING_ENV, raising=False)
    xstencil.clear_caches()


@pytest.mark.parametrize("weights", ["real", "complex", "runtime"])
def test_fused_lowering_runs_the_rows_loop(fused: list[str], weights: str) -> None:
    a = _data((30, 34), 13)
    a[4, 4] = complex(np.nan, 0)
    w = _gabor(15) if weights != "real" else np.random.default_rng(1).standard_normal(
        (15, 15)).astype(np.float32)
    w[0, :] = 0
    if weights == "runtime":
        got = jax.jit(lambda a, w: _map(a, w, "fill", 15).data)(jnp.asarray(a), jnp.asarray(w))
    else:
        got = _map(a, w, "fill", 15, backend="xla").values
    want = _direct(a, w, "fill")
    np.testing.assert_array_equal(np.isnan(np.asarray(got)), np.isnan(want))
    fin = np.isfinite(want)
    _close(np.where(fin, got, 0), np.where(fin, want, 0), 2e-6)
    assert "rows" in fused and set(fused) <= {"rows"}


@pytest.mark.parametrize("weights", ["real", "complex"])
def test_real_runtime_weights_take_two_real_correlations(monkeypatch: pytest.MonkeyPatch,
                                                         weights: str) -> None:
    """Real weights closed over (so traced) are cast to complex by the
    kernel; :func:`~xstencil._engine.dense_complex.real_weights` reads from
    the jaxpr that their imaginary part is 0, so the correlations are those
    of the data's two parts with real weights (four with complex ones)."""
    xstencil.clear_caches()
    seen = recorded(monkeypatch, dense, "correlate",
                    keep=lambda args, out: (jnp.iscomplexobj(args[0]), jnp.iscomplexobj(args[1])))
    a = _data((30, 31), 14)
    w = np.random.default_rng(2).standard_normal((11, 11)).astype(np.float32)
    if weights == "complex":
        w = _gabor(11)
    got = _map(a, w, "reflect", 11, backend="xla")
    _close(got.values, _direct(a, w, "reflect"), 2e-6)
    wholes = [c for c in seen if c[0]]
    parts = len(seen) - len(wholes)
    assert wholes and all(c == (True, weights == "complex") for c in wholes)
    assert parts == (2 if weights == "real" else 4) * len(wholes)


def test_real_weights_reads_the_jaxpr() -> None:
    u = jnp.zeros((3,), np.complex64)
    phase = jnp.arange(3.0, dtype=np.float32)
    cases = {  # kernel of (cells, traced input) -> weights known real
        lambda u, p: (u * p.astype(np.complex64)).sum() + 1j: True,
        lambda u, p: (u * jnp.exp(1j * p.astype(np.complex64))).sum(): False,
        lambda u, p: (u * lax_complex(p)).sum(): False,
        lambda u, p: (u / (2 * p.astype(np.complex64))).sum(): True,
        lambda u, p: (u * jnp.sqrt(p.astype(np.complex64) - 1)).sum(): False,
        lambda u, p: (u * jnp.exp(p.astype(np.complex64))).sum(): False,  # exp: not kept
    }
    for kernel, want in cases.items():
        closed = jax.make_jaxpr(kernel)(u, phase)
        assert real_weights(closed, 1) is want


def lax_complex(p: Any) -> Any:
    return jax.lax.complex(p, jnp.zeros_like(p))  # 0, but not known to be

"""Dense windows whose weights are runtime inputs (issue 17, item 3).

Arrays a kernel closes over are inputs of the compiled program (compile once,
``xstencil._engine.kcache``), so ``lambda u: (u * w).sum()`` sees ``w`` as a
traced value.  ``xstencil._engine.affine`` decides from the jaxpr that the
kernel is linear in its window and computes the weights in the program; the
slices and FFT lowerings take them as traced arrays.

References are independent: a numpy loop over the window's cells on a
``numpy.pad``-ded array, ``scipy.ndimage.correlate``, ``check_grads`` and
finite differences.
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
from tests.compiles import compiles
from xstencil._engine import affine

NUMPY_MODE = {"fill": "constant", "extend": "edge", "periodic": "wrap", "reflect": "reflect",
              "symmetric": "symmetric"}


def _loop(a: np.ndarray, w: np.ndarray, mode: str, steps: tuple[int, int] = (1, 1),
          fill: float = 0.0) -> np.ndarray:
    """The direct sum, one window cell at a time; cells of weight 0 are not read."""
    ky, kx = w.shape
    kw = {"constant_values": fill} if mode == "fill" else {}
    p = np.pad(a, ((ky // 2, ky // 2), (kx // 2, kx // 2)), mode=NUMPY_MODE[mode], **kw)
    ny, nx = a.shape
    out = np.zeros(((ny - 1) // steps[0] + 1, (nx - 1) // steps[1] + 1))
    with np.errstate(invalid="ignore"):  # inf - inf is NaN, as in the direct sum
        _accumulate(out, p, w, (ny, nx), steps)
    return out


def _accumulate(out: np.ndarray, p: np.ndarray, w: np.ndarray, shape: tuple[int, int],
                steps: tuple[int, int]) -> None:
    ky, kx = w.shape
    ny, nx = shape
    for i in range(ky):
        for j in range(kx):
            if w[i, j] != 0:
                out += w[i, j] * p[i:i + ny:steps[0], j:j + nx:steps[1]]


def _map(a: Any, kernel: Any, k: int, mode: str, *args: Any, **kw: Any) -> Any:
    da = xr.DataArray(a, dims=("y", "x"))
    return da.stencil.map(kernel, *args, window={"y": k, "x": k}, boundary=mode, **kw)


@pytest.mark.parametrize("k", [3, 9, 15, 31])
@pytest.mark.parametrize("mode", list(NUMPY_MODE))
def test_closed_over_weights_match_numpy_loop(x64: None, k: int, mode: str) -> None:
    rng = np.random.default_rng(k)
    a = rng.standard_normal((37, 44))
    w = rng.standard_normal((k, k))
    out = _map(a, lambda u: (u * w).sum(), k, mode, fill_value=0.0).values
    np.testing.assert_allclose(out, _loop(a, w, mode), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("k", [9, 21])
@pytest.mark.parametrize("mode", ["fill", "periodic", "symmetric"])
def test_strided_runtime_weights(x64: None, k: int, mode: str) -> None:
    rng = np.random.default_rng(2)
    a = rng.standard_normal((41, 50))
    w = rng.standard_normal((k, k))
    out = _map(a, lambda u: (w * u).sum(), k, mode, fill_value=0.0,
               stride={"y": 2, "x": 3}).values
    np.testing.assert_allclose(out, _loop(a, w, mode, (2, 3)), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("k", [15, 21, 31, 63])
def test_large_windows_run_where_gathering_is_refused(k: int) -> None:
    """Every window at once would need over 1 GiB from k = 21 (the generic
    lowering's refusal); a linear kernel is an FFT of the runtime weights."""
    rng = np.random.default_rng(k)
    a = rng.standard_normal((1030, 1040)).astype(np.float32)
    w = rng.standard_normal((k, k)).astype(np.float32)
    assert a.size * k * k * 4 > 2**30 or k == 15
    out = _map(a, lambda u: (u * w).sum(), k, "periodic").values
    assert out.dtype == np.float32
    # the direct sum in float64 at some outputs, near the edges and inside
    h = k // 2
    tol = 3e-6 * np.sqrt(k * k) * 4
    for i, j in [(0, 0), (1029, 1039), (3, 1035), (500, 7), (517, 611), (1000, 2)]:
        rows = (np.arange(i - h, i + h + 1) % 1030)[:, None]
        cols = (np.arange(j - h, j + h + 1) % 1040)[None, :]
        ref = np.sum(a[rows, cols].astype(np.float64) * w.astype(np.float64))
        np.testing.assert_allclose(out[i, j], ref, atol=tol)


@pytest.mark.parametrize("k", [9, 15])
def test_new_weight_values_give_new_answers_without_compiling(x64: None, k: int) -> None:
    rng = np.random.default_rng(3)
    a = rng.standard_normal((30, 34))
    w = rng.standard_normal((k, k))
    w[0, :] = 0.0  # a zero row that becomes nonzero later: the support is a runtime value
    a[0, 5] = np.nan

    def kernel(u: Any) -> Any:
        return (u * w).sum()

    def check() -> None:
        out = _map(a, kernel, k, "extend").values
        ref = _loop(a, w, "extend")
        np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
        ok = np.isfinite(ref)
        np.testing.assert_allclose(out[ok], ref[ok], rtol=1e-10, atol=1e-10)

    check()
    with compiles() as got:
        w[...] = rng.standard_normal((k, k))  # changed in place: read afresh
        check()
        w = np.where(rng.random((k, k)) < 0.3, 0.0, rng.standard_normal((k, k)))  # a new array
        check()
    assert got["compiles"] == 0


@pytest.mark.parametrize("k", [9, 15])
@pytest.mark.parametrize("mode", ["fill", "periodic", "symmetric"])
def test_nans_stay_local_with_runtime_zeros(x64: None, k: int, mode: str) -> None:
    """Cells of runtime weight 0 are not read, so a NaN under them (or the
    default NaN fill) does not reach the output, as with constant weights."""
    rng = np.random.default_rng(4)
    a = rng.standard_normal((40, 45))
    a[20, 22] = np.nan
    a[3, 40] = np.inf
    w = rng.standard_normal((k, k))
    w[:, -2:] = 0.0
    w[k // 2, k // 2] = 0.0
    out = _map(a, lambda u: (u * w).sum(), k, mode).values  # fill: the default NaN fill
    ref = _loop(a, w, mode, fill=np.nan)
    # (the FFT gives NaN where the direct sum meets infinities of one sign only)
    np.testing.assert_array_equal(np.isfinite(out), np.isfinite(ref))
    assert np.isfinite(out).sum() > 0
    ok = np.isfinite(ref)
    np.testing.assert_allclose(out[ok], ref[ok], rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("k", [3, 15])  # runtime slices (3x3: 9 cells) and the FFT
def test_gradient_with_respect_to_weights(x64: None, k: int) -> None:
    rng = np.random.default_rng(5)
    a = rng.standard_normal((24, 26))
    target = rng.standard_normal((24, 26))

    def fit(w: Any) -> Any:
        out = _map(a, lambda u: (u * w).sum(), k, "periodic").data
        return jnp.sum((out - target) ** 2)

    w0 = jnp.asarray(rng.standard_normal((k, k)))
    check_grads(jax.jit(fit), (w0,), order=1, modes=["rev", "fwd"], atol=1e-5, rtol=1e-5)
    # against finite differences of the numpy reference, at one weight
    g = jax.jit(jax.grad(fit))(w0)
    e = np.zeros((k, k))
    e[1, 2] = 1e-6
    wn = np.asarray(w0)
    fd = (np.sum((_loop(a, wn + e, "periodic") - target) ** 2)
          - np.sum((_loop(a, wn - e, "periodic") - target) ** 2)) / 2e-6
    np.testing.assert_allclose(g[1, 2], fd, rtol=1e-6)


def test_gradient_under_jit_and_vmap_over_weights(x64: None) -> None:
    rng = np.random.default_rng(6)
    a = rng.standard_normal((20, 22))
    ws = jnp.asarray(rng.standard_normal((3, 11, 11)))

    def one(w: Any) -> Any:
        return _map(a, lambda u: (u * w).sum(), 11, "extend").data

    outs = jax.jit(jax.vmap(one))(ws)
    for i in range(3):
        np.testing.assert_allclose(outs[i], _loop(a, np.asarray(ws[i]), "extend"), rtol=1e-10,
                                   atol=1e-10)
    grads = jax.jit(jax.grad(lambda w: one(w).sum()))(ws[0])
    # d/dw[i, j] of sum(out) is the sum of the padded field's slice under cell (i, j)
    p = np.pad(a, 5, mode="edge")
    ref = np.array([[p[i:i + 20, j:j + 22].sum() for j in range(11)] for i in range(11)])
    np.testing.assert_allclose(grads, ref, rtol=1e-10)


def test_weights_passed_as_an_argument(x64: None) -> None:
    rng = np.random.default_rng(7)
    a = rng.standard_normal((33, 36))
    w = rng.standard_normal((31, 31))
    out = _map(a, lambda u, t: (u * t).sum(), 31, "reflect", jnp.asarray(w)).values
    np.testing.assert_allclose(out, _loop(a, w, "reflect"), rtol=1e-10, atol=1e-10)


def test_other_linear_forms(x64: None) -> None:
    """A normalized sum with a runtime bias, a runtime mask and a product with
    a runtime vector are all linear in the window."""
    rng = np.random.default_rng(8)
    a = rng.standard_normal((30, 32))
    w = rng.standard_normal((13, 13))
    b = np.asarray(0.25)
    mask = rng.random((13, 13)) < 0.5
    v = rng.standard_normal(13)
    out = _map(a, lambda u: jnp.sum(w * u) / w.sum() + b, 13, "periodic").values
    np.testing.assert_allclose(out, _loop(a, w / w.sum(), "periodic") + 0.25, rtol=1e-9,
                               atol=1e-9)
    out = _map(a, lambda u: jnp.where(mask, u, 0.0).sum(), 13, "periodic").values
    np.testing.assert_allclose(out, _loop(a, mask.astype(float), "periodic"), rtol=1e-10,
                               atol=1e-10)
    out = _map(a, lambda u: (u @ v).sum(), 13, "periodic").values
    np.testing.assert_allclose(out, _loop(a, np.broadcast_to(v, (13, 13)), "periodic"),
                               rtol=1e-10, atol=1e-10)


def test_nonlinear_kernel_with_runtime_weights_keeps_the_general_path(x64: None) -> None:
    rng = np.random.default_rng(9)
    a = rng.standard_normal((25, 27))
    w = rng.standard_normal((9, 9))
    out = _map(a, lambda u: (u * u * w).sum(), 9, "periodic").values
    np.testing.assert_allclose(out, _loop(a * a, w, "periodic"), rtol=1e-10, atol=1e-10)


def test_float32_data_with_float64_weights_keeps_their_precision(x64: None) -> None:
    """The kernel computes in float64: the weights keep their low bits."""
    rng = np.random.default_rng(10)
    a = rng.standard_normal((30, 31)).astype(np.float32)
    w = rng.standard_normal((9, 9)) * (1 + 1e-12)
    out = _map(a, lambda u: (u.astype(jnp.float64) * w).sum(), 9, "periodic").values
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, _loop(a.astype(np.float64), w, "periodic"), rtol=1e-12,
                               atol=1e-12)


def test_half_precision_runtime_fft() -> None:
    rng = np.random.default_rng(11)
    a = rng.standard_normal((40, 40)).astype(np.float16)
    w = rng.standard_normal((15, 15)).astype(np.float16)
    out = _map(a, lambda u: (u * w).sum(), 15, "periodic").values
    assert out.dtype == np.float16
    ref = ndi.correlate(a.astype(np.float64), w.astype(np.float64), mode="wrap")
    np.testing.assert_allclose(out.astype(np.float64), ref, rtol=2e-2, atol=0.05)


def test_kmap_constant_path_still_agrees(x64: None) -> None:
    rng = np.random.default_rng(12)
    a = rng.standard_normal((30, 30))
    w = rng.standard_normal((15, 15))
    f = xstencil.kmap(kernel_size=(15, 15), padding="same")(lambda u: jnp.sum(u * w))
    np.testing.assert_allclose(f(jnp.asarray(a)), _loop(a, w, "fill"), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(_map(a, lambda u: jnp.sum(u * w), 15, "fill",
                                    fill_value=0.0).values, f(jnp.asarray(a)), rtol=1e-10,
                               atol=1e-10)


def _affine(kernel: Any, *args: Any) -> bool:
    closed = jax.make_jaxpr(kernel)(jnp.zeros((5, 5)), *args)
    return affine.is_affine(closed, 1)


def test_is_affine_reads_the_jaxpr() -> None:
    t = jnp.ones((5, 5))
    assert _affine(lambda u, t: (u * t).sum(), t)
    assert _affine(lambda u, t: (u / t.sum()).mean() - t[0, 0], t)
    assert _affine(lambda u, t: jnp.where(t > 0, u, 0.0)[::-1].T[1:4].sum(), t)
    assert _affine(lambda u, t: u[jnp.argmax(t) % 5].sum(), t)  # a runtime index
    assert not _affine(lambda u, t: (u * u * t).sum(), t)
    assert not _affine(lambda u, t: jnp.sin(u).sum(), t)
    assert not _affine(lambda u, t: u[jnp.argmax(u) % 5].sum(), t)  # index from the window
    assert not _affine(lambda u, t: jax.lax.stop_gradient(u).sum(), t)  # derivative is not it
    assert not _affine(lambda u, t: jnp.where(u > 0, u, 0.0).sum(), t)  # relu
    assert not _affine(lambda u, t: (u * t), t)  # not a scalar

    @jax.custom_jvp
    def twice(x: Any) -> Any:
        return 2.0 * x

    twice.defjvp(lambda p, tg: (twice(p[0]), 3.0 * tg[0]))
    assert not _affine(lambda u, t: twice(u).sum(), t)  # a custom rule: refused


def test_window_wider_than_the_periodic_field(x64: None) -> None:
    rng = np.random.default_rng(13)
    a = rng.standard_normal((20, 25))
    w = rng.standard_normal((31, 27))
    da = xr.DataArray(a, dims=("y", "x"))
    out = da.stencil.map(lambda u: (u * w).sum(), window={"y": 31, "x": 27},
                         boundary="periodic").values
    np.testing.assert_allclose(out, _loop(a, w, "periodic"), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize(("shape", "window"), [((50,), (41,)), ((12, 13, 14), (5, 5, 5))])
def test_one_and_three_dims(x64: None, shape: tuple[int, ...], window: tuple[int, ...]) -> None:
    rng = np.random.default_rng(14)
    a = rng.standard_normal(shape)
    w = rng.standard_normal(window)
    dims = ("z", "y", "x")[-len(shape):]
    out = xr.DataArray(a, dims=dims).stencil.map(
        lambda u: (u * w).sum(), window=dict(zip(dims, window, strict=True)),
        boundary="symmetric").values
    np.testing.assert_allclose(out, ndi.correlate(a, w, mode="reflect"), rtol=1e-10,
                               atol=1e-10)


@pytest.mark.parametrize("k", [3, 15])
def test_weight_gradient_stays_finite_next_to_a_nan(x64: None, k: int) -> None:
    """The outputs a NaN reaches are dropped from the loss; the gradient of
    the rest is finite and matches finite differences of the numpy loop."""
    rng = np.random.default_rng(15)
    a = rng.standard_normal((22, 24))
    a[10, 12] = np.nan
    w0 = rng.standard_normal((k, k))
    w0[0, 0] = 0.0  # a zero weight: the cell is not read

    def loss_np(w: np.ndarray) -> float:
        out = _loop(a, w, "periodic")
        return float(np.sum(np.where(np.isfinite(out), out, 0.0) ** 2))

    def loss(w: Any) -> Any:
        out = _map(a, lambda u: (u * w).sum(), k, "periodic").data
        return jnp.sum(jnp.where(jnp.isfinite(out), out, 0.0) ** 2)

    g = np.asarray(jax.jit(jax.grad(loss))(jnp.asarray(w0)))
    assert np.isfinite(g).all()
    for i, j in [(1, 1), (k - 1, k // 2)]:
        e = np.zeros((k, k))
        e[i, j] = 1e-6
        fd = (loss_np(w0 + e) - loss_np(w0 - e)) / 2e-6
        np.testing.assert_allclose(g[i, j], fd, rtol=1e-6)

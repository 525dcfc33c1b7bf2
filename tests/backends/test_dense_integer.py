"""Dense windows over integer and bool images (``xstencil/_engine/intcells.py``).

A Gaussian over a ``uint8`` image casts every cell to float32 before it
multiplies: it takes the dense lowering (the host's separable passes or FFT,
XLA's FFT under ``jit``), as float data do, instead of a shifted slice per
window cell (a 15 x 15 Gaussian on a 1024² uint8 image took 7 s to compile
and 67 ms a call that way, against 0.07 s and 1.7 ms for float32 data).
Checked against ``scipy.ndimage`` and a float64 direct sum, and on what
must stay exact: integer arithmetic before the cast (it wraps), integer
results, integers a float32 does not hold.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.ndimage as ndi
import xarray as xr

import xstencil  # noqa: F401 - registers the accessor
from tests.backends.test_hostfft import _bound, _direct, _gauss
from xstencil._engine.intcells import exact_in, float_cells

pytest.importorskip("numba")

IMAGE_DTYPES = [np.uint8, np.int8, np.uint16, np.int16, np.bool_]


@pytest.fixture(autouse=True)
def _standard_promotion() -> Any:
    """JAX's default promotion, as users run it (the suite runs strict):
    ``uint8 * float32`` is float32."""
    with jax.numpy_dtype_promotion("standard"):
        yield


def _image(dtype: Any, shape: tuple[int, int] = (70, 83), seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if np.dtype(dtype) == np.bool_:
        return rng.random(shape) < 0.3
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, shape, endpoint=True).astype(dtype)


@pytest.mark.parametrize("dtype", IMAGE_DTYPES)
def test_a_gaussian_over_an_image_is_scipy_ndimages_gaussian_filter(
        calls: dict[str, list[Any]], dtype: Any) -> None:
    """The port of ``scipy.ndimage.gaussian_filter(image, sigma, mode="mirror")``
    (scikit-image's ``filters.gaussian`` calls it) on an integer or bool
    image: the same numbers to float32 rounding, float32 out, coords and
    name kept, by the host's two 1-D passes."""
    img = _image(dtype)
    sigma, truncate = 2.0, 3.5
    radius = int(truncate * sigma + 0.5)
    g = _gauss(2 * radius + 1, sigma).astype(np.float32)
    w = np.outer(g, g)
    da = xr.DataArray(img, dims=("y", "x"), name="img",
                      coords={"x": np.arange(img.shape[1]) * 0.5})
    got = da.stencil.map(lambda u: (u * w).sum(), window={"y": w.shape[0], "x": w.shape[1]},
                         boundary="reflect", backend="loops")
    assert calls == {"host": [True], "passes": [True]}
    want = ndi.gaussian_filter(img.astype(np.float64), sigma, mode="mirror", truncate=truncate)
    assert got.dtype == np.float32 and got.name == "img"
    np.testing.assert_array_equal(got.x, da.x)
    scale = float(np.abs(img.astype(np.float64)).max())
    np.testing.assert_allclose(got.values, want, rtol=0, atol=1e-5 * scale + 1e-6)


# every mode on uint8 and periodic on int16 in the fast run (4-8 s a case on 2 cores)
@pytest.mark.parametrize(("dtype", "mode"), [
    pytest.param(dtype, mode, id=f"{np.dtype(dtype).name}-{mode}",
                 marks=() if dtype == np.uint8 or mode == "periodic" else pytest.mark.slow)
    for dtype in (np.uint8, np.int16)
    for mode in ("periodic", "reflect", "symmetric", "extend", "fill")])
def test_dense_weights_over_an_image_take_the_fft_in_every_mode(
        calls: dict[str, list[Any]], mode: str, dtype: Any) -> None:
    """Weights of full rank run the host FFT on the image cast to float32;
    the direct float64 sum and XLA's program (which lowers the same kernel
    to its own FFT now) agree to FFT rounding; the fill value is cast to the
    image's dtype first, as the kernel's halo holds it."""
    img = _image(dtype, seed=1)
    rng = np.random.default_rng(2)
    w = rng.standard_normal((13, 11)).astype(np.float32)
    da = xr.DataArray(img, dims=("y", "x"))
    opts = {"window": {"y": 13, "x": 11}, "boundary": mode, "fill_value": 7}
    got = da.stencil.map(lambda u: (u * w).sum(), backend="loops", **opts)
    assert calls == {"host": [True], "passes": []}
    xla = da.stencil.map(lambda u: (u * w).sum(), backend="xla", **opts)
    want = _direct(img, w, mode, 7.0)
    bound = _bound(img.astype(np.float64), w, np.finfo(np.float32).eps)
    assert got.dtype == xla.dtype == np.float32
    assert np.abs(got.values - want).max() < bound
    assert np.abs(xla.values - want).max() < bound


def test_constant_weights_and_strides_over_an_image(calls: dict[str, list[Any]]) -> None:
    """``u.mean()`` (constant weights, known when compiling) over a uint8
    image, strided, in float32 and in float64 (``dtype=``): the window's
    mean to rounding."""
    img = _image(np.uint8, (64, 90), seed=3)
    da = xr.DataArray(img, dims=("y", "x"))
    w = np.full((11, 11), 1 / 121)
    for dtype in (None, np.float64):
        got = da.stencil.map(lambda u: u.mean(), window={"y": 11, "x": 11},
                             boundary="extend", stride={"y": 2, "x": 3}, dtype=dtype)
        want = _direct(img, w, "extend", stride=(2, 3))
        assert got.shape == want.shape
        np.testing.assert_allclose(got.values, want, rtol=0, atol=1e-4)


def test_integer_arithmetic_before_the_cast_stays_exact(calls: dict[str, list[Any]]) -> None:
    """``u + u`` on uint8 cells wraps at 256 before the cast: not a linear
    sum, so no FFT; the map gives the wrapped values' sum, as the kernel
    says, and so does XLA."""
    img = np.full((40, 50), 200, np.uint8)
    img[::3] = 7
    rng = np.random.default_rng(4)
    w = rng.random((9, 9)).astype(np.float32)
    da = xr.DataArray(img, dims=("y", "x"))
    opts = {"window": {"y": 9, "x": 9}, "boundary": "periodic"}
    want = _direct((2 * img.astype(np.int64)) % 256, w, "periodic")
    for backend in ("loops", "xla"):
        got = da.stencil.map(lambda u: ((u + u) * w).sum(), backend=backend, **opts)
        np.testing.assert_allclose(got.values, want, rtol=1e-5)
    assert calls["host"] == []


def test_integer_results_and_wide_integers_keep_the_exact_lowering(
        calls: dict[str, list[Any]]) -> None:
    """A window sum of a uint8 image is an integer (uint32: exact, no FFT),
    and int32 data are not all float32 values: their float32 Gaussian keeps
    the kernel's own casts (no FFT either), still the direct sum's value."""
    img = _image(np.uint8, (30, 40), seed=5)
    da = xr.DataArray(img, dims=("y", "x"))
    total = da.stencil.map(lambda u: u.sum(), window={"y": 11, "x": 11}, boundary="fill",
                           fill_value=0)
    want = _direct(img, np.ones((11, 11)), "fill", 0.0)
    assert np.issubdtype(total.dtype, np.unsignedinteger)
    np.testing.assert_array_equal(total.values, want.astype(total.dtype))
    big = (img.astype(np.int32) << 20) + 12345
    w = np.outer(_gauss(11, 2.0), _gauss(11, 2.0)).astype(np.float32)
    got = xr.DataArray(big, dims=("y", "x")).stencil.map(
        lambda u: (u * w).sum(), window={"y": 11, "x": 11}, boundary="reflect")
    assert calls["host"] == [] and got.dtype == np.float32
    want = _direct(big.astype(np.float32), w, "reflect")
    np.testing.assert_allclose(got.values, want, rtol=1e-5)


def test_under_jit_and_grad_the_image_takes_xlas_fft() -> None:
    """Under ``jit`` the same kernel compiles as one FFT, and the gradient
    of the output's sum with respect to the weights is, per window cell,
    the sum of the padded image over the cells it reads."""
    img = _image(np.uint8, (48, 40), seed=6)
    da = xr.DataArray(img, dims=("y", "x"))
    rng = np.random.default_rng(7)
    w0 = rng.random((11, 11)).astype(np.float32)

    def total(w: Any) -> Any:
        out = da.stencil.map(lambda u, w: (u * w).sum(), w, window={"y": 11, "x": 11},
                             boundary="periodic")
        return jnp.sum(out.data)

    got = jax.jit(total)(w0)
    want = _direct(img, w0, "periodic").sum()
    assert abs(float(got) - want) < 1e-4 * abs(want)
    grad = jax.grad(total)(w0)
    # every output reads each window cell once, over the whole periodic image
    np.testing.assert_allclose(np.asarray(grad), np.full((11, 11), img.astype(np.float64).sum()),
                               rtol=1e-5)


def test_exact_in_says_which_integers_a_float_holds() -> None:
    assert exact_in(np.bool_, np.float32) and exact_in(np.uint16, np.float32)
    assert exact_in(np.int16, np.float32) and not exact_in(np.int32, np.float32)
    assert exact_in(np.uint32, np.float64) and not exact_in(np.int64, np.float64)
    assert not exact_in(np.uint8, np.int32) and not exact_in(np.float32, np.float64)
    assert exact_in(np.uint8, np.float16) and not exact_in(np.uint16, np.float16)


@pytest.mark.parametrize(("kernel", "ok"), [
    (lambda u: (u * jnp.float32(0.5)).sum(), True),
    (lambda u: u.astype(jnp.float32)[1:, :].sum() + u.astype(jnp.float32)[0, 0], True),
    (lambda u: jax.lax.pad(u, np.uint8(3), [(1, 1, 0), (1, 1, 0)]).astype(jnp.float32).sum(),
     True),
    (lambda u: jnp.pad(u, 1).astype(jnp.float32).sum(), False),  # inside a jit: not followed
    (lambda u: (u + u).astype(jnp.float32).sum(), False),  # wraps
    (lambda u: (-u).astype(jnp.float32).sum(), False),
    (lambda u: u.sum(), False),  # an integer result
    (lambda u: jnp.maximum(u, 3).astype(jnp.float32).sum(), False),
    (lambda u: u.astype(jnp.float16).sum().astype(jnp.float32), True),
    (lambda u: jax.lax.dynamic_slice(u, (u[0, 0], np.uint8(0)), (2, 2)).astype(jnp.float32)
     .sum(),
     False),  # a read whose position is a cell's value
])
def test_float_cells_refuses_whatever_the_cast_would_change(kernel: Any, ok: bool) -> None:
    """The float kernel exists only where it computes the integer kernel's
    values on every window; where it does, it agrees on a random one."""
    closed = jax.make_jaxpr(kernel)(jax.ShapeDtypeStruct((4, 5), np.uint8))
    out = float_cells(closed, 1)
    assert (out is not None) == ok
    if ok:
        cells = np.random.default_rng(8).integers(0, 256, (4, 5)).astype(np.uint8)
        want = jax.core.eval_jaxpr(closed.jaxpr, closed.consts, cells)
        got = jax.core.eval_jaxpr(out.jaxpr, out.consts, cells.astype(np.float32))
        assert out.jaxpr.invars[0].aval.dtype == np.float32
        np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(want[0]))

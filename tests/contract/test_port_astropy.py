"""astropy.convolution ported to xstencil as a new user would write it, and
checked against astropy itself (port public codes, keep them as tests).

``astropy.convolution.convolve(array, kernel, ...)`` is a *convolution*: the
kernel is flipped, so the xstencil kernel correlates with ``K[::-1, ::-1]``
(astropy only takes odd kernels, where the flip keeps the centre). Its
options map onto one kernel function:

- ``boundary='fill'`` / ``'extend'`` / ``'wrap'`` are xstencil's ``"fill"``
  (with ``fill_value``) / ``"extend"`` / ``"periodic"``; ``boundary=None``
  zeroes every cell the kernel overhangs, which is ``"valid"`` padded back
  with zeros.
- ``nan_treatment='interpolate'`` (when there is a NaN in the data, or the
  fill value is NaN) is a normalised convolution: the sum of finite values
  times their weights over the sum of those weights; where no weight is
  finite astropy returns the centre value (NaN). ``normalize_kernel=False``
  then multiplies by the kernel's sum.
- ``nan_treatment='fill'`` replaces NaN by ``fill_value`` first.
- ``preserve_nan=True`` puts NaN back where the input had NaN.

xstencil's default ``boundary="fill"`` has a NaN fill value, so with the
interpolating kernel the default boundary is astropy's
``boundary='fill', fill_value=np.nan``: the image's edge is normalised
like a NaN hole.

``convolve_fft`` differs from ``convolve`` in three ways that the port must
follow (tested below): an even kernel is allowed and sits with its extra
cell *before* the centre (xstencil's own default window for an even size);
a window with no finite weight gives 0, not NaN; and ``boundary='wrap'``
wraps over the FFT's work array, which is zero-padded to the kernel's size,
so with a kernel longer than the image it is not periodic over the image
(xstencil's ``"periodic"`` is, as ``convolve`` is).

astropy computes in float64 and casts float32 results back; the float32
ports compute in float32, so they are compared to a few float32 ulps of
``sum|w| * max|u|``.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr

import xstencil  # noqa: F401 - registers the accessor

conv = pytest.importorskip("astropy.convolution")

_MODES = {"fill": "fill", "extend": "extend", "wrap": "periodic"}


def _image(shape: tuple[int, ...], dtype: type = np.float64, holes: bool = True,
           seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    img = (280.0 + 10.0 * rng.random(shape)).astype(dtype)  # temperatures: an offset
    if holes:
        img.flat[rng.choice(img.size, max(1, img.size // 12), replace=False)] = np.nan
        if img.shape[0] > 12 and img.shape[1] > 12:
            img[4:9, 6:11] = np.nan  # a hole wider than a 3 x 3 window
    return img


def _kernels() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {
        "gaussian": conv.Gaussian2DKernel(0.6).array,  # 5 x 5
        "box": conv.Box2DKernel(5).array,
        "custom": rng.random((3, 5)) + 0.05,  # non-square, not symmetric
    }


def _astropy(img: np.ndarray, kernel: np.ndarray, **kw: object) -> np.ndarray:
    with warnings.catch_warnings():
        # astropy warns when a hole is wider than the kernel (NaN left); the
        # port leaves the same NaN, which the comparison checks
        warnings.simplefilter("ignore")
        return conv.convolve(img, kernel, **kw)


def convolve_port(da: xr.DataArray, kernel: np.ndarray, boundary: str | None = "fill",
                  fill_value: float = 0.0, nan_treatment: str = "interpolate",
                  normalize_kernel: bool = True, preserve_nan: bool = False,
                  **map_kw: object) -> xr.DataArray:
    """``astropy.convolution.convolve`` written with ``da.stencil.map``."""
    w = np.asarray(kernel, dtype=da.dtype)[::-1, ::-1]
    ksum = float(np.sum(kernel))
    has_nan = bool(np.isnan(da).any()) or (boundary == "fill" and np.isnan(fill_value))
    interpolate = nan_treatment == "interpolate" and has_nan

    def kern(u):
        v = jnp.where(jnp.isnan(u), fill_value, u) if nan_treatment == "fill" else u
        if interpolate:
            finite = jnp.isfinite(v)
            top = (jnp.where(finite, v, 0) * w).sum()
            bot = (finite.astype(w.dtype) * w).sum()
            r = jnp.where(bot == 0, u(), top / bot)
            return r if normalize_kernel else r * ksum
        r = (v * w).sum()
        return r / ksum if normalize_kernel else r

    window = dict(zip(da.dims, w.shape, strict=True))
    if boundary is None:
        out = da.stencil.map(kern, window=window, boundary="valid", **map_kw)
        out = out.reindex_like(da, fill_value=0.0)  # astropy zeroes the overhang
    else:
        extra = {"fill_value": fill_value} if boundary == "fill" else {}
        out = da.stencil.map(kern, window=window, boundary=_MODES[boundary], **extra, **map_kw)
    if preserve_nan:
        out = out.where(~np.isnan(da))
    return out


def _check(out: xr.DataArray, ref: np.ndarray, img: np.ndarray, kernel: np.ndarray) -> None:
    got = np.asarray(out.values)
    assert got.dtype == ref.dtype
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    scale = np.nanmax(np.abs(img)) * max(1.0, float(np.abs(kernel).sum()))
    rtol = 4e-7 if img.dtype == np.float32 else 1e-13
    np.testing.assert_allclose(got, ref, rtol=0, atol=rtol * scale, equal_nan=True)


def _da(img: np.ndarray) -> xr.DataArray:
    ny, nx = img.shape
    return xr.DataArray(img, dims=("y", "x"), name="sky", attrs={"units": "K"},
                        coords={"y": np.arange(ny) * 0.5, "x": 10.0 + np.arange(nx)})


@pytest.mark.parametrize(("kname", "boundary", "fill_value"),
                         [("gaussian", "fill", 0.0), ("custom", "fill", np.nan),
                          ("box", "extend", 0.0), ("custom", "wrap", 0.0),
                          ("gaussian", None, 0.0)])
def test_convolve_interpolates_nan_like_astropy(kname: str, boundary: str | None,
                                               fill_value: float) -> None:
    kernel = _kernels()[kname]
    img = _image((30, 41))
    with jax.enable_x64(True):
        out = convolve_port(_da(img), kernel, boundary=boundary, fill_value=fill_value)
    ref = _astropy(img, kernel, boundary=boundary, fill_value=fill_value)
    _check(out, ref, img, kernel)
    assert out.name == "sky" and out.attrs == {"units": "K"} and out.dims == ("y", "x")
    np.testing.assert_array_equal(out.x.values, 10.0 + np.arange(41))


def test_default_boundary_is_astropys_nan_fill() -> None:
    """xstencil's default boundary (fill with NaN) with the interpolating
    kernel normalises the edge as astropy's ``fill_value=np.nan`` does, and
    differs from astropy's own default (``fill_value=0``) at the edge only."""
    kernel = _kernels()["gaussian"]
    img = _image((25, 33))
    w = kernel[::-1, ::-1]

    def interp(u):
        finite = jnp.isfinite(u)
        return (jnp.where(finite, u, 0) * w).sum() / (finite.astype(w.dtype) * w).sum()

    with jax.enable_x64(True):
        out = _da(img).stencil.map(interp, window={"y": 5, "x": 5})
    _check(out, _astropy(img, kernel, fill_value=np.nan), img, kernel)
    zero_fill = _astropy(img, kernel)
    inner = (slice(2, -2), slice(2, -2))
    np.testing.assert_allclose(out.values[inner], zero_fill[inner], rtol=1e-13)
    assert np.nanmax(np.abs(out.values[0] - zero_fill[0])) > 50  # 0 pulled in, ~280 K


@pytest.mark.parametrize("normalize_kernel", [True, False])
@pytest.mark.parametrize("nan_treatment", ["interpolate", "fill"])
@pytest.mark.parametrize("preserve_nan", [False, True])
def test_convolve_options_match_astropy(normalize_kernel: bool, nan_treatment: str,
                                        preserve_nan: bool) -> None:
    kernel = _kernels()["custom"]
    img = _image((22, 27), seed=1)
    kw = dict(boundary="fill", fill_value=3.0, nan_treatment=nan_treatment,
              normalize_kernel=normalize_kernel, preserve_nan=preserve_nan)
    with jax.enable_x64(True):
        out = convolve_port(_da(img), kernel, **kw)
    _check(out, _astropy(img, kernel, **kw), img, kernel)


@pytest.mark.parametrize(("kind", "backend"),
                         [("numpy", "loops"), ("numpy", "xla"), ("jax", "auto"),
                          ("dask", "auto")])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_convolve_backends_and_dtypes(kind: str, backend: str, dtype: type) -> None:
    """float32 stays float32 (as astropy casts back), float64 stays float64
    with x64 off, on every backend (a JAX array is float64 only with x64 on:
    ``jnp.asarray`` would cast it before xstencil sees it)."""
    kernel = conv.Box2DKernel(3).array
    img = _image((26, 30), dtype=dtype, seed=2)
    data: object = img
    if kind == "jax":
        with jax.enable_x64(True):
            data = jnp.asarray(img)
        assert data.dtype == dtype
    elif kind == "dask":
        da_mod = pytest.importorskip("dask.array")
        data = da_mod.from_array(img, chunks=(13, 15))
    da = xr.DataArray(data, dims=("y", "x"))
    out = convolve_port(da, kernel, boundary="extend", backend=backend)
    ref = _astropy(img, kernel, boundary="extend")
    assert ref.dtype == dtype
    _check(out, ref, img, kernel)
    assert np.isnan(img).any() and not np.isnan(ref).all()


@pytest.mark.parametrize(("shape", "boundary"), [((1, 17), "wrap"), ((17, 1), "extend"),
                                               ((2, 2), "wrap"), ((3, 4), "fill")])
def test_images_smaller_than_the_kernel(shape: tuple[int, int], boundary: str) -> None:
    """A 5 x 5 kernel over images thinner than its reach: ``wrap`` repeats the
    image as often as needed, as ``np.pad(mode="wrap")`` (astropy's) does."""
    kernel = _kernels()["gaussian"]
    img = _image(shape, holes=False, seed=3)
    img.flat[0] = np.nan
    with jax.enable_x64(True):
        out = convolve_port(_da(img), kernel, boundary=boundary)
    _check(out, _astropy(img, kernel, boundary=boundary), img, kernel)


@pytest.mark.slow
def test_large_gaussian_with_holes_float32() -> None:
    """A 33 x 33 Gaussian (the window's sums run as dense lowerings) over
    float32 data with an offset, scattered NaN and a hole, at a size where
    the loop backend is chosen."""
    kernel = conv.Gaussian2DKernel(4.0).array
    assert kernel.shape == (33, 33)
    img = _image((512, 520), dtype=np.float32, seed=4)
    img[100:140, 200:260] = np.nan  # a hole wider than the kernel: NaN stays
    out = convolve_port(_da(img), kernel, fill_value=np.nan)
    ref = _astropy(img, kernel, fill_value=np.nan)
    assert np.isnan(ref).any()
    _check(out, ref, img, kernel)


# -- convolve_fft ----------------------------------------------------------------------


def test_convolve_fft_even_kernel_is_xstencils_default_window() -> None:
    """An even kernel in ``convolve_fft`` puts its extra cell before the
    centre; flipped, that is xstencil's default window for an even size."""
    rng = np.random.default_rng(5)
    kernel = rng.random((4, 6))
    img = rng.random((20, 23))
    w = kernel[::-1, ::-1]
    with jax.enable_x64(True):
        out = _da(img).stencil.map(lambda u: (u * w).sum(), window={"y": 4, "x": 6},
                                   boundary="fill", fill_value=0.0)
    ref = conv.convolve_fft(img, kernel, normalize_kernel=False)
    np.testing.assert_allclose(out.values, ref, rtol=0, atol=1e-13 * kernel.sum())
    with pytest.raises(Exception, match="odd"):
        conv.convolve(img, kernel)  # convolve itself refuses even kernels


def test_convolve_fft_empty_window_is_zero_not_nan() -> None:
    kernel = np.ones((3, 3))
    img = _image((20, 24), holes=False)
    img[5:15, 5:15] = np.nan
    w = kernel[::-1, ::-1]
    eps = 10 * np.finfo(np.float64).eps

    def fft_interp(u):  # convolve_fft's rule: a weight below 10 eps gives 0
        finite = jnp.isfinite(u)
        bot = (finite.astype(w.dtype) * w).sum()
        return jnp.where(bot < eps, 0.0, (jnp.where(finite, u, 0) * w).sum() / bot)

    with jax.enable_x64(True):
        out = _da(img).stencil.map(fft_interp, window={"y": 3, "x": 3},
                                   boundary="fill", fill_value=0.0)
    ref = conv.convolve_fft(img, kernel)
    np.testing.assert_allclose(out.values, ref, rtol=1e-12)
    assert (ref[6:14, 6:14] == 0).all()
    assert np.isnan(_astropy(img, kernel)[6:14, 6:14]).all()


def test_convolve_fft_wrap_is_periodic_only_when_kernel_fits() -> None:
    rng = np.random.default_rng(6)
    kernel = rng.random((5, 7))
    w = kernel[::-1, ::-1]
    for shape, agrees in [((12, 15), True), ((3, 4), False)]:
        img = rng.random(shape)
        with jax.enable_x64(True):
            out = _da(img).stencil.map(lambda u: (u * w).sum(), window={"y": 5, "x": 7},
                                       boundary="periodic")
        ref = conv.convolve(img, kernel, boundary="wrap", normalize_kernel=False)
        np.testing.assert_allclose(out.values, ref, rtol=1e-13)  # convolve: always
        fft = conv.convolve_fft(img, kernel, boundary="wrap", normalize_kernel=False)
        assert np.allclose(out.values, fft, rtol=1e-12) == agrees

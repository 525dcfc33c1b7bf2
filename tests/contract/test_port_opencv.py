"""OpenCV filters ported to xstencil as a new user would write them, and
checked against OpenCV itself (port public codes, keep them as tests).

Border types map onto xstencil's boundary modes:

==========================  ====================  =====================
OpenCV                      pattern               xstencil
==========================  ====================  =====================
``BORDER_CONSTANT``         ``iiii|abcd|iiii``    ``"fill"``, ``fill_value=0``
``BORDER_REPLICATE``        ``aaaa|abcd|dddd``    ``"extend"``
``BORDER_REFLECT``          ``dcba|abcd|dcba``    ``"symmetric"``
``BORDER_REFLECT_101``      ``dcb|abcd|cba``      ``"reflect"`` (OpenCV's default)
``BORDER_WRAP``             ``abcd|abcd|abcd``    ``"periodic"``
==========================  ====================  =====================

OpenCV's linear filters (``filter2D``, ``Sobel``, ...) refuse
``BORDER_WRAP``; its reference here is ``copyMakeBorder(BORDER_WRAP)``
followed by a filter of the padded image, cropped.

``filter2D`` is a correlation (no flip) whose anchor is the kernel's centre,
``ksize // 2``; for an even size that is one cell after xstencil's default
centre, ``(ksize - 1) // 2``, so the ports give the reach explicitly:
``window={"y": (kh // 2, kh - 1 - kh // 2)}``.

dtypes: with ``ddepth=-1`` OpenCV writes the result in the image's dtype,
rounded to nearest and saturated (a uint8 Sobel clips negative edges to 0).
An xstencil kernel that multiplies by float weights returns float32 (as
numpy and JAX promote), so the ports are compared with OpenCV's
``ddepth=CV_32F`` (``CV_64F`` for float64 images). To get OpenCV's uint8
output, round in the kernel and cast with ``dtype=np.uint8``: xstencil's cast
saturates, as OpenCV does, and never wraps (numpy's ``astype`` would).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr

import xstencil  # noqa: F401 - registers the accessor

cv2 = pytest.importorskip("cv2")

BORDERS = {
    "constant": (cv2.BORDER_CONSTANT, {"boundary": "fill", "fill_value": 0}),
    "replicate": (cv2.BORDER_REPLICATE, {"boundary": "extend"}),
    "reflect": (cv2.BORDER_REFLECT, {"boundary": "symmetric"}),
    "reflect_101": (cv2.BORDER_REFLECT_101, {"boundary": "reflect"}),
    "wrap": (cv2.BORDER_WRAP, {"boundary": "periodic"}),
}
FLOAT = {np.dtype(np.uint8): np.float32, np.dtype(np.uint16): np.float32,
         np.dtype(np.float32): np.float32, np.dtype(np.float64): np.float64}


def _image(shape: tuple[int, int], dtype: type, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if np.issubdtype(dtype, np.integer):
        img = rng.integers(0, np.iinfo(dtype).max, size=shape, endpoint=True).astype(dtype)
    else:
        img = (100.0 + 50.0 * rng.random(shape)).astype(dtype)  # an offset, as pixels have
    return img


def _da(img: np.ndarray) -> xr.DataArray:
    return xr.DataArray(img, dims=("row", "col"), name="frame", attrs={"sensor": "cam0"},
                        coords={"row": np.arange(img.shape[0]),
                                "col": 0.5 * np.arange(img.shape[1])})


def _window(w: np.ndarray) -> dict[str, tuple[int, int]]:
    (kh, kw) = w.shape
    return {"row": (kh // 2, kh - 1 - kh // 2), "col": (kw // 2, kw - 1 - kw // 2)}


def _opts(border: str, dtype: np.dtype) -> dict[str, object]:
    opts = dict(BORDERS[border][1])
    if "fill_value" in opts:
        opts["fill_value"] = dtype.type(0)  # integer data needs an explicit fill value
    return opts


def correlate(da: xr.DataArray, w: np.ndarray, border: str, **kw: object) -> xr.DataArray:
    """``cv2.filter2D(img, CV_32F/CV_64F, w, borderType=...)`` with xstencil."""
    ft = FLOAT[np.dtype(da.dtype)]
    wf = w.astype(ft)
    return da.stencil.map(lambda u: (u.astype(ft) * wf).sum(), window=_window(w),
                          **_opts(border, np.dtype(da.dtype)), **kw)


def _cv(fn, img: np.ndarray, border: str, w_shape: tuple[int, int]) -> np.ndarray:
    """OpenCV's result, with ``BORDER_WRAP`` done by padding first."""
    code = BORDERS[border][0]
    if border != "wrap":
        return fn(img, code)
    kh, kw = w_shape
    top, left = kh // 2, kw // 2
    big = cv2.copyMakeBorder(img, top, kh - 1 - top, left, kw - 1 - left, cv2.BORDER_WRAP)
    return fn(big, cv2.BORDER_CONSTANT)[top:top + img.shape[0], left:left + img.shape[1]]


def _check(out: xr.DataArray, ref: np.ndarray, img: np.ndarray, w: np.ndarray) -> None:
    got = np.asarray(out.values)
    assert got.dtype == ref.dtype
    scale = float(np.abs(w).sum()) * float(np.abs(img.astype(np.float64)).max())
    tol = 1e-13 if ref.dtype == np.float64 else 1e-6
    np.testing.assert_allclose(got, ref, rtol=0, atol=tol * scale)


def _depth(dtype: type) -> int:
    return cv2.CV_64F if dtype == np.float64 else cv2.CV_32F


# -- filter2D: border types x dtypes x window shapes ----------------------------------


@pytest.mark.parametrize("border", list(BORDERS))
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.float32, np.float64])
def test_filter2d_border_types(border: str, dtype: type) -> None:
    """A non-square, even-sized, asymmetric kernel (4 x 6): the anchor and
    the border mapping both show at the edges."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal((4, 6))
    img = _image((23, 31), dtype)
    with jax.enable_x64(dtype == np.float64):
        out = correlate(_da(img), w, border)
    wf = w.astype(FLOAT[np.dtype(dtype)])
    ref = _cv(lambda a, b: cv2.filter2D(a, _depth(dtype), wf, borderType=b), img, border,
              w.shape)
    _check(out, ref, img, w)
    assert out.dims == ("row", "col") and out.name == "frame"
    assert out.attrs == {"sensor": "cam0"}
    np.testing.assert_array_equal(out.col.values, 0.5 * np.arange(31))


def test_border_mapping_differs_at_the_edges_only() -> None:
    """Each pair of neighbouring modes differs, and only in the border band:
    a wrong mapping cannot pass by accident."""
    w = np.random.default_rng(2).standard_normal((5, 5))
    img = _image((20, 24), np.float64)
    outs = {}
    with jax.enable_x64(True):
        for border in ["reflect", "reflect_101"]:
            out = correlate(_da(img), w, border)
            outs[border] = out.values
            ref = _cv(lambda a, b: cv2.filter2D(a, cv2.CV_64F, w, borderType=b), img, border,
                      w.shape)
            _check(out, ref, img, w)
    diff = np.abs(outs["reflect"] - outs["reflect_101"]) > 1e-9
    assert diff[:2].any() and diff[-2:].any() and not diff[2:-2, 2:-2].any()


@pytest.mark.parametrize(("kind", "backend"),
                         [("numpy", "loops"), ("numpy", "xla"), ("jax", "auto"),
                          ("dask", "auto")])
@pytest.mark.parametrize("border", ["reflect_101", "wrap"])
def test_filter2d_backends(kind: str, backend: str, border: str) -> None:
    w = np.random.default_rng(3).standard_normal((3, 5))
    img = _image((30, 36), np.float32, seed=3)
    data: object = img
    if kind == "jax":
        data = jnp.asarray(img)
    elif kind == "dask":
        data = pytest.importorskip("dask.array").from_array(img, chunks=(15, 12))
    da = xr.DataArray(data, dims=("row", "col"))
    out = correlate(da, w, border, backend=backend)
    ref = _cv(lambda a, b: cv2.filter2D(a, cv2.CV_32F, w.astype(np.float32), borderType=b),
              img, border, w.shape)
    _check(out, ref, img, w)


@pytest.mark.parametrize(("size", "border"), [(15, "reflect_101"), (31, "constant"),
                                              (31, "wrap")])
def test_large_windows(size: int, border: str) -> None:
    """15 x 15 and 31 x 31 windows at 512 x 520 (the loop backend's FFT and
    dense lowerings; OpenCV uses its DFT there too), uint8 data."""
    w = np.random.default_rng(size).random((size, size))
    img = _image((512, 520), np.uint8, seed=4)
    out = correlate(_da(img), w, border)
    ref = _cv(lambda a, b: cv2.filter2D(a, cv2.CV_32F, w.astype(np.float32), borderType=b),
              img, border, w.shape)
    _check(out, ref, img, w)


@pytest.mark.parametrize(("shape", "wshape", "border"), [
    ((1, 20), (3, 3), "replicate"), ((20, 1), (5, 3), "reflect"), ((2, 2), (5, 5), "reflect_101"),
    ((2, 2), (15, 15), "reflect"), ((3, 4), (1, 7), "constant"), ((3, 4), (4, 6), "wrap")])
def test_images_smaller_than_the_window(shape: tuple[int, int], wshape: tuple[int, int],
                                        border: str) -> None:
    """Windows that reach past the whole image, where the border repeats
    itself (OpenCV's borderInterpolate and numpy's pad agree)."""
    w = np.random.default_rng(5).standard_normal(wshape)
    img = _image(shape, np.float64, seed=5)
    with jax.enable_x64(True):
        out = correlate(_da(img), w, border)
    ref = _cv(lambda a, b: cv2.filter2D(a, cv2.CV_64F, w, borderType=b), img, border, wshape)
    _check(out, ref, img, w)


def test_reflect_101_on_one_pixel_is_refused() -> None:
    """OpenCV's BORDER_REFLECT_101 on a one-pixel-high image repeats the pixel;
    xstencil's ``"reflect"`` has no mirror there and raises, naming the dim,
    rather than guess. ``"symmetric"`` (or ``"extend"``) along that dim is
    OpenCV's halo."""
    w = np.random.default_rng(11).standard_normal((3, 3))
    img = _image((1, 12), np.float64)
    with jax.enable_x64(True):
        with pytest.raises(ValueError, match=r"'reflect' along 'row' needs at least 2 points"):
            correlate(_da(img), w, "reflect_101")
        out = _da(img).stencil.map(lambda u: (u * w).sum(), window={"row": 3, "col": 3},
                                   boundary={"row": "symmetric", "col": "reflect"})
    ref = cv2.filter2D(img, cv2.CV_64F, w, borderType=cv2.BORDER_REFLECT_101)
    _check(out, ref, img, w)


# -- named filters -------------------------------------------------------------------


def _gauss(k: int, sigma: float) -> np.ndarray:
    x = np.arange(k) - (k - 1) / 2
    g = np.exp(-x**2 / (2 * sigma**2))
    return g / g.sum()


SOBEL = np.array([[-1, 0, 1], [-2, 0, 2], [-1, 0, 1]], float)
SCHARR = np.array([[-3, 0, 3], [-10, 0, 10], [-3, 0, 3]], float)
NAMED = {
    "Sobel dx": (lambda a, d, b: cv2.Sobel(a, d, 1, 0, ksize=3, borderType=b), SOBEL),
    "Sobel dy ksize=5": (lambda a, d, b: cv2.Sobel(a, d, 0, 1, ksize=5, borderType=b),
                         np.outer([-1, -2, 0, 2, 1], [1, 4, 6, 4, 1]).astype(float)),
    "Scharr dy": (lambda a, d, b: cv2.Scharr(a, d, 0, 1, borderType=b), SCHARR.T),
    "Laplacian ksize=1": (lambda a, d, b: cv2.Laplacian(a, d, ksize=1, borderType=b),
                          np.array([[0, 1, 0], [1, -4, 1], [0, 1, 0]], float)),
    "Laplacian ksize=3": (lambda a, d, b: cv2.Laplacian(a, d, ksize=3, borderType=b),
                          np.array([[2, 0, 2], [0, -8, 0], [2, 0, 2]], float)),
    "boxFilter 5x3": (lambda a, d, b: cv2.boxFilter(a, d, (3, 5), borderType=b),
                      np.ones((5, 3)) / 15),
    "boxFilter 4x6 sum": (lambda a, d, b: cv2.boxFilter(a, d, (6, 4), normalize=False,
                                                        borderType=b), np.ones((4, 6))),
    "blur 15x15": (lambda a, d, b: cv2.blur(a, (15, 15), borderType=b), np.ones((15, 15)) / 225),
    "GaussianBlur 7x7": (lambda a, d, b: cv2.GaussianBlur(a, (7, 7), 1.3, borderType=b),
                         np.outer(_gauss(7, 1.3), _gauss(7, 1.3))),
    "GaussianBlur 31x15": (lambda a, d, b: cv2.GaussianBlur(a, (15, 31), 4.0, sigmaY=2.5,
                                                            borderType=b),
                           np.outer(_gauss(31, 2.5), _gauss(15, 4.0))),
}


_PAIRS = [(np.uint8, "reflect_101"), (np.float32, "replicate"), (np.float64, "constant"),
          (np.uint16, "reflect")]


@pytest.mark.parametrize(("name", "dtype", "border"),
                         [(name, *_PAIRS[i % len(_PAIRS)]) for i, name in enumerate(NAMED)]
                         + [("Sobel dx", np.float32, "reflect"),
                            ("GaussianBlur 7x7", np.uint8, "reflect_101")])
def test_named_filters(name: str, dtype: type, border: str) -> None:
    fn, w = NAMED[name]
    img = _image((29, 37), dtype, seed=6)
    ft = FLOAT[np.dtype(dtype)]
    # blur and GaussianBlur keep the input's depth: give them float input
    src = img.astype(ft) if name.startswith(("blur", "Gaussian")) else img
    with jax.enable_x64(dtype == np.float64):
        out = correlate(_da(img), w, border)
    ref = fn(src, _depth(dtype), BORDERS[border][0])
    _check(out, ref, img, w)


# -- dtypes: ddepth=-1, saturation, never a wrap -------------------------------------


def test_uint8_output_saturates_like_ddepth_minus_one() -> None:
    """A uint8 Sobel with ``ddepth=-1``: negative edges clip to 0 and strong
    ones to 255. ``dtype=np.uint8`` saturates the same way; numpy's
    ``astype`` would wrap -4 to 252."""
    img = _image((40, 48), np.uint8, seed=7)

    def sobel_u8(u):
        return jnp.round((u.astype(jnp.float32) * SOBEL.astype(np.float32)).sum())

    out = _da(img).stencil.map(sobel_u8, window={"row": 3, "col": 3}, boundary="reflect",
                               dtype=np.uint8)
    ref = cv2.Sobel(img, -1, 1, 0, ksize=3)
    assert out.dtype == np.uint8
    np.testing.assert_array_equal(out.values, ref)
    raw = correlate(_da(img), SOBEL, "reflect_101").values
    assert (raw < 0).any() and (raw > 255).any()  # both ends were clipped
    assert not np.array_equal(raw.astype(np.int64).astype(np.uint8), ref)  # a wrap differs


def test_uint8_rounding_is_the_users_choice() -> None:
    """OpenCV rounds a uint8 blur to nearest; the cast truncates, as JAX's
    and numpy's do, so a port rounds in the kernel. Both are checked."""
    img = _image((30, 33), np.uint8, seed=8)
    g = np.outer(_gauss(5, 1.1), _gauss(5, 1.1)).astype(np.float32)
    ref = cv2.filter2D(img, -1, g)
    kw = dict(window={"row": 5, "col": 5}, boundary="reflect", dtype=np.uint8)
    rounded = _da(img).stencil.map(lambda u: jnp.round((u.astype(jnp.float32) * g).sum()), **kw)
    truncated = _da(img).stencil.map(lambda u: (u.astype(jnp.float32) * g).sum(), **kw)
    exact = correlate(_da(img), g, "reflect_101").values
    # OpenCV's fixed-point uint8 path may round a value within a float32
    # rounding of .5 the other way: allow 1 there only
    off = np.abs(rounded.values.astype(int) - ref.astype(int))
    assert off.max() <= 1
    assert np.all(np.abs(np.abs(exact[off == 1] - np.floor(exact[off == 1])) - 0.5) < 1e-3)
    np.testing.assert_array_equal(truncated.values, np.floor(exact).astype(np.uint8))
    assert (truncated.values != ref).mean() > 0.2  # truncation is not OpenCV's rule


@pytest.mark.parametrize("backend", ["loops", "xla"])
def test_integer_window_sums_never_wrap(backend: str) -> None:
    """``boxFilter(normalize=False)`` on uint8 and uint16: ``u.sum()`` is a
    uint32 (JAX's default width) and exact; the sum of 961 uint16 values
    would wrap a uint16 and overflow a float16, not a uint32."""
    for dtype in (np.uint8, np.uint16):
        img = np.full((520, 512), np.iinfo(dtype).max, dtype)
        img[::7, ::3] = 0
        out = _da(img).stencil.map(lambda u: u.sum(), window={"row": 31, "col": 31},
                                   boundary="reflect", backend=backend)
        ref = cv2.boxFilter(img.astype(np.float64), -1, (31, 31), normalize=False)
        assert out.dtype == np.uint32
        np.testing.assert_array_equal(out.values, ref.astype(np.uint32))
        assert ref.max() > np.iinfo(np.uint16).max


# -- order statistics: medianBlur, dilate, erode ------------------------------------


@pytest.mark.parametrize(("dtype", "ksize"), [(np.uint8, 3), (np.float32, 5)])
def test_median_blur(dtype: type, ksize: int) -> None:
    """``medianBlur`` always replicates the border."""
    img = _image((27, 35), dtype, seed=9)
    out = _da(img).stencil.map(lambda u: jnp.sort(u.ravel())[ksize * ksize // 2],
                               window={"row": ksize, "col": ksize}, boundary="extend")
    np.testing.assert_array_equal(out.values, cv2.medianBlur(img, ksize))
    assert out.dtype == dtype


@pytest.mark.parametrize(("dtype", "shape_name"), [(np.uint8, "rect 3x5"),
                                                   (np.uint16, "ellipse 7x7"),
                                                   (np.float32, "rect 4x4")])
def test_dilate_erode(dtype: type, shape_name: str) -> None:
    """OpenCV's default border for morphology ignores the outside (a border
    value of +-inf in effect): the port fills with the dtype's extreme, the
    value that can never win the max (min)."""
    se = {"rect 3x5": np.ones((3, 5), np.uint8),
          "ellipse 7x7": cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (7, 7)),
          "rect 4x4": np.ones((4, 4), np.uint8)}[shape_name]
    m = se.astype(bool)
    img = _image((26, 31), dtype, seed=10)
    if np.issubdtype(dtype, np.integer):
        lo, hi = np.iinfo(dtype).min, np.iinfo(dtype).max
    else:
        lo, hi = -np.inf, np.inf
    lo, hi = np.dtype(dtype).type(lo), np.dtype(dtype).type(hi)
    da = _da(img)
    dil = da.stencil.map(lambda u: jnp.where(m, u, lo).max(), window=_window(m),
                         boundary="fill", fill_value=lo)
    ero = da.stencil.map(lambda u: jnp.where(m, u, hi).min(), window=_window(m),
                         boundary="fill", fill_value=hi)
    np.testing.assert_array_equal(dil.values, cv2.dilate(img, se))
    np.testing.assert_array_equal(ero.values, cv2.erode(img, se))
    assert dil.dtype == ero.dtype == dtype

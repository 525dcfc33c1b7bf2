"""A port of scikit-image's grayscale morphology to xstencil, checked bitwise
against ``skimage.morphology`` (session 26; a helper's port matched 1368
cases; this keeps a representative set).

Erosion is the minimum over the footprint, dilation the maximum: as a
kernel, ``jnp.where(fp, u.array, top).min()`` with ``top`` the dtype's
largest value (so cells outside the footprint never win).  skimage pads an
even footprint at the front, which is xstencil's own centre for an even
window; the footprint is not mirrored.  ``opening``/``closing`` apply the
second operation with the footprint mirrored (and padded by one cell at the
front of even dims).  skimage's mode names are scipy's: its ``reflect`` is
xstencil's ``symmetric``.

Also here: an offset given as a numpy integer (``np.nonzero`` gives them)
read the window from its first cell, half a window away, with no warning.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr

import xstencil  # noqa: F401 - registers the .stencil accessor

morphology = pytest.importorskip("skimage.morphology")

MODES = {"reflect": "symmetric", "mirror": "reflect", "nearest": "extend", "wrap": "periodic"}

FOOTPRINTS = {
    "square3": np.ones((3, 3), bool),
    "square4": np.ones((4, 4), bool),
    "rect2x5": np.ones((2, 5), bool),
    "disk2": None,  # filled in below (skimage builds it)
    "custom": np.array([[1, 0, 0], [1, 1, 0], [0, 1, 1]], bool),
}


def _footprint(name: str) -> np.ndarray:
    fp = FOOTPRINTS[name]
    return np.asarray(morphology.disk(2), bool) if fp is None else fp


def _extremes(dtype: np.dtype) -> tuple:
    if dtype.kind == "b":
        return False, True
    if dtype.kind in "ui":
        info = np.iinfo(dtype)
        return info.min, info.max
    return -np.inf, np.inf


def _window(fp: np.ndarray) -> dict:
    return {d: s for d, s in zip(("y", "x"), fp.shape, strict=True)}  # even: xstencil's centre


def erosion(da: xr.DataArray, fp: np.ndarray, mode: str) -> xr.DataArray:
    _, top = _extremes(da.dtype)
    return da.stencil.map(lambda u: jnp.where(fp, u.array, top).min(), window=_window(fp),
                          boundary=MODES[mode])


def dilation(da: xr.DataArray, fp: np.ndarray, mode: str) -> xr.DataArray:
    bottom, _ = _extremes(da.dtype)
    return da.stencil.map(lambda u: jnp.where(fp, u.array, bottom).max(), window=_window(fp),
                          boundary=MODES[mode])


def _mirrored(fp: np.ndarray) -> np.ndarray:
    pad = [(1, 0) if s % 2 == 0 else (0, 0) for s in fp.shape]
    return np.pad(fp, pad)[::-1, ::-1]


def opening(da: xr.DataArray, fp: np.ndarray, mode: str) -> xr.DataArray:
    return dilation(erosion(da, fp, mode), _mirrored(fp), mode)


def closing(da: xr.DataArray, fp: np.ndarray, mode: str) -> xr.DataArray:
    return erosion(dilation(da, fp, mode), _mirrored(fp), mode)


def _image(dtype: str, shape: tuple[int, int] = (23, 30)) -> np.ndarray:
    rng = np.random.default_rng(0)
    if dtype == "bool":
        return rng.random(shape) > 0.6
    if dtype in ("uint8", "uint16"):
        return rng.integers(0, np.iinfo(dtype).max, shape, endpoint=True).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("dtype", ["uint8", pytest.param("uint16", marks=pytest.mark.slow),
                                   "bool", "float32", pytest.param("float64",
                                                                   marks=pytest.mark.slow)])
@pytest.mark.parametrize("fp_name", list(FOOTPRINTS))
def test_erosion_and_dilation_match_skimage(dtype: str, fp_name: str) -> None:
    a, fp = _image(dtype), _footprint(fp_name)
    da = xr.DataArray(a, dims=("y", "x"))
    names = list(MODES)  # two modes a case, all four across the cases
    k = list(FOOTPRINTS).index(fp_name) + ["uint8", "uint16", "bool", "float32",
                                           "float64"].index(dtype)
    for mode in (names[k % 4], names[(k + 1) % 4]):
        ours_e, ours_d = erosion(da, fp, mode), dilation(da, fp, mode)
        assert ours_e.dtype == a.dtype and ours_d.dtype == a.dtype
        np.testing.assert_array_equal(ours_e.values, morphology.erosion(a, fp, mode=mode))
        np.testing.assert_array_equal(ours_d.values, morphology.dilation(a, fp, mode=mode))


@pytest.mark.parametrize("dtype", ["uint8", "float32"])
@pytest.mark.parametrize("fp_name", ["square4", "disk2", "custom"])
def test_opening_closing_and_tophats_match_skimage(dtype: str, fp_name: str) -> None:
    a, fp = _image(dtype), _footprint(fp_name)
    da = xr.DataArray(a, dims=("y", "x"))
    o, c = opening(da, fp, "reflect"), closing(da, fp, "reflect")
    np.testing.assert_array_equal(o.values, morphology.opening(a, fp))
    np.testing.assert_array_equal(c.values, morphology.closing(a, fp))
    np.testing.assert_array_equal((da - o).values, morphology.white_tophat(a, fp))
    np.testing.assert_array_equal((c - da).values, morphology.black_tophat(a, fp))


def test_erosion_large_image_takes_the_same_numbers() -> None:
    """512 x 512 runs as CPU loops: the same bits as skimage."""
    a, fp = _image("uint8", (512, 512)), np.random.default_rng(1).random((4, 4)) > 0.4
    da = xr.DataArray(a, dims=("y", "x"))
    np.testing.assert_array_equal(erosion(da, fp, "reflect").values,
                                  morphology.erosion(a, fp, mode="reflect"))


def test_offsets_from_np_nonzero_read_relative_to_the_centre() -> None:
    """Reads by the footprint's cells, offsets as ``np.nonzero`` gives them."""
    a, fp = _image("uint8"), FOOTPRINTS["custom"]
    offsets = [(i - 1, j - 1) for i, j in zip(*np.nonzero(fp), strict=True)]
    assert isinstance(offsets[0][0], np.integer)
    da = xr.DataArray(a, dims=("y", "x"))
    by_index = da.stencil.map(lambda u: jnp.min(jnp.stack([u[i, j] for i, j in offsets])),
                              window={"y": 3, "x": 3}, boundary="symmetric")
    by_name = da.stencil.map(lambda u: jnp.min(jnp.stack([u(y=i, x=j) for i, j in offsets])),
                             boundary="symmetric")
    want = morphology.erosion(a, fp, mode="reflect")
    np.testing.assert_array_equal(by_index.values, want)
    np.testing.assert_array_equal(by_name.values, want)

"""Windows wider than the field along an axis (session 12 attack).

The loop nest splits each row into its interior and the boundary shell
before and after it.  Where the window was wider than the field, the
interior's first index passed the field's size, so the shell's first run
wrote past the end of the output: a 1-point periodic field with a 7-cell
window crashed the process (segmentation fault), and 2-D fields such as
6 x 2 with a 5 x 9 window came back silently wrong (max error 15.5) on
``backend="loops"``.  XLA was right.  Reference: ``np.pad`` with the same
mode, then a plain correlation loop.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import xarray as xr

import xstencil  # noqa: F401 - registers the accessor

pytest.importorskip("numba")

_NP = {"periodic": "wrap", "reflect": "reflect", "symmetric": "symmetric"}


def _padded(a: np.ndarray, axis: int, h: int, mode: str) -> np.ndarray:
    pads = [(0, 0)] * a.ndim
    pads[axis] = (h, h)
    if mode == "fill":
        return np.pad(a, pads, constant_values=0.0)
    return np.pad(a, pads, mode=_NP[mode])


def _reference(a: np.ndarray, w: np.ndarray, modes: tuple[str, ...]) -> np.ndarray:
    p = a
    for axis, mode in enumerate(modes):
        p = _padded(p, axis, w.shape[axis] // 2, mode)
    out = np.empty_like(a)
    for idx in np.ndindex(*a.shape):
        cell = tuple(slice(i, i + k) for i, k in zip(idx, w.shape, strict=True))
        out[idx] = (p[cell] * w).sum()
    return out


def _map(a: np.ndarray, w: np.ndarray, modes: tuple[str, ...], backend: str) -> np.ndarray:
    dims = ("y", "x")[-a.ndim:]
    da = xr.DataArray(a, dims=dims)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a window wider than the field warns
        return da.stencil.map(lambda u: (u * w).sum(), window=dict(zip(dims, w.shape, strict=True)),
                              boundary=dict(zip(dims, modes, strict=True)), fill_value=0.0,
                              backend=backend).values


@pytest.mark.parametrize("backend", ["loops", "xla"])
@pytest.mark.parametrize(("n", "k", "mode"), [(1, 7, "periodic"), (2, 7, "periodic"),
                                              (2, 9, "symmetric"), (3, 9, "fill"),
                                              (1, 5, "symmetric")])
def test_1d(backend: str, n: int, k: int, mode: str) -> None:
    rng = np.random.default_rng(n * 100 + k)
    a, w = rng.standard_normal(n), rng.standard_normal(k)
    np.testing.assert_allclose(_map(a, w, (mode,), backend), _reference(a, w, (mode,)),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", ["loops", "xla"])
@pytest.mark.parametrize(("shape", "window", "modes"), [
    ((3, 1), (3, 5), ("periodic", "symmetric")),
    ((6, 2), (5, 9), ("reflect", "periodic")),
    ((6, 2), (5, 9), ("reflect", "reflect")),
    ((2, 3), (7, 3), ("fill", "periodic")),
])
def test_2d(backend: str, shape: tuple[int, int], window: tuple[int, int],
            modes: tuple[str, str]) -> None:
    rng = np.random.default_rng(sum(shape) + sum(window))
    a, w = rng.standard_normal(shape), rng.standard_normal(window)
    np.testing.assert_allclose(_map(a, w, modes, backend), _reference(a, w, modes),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("shape", "window"), [((2,), (9,)), ((3, 2), (1, 9)), ((6, 2), (5, 9))])
def test_nothing_is_written_past_the_output(shape: tuple[int, ...],
                                            window: tuple[int, ...]) -> None:
    """The loops write straight into ``out=``: the cells after it keep their
    values.  The old nest wrote each row's extra shell points over the next
    row's first cells (right again only where that row ran later, on the
    same thread) and the last row's past the end of the buffer."""
    rng = np.random.default_rng(7)
    a, w = rng.standard_normal(shape), rng.standard_normal(window)
    dims = ("y", "x")[-len(shape):]
    size = int(np.prod(shape))
    buf = np.full(size + 64, 12345.0)
    out = buf[:size].reshape(shape)
    da = xr.DataArray(a, dims=dims)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = da.stencil.map(lambda u: (u * w).sum(), window=dict(zip(dims, window, strict=True)),
                             boundary="periodic", backend="loops", out=out)
    assert np.shares_memory(got.values, out)
    assert (buf[size:] == 12345.0).all()
    np.testing.assert_allclose(out, _reference(a, w, ("periodic",) * len(shape)),
                               rtol=1e-12, atol=1e-12)

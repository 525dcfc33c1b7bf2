"""Session 30's sweep of the fused lowering (the one a TPU or GPU gets) on
the CPU, where ``XSTENCIL_LOWERING=fused`` forces it: defects it found,
each against a plain numpy reference."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import xarray as xr

import xstencil
from tests.reference import extend
from xstencil._engine import boundary


@pytest.fixture
def fused(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The fused lowering, traced anew."""
    monkeypatch.setenv(boundary.LOWERING_ENV, "fused")
    xstencil.clear_caches()
    yield
    monkeypatch.delenv(boundary.LOWERING_ENV, raising=False)
    xstencil.clear_caches()


def _correlate(a: np.ndarray, w: np.ndarray, mode: str) -> np.ndarray:
    """``sum_c w[c] * a[j + c - k // 2]`` in float64, numpy-padded."""
    pads = [(k // 2, k // 2) for k in w.shape]
    p = extend(a.astype(np.float64), pads, [mode] * a.ndim, 0.0)
    out = np.zeros(a.shape)
    for cell in np.ndindex(w.shape):
        out += w[cell] * p[tuple(slice(c, c + n) for c, n in zip(cell, a.shape, strict=True))]
    return out


@pytest.mark.parametrize("mode", ["fill", "periodic"])
def test_rows_centre_only_weights_that_cancel(fused: None, mode: str) -> None:
    """A dense window of 101-1024 cells runs as a loop over its rows when
    fused, and its sum was always centred on each output's centre value.
    Weights that do not cancel (a blur) gain nothing from that and lose the
    digits of ``r * sum(w)``: a 15 x 15 blur at a spike of 1e4 among values
    near 1 was off by 1e-3 or more, and an 11 x 11 window over one row
    (fill 0) by 7e-4; the FFT the CPU takes, and the uncentred sum, by
    1e-5 or less."""
    rng = np.random.default_rng(0)
    a = rng.random((40, 36)).astype(np.float32)
    a[10, 12] = a[30, 5] = 1e4
    w = np.outer(np.hanning(17)[1:-1], np.hanning(17)[1:-1])
    w = w / w.sum()
    da = xr.DataArray(a, dims=("y", "x"))
    kw = {"fill_value": 0.0} if mode == "fill" else {}
    out = da.stencil.map(lambda u: (u * w).sum(), window={"y": 15, "x": 15}, boundary=mode, **kw)
    ref = _correlate(a, w, mode)
    scale = _correlate(np.abs(a), np.abs(w), mode)  # sum |w| |a|: the rounding's scale
    err = np.abs(out.values.astype(np.float64) - ref)
    assert out.dtype == np.float32
    assert np.all(err <= 16 * np.finfo(np.float32).eps * scale), err.max()

    row = rng.standard_normal((1, 6)).astype(np.float32)
    w11 = np.arange(121.0).reshape(11, 11)
    one = xr.DataArray(row, dims=("y", "x")).stencil.map(
        lambda u: (u * w11).sum(), window={"y": 11, "x": 11}, boundary=mode, **kw)
    ref = _correlate(row, w11, mode)
    scale = _correlate(np.abs(row), w11, mode)
    assert np.all(np.abs(one.values - ref) <= 16 * np.finfo(np.float32).eps * scale)

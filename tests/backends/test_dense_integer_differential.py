"""Differential check of the dense lowering on integer and bool data: each
kernel's map, on the loops and on XLA, against the same map with the dense
lowering switched off (``dense.plan`` answering ``None``: every kernel then
runs its own arithmetic cell by cell, the exact reference).  Integer results
must agree bitwise, float results to FFT rounding; kernels the dense
lowering must refuse (integer arithmetic that wraps before a cast, casts
that round) agree bitwise too, because they keep that lowering.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr

import xstencil
from xstencil._engine import dense

pytest.importorskip("numba")

K = 11  # 121 cells: above dense.FFT_TAPS, so the loops take the dense paths too
_G = tuple(float(v) for v in np.exp(-0.5 * ((np.arange(K) - K // 2) / 2.0) ** 2))
_T = tuple(tuple(int(v) for v in r)
           for r in np.random.default_rng(40).integers(-3, 4, (K, K)))

KERNELS: dict[str, Any] = {
    "mean": lambda u: u.mean(),
    "sum": lambda u: u.sum(),
    "gauss numbers": lambda u: sum(_G[i] * _G[j] * u[i - K // 2, j - K // 2].astype(jnp.float32)
                                   for i in range(K) for j in range(K)),
    "int table": lambda u: sum(_T[i][j] * u[i - K // 2, j - K // 2].astype(jnp.int32)
                               for i in range(K) for j in range(K)),
    "int table 9x9": lambda u: sum(_T[i][j] * u[i - 4, j - 4].astype(jnp.int32)
                                   for i in range(9) for j in range(9)),  # one sum of slices
    "uint32 box minus": lambda u: 3 * u.astype(jnp.uint32).sum() - 11,
    "wraps first": lambda u: (u + u).astype(jnp.float32).sum(),
    "int16 first": lambda u: (u.astype(jnp.int16) * 300).astype(jnp.int32).sum(),
    "float16 cells": lambda u: u.astype(jnp.float16).astype(jnp.float32).sum(),
    "rows then cast": lambda u: jnp.concatenate([u[:3], u[3:]]).astype(jnp.float32).mean(),
}
EXACT = {"sum", "int table", "int table 9x9", "uint32 box minus", "int16 first"}


def _data(dtype: Any) -> np.ndarray:
    rng = np.random.default_rng(41)
    if dtype == np.bool_:
        return rng.random((36, 41)) < 0.5
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, (36, 41), endpoint=True).astype(dtype)


# each case compiles three maps of 121-cell windows (15-40 s on 2 cores): every kernel on
# uint8 and the sum on int16 and bool in the fast run, the rest with the slow tests
@pytest.mark.parametrize(("dtype", "name"), [
    pytest.param(dtype, name, id=f"{np.dtype(dtype).name}-{name}",
                 marks=() if dtype == np.uint8 or name == "sum" else pytest.mark.slow)
    for dtype in (np.uint8, np.int16, np.bool_) for name in KERNELS])
def test_the_dense_lowering_agrees_with_the_kernels_own_arithmetic(
        monkeypatch: pytest.MonkeyPatch, name: str, dtype: Any) -> None:
    kernel = KERNELS[name]
    a = _data(dtype)
    da = xr.DataArray(a, dims=("y", "x"))
    opts = {"window": {"y": K, "x": K}, "boundary": "reflect"}
    with jax.numpy_dtype_promotion("standard"):
        xstencil.clear_caches()
        got = {b: da.stencil.map(kernel, backend=b, **opts) for b in ("loops", "xla")}
        xstencil.clear_caches()  # the reference compiles anew, cell by cell
        with monkeypatch.context() as m:
            m.setattr(dense, "plan", lambda *args, **kwargs: None)
            want = da.stencil.map(kernel, backend="xla", **opts)
        xstencil.clear_caches()
    for res in got.values():
        assert res.dtype == want.dtype
        if name in EXACT or not np.issubdtype(want.dtype, np.floating):
            np.testing.assert_array_equal(res.values, want.values)
        else:
            scale = float(np.abs(want.values).max()) + 1.0
            np.testing.assert_allclose(res.values, want.values, rtol=0, atol=2e-5 * scale)

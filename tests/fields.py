"""Fields, a kernel and the comparison shared by the scale-out tests
(tests/test_dask.py, and tests/shard_checks.py, which runs in a subprocess)."""

from __future__ import annotations

from typing import Any

import numpy as np
import xarray as xr


def field(dtype: Any = np.float32, shape: tuple[int, int] = (37, 50)) -> xr.DataArray:
    """A random ``(y, x)`` field with coordinates, attrs and a name."""
    rng = np.random.default_rng(0)
    return xr.DataArray(
        rng.random(shape).astype(dtype), dims=("y", "x"),
        coords={"y": np.linspace(0.0, 1.0, shape[0]), "x": np.linspace(0.0, 2.0, shape[1])},
        attrs={"units": "K"}, name="T")


def heat(u: Any) -> Any:
    """Explicit 2-D heat equation (5-point Laplacian), one step."""
    return u(time=-1) + 0.1 * (u(time=-1, x=1) + u(time=-1, x=-1) + u(time=-1, y=1)
                               + u(time=-1, y=-1) - 4 * u(time=-1))


def same(out: Any, ref: Any, rtol: float = 1e-6) -> None:
    """``out`` equals ``ref``: dims, shape, dtype, values, coords, attrs and name."""
    assert out.dims == ref.dims and out.shape == ref.shape and out.dtype == ref.dtype
    np.testing.assert_allclose(np.asarray(out.values), np.asarray(ref.values), rtol=rtol,
                               atol=1e-6 if out.dtype == np.float32 else 0, equal_nan=True)
    for c in ref.coords:
        np.testing.assert_array_equal(out[c].values, ref[c].values)
    assert out.attrs == ref.attrs and out.name == ref.name

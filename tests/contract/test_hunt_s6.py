"""Silently wrong results found by attacking the loop backend, meshes on
loops, ``map(out=)``, loop scans and the dense lowerings with odd inputs
(session 6 hunt).  Every test compares against an independent reference: a
plain numpy loop written here, or the XLA backend where loops are compared.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr

import xstencil


def _valid_dot(a: np.ndarray, v: np.ndarray) -> np.ndarray:
    """``out[i] = sum_k a[i + k] * v[k]``, one term at a time."""
    n = a.size - v.size + 1
    out = np.empty(n, a.dtype)
    with np.errstate(invalid="ignore", over="ignore"):
        for i in range(n):
            s = a.dtype.type(0)
            for k in range(v.size):
                s = s + a[i + k] * v[k]
            out[i] = s
    return out


@pytest.mark.parametrize("spelling", ["matmul", "einsum", "tensordot"])
def test_constant_dot_with_an_infinite_weight_is_the_direct_sum(spelling: str) -> None:
    """(a) ``x @ v`` with a constant ``v`` holding inf: the weight reader's
    dense ``einsum`` multiplied the structural zeros of the window's
    coefficient matrix by inf, so every output was NaN instead of inf."""
    a = np.arange(1.0, 31.0, dtype=np.float32)
    v = np.ones(11, np.float32)
    v[3], v[5] = np.inf, 0.5
    ref = _valid_dot(a, v)
    assert np.isinf(ref).all()
    ops = {"matmul": lambda x, w: x @ w, "einsum": lambda x, w: jnp.einsum("i,i->", x, w),
           "tensordot": lambda x, w: jnp.tensordot(x, w, 1)}

    @xstencil.kmap(kernel_size=(11,), padding="valid", relative=False)
    def f(x):
        return ops[spelling](x, jnp.asarray(v))

    out = np.asarray(f(jnp.asarray(a)))
    np.testing.assert_array_equal(out, ref)


def test_constant_dot_with_a_nan_weight_spoils_only_what_it_touches() -> None:
    """A NaN weight makes every output NaN (each window reads the cell), and
    a finite weight vector gives the finite direct sum."""
    a = np.arange(1.0, 31.0, dtype=np.float32)
    v = np.linspace(-1, 1, 11).astype(np.float32)
    for bad in (None, np.nan, -np.inf):
        w = v.copy()
        if bad is not None:
            w[7] = bad

        @xstencil.kmap(kernel_size=(11,), padding="valid", relative=False)
        def f(x, w=w):
            return x @ jnp.asarray(w)

        out = np.asarray(f(jnp.asarray(a)))
        ref = _valid_dot(a, w)
        np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
        np.testing.assert_array_equal(np.isinf(out), np.isinf(ref))
        ok = np.isfinite(ref)
        np.testing.assert_allclose(out[ok], ref[ok], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [">f4", ">f8", ">i2"])
@pytest.mark.parametrize("backend", ["xla", "loops"])
def test_big_endian_data_map_like_native(dtype: str, backend: str) -> None:
    """Big-endian data (netCDF/HDF5 files hold it) used to crash inside
    ``jax.jit`` with an obscure TypeError; it now maps like native data."""
    a = np.arange(12.0).reshape(3, 4).astype(dtype)
    ref = a + np.roll(a, -1, axis=1)
    res = xr.DataArray(a, dims=("y", "x")).stencil.map(
        lambda u: u(x=1) + u(), boundary="periodic", backend=backend)
    assert res.dtype == np.dtype(dtype).newbyteorder("=")
    np.testing.assert_array_equal(res.values, ref)
    ds = xr.Dataset({"v": (("y", "x"), a)})
    out = ds.stencil.map(lambda s: {"v": s["v"](x=1) + s["v"]()}, boundary="periodic",
                         backend=backend)
    np.testing.assert_array_equal(out["v"].values, ref)

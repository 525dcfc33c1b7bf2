"""Fast paths that gave silently wrong results (review of the runtime-weight
dense lowering and the mesh fast path): each test compares with a numpy
loop or with the same call taking the general path."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr
from jax import lax

import xstencil


def _window_sums(data: np.ndarray, fn: object, size: int) -> np.ndarray:
    """``fn(window)`` at every point, 'extend' boundary, a numpy loop."""
    h = size // 2
    p = np.pad(data, h, mode="edge")
    out = np.empty(data.shape, np.float64)
    for i in range(data.shape[0]):
        for j in range(data.shape[1]):
            out[i, j] = fn(p[i:i + size, j:j + size])  # type: ignore[operator]
    return out


def _field() -> xr.DataArray:
    rng = np.random.default_rng(3)
    return xr.DataArray((rng.standard_normal((9, 11)) * 3).astype(np.float32), dims=("y", "x"))


def test_a_float16_round_trip_inside_a_linear_kernel_is_kept_with_runtime_weights() -> None:
    # rounding the window to float16 is not linear: the runtime-weight lowering
    # (weights from a derivative at a zero window) used to drop it
    da = _field()
    w = np.random.default_rng(4).standard_normal((5, 5)).astype(np.float32)
    wj = jnp.asarray(w)
    out = da.stencil.map(lambda u: (u.array.astype(jnp.float16).astype(jnp.float32) * wj).sum(),
                         window={"y": 5, "x": 5}, boundary="extend")
    ref = _window_sums(da.values, lambda p: (p.astype(np.float16).astype(np.float32) * w).sum(), 5)
    np.testing.assert_allclose(out.values, ref, rtol=0, atol=2e-5 * np.abs(ref).max())


def test_reduce_precision_inside_a_linear_kernel_is_kept_with_constant_weights() -> None:
    da = _field()
    w = np.arange(1.0, 26.0).reshape(5, 5) / 7

    def kernel(u: xstencil.Window) -> jax.Array:
        weights = jnp.arange(1.0, 26.0).reshape(5, 5) / 7  # constants of the program
        return (lax.reduce_precision(u.array, 5, 10) * weights).sum()

    out = da.stencil.map(kernel, window={"y": 5, "x": 5}, boundary="extend")
    ref = _window_sums(da.values, lambda p: (p.astype(np.float16).astype(np.float64) * w).sum(), 5)
    np.testing.assert_allclose(out.values, ref, rtol=0, atol=2e-5 * np.abs(ref).max())


def test_a_narrowing_cast_to_the_output_dtype_keeps_the_dense_lowering_exact() -> None:
    # float64 data cast to float32, weights float32: the result is float32, and
    # the dense lowering rounds the data to float32 as the kernel does
    with jax.enable_x64(True):
        da = _field().astype(np.float64) + 1e-9
        w = np.random.default_rng(5).standard_normal((5, 5)).astype(np.float32)
        wj = jnp.asarray(w)
        out = da.stencil.map(lambda u: (u.array.astype(jnp.float32) * wj).sum(),
                             window={"y": 5, "x": 5}, boundary="extend")
    assert out.dtype == np.float32
    ref = _window_sums(da.values, lambda p: (p.astype(np.float32) * w).sum(), 5)
    np.testing.assert_allclose(out.values, ref, rtol=0, atol=1e-5 * np.abs(ref).max())


def _singular_mesh_loss(h: jax.Array) -> jax.Array:
    da = xr.DataArray(h, dims="x")
    m = da.stencil.mesh(boundary="extend")
    m[{"x": slice(1, 4)}] = lambda u: 1.0 / u()
    m[{"x": 5}] = lambda u: 1.0 / u()
    return m.map().data.sum()


def test_a_mesh_gradient_after_an_eager_call_is_not_nan() -> None:
    # the eager call records the repeat-call fast path with the 'select'
    # evaluation, in which 1/h also runs where h == 0 (not kept); a
    # differentiated call must not reuse it, or the gradient there is NaN
    h = np.array([0.0, 1.0, 2.0, 3.0, 0.0, 2.0], np.float32)
    expected = np.array([1.0, -1.0, -1 / 4, -1 / 9, 1.0, -1 / 4], np.float32)
    xstencil.clear_caches()
    np.testing.assert_allclose(float(_singular_mesh_loss(h)), 1 + 1 / 2 + 1 / 3 + 1 / 2, rtol=1e-6)
    g = jax.grad(_singular_mesh_loss)(jnp.asarray(h))
    np.testing.assert_allclose(np.asarray(g), expected, rtol=1e-6)
    g = jax.jit(jax.grad(_singular_mesh_loss))(jnp.asarray(h))
    np.testing.assert_allclose(np.asarray(g), expected, rtol=1e-6)


def _f16_mesh(da: xr.DataArray) -> xstencil.Mesh:
    m = da.stencil.mesh(boundary="extend")
    m[{"x": slice(0, 4)}] = lambda u: u().astype(jnp.float16)
    m[da.x >= 2] = lambda u: (2 * u()).astype(jnp.float16)
    return m


def test_a_mesh_covered_by_a_slab_and_a_mask_has_the_kernels_dtype_under_jit() -> None:
    # every point is covered, so the input's dtype takes no part (docs/dtypes.rst);
    # under jit the slab evaluation used to promote with it (float32)
    da = xr.DataArray(np.linspace(-1, 1, 48, dtype=np.float32).reshape(6, 8), dims=("y", "x"),
                      coords={"x": np.arange(8)})

    def run(d: jax.Array) -> jax.Array:
        return _f16_mesh(da.copy(data=d)).map().data

    xstencil.clear_caches()
    traced = jax.jit(run)(jnp.asarray(da.values))
    eager = _f16_mesh(da).map()
    x = da.x.values
    ref = np.where(x >= 2, (2 * da.values).astype(np.float16), da.values.astype(np.float16))
    assert eager.dtype == np.float16
    assert traced.dtype == np.float16
    np.testing.assert_array_equal(eager.values, ref)
    np.testing.assert_array_equal(np.asarray(traced), ref)


def test_a_mesh_called_under_jit_then_eagerly_does_not_reuse_traced_values() -> None:
    # the jitted call used to record its (traced) membership array for the
    # repeat-call fast path, and the next eager call then raised
    # UnexpectedTracerError
    da = xr.DataArray(np.arange(12.0, dtype=np.float32).reshape(3, 4), dims=("y", "x"))
    big = da > 6

    def build(d: xr.DataArray) -> xstencil.Mesh:
        m = d.stencil.mesh(boundary="extend")
        m[{"x": slice(0, 2)}] = lambda u: u(x=1) - u()
        m[big] = lambda u: -u()
        return m

    def run(v: jax.Array) -> jax.Array:
        return build(da.copy(data=v)).map().data

    xstencil.clear_caches()
    traced = np.asarray(jax.jit(run)(jnp.asarray(da.values)))
    v = da.values
    right = np.concatenate([v[:, 1:], v[:, -1:]], axis=1)
    ref = np.where(v > 6, -v, np.where(np.arange(4) < 2, right - v, v))
    np.testing.assert_array_equal(traced, ref)
    np.testing.assert_array_equal(build(da).map().values, ref)
    np.testing.assert_array_equal(build(da).map().values, ref)  # the fast path


def _uint8_mesh(d: xr.DataArray) -> xstencil.Mesh:
    m = d.stencil.mesh(boundary="extend")
    m[...] = lambda u: u().astype(jnp.float32) * 0.5
    m[{"x": 0}] = lambda u: u()  # the last kernel returns uint8
    return m


def test_a_dask_mesh_announces_the_dtype_it_computes() -> None:
    # the lazy result's dtype came from the last kernel alone (uint8) while the
    # blocks held float32: written out (to_netcdf) it would have been truncated
    v = np.arange(24, dtype=np.uint8).reshape(4, 6)
    da = xr.DataArray(v, dims=("y", "x"))
    eager = _uint8_mesh(da).map()
    lazy = _uint8_mesh(da.chunk({"x": 3})).map()
    ref = np.where(np.arange(6) == 0, v, v * np.float32(0.5)).astype(np.float32)
    assert eager.dtype == np.float32
    assert lazy.dtype == np.float32
    computed = lazy.compute()
    assert computed.dtype == np.float32
    np.testing.assert_array_equal(computed.values, ref)
    np.testing.assert_array_equal(eager.values, ref)


def test_a_dask_mesh_covered_by_masks_has_the_kernels_dtype() -> None:
    da = xr.DataArray(np.linspace(-1, 1, 48, dtype=np.float32).reshape(6, 8), dims=("y", "x"))
    pos = da > 0

    def build(d: xr.DataArray) -> xstencil.Mesh:
        m = d.stencil.mesh(boundary="extend")
        m[pos] = lambda u: u().astype(jnp.float16)
        m[~pos] = lambda u: (2 * u()).astype(jnp.float16)
        return m

    ref = np.where(pos.values, da.values.astype(np.float16),
                   (2 * da.values).astype(np.float16))
    eager = build(da).map()
    lazy = build(da.chunk({"x": 4})).map()
    assert eager.dtype == lazy.dtype == lazy.compute().dtype == np.float16
    np.testing.assert_array_equal(eager.values, ref)
    np.testing.assert_array_equal(lazy.values, ref)


_SHARDED = """
import jax.numpy as jnp, numpy as np, xarray as xr, xstencil
da = xr.DataArray(np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8), dims=("y", "x"))
pos = da > 0
def build(**kw):
    m = da.stencil.mesh(boundary="extend", **kw)
    m[pos] = lambda u: u().astype(jnp.float16)
    m[~pos] = lambda u: (2 * u()).astype(jnp.float16)
    return m
a = build().map()
s = build(devices={"y": "a", "x": "b"}).map()
ref = np.where(pos.values, da.values.astype(np.float16), (2 * da.values).astype(np.float16))
assert a.dtype == np.float16, a.dtype
assert s.dtype == np.float16, s.dtype
np.testing.assert_array_equal(np.asarray(s.values), ref)
print("ok")
"""


def test_a_sharded_mesh_covered_by_masks_has_the_kernels_dtype() -> None:
    # sharded meshes run every region as a mask and promoted with the kept input
    # (float32) though no position keeps it; in memory the result is float16
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
               JAX_PLATFORMS="cpu")
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-W", "error", "-c", _SHARDED], capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("ok")


def _subset_mesh(ds: xr.Dataset) -> xstencil.Mesh:
    m = ds.stencil.mesh(boundary="extend")
    m[...] = lambda s: {"u": s["u"]() * 2}
    m[{"x": 0}] = lambda s: {"h": -s["h"]()}
    return m


def test_dataset_mesh_kernels_returning_other_variables_raise() -> None:
    # the regions' results were merged leaf by leaf: 'u' at x=0 got -h, and h
    # kept its input (dask: 'h' got the other region's u); now a clear error
    v = np.arange(12.0, dtype=np.float32).reshape(3, 4)
    ds = xr.Dataset({"u": (("y", "x"), v), "h": (("y", "x"), v * 10)})
    for data in (ds, ds.chunk({"x": 2})):
        with pytest.raises(xstencil.XStencilError,
                           match=r"mesh.*kernels return different results: \['u'\] and "
                                 r"\['h'\].*every kernel"):
            _subset_mesh(data).map().compute()
    # every kernel returning both variables works, and matches a numpy reference
    m = ds.stencil.mesh(boundary="extend")
    m[...] = lambda s: {"u": s["u"]() * 2, "h": s["h"]()}
    m[{"x": 0}] = lambda s: {"u": s["u"](), "h": -s["h"]()}
    out = m.map()
    np.testing.assert_array_equal(out["u"].values, np.where(np.arange(4) == 0, v, 2 * v))
    np.testing.assert_array_equal(out["h"].values, np.where(np.arange(4) == 0, -10 * v, 10 * v))


def test_mesh_kernels_returning_other_shapes_raise_on_every_path() -> None:
    # under jit and with dask a (1,) result was broadcast over output_dims
    # (or written into its first entry only); eagerly a raw TypeError
    v = np.arange(12.0, dtype=np.float32).reshape(3, 4)
    da = xr.DataArray(v, dims=("y", "x"))
    mask = da > 5

    def build(d: xr.DataArray) -> xstencil.Mesh:
        m = d.stencil.mesh(boundary="extend", output_dims=["k"])
        m[...] = lambda u: jnp.stack([u(), 2 * u(), 3 * u()])
        m[{"x": 0}] = lambda u: jnp.stack([-u()])
        m[mask] = lambda u: jnp.stack([-u()])
        return m

    match = r"mesh.*kernels return different results.*shapes \(3,\) and \(1,\).*every kernel"
    with pytest.raises(xstencil.XStencilError, match=match):
        build(da).map()
    with pytest.raises(xstencil.XStencilError, match=match):
        build(da.chunk({"x": 2})).map().compute()
    with pytest.raises(xstencil.XStencilError, match=match):
        jax.jit(lambda d: build(da.copy(data=d)).map().data)(jnp.asarray(v))

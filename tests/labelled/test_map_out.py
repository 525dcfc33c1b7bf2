"""``map(..., out=)``: the result written into a preallocated numpy array.

Each case is checked against a numpy reference built with ``np.pad``, on the
loop backend (which writes into ``out`` directly) and on XLA (which copies),
first and repeated calls (the repeat-call fast path) alike.  Every refusal
leaves ``out`` as it was and the input untouched.
"""

from __future__ import annotations

import resource
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr

import xstencil
from xstencil._backends import loops as L
from xstencil._errors import XStencilError

HAS_NUMBA = L.available()
BACKENDS = ["xla", pytest.param("loops", marks=pytest.mark.skipif(
    not HAS_NUMBA, reason="numba not installed"))]


def _lap(u: Any) -> Any:
    return u(x=1) + u(x=-1) + u(y=1) + u(y=-1) - 4 * u()


def _ref_lap(a: np.ndarray, mode: str, fill: float = 0.0) -> np.ndarray:
    p = np.pad(a, 1, mode="wrap") if mode == "periodic" else np.pad(
        a, 1, mode="constant", constant_values=fill)
    # the kernel's order of operations: float32 results match bitwise
    return p[1:-1, 2:] + p[1:-1, :-2] + p[2:, 1:-1] + p[:-2, 1:-1] - 4 * p[1:-1, 1:-1]


def _da(dtype: Any = np.float32, shape: tuple[int, int] = (12, 10),
        dim_coords: bool = False) -> xr.DataArray:
    """Data with a scalar and a non-dimension coordinate; ``dim_coords`` adds
    numeric coordinates on both dims (for float32 data they reach the loop
    as packed complex64 pairs, which must not keep the loop from running)."""
    rng = np.random.default_rng(3)
    a = (rng.random(shape) * 10).astype(dtype)
    coords: dict[str, Any] = {"time": 3.5, "station": ("y", [f"s{i}" for i in range(shape[0])])}
    if dim_coords:
        coords.update(x=np.linspace(0.0, 1.0, shape[1]), y=np.arange(shape[0]))
    return xr.DataArray(a, dims=("y", "x"), coords=coords, attrs={"units": "K"}, name="T")


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """What each loop kernel run returned (``out`` itself when it wrote there)."""
    got: list[Any] = []
    real = L.run_loops

    def run(*a: Any, **k: Any) -> Any:
        got.append(real(*a, **k))
        return got[-1]

    monkeypatch.setattr(L, "run_loops", run)
    monkeypatch.delenv(L.ENV, raising=False)
    yield got


# -- numerics and metadata ----------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("boundary", ["fill", "periodic"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
@pytest.mark.parametrize("dim_coords", [False, True])
def test_out_holds_the_numpy_reference(backend: str, boundary: str, dtype: Any,
                                       dim_coords: bool, spy: list[Any]) -> None:
    da = _da(dtype, dim_coords=dim_coords)
    before = da.copy(deep=True)
    opts: dict[str, Any] = {"boundary": boundary, "backend": backend}
    if boundary == "fill":
        opts["fill_value"] = 0
    want = _ref_lap(da.values, boundary)
    for _ in range(3):  # the first call, then the repeat-call fast path
        buf = np.full(da.shape, 99, dtype=dtype)
        res = da.stencil.map(_lap, out=buf, **opts)
        assert res.data is buf
        assert buf.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(buf, want)  # the same operations in the same order
        assert res.name == "T" and res.attrs == {"units": "K"} and res.dims == ("y", "x")
        xr.testing.assert_identical(res.coords.to_dataset(), da.coords.to_dataset())
        xr.testing.assert_identical(da, before)  # the input is never mutated
    if backend == "loops":
        assert len(spy) == 3 and spy[-1] is buf  # written by the loop, not copied


@pytest.mark.parametrize("backend", BACKENDS)
def test_out_equals_the_result_without_out(backend: str) -> None:
    da = _da()
    plain = da.stencil.map(_lap, boundary="periodic", backend=backend)
    buf = np.empty(da.shape, np.float32)
    res = da.stencil.map(_lap, boundary="periodic", backend=backend, out=buf)
    xr.testing.assert_identical(res, plain.copy(data=np.asarray(plain.data)))
    np.testing.assert_array_equal(buf, np.asarray(plain.data))  # bitwise


@pytest.mark.skipif(not HAS_NUMBA, reason="numba not installed")
def test_the_loop_backend_writes_into_out_directly(spy: list[Any]) -> None:
    da = _da()
    first = np.empty(da.shape, np.float32)
    da.stencil.map(_lap, boundary="periodic", backend="loops", out=first)
    assert spy and spy[-1] is first  # even the first call, which compiles by running
    for _ in range(2):  # repeat calls: the fast path hands out to the loop as well
        buf = np.empty(da.shape, np.float32)
        res = da.stencil.map(_lap, boundary="periodic", backend="loops", out=buf)
        assert spy[-1] is buf and res.data is buf
    np.testing.assert_allclose(buf, _ref_lap(da.values, "periodic"), rtol=1e-6)


def test_the_accessor_and_the_function_agree() -> None:
    da = _da()
    a, b = np.empty(da.shape, np.float32), np.empty(da.shape, np.float32)
    ra = da.stencil.map(_lap, boundary="periodic", out=a)
    rb = xstencil.map(da, _lap, boundary="periodic", out=b)
    assert ra.data is a and rb.data is b
    np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(a, _ref_lap(da.values, "periodic"), rtol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_dataarray_out_is_wrapped_not_modified(backend: str) -> None:
    da = _da()
    target = xr.DataArray(np.zeros(da.shape, np.float32), dims=("y", "x"), name="keep",
                          attrs={"a": 1})
    res = da.stencil.map(_lap, boundary="periodic", backend=backend, out=target)
    assert res.data is target.data
    assert res.name == "T" and res.attrs == {"units": "K"}
    assert target.name == "keep" and target.attrs == {"a": 1}
    np.testing.assert_allclose(target.values, _ref_lap(da.values, "periodic"), rtol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_valid_and_stride_take_an_out_of_the_result_shape(backend: str, spy: list[Any]) -> None:
    da = _da(shape=(13, 11))
    p = da.values
    want = p[1:-1, 2:] + p[1:-1, :-2] + p[2:, 1:-1] + p[:-2, 1:-1] - 4 * p[1:-1, 1:-1]
    for _ in range(2):  # the first call, then the fast path (which rewraps a trimmed result)
        buf = np.empty((11, 9), np.float32)
        res = da.stencil.map(_lap, boundary="valid", backend=backend, out=buf)
        assert res.data is buf and res.sizes == {"y": 11, "x": 9}
        np.testing.assert_array_equal(buf, want)
        np.testing.assert_array_equal(res.station.values, da.station.values[1:-1])
        strided = np.empty((7, 6), np.float32)
        res = da.stencil.map(_lap, boundary="fill", fill_value=0.0, stride=2, backend=backend,
                             out=strided)
        assert res.data is strided
        np.testing.assert_array_equal(strided, _ref_lap(p, "fill")[::2, ::2])
        np.testing.assert_array_equal(res.station.values, da.station.values[::2])
        if backend == "loops":
            assert spy[-2] is buf and spy[-1] is strided
    with pytest.raises(XStencilError, match=r"shape \(13, 11\).*result has shape \(11, 9\)"):
        da.stencil.map(_lap, boundary="valid", backend=backend, out=np.empty_like(p))


def test_dtype_casts_into_out_and_output_dims_take_a_trailing_axis() -> None:
    da = _da(np.float64)
    buf = np.empty(da.shape, np.float32)
    da.stencil.map(_lap, boundary="periodic", dtype="float32", out=buf)
    np.testing.assert_allclose(buf, _ref_lap(da.values, "periodic").astype(np.float32),
                               rtol=1e-6)
    grad = np.empty(da.shape + (2,), np.float64)
    res = da.stencil.map(lambda u: jnp.stack([u(x=1) - u(), u(y=1) - u()]),
                         boundary="periodic", output_dims="d", out=grad)
    a = da.values
    np.testing.assert_allclose(grad[..., 0], np.roll(a, -1, 1) - a, rtol=1e-12)
    np.testing.assert_allclose(grad[..., 1], np.roll(a, -1, 0) - a, rtol=1e-12)
    assert res.dims == ("y", "x", "d") and res.data is grad


def test_ping_pong_buffers_step_in_time() -> None:
    """Two buffers swapped each step: a time loop without new arrays."""
    da = _da(np.float64)
    u = da.copy(deep=True)
    a, b = np.empty(da.shape), np.empty(da.shape)
    want = da.values.copy()
    for _ in range(4):
        res = u.stencil.map(lambda w: w() + 0.1 * _lap(w), boundary="periodic", out=a)
        want = want + 0.1 * _ref_lap(want, "periodic")
        u, a, b = res, b, a
    np.testing.assert_allclose(u.values, want, rtol=1e-12)


# -- refusals -----------------------------------------------------------------------------


def _refused(da: xr.DataArray, out: Any, match: str, kernel: Any = _lap, **opts: Any) -> None:
    before = da.copy(deep=True)
    snapshot = np.array(out, copy=True) if isinstance(out, np.ndarray) else None
    opts.setdefault("boundary", "periodic")
    with pytest.raises(XStencilError, match=match):
        da.stencil.map(kernel, out=out, **opts)
    xr.testing.assert_identical(da, before)
    if snapshot is not None:  # no partial write before the refusal
        np.testing.assert_array_equal(out, snapshot)


@pytest.mark.parametrize("backend", BACKENDS)
def test_wrong_shape_dtype_and_dims_are_refused(backend: str) -> None:
    da = _da()
    for _ in range(2):  # the first call and the repeat-call fast path
        _refused(da, np.full((10, 12), 7, np.float32), r"shape \(10, 12\).*result has "
                 r"shape \(12, 10\)", backend=backend)
        _refused(da, np.full(da.shape, 7, np.float64), r"dtype 'float64'.*result has dtype "
                 r"'float32' \(no silent cast\)", backend=backend)
        _refused(da, np.full(da.shape, 7, np.dtype(">f4")), r"dtype '>f4'", backend=backend)
        _refused(da, np.full(da.shape[:1], 7, np.float32), r"shape \(12,\)", backend=backend)
    u8 = _da(np.uint8)  # a window sum of uint8 is an unsigned integer of JAX's default width
    _refused(u8, np.zeros(u8.shape, np.uint8), r"dtype 'uint8'.*result has dtype 'uint32'",
             lambda u: u.sum(), window={"y": 3, "x": 3}, boundary="fill", fill_value=0,
             backend=backend)
    square = _da(shape=(6, 6))
    _refused(square, xr.DataArray(np.zeros((6, 6), np.float32), dims=("x", "y")),
             r"out= has dims \('x', 'y'\).*start with the data's \('y', 'x'\)")
    _refused(square, xr.DataArray(np.zeros((6, 6, 2), np.float32), dims=("y", "x", "d")),
             r"out= has dims \('y', 'x', 'd'\), but the result has dims \('y', 'x'\)")


def test_layout_and_writeability_are_refused() -> None:
    da = _da()
    _refused(da, np.asfortranarray(np.zeros(da.shape, np.float32)), "not C-contiguous")
    _refused(da, np.zeros((12, 20), np.float32)[:, ::2], r"not C-contiguous \(strides")
    ro = np.zeros(da.shape, np.float32)
    ro.flags.writeable = False
    _refused(da, ro, "is read-only")


def test_non_numpy_out_is_refused() -> None:
    da = _da()
    _refused(da, jnp.zeros(da.shape, jnp.float32), "is not a numpy array.*JAX arrays")
    _refused(da, np.zeros(da.shape, np.float32).tolist(), "is not a numpy array")
    _refused(da, np.ma.zeros(da.shape, np.float32), "MaskedArray.*is not a numpy array")
    _refused(da, xr.DataArray(jnp.zeros(da.shape, jnp.float32), dims=("y", "x")),
             "a DataArray holding .*ArrayImpl")
    dask = pytest.importorskip("dask.array")
    _refused(da, dask.zeros(da.shape, np.float32), "is not a numpy array")
    _refused(da, xr.DataArray(dask.zeros(da.shape, np.float32), dims=("y", "x")),
             "a DataArray holding dask")


@pytest.mark.parametrize("backend", BACKENDS)
def test_out_sharing_memory_with_what_the_kernel_reads_is_refused(backend: str) -> None:
    da = _da()
    _refused(da, da.values, "shares memory with the data", backend=backend)
    _refused(da, da, "shares memory with the data", backend=backend)
    big = np.zeros((24, 10), np.float32)
    view_in = xr.DataArray(big[:12], dims=("y", "x"))
    _refused(view_in, big[6:18], "shares memory with the data", backend=backend)
    w = np.ones(da.shape, np.float32)
    with pytest.raises(XStencilError, match="shares memory with an array the kernel closes"):
        da.stencil.map(lambda u: u() * w, out=w, backend=backend)
    np.testing.assert_array_equal(w, 1)
    with pytest.raises(XStencilError, match="shares memory with an argument of the kernel"):
        da.stencil.map(lambda u, s: u() * s, w, out=w, backend=backend)
    lat = np.zeros(da.shape)
    with2d = da.astype(np.float64).assign_coords(lat=(("y", "x"), lat))
    _refused(with2d, lat, "shares memory with coordinate 'lat'", backend=backend)
    buf = np.empty(da.shape, np.float32)  # the previous result as the next input
    res = da.stencil.map(_lap, boundary="periodic", backend=backend, out=buf)
    _refused(res, buf, "shares memory with the data", backend=backend)


def test_datasets_scale_out_and_staggered_maps_are_refused() -> None:
    da = _da()
    buf = np.zeros(da.shape, np.float32)
    with pytest.raises(XStencilError, match=r"given for a Dataset; out= takes one array"):
        da.to_dataset().stencil.map(lambda s: s["T"](x=1), boundary="periodic", out=buf)
    with pytest.raises(XStencilError, match="out= with grid="):
        da.stencil.map(_lap, grid={"X": {"center": "x"}}, out=buf)
    with pytest.raises(XStencilError, match="out= with devices="):
        da.stencil.map(_lap, devices={"x": "x"}, out=buf)
    pytest.importorskip("dask.array")
    _refused(da.chunk({"y": 6}), buf, "needs in-memory data on one device.*dask")
    np.testing.assert_array_equal(buf, 0)


def test_out_inside_jax_transforms_is_refused() -> None:
    da = _da()
    buf = np.zeros(da.shape, np.float32)

    def f(x: Any) -> Any:
        return xr.DataArray(x, dims=("y", "x")).stencil.map(_lap, boundary="periodic",
                                                             out=buf).data.sum()

    with pytest.raises(XStencilError, match="cannot be used inside jax.jit, grad or vmap"):
        jax.jit(f)(da.values)
    with pytest.raises(XStencilError, match="cannot be used inside jax.jit, grad or vmap"):
        jax.grad(f)(da.values)
    w = jnp.float32(2.0)
    with pytest.raises(XStencilError, match="cannot be used inside jax.jit"):  # a traced closure
        jax.jit(lambda s: da.stencil.map(lambda u: u() * s, out=buf).data)(w)
    np.testing.assert_array_equal(buf, 0)


# -- page faults --------------------------------------------------------------------------


def _faults(f: Any) -> int:
    f()
    f()
    got = []
    for _ in range(3):
        r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        f()
        got.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0)
    return sorted(got)[1]


@pytest.mark.skipif(not HAS_NUMBA, reason="numba not installed")
def test_loop_outputs_page_fault_no_more_than_numpy() -> None:
    """A 64 MiB result (always a fresh mmap): numpy's allocation, with its
    huge-page advice, costs a few hundred faults (16,384 with 4 KiB pages);
    the loop backend's must not cost more, and ``out=`` none."""
    a = np.random.default_rng(0).random((4096, 4096), dtype=np.float32)
    da = xr.DataArray(a, dims=("y", "x"))
    numpy_new = _faults(lambda: a.copy())
    fresh = _faults(lambda: da.stencil.map(_lap, boundary="periodic", backend="loops"))
    buf = np.empty_like(a)
    into = _faults(lambda: da.stencil.map(_lap, boundary="periodic", backend="loops", out=buf))
    assert fresh <= max(2 * numpy_new, 1024), (fresh, numpy_new)
    assert into <= 256, into
    np.testing.assert_allclose(buf[:64, :64], _ref_lap(a, "periodic")[:64, :64], rtol=1e-5)

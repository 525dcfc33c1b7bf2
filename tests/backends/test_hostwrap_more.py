"""Loop-backend meshes and scans wrap their results with
:func:`xstencil._backends.hostwrap.wrap` (the direct jaxlib call of
``jax.device_put``, one :class:`~xstencil._backends.hostwrap.Wrapper` per
shape and dtype) instead of ``jax.device_put``.

Checked here: the wrap is ``jax.device_put``'s result (type, dtype, sharding,
committed, values) for each dtype, with x64 off and on; 64-bit data without
x64 still goes to ``jax.device_put``; a function mesh, a grown scan and its
repeat call on the loops return what ``backend="xla"`` and a numpy reference
return, with the same dtype, and two results held at once share no memory
(a later call never changes an earlier result).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jax
import numpy as np
import pytest
import xarray as xr

import xstencil  # noqa: F401 - registers the accessor
from xstencil._backends import bufpool, hostwrap

pytest.importorskip("numba")

from tests.spies import count_calls  # noqa: E402
from xstencil._backends import loops_mesh  # noqa: E402 - after the numba check
from xstencil._labelled import loop_scan as LS  # noqa: E402

N = (520, 512)  # pooled buffers (>= bufpool.MIN_BYTES in float32)


@pytest.fixture
def wraps(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """The arrays that the loop mesh and scan modules wrapped."""
    seen: list[Any] = []

    def spy(x: np.ndarray) -> Any:
        seen.append(x)
        return hostwrap.wrap(x)

    monkeypatch.setattr(loops_mesh, "wrap", spy)
    monkeypatch.setattr(LS, "wrap", spy)
    yield seen


def _same_as_device_put(got: Any, x: np.ndarray) -> None:
    want = jax.device_put(x)
    assert type(got) is type(want)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.weak_type == want.weak_type
    assert got.sharding == want.sharding and got.committed == want.committed
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize("x64", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "float64", "int64", "int16", "bool"])
def test_wrap_is_device_puts_result(dtype: str, x64: bool) -> None:
    with jax.enable_x64(x64):
        x = bufpool.empty((300, 260), dtype)
        x[...] = (np.arange(x.size) % 89).reshape(x.shape).astype(dtype)
        _same_as_device_put(hostwrap.wrap(x), x)
        _same_as_device_put(hostwrap.wrap(x[1:]), x[1:])  # another shape: another Wrapper
        key = (x.shape, x.dtype.str)
        assert hostwrap.wrap(x) is not None and key in hostwrap._WRAPPERS


def test_64_bit_without_x64_goes_to_device_put(monkeypatch: pytest.MonkeyPatch) -> None:
    with jax.enable_x64(False):
        calls = count_calls(monkeypatch, hostwrap.jax, "device_put")
        x = bufpool.empty((300, 260), np.float64)
        x[...] = 1.0 + 2.0**-40  # not a float32: the conversion shows
        got = hostwrap.wrap(x)
        assert len(calls) == 1
        assert got.dtype == np.float32 and float(got[0, 0]) == np.float32(x[0, 0])
        y = bufpool.empty((300, 260), np.float32)
        hostwrap.wrap(y)
        assert len(calls) == 1  # 32-bit data: the direct call


def lap(u: Any) -> Any:
    return u(x=1) + u(x=-1) + u(y=1) + u(y=-1) - 4 * u()


def lap_numpy(a: np.ndarray) -> np.ndarray:
    return (np.roll(a, -1, 1) + np.roll(a, 1, 1) + np.roll(a, -1, 0) + np.roll(a, 1, 0)
            - 4 * a)


def _mesh(da: xr.DataArray, backend: str) -> Any:
    m = da.stencil.mesh(boundary="periodic", backend=backend)
    m[...] = lap
    m[{"x": 0}] = lambda u: u(x=1)
    return m


def _mesh_numpy(a: np.ndarray) -> np.ndarray:
    out = lap_numpy(a)
    out[:, 0] = a[:, 1]
    return out


def _shares(a: Any, b: Any) -> bool:
    return bool(np.shares_memory(np.asarray(a), np.asarray(b)))


@pytest.mark.parametrize("x64", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_mesh_results_are_xlas_and_independent(wraps: list[Any], dtype: Any,
                                               x64: bool) -> None:
    rng = np.random.default_rng(4)
    with jax.enable_x64(x64):
        a, b = (rng.random(N).astype(dtype) for _ in range(2))
        da, db = xr.DataArray(a, dims=("y", "x")), xr.DataArray(b, dims=("y", "x"))
        m = _mesh(da, "loops")
        first = m.map()  # the first call compiles
        before = len(wraps)
        r1 = m.map()
        assert len(wraps) == before + 1, "the mesh did not run as loops"
        r2 = _mesh(db, "loops").map()
        xla = _mesh(da, "xla").map()
        assert r1.dtype == xla.dtype == first.dtype
        assert type(r1.data) is type(xla.data)  # numpy for 64-bit data without x64
        np.testing.assert_array_equal(np.asarray(r1.data), np.asarray(xla.data))
        ref = _mesh_numpy(a.astype(r1.dtype))
        tol = 1e-6 if r1.dtype == np.float32 else 1e-13
        np.testing.assert_allclose(np.asarray(r1.data), ref, rtol=tol, atol=tol)
        np.testing.assert_allclose(np.asarray(r2.data), _mesh_numpy(b.astype(r2.dtype)),
                                   rtol=tol, atol=tol)
        assert not _shares(r1.data, r2.data) and not _shares(r1.data, first.data)
        assert not _shares(r1.data, a)
        np.testing.assert_array_equal(np.asarray(first.data), np.asarray(r1.data))


NU = 0.1


def heat(u: Any) -> Any:
    return u(time=-1) + NU * (u(time=-1, x=1) + u(time=-1, x=-1) + u(time=-1, y=1)
                              + u(time=-1, y=-1) - 4 * u(time=-1))


def heat_numpy(a: np.ndarray, steps: int) -> np.ndarray:
    out = [a]
    for _ in range(steps):
        out.append((out[-1] + a.dtype.type(NU) * lap_numpy(out[-1])).astype(a.dtype))
    return np.stack(out)


@pytest.mark.parametrize("x64", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_scan_results_are_xlas_and_independent(monkeypatch: pytest.MonkeyPatch,
                                               wraps: list[Any], dtype: Any,
                                               x64: bool) -> None:
    ran = count_calls(monkeypatch, LS.loop_scan_steps, "run_loop")
    rng = np.random.default_rng(6)
    with jax.enable_x64(x64):
        a, b = (rng.random(N).astype(dtype) for _ in range(2))
        da, db = xr.DataArray(a, dims=("y", "x")), xr.DataArray(b, dims=("y", "x"))
        kw: dict[str, Any] = {"steps": 3, "boundary": "periodic"}
        results = []
        for data in (da, da, db):  # the second call takes the repeat-call path
            before, steps = len(wraps), len(ran)
            results.append(data.stencil.scan(heat, "time", backend="loops", **kw))
            assert len(ran) == steps + 1, "the scan did not run as loops"
            if dtype == np.float32:
                assert len(wraps) == before + 1
        xla = da.stencil.scan(heat, "time", backend="xla", **kw)
        for r in results:
            assert r.dtype == xla.dtype
            assert type(r.data) is type(xla.data)
        tol = 1e-6 if results[0].dtype == np.float32 else 1e-13  # XLA may contract to FMAs
        for r, x in zip(results, (a, a, b), strict=True):
            np.testing.assert_allclose(np.asarray(r.data), heat_numpy(x.astype(r.dtype), 3),
                                       rtol=tol, atol=tol)
        np.testing.assert_allclose(np.asarray(results[0].data), np.asarray(xla.data),
                                   rtol=tol, atol=tol)
        r0, r1, r2 = (np.asarray(r.data) for r in results)
        assert not _shares(r0, r1) and not _shares(r1, r2) and not _shares(r0, r2)
        assert not _shares(r0, a)
        np.testing.assert_array_equal(r0, r1)  # the later calls changed nothing

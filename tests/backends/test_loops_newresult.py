"""New results of loop-backend maps (``xstencil/_backends/bufpool.py``).

A map without ``out=`` writes into an output buffer that is recycled once no
result, view or JAX array can reach it.  These tests check the numbers
against a numpy reference, that consecutive results and the input never
share memory (also after memory was recycled), that the JAX result wraps the
loop's buffer without a copy, and the pool's own rules.
"""

from __future__ import annotations

import gc
import threading
from typing import Any

import jax
import numpy as np
import pytest
import xarray as xr

import xstencil
from tests.spies import count_calls
from xstencil._backends import bufpool, loops_mesh

pytest.importorskip("numba")

DIMS = ("z", "y", "x")
# at least bufpool.MIN_BYTES in float32: the pooled path
SHAPES = {2: (512, 520), 3: (64, 64, 66)}


def _lap(ndim: int) -> Any:
    dims = DIMS[-ndim:]

    def kernel(u: Any) -> Any:
        return sum((u(**{d: s}) for d in dims for s in (1, -1)), start=-2 * ndim * u())

    return kernel


def _lap_ref(a: np.ndarray, mode: str, fill: float) -> np.ndarray:
    """The Laplacian with numpy, in the kernel's order of operations."""
    if mode == "periodic":
        p = np.pad(a, 1, mode="wrap")
    else:
        p = np.pad(a, 1, mode="constant", constant_values=fill)
    inner = tuple(slice(1, -1) for _ in range(a.ndim))
    s = a.dtype.type(-2 * a.ndim) * p[inner]
    for ax in range(a.ndim):
        for lo in (2, 0):
            sl = list(inner)
            sl[ax] = slice(lo, lo + a.shape[ax])
            s = s + p[tuple(sl)]
    return s


def _opts(mode: str) -> dict[str, Any]:
    return {"boundary": "periodic"} if mode == "periodic" else {"boundary": "fill",
                                                                 "fill_value": 0.5}


@pytest.mark.parametrize("dtype", ["float32", pytest.param("float64", marks=pytest.mark.slow)])
@pytest.mark.parametrize("ndim", [2, 3])
@pytest.mark.parametrize("mode", ["fill", "periodic"])
def test_consecutive_results_are_right_and_independent(mode: str, ndim: int, dtype: str,
                                                       ran: list[int]) -> None:
    rng = np.random.default_rng(ndim)
    a = rng.random(SHAPES[ndim]).astype(dtype)
    b = rng.random(SHAPES[ndim]).astype(dtype)
    a0, b0 = a.copy(), b.copy()
    da, db = xr.DataArray(a, dims=DIMS[-ndim:]), xr.DataArray(b, dims=DIMS[-ndim:])
    kernel = _lap(ndim)
    first = da.stencil.map(kernel, backend="loops", **_opts(mode))
    dropped = db.stencil.map(kernel, backend="loops", **_opts(mode))
    del dropped
    gc.collect()  # its buffer goes back to the pool: the next call takes it
    second = db.stencil.map(kernel, backend="loops", **_opts(mode))
    third = da.stencil.map(kernel, backend="loops", **_opts(mode))
    assert len(ran) == 4, "the loop backend did not run"
    results = [np.asarray(r) for r in (first, second, third)]
    for r, x in zip(results, (a, b, a), strict=True):
        assert r.dtype == np.dtype(dtype)
        # the same operations in the same order as the loop: bitwise
        np.testing.assert_array_equal(r, _lap_ref(x, mode, 0.5))
    for i, r in enumerate(results):
        assert not np.shares_memory(r, a) and not np.shares_memory(r, b)
        for other in results[i + 1:]:
            assert not np.shares_memory(r, other)
    np.testing.assert_array_equal(a, a0)  # inputs untouched
    np.testing.assert_array_equal(b, b0)


def test_a_live_view_keeps_its_memory(ran: list[int]) -> None:
    """Only the last view of a dropped result keeps it: its memory must not
    be handed to the next calls."""
    rng = np.random.default_rng(5)
    a = rng.random(SHAPES[2], dtype=np.float32)
    da = xr.DataArray(a, dims=("y", "x"))
    kernel = _lap(2)
    res = da.stencil.map(kernel, backend="loops", boundary="periodic")
    view = np.asarray(res.data)[3:, 1:]  # a numpy view of the JAX array, sliced
    del res
    gc.collect()
    others = [xr.DataArray(rng.random(SHAPES[2], dtype=np.float32), dims=("y", "x"))
              .stencil.map(kernel, backend="loops", boundary="periodic") for _ in range(3)]
    assert len(ran) == 4
    np.testing.assert_array_equal(view, _lap_ref(a, "periodic", 0.0)[3:, 1:])
    assert not any(np.shares_memory(view, np.asarray(o)) for o in others)


def test_dropped_results_memory_is_reused(ran: list[int]) -> None:
    a = np.random.default_rng(6).random(SHAPES[2], dtype=np.float32)
    da = xr.DataArray(a, dims=("y", "x"))
    kernel = _lap(2)
    res = da.stencil.map(kernel, backend="loops", boundary="periodic")
    where = res.data.unsafe_buffer_pointer()
    del res
    gc.collect()
    again = da.stencil.map(kernel, backend="loops", boundary="periodic")
    assert len(ran) == 2
    assert again.data.unsafe_buffer_pointer() == where
    np.testing.assert_array_equal(np.asarray(again), _lap_ref(a, "periodic", 0.0))


def test_the_result_wraps_the_loop_buffer_without_a_copy(ran: list[int],
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    made: list[int] = []
    real = bufpool.empty

    def empty(shape: tuple[int, ...], dtype: Any, near: int | None = None) -> np.ndarray:
        out = real(shape, dtype, near)
        made.append(out.ctypes.data)
        return out

    monkeypatch.setattr(bufpool, "empty", empty)
    a = np.random.default_rng(7).random((1024, 1024), dtype=np.float32)
    res = xr.DataArray(a, dims=("y", "x")).stencil.map(_lap(2), backend="loops",
                                                       boundary="fill", fill_value=0.0)
    assert ran and len(made) == 1
    assert isinstance(res.data, jax.Array)  # the documented result type
    ptr = res.data.unsafe_buffer_pointer()
    assert ptr == made[0]  # no copy between the loop and the JAX array
    # 4 MiB: starts by a huge page, half a page after the input within a 4 KiB page
    assert ptr % (2 << 20) == bufpool.offset(a.ctypes.data)
    np.testing.assert_array_equal(np.asarray(res), _lap_ref(a, "fill", 0.0))


def test_clear_caches_releases_idle_memory() -> None:
    x = bufpool.empty((1024, 1024), np.float32)
    del x
    gc.collect()
    assert bufpool.idle_bytes() >= 4 << 20
    xstencil.clear_caches()
    assert bufpool.idle_bytes() == 0


@pytest.mark.parametrize("shape, dtype", [((3,), np.float32), ((700, 700), np.float64),
                                          ((512, 512), np.uint8), ((2048, 1024), np.float32)])
def test_empty_is_aligned_writeable_and_c_contiguous(shape: tuple[int, ...], dtype: Any) -> None:
    x = bufpool.empty(shape, dtype)
    assert x.shape == shape and x.dtype == dtype
    assert x.flags.c_contiguous and x.flags.writeable and x.flags.aligned
    assert x.ctypes.data % bufpool.ALIGN == 0
    x[...] = 1
    assert (x == 1).all()


def test_small_arrays_are_not_pooled() -> None:
    bufpool.clear()
    x = bufpool.empty((16, 16), np.float32)
    del x
    gc.collect()
    assert bufpool.idle_bytes() == 0


def test_memory_comes_back_only_after_the_last_view() -> None:
    bufpool.clear()
    x = bufpool.empty((1024, 512), np.float32)
    x[...] = 3.0
    view = x[10:20].T
    held = jax.device_put(x)
    del x
    gc.collect()
    assert bufpool.idle_bytes() == 0  # the view and the JAX array still reach it
    del view
    gc.collect()
    assert bufpool.idle_bytes() == 0  # the JAX array still does
    y = bufpool.empty((1024, 512), np.float32)
    y[...] = -1.0
    assert not np.shares_memory(y, np.asarray(held))
    assert float(held.sum()) == 3.0 * 1024 * 512
    del held, y
    gc.collect()
    assert bufpool.idle_bytes() > 0


def test_idle_memory_is_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    bufpool.clear()
    monkeypatch.setattr(bufpool, "MAX_IDLE_BYTES", 13 << 20)
    xs = [bufpool.empty((1024, 1024), np.float32) for _ in range(4)]  # 4 MiB (+2) each
    del xs
    gc.collect()
    assert 8 << 20 < bufpool.idle_bytes() <= 13 << 20  # two of the four blocks kept
    bufpool.clear()


def test_threads_never_share_a_buffer() -> None:
    bufpool.clear()
    errors: list[str] = []

    def work(k: int) -> None:
        for _ in range(20):
            x = bufpool.empty((512, 512), np.float32)
            x[...] = k
            gc.collect(0)
            if not (x == k).all():
                errors.append(f"thread {k} saw another thread's values")
            del x

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    bufpool.clear()


def test_mesh_results_are_right_and_independent(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loop meshes take their outputs from the pool too."""
    ran = count_calls(monkeypatch, loops_mesh, "run_mesh")
    rng = np.random.default_rng(9)
    a, b = (rng.random(SHAPES[2], dtype=np.float32) for _ in range(2))

    def mesh_of(x: np.ndarray) -> Any:
        m = xr.DataArray(x, dims=("y", "x")).stencil.mesh(backend="loops", boundary="periodic")
        m[...] = _lap(2)
        m[{"x": 0}] = lambda u: 2 * u()
        return m

    first = mesh_of(a).map()
    dropped = mesh_of(b).map()
    del dropped
    gc.collect()
    second = mesh_of(b).map()
    assert len(ran) == 3
    for res, x in ((first, a), (second, b)):
        ref = _lap_ref(x, "periodic", 0.0)
        ref[:, 0] = 2 * x[:, 0]
        np.testing.assert_array_equal(np.asarray(res), ref)
    assert not np.shares_memory(np.asarray(first), np.asarray(second))


def test_recycled_memory_never_leaks_into_uncovered_mesh_cells(monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    """A recycled buffer holds an old result: cells no region covers must
    still come out as the input (fresh memory read as zeros would hide it)."""
    ran = count_calls(monkeypatch, loops_mesh, "run_mesh")
    rng = np.random.default_rng(10)
    a = rng.random(SHAPES[2], dtype=np.float32)
    mask = rng.random(SHAPES[2]) > 0.7
    da = xr.DataArray(a, dims=("y", "x"))
    for _ in range(3):
        stale = da.stencil.map(lambda u: u() + 100.0, backend="loops", boundary="fill",
                               fill_value=0.0)  # fills a pooled buffer with other values
        del stale
        gc.collect()
        m = da.stencil.mesh(backend="loops", boundary="periodic")
        m[{"x": slice(0, 200)}] = _lap(2)
        m[xr.DataArray(mask, dims=("y", "x"))] = lambda u: -u()
        res = np.asarray(m.map())
        ref = a.copy()
        ref[:, :200] = _lap_ref(a, "periodic", 0.0)[:, :200]
        ref[mask] = -a[mask]
        np.testing.assert_array_equal(res, ref)
    assert len(ran) == 3


def test_near_of_answers_for_the_array_it_is_given() -> None:
    """near_of keeps its last answer by weak reference: the same array gets
    it back, any other array (also one made where a dead one was) its own
    address."""
    a = np.ones((256, 256), np.float32)
    b = np.ones((256, 256), np.float32)
    assert bufpool.near_of(a) == a.ctypes.data
    assert bufpool.near_of(a) == a.ctypes.data  # the kept answer
    assert bufpool.near_of(b) == b.ctypes.data
    assert bufpool.near_of(a[1:]) == a[1:].ctypes.data  # a view: its own first element
    for _ in range(20):  # a new array (often at a dead one's id) is never taken for it
        del a
        a = np.ones((256, 256), np.float32)
        assert bufpool.near_of(a) == a.ctypes.data

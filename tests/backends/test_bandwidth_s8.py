"""Where a loop's new result lies (``near`` of
:func:`xstencil._backends.bufpool.empty`).

A map or function mesh without ``out=`` takes its output buffer from the
pool; from 2 MiB on the buffer starts by a huge-page boundary, placed so that
within a 4 KiB page it lies half a page (1985-2048 bytes) after its input
(:func:`~xstencil._backends.bufpool.offset`): level with the input or 64
bytes after it, loads and stores collide (4K aliasing) and the 5-point
Laplacian's nest ran up to twice as long at 2048² and 4096² float32 (see
bufpool's notes).  Checked here: the placement rule against a brute-force
search, that the placed array lies inside its block and is 64-byte aligned
(the wrap as a JAX array stays zero-copy), that small arrays ignore ``near``,
that a recycled block placed for another input never overlaps a live array,
and that maps, meshes and a loop scan's spare states on inputs at every
page offset give the numpy reference bitwise, leave the input untouched and
return independent results at the promised place.
"""

from __future__ import annotations

import gc
from typing import Any

import numpy as np
import pytest
import xarray as xr

from xstencil._backends import bufpool

pytest.importorskip("numba")

PAGE = 4096
HUGE = 2 << 20
SHAPE = (520, 1024)  # float32: 2.03 MiB (>= 2 MiB), rows of one page: placed
UNEVEN = (1024, 520)  # rows of 2080 bytes: the huge-page boundary


def _rel(addr: int, near: int) -> int:
    """Bytes from ``near`` to ``addr`` within a 4 KiB page (0 to 4095)."""
    return (addr - near) % PAGE


def _placement(near: int) -> int:
    """The offset past a huge-page boundary, by search: the multiple of 64
    in a page whose distance after ``near`` (modulo a page) is the largest
    one up to half a page."""
    return max((o for o in range(0, PAGE, bufpool.ALIGN) if _rel(o, near) <= PAGE // 2),
               key=lambda o: _rel(o, near))


def _half_a_page_after(addr: int, near: int) -> bool:
    return PAGE // 2 - bufpool.ALIGN < _rel(addr, near) <= PAGE // 2


@pytest.mark.parametrize("near", [0, 1, 16, 63, 64, 65, 1000, 2048, 4031, 4032, 4080, 4095,
                                  4096 + 16, (7 << 21) + 2064])
def test_offset_puts_the_output_half_a_page_after_the_input(near: int) -> None:
    off = bufpool.offset(near)
    assert off == _placement(near)
    assert 0 <= off < PAGE and off % bufpool.ALIGN == 0
    assert _half_a_page_after(off, near)


def test_near_of_is_the_address_of_the_first_element() -> None:
    raw = np.zeros(8 * PAGE * 64, np.uint8)
    two = raw[16:16 + 64 * 2 * PAGE].view(np.float32).reshape(64, 2 * PAGE // 4)
    assert bufpool.near_of(two) == two.ctypes.data
    assert bufpool.near_of(two[::-2]) == two[::-2].ctypes.data  # negative strides
    assert bufpool.near_of(two[:, 1:]) == two.ctypes.data + 4  # a view's own start
    uneven = raw[:4 * 256 * 260].view(np.float32).reshape(256, 260)  # rows of 1040 bytes
    assert bufpool.near_of(uneven) == uneven.ctypes.data
    one = np.zeros(3 * PAGE, np.float32)
    assert bufpool.near_of(one) == one.ctypes.data


def _block_of(x: np.ndarray) -> np.ndarray:
    """The raw block behind a pooled array (its lease's first item)."""
    base = x.base
    while not hasattr(base, "block"):
        base = base.base
    return base.block[0]


@pytest.mark.parametrize("near", [0, 16, 2000, 4032, 4080, 4095])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.uint8])
def test_a_placed_array_is_aligned_inside_its_block_and_writeable(near: int, dtype: Any) -> None:
    shape = (HUGE // np.dtype(dtype).itemsize + 1000,)  # just over 2 MiB
    x = bufpool.empty(shape, dtype, near)
    addr = x.ctypes.data
    assert x.shape == shape and x.dtype == dtype and x.flags.c_contiguous and x.flags.writeable
    assert addr % bufpool.ALIGN == 0
    assert addr % HUGE == bufpool.offset(near)
    assert _half_a_page_after(addr, near)
    raw = _block_of(x)
    assert raw.ctypes.data <= addr and addr + x.nbytes <= raw.ctypes.data + raw.nbytes
    x[...] = 7
    assert (x == 7).all()


def test_small_arrays_ignore_near() -> None:
    x = bufpool.empty((512, 600), np.float32, near=16)  # 1.2 MiB: pooled, not placed
    assert x.ctypes.data % bufpool.ALIGN == 0
    y = bufpool.empty((16, 16), np.float32, near=16)  # not pooled
    assert y.ctypes.data % bufpool.ALIGN == 0


def test_a_recycled_block_placed_for_another_input_never_overlaps_a_live_array() -> None:
    bufpool.clear()
    first = bufpool.empty(SHAPE, np.float32, near=16)
    raw = _block_of(first)
    del first
    gc.collect()
    again = bufpool.empty(SHAPE, np.float32, near=4080)  # the same block, placed anew
    assert _block_of(again) is raw
    assert _rel(again.ctypes.data, 4080) == 2048 - 4080 % 64
    other = bufpool.empty(SHAPE, np.float32, near=16)  # the block is in use: another one
    assert _block_of(other) is not raw
    assert not np.shares_memory(again, other)
    again[...] = 1.0
    other[...] = 2.0
    assert (again == 1.0).all() and (other == 2.0).all()
    del again, other
    bufpool.clear()


def _at(offset: int, a: np.ndarray) -> np.ndarray:
    """A copy of ``a`` whose data start ``offset`` bytes into a 4 KiB page."""
    raw = np.empty(a.nbytes + 2 * PAGE, np.uint8)
    start = (-raw.ctypes.data) % PAGE + offset
    x = raw[start:start + a.nbytes].view(a.dtype).reshape(a.shape)
    x[...] = a
    return x


def _lap(u: Any) -> Any:
    return u(x=1) + u(x=-1) + u(y=1) + u(y=-1) - 4 * u()


def _lap_ref(a: np.ndarray, mode: str) -> np.ndarray:
    """The Laplacian in the kernel's order of operations (numpy)."""
    p = np.pad(a, 1, mode="wrap") if mode == "periodic" else np.pad(a, 1)
    c = p[1:-1, 1:-1]
    return p[1:-1, 2:] + p[1:-1, :-2] + p[2:, 1:-1] + p[:-2, 1:-1] - a.dtype.type(4) * c


@pytest.mark.parametrize("mode", ["fill", "periodic"])
def test_maps_on_inputs_at_any_page_offset_are_right_independent_and_placed(
        mode: str, ran: list[int]) -> None:
    rng = np.random.default_rng(8)
    base = rng.random(SHAPE, dtype=np.float32)
    opts = {"boundary": "periodic"} if mode == "periodic" else {"boundary": "fill",
                                                                 "fill_value": 0.0}
    held = []
    for offset in (0, 16, 1024, 4032, 4080, 16):
        a = _at(offset, base * (1 + offset))
        a0 = a.copy()
        res = xr.DataArray(a, dims=("y", "x")).stencil.map(_lap, backend="loops", **opts)
        dropped = xr.DataArray(a, dims=("y", "x")).stencil.map(_lap, backend="loops", **opts)
        del dropped
        gc.collect()  # its block goes back: later calls place it for their own input
        ptr = res.data.unsafe_buffer_pointer()
        assert _half_a_page_after(ptr, a.ctypes.data) and ptr % HUGE < PAGE
        np.testing.assert_array_equal(np.asarray(res), _lap_ref(a0, mode))
        np.testing.assert_array_equal(a, a0)  # the input untouched
        held.append((res, _lap_ref(a0, mode)))
    assert len(ran) == 12, "the loop backend did not run"
    for i, (r, want) in enumerate(held):
        np.testing.assert_array_equal(np.asarray(r), want)  # later calls changed nothing
        for s, _ in held[i + 1:]:
            assert not np.shares_memory(np.asarray(r), np.asarray(s))


def test_a_map_on_rows_that_are_not_whole_pages_is_placed_too(ran: list[int]) -> None:
    rng = np.random.default_rng(9)
    for offset in (16, 1024):
        a = _at(offset, rng.random(UNEVEN, dtype=np.float32))
        a0 = a.copy()
        res = xr.DataArray(a, dims=("y", "x")).stencil.map(_lap, backend="loops",
                                                           boundary="periodic")
        ptr = res.data.unsafe_buffer_pointer()
        assert _half_a_page_after(ptr, a.ctypes.data) and ptr % HUGE < PAGE
        np.testing.assert_array_equal(np.asarray(res), _lap_ref(a0, "periodic"))
        np.testing.assert_array_equal(a, a0)
    assert len(ran) == 2


@pytest.mark.parametrize("offset", [0, 16, 3000])
def test_a_mesh_result_is_placed_half_a_page_after_its_input(offset: int) -> None:
    a = _at(offset, np.random.default_rng(10).random(SHAPE, dtype=np.float32))
    a0 = a.copy()
    m = xr.DataArray(a, dims=("y", "x")).stencil.mesh(boundary="periodic", backend="loops")
    m[...] = _lap
    m[{"x": 0}] = lambda u: 2 * u()
    res = m.map()
    ptr = res.data.unsafe_buffer_pointer()
    assert _half_a_page_after(ptr, a.ctypes.data) and ptr % HUGE < PAGE
    want = _lap_ref(a0, "periodic")
    want[:, 0] = 2 * a0[:, 0]
    np.testing.assert_array_equal(np.asarray(res), want)
    np.testing.assert_array_equal(a, a0)


def test_a_loop_scans_spare_states_lie_half_a_page_apart() -> None:
    """A time loop's two spare states (each step reads one and writes the
    other) are each placed by the one they follow (``near``): half a page
    apart within their pages.  At the same place, a 2048² heat step's nest
    ran twice as long on session 14's host."""
    shape = (HUGE // 4 + 1000,)
    slab = np.zeros(shape, np.float32)
    a = bufpool.empty(shape, np.float32, bufpool.near_of(slab))
    b = bufpool.empty(shape, np.float32, bufpool.near_of(a))
    assert _half_a_page_after(a.ctypes.data, slab.ctypes.data)
    assert _half_a_page_after(b.ctypes.data, a.ctypes.data)
    assert b.ctypes.data % bufpool.ALIGN == 0
    raw = _block_of(b)
    assert raw.ctypes.data <= b.ctypes.data
    assert b.ctypes.data + b.nbytes <= raw.ctypes.data + raw.nbytes
    b[...] = 3
    assert (b == 3).all() and not np.shares_memory(a, b)

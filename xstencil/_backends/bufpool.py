"""Output buffers of the loop backend, recycled once no result uses them.

A map that returns a new result needs a new output array on every call.  Fresh
memory costs as much as the stencil itself: the kernel faults in and zeroes
every page (numpy's ``a.copy()`` of a 4096 x 4096 float32 array takes twice
an ``np.copyto`` into an existing one), and on a virtual machine that hands
freed memory back to its host (free page reporting) each fault can also fault
on the host, which measured up to 40x slower.  glibc returns every block over
32 MiB to the kernel with ``munmap`` when it is freed, so a loop of maps pays
this on every call even when it drops each result before the next.

:func:`empty` hands out arrays whose memory comes back here, instead of to
glibc, when the last object that can reach it is gone.  The array's numpy base
is a :class:`_Lease` (an ``__array_interface__`` holder), so every view of the
array, the JAX array that wraps it without a copy (``jax.device_put`` aliases
a 64-byte aligned numpy buffer on the CPU and keeps the numpy array alive),
and every ``np.asarray`` of that JAX array keep the lease alive; a ``__del__`` on
the lease returns the memory.  A buffer is therefore never handed out twice
while any result, view or JAX array can still see it.  jaxlib lets go of the
numpy array behind a dropped JAX array lazily, at its next garbage collection
(run by Python's ``gc`` and by :func:`empty` before it looks for a block), so
without that call a dropped result would come back only after the next one
was allocated.

Where the array is a loop's output and ``near`` gives the address of its
input (:func:`near_of`), an array from 2 MiB on starts as many bytes past its
huge-page boundary as put it half a page (1985-2048 bytes) after the input
within a 4 KiB page (:func:`offset`).  A C-contiguous output of the input's
shape then lies at that same distance from it, modulo a page, at every cell.
Stores and loads whose addresses agree in their low 12 bits are falsely
ordered by the CPU (4K aliasing): an output level with its input, or a few
cache lines after it, collides with the loads of the next cells on every
row.  Measured with the 5-point Laplacian's loop nest (float32, 2 cores,
session 15's host, reported as "Intel Xeon Processor", AVX-512), per call,
input at the start of a huge page / 16 bytes into a page:

* 2048² periodic: level 1479 / 872 µs, 64 bytes after 1560 / 1603 µs,
  half a page after 805 / 805 µs;
* 4096² periodic: level 5378 / 4145 µs, 64 after 6188 / 6601 µs, half a page
  3690 / 3911 µs;
* 2100² zero fill (rows of 8400 bytes): level 1333 / 1385 µs, 64 after
  1739 / 1755, half a page 1133 / 1084;
* the 7-point 256³ (rows of 1 KiB): level 7830 / 8010 µs, 64 after 8946 /
  8905, half a page 6054 / 5496.

Session 13's rule (1-64 bytes after the input, from a host where that beat
level by 3-12 %) was the slowest placement on this one.

At most :data:`MAX_IDLE_BYTES` of returned memory is kept (the most recently
returned buffers first); :func:`clear` (``xstencil.clear_caches()``) releases
it all.  Arrays under :data:`MIN_BYTES` come from numpy, whose small blocks
glibc already recycles.
"""

from __future__ import annotations

import collections
import math
import threading
import weakref
from typing import Any

import numpy as np

try:  # drains the Python references jaxlib releases lazily (also run by gc)
    from jax._src.lib import _jax as _jaxlib
except ImportError:  # pragma: no cover - a jaxlib without it: buffers come back later
    _jaxlib = None

__all__ = ["ALIGN", "HALF_PAGE", "MAX_IDLE_BYTES", "MIN_BYTES", "clear", "empty", "idle_bytes",
           "near_of", "offset"]

#: Byte alignment of every array :func:`empty` returns: the alignment
#: ``jax.device_put`` needs to wrap a numpy buffer on the CPU without a copy.
ALIGN = 64
#: Arrays from this size on are recycled (1 MiB).
MIN_BYTES = 1 << 20
#: The most memory kept for reuse while no result holds it (256 MiB).
MAX_IDLE_BYTES = 256 << 20
#: The distance :func:`offset` puts between a loop's output and its input
#: within a page (a time loop's two spare states included: each is placed by
#: the one it reads): half a page.  Two 2048 x 2048
#: float32 arrays at the same place in their huge pages made the heat step's
#: nest run 2.4-2.5 ms where 512 to 4096 bytes apart (or a whole page) took
#: 1.25-1.30 ms (session 14's host, reported as "Intel Xeon Processor",
#: AVX-512); 64 bytes apart was as slow as level.
HALF_PAGE = 2048
_HUGE = 2 << 20  # arrays from 2 MiB on start on a huge-page boundary (plus offset())
_PAGE = 4096  # offset() places an array within this many bytes of a huge-page boundary
_LOCK = threading.Lock()
_IDLE: list[tuple[np.ndarray, int]] = []  # (raw block, aligned start) ready for reuse,
# most recently returned last
_NEAR: list[tuple[Any, int]] = [(None, 0)]  # near_of's last (weakref to the array, address)
_RETURNED: collections.deque[tuple[np.ndarray, int]] = collections.deque()  # from leases


class _Lease:
    """The numpy base of one handed-out array: alive while anything can see it.
    Its ``__del__`` (cheaper than a ``weakref.finalize``: a few hundred
    nanoseconds against several microseconds) returns the block."""

    __slots__ = ("__array_interface__", "block")

    def __init__(self, block: tuple[np.ndarray, int], start: int, shape: tuple[int, ...],
                 dtype: np.dtype):
        self.block = block
        self.__array_interface__ = {"data": (start, False), "shape": shape,
                                    "typestr": dtype.str, "version": 3}

    def __del__(self) -> None:
        try:
            _give_back(self.block)
        except Exception:  # noqa: BLE001, S110 - interpreter shutdown: nothing to return to
            pass


def _start(raw: np.ndarray) -> int:
    """The aligned address inside ``raw`` where the array starts."""
    p = raw.ctypes.data
    return p + (-p) % (_HUGE if raw.nbytes >= 2 * _HUGE else ALIGN)  # see _need


def _give_back(block: tuple[np.ndarray, int]) -> None:
    """Run when a lease dies: may run inside any allocation of any thread (a
    garbage collection), so it only appends; :func:`_drain` files it."""
    _RETURNED.append(block)
    if _LOCK.acquire(blocking=False):  # not inside empty() or clear(): file it now
        try:
            _drain()
        finally:
            _LOCK.release()


def _drain() -> None:
    """Move returned blocks to the idle list and trim it (``_LOCK`` held)."""
    if not _RETURNED:  # nothing came back: the idle list is within its cap already
        return
    while _RETURNED:
        _IDLE.append(_RETURNED.popleft())
    total = sum(r.nbytes for r, _ in _IDLE)
    while _IDLE and total > MAX_IDLE_BYTES:
        total -= _IDLE.pop(0)[0].nbytes


def _need(nbytes: int) -> int:
    """The raw block size for an array of ``nbytes``: room to align its start
    to a huge page from 2 MiB on, plus the :func:`offset` (the block is then
    over 4 MiB), else to :data:`ALIGN` bytes (the block is then under 4 MiB)."""
    return nbytes + (_HUGE + _PAGE if nbytes >= _HUGE else ALIGN)


def near_of(x: np.ndarray) -> int:
    """The ``near`` of :func:`empty` for a loop's output written alongside
    ``x``: ``x``'s address (the address of its first element; for a view
    with gaps between its rows the distance varies from row to row, and this
    places the first).

    The last array's answer is kept (by weak reference): a map repeated on
    the same array reads it in a microsecond, where ``__array_interface__``
    builds a dict, 15-50 µs with the caches cold after a nest.  The address
    only places the output (:func:`offset`), so an answer gone stale (an
    ``ndarray.resize`` in place) costs speed, never a wrong result."""
    ref, near = _NEAR[0]  # one tuple: read and replaced whole, safe across threads
    if ref is not None and ref() is x:
        return near
    near = x.__array_interface__["data"][0]
    try:
        _NEAR[0] = (weakref.ref(x), near)
    except TypeError:  # not weakly referenceable (a subclass with __slots__)
        pass
    return near


def offset(near: int) -> int:
    """Bytes past a huge-page boundary where an output next to the input
    at address ``near`` starts: half a page past the start of ``near``'s
    64-byte line, within a 4 KiB page (so the output lies 1985-2048 bytes
    after the input, modulo a page: see the module notes)."""
    return (near % _PAGE // ALIGN * ALIGN + HALF_PAGE) % _PAGE


def empty(shape: tuple[int, ...], dtype: Any, near: int | None = None) -> np.ndarray:
    """An uninitialised, writeable, C-contiguous array aligned to :data:`ALIGN`
    bytes, in recycled memory where some is idle.

    No other array, view or JAX array shares its memory: memory comes back for
    reuse only after every object that could read it is gone.  ``near``: the
    address of the input a loop reads while it writes this array; from 2 MiB
    on the array then starts :func:`offset` bytes past a huge-page boundary
    (else on the boundary).
    """
    dtype = np.dtype(dtype)
    shape = tuple(int(n) for n in shape)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes < MIN_BYTES:
        buf = np.empty(nbytes + ALIGN, np.uint8)
        off = (-buf.ctypes.data) % ALIGN
        return buf[off:off + nbytes].view(dtype).reshape(shape)
    need = _need(nbytes)
    if _jaxlib is not None and hasattr(_jaxlib, "collect_garbage"):
        _jaxlib.collect_garbage()  # results dropped since the last JAX call come back now
    block = None
    with _LOCK:
        _drain()
        for i in range(len(_IDLE) - 1, -1, -1):
            if _IDLE[i][0].nbytes == need:
                block = _IDLE.pop(i)
                break
    if block is None:
        raw = np.empty(need, np.uint8)  # numpy asks for huge pages from 4 MiB on
        block = (raw, _start(raw))
    start = block[1] if nbytes < _HUGE or near is None else block[1] + offset(near)
    return np.asarray(_Lease(block, start, shape, dtype))


def idle_bytes() -> int:
    """The memory kept for reuse now, in bytes."""
    with _LOCK:
        _drain()
        return sum(r.nbytes for r, _ in _IDLE)


def clear() -> None:
    """Release every idle block (arrays still in use come back later)."""
    with _LOCK:
        while True:  # a lease dying in a collection in here only appends
            _drain()
            _IDLE.clear()
            if not _RETURNED:
                break

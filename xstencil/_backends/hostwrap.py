"""A loop result as a JAX array, wrapped without a copy, in a few microseconds.

A map's result holds a JAX array (the contract of ``map``'s Returns).  The
loop backend writes into a numpy buffer from :mod:`~xstencil._backends.bufpool`
(64-byte aligned), and ``jax.device_put`` wraps such a buffer on the CPU
without copying it.  The wrap itself is one call into jaxlib
(``batched_device_put``), but the public ``jax.device_put`` reaches it through
about a dozen Python layers (pytree flattening, a primitive bind, sharding
inference, a second ``ArrayImpl`` for the uncommitted result).  Right after a
loop nest has streamed tens of MiB through the caches, those layers run cold:
measured at 2048² float32 on 2 cores, ``jax.device_put`` took 160-270 µs per
call after the nest (20 µs in a warm loop), the direct call 27-45 µs.

:class:`Wrapper` makes that direct call with the same arguments
``jax.device_put(x)`` ends up passing (the default device, an uncommitted
single-device sharding, zero-copy host-buffer semantics, the array's own
aval), so the result is the same: a JAX array that shares ``x``'s memory and
keeps ``x`` (and with it the buffer's lease) alive.  Where the direct call is
missing, raises, or would need a dtype conversion (64-bit data while JAX's
x64 flag is off), it falls back to ``jax.device_put``.

:func:`wrap` keeps one :class:`Wrapper` per shape and dtype for the results
whose shapes vary between calls: the loop backend's function meshes
(:mod:`~xstencil._backends.loops_mesh`) and scans
(:mod:`~xstencil._labelled.loop_scan`, its repeat calls included).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

try:  # private: the call jax.device_put makes for a numpy array on one device
    from jax._src.core import ShapedArray
    from jax._src.interpreters.pxla import get_default_device
    from jax._src.lib import xla_client as _xc

    _direct = _xc.batched_device_put
except (ImportError, AttributeError):  # pragma: no cover - another jaxlib: the public way
    _direct = None

__all__ = ["Wrapper", "wrap"]

_MAX_ADDRESSES = 64  # the most (device, address) answers one Wrapper keeps
_MAX_WRAPPERS = 64  # the most (shape, dtype) Wrappers :func:`wrap` keeps
_WRAPPERS: dict[tuple[tuple[int, ...], str], Wrapper] = {}


class Wrapper:
    """Wraps numpy arrays of one shape and dtype as JAX arrays without a copy.

    Holds the aval and, per default device, the sharding, so that a repeated
    call builds nothing.  Falls back to ``jax.device_put`` (the same result)
    for good once the direct call fails.
    """

    __slots__ = ("aval", "shardings", "direct", "aliases")

    def __init__(self, shape: tuple[int, ...], dtype: Any):
        dtype = np.dtype(dtype)
        self.direct = _direct is not None and dtype.kind in "biuf"
        self.aval = ShapedArray(tuple(shape), dtype) if self.direct else None
        self.shardings: dict[Any, Any] = {}
        # (device, address) -> whether the wrap shared the memory there (see alias)
        self.aliases: dict[tuple[Any, int], bool] = {}

    def _public(self, x: np.ndarray) -> bool:
        """Whether ``x`` takes ``jax.device_put`` (which converts 64-bit data
        while the x64 flag is off: a copy)."""
        return not self.direct or (x.dtype.itemsize == 8
                                   and not jax.config.read("jax_enable_x64"))

    def __call__(self, x: np.ndarray) -> jax.Array:
        """``jax.device_put(x)``: ``x`` must have this wrapper's shape and dtype."""
        if self._public(x):
            return jax.device_put(x)
        return self._wrap(x, get_default_device())

    def _wrap(self, x: np.ndarray, device: Any) -> jax.Array:
        try:
            sharding = self.shardings.get(device)
            if sharding is None:
                sharding = self.shardings[device] = jax.sharding.SingleDeviceSharding(device)
            return _direct(self.aval, sharding, [x], [device], False)
        except Exception:  # noqa: BLE001 - jaxlib changed: the public way from now on
            self.direct = False
            return jax.device_put(x)

    def alias(self, x: np.ndarray) -> jax.Array | None:
        """``self(x)`` where it shares ``x``'s memory (later writes into ``x``
        are what it holds), else ``None``.

        Whether jaxlib wraps or copies depends on the device, the shape, the
        dtype and the address's alignment, so the answer is looked up per
        device and address (the pool hands out the same few addresses over
        and over) and measured, by comparing the buffer pointers, the first
        time each comes up (the comparison costs 20-40 µs after a nest)."""
        if self._public(x):
            return None
        device = get_default_device()
        j = self._wrap(x, device)
        if not self.direct:  # the public way from now on: do not rely on it sharing
            return None
        address = x.__array_interface__["data"][0]
        known = self.aliases.get((device, address))
        if known is None:
            try:
                known = j.unsafe_buffer_pointer() == address
            except Exception:  # noqa: BLE001 - no pointer to compare: assume a copy
                known = False
            if len(self.aliases) >= _MAX_ADDRESSES:
                self.aliases.clear()
            self.aliases[(device, address)] = known
        return j if known else None


def wrap(x: np.ndarray) -> jax.Array:
    """``jax.device_put(x)`` for a numpy array on the host, through a
    :class:`Wrapper` kept per shape and dtype (the loop backend's mesh and
    scan results, whose shapes vary from call to call); 64-bit data while
    JAX's x64 flag is off, and dtypes the direct call does not take, go to
    ``jax.device_put`` itself, as :class:`Wrapper` decides."""
    key = (x.shape, x.dtype.str)
    w = _WRAPPERS.get(key)
    if w is None:
        if len(_WRAPPERS) >= _MAX_WRAPPERS:
            _WRAPPERS.clear()
        w = _WRAPPERS[key] = Wrapper(x.shape, x.dtype)
    return w(x)

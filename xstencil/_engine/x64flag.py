"""JAX's x64 flag, read without the public layers.

``jax.config.read("jax_enable_x64")`` costs 3-4 µs warm and about 30 µs
right after a loop nest has evicted the caches, and a repeated map reads it
three times.  :func:`x64` reads the same holder's ``value`` (the global value
or a ``jax.enable_x64`` context's), falling back to the public call where a
JAX version lacks the holder.
"""

from __future__ import annotations

from typing import Any

import jax

__all__ = ["x64"]

try:  # what jax.config.read("jax_enable_x64") returns: this holder's value
    _HOLDER: Any = jax.config._value_holders["jax_enable_x64"]
    bool(_HOLDER.value)
except Exception:  # noqa: BLE001 - another JAX: the public way  # pragma: no cover
    _HOLDER = None


def x64() -> bool:
    """Whether JAX's x64 flag is on now (in this thread and context)."""
    if _HOLDER is None:  # pragma: no cover - another JAX
        return bool(jax.config.read("jax_enable_x64"))
    return bool(_HOLDER.value)

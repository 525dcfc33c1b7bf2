"""Size checks made before anything is allocated: an input or a result that
cannot fit in memory raises a clear error up front, instead of an
out-of-memory error from XLA or a process that swaps or blocks."""

from __future__ import annotations

import functools
import os
from typing import Any

import jax
import numpy as np

from xstencil._errors import XStencilError

__all__ = ["memory_limit", "size_text", "check_fits", "check_inputs"]


@functools.lru_cache(maxsize=1)
def memory_limit() -> int:
    """Bytes one array may take: the host's physical memory, or less on an
    accelerator (its ``bytes_limit``)."""
    try:
        limit = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        limit = 2**63 - 1
    dev = jax.devices()[0]
    if dev.platform != "cpu":
        stats = getattr(dev, "memory_stats", lambda: None)() or {}
        limit = min(limit, int(stats.get("bytes_limit", limit)))
    return int(limit)


def size_text(n: float) -> str:
    """``n`` bytes in words: ``"7.3 TiB"``."""
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PiB"


def check_fits(call: str, nbytes: int, what: str, fix: str) -> None:
    """Raise if ``nbytes`` (of ``what``) exceeds :func:`memory_limit`."""
    limit = memory_limit()
    if nbytes > limit:
        raise XStencilError(
            f"{call}: {what} would need {size_text(nbytes)}, more than the "
            f"{size_text(limit)} of memory available; {fix}")


def check_inputs(call: str, names: Any, arrays: Any) -> None:
    """Numpy inputs are copied whole to the device: a broadcast view (stride
    0) of huge logical size is refused here, before the copy."""
    for n, x in zip(names, arrays, strict=True):
        if isinstance(x, np.ndarray) and x.nbytes > memory_limit():
            label = "the data" if n is None else f"data variable {n!r}"
            check_fits(call, int(x.nbytes), f"{label} (shape {x.shape}, {x.dtype}; a "
                       f"broadcast view is copied whole)",
                       "pass the array before broadcasting and let the kernel broadcast it, "
                       "or chunk it with dask (.chunk(...))")

"""Whether a numpy array holds only finite values: the ``check_finite`` test
that the loop backend's scans run after every step
(:mod:`xstencil._labelled.loop_scan`).

It reads the array once, in one serial numba loop that sums ``x * 0``: zero
for every finite ``x``, NaN for a NaN or an Inf, and NaN stays NaN in a sum,
so the sum is zero exactly when every value is finite (no overflow is
possible, unlike a plain sum).  ``fastmath={"reassoc"}`` only lets LLVM
reorder the sum into SIMD lanes; without ``nnan``/``nsz`` it may not fold
``x * 0`` to ``0``.  Measured on the shared 2-core machine: 0.18 ms at 2048²
float32 and 0.02 ms at 512² float64, against 0.35 and 0.03 ms for
``np.isfinite(x).all()``, which also allocates a boolean array each call.
numba compiles it once per dtype (0.1-0.5 s for the first), on its first
use, from a source kept in the loop nests' disk cache
(:func:`~xstencil._backends.loopcache.njit_source`), so a later process
loads the machine code instead; without numba, or for other dtypes,
``np.isfinite(x).all()`` answers.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from xstencil._backends.loopcache import njit_source

try:
    import numba
except ImportError:  # pragma: no cover - exercised where numba is absent
    numba = None

__all__ = ["all_finite"]


#: The loop: zero for every finite value, NaN from the first NaN or Inf on.
SOURCE = """\
def kernel(flat):
    acc = flat.dtype.type(0)
    for i in range(flat.size):
        acc += flat[i] * 0
    return acc == 0
"""

_JITTED: list[Any] = []  # the dispatcher, made on first use
_MAKE = threading.Lock()


def _jitted() -> Any:
    if not _JITTED:
        with _MAKE:
            if not _JITTED:
                _JITTED.append(njit_source(SOURCE, "<xstencil all_finite>",
                                           fastmath={"reassoc"}, error_model="numpy",
                                           nogil=True))
    return _JITTED[0]


def all_finite(x: np.ndarray) -> bool:
    """Whether the numpy array ``x`` holds no NaN and no Inf (integers and
    booleans always do)."""
    kind = x.dtype.kind
    if kind not in "fc":
        return True
    if numba is not None and kind == "f" and x.dtype.itemsize in (4, 8):
        return bool(_jitted()(x.reshape(-1)))
    return bool(np.isfinite(x).all())

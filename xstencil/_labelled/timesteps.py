"""Evenly spaced datetime and timedelta positions, exact or an error.

numpy's datetime arithmetic wraps silently: ``dt=np.timedelta64(1, "ps")``
on a nanosecond coordinate of 2026 promotes it to picoseconds, whose range
ends in 1970, and a long run of large steps overflows int64.  Pandas and
xarray hold times in nanoseconds at the finest, so a finer ``dt`` also loses
its fraction.  :func:`spaced` computes the positions in the finer of the two
units (at most nanoseconds) with the bounds checked in Python integers.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from xstencil._errors import XStencilError

__all__ = ["joined", "spaced"]

#: Units with a fixed length, coarse to fine (years and months have none).
_LINEAR = ("W", "D", "h", "m", "s", "ms", "us", "ns", "ps", "fs", "as")
_FINEST = "ns"  # the finest resolution pandas and xarray hold
_I64 = 2**63


def _unit(x: Any) -> str:
    return np.datetime_data(x.dtype)[0]


def _exact(call: str, what: str, x: Any, unit: str) -> Any:
    """``x`` converted to ``unit``, or an error where that changes a value."""
    y = x.astype(f"{x.dtype.kind}8[{unit}]")
    back = y.astype(x.dtype)
    if np.any(np.isnat(y) != np.isnat(x)) or np.any((back != x) & ~np.isnat(x)):
        raise XStencilError(
            f"{call}: {what}={x!r:.80} is not a whole number of {unit!r} or does not fit "
            f"datetime64[{unit}] (the finest unit xarray holds is {_FINEST!r}); pass it in "
            f"whole {unit!r} within the int64 range of that unit")
    return y


def spaced(call: str, dim: str, start: Any, dt: Any, ks: np.ndarray) -> np.ndarray:
    """``start + dt * k`` for the integers ``ks`` (``start`` ``None``: a
    timedelta of zero), in the finer unit of ``start`` and ``dt`` (at most
    nanoseconds); raises where a value would wrap or lose a fraction."""
    dt = np.timedelta64(dt)
    units = [_unit(dt)] + ([] if start is None else [_unit(start)])
    if any(u not in _LINEAR for u in units):  # years, months, generic: numpy's own rules
        base = np.zeros((), dtype=dt.dtype) if start is None else start
        return base + dt * ks
    unit = max(units, key=_LINEAR.index)
    if _LINEAR.index(unit) > _LINEAR.index(_FINEST):
        unit = _FINEST
    step = _exact(call, "dt", dt, unit)
    kind = "m" if start is None else start.dtype.kind
    first = np.timedelta64(0, unit) if start is None else _exact(
        call, f"the last {dim!r} coordinate", start, unit)
    a, d = int(first.astype(np.int64)), int(step.astype(np.int64))
    ends = [a + d * int(k) for k in (ks.min(), ks.max())] if ks.size else []
    if any(not -_I64 < e < _I64 for e in ends):
        raise XStencilError(
            f"{call}: {ks.size} positions of dt={dt!r} from {first!r} run past the range "
            f"of {kind}8[{unit}] (int64 {unit!r}); pass fewer steps, a smaller dt, or coord= "
            f"with the positions")
    out = np.int64(a) + np.int64(d) * ks.astype(np.int64)  # in range: no wrap
    return out.view(f"{kind}8[{unit}]")


def joined(call: str, dim: str, have: np.ndarray, new: np.ndarray) -> np.ndarray:
    """The input's positions ``have`` followed by ``new`` (from :func:`spaced`),
    in ``new``'s unit, exactly or an error."""
    if have.dtype.kind in "Mm" and have.dtype != new.dtype:
        have = _exact(call, f"the {dim!r} coordinate", have, np.datetime_data(new.dtype)[0])
    return np.concatenate([have, new])

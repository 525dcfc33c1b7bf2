"""The fill value of ``boundary="fill"``: checked to be a number
(:func:`check_fill`), converted exactly (:func:`exact_fill`), and checked
against every dtype of the data (:func:`fill_for`, :func:`fits`)."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from xstencil._engine.call import dtype_kind
from xstencil._errors import XStencilError

__all__ = ["fill_for", "check_fill", "exact_fill", "fits"]


def fill_for(call: str, fill_value: Any, dtypes: Sequence[Any], needed: bool,
             names: Sequence[str] | None = None) -> Any:
    """The fill value, checked against every one of the data's dtypes."""
    check_fill(call, fill_value)

    def what(k: int) -> str:
        return "" if names is None else f" (variable {names[k]!r})"

    if fill_value is None:
        if not needed:
            return None
        for k, dt in enumerate(dtypes):
            if dtype_kind(dt) not in "fc":
                raise XStencilError(
                    f"{call}: boundary 'fill' on {np.dtype(dt)} data needs fill_value=...; the "
                    f"default NaN has no {np.dtype(dt)} value{what(k)} (pass e.g. fill_value=0, or "
                    f"another boundary mode)"
                )
        return math.nan
    fill_value = exact_fill(call, fill_value)
    for k, dt in enumerate(dtypes):
        if not fits(fill_value, dt):
            raise XStencilError(
                f"{call}: fill_value={fill_value!r} cannot be stored in {np.dtype(dt)} data"
                f"{what(k)}; "
                f"pass a fill_value that {np.dtype(dt)} can hold, or convert the data with "
                f".astype(...)"
            )
    if isinstance(fill_value, np.generic):
        fill_value = fill_value.item()
    if isinstance(fill_value, complex) and all(dtype_kind(dt) != "c" for dt in dtypes):
        fill_value = fill_value.real  # fits() saw no imaginary part: real data takes the real
    return fill_value


def check_fill(call: str, fill_value: Any) -> None:
    """``fill_value`` is None or a number (not a bool-like string, list, ...)."""
    if fill_value is not None and (isinstance(fill_value, str) or not isinstance(
            fill_value, numbers.Number | np.generic) or np.ndim(fill_value) != 0):
        hint = (" (a 0-d array: pass fill_value=x.item())"
                if hasattr(fill_value, "shape") and np.ndim(fill_value) == 0 else "")
        raise XStencilError(
            f"{call}: fill_value={fill_value!r:.60} must be a number, such as "
            f"fill_value=0.0{hint}")
    exact_fill(call, fill_value)


def exact_fill(call: str, fill_value: Any) -> Any:
    """``fill_value`` as a Python or numpy number: other numbers (``Decimal``,
    ``Fraction``) are converted when the conversion is exact, else raise."""
    if fill_value is None or isinstance(fill_value, np.generic | int | float | complex):
        return fill_value
    for kind in (int, float):
        try:
            v = kind(fill_value)
        except (TypeError, ValueError, OverflowError, ArithmeticError):
            continue
        try:
            same = bool(v == fill_value)
        except (TypeError, ArithmeticError):
            same = False
        if same:
            return v
    raise XStencilError(
        f"{call}: fill_value={fill_value!r:.60} ({type(fill_value).__name__}) has no exact "
        f"int or float value; pass a Python int or float, e.g. fill_value="
        f"{_approx(fill_value)!r}")


def _approx(v: Any) -> Any:
    try:
        return float(v)
    except (TypeError, ValueError, OverflowError, ArithmeticError):
        return 0.0


def fits(value: Any, dtype: Any) -> bool:
    """Whether the scalar ``value`` can be stored in ``dtype`` without changing:
    in a float dtype an integer exactly, any other value to within the
    dtype's rounding (``0.1`` in float32), never flushed to 0 or to a
    subnormal's few bits (``1e-50`` in float32: a boundary silently 0)
    nor beyond the largest finite value (``1e300`` in float32: inf)."""
    dt = np.dtype(dtype)
    v = value.item() if isinstance(value, np.generic) else value
    if isinstance(v, complex) and dt.kind != "c":
        return v.imag == 0 and fits(v.real, dt)
    if dt.kind in "iu":
        if isinstance(v, float) and not v.is_integer():
            return False
        info = np.iinfo(dt)
        return bool(info.min <= v <= info.max)
    if dt.kind == "b":
        return v in (0, 1)
    if dtype_kind(dt) in "fc":
        info = jnp.finfo(dt)
        big, eps = float(info.max), float(info.eps)
        parts = (v.real, v.imag) if isinstance(v, complex) else (v,)
        part = dt if dt.kind != "c" else np.dtype(np.float32 if dt.itemsize == 8 else np.float64)
        for p in parts:
            if not math.isfinite(p):
                continue
            if abs(p) > big:  # it would become inf
                return False
            stored = float(np.asarray(p).astype(part).astype(np.float64))
            if isinstance(p, int) and stored != p:
                return False  # an integer the dtype cannot hold (2**24 + 1 in float32)
            if abs(stored - p) > eps * abs(p):
                return False  # more than rounding: flushed to 0, or a subnormal's few bits
    return True

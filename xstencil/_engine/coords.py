"""Coordinate windows: the values of a 1-D coordinate around each point.

Inside the halo the coordinate continues geometrically, so that differences
such as ``x(x=1) - x(x=-1)`` stay meaningful at the edges:

* ``fill``, ``extend``, ``valid``: extrapolated linearly with the edge spacing;
* ``periodic``: shifted by one period (the neighbour of the last point reads
  as the first point plus the period).  The period is inferred from uniform
  spacing (``n * dx``) or given with ``period={dim: value}``;
* ``reflect`` / ``symmetric``: mirrored about the edge point / about the
  midpoint half a spacing beyond the edge, so distances are preserved.

Datetime coordinates become float seconds since their first value, and
timedelta coordinates float seconds.

Precision: every value, halo and period is computed here in float64.  A
kernel reads coordinates in the data's float dtype; below float64 each value
travels as a float32 pair ``hi + lo`` (packed in a complex64, see
:func:`pack_coord`), so the difference of two reads is exact to float32
precision (about 1e-7 relative), however large the values are.
A dim with a single position has no spacing: its halo is NaN, and a kernel
read off the centre raises (:class:`xstencil._engine.coordwindow.CoordWindow`).
"""

from __future__ import annotations

import datetime
import hashlib
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from xstencil._engine.boundary import source_index
from xstencil._errors import XStencilError

__all__ = ["coord_digest", "coord_values", "is_cftime", "same_values", "numeric_coord",
           "coord_period", "check_monotonic", "pad_coord", "read_coord", "read_dtype",
           "pack_coord", "padded", "repeated_period", "warn_repeated_endpoint"]

#: spans that are a full period on their own: a periodic coordinate spanning
#: one of these from its first to its last label repeats its endpoint
_PERIODS = (2 * np.pi, 360.0)


def repeated_period(c: np.ndarray | None, period: float | None = None) -> float | None:
    """The period that the first and last labels of ``c`` are apart, if
    :func:`warn_repeated_endpoint` warns for them, else ``None``."""
    if c is None or len(c) < 3:
        return None
    span = float(c[-1] - c[0])
    known = [p for p in _PERIODS if np.isclose(abs(span), p, rtol=1e-9, atol=0)]
    if period is not None:
        if known or not np.isclose(abs(span), period, rtol=1e-9, atol=0):
            return None  # the first case already warned when the plan was made
        known = [period]
    return known[0] if known else None


def warn_repeated_endpoint(call: str, dim: str, c: np.ndarray | None,
                           period: float | None = None) -> None:
    """Warn when a periodic coordinate's first and last labels are one period
    apart (``np.linspace(0, 2*np.pi, 21)``): the last point repeats the first,
    so the periodic neighbour of the last point is the first point again."""
    known = repeated_period(c, period)
    if known is None or c is None:
        return
    warnings.warn(
        f"{call}: boundary 'periodic' on {dim!r}, whose first and last labels "
        f"({c[0]:g}, {c[-1]:g}) are one period ({known:g}) apart: the last point repeats "
        f"the first, so the seam is read twice and derivatives there are wrong. Drop the "
        f"last point (data.isel({dim}=slice(None, -1))), or build the grid with "
        f"np.linspace(start, stop, n, endpoint=False)", stacklevel=2)



def coord_values(v: Any) -> np.ndarray:
    """A coordinate variable's values as numpy; a timezone-aware datetime
    index as UTC datetime64 (without pandas' deprecated ``.values``)."""
    if getattr(v.dtype, "tz", None) is not None:
        idx = v.to_index() if getattr(v, "ndim", 1) == 1 else pd.DatetimeIndex([v.item()])
        out = idx.tz_convert(None).to_numpy()
        return out if getattr(v, "ndim", 1) == 1 else out[0]
    return np.asarray(v.values)


def coord_digest(name: Any, v: Any) -> tuple[Any, ...]:
    """A coordinate variable ``v`` by value, for a compile-cache key: its name,
    dims, shape, dtype (a timezone included), attrs and a digest of its values (their bytes for
    numbers, datetimes and timedeltas, else their repr)."""
    a = np.asarray(v.values)
    raw = np.ascontiguousarray(a).view(np.uint8) if a.dtype.kind in "biufcmM" \
        else repr(a.tolist()).encode()
    return (str(name), tuple(v.dims), a.shape, str(v.dtype), repr(v.attrs),
            hashlib.blake2b(raw, digest_size=16).hexdigest())


def same_values(a: Any, b: Any) -> bool:
    """Whether two coordinates hold equal labels; labels that do not compare
    (cftime dates of two calendars) are not equal."""
    try:
        return bool(np.array_equal(a, b))
    except (TypeError, ValueError):
        return False


def is_cftime(values: Any) -> bool:
    """Labels of a non-standard calendar (cftime objects, held as objects)."""
    v = np.asarray(values).ravel()
    return v.dtype.kind == "O" and bool(v.size) and all(
        hasattr(x, "calendar") and hasattr(x, "timetuple") for x in v)


def numeric_coord(call: str, dim: str, values: np.ndarray) -> np.ndarray | None:
    """The coordinate as float64, or ``None`` if it is not numeric."""
    values = np.asarray(values)
    if is_cftime(values):
        # cftime labels (a non-standard calendar): seconds since the first, by
        # the calendar's own arithmetic (a difference is a datetime.timedelta)
        flat = values.ravel()
        return np.array([(v - flat[0]).total_seconds() for v in flat],
                        dtype=np.float64).reshape(values.shape)
    if values.dtype.kind == "O" and values.size and all(
            isinstance(v, datetime.datetime) for v in values.ravel()):
        # a timezone-aware index: xarray gives naive UTC datetimes
        values = values.astype("datetime64[us]")
    if values.dtype.kind == "M":
        return _seconds_since_first(values)
    if values.dtype.kind == "m":
        return values / np.timedelta64(1, "s")
    if values.dtype.kind in "iuf":
        return values.astype(np.float64)
    return None


def read_coord(call: str, dim: str, values: np.ndarray) -> np.ndarray | None:
    """:func:`numeric_coord` for a coordinate a kernel reads: integers that
    float64 cannot hold exactly (beyond 2**53: epoch nanoseconds) are
    refused, since the differences of their reads would be rounded to the
    float64 spacing there (256 at 1.7e18: 2048 for a step of 2000)."""
    values = np.asarray(values)
    c = numeric_coord(call, dim, values)
    if values.dtype.kind in "iu" and c is not None and values.size \
            and not np.array_equal(c.astype(values.dtype), values):
        raise XStencilError(
            f"{call}: coordinate {dim!r} holds integers beyond 2**53 ({int(values.flat[0])}), "
            f"which float64 cannot hold exactly, so differences of its reads (u.coord"
            f"({dim!r})) would be rounded; convert it, to datetime64 if it counts time "
            f"(obj.assign_coords({dim}=obj[{dim!r}].astype('datetime64[ns]'))), or "
            f"subtract an origin (obj.assign_coords({dim}=obj[{dim!r}] - obj[{dim!r}][0]))")
    return c


def _seconds_since_first(values: np.ndarray) -> np.ndarray:
    """Seconds since the first known datetime, in float64.  ``values -
    values[0]`` wraps in int64 for nanosecond times more than 292 years apart
    (1700 to 2100), so whole seconds and the rest are subtracted apart.  The
    origin is the first label that is not NaT: a NaT first label made every
    position NaN, so every coordinate difference a kernel read was NaN, not
    only those next to the missing label."""
    unit, count = np.datetime_data(values.dtype)
    per_s = np.timedelta64(1, "s") / np.timedelta64(count, unit)  # ticks per second
    ticks, nat = values.view(np.int64), np.isnat(values)
    known = ticks[~nat]
    if not known.size or int(known.max()) - int(known.min()) < 2**63 or per_s <= 1 \
            or per_s != int(per_s):  # no wrap: exact
        origin = values[~nat][0] if known.size else values.flat[0]
        return (values - origin) / np.timedelta64(1, "s")
    t0 = known[0]
    n = int(per_s)
    whole = (ticks // n - t0 // n).astype(np.float64)
    rest = (ticks % n - t0 % n).astype(np.float64) / n
    out = whole + rest
    out[nat] = np.nan
    return out


def coord_period(call: str, dim: str, c: np.ndarray, period: float | None) -> float:
    """The period of coordinate ``c`` across a periodic boundary: ``period``,
    or the length of a uniformly spaced ``c`` (its spacing times its size),
    signed as ``c`` runs (negative for descending labels), so that the seam
    continues the labels in their own direction.  Labels that are not
    monotonic (a rolled longitude, 180..357.5, 0..177.5) are refused: their
    internal jump would be read as a step of almost one period."""
    check_monotonic(call, dim, c, period)
    if period is not None:
        warn_repeated_endpoint(call, dim, c, period)
        sign = -1.0 if len(c) > 1 and c[-1] < c[0] else 1.0
        if len(c) > 1 and abs(float(c[-1] - c[0])) > period * (1 + 1e-9):
            raise XStencilError(
                f"{call}: period={{{dim!r}: {period!r}}} is shorter than the span of "
                f"coordinate {dim!r} ({c[0]:g} to {c[-1]:g}), so the seam would step "
                f"backwards; give the full period (the span plus one spacing for an "
                f"evenly spaced grid)")
        return sign * period
    d = np.diff(c)
    if not len(d):
        return float("nan")  # one position: no period
    if np.allclose(d, d[0], rtol=1e-6, atol=0):
        return float(len(c) * d[0])
    # a uniform grid stored in float32 (a 0.1 degree longitude read from a file)
    # is uniform only to float32's rounding of its values: accept that, and fit
    # the spacing by least squares (d[0] is off by the rounding of c[0], which
    # the period multiplies by the length: 0.027 degrees for 0.1 from -180)
    if np.array_equal(c.astype(np.float32), c):
        i = np.arange(len(c)) - (len(c) - 1) / 2
        spacing = float(np.dot(i, c - c.mean()) / np.dot(i, i))
        rounding = 4 * float(np.finfo(np.float32).eps) * float(np.abs(c).max())
        if spacing and np.all(np.abs(d - spacing) <= 1e-6 * abs(spacing) + rounding):
            return float(len(c) * spacing)
    raise XStencilError(
        f"{call}: coordinate {dim!r} is not uniformly spaced, so its period across "
        f"the periodic boundary cannot be inferred; pass period={{{dim!r}: ...}}"
    )


def check_monotonic(call: str, dim: str, c: np.ndarray, period: float | None) -> None:
    """Refuse a periodic coordinate whose labels rise and fall: a kernel
    reading ``u.coord(dim)`` would see the internal jump (357.5 to 0 in a
    rolled longitude) as a step of almost one period.  Unwrapping the labels
    would mend the differences but change the values kernels read, so the
    caller sorts or unwraps them instead."""
    d = np.diff(c)
    if not ((d > 0).any() and (d < 0).any()):
        return
    up = bool(np.sum(d > 0) >= np.sum(d < 0))
    i = int(np.flatnonzero(d < 0 if up else d > 0)[0])
    p = "..." if period is None else repr(period)
    raise XStencilError(
        f"{call}: boundary 'periodic' on {dim!r}, whose coordinate is not monotonic: it "
        f"{'falls' if up else 'rises'} from {c[i]:g} to {c[i + 1]:g} between positions {i} "
        f"and {i + 1} (as after .roll({dim}=..., roll_coords=True)), so coordinate "
        f"differences read across that jump (u.coord({dim!r})) would be off by a period; "
        f"sort the data first (obj.sortby({dim!r})), or unwrap the labels "
        f"(obj.assign_coords({dim}=np.unwrap(obj[{dim!r}], period={p})))")


def pad_coord(call: str, dim: str, c: np.ndarray, lo: int, hi: int, mode: str,
              period: float | None = None) -> np.ndarray:
    """The coordinate ``c`` with ``lo``/``hi`` halo points for ``mode``."""
    if c is None:
        raise XStencilError(
            f"{call}: coordinate {dim!r} cannot be read as numbers by u.coord({dim!r}) "
            f"(numbers, datetimes and timedeltas can); convert it (e.g. to datetime64 or to "
            f"float seconds) with obj.assign_coords({dim}=...)")
    n = len(c)
    if lo == 0 and hi == 0:
        return c
    p = np.arange(-lo, n + hi)
    if mode in ("fill", "extend", "valid") or n == 1:
        one = period if n == 1 and mode == "periodic" and period is not None else np.nan
        d_lo = c[1] - c[0] if n > 1 else one  # one position: no spacing to extend by
        d_hi = c[-1] - c[-2] if n > 1 else one
        return np.where(p < 0, c[0] + p * d_lo,
                        np.where(p >= n, c[-1] + (p - n + 1) * d_hi, c[np.clip(p, 0, n - 1)]))
    if mode == "periodic":
        idx = source_index(p, n, mode)
        return c[idx] + np.floor_divide(p, n) * coord_period(call, dim, c, period)
    return _unfolded(c, p, mode)


def _unfolded(c: np.ndarray, p: np.ndarray, mode: str) -> np.ndarray:
    """The coordinate at positions ``p`` of a ``reflect`` or ``symmetric``
    halo, as the mirrored grid unfolds: a position past an end is the mirror
    image, about that end's mirror point (the edge point for ``reflect``,
    the point half a spacing beyond it for ``symmetric``), of the position
    it reflects to, and so on until it lands in the grid.  The positions keep
    increasing however deep the halo, while the data's index bounces back
    and forth; one reflection gives ``2 * mirror - c[i]`` as written."""
    n = len(c)
    shift = 0 if mode == "reflect" else 1  # symmetric repeats the edge cell
    if mode == "reflect":
        m_lo, m_hi = c[0], c[-1]
    else:
        m_lo, m_hi = c[0] - (c[1] - c[0]) / 2, c[-1] + (c[-1] - c[-2]) / 2
    q = np.asarray(p).copy()
    sign = np.ones(q.shape)
    off = np.zeros(q.shape)
    while True:
        lo, hi = q < 0, q > n - 1
        if not (lo.any() or hi.any()):
            return off + sign * c[q]
        off = np.where(lo, off + sign * (2 * m_lo), np.where(hi, off + sign * (2 * m_hi), off))
        sign = np.where(lo | hi, -sign, sign)
        q = np.where(lo, -q - shift, np.where(hi, 2 * (n - 1) + shift - q, q))


def read_dtype(var_dtypes: Sequence[Any]) -> np.dtype:
    """The float dtype a kernel reads coordinates in: the data's float dtype
    (float32 for integer data; the real dtype of complex data)."""
    cdt = np.result_type(*[dt if np.dtype(dt).kind in "fc" else np.float32
                           for dt in var_dtypes])
    if np.dtype(cdt).kind == "c":
        cdt = np.float64 if np.dtype(cdt).itemsize == 16 else np.float32
    return np.dtype(cdt)


def padded(call: str, values: Mapping[str, np.ndarray], widths: Mapping[str, tuple[int, int]],
           modes: Mapping[str, str], period: Mapping[str, float] | None,
           dtype: Any) -> tuple[np.ndarray, ...]:
    """Each numeric coordinate in ``values`` (in its order) padded by
    ``widths[dim]`` cells in ``modes[dim]`` (``valid`` pads like ``fill``),
    as ``dtype``: the one coordinate padding shared by every backend."""
    out = []
    for d, c in values.items():
        lo, hi = widths[d]
        mode = "fill" if modes[d] == "valid" else modes[d]
        p = pad_coord(call, d, c, lo, hi, mode, None if period is None else period.get(d))
        out.append(pack_coord(p, dtype))
    return tuple(out)


def pack_coord(values: np.ndarray, dtype: Any) -> np.ndarray:
    """Coordinate ``values`` (float64) as the kernel's coordinate source for
    reads in ``dtype``: float64 itself for float64 reads, else the
    float32 pair ``hi + 1j * lo`` with ``hi + lo == values`` to float64
    precision, so that differences of reads stay exact."""
    c = np.asarray(values, np.float64)
    if np.dtype(dtype).itemsize >= 8:  # float64 data computes in float64 (x64 scoped on)
        return c
    hi = c.astype(np.float32)
    with np.errstate(invalid="ignore"):
        lo = np.where(np.isfinite(c), c - hi.astype(np.float64), 0.0).astype(np.float32)
    return (hi + 1j * lo).astype(np.complex64)


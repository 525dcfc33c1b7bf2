"""The windows a staggered kernel receives: reads by axis name in cell units.

``s["v"](X=0.5)`` reads ``v`` half a cell to the right of the output point
along axis ``X``.  Each variable was renamed onto the index dims of the plain
call underneath (:mod:`xstencil._labelled.staggered`); its *delta* along an
axis is where the output point sits relative to the variable's point of the
same index, in cells (``OFFSET[out] - OFFSET[var]``).  A read at ``r`` cells
is then the integer index offset ``r + delta``; anything else does not land on
the variable's points and raises.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import jax.numpy as jnp

from xstencil._engine.window import Window
from xstencil._errors import XStencilError

__all__ = ["Axes", "StaggeredWindow", "StaggeredSet", "MetricWindow", "UNSORTED"]


@dataclass(frozen=True)
class Axes:
    """What a kernel's reads need to know about the grid, for one output
    position: per axis its index dim, output position, and (periodic axes)
    the period and the hidden index variable that detects wraps."""

    index: tuple[tuple[str, str], ...]  # axis -> index dim of the plain call
    at: tuple[tuple[str, str], ...]  # axis -> output position
    dims: tuple[tuple[str, str], ...]  # grid dim -> axis (for error messages)
    period: tuple[tuple[str, float | None], ...] = ()  # periodic axis -> period
    size: tuple[tuple[str, int], ...] = ()  # axis -> cells
    #: dims outside the grid given no boundary mode: a read off the centre
    #: along one would take the grid's fill value (0) past its edges
    unset: tuple[str, ...] = ()


def _land(label: str, axis: str, r: Any, delta: float, pos: str, at: str) -> int:
    if isinstance(r, bool) or not isinstance(r, numbers.Real):
        raise XStencilError(f"{label}({axis}={r!r}): offsets are numbers of cells, such as "
                            f"1, -1, 0.5 or -0.5")
    k = float(r) + delta
    if abs(k - round(k)) > 1e-9:
        ok = "0, ±1, ±2, ..." if delta == round(delta) else "±0.5, ±1.5, ..."
        raise XStencilError(
            f"{label}({axis}={r!r}): the output is at {at!r} along {axis!r} and this "
            f"variable at {pos!r}, so a read at {r!r} cells falls between its points; "
            f"offsets that land on it are {ok}")
    return int(round(k))


class StaggeredWindow:
    """A variable's window, read by axis name in cells from the output point.

    Parameters
    ----------
    win
        The plain window (over the index dims).
    deltas
        ``{axis: (position, delta)}`` for the axes this variable lies on.
    axes
        The grid's axes for this call.
    coords
        ``{axis: (coordinate window, index window or None)}`` of this
        variable's position along each axis (for :meth:`coord`).
    """

    def __init__(self, win: Window, deltas: Mapping[str, tuple[str, float]], axes: Axes,
                 coords: Mapping[str, tuple[Any, Any]] | None = None, label: str = "u"):
        self._win = win
        self._deltas = dict(deltas)
        self._axes = axes
        self._coords = dict(coords or {})
        self._label = label

    def __repr__(self) -> str:
        pos = {a: p for a, (p, _) in self._deltas.items()}
        return f"<xstencil staggered window {self._label} at {pos}>"

    def offsets(self, offsets: Mapping[str, Any]) -> dict[str, int]:
        """The plain window's integer offsets for a read at ``offsets`` (cells)."""
        index, at, gdims = dict(self._axes.index), dict(self._axes.at), dict(self._axes.dims)
        out: dict[str, int] = {}
        for key, r in offsets.items():
            if key in index:
                if key in self._deltas:
                    pos, delta = self._deltas[key]
                    out[index[key]] = _land(self._label, key, r, delta, pos, at[key])
                elif isinstance(r, bool) or not isinstance(r, numbers.Real):
                    raise XStencilError(f"{self._label}({key}={r!r}): offsets are numbers "
                                        f"of cells")
            elif key in gdims:
                raise XStencilError(
                    f"{self._label}({key}=...): {key!r} is a dim of grid axis "
                    f"{gdims[key]!r}; on a grid, read by axis name in cells from the output "
                    f"point, e.g. {self._label}({gdims[key]}=0.5)")
            else:
                if key in self._axes.unset and not isinstance(r, bool) \
                        and isinstance(r, numbers.Real) and r != 0:
                    raise XStencilError(
                        f"{self._label}({key}={r!r}): {key!r} is a dim outside the grid and "
                        f"has no boundary mode, so past its edges this read would take the "
                        f"grid's fill value (0; a plain map reads NaN); give it a mode, e.g. "
                        f"boundary={{..., {key!r}: 'extend'}} ('fill' for the fill value)")
                out[key] = r
        for a, (pos, delta) in self._deltas.items():
            if a not in offsets:
                out[index[a]] = _land(self._label, a, 0, delta, pos, at[a])
        return out

    def __call__(self, /, **offsets: Any) -> Any:
        """Read by axis name, in cells from the output point: ``u(X=0.5)``."""
        return self._win(**self.offsets(offsets))

    def coord(self, axis: str) -> StaggeredWindow | Any:
        """The coordinate of this variable's points along ``axis``, read like
        the variable; across a periodic seam it continues by one period."""
        if axis not in self._coords:
            if axis not in dict(self._axes.index):
                return self._win.coord(axis)  # a dim outside the grid, such as time
            raise XStencilError(
                f"{self._label}.coord({axis!r}): this variable's dim along {axis!r} has no "
                f"numeric coordinate; assign one, e.g. ds.assign_coords(x_c=...)")
        cw, iw, edges = self._coords[axis]
        return _CoordWindow(cw, iw, edges, {axis: self._deltas[axis]}, self._axes,
                            label=f"{self._label}.coord({axis!r})")

    @property
    def position(self) -> dict[str, str]:
        """``{axis: position}`` of this variable."""
        return {a: p for a, (p, _) in self._deltas.items()}


#: the period recorded for a periodic axis whose centre labels rise and fall
#: (a rolled longitude): a coordinate read on it raises (equal to itself, so
#: compile-cache keys still match, unlike NaN)
UNSORTED = float("inf")


class _CoordWindow(StaggeredWindow):
    """A coordinate read like its variable.  Across a periodic seam it
    continues by one period; past any other edge it continues linearly with
    the edge's spacing, as a plain map's ``u.coord`` does under ``fill`` and
    ``extend``
    (``edges``: the first value and spacing at each end, read at the output
    point; the padded value itself would be the fill value or the edge's)."""

    def __init__(self, cw: Window, iw: Window | None, edges: tuple[Any, ...] | None,
                 deltas: Mapping[str, tuple[str, float]], axes: Axes, label: str):
        super().__init__(cw, deltas, axes, label=label)
        self._iw = iw
        self._edges = edges

    def __call__(self, /, **offsets: Any) -> Any:
        off = self.offsets(offsets)
        val = self._win(**off)
        if self._iw is None:
            return val
        (axis,) = self._deltas
        dim = dict(self._axes.index)[axis]
        n = dict(self._axes.size)[axis]
        k = off[dim]
        if axis not in dict(self._axes.period):
            if k == 0 or self._edges is None:
                return val
            j = self._iw(**{dim: 0}) + k  # the index read, past an edge or not
            lo0, lod, hi0, hid = (e(**{dim: 0}) for e in self._edges)
            return jnp.where(j < 0, lo0 + j * lod,
                             jnp.where(j > n - 1, hi0 + (j - (n - 1)) * hid, val))
        period = dict(self._axes.period).get(axis)
        if period is None:
            raise XStencilError(
                f"{self._label}: axis {axis!r} is periodic and its coordinate is not uniformly "
                f"spaced, so its period is unknown; pass period={{{axis!r}: ...}}")
        if period == UNSORTED:  # labels that rise and fall (staggered_hidden._period)
            raise XStencilError(
                f"{self._label}: axis {axis!r} is periodic and its centre coordinate is not "
                f"monotonic (as after .roll(..., roll_coords=True)), so coordinate differences "
                f"read across its jump would be off by a period; sort the data first "
                f"(ds.sortby(...) on the axis's dims)")
        wraps = (self._iw(**{dim: 0}) + k - self._iw(**{dim: k})) / n
        return val + wraps * period


class MetricWindow:
    """A metric (``dx``, an area) read at any position: the grid's metric
    variable whose points the read lands on is used."""

    def __init__(self, axes_key: tuple[str, ...], candidates: list[StaggeredWindow],
                 label: str):
        self._key = axes_key
        self._candidates = candidates
        self._label = label

    def __call__(self, /, **offsets: Any) -> Any:
        for c in self._candidates:
            try:
                off = c.offsets(offsets)
            except XStencilError:
                continue
            return c._win(**off)
        where = ", ".join(f"{c._label} at {c.position}" for c in self._candidates)
        raise XStencilError(
            f"{self._label}({', '.join(f'{k}={v!r}' for k, v in offsets.items())}): no metric "
            f"for axes {self._key!r} has a point there (the grid has {where or 'none'}); add "
            f"the metric at that position to the grid's metrics")


class StaggeredSet(Mapping[str, StaggeredWindow]):
    """A staggered kernel's argument: ``s["u"]`` or ``s.u`` is variable ``u``,
    ``s.metric("X")`` the grid's ``X`` metric, ``s.coord("X")`` the
    coordinate along ``X`` at the output position."""

    def __init__(self, windows: dict[str, StaggeredWindow],
                 metrics: dict[frozenset[str], list[StaggeredWindow]],
                 coords: dict[str, StaggeredWindow]):
        self._windows = windows
        self._metrics = metrics
        self._coords = coords

    def __getitem__(self, name: str) -> StaggeredWindow:
        try:
            return self._windows[name]
        except KeyError:
            raise XStencilError(
                f"s[{name!r}]: the Dataset has no data variable {name!r}; available are "
                f"{tuple(self._windows)!r}") from None

    def __getattr__(self, name: str) -> StaggeredWindow:
        if name.startswith("_"):
            raise AttributeError(name)
        return self[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._windows)

    def __len__(self) -> int:
        return len(self._windows)

    def __repr__(self) -> str:
        return f"<xstencil staggered WindowSet {list(self._windows)}>"

    def metric(self, axes: str | tuple[str, ...]) -> MetricWindow:
        """The grid's metric along ``axes`` (``"X"``, or ``("X", "Y")`` for an
        area), read in cells from the output point at any position the grid
        has it: ``s.metric("X")(X=0.5)``."""
        key = (axes,) if isinstance(axes, str) else tuple(axes)
        found = self._metrics.get(frozenset(key))
        if not found:
            raise XStencilError(
                f"s.metric({axes!r}): the grid has no metric for axes {key!r}; it has "
                f"{[tuple(sorted(k)) for k in self._metrics]!r} (pass metrics= to xgcm.Grid)")
        return MetricWindow(key, found, f"s.metric({axes!r})")

    def coord(self, axis: str) -> StaggeredWindow:
        """The coordinate along ``axis`` at the output position."""
        if axis not in self._coords:
            raise XStencilError(
                f"s.coord({axis!r}): no numeric coordinate along {axis!r} at the output "
                f"position; available: {tuple(self._coords)!r}")
        return self._coords[axis]

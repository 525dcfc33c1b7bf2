"""Staggered grids: the axes and positions of an xgcm-style grid.

A grid names, for each axis (``"X"``, ``"Y"``, ...), the dim that holds the
points at each position of a cell: ``center``, ``left`` (half a cell before
the centre, xgcm's ``left[i]`` at ``i - 1/2``), ``right`` (``i + 1/2``) and
``outer``/``inner``.  It comes from

* an ``xgcm.Grid`` (read duck-typed: its ``axes`` with ``coords``,
  ``padding`` and ``fill_value``, and its metrics; xgcm is not imported),
* a mapping ``{"X": {"center": "x_c", "left": "x_g"}, ...}``,
* or the COMODO attributes xgcm autoparses (``axis`` on each dim coordinate,
  ``c_grid_axis_shift: -0.5 / 0.5`` on the staggered ones), when ``grid`` is
  omitted.

This module only parses; :mod:`xstencil._labelled.staggered` translates a
staggered call into a plain one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import xarray as xr

from xstencil._errors import XStencilError

__all__ = ["GridAxis", "Grid", "parse_grid", "OFFSET", "POSITIONS"]

#: Where each position sits, in cells, relative to the centre of the same index.
OFFSET = {"center": 0.0, "left": -0.5, "right": 0.5, "outer": -0.5, "inner": 0.5}
POSITIONS = ("center", "left", "right", "outer", "inner")
_MODES = ("fill", "extend", "periodic")


@dataclass(frozen=True)
class GridAxis:
    """One axis: ``dims`` maps position -> dim; ``padding`` is ``None`` when
    the grid sets no boundary condition."""

    name: str
    dims: tuple[tuple[str, str], ...]
    padding: str | None = None
    fill_value: float | None = None

    @property
    def positions(self) -> dict[str, str]:
        return dict(self.dims)


@dataclass(frozen=True)
class Grid:
    """The parsed grid: axes, and metrics as ``(axes, variable name)``."""

    axes: tuple[GridAxis, ...]
    metrics: tuple[tuple[frozenset[str], str], ...] = ()
    source: Any = field(default=None, compare=False, hash=False)  # the grid's own Dataset
    where: dict[str, tuple[str, str]] = field(default_factory=dict, compare=False, hash=False)

    def axis(self, name: str) -> GridAxis:
        for a in self.axes:
            if a.name == name:
                return a
        raise KeyError(name)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.axes)


def _where(axes: tuple[GridAxis, ...]) -> dict[str, tuple[str, str]]:
    return {d: (a.name, p) for a in axes for p, d in a.dims}


def parse_grid(call: str, ds: xr.Dataset, grid: Any) -> Grid:
    """The grid of ``ds``: from ``grid`` (an xgcm.Grid or a mapping) or, when
    it is ``None``, from the COMODO attributes of ``ds``'s coordinates."""
    if grid is None:
        axes = _comodo(call, ds)
        metrics: tuple[tuple[frozenset[str], str], ...] = ()
    elif isinstance(grid, Mapping):
        axes = tuple(_mapping_axis(call, ds, name, spec) for name, spec in grid.items())
        metrics = ()
    elif hasattr(grid, "axes") and isinstance(getattr(grid, "axes", None), Mapping):
        axes = tuple(_xgcm_axis(call, ds, name, ax, grid) for name, ax in grid.axes.items())
        metrics = _xgcm_metrics(call, ds, grid)
    else:
        raise XStencilError(
            f"{call}: grid={grid!r:.80} is not a grid; pass an xgcm.Grid, a mapping such as "
            f"{{'X': {{'center': 'x_c', 'left': 'x_g'}}}}, or nothing (the Dataset's COMODO "
            f"attributes 'axis' and 'c_grid_axis_shift' are read)")
    if not axes:
        raise XStencilError(f"{call}: the grid has no axes; name them, e.g. grid={{'X': "
                            f"{{'center': 'x_c', 'left': 'x_g'}}}}")
    seen: dict[str, str] = {}
    for a in axes:
        for p, d in a.dims:
            if d in seen:
                raise XStencilError(
                    f"{call}: grid: dim {d!r} is on axis {seen[d]!r} and on axis {a.name!r} "
                    f"({p!r}); each dim belongs to one axis and one position")
            seen[d] = a.name
    source = getattr(grid, "_ds", None)
    return Grid(axes, metrics, source if isinstance(source, xr.Dataset) else None,
                _where(axes))


def _check_positions(call: str, ds: xr.Dataset, name: str, coords: Mapping[str, Any],
                     source: Any = None) -> tuple[tuple[str, str], ...]:
    """Validate ``{position: dim}``.  Dims the data lacks are kept (a subset
    of a Dataset need not carry every position); the sizes of those it has
    must agree."""
    out = []
    for p, d in coords.items():
        if p not in POSITIONS:
            raise XStencilError(
                f"{call}: grid axis {name!r}: position {p!r} is not one of {POSITIONS!r}")
        if not isinstance(d, str):
            raise XStencilError(f"{call}: grid axis {name!r}: dim {d!r} (position {p!r}) must "
                                f"be a dim name (str)")
        out.append((str(p), str(d)))
    if "center" not in dict(out):
        raise XStencilError(
            f"{call}: grid axis {name!r} has no 'center' dim ({dict(out)!r}); xstencil counts "
            f"cells by the centres, so name the centre dim, e.g. {{'center': 'x_c', ...}}")
    sizes = {p: ds.sizes[d] for p, d in out if d in ds.dims}
    if not sizes:
        return tuple(out)
    p0, s0 = next(iter(sizes.items()))
    n = s0 - 1 if p0 == "outer" else s0 + 1 if p0 == "inner" else s0
    for p, d in out:
        want = n + 1 if p == "outer" else n - 1 if p == "inner" else n
        if p in sizes and sizes[p] != want:
            raise XStencilError(
                f"{call}: grid axis {name!r}: dim {d!r} at {p!r} has {sizes[p]} points, but "
                f"{dict(out)[p0]!r} at {p0!r} has {s0}, so it should have {want}")
    return tuple(out)


def _mode(call: str, name: str, padding: Any) -> str | None:
    if padding is None or padding in _MODES:
        return padding
    raise XStencilError(
        f"{call}: grid axis {name!r} has padding={padding!r}, which xstencil does not support "
        f"(supported: {_MODES!r}); pass boundary={{{name!r}: ...}} to choose one")


def _mapping_axis(call: str, ds: xr.Dataset, name: Any, spec: Any) -> GridAxis:
    if not isinstance(name, str) or not isinstance(spec, Mapping):
        raise XStencilError(
            f"{call}: grid={{{name!r}: {spec!r:.60}}}: expected axis names mapped to "
            f"{{position: dim}}, such as {{'X': {{'center': 'x_c', 'left': 'x_g'}}}}")
    return GridAxis(name, _check_positions(call, ds, name, spec))


def _xgcm_axis(call: str, ds: xr.Dataset, name: str, ax: Any, grid_ds: Any) -> GridAxis:
    coords = getattr(ax, "coords", None)
    if not isinstance(coords, Mapping):
        raise XStencilError(f"{call}: grid axis {name!r} ({ax!r:.60}) has no coords mapping")
    try:
        padding = ax.padding
    except AttributeError:  # older xgcm: 'boundary'
        padding = getattr(ax, "_boundary", None)
    fill = getattr(ax, "fill_value", None)
    return GridAxis(str(name), _check_positions(call, ds, name, coords,
                                                getattr(grid_ds, "_ds", None)),
                    _mode(call, name, padding), None if fill is None else float(fill))


def _xgcm_metrics(call: str, ds: xr.Dataset, grid: Any) -> tuple[tuple[frozenset[str], str], ...]:
    out = []
    for axes, values in (getattr(grid, "_metrics", None) or {}).items():
        for v in values:
            name = getattr(v, "name", None)
            if name is not None:
                out.append((frozenset(axes), str(name)))
    return tuple(out)


def _comodo(call: str, ds: xr.Dataset) -> tuple[GridAxis, ...]:
    found: dict[str, dict[str, str]] = {}
    for d in ds.dims:
        if d not in ds.coords:
            continue
        attrs = ds[d].attrs
        if "axis" not in attrs:
            continue
        shift = attrs.get("c_grid_axis_shift")
        found.setdefault(str(attrs["axis"]), {})
        found[str(attrs["axis"])][str(d)] = "" if shift is None else str(float(shift))
    if not found:
        raise XStencilError(
            f"{call}: no grid given and no dim coordinate has an 'axis' attribute (COMODO); "
            f"pass grid=xgcm.Grid(...) or grid={{'X': {{'center': 'x_c', 'left': 'x_g'}}}}")
    axes = []
    for name, dims in found.items():
        centres = [d for d, s in dims.items() if s == ""]
        if len(centres) != 1:
            raise XStencilError(
                f"{call}: axis {name!r} needs exactly one dim without 'c_grid_axis_shift' (the "
                f"centre), got {centres!r}; set c_grid_axis_shift=-0.5 or 0.5 on the others")
        n = ds.sizes[centres[0]]
        pos = {"center": centres[0]}
        for d, s in dims.items():
            if s == "":
                continue
            if ds.sizes[d] == n + 1:
                p = "outer"
            elif ds.sizes[d] == n - 1:
                p = "inner"
            elif s in ("-0.5", "0.5"):
                p = "left" if s == "-0.5" else "right"
            else:
                raise XStencilError(
                    f"{call}: dim {d!r} of axis {name!r} has c_grid_axis_shift={s!r}; "
                    f"expected -0.5 (left) or 0.5 (right)")
            if p in pos:
                raise XStencilError(f"{call}: axis {name!r} has two {p!r} dims "
                                    f"({pos[p]!r}, {d!r})")
            pos[p] = d
        axes.append(GridAxis(name, _check_positions(call, ds, name, pos)))
    return tuple(axes)

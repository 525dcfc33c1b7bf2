"""Staggered calls (``map``/``mesh``/``scan`` with ``grid=``/``at=``) as plain ones.

The translation:

1. parse the grid into per-axis ``{position: dim}`` tables (:mod:`.grid`);
2. find each variable's position per axis, and the output's (``at``, or the
   one position all inputs share);
3. rename every variable's grid dims onto one *index dim* per axis (the
   output's dim, so results come back on the output's dims and coords; for a
   scan whose variables stay at their own positions, the centre dim).  The
   centre, left and right dims of an axis all have ``n`` points, and index
   ``i`` of each is the point of cell ``i`` at that position;
4. hand the kernel :class:`~xstencil._labelled.grid_window.StaggeredSet`
   windows, which turn reads in cells from the output point into integer
   offsets along the index dims;
5. run the plain call with the grid's boundaries keyed by index dim, and
   rename the result back onto the grid's dims.

Coordinates and metrics travel as hidden data variables (``__xs_...``) on the
index dims; they are never returned.  ``outer``/``inner`` dims (``n + 1`` and
``n - 1`` points) are not supported yet and raise.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import xarray as xr

from xstencil._engine.kcache import peek, put
from xstencil._errors import XStencilError
from xstencil._labelled.grid import Grid, parse_grid
from xstencil._labelled.grid_window import Axes
from xstencil._labelled.staggered_hidden import HIDDEN, POS, translate

__all__ = ["Layout", "Spec", "layout", "HIDDEN"]


@dataclass(frozen=True, slots=True)
class Spec:
    """What the kernel wrapper needs to build the staggered windows (hashable).

    Slotted, so the compile cache keys the wrapper that closes over it by its
    value (:func:`~xstencil._engine.kcache.describe`), not by identity: a
    new but equal spec on every call still reuses the compiled code.
    """

    axes: Axes
    variables: tuple[tuple[str, tuple[tuple[str, str], ...]], ...]  # name -> (axis, pos)
    coords: tuple[tuple[str, str, str], ...]  # (axis, pos, hidden name)
    index_vars: tuple[tuple[str, str], ...]  # axis -> hidden index variable
    metrics: tuple[tuple[frozenset[str], str, tuple[tuple[str, str], ...]], ...]
    single: str | None  # a DataArray's variable: the kernel gets its window


@dataclass
class Layout:
    """A staggered call, translated."""

    call: str
    grid: Grid
    obj: xr.DataArray | xr.Dataset
    ds: xr.Dataset  # the input as a Dataset
    variables: dict[str, xr.Variable]  # translated, on index dims (hidden ones too)
    keep: dict[Any, Any]  # the coordinates that stay (index dims and dims outside the grid)
    positions: dict[str, dict[str, str]]  # variable -> {axis: position}
    index: dict[str, str]  # axis -> index dim
    boundary: dict[str, str]
    fill_value: Any
    period: dict[str, float]  # index dim -> period (plain call)
    spec_base: dict[str, Any]
    single: str | None
    include: frozenset[str] | None = None  # the hidden variables to pass (None: all)

    @property
    def plain(self) -> xr.Dataset:
        """The translated Dataset: every variable on the index dims, with the
        hidden variables the kernel reads (all until that is known)."""
        names = [n for n in self.variables
                 if not n.startswith(HIDDEN) or n == self.single or self.include is None
                 or n in self.include]
        return _dataset({n: self.variables[n] for n in names}, self.keep, self.ds, self.grid)

    def spec(self, at: Mapping[str, str], scan_dim: str | None = None) -> Spec:
        """The window spec for outputs at ``at`` ({axis: position}); a scan
        along ``scan_dim`` reads along it without a boundary mode."""
        unset = tuple(d for d in self.spec_base["axes"]["unset"] if d != scan_dim)
        axes = Axes(**{**self.spec_base["axes"], "at": tuple(sorted(at.items())),
                       "unset": unset})
        return Spec(axes, *self.spec_base["rest"], self.single)

    def rename_key(self, key: Any, at: Mapping[str, str] | None = None) -> Any:
        """A mesh selector: axis names become index dims.  A mask's dims
        must be the output's (at ``at``): a mask on the centres of an axis
        whose output is on its faces would select the face with the same
        index, half a cell away (it did, silently)."""
        if isinstance(key, Mapping):
            return {self.index.get(k, k): v for k, v in key.items()}
        if isinstance(key, xr.DataArray):
            where = self.grid.where
            for d in key.dims:
                if at is not None and d in where and where[d][0] in at \
                        and where[d][1] != at[where[d][0]]:
                    a, p = where[d]
                    want = next((dd for dd, (aa, pp) in where.items()
                                 if aa == a and pp == at[a]), None)
                    raise XStencilError(
                        f"{self.call}: a mask with dim {d!r} (the {p!r} points of axis {a!r}) "
                        f"selects cells of an output at {at[a]!r} along {a!r}; give the mask "
                        f"the output's dims ({want!r}), e.g. interpolate it there first, or "
                        f"build the mesh with at={{{a!r}: {p!r}}}")
            return key.rename({d: self.index[where[d][0]] for d in key.dims
                               if d in where and where[d][0] in self.index})
        return key


def _positions(call: str, ds: xr.Dataset, g: Grid) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for n in ds.data_vars:
        pos: dict[str, str] = {}
        for d in ds[n].dims:
            if d not in g.where:
                continue
            a, p = g.where[str(d)]
            if a in pos:
                raise XStencilError(
                    f"{call}: variable {n!r} has two dims on grid axis {a!r} "
                    f"({ds[n].dims!r}); a staggered kernel needs one dim per axis")
            if p not in POS:
                raise XStencilError(
                    f"{call}: variable {n!r} is at the {p!r} position of axis {a!r} (dim "
                    f"{d!r}); staggered kernels support center, left and right positions, "
                    f"not outer/inner yet; select n points, e.g. .isel({d}=slice(1, None)) "
                    f"for the right faces, and declare them as 'right'")
            pos[a] = p
        out[str(n)] = pos
    return out


def _resolve_at(call: str, g: Grid, at: Any, positions: Mapping[str, Mapping[str, str]]
                ) -> dict[str, str]:
    used = {a for pos in positions.values() for a in pos}
    out: dict[str, str] = {}
    if at is not None:
        if not isinstance(at, Mapping):
            raise XStencilError(
                f"{call}: at={at!r:.60} must map axis names to positions, such as "
                f"at={{'X': 'left', 'Y': 'center'}}")
        for a, p in at.items():
            if a not in g.names:
                raise XStencilError(f"{call}: at={dict(at)!r}: {a!r} is not a grid axis; the "
                                    f"axes are {g.names!r}")
            dims = g.axis(a).positions
            if p not in dims:  # a dim name instead of a position
                p = next((q for q, d in dims.items() if d == p), p)
            if p not in dims:
                raise XStencilError(
                    f"{call}: at={dict(at)!r}: axis {a!r} has positions {dims!r}, not {p!r}")
            if p not in POS:
                raise XStencilError(f"{call}: at={dict(at)!r}: outputs at {p!r} are not "
                                    f"supported yet; use center, left or right")
            if a not in used:
                raise XStencilError(
                    f"{call}: at={dict(at)!r} places the output on axis {a!r}, which no data "
                    f"variable has, so the output would gain a dim; drop {a!r} from at")
            out[a] = p
    for a in sorted(used - out.keys()):
        seen = {n: pos[a] for n, pos in positions.items() if a in pos}
        if len(set(seen.values())) > 1:
            raise XStencilError(
                f"{call}: the inputs sit at different positions along axis {a!r} ({seen!r}), "
                f"so the output position is ambiguous; pass at={{{a!r}: "
                f"{sorted(set(seen.values()))[0]!r}, ...}}")
        out[a] = next(iter(seen.values()))
    return out


def _boundary(call: str, g: Grid, index: Mapping[str, str], other: tuple[str, ...],
              boundary: Any, fill_value: Any) -> tuple[dict[str, str], Any]:
    if boundary is not None and not isinstance(boundary, str | Mapping):
        raise XStencilError(f"{call}: boundary={boundary!r:.60} must be a mode or a dict "
                            f"keyed by axis name")
    if isinstance(boundary, Mapping):
        for k in boundary:
            if k not in index and k not in other:
                hint = (f"{k!r} is a dim of axis {g.where[k][0]!r}; key it by the axis name"
                        if k in g.where else f"known keys are {tuple(index) + other!r}")
                raise XStencilError(f"{call}: boundary={dict(boundary)!r}: {hint}")
    out: dict[str, str] = {}
    fills = set()
    for a, d in index.items():
        if isinstance(boundary, str):
            mode = boundary
        elif isinstance(boundary, Mapping) and a in boundary:
            mode = boundary[a]
        else:
            mode = g.axis(a).padding
            if mode is None:
                raise XStencilError(
                    f"{call}: grid axis {a!r} has no padding (xgcm's padding=None), so reads "
                    f"past its edges have no value; pass boundary={{{a!r}: 'periodic'}} "
                    f"('fill' or 'extend'), or build the grid with padding=...")
            if mode == "fill":
                fv = g.axis(a).fill_value
                fills.add(0.0 if fv is None else fv)
        if mode == "valid":
            raise XStencilError(
                f"{call}: boundary 'valid' along axis {a!r} would move the output off the "
                f"grid's points; use 'fill', 'extend' or 'periodic'")
        out[d] = mode
    for d in other:
        if isinstance(boundary, str):
            out[d] = boundary
        elif isinstance(boundary, Mapping) and d in boundary:
            out[d] = boundary[d]
    if fill_value is None:
        if len(fills) > 1:
            raise XStencilError(
                f"{call}: the grid's fill values differ between axes ({sorted(fills)!r}); a "
                f"call has one, so pass fill_value=...")
        fill_value = fills.pop() if fills else 0.0
    return out, fill_value


@dataclass
class _Static:
    """The part of a layout that depends only on the structure of the data,
    the grid and the options (cached per kernel, see :func:`layout`)."""

    grid: Grid
    positions: dict[str, dict[str, str]]
    out_at: dict[str, str]
    index: dict[str, str]
    boundary: dict[str, str]
    fill_value: Any
    hidden: dict[str, xr.Variable]
    keep: dict[Any, Any]
    spec_base: dict[str, Any]
    period: dict[str, float]
    coords: dict[Any, xr.Variable]  # the coordinates it was built from
    grid_ref: Any

    def valid(self, ds: xr.Dataset, grid: Any) -> bool:
        if self.grid_ref is not None and self.grid_ref() is not grid:
            return False
        variables = ds.variables
        return all(k in variables and (variables[k] is v or variables[k].identical(v))
                   for k, v in self.coords.items())


def _freeze(x: Any) -> Any:
    if isinstance(x, Mapping):
        return ("<map>",) + tuple((k, _freeze(v)) for k, v in x.items())
    return x


def _exact(v: Any) -> Any:
    """``v`` for a cache key, told apart from equal values of another type or
    sign (``0``, ``0.0``, ``-0.0``, ``False``)."""
    if isinstance(v, np.generic):
        return (type(v), v.tobytes())
    if isinstance(v, float):
        return (type(v), v.hex())
    if isinstance(v, complex):
        return (type(v), v.real.hex(), v.imag.hex())
    return (type(v), v)


def _static_key(call: str, ds: xr.Dataset, grid: Any, at: Any, boundary: Any,
                fill_value: Any, period: Any, own: bool) -> Any:
    g = _freeze(grid) if grid is None or isinstance(grid, str | Mapping) else ("id", id(grid))
    variables = ds.variables
    try:
        key = ("staggered-layout", call, g, _freeze(at), _freeze(boundary), _exact(fill_value),
               _freeze(period), own,
               tuple((n, variables[n].dims, variables[n].dtype.str) for n in ds.data_vars),
               tuple(ds.sizes.items()), tuple(ds.coords))
        hash(key)
    except TypeError:
        return None
    return key


def layout(call: str, obj: xr.DataArray | xr.Dataset, grid: Any, at: Any, boundary: Any,
           fill_value: Any, period: Any, *, own_positions: bool = False,
           cache: bool = False) -> tuple[Layout, dict[str, str]]:
    """Translate ``obj`` for a staggered call; returns the layout and the
    output position (``{}`` when ``own_positions``: each variable stays at
    its own, and the index dims are the centre dims).  ``cache``: keep the
    structural part between calls, in the compile cache (it does not depend
    on the kernel; it is checked against the coordinates and grid on reuse)."""
    single = None
    if isinstance(obj, xr.DataArray):
        single = str(obj.name) if obj.name is not None else f"{HIDDEN}data"
        ds = obj.to_dataset(name=single)
    elif isinstance(obj, xr.Dataset):
        ds = obj
    else:
        raise XStencilError(f"{call}: expected a DataArray or Dataset, got "
                            f"{type(obj).__name__}")
    key = None if not cache else _static_key(call, ds, grid, at, boundary, fill_value,
                                              period, own_positions)
    st = None if key is None else peek(key)
    if st is None or not st.valid(ds, grid):
        st = _static(call, ds, grid, at, boundary, fill_value, period, own_positions)
        if key is not None:
            put(key, st)
    g = st.grid
    variables: dict[str, xr.Variable] = {}
    for n in ds.data_vars:
        v = ds.variables[n]
        dims = tuple(st.index[g.where[str(d)][0]] if str(d) in g.where else d for d in v.dims)
        variables[str(n)] = xr.Variable(dims, v.data, v.attrs, fastpath=True)
    variables.update(st.hidden)
    return Layout(call, g, obj, ds, variables, st.keep, st.positions, st.index, st.boundary,
                  st.fill_value, st.period, st.spec_base, single), st.out_at


def _static(call: str, ds: xr.Dataset, grid: Any, at: Any, boundary: Any, fill_value: Any,
            period: Any, own_positions: bool) -> _Static:
    comodo = grid is None or (isinstance(grid, str) and grid == "comodo")
    g = parse_grid(call, ds, None if comodo else grid)
    positions = _positions(call, ds, g)
    used = sorted({a for pos in positions.values() for a in pos})
    if not used:
        raise XStencilError(
            f"{call}: no data variable has a dim of the grid {sorted(g.where)!r}; the data's "
            f"dims are {tuple(map(str, ds.dims))!r}; check the grid's dim names")
    out_at = {} if own_positions else _resolve_at(call, g, at, positions)
    index = {a: g.axis(a).positions[out_at.get(a, "center")] for a in used}
    # dims outside the grid that data variables have (a coordinate-only dim, such
    # as y_c of a 1-D slice, is not a dim of the plain call: no mode for it)
    held = {str(d) for n in ds.data_vars for d in ds[n].dims}
    other = tuple(str(d) for d in ds.dims if str(d) not in g.where and str(d) in held)
    bmodes, fv = _boundary(call, g, index, other, boundary, fill_value)
    hidden, keep, spec_base, pperiod = translate(call, ds, g, positions, index, bmodes,
                                                 dict(period or {}))
    spec_base["axes"]["unset"] = tuple(d for d in other if d not in bmodes)
    try:
        ref = None if comodo or isinstance(grid, Mapping) else weakref.ref(grid)
    except TypeError:
        ref = lambda: grid  # noqa: E731 - a grid that cannot be referenced weakly
    return _Static(g, positions, out_at, index, bmodes, fv, hidden, keep, spec_base, pperiod,
                   dict(ds.coords.variables), ref)


def _dataset(variables: dict[str, xr.Variable], keep: Mapping[Any, Any], ds: xr.Dataset,
             g: Grid) -> xr.Dataset:
    """``xr.Dataset(variables, coords=keep, attrs=ds.attrs)``, built directly
    (a few microseconds instead of xarray's merge) when the sizes agree."""
    coords = {k: getattr(v, "variable", v) for k, v in keep.items()}
    sizes: dict[Any, int] = {}
    ok = True
    for v in (*variables.values(), *coords.values()):
        for d, n in zip(v.dims, v.shape, strict=True):
            ok = ok and sizes.setdefault(d, n) == n
    indexes = {}
    for k in coords:
        src = ds if k in ds.coords else g.source
        if src is not None and k in src.xindexes:
            indexes[k] = src.xindexes[k]
    if ok and all(k in indexes for k in coords if coords[k].dims == (k,)):
        try:
            return xr.Dataset._construct_direct({**variables, **coords}, set(coords),
                                                attrs=dict(ds.attrs), indexes=indexes)
        except (AttributeError, TypeError):  # xarray internals moved: the public way
            pass
    return xr.Dataset(variables, coords=keep, attrs=ds.attrs)

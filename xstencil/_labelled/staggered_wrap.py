"""The kernel side of a staggered call (:mod:`xstencil._labelled.staggered`):
the plain kernel that hands the user's kernel staggered windows, and the
result renamed back onto the grid's dims."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import xarray as xr

from xstencil._errors import XStencilError
from xstencil._labelled.grid import OFFSET, Grid
from xstencil._labelled.grid_window import Axes, StaggeredSet, StaggeredWindow
from xstencil._labelled.staggered import HIDDEN, Layout, Spec
from xstencil._labelled.staggered_hidden import EDGE

__all__ = ["windows", "wrap", "wrap_each", "recording", "restore"]


# -- the kernel's argument ---------------------------------------------------------------

class _Lazy:
    """A hidden variable's window, looked up when first read (and recorded in
    ``used``), so that calls pass only the hidden variables a kernel reads."""

    __slots__ = ("_s", "_name", "_used")

    def __init__(self, s: Any, name: str, used: set[str]):
        self._s, self._name, self._used = s, name, used

    def __call__(self, /, **offsets: Any) -> Any:
        self._used.add(self._name)
        if self._name not in self._s:
            raise XStencilError(
                f"the kernel reads {self._name[len(HIDDEN):]!r} (a coordinate or metric) that "
                f"it did not read on its first call with these inputs; kernels on a grid must "
                f"read the same coordinates and metrics on every call (define a new kernel)")
        return self._s[self._name](**offsets)


def windows(s: Any, spec: Spec, used: set[str] | None = None) -> Any:
    """The staggered windows for the plain WindowSet ``s``; the hidden
    variables the kernel reads are added to ``used``."""
    used = set() if used is None else used
    at = dict(spec.axes.at)
    iv = {a: _Lazy(s, n, used) for a, n in spec.index_vars}
    periodic = dict(spec.axes.period)
    cw: dict[tuple[str, str], Any] = {
        (a, p): (_Lazy(s, n, used), iv.get(a),
                 None if a in periodic else tuple(_Lazy(s, n + e, used) for e in EDGE))
        for a, p, n in spec.coords}

    def coords_of(pos: Mapping[str, str]) -> dict[str, tuple[Any, Any, Any]]:
        return {a: cw[(a, p)] for a, p in pos.items() if (a, p) in cw}

    def deltas(pos: Mapping[str, str]) -> dict[str, tuple[str, float]]:
        return {a: (p, OFFSET[at[a]] - OFFSET[p]) for a, p in pos.items() if a in at}

    wins = {}
    for n, pos in spec.variables:
        if n.startswith(HIDDEN) and n != spec.single:
            continue
        label = "u" if spec.single is not None else f"s[{n!r}]"
        wins[n] = StaggeredWindow(s[n], deltas(dict(pos)), spec.axes, coords_of(dict(pos)),
                                  label)
    metrics: dict[frozenset[str], list[StaggeredWindow]] = {}
    for axes, name, pos in spec.metrics:
        metrics.setdefault(axes, []).append(
            StaggeredWindow(_Lazy(s, name, used), deltas(dict(pos)), spec.axes,  # type: ignore[arg-type]
                            label=f"metric {name[len(HIDDEN):]}"))
    here = {a: cw[(a, p)] for a, p in at.items() if (a, p) in cw}
    coords = {a: _at_coord(here[a], a, spec.axes) for a in here}
    ss = StaggeredSet(wins, metrics, coords)
    if spec.single is not None:
        return ss[spec.single]
    return ss


def _at_coord(cwiw: tuple[Any, Any, Any], a: str, axes: Axes) -> Any:
    w = StaggeredWindow(cwiw[0], {a: (dict(axes.at)[a], 0.0)}, axes, {a: cwiw}, label="s")
    return w.coord(a)


def wrap(kernel: Callable[..., Any], spec: Spec) -> Callable[..., Any]:
    """The plain kernel for a staggered ``kernel``.

    A new function on every call, closing over only ``kernel`` and the
    hashable ``spec``: the compile cache's :func:`~xstencil._engine.kcache.describe`
    walks it into ``kernel`` (its code, closures, globals), so repeated calls
    with kernels of the same structure share the compiled code, and a changed
    value the kernel reads compiles again.  Nothing mutable is closed over
    (what a trace finds out is recorded by :func:`recording` instead).
    """

    def staggered(s: Any, *args: Any, **kwargs: Any) -> Any:
        return kernel(windows(s, spec), *args, **kwargs)

    staggered.__name__ = getattr(kernel, "__name__", "kernel")
    staggered.__qualname__ = getattr(kernel, "__qualname__", staggered.__name__)
    return staggered


def wrap_each(kernels: Mapping[str, Callable[..., Any]], specs: Mapping[str, Spec]
              ) -> Callable[..., Any]:
    """One plain kernel returning ``{name: kernels[name](windows at name's
    position)}`` (closing over the kernels and specs only, as :func:`wrap`)."""
    items = tuple((n, kernels[n], specs[n]) for n in kernels)

    def staggered(s: Any, *args: Any, **kwargs: Any) -> Any:
        return {n: k(windows(s, sp), *args, **kwargs) for n, k, sp in items}

    return staggered


def recording(kernels: Mapping[str | None, Callable[..., Any]],
              specs: Mapping[str | None, Spec], used: set[str],
              names: list[tuple[str, ...]]) -> Callable[..., Any]:
    """For a probe trace only (never cached: it closes over the record): the
    plain kernel of :func:`wrap` (``kernels`` keyed by ``None``) or of
    :func:`wrap_each`, adding the hidden variables read to ``used`` and the
    names of a dict result (one kernel) to ``names``."""
    items = tuple((n, kernels[n], specs[n]) for n in kernels)

    def staggered(s: Any, *args: Any, **kwargs: Any) -> Any:
        if items[0][0] is None:
            _, k, sp = items[0]
            out = k(windows(s, sp, used), *args, **kwargs)
            if isinstance(out, Mapping):
                names.append(tuple(out))
            return out
        return {n: k(windows(s, sp, used), *args, **kwargs) for n, k, sp in items}

    staggered.__name__ = getattr(items[0][1], "__name__", "kernel")
    staggered.__qualname__ = getattr(items[0][1], "__qualname__", staggered.__name__)
    return staggered


# -- results ------------------------------------------------------------------------------

def restore(lay: Layout, res: Any, targets: Mapping[str, Mapping[str, str]],
            at: Mapping[str, str] | None = None) -> Any:
    """The plain call's result on the grid's dims: each variable renamed back
    to its position (``targets`` for outputs, its own for the rest; ``at``
    for a DataArray result)."""
    g = lay.grid
    back = {d: a for a, d in lay.index.items()}
    if isinstance(res, xr.DataArray):
        res = _rename_back(_full(res, lay, at or {}), back, at or {}, g)
        if lay.single is not None:
            res.name = lay.obj.name
            res.attrs = dict(lay.obj.attrs)
        return _with_coords(res, lay)
    variables = {}
    for n in res.data_vars:
        if str(n).startswith(HIDDEN) and n != lay.single:
            continue
        pos = targets.get(str(n), lay.positions.get(str(n), {}))
        da = res[n].reset_coords(drop=True)
        if str(n) in targets and str(n) not in lay.positions:  # a new result
            da = _full(da, lay, pos)
        variables[n] = _rename_back(da, back, pos, g)
    other = {k: v for k, v in res.coords.items() if not set(map(str, v.dims)) & set(back)}
    out = xr.Dataset(variables, coords=other, attrs=res.attrs)
    out = _with_coords(out, lay)
    if lay.single is not None:
        return out[lay.single].rename(lay.obj.name)
    return out


def _full(da: xr.DataArray, lay: Layout, at: Mapping[str, str]) -> xr.DataArray:
    """A new result on all the index dims of the axes in ``at`` (still named
    as index dims): constant along those it did not read.

    The Dataset rule gives each result only the dims it read (a kernel that
    reads only ``s.coord("X")`` gets ``x`` alone); on a grid, a result is
    placed on the output's full dims for ``at`` (docs/staggered.rst)."""
    need = [lay.index[a] for a in at if a in lay.index]
    missing = [d for d in need if d not in da.dims]
    if not missing:
        return da
    want = set(da.dims) | set(need)
    grid_dims = set(lay.index.values())
    inputs = [v.dims for n, v in lay.variables.items() if not n.startswith(HIDDEN)
              or n == lay.single]
    ref = next((dims for dims in inputs if want <= set(dims)), None)
    order = [d for d in (ref if ref is not None else dict.fromkeys(
        d for dims in inputs for d in dims)) if d in want and d in grid_dims]
    order += [d for d in need if d not in order]
    size = dict(lay.spec_base["axes"]["size"])
    back = {d: a for a, d in lay.index.items()}
    out = da.expand_dims({d: size[back[d]] for d in missing})
    first = next((k for k, d in enumerate(da.dims) if d in grid_dims), len(da.dims))
    lead = list(da.dims[:first])  # e.g. a scan's dim before the grid's,
    trail = [d for d in da.dims[first:] if d not in grid_dims]  # output_dims after them
    out = out.transpose(*lead, *order, *trail)
    if isinstance(out.data, np.ndarray):  # not a read-only broadcast view
        out = out.copy(data=np.array(out.data))
    return out


def _rename_back(da: xr.DataArray, back: Mapping[str, str], at: Mapping[str, str],
                 g: Grid) -> xr.DataArray:
    ren = {}
    for d in da.dims:
        if d in back:
            a = back[str(d)]
            target = g.axis(a).positions[at.get(a, g.where[str(d)][1])]
            if target != d:
                ren[d] = target
    drop = [k for k, v in da.coords.items() if set(map(str, v.dims)) & set(ren)]
    return da.drop_vars(drop).rename(ren) if ren else da


def _with_coords(obj: Any, lay: Layout) -> Any:
    # bare variables: a DataArray from .coords carries the Dataset's scalar coords
    # along, and a scalar one named like a dim of the result (the label of a grown
    # scan's initial position, ``time``) made assign_coords raise
    dims = set(map(str, obj.dims))
    grid_dims = set(lay.grid.where)
    add = {k: v.variable for k, v in lay.ds.coords.items()
           if set(map(str, v.dims)) <= dims and set(map(str, v.dims)) & grid_dims
           and k not in obj.coords}
    src = lay.grid.source
    if src is not None:  # dims only the grid's Dataset has coordinates for
        add.update({k: v.variable for k, v in src.coords.items() if v.dims == (k,)
                    and str(k) in dims and str(k) not in set(map(str, lay.ds.dims))
                    and k not in obj.coords})
    return obj.assign_coords(add) if add else obj

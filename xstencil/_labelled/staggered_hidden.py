"""The hidden variables of a staggered call: coordinates, metrics and
periodic indices travel as data variables named ``__xs_...`` (:data:`HIDDEN`)
on the index dims (:func:`translate`); they are never returned."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import xarray as xr

from xstencil._backends.jobs import HIDDEN
from xstencil._engine.coords import coord_values, numeric_coord, read_coord
from xstencil._labelled.grid import Grid
from xstencil._labelled.grid_window import UNSORTED

__all__ = ["EDGE", "HIDDEN", "POS", "translate"]

POS = ("center", "left", "right")


def _hidden_dtype(ds: xr.Dataset) -> Any:
    floats = [ds[n].dtype for n in ds.data_vars if ds[n].dtype.kind in "fc"]
    dt = np.result_type(*floats) if floats else np.dtype(np.float64)
    return np.float64 if dt.kind == "c" and dt.itemsize == 16 else \
        np.float32 if dt.kind == "c" else dt


def translate(call: str, ds: xr.Dataset, g: Grid, positions: Mapping[str, Mapping[str, str]],
              index: Mapping[str, str], bmodes: Mapping[str, str], uperiod: Mapping[str, Any]
              ) -> tuple[xr.Dataset, dict[str, Any], dict[str, float]]:
    hdt = _hidden_dtype(ds)
    variables: dict[str, xr.Variable] = {}  # the hidden ones
    coords, index_vars, periods, sizes = [], [], [], []
    pperiod: dict[str, float] = {}
    for a, idim in index.items():
        ax = g.axis(a)
        n = next(ds.sizes[d] for p, d in ax.dims if d in ds.dims and p in POS)
        sizes.append((a, n))
        for p, d in ax.dims:
            cv = _coord(ds, g, d)
            if p not in POS or cv is None or cv.dims != (d,):
                continue
            c = read_coord(call, d, coord_values(cv))
            if c is None:
                continue
            name = f"{HIDDEN}c_{d}"
            variables[name] = xr.Variable((idim,), c.astype(hdt))
            coords.append((a, p, name))
            if bmodes.get(idim) != "periodic":  # past an edge: extended linearly
                variables.update(_edge_lines(name, idim, c, hdt))
        # the hidden index: the cell a read lands on (a wrap, or past an edge)
        name = f"{HIDDEN}i_{a}"
        variables[name] = xr.Variable((idim,), np.arange(n, dtype=hdt))
        index_vars.append((a, name))
        if bmodes.get(idim) == "periodic":
            periods.append((a, _period(a, ax.positions, ds, g, uperiod)))
            cv = _coord(ds, g, idim)
            if cv is not None and cv.dims == (idim,):
                c = numeric_coord(call, idim, coord_values(cv))
                if c is not None and n > 1:  # the plain call's own (unused) coord window
                    pperiod[idim] = float(uperiod.get(a, uperiod.get(idim, 0.0))) or \
                        float(abs(c[-1] - c[0]) * n / (n - 1)) or 1.0
    metrics = []
    for k, (axes, mname) in enumerate(g.metrics):
        m = _coord(ds, g, mname)
        if m is None or any(m.sizes[d] != n for d, n in ds.sizes.items() if d in m.dims):
            continue
        mpos: dict[str, str] = {}
        for d in m.dims:
            if str(d) not in g.where or g.where[str(d)][0] not in index:
                break
            mpos[g.where[str(d)][0]] = g.where[str(d)][1]
        else:
            if all(p in POS for p in mpos.values()):
                name = f"{HIDDEN}m{k}_{mname}"
                variables[name] = xr.Variable(tuple(index[g.where[str(d)][0]] for d in m.dims),
                                              np.asarray(m.values, hdt))
                metrics.append((axes, name, tuple(sorted(mpos.items()))))
    idims = set(index.values())
    other = {str(d) for d in ds.dims if str(d) not in g.where}
    keep = {k: v for k, v in ds.coords.items()
            if {str(d) for d in v.dims} <= idims | other}
    for d in idims - set(map(str, ds.dims)):  # an output dim only the grid's Dataset has
        cv = _coord(ds, g, d)
        if cv is not None and cv.dims == (d,):
            keep[d] = cv
    spec_base = {
        "axes": dict(index=tuple(sorted(index.items())),
                     dims=tuple(sorted((d, a) for d, (a, _) in g.where.items())),
                     period=tuple(periods), size=tuple(sizes)),
        "rest": (tuple((n, tuple(sorted(p.items()))) for n, p in positions.items()),
                 tuple(coords), tuple(index_vars), tuple(metrics)),
    }
    return variables, keep, spec_base, pperiod


#: The suffixes of a coordinate's edge lines (:func:`_edge_lines`).
EDGE = ("_lo0", "_lod", "_hi0", "_hid")


def _edge_lines(name: str, idim: str, c: np.ndarray, dtype: Any) -> dict[str, xr.Variable]:
    """The first value and spacing at each end of coordinate ``c``, as
    constant hidden variables read at the output point (always inside the
    field), so that a read past a ``fill`` or ``extend`` edge continues the
    coordinate linearly, as a plain map's ``u.coord`` does
    (:func:`~xstencil._engine.coords.pad_coord`), not padded like data
    (the fill value, or the edge value repeated)."""
    n = len(c)
    d_lo = c[1] - c[0] if n > 1 else np.nan  # one position: no spacing
    d_hi = c[-1] - c[-2] if n > 1 else np.nan
    return {name + sfx: xr.Variable((idim,), np.full(n, v, dtype))
            for sfx, v in zip(EDGE, (c[0], d_lo, c[-1], d_hi), strict=True)}


def _coord(ds: xr.Dataset, g: Grid, name: str) -> xr.Variable | None:
    """Variable ``name`` of ``ds``, else of the grid's own Dataset."""
    for src in (ds, g.source):
        if src is not None and name in src.variables:
            return src.variables[name]
    return None


def _period(a: str, dims: Mapping[str, str], ds: xr.Dataset, g: Grid,
            uperiod: Mapping[str, Any]) -> float | None:
    """Axis ``a``'s period, signed as its centre coordinate runs (negative for
    descending labels); :data:`UNSORTED` where that coordinate rises and
    falls (a rolled longitude), which a coordinate read refuses."""
    cv = _coord(ds, g, dims["center"])
    x = None if cv is None or cv.ndim != 1 or cv.dtype.kind not in "iuf" or cv.size < 2 \
        else np.asarray(cv.values, np.float64)
    d = None if x is None else np.diff(x)
    if d is not None and (d > 0).any() and (d < 0).any():
        return UNSORTED
    if a in uperiod:
        return float(uperiod[a]) * (-1.0 if x is not None and x[-1] < x[0] else 1.0)
    if x is None or d is None:
        return None
    if not np.allclose(d, d[0], rtol=1e-6, atol=0):
        return None
    return float(len(x) * d[0])

"""A function mesh's regions: what ``m[...]``, ``m.loc[...]`` and ``m[mask]``
select, resolved into positions when they are assigned, and the engine's
regions over the output positions of a plan.

A region is ``None`` (everywhere), ``{dim: positions}`` (a rectangular
selection; positions are sorted input positions along ``dim``) or a boolean
array of the data's field shape (a mask, copied when assigned).
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from xstencil._engine.mesh import Slab
from xstencil._errors import LabelError, XStencilError
from xstencil._labelled.core import Fields
from xstencil._labelled.mesh_checks import align_mask
from xstencil._labelled.plan import Plan

__all__ = ["nearest", "bad_key", "by_position", "by_label", "by_mask", "engine_regions",
           "region_dims", "region_key"]

Region = dict[str, np.ndarray] | np.ndarray | None


@dataclass(frozen=True)
class nearest:  # noqa: N801 - reads as a function at the call site
    """Select the nearest labels in ``m.loc[...]`` (``.sel(method="nearest")``).

    Parameters
    ----------
    indexers
        ``{dim: label}``, or the same as keyword arguments.

    Examples
    --------
    >>> import numpy as np, xarray as xr, xstencil
    >>> da = xr.DataArray(np.zeros(4), dims="x", coords={"x": [0.0, 0.25, 0.5, 0.75]})
    >>> m = da.stencil.mesh()
    >>> m.loc[xstencil.nearest(x=0.3)] = lambda u: u() + 1  # snaps to x=0.25
    >>> m.map().values
    array([0., 1., 0., 0.])
    """

    indexers: Mapping[str, Any]

    def __init__(self, indexers: Mapping[str, Any] | None = None, /, **kw: Any):
        object.__setattr__(self, "indexers", {**(indexers or {}), **kw})


def _check_dims(call: str, f: Fields, key: Mapping[str, Any], loc: bool) -> None:
    """Every dim of ``key`` (of ``m[key]``, or ``m.loc[key]``) is the data's."""
    for d in key:
        if d not in f.dims:
            how = f"m{'.loc' if loc else ''}[{dict(key)!r}]"
            raise XStencilError(
                f"{call}: {how}: dimension {d!r} not found; available dims are {f.dims!r}"
            )


def _int_positions(sel: Any, n: int) -> np.ndarray | None:
    """``np.atleast_1d(np.arange(n)[sel])`` for an int in range or a slice of
    ints (or ``None``s) with a nonzero step, without the general checks: a
    mesh rebuilt before every call of a solve (one row or slice per region)
    paid them per region; ``None`` for anything else (the general path)."""
    t = type(sel)
    if t is int:
        return np.arange(sel % n, sel % n + 1) if -n <= sel < n else None  # (n > 0 there)
    if t is slice and sel.step != 0 and all(
            type(v) is int or v is None for v in (sel.start, sel.stop, sel.step)):
        return np.arange(*sel.indices(n))
    return None


def float_positions(sel: Any) -> bool:
    """Whether a position selector holds floats (labels belong in ``.loc``);
    selectors numpy cannot read as one array are left to the position check."""
    try:
        a = np.asarray(sel)
    except (TypeError, ValueError):
        return False
    return bool(a.size) and a.dtype.kind in "fc"


def by_position(call: str, f: Fields, key: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """``m[{dim: positions}]``: ``.isel`` semantics."""
    _check_dims(call, f, key, loc=False)
    out = {}
    for d, sel in key.items():
        n = f.shape[f.dims.index(d)]
        quick = _int_positions(sel, n)
        if quick is not None:  # an int or a slice of ints: what np.arange(n)[sel] gives
            out[d] = quick
            continue
        if not isinstance(sel, slice) and float_positions(sel):
            raise XStencilError(
                f"{call}: m[{{{d!r}: {sel!r:.60}}}]: positions are ints (.isel semantics), got a "
                f"float; select coordinate labels with m.loc[{{{d!r}: {sel!r:.60}}}]"
            )
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                got = np.atleast_1d(np.arange(n)[sel])
        except IndexError:
            raise XStencilError(
                f"{call}: m[{{{d!r}: {sel!r}}}]: position {sel!r} is out of range for dim "
                f"{d!r} of length {n}"
            ) from None
        except (TypeError, ValueError, OverflowError, Warning):
            got = None
        if got is None or got.dtype.kind not in "iu" or got.ndim != 1:
            raise XStencilError(
                f"{call}: m[{{{d!r}: {sel!r:.60}}}]: select positions with an int, a slice of "
                f"ints or a list of ints (.isel semantics); use m.loc[...] for coordinate labels"
            )
        out[d] = got
    return out


def _number(v: Any) -> bool:
    return (type(v) in (int, float) or isinstance(v, np.integer | np.floating)) \
        and not isinstance(v, bool | np.bool_)


def _quick(index: pd.Index, sel: Any) -> np.ndarray | None:
    """The positions ``.sel`` gives for a numeric label or label slice on a
    unique numeric index, straight from pandas (what xarray calls) without
    building a DataArray; ``None`` for anything else (the full ``.sel``)."""
    if index.dtype.kind not in "iuf" or not index.is_unique:
        return None
    try:
        if isinstance(sel, slice):
            if sel.step is not None or not all(v is None or _number(v)
                                               for v in (sel.start, sel.stop)):
                return None
            s = index.slice_indexer(sel.start, sel.stop)
            return np.arange(len(index))[s]
        if _number(sel):
            p = index.get_loc(sel)
            return np.array([p]) if isinstance(p, int | np.integer) else None
    except (KeyError, TypeError, ValueError, pd.errors.InvalidIndexError):
        return None
    return None


def _levels(call: str, key: Mapping[Any, Any], indexes: Mapping[Any, pd.Index],
            dims: Sequence[str], method: Any) -> tuple[dict[Any, Any], dict[str, np.ndarray]]:
    """``key`` without the levels of MultiIndex dims (``m.loc[{"a": 1}]`` for a
    dim ``z`` indexed by levels ``a`` and ``b``), and the positions those
    select, by xarray's own ``.sel`` (as ``md.sel(a=1)`` selects)."""
    rest, by_dim = {}, {}
    for k, sel in key.items():
        owner = next((d for d in dims if isinstance(indexes.get(d), pd.MultiIndex)
                      and k not in dims and k in indexes[d].names), None)
        if owner is None:
            rest[k] = sel
        else:
            by_dim.setdefault(owner, {})[k] = sel
    out = {}
    for d, levels in by_dim.items():
        if d in rest or method is not None:
            raise XStencilError(
                f"{call}: m.loc[{dict(key)!r:.80}]: select {d!r} either by its levels "
                f"{list(levels)!r} or by whole labels, not both, and without nearest")
        pos = xr.DataArray(np.arange(len(indexes[d])), dims=d,
                           coords=xr.Coordinates.from_pandas_multiindex(indexes[d], d))
        try:
            out[d] = np.atleast_1d(np.asarray(pos.sel(levels).values))
        except KeyError:
            raise LabelError(
                f"{call}: m.loc[{levels!r:.80}]: no label of {d!r} has those level values; "
                f"its levels are {list(indexes[d].names)!r}") from None
    return rest, out


def bad_key(call: str, f: Fields, key: Any, loc: bool = False) -> XStencilError:
    """The error for a mesh key of no known kind.  An array is named by its
    type and shape, not its repr (many lines for a mask), and a boolean
    array of the data's shape is answered with the DataArray to wrap it in."""
    is_array = hasattr(key, "shape") and hasattr(key, "dtype")
    shown = "key" if is_array else " ".join(repr(key).split())[:60]
    sel = f"m.loc[{shown}]" if loc else f"m[{shown}] = ..."
    what = "a dict of labels such as {'x': 0.0} or {'x': slice(1.5, None)}" if loc else \
        "'...' (everywhere), a dict of positions such as {'x': 0}, a boolean DataArray, " \
        "or m.loc[{...}] for labels"
    if not is_array:
        return XStencilError(f"{call}: {sel}: select with {what}")
    dims = tuple(f.dims)
    kind = "a numpy array" if isinstance(key, np.ndarray) \
        else f"an array of type {type(key).__name__}"
    key_is = f"key is {kind} of shape {tuple(key.shape)!r} and dtype {key.dtype}"
    if np.dtype(key.dtype) != np.bool_:
        return XStencilError(f"{call}: {sel}: {key_is}; select with {what}")
    fit = f"with dims {dims!r}" if tuple(key.shape) == tuple(f.shape) \
        else "with the dims it spans"
    return XStencilError(
        f"{call}: {sel}: {key_is}; masks select by dim name, so wrap it in a DataArray "
        f"{fit}: m[xr.DataArray(mask, dims={dims!r})] = ...")


def by_label(call: str, obj: xr.DataArray | xr.Dataset, f: Fields, key: Any,
             indexes: Mapping[Any, pd.Index] | None = None) -> dict[str, np.ndarray]:
    """``m.loc[{dim: labels}]``: ``.sel`` semantics (``nearest`` snaps);
    ``indexes``: the data's pandas indexes, if already at hand."""
    indexes = obj.indexes if indexes is None else indexes
    method = None
    if isinstance(key, nearest):
        key, method = key.indexers, "nearest"
    if not isinstance(key, Mapping):
        raise bad_key(call, f, key, loc=True)
    key, out = _levels(call, key, indexes, f.dims, method)
    _check_dims(call, f, key, loc=True)
    for d, sel in key.items():
        if d not in indexes:
            raise XStencilError(
                f"{call}: m.loc[{{{d!r}: ...}}]: dim {d!r} has no index coordinate to select "
                f"labels from; assign one (obj.assign_coords({d}=...)) or select by position "
                f"with m[{{{d!r}: ...}}]"
            )
        index = indexes[d]
        if method is None and (quick := _quick(index, sel)) is not None:
            out[d] = quick
            continue
        if method is not None and not index.is_unique:
            dup = index[index.duplicated()].unique()[:3].tolist()
            raise XStencilError(
                f"{call}: m.loc[xstencil.nearest({d}={sel!r:.60})]: coordinate {d!r} has "
                f"duplicated labels {dup!r}, so the nearest label is ambiguous; select by "
                f"position with m[{{{d!r}: ...}}] or drop the duplicates first")
        pos = xr.DataArray(np.arange(len(index)), dims=d, coords={d: index})
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                got = pos.sel({d: sel}, method=method) if method else pos.sel({d: sel})
                values = np.atleast_1d(np.asarray(got.values))
        except (TypeError, ValueError, IndexError, OverflowError, Warning,
                NotImplementedError):
            raise XStencilError(
                f"{call}: m.loc[{{{d!r}: {sel!r:.60}}}]: cannot select labels of coordinate "
                f"{d!r} (dtype {np.asarray(index).dtype}) with {sel!r:.60}; use a label, a list "
                f"of labels or a slice of labels (.sel semantics)"
            ) from None
        except KeyError:
            vals = np.asarray(index)
            probe = np.asarray(sel)
            if probe.ndim == 0 and probe.dtype.kind in "iuf" and vals.dtype.kind in "iuf":
                near = vals[np.argsort(np.abs(vals - probe.astype(float)))[:3]]
            else:
                near = vals[:3]
            raise LabelError(
                f"{call}: m.loc[{{{d!r}: {sel!r}}}]: label {sel!r} not found in coordinate "
                f"{d!r}; nearest available are {near.tolist()!r} (use "
                f"xstencil.nearest({d}={sel!r}) to snap to the nearest)"
            ) from None
        if values.dtype.kind not in "iu" or values.ndim != 1:
            raise XStencilError(
                f"{call}: m.loc[{{{d!r}: {sel!r:.60}}}]: the selection is not a set of "
                f"positions along {d!r}; use a label, a list of labels or a slice"
            )
        out[d] = values
    return out


def by_mask(call: str, obj: xr.DataArray | xr.Dataset, f: Fields,
            mask: xr.DataArray) -> np.ndarray:
    """``m[mask]``: a boolean DataArray, aligned by label and broadcast to
    the data's field shape; a copy, so the region is fixed when assigned."""
    if mask.dtype != bool:
        raise XStencilError(
            f"{call}: m[mask] = ...: the mask has dtype {mask.dtype}; use a boolean DataArray, "
            f"e.g. m[da > 0] = f"
        )
    extra = [d for d in mask.dims if d not in f.dims]
    if extra:
        raise XStencilError(
            f"{call}: m[mask] = ...: the mask has dims {tuple(mask.dims)!r}, and {extra!r} are "
            f"not dims of the data {f.dims!r}"
        )
    sizes = dict(zip(f.dims, f.shape, strict=True))
    for d in mask.dims:
        if mask.sizes[d] != sizes[d]:
            raise XStencilError(
                f"{call}: m[mask] = ...: the mask has length {mask.sizes[d]} along {d!r} but "
                f"the data has {sizes[d]}"
            )
    mask = align_mask(call, obj, mask)
    full = mask.transpose(*[d for d in f.dims if d in mask.dims])
    arr = np.array(full.values, dtype=bool)  # a copy: later changes to the mask are not seen
    arr = arr.reshape([sizes[d] if d in mask.dims else 1 for d in f.dims])
    return np.broadcast_to(arr, f.shape)


def region_key(region: Region) -> Hashable:
    """A hashable key equal for equal regions (masks by a digest of their cells)."""
    if region is None:
        return None
    if isinstance(region, np.ndarray):
        # a boolean mask: its cells packed 8 to a byte (a broadcast view too), then digested
        bits = np.packbits(np.asarray(region, dtype=bool), axis=None)
        return ("mask", region.shape, hashlib.blake2b(bits.tobytes(), digest_size=20).digest())
    return tuple((d, a.dtype.str, a.tobytes()) for d, a in region.items())


def region_dims(f: Fields, regions: list[tuple[Region, Any]]) -> tuple[str, ...]:
    """Dims along which the regions vary: results change along them.  A
    region that selects no cells (``{"x": []}``) varies along nothing: its
    kernel never runs."""
    out: set[str] = set()
    sizes = dict(zip(f.dims, f.shape, strict=True))
    for region, _ in regions:
        if isinstance(region, Mapping):
            if any(len(pos) == 0 for pos in region.values()):
                continue
            out |= {d for d, pos in region.items() if len(np.unique(pos)) != sizes[d]}
        elif isinstance(region, np.ndarray):
            if not region.any():
                continue
            out |= {d for a, d in enumerate(f.dims)
                    if not (region == region.take([0], axis=a)).all()}
    return tuple(d for d in f.dims if d in out)


def _as_range(hit: np.ndarray) -> tuple[int, int, int] | None:
    if hit.size == 0:
        return (0, 0, 1)
    if hit.size == 1:
        return (int(hit[0]), int(hit[0]) + 1, 1)
    d = np.diff(hit)
    if np.all(d == d[0]) and d[0] > 0:
        return (int(hit[0]), int(hit[-1]) + 1, int(d[0]))
    return None


def engine_regions(f: Fields, regions: list[tuple[Region, Any]], plan: Plan,
                   dim: str | None) -> tuple[list[Slab | int], list[np.ndarray]]:
    """The engine's regions over the plan's output positions: a :class:`Slab`
    or the index of a mask in the second list (see ``Mesh.regions``)."""
    out: list[Slab | int] = []
    masks: list[np.ndarray] = []
    index = plan.input_index()
    counts = plan.out_shape
    fdims = tuple(str(d) for d in f.dims)
    for region, _ in regions:
        if isinstance(region, np.ndarray) and dim is not None:
            region = np.transpose(region, [fdims.index(d) for d in plan.dims if d in fdims])
            if dim not in fdims:
                region = np.expand_dims(region, plan.axis(dim))
        if region is None:
            out.append(Slab(tuple((0, c, 1) for c in counts)))
            continue
        if isinstance(region, np.ndarray):
            sub = region[tuple(index[d] for d in plan.dims)]
            masks.append(sub)
            out.append(len(masks) - 1)
            continue
        ranges = []
        as_mask = False
        per_dim = []
        for d, c in zip(plan.dims, counts, strict=True):
            s = index[d]
            inputs = np.arange(s.start, s.stop, s.step)[:c]
            pos = region.get(d)
            hit = np.arange(c) if pos is None else np.nonzero(np.isin(inputs, pos))[0]
            per_dim.append(hit)
            r = _as_range(hit)
            if r is None:
                as_mask = True
            ranges.append(r if r is not None else (0, 0, 1))
        if as_mask:
            m = np.zeros(counts, dtype=bool)
            m[np.ix_(*per_dim)] = True
            masks.append(m)
            out.append(len(masks) - 1)
        else:
            out.append(Slab(tuple(ranges)))  # type: ignore[arg-type]
    return out, masks

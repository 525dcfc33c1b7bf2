"""Checks on mesh regions that catch silently wrong selections: a region
that selects no cells, and a boolean mask whose labels differ from the data's."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import xarray as xr

from xstencil._errors import XStencilError

__all__ = ["warn_empty", "align_mask"]


def warn_empty(call: str, obj: xr.DataArray | xr.Dataset, region: Any, key: Any,
               by_label: bool) -> None:
    """Warn about a region that selects no cells, naming the likely cause
    (a label slice the wrong way round on a descending coordinate).

    ``region`` is a boolean array or ``{dim: positions}``; ``key`` is what
    the user wrote (``{dim: selector}``), ``by_label`` whether through ``.loc``.
    """
    if isinstance(region, np.ndarray):
        if not region.any():
            warnings.warn(f"{call}: m[mask] = ...: the mask selects no cells (it is False "
                          f"everywhere), so this kernel never runs", stacklevel=4)
        return
    if not isinstance(region, Mapping) or not isinstance(key, Mapping):
        return
    empty = [d for d, pos in region.items() if pos.size == 0]
    if not empty:
        return
    where = f"m.loc[{dict(key)!r}]" if by_label else f"m[{dict(key)!r}]"
    hint = ""
    for d in empty:
        sel = key.get(d)
        index = obj.indexes.get(d)
        if by_label and isinstance(sel, slice) and index is not None and len(index) > 1 \
                and index.is_monotonic_decreasing and sel.start is not None \
                and sel.stop is not None and sel.start < sel.stop:
            hint = (f"; coordinate {d!r} is descending, so a label slice runs from high to "
                    f"low: use slice({sel.stop!r}, {sel.start!r})")
    warnings.warn(f"{call}: {where} = ...: the region selects no cells along "
                  f"{tuple(empty)!r}, so this kernel never runs{hint}", stacklevel=4)


def _label_difference(mine: Any, theirs: Any) -> str:
    """What differs between the data's labels and the mask's, in words."""
    extra, missing = theirs.difference(mine), mine.difference(theirs)
    parts = []
    if len(extra):
        parts.append(f"the mask has {extra[:3].tolist()!r}{'...' if len(extra) > 3 else ''} "
                     f"that the data lacks")
    if len(missing):
        parts.append(f"the data has {missing[:3].tolist()!r}"
                     f"{'...' if len(missing) > 3 else ''} that the mask lacks")
    if not parts:  # equal sets: repeated (or NaN) labels, or another count
        parts.append(f"the same labels, but {len(theirs)} in the mask against {len(mine)} in "
                     f"the data, or some repeated (unique: mask {theirs.is_unique}, data "
                     f"{mine.is_unique}), so they cannot be matched one to one")
    return "; ".join(parts)


def align_mask(call: str, obj: xr.DataArray | xr.Dataset, mask: xr.DataArray) -> xr.DataArray:
    """The mask reordered to the data's labels, as xarray aligns by label;
    labels that differ as sets raise.  Dims without an index on either side
    stay positional (as in xarray)."""
    for d in mask.dims:
        mine, theirs = obj.indexes.get(d), mask.indexes.get(d)
        if mine is None or theirs is None or mine.equals(theirs):
            continue
        if not (mine.is_unique and theirs.is_unique and len(mine) == len(theirs)
                and mine.isin(theirs).all()):
            raise XStencilError(
                f"{call}: m[mask] = ...: the mask's coordinate {d!r} does not match the "
                f"data's: {_label_difference(mine, theirs)}; build the mask from the data "
                f"(e.g. m[da > 0]) or align it with mask.reindex_like(data)")
        mask = mask.reindex({d: mine})
    return mask

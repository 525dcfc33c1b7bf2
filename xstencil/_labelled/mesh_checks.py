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
                f"{call}: m[mask] = ...: the mask's coordinate {d!r} has labels "
                f"{theirs[:3].tolist()!r}... that do not match the data's "
                f"{mine[:3].tolist()!r}...; build the mask from the data (e.g. m[da > 0]) or "
                f"align it with mask.reindex_like(data)")
        mask = mask.reindex({d: mine})
    return mask

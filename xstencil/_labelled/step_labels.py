"""A step function's result, taken by label.

``scan(step=...)`` and ``iterate(step=...)`` carry the state as plain arrays
between steps and wrap them in the state's labels again.  A step that
returns its state in another order of labels (``.sortby("lat")``, ``.roll(x=1,
roll_coords=True)``, ``.isel(lat=slice(None, None, -1))``) was taken by
position, so every value landed under another label with no warning.  The
result is now reordered to the state's labels, as xarray's arithmetic would
align it; a result with labels the state does not have is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from xstencil._errors import XStencilError

__all__ = ["by_label"]


def _show(index: pd.Index) -> str:
    vals = list(index)
    return repr(vals) if len(vals) <= 6 else f"[{vals[0]!r}, {vals[1]!r}, ..., {vals[-1]!r}]"


def by_label(call: str, new: xr.DataArray, indexes: Mapping[Any, pd.Index],
             what: str, whose: str = "state") -> xr.DataArray:
    """``new`` with each indexed dim in the order of the ``whose``'s ``indexes``
    (``what``: how the message names ``new``)."""
    for d in new.dims:
        want = indexes.get(d)
        got = new.indexes.get(d)
        if want is None or got is None or got.equals(want) or len(got) != len(want):
            continue  # another length: the caller's shape check says what is wrong
        if len(got) == len(want) and got.is_unique and want.is_unique:
            order = got.get_indexer(want)
            if (order >= 0).all():
                new = new.isel({d: np.asarray(order)})
                continue
        differ = got.difference(want)
        new = f" ({_show(differ)} are new)" if len(differ) else " (some repeat)"
        raise XStencilError(
            f"{call}: {what} {d!r} labels {_show(got)}, which are not the {whose}'s "
            f"{_show(want)}{new}; keep the {whose}'s labels, or relabel by position with "
            f".assign_coords({d}={whose}.{d}) if that is what you mean")
    return new

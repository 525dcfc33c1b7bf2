"""Where xarray objects keep the arrays a trace may read (see
:data:`xstencil._engine.fresh.LENDERS`).

With x64 off, JAX keeps its 32-bit copy of a float64 numpy array by the
array object.  A kernel reading ``coef.values`` of a DataArray it closes over
gets the same numpy array on every call (the Variable's own), so after
``coef.values[...] = 3`` a retrace read JAX's old copy.  The Variable is where
a view can be lent for the trace: ``.values`` and ``.data`` then return it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import xarray as xr

from xstencil._engine.fresh import LENDERS

__all__ = ["variable_slots"]


def variable_slots(v: Any) -> list[tuple[Any, Any]] | None:
    """The ``(Variable, "data")`` slots of ``v``'s numpy-backed variables
    (data and coordinates that are not indexes), or ``None`` for a value that
    is not an xarray object."""
    if isinstance(v, xr.DataArray):
        variables = [v.variable, *(c.variable for c in v.coords.values())]
    elif isinstance(v, xr.Dataset):
        variables = list(v.variables.values())
    elif isinstance(v, xr.Variable):
        variables = [v]
    else:
        return None
    return [(x, "data") for x in variables
            if not isinstance(x, xr.IndexVariable) and isinstance(x._data, np.ndarray)]


LENDERS.append(variable_slots)

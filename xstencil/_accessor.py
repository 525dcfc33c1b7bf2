"""The ``.stencil`` accessor on DataArray and Dataset.

Each method is a one-line delegate to the public function of the same name;
the accessor holds no state (xarray caches it per object).
"""

from __future__ import annotations

from typing import Any

import xarray as xr

from xstencil._labelled.iterate import iterate as _iterate
from xstencil._labelled.map import map as _map
from xstencil._labelled.mesh import mesh as _mesh
from xstencil._labelled.scan import scan as _scan
from xstencil._labelled.solve import solve as _solve

__all__ = ["StencilAccessor"]


class StencilAccessor:
    """Stencil computations on this object: ``obj.stencil.map(kernel)``.

    Registered as ``.stencil`` on DataArray and Dataset by ``import xstencil``.
    Each method delegates to the function of the same name with the object
    as its first argument: ``da.stencil.map(k)`` is ``xstencil.map(da, k)``.

    Examples
    --------
    >>> import numpy as np, xarray as xr, xstencil
    >>> da = xr.DataArray(np.arange(4.0), dims="x")
    >>> da.stencil.map(lambda u: u(x=1) - u(), boundary="periodic").values
    array([ 1.,  1.,  1., -3.])
    >>> xstencil.map(da, lambda u: u(x=1) - u(), boundary="periodic").values
    array([ 1.,  1.,  1., -3.])
    """

    def __init__(self, obj: xr.DataArray | xr.Dataset):
        self._obj = obj

    def map(self, kernel: Any, *args: Any, **kwargs: Any) -> Any:
        """Apply a kernel at every point; see :func:`xstencil.map`."""
        return _map(self._obj, kernel, *args, **kwargs)

    def iterate(self, body: Any = None, *args: Any, **kwargs: Any) -> Any:
        """Apply a kernel or mesh until converged; see :func:`xstencil.iterate`."""
        return _iterate(self._obj, body, *args, **kwargs)

    def solve(self, operator: Any, *args: Any, **kwargs: Any) -> Any:
        """Solve ``operator(x) = self``; see :func:`xstencil.solve`."""
        return _solve(operator, self._obj, *args, **kwargs)

    def mesh(self, **kwargs: Any) -> Any:
        """A function mesh over this object; see :func:`xstencil.mesh`."""
        return _mesh(self._obj, **kwargs)

    def scan(self, kernel: Any = None, *args: Any, **kwargs: Any) -> Any:
        """Scan a kernel along a dim (time stepping); see :func:`xstencil.scan`."""
        return _scan(self._obj, kernel, *args, **kwargs)


def register() -> None:
    """Register the accessor as ``.stencil`` on DataArray and Dataset."""
    xr.register_dataarray_accessor("stencil")(StencilAccessor)
    xr.register_dataset_accessor("stencil")(StencilAccessor)

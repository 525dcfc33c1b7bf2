"""Making a function mesh: :func:`mesh` (``xstencil.mesh``,
``da.stencil.mesh``) checks its options and returns a :class:`Mesh`
(mesh.py), or a grid mesh when ``grid=`` or ``at=`` is given.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import xarray as xr

from xstencil._backends.loops import backend_arg
from xstencil._errors import XStencilError, raised_here
from xstencil._labelled.dispatch import devices_arg
from xstencil._labelled.mesh import Mesh
from xstencil._labelled.options import MESH
from xstencil._labelled.staggered_ops import GridMesh

__all__ = ["mesh"]


def _from_options(obj: xr.DataArray | xr.Dataset, **options: Any) -> Mesh | GridMesh:
    """:func:`mesh` from the options given (``None`` values left out)."""
    if options.get("grid") is not None or options.get("at") is not None:
        return GridMesh(_from_options, obj, {k: v for k, v in options.items() if v is not None})
    allowed = set(MESH)
    bad = set(options) - allowed
    call = "da.stencil.mesh(...)" if isinstance(obj, xr.DataArray) else "ds.stencil.mesh(...)"
    if "mesh" in options:
        options["devices"] = devices_arg(call, options.get("devices"), options.pop("mesh"))
    if bad:
        raise XStencilError(f"{call}: unknown option(s) {sorted(bad)!r}; "
                            f"accepted are {sorted(allowed - {'mesh'})!r}")
    if "backend" in options:
        backend_arg(call, options["backend"])
    return Mesh(obj, **options)


@raised_here
def mesh(
    obj: xr.DataArray | xr.Dataset,
    *,
    window: Mapping[str, int | tuple[int, int]] | None = None,
    boundary: str | Mapping[str, str] | None = None,
    fill_value: Any = None,
    stride: int | Mapping[str, int] | None = None,
    output_dims: str | Sequence[str] | None = None,
    period: Mapping[str, float] | None = None,
    devices: Any = None,
    new_vars: str | Sequence[str] | None = None,
    grid: Any = None,
    at: Mapping[str, str] | None = None,
    dtype: Any = None,
    mesh: Any = None,
    backend: str | None = None,
    **unknown: Any,
) -> Mesh | GridMesh:
    """A function mesh: different kernels on different regions.

    Parameters
    ----------
    obj
        The data.
    window
        ``{dim: size}`` or ``{dim: (lo, hi)}``, as for :func:`xstencil.map`;
        inferred from the offsets all the kernels read when omitted.
    boundary
        One mode or ``{dim: mode}``, as for :func:`xstencil.map`.  Default
        ``"fill"``; on a grid, the grid's padding per axis.
    fill_value
        The halo value for ``"fill"`` (NaN for float data by default).
    stride
        ``{dim: step}`` (or one int): compute every step-th point.
    output_dims
        Names of the trailing dims for kernels that return arrays.
    period
        ``{dim: period}`` of a periodic coordinate, for ``u.coord``.
    devices
        Run on several devices, as for :func:`xstencil.map`.
    new_vars
        Names a Dataset kernel may return that are not data variables yet.
    grid, at
        A staggered grid and the output position per axis (see
        :doc:`/staggered`).
    dtype
        Cast the results to this dtype (``m.map(dtype=...)`` overrides it).
    mesh
        Deprecated spelling of ``devices`` (a DeprecationWarning says so).
    backend
        ``"auto"``, ``"loops"`` or ``"xla"``, as for :func:`xstencil.map`
        (default: the ``XSTENCIL_BACKEND`` environment variable, else
        ``"auto"``): ``m.map()`` on large numpy data on the CPU runs as numba
        loops, one loop nest per region; see :doc:`/performance`.
    **unknown
        Not accepted: a misspelled option raises an error that lists the
        accepted ones.  Kernel arguments go to ``m.map(...)``.

    Returns
    -------
    Mesh
        Assign kernels with ``m[...] = f`` (everywhere), ``m[{"x": 0}] = f``
        (by position), ``m.loc[{"x": 0.0}] = f`` (by label, inclusive slices),
        ``m[mask] = f`` (a boolean DataArray); run with ``m.map()`` or
        ``m.scan(dim=...)``.  Later assignments win; uncovered points keep
        their input.  With ``grid=`` or ``at=``, a grid mesh that reads the
        same way.

    Notes
    -----
    Regions are resolved when they are assigned: labels to positions, and a
    mask is copied, so changing the mask afterwards does not change the
    mesh.  Each distinct kernel is compiled once however many regions use
    it, and a mesh rebuilt with the same regions in a loop reuses the
    compiled function.

    Examples
    --------
    >>> import numpy as np, xarray as xr, xstencil
    >>> da = xr.DataArray(np.arange(5.0), dims="x", coords={"x": np.linspace(0, 1, 5)})
    >>> m = da.stencil.mesh(boundary="extend")
    >>> m[...] = lambda u: u(x=-1) + u(x=1)
    >>> m.loc[{"x": 0.0}] = lambda u: -1.0
    >>> m.map().values
    array([-1.,  2.,  4.,  6.,  7.])
    """
    given = {"window": window, "boundary": boundary, "fill_value": fill_value,
             "stride": stride, "output_dims": output_dims, "period": period,
             "devices": devices, "new_vars": new_vars, "grid": grid, "at": at,
             "dtype": dtype, "backend": backend}
    options = {k: v for k, v in given.items() if v is not None}
    if mesh is not None:
        options["mesh"] = mesh
    return _from_options(obj, **options, **unknown)

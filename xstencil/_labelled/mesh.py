"""Function meshes on labelled data: kernels assigned to regions picked by
position (``m[{"x": 0}]``, ``.isel`` semantics), by coordinate label
(``m.loc[{"x": 0.0}]``, ``.sel`` semantics) or by a boolean DataArray mask.

The later assignment wins where regions overlap; points no region covers keep
their input value.  The result equals a per-point ``lax.switch`` over the
assigned kernels.  Regions are resolved when assigned (mesh_regions.py); how
they run, and the repeat-call fast path, are in mesh_run.py.  The
:func:`~xstencil._labelled.mesh_make.mesh` function that makes a mesh (and
checks its options) is in mesh_make.py.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import numpy as np
import xarray as xr

from xstencil._engine.call import precision
from xstencil._engine.kcache import cached, describe
from xstencil._engine.mesh import Slab
from xstencil._errors import XStencilError, raised_here
from xstencil._labelled.core import Fields, call_engine, prepare, unwrap
from xstencil._labelled.dispatch import map_scaled
from xstencil._labelled.dtypes import out_dtype
from xstencil._labelled.map import leaf_dims_cached
from xstencil._labelled.mesh_checks import warn_empty
from xstencil._labelled.mesh_loops import loop_hook
from xstencil._labelled.mesh_regions import (
    bad_key,
    by_label,
    by_mask,
    by_position,
    engine_regions,
    nearest,
    region_dims,
)
from xstencil._labelled.mesh_repr import Loc, MeshRepr
from xstencil._labelled.mesh_resolved import resolved
from xstencil._labelled.mesh_run import how, layout, lookup, remember, run, traced_call
from xstencil._labelled.plan import Plan
from xstencil._labelled.result import rewrap
from xstencil._labelled.scan import scan_mesh

__all__ = ["Mesh", "nearest"]


class Mesh(MeshRepr):
    """A function mesh over a DataArray or Dataset; make one with
    :func:`xstencil.mesh` or ``da.stencil.mesh(...)``.

    Assign kernels to regions, then run them all at once:

    * ``m[...] = f``: everywhere;
    * ``m[{"x": 0}] = f``: by position (:meth:`xarray.DataArray.isel` semantics);
    * ``m.loc[{"x": 0.0}] = f``: by coordinate label
      (:meth:`xarray.DataArray.sel` semantics, label slices include both ends;
      ``m.loc[xstencil.nearest(x=0.3)]`` snaps to the nearest label);
    * ``m[mask] = f``: by a boolean DataArray.

    Later assignments win where regions overlap; cells no region covers keep
    their input.  ``m.map()`` runs the mesh once, ``m.scan(dim=...)`` steps it
    along a dim (see :func:`xstencil.scan`).  ``repr(m)`` lists the regions in
    the order they were assigned.

    Examples
    --------
    >>> import numpy as np, xarray as xr, xstencil
    >>> da = xr.DataArray(np.arange(5.0), dims="x", coords={"x": np.linspace(0, 1, 5)})
    >>> m = da.stencil.mesh(boundary="extend")
    >>> m[...] = lambda u: u(x=1) + u(x=-1)
    >>> m.loc[{"x": 0.0}] = lambda u: -1.0
    >>> m.map().values
    array([-1.,  2.,  4.,  6.,  7.])
    """

    def __init__(self, obj: xr.DataArray | xr.Dataset, **options: Any):
        self._obj = obj
        self._options = options
        self._call = "da.stencil.mesh(...)" if isinstance(obj, xr.DataArray) \
            else "ds.stencil.mesh(...)"
        self._fields: Fields = unwrap(self._call, obj)
        self._indexes = {k: v.copy() for k, v in obj.indexes.items()}
        self._regions: list[tuple[dict[str, np.ndarray] | np.ndarray | None,
                                  Callable[..., Any]]] = []
        self._keys: list[str] = []  # how each region was selected, for the repr
        # the data's index objects the regions were checked against (fast path, mesh_run.py)
        self._seen: dict[Any, Any] | None = dict(getattr(obj, "_indexes", None) or {}) \
            if hasattr(obj, "_indexes") else None

    @property
    def loc(self) -> Loc:
        """Assign by coordinate label: ``m.loc[{"x": slice(1.5, None)}] = f``."""
        return Loc(self)

    @raised_here
    def __setitem__(self, key: Any, kernel: Callable[..., Any]) -> None:
        if key is Ellipsis:
            self._assign(None, kernel, key)
        elif isinstance(key, xr.DataArray):
            self._assign(self._by_mask(key), kernel, "<mask>")
        elif isinstance(key, Mapping):
            self._assign(self._by_position(key), kernel, key)
        else:
            raise bad_key(self._call, self._fields, key)

    def _assign(self, region: Any, kernel: Callable[..., Any], key: Any,
                by_label: bool = False) -> None:
        if not callable(kernel):
            raise XStencilError(
                f"{self._call}: m[{key!r:.60}] = {kernel!r:.60}: assign a kernel function, such "
                f"as lambda u: u(x=-1)"
            )
        warn_empty(self._call, self._obj, region,
                   key.indexers if isinstance(key, nearest) else key, by_label)
        self._regions.append((region, kernel))
        self._keys.append("[...]" if key is Ellipsis else f"[{key}]" if isinstance(key, str)
                          else f"[{key!r}]")

    def _by_position(self, key: Mapping[str, Any]) -> dict[str, np.ndarray]:
        return by_position(self._call, self._fields, key)

    def _by_label(self, key: Any) -> dict[str, np.ndarray]:
        return by_label(self._call, self._obj, self._fields, key, self._indexes)

    def _by_mask(self, mask: xr.DataArray) -> np.ndarray:
        return by_mask(self._call, self._obj, self._fields, mask)

    def _current(self) -> Fields:
        """The data as it is now (``T.data = ...`` after the mesh was made is
        seen); a change of dims, sizes or coordinate labels raises, since the
        regions were resolved against the old ones."""
        f = unwrap(self._call, self._obj)
        old = self._fields
        changed = f.dims != old.dims or f.shape != old.shape or f.names != old.names \
            or self._indexes.keys() != self._obj.indexes.keys() \
            or any(not v.equals(self._obj.indexes[k]) for k, v in self._indexes.items())
        if changed:
            what = (f"Dataset's data variables changed after the mesh was created "
                    f"({old.names!r} then, {f.names!r} now)" if f.names != old.names else
                    f"data's dims, sizes or coordinate labels changed after the mesh was "
                    f"created (was {dict(zip(old.dims, old.shape, strict=True))!r})")
            raise XStencilError(
                f"{self._call}: the {what}; the regions were chosen on the old ones, so "
                f"create the mesh again")
        self._fields = f
        if hasattr(self._obj, "_indexes"):
            self._seen = dict(self._obj._indexes)
        return f

    # -- running --------------------------------------------------------------
    def _plan(self, extra_reach: Mapping[str, tuple[int, int]] | None = None,
              call: str | None = None, **over: Any) -> tuple[Plan, dict[str, Any]]:
        o = dict(self._options)
        o.update(over)
        if not self._regions:
            raise XStencilError(f"{self._call}: the mesh has no regions; assign kernels with "
                                f"m[...] = f, m[{{dim: pos}}] = f or m.loc[{{dim: label}}] = f")
        # the distinct kernels: a window is inferred once per kernel, not per region
        plan = prepare(call or self._call, self._fields, layout(self).distinct,
                       window=o.get("window"), boundary=o.get("boundary", "fill"),
                       fill_value=o.get("fill_value"), stride=o.get("stride"),
                       output_dims=o.get("output_dims"), args=o.get("args", ()),
                       kwargs=o.get("kwargs", {}), extra_reach=extra_reach)
        return plan, o

    def regions(self, plan: Plan, dim: str | None = None
                ) -> tuple[list[Slab | int], list[np.ndarray]]:
        """Engine regions over output positions; masks are returned separately
        (they travel as arrays), referenced by index.

        For a scan along ``dim``, ``plan`` may order the dims differently and
        may add ``dim`` (an initial state): masks are then transposed to the
        plan's order and get a length-1 ``dim`` axis, which every position
        reads (a slice at position ``t`` clamps to it).
        """
        if all(r is None or isinstance(r, dict) for r, _ in self._regions):
            # positions only (no masks): cached by value, so rebuilt meshes skip this
            key = ("regions", plan, dim, tuple(
                None if r is None else tuple((d, a.dtype.str, a.tobytes()) for d, a in r.items())
                for r, _ in self._regions))
            out, masks = cached(key, lambda: self._regions_of(plan, dim))
            return list(out), list(masks)
        return self._regions_of(plan, dim)

    def _regions_of(self, plan: Plan, dim: str | None
                    ) -> tuple[list[Slab | int], list[np.ndarray]]:
        return engine_regions(self._fields, self._regions, plan, dim)

    @raised_here
    def map(self, *args: Any, dtype: Any = None, **kwargs: Any) -> xr.DataArray | xr.Dataset:
        """Run the mesh over the data once.

        Parameters
        ----------
        *args, **kwargs
            Passed to every kernel, as for :func:`xstencil.map` (arrays are
            traced, other values are static).
        dtype
            Cast the results to this dtype (overrides the mesh's ``dtype=``).
            By default the result has the promoted dtype of the kernels'
            results, and of the input where points no region covers keep it.

        Returns
        -------
        DataArray or Dataset
            With the input's dims, coords, attrs and name.

        Notes
        -----
        A repeated call, from this mesh or one rebuilt with the same regions
        and structurally equal kernels, reuses the compiled function and
        skips validation and planning; each distinct kernel is compiled once
        however many regions use it.
        """
        if isinstance(kwargs.get("out"), xr.DataArray):  # map(out=)'s option, not a mesh's
            raise XStencilError(
                f"{self._call.replace('mesh(...)', 'mesh(...).map()')}: out= (writing into a "
                f"preallocated array) is an option of da.stencil.map, not of a mesh's map; "
                f"here out={kwargs['out'].name!r} would be passed to the kernels as an extra "
                f"argument. Use the returned result: u = m.map()")
        hit = lookup(self, args, kwargs, self._options.get("dtype") if dtype is None else dtype)
        if hit is not None:  # a repeated call (mesh_run.py)
            return run(hit[0], self._obj, args, kwargs, hit[1])
        call = self._call.replace("mesh(...)", "mesh(...).map()")
        self._current()
        given = self._options.get("dtype") if dtype is None else dtype
        result = out_dtype(call, given)
        with precision(np.zeros(0, result) if isinstance(result, np.dtype) else None):
            plan, _ = self._plan(call=call, args=args, kwargs=kwargs)  # see map.py
        plan = replace(plan, out_dtype=result)
        lay = layout(self)
        # resolved once per regions and plan, with their coverage (mesh_resolved.py)
        res = resolved(plan, lay.key[0], lambda: self.regions(plan))
        regions, masks = list(res.regions), list(res.masks)
        kernels = tuple(k for _, k in self._regions)
        lifted = describe(lay.distinct)  # the compile-cache key and closed-over arrays
        leaf_dims = None
        if self._fields.names is not None:  # each result gets its own dims (returns.py)
            leaf_dims = leaf_dims_cached(plan, self._fields, lay.distinct, lifted.key, args,
                                         kwargs, self._options.get("new_vars"),
                                         self._region_dims())
        out = map_scaled(plan, self._fields, kernels, self, args, kwargs,
                         self._options.get("period"), self._options.get("devices"), regions,
                         masks, backend=self._options.get("backend"))
        if out is not None:  # dask-backed or sharded: the backend chosen by the arrays
            return rewrap(plan, self._fields, out, leaf_dims)
        traced = traced_call(self._fields.arrays, args, kwargs, lifted)
        key_extra, body, dynamic = how(plan, lay, lifted, res, traced)
        hook = loop_hook(plan, self._fields.arrays, lay.kidx, res, key_extra,
                         self._options.get("backend"), traced)
        if hook is not None:  # numba loops on large numpy data (mesh_loops.py)
            key_extra = (key_extra, hook[0])
        used: dict[str, Any] = {}
        out = call_engine(plan, self._fields, lifted, key_extra, body, args, kwargs,
                          self._options.get("period"), dynamic, used=used,
                          loops=None if hook is None else hook[1])
        remember(self, lifted, plan, self._fields, args, kwargs, given, dynamic, used,
                 leaf_dims)
        return rewrap(plan, self._fields, out, leaf_dims)

    def _region_dims(self) -> tuple[str, ...]:
        """Dims along which the regions vary: results change along them
        (cached by the regions' keys: a pass over each mask otherwise)."""
        f = self._fields
        return cached(("mesh-region-dims", f.dims, f.shape, layout(self).key[0]),
                      lambda: region_dims(f, self._regions))

    @raised_here
    def scan(self, dim: str = "time", *args: Any,
             window: Mapping[str, int | tuple[int, int]] | None = None,
             boundary: str | Mapping[str, str] | None = None, fill_value: Any = None,
             steps: int | None = None, dt: Any = None, coord: Any = None,
             save_every: int | str = 1, progress: bool = False, checkpoint: bool = False,
             check_finite: bool = False, period: Mapping[str, float] | None = None,
             halo_every: int | None = None, dtype: Any = None, store: Any = None,
             backend: str | None = None, **kwargs: Any) -> xr.DataArray | xr.Dataset:
        """Run the mesh as a scan along ``dim``: each region's kernel steps
        its cells (see :func:`xstencil.scan` for the scan semantics).

        Parameters
        ----------
        dim
            The dim to scan along.
        *args, **kwargs
            Passed to every kernel.
        window, boundary, fill_value, period
            As for :func:`xstencil.scan`; default to the mesh's own.
        steps, dt, coord, save_every, progress, checkpoint, check_finite
            As for :func:`xstencil.scan`.
        halo_every
            For dask-backed or sharded data: steps per halo exchange.
        dtype
            The state's dtype (overrides the mesh's ``dtype=``).
        store
            Not available for a mesh yet (raises).
        backend
            As for :func:`xstencil.scan` (default: the mesh's own
            ``backend=``): a mesh grown by ``steps=`` on numpy data whose
            kernels read only the previous position runs as numba loops, one
            nest per region per step (see :doc:`/performance`); other mesh
            scans run with XLA.

        Returns
        -------
        DataArray or Dataset
            The trajectory (or the saved steps), as :func:`xstencil.scan`.
        """
        self._current()
        opts = {"window": window, "boundary": boundary, "fill_value": fill_value,
                "steps": steps, "dt": dt, "coord": coord, "period": period,
                "halo_every": halo_every, "dtype": dtype, "store": store, "backend": backend}
        opts = {k: v for k, v in opts.items() if v is not None}  # unset: the mesh's own
        return scan_mesh(self, dim, *args, save_every=save_every, progress=progress,
                         checkpoint=checkpoint, check_finite=check_finite, **opts, **kwargs)

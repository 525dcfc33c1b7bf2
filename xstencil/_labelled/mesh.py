"""Function meshes on labelled data: kernels assigned to regions picked by
position (``m[{"x": 0}]``, ``.isel`` semantics), by coordinate label
(``m.loc[{"x": 0.0}]``, ``.sel`` semantics) or by a boolean DataArray mask.

The later assignment wins where regions overlap; points no region covers keep
their input value.  The result equals a per-point ``lax.switch`` over the
assigned kernels.  Rectangular regions are computed over their own slab only.
"""

from __future__ import annotations

import html
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import xarray as xr

from xstencil._engine.kcache import cached, describe
from xstencil._engine.mesh import Mask, Slab, mesh_evaluate
from xstencil._errors import LabelError, XStencilError, raised_here
from xstencil._labelled.core import (
    Fields,
    call_engine,
    identity_caller,
    kernel_caller,
    prepare,
    rewrap,
    sources,
    unwrap,
)
from xstencil._labelled.dispatch import devices_arg, map_scaled
from xstencil._labelled.dtypes import out_dtype
from xstencil._labelled.map import leaf_dims_cached
from xstencil._labelled.mesh_checks import align_mask, warn_empty
from xstencil._labelled.options import MESH
from xstencil._labelled.plan import Plan
from xstencil._labelled.scan import scan_mesh
from xstencil._labelled.staggered_ops import GridMesh

__all__ = ["mesh", "Mesh", "nearest"]


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


class _Loc:
    """``m.loc[{dim: label}] = kernel``: assign by coordinate label."""

    def __init__(self, mesh: Mesh):
        self._mesh = mesh

    def __repr__(self) -> str:
        return (f"<{self._mesh._call[:-5]}.loc: assign by coordinate label, "
                f"m.loc[{{dim: label}}] = f>")

    @raised_here
    def __setitem__(self, key: Any, kernel: Callable[..., Any]) -> None:
        self._mesh._assign(self._mesh._by_label(key), kernel, key, by_label=True)
        self._mesh._keys[-1] = f".loc[{key!r}]"


class Mesh:
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

    def _summary(self) -> tuple[str, list[tuple[str, str]]]:
        sizes = ", ".join(f"{d}: {n}" for d, n in self._obj.sizes.items())
        opts = "".join(f", {k}={v!r}" for k, v in self._options.items())
        head = f"xstencil.Mesh over a {type(self._obj).__name__} ({sizes}){opts}"
        rows = [(k, getattr(f, "__name__", None) or repr(f))
                for k, (_, f) in zip(self._keys, self._regions, strict=True)]
        return head, rows

    def __repr__(self) -> str:
        head, rows = self._summary()
        if not rows:
            return f"<{head}: no regions; assign with m[...] = f>"
        width = max(len(k) for k, _ in rows) + 2
        lines = [f"<{head}: {len(rows)} region{'s' if len(rows) > 1 else ''}, later wins"]
        lines += [f"  m{k:<{width}}= {f}" for k, f in rows]
        return "\n".join(lines) + ">"

    def _repr_html_(self) -> str:
        head, rows = self._summary()
        cells = "".join(f"<tr><td><code>m{html.escape(k)}</code></td>"
                        f"<td><code>{html.escape(f)}</code></td></tr>" for k, f in rows)
        table = (f"<table><tr><th>region (later wins)</th><th>kernel</th></tr>{cells}</table>"
                 if rows else "<p>no regions; assign with <code>m[...] = f</code></p>")
        return f"<div><strong>{html.escape(head)}</strong>{table}</div>"

    @property
    def loc(self) -> _Loc:
        """Assign by coordinate label: ``m.loc[{"x": slice(1.5, None)}] = f``."""
        return _Loc(self)

    @raised_here
    def __setitem__(self, key: Any, kernel: Callable[..., Any]) -> None:
        if key is Ellipsis:
            self._assign(None, kernel, key)
        elif isinstance(key, xr.DataArray):
            self._assign(self._by_mask(key), kernel, "<mask>")
        elif isinstance(key, Mapping):
            self._assign(self._by_position(key), kernel, key)
        else:
            raise XStencilError(
                f"{self._call}: m[{key!r:.60}] = ...: select with '...' (everywhere), a dict "
                f"of positions such as {{'x': 0}}, a boolean DataArray, or m.loc[{{...}}] for "
                f"labels"
            )

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

    def _check_dims(self, key: Mapping[str, Any], how: str) -> None:
        for d in key:
            if d not in self._fields.dims:
                raise XStencilError(
                    f"{self._call}: {how}: dimension {d!r} not found; available dims are "
                    f"{self._fields.dims!r}"
                )

    def _by_position(self, key: Mapping[str, Any]) -> dict[str, np.ndarray]:
        self._check_dims(key, f"m[{dict(key)!r}]")
        out = {}
        for d, sel in key.items():
            n = self._fields.shape[self._fields.dims.index(d)]
            if not isinstance(sel, slice) and _float_positions(sel):
                raise XStencilError(
                    f"{self._call}: m[{{{d!r}: {sel!r:.60}}}]: positions are ints (.isel "
                    f"semantics), got a float; select coordinate labels with "
                    f"m.loc[{{{d!r}: {sel!r:.60}}}]"
                )
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("error")
                    got = np.atleast_1d(np.arange(n)[sel])
            except IndexError:
                raise XStencilError(
                    f"{self._call}: m[{{{d!r}: {sel!r}}}]: position {sel!r} is out of range for "
                    f"dim {d!r} of length {n}"
                ) from None
            except (TypeError, ValueError, OverflowError, Warning):
                got = None
            if got is None or got.dtype.kind not in "iu" or got.ndim != 1:
                raise XStencilError(
                    f"{self._call}: m[{{{d!r}: {sel!r:.60}}}]: select positions with an int, a "
                    f"slice of ints or a list of ints (.isel semantics); use m.loc[...] for "
                    f"coordinate labels"
                )
            out[d] = got
        return out

    def _by_label(self, key: Any) -> dict[str, np.ndarray]:
        method = None
        if isinstance(key, nearest):
            key, method = key.indexers, "nearest"
        if not isinstance(key, Mapping):
            raise XStencilError(
                f"{self._call}: m.loc[{key!r:.60}]: select with a dict of labels such as "
                f"{{'x': 0.0}} or {{'x': slice(1.5, None)}}"
            )
        self._check_dims(key, f"m.loc[{dict(key)!r}]")
        out = {}
        for d, sel in key.items():
            if d not in self._obj.indexes:
                raise XStencilError(
                    f"{self._call}: m.loc[{{{d!r}: ...}}]: dim {d!r} has no index coordinate to "
                    f"select labels from; assign one (obj.assign_coords({d}=...)) or select by "
                    f"position with m[{{{d!r}: ...}}]"
                )
            index = self._obj.indexes[d]
            if method is not None and not index.is_unique:
                dup = index[index.duplicated()].unique()[:3].tolist()
                raise XStencilError(
                    f"{self._call}: m.loc[xstencil.nearest({d}={sel!r:.60})]: coordinate {d!r} "
                    f"has duplicated labels {dup!r}, so the nearest label is ambiguous; select "
                    f"by position with m[{{{d!r}: ...}}] or drop the duplicates first")
            pos = xr.DataArray(np.arange(len(index)), dims=d, coords={d: index})
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("error")
                    got = pos.sel({d: sel}, method=method) if method else pos.sel({d: sel})
                    values = np.atleast_1d(np.asarray(got.values))
            except (TypeError, ValueError, IndexError, OverflowError, Warning,
                    NotImplementedError):
                raise XStencilError(
                    f"{self._call}: m.loc[{{{d!r}: {sel!r:.60}}}]: cannot select labels of "
                    f"coordinate {d!r} (dtype {np.asarray(index).dtype}) with {sel!r:.60}; use "
                    f"a label, a list of labels or a slice of labels (.sel semantics)"
                ) from None
            except KeyError:
                vals = np.asarray(index)
                probe = np.asarray(sel)
                if probe.ndim == 0 and probe.dtype.kind in "iuf" and vals.dtype.kind in "iuf":
                    near = vals[np.argsort(np.abs(vals - probe.astype(float)))[:3]]
                else:
                    near = vals[:3]
                raise LabelError(
                    f"{self._call}: m.loc[{{{d!r}: {sel!r}}}]: label {sel!r} not found in "
                    f"coordinate {d!r}; nearest available are {near.tolist()!r} (use "
                    f"xstencil.nearest({d}={sel!r}) to snap to the nearest)"
                ) from None
            if values.dtype.kind not in "iu" or values.ndim != 1:
                raise XStencilError(
                    f"{self._call}: m.loc[{{{d!r}: {sel!r:.60}}}]: the selection is not a set of "
                    f"positions along {d!r}; use a label, a list of labels or a slice"
                )
            out[d] = values
        return out

    def _by_mask(self, mask: xr.DataArray) -> np.ndarray:
        if mask.dtype != bool:
            raise XStencilError(
                f"{self._call}: m[mask] = ...: the mask has dtype {mask.dtype}; use a boolean "
                f"DataArray, e.g. m[da > 0] = f"
            )
        extra = [d for d in mask.dims if d not in self._fields.dims]
        if extra:
            raise XStencilError(
                f"{self._call}: m[mask] = ...: the mask has dims {tuple(mask.dims)!r}, and "
                f"{extra!r} are not dims of the data {self._fields.dims!r}"
            )
        sizes = dict(zip(self._fields.dims, self._fields.shape, strict=True))
        for d in mask.dims:
            if mask.sizes[d] != sizes[d]:
                raise XStencilError(
                    f"{self._call}: m[mask] = ...: the mask has length {mask.sizes[d]} along "
                    f"{d!r} but the data has {sizes[d]}"
                )
        mask = align_mask(self._call, self._obj, mask)
        full = mask.transpose(*[d for d in self._fields.dims if d in mask.dims])
        arr = np.asarray(full.values, dtype=bool)
        arr = arr.reshape([sizes[d] if d in mask.dims else 1 for d in self._fields.dims])
        return np.broadcast_to(arr, self._fields.shape)

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
            raise XStencilError(
                f"{self._call}: the data's dims, sizes or coordinate labels changed after the "
                f"mesh was created (was {dict(zip(old.dims, old.shape, strict=True))!r}); the "
                f"regions were chosen on the old ones, so create the mesh again")
        self._fields = f
        return f

    # -- running --------------------------------------------------------------
    def _plan(self, extra_reach: Mapping[str, tuple[int, int]] | None = None,
              call: str | None = None, **over: Any) -> tuple[Plan, dict[str, Any]]:
        o = dict(self._options)
        o.update(over)
        if not self._regions:
            raise XStencilError(f"{self._call}: the mesh has no regions; assign kernels with "
                                f"m[...] = f, m[{{dim: pos}}] = f or m.loc[{{dim: label}}] = f")
        plan = prepare(call or self._call, self._fields, [k for _, k in self._regions],
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
        out: list[Slab | int] = []
        masks: list[np.ndarray] = []
        index = plan.input_index()
        counts = plan.out_shape
        fdims = tuple(str(d) for d in self._fields.dims)
        for region, _ in self._regions:
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

    @raised_here
    def map(self, *args: Any, dtype: Any = None, **kwargs: Any) -> xr.DataArray | xr.Dataset:
        """Run the mesh over the data; extra arguments go to every kernel.

        The result has the promoted dtype of the kernels' results (and of the
        input, where points no region covers keep it); ``dtype=`` (here or in
        :func:`mesh`) casts explicitly.
        """
        call = self._call.replace("mesh(...)", "mesh(...).map()")
        self._current()
        result = out_dtype(call, self._options.get("dtype") if dtype is None else dtype)
        plan, _ = self._plan(call=call, args=args, kwargs=kwargs)
        plan = replace(plan, out_dtype=result)
        regions, masks = self.regions(plan)
        kernels = tuple(k for _, k in self._regions)
        lifted = describe(kernels)  # the compile-cache key and closed-over arrays (kcache.py)
        leaf_dims = None
        if self._fields.names is not None:  # each result gets its own dims (returns.py)
            leaf_dims = leaf_dims_cached(plan, self._fields, kernels, lifted.key, args,
                                         kwargs, self._options.get("new_vars"),
                                         self._region_dims())
        out = map_scaled(plan, self._fields, kernels, self, args, kwargs,
                         self._options.get("period"), self._options.get("devices"), regions,
                         masks)
        if out is not None:  # dask-backed or sharded: the backend chosen by the arrays
            return rewrap(plan, self._fields, out, leaf_dims)
        out = call_engine(plan, self._fields, lifted, ("mesh", tuple(regions)),
                          _mesh_body(regions), args, kwargs,
                          self._options.get("period"), masks)
        return rewrap(plan, self._fields, out, leaf_dims)

    def _region_dims(self) -> tuple[str, ...]:
        """Dims along which the regions vary: results change along them."""
        out: set[str] = set()
        sizes = dict(zip(self._fields.dims, self._fields.shape, strict=True))
        for region, _ in self._regions:
            if isinstance(region, Mapping):
                out |= {d for d, pos in region.items() if len(np.unique(pos)) != sizes[d]}
            elif isinstance(region, np.ndarray):
                out |= {d for a, d in enumerate(self._fields.dims)
                        if not (region == region.take([0], axis=a)).all()}
        return tuple(d for d in self._fields.dims if d in out)

    @raised_here
    def scan(self, *args: Any, **kwargs: Any) -> Any:
        """Run the mesh as a scan along a dim; see :func:`xstencil.scan`."""
        self._current()
        return scan_mesh(self, *args, **kwargs)


def _as_range(hit: np.ndarray) -> tuple[int, int, int] | None:
    if hit.size == 0:
        return (0, 0, 1)
    if hit.size == 1:
        return (int(hit[0]), int(hit[0]) + 1, 1)
    d = np.diff(hit)
    if np.all(d == d[0]) and d[0] > 0:
        return (int(hit[0]), int(hit[-1]) + 1, int(d[0]))
    return None


def _mesh_body(regions: Sequence[Slab | int]) -> Any:
    def body(kernels: Sequence[Callable[..., Any]], plan: Plan, static: Any, arrays: Any,
             coords: Any, dyn: Any, masks: Any) -> Any:
        calls = [kernel_caller(plan, k, static) for k in kernels]
        branches = [(r if isinstance(r, Slab) else Mask(masks[r]), c)
                    for r, c in zip(regions, calls, strict=True)]
        base = identity_caller(plan, calls[-1])
        return mesh_evaluate(branches, base, sources(plan, arrays, coords), plan.geom, dyn)

    return body


@raised_here
def mesh(obj: xr.DataArray | xr.Dataset, **options: Any) -> Mesh | GridMesh:
    """A function mesh: different kernels on different regions.

    Parameters
    ----------
    obj
        The data.
    **options
        ``window``, ``boundary``, ``fill_value``, ``stride``, ``output_dims``,
        ``period``, ``devices`` (``mesh`` is its deprecated spelling),
        ``new_vars`` and ``dtype``, as for :func:`xstencil.map`; ``grid`` and
        ``at`` for a staggered grid (see :doc:`/staggered`).

    Returns
    -------
    Mesh
        Assign kernels with ``m[...] = f`` (everywhere), ``m[{"x": 0}] = f``
        (by position), ``m.loc[{"x": 0.0}] = f`` (by label, inclusive slices),
        ``m[mask] = f`` (a boolean DataArray); run with ``m.map()`` or
        ``m.scan(dim=...)``.  Later assignments win; uncovered points keep
        their input.

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
    if options.get("grid") is not None or options.get("at") is not None:
        return GridMesh(mesh, obj, {k: v for k, v in options.items() if v is not None})
    allowed = set(MESH)
    bad = set(options) - allowed
    call = "da.stencil.mesh(...)" if isinstance(obj, xr.DataArray) else "ds.stencil.mesh(...)"
    if "mesh" in options:
        options["devices"] = devices_arg(call, options.get("devices"), options.pop("mesh"))
    if bad:
        raise XStencilError(f"{call}: unknown option(s) {sorted(bad)!r}; "
                            f"accepted are {sorted(allowed - {'mesh'})!r}")
    return Mesh(obj, **options)


def _float_positions(sel: Any) -> bool:
    """Whether a position selector holds floats (labels belong in ``.loc``);
    selectors numpy cannot read as one array are left to the position check."""
    try:
        a = np.asarray(sel)
    except (TypeError, ValueError):
        return False
    return bool(a.size) and a.dtype.kind in "fc"

"""``map``, ``mesh`` and ``scan`` with ``grid=``/``at=``: staggered calls
translated into plain ones (:mod:`xstencil._labelled.staggered`).

Each entry point receives the plain function it runs on (``run``), so this
module imports none of map.py, mesh.py or scan.py (they dispatch here).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import xarray as xr

from xstencil._engine.call import split_static
from xstencil._engine.kcache import describe, peek, put, settle
from xstencil._errors import XStencilError
from xstencil._labelled.core import coord_dims, unwrap
from xstencil._labelled.plan import infer_window
from xstencil._labelled.staggered import Layout, Spec, layout
from xstencil._labelled.staggered_wrap import recording, restore, wrap, wrap_each

__all__ = ["FILL", "map_grid", "scan_grid", "GridMesh"]


class _DefaultFill(str):
    """The default ``boundary="fill"`` of map and scan, told apart from an
    explicit ``"fill"``: on a grid, the default means the grid's padding."""

    __slots__ = ()


FILL = _DefaultFill("fill")


def _call(obj: Any, what: str) -> str:
    return f"{'da' if isinstance(obj, xr.DataArray) else 'ds'}.stencil.{what}(..., grid=...)"


def _by_axis(lay: Layout, value: Any, name: str) -> Any:
    """``window=``/``stride=`` keyed by axis: keyed by index dim."""
    if value is None or not isinstance(value, Mapping):
        return value
    out = {}
    for k, v in value.items():
        if k in lay.grid.where:
            raise XStencilError(
                f"{lay.call}: {name}={dict(value)!r}: {k!r} is a dim of axis "
                f"{lay.grid.where[k][0]!r}; on a grid, key it by the axis name")
        out[lay.index.get(k, k)] = v
    return out


def _period(lay: Layout, period: Any) -> dict[str, float] | None:
    out = dict(lay.period)
    for k, v in (period or {}).items():
        if k not in lay.index and k not in lay.grid.where:
            out[k] = v  # a dim outside the grid
    return out or None


def _probe(lay: Layout, plain: Any, args: Any, kwargs: Any, dim: str | None = None) -> None:
    """Trace ``plain`` once on probe windows (as window inference does), so
    that the hidden variables it reads are recorded before the real call.
    ``dim``: a scan's dim, which a grown trajectory adds."""
    f = unwrap(lay.call, lay.plain)
    dims, var_dims, cdims = f.dims, f.var_dims, coord_dims(f)
    if dim is not None and dim not in dims:  # grown: the trajectory has a coordinate along dim
        dims, var_dims = (dim, *dims), tuple((dim, *d) for d in var_dims)
        cdims = (dim, *cdims)
    infer_window(lay.call, plain, dims, f.names, var_dims, f.dtypes, cdims, args, kwargs)


def _include(lay: Layout, kernels: Any, spec: Spec, args: Any, kwargs: Any,
             dim: str | None = None) -> tuple[str, ...]:
    """Pass only the hidden variables that ``kernels`` read (a dask scan needs
    every variable on the same dims, and fewer inputs are cheaper); returns
    the names the kernels' dict results have."""
    sides = [_side(lay, {None: k}, {None: spec}, args, kwargs, dim) for k in kernels]
    lay.include = frozenset().union(*[used for _, used in sides])
    return tuple(dict.fromkeys(n for names, _ in sides for n in names))


def _side(lay: Layout, kernels: Mapping[str | None, Any], specs: Mapping[str | None, Spec],
          args: Any, kwargs: Any, dim: str | None) -> tuple[tuple[str, ...], frozenset[str]]:
    """The names of one kernel's dict result and the hidden variables the
    kernels read (``kernels`` as :func:`~xstencil._labelled.staggered_wrap.recording`
    takes them), found by one probe trace per kernel structure (their
    :func:`~xstencil._engine.kcache.describe` key, so a changed global or
    closure value is traced again), specs, data layout and static arguments,
    and kept in the compile cache."""
    lifted = describe(list(kernels.values()))
    key = _side_key(lay, lifted.key, specs, args, kwargs, dim)
    got = None if key is None else peek(key)
    if got is None:
        used: set[str] = set()
        names: list[tuple[str, ...]] = []
        _probe(lay, recording(kernels, specs, used, names), args, kwargs, dim)
        got = (names[-1] if names else (), frozenset(used))
        settle(lifted)  # a list the trace wrote to is keyed by identity from now on,
        key = _side_key(lay, describe(list(kernels.values())).key, specs, args, kwargs, dim)
        if key is not None:  # so key what the next call will look up
            put(key, got)
    return got


def _side_key(lay: Layout, kkey: Any, specs: Mapping[str | None, Spec], args: Any,
              kwargs: Any, dim: str | None) -> Any:
    dyn, static = split_static(lay.call, (args, kwargs))
    key = ("staggered-side", kkey, tuple(specs.items()), dim, static,
           tuple((n, v.dims, v.dtype.str) for n, v in lay.variables.items()),
           tuple(lay.ds.sizes.items()), tuple(lay.keep),
           tuple((tuple(np.shape(x)), str(getattr(x, "dtype", ""))) for x in dyn))
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _check_scan_outputs(lay: Layout, names: Any, out_at: Mapping[str, str]) -> None:
    """A scan feeds its outputs back as inputs, so they must stay where they are."""
    for n in names:
        pos = lay.positions.get(n, {})
        if any(out_at.get(a, p) != p for a, p in pos.items()):
            raise XStencilError(
                f"{lay.call}: the kernel advances {n!r}, which is at {pos!r}, but at= puts the "
                f"output at {out_at!r}; a scan reads its outputs back at their own positions, "
                f"so pass kernel={{{n!r}: ..., ...}} (each variable at its own position) or "
                f"at= matching {n!r}")


def _check_kernel(call: str, kernel: Any) -> None:
    if not callable(kernel):
        raise XStencilError(f"{call}: kernel={kernel!r:.60} is not callable; pass a function "
                            f"of the staggered windows, e.g. lambda s: s.u(X=0.5) - s.u(X=-0.5)")


def map_grid(run: Callable[..., Any], obj: Any, kernel: Any, args: Any, kwargs: Any, *,
             grid: Any, at: Any, window: Any, boundary: Any, fill_value: Any, stride: Any,
             output_dims: Any, period: Any, mesh: Any, new_vars: Any = None) -> Any:
    """``map`` on a staggered grid; ``run`` is :func:`xstencil.map`."""
    call = _call(obj, "map")
    _check_kernel(call, kernel)
    if mesh is not None:
        raise XStencilError(f"{call}: mesh= (devices) is not supported with grid= yet; run "
                            f"in memory or on dask-backed data")
    if new_vars is not None and isinstance(obj, xr.DataArray):
        raise XStencilError(f"{call}: new_vars={new_vars!r:.60} is for Dataset kernels that "
                            f"return a dict; a DataArray kernel returns one value")
    lay, out_at = layout(call, obj, grid, at, None if boundary is FILL else boundary,
                         fill_value, period, cache=True)
    spec = lay.spec(out_at)
    names = _include(lay, [kernel], spec, args, kwargs)
    res = run(lay.plain, wrap(kernel, spec), *args, window=_by_axis(lay, window, "window"),
              boundary=lay.boundary, fill_value=lay.fill_value,
              stride=_by_axis(lay, stride, "stride"), output_dims=output_dims,
              period=_period(lay, period), new_vars=new_vars, **kwargs)
    return restore(lay, res, dict.fromkeys(names, out_at), out_at)


def scan_grid(run: Callable[..., Any], obj: Any, kernel: Any, dim: str, args: Any,
              kwargs: Any, options: dict[str, Any], *, grid: Any, at: Any, window: Any,
              boundary: Any, fill_value: Any, period: Any) -> Any:
    """``scan`` on a staggered grid; ``run`` is :func:`xstencil.scan`.

    ``kernel`` is one kernel (outputs at ``at``) or ``{name: kernel}``
    (each variable advanced at its own position).
    """
    call = _call(obj, "scan")
    boundary = None if boundary is FILL else boundary
    if isinstance(kernel, Mapping):
        if at is not None:
            raise XStencilError(f"{call}: with one kernel per variable, each variable stays "
                                f"at its own position; drop at=")
        lay, _ = layout(call, obj, grid, None, boundary, fill_value, period,
                        own_positions=True, cache=True)
        specs, targets = {}, {}
        for n, k in kernel.items():
            if n not in lay.positions:
                raise XStencilError(f"{call}: kernel={{{n!r}: ...}}: {n!r} is not a data "
                                    f"variable; they are {tuple(lay.positions)!r}")
            _check_kernel(call, k)
            targets[n] = {a: lay.positions[n].get(a, "center") for a in lay.index}
            specs[n] = lay.spec(targets[n], dim)
        plain = wrap_each(kernel, specs)
        lay.include = _side(lay, kernel, specs, args, kwargs, dim)[1]
        out_at: dict[str, str] = {}
    else:
        _check_kernel(call, kernel)
        lay, out_at = layout(call, obj, grid, at, boundary, fill_value, period, cache=True)
        spec = lay.spec(out_at, dim)
        plain = wrap(kernel, spec)
        names = _include(lay, [kernel], spec, args, kwargs, dim)
        _check_scan_outputs(lay, names, out_at)
        targets = dict.fromkeys(names, out_at)
    res = run(lay.plain, plain, dim, *args, window=_by_axis(lay, window, "window"),
              boundary=lay.boundary, fill_value=lay.fill_value, period=_period(lay, period),
              **options, **kwargs)
    return restore(lay, res, targets, out_at)


_SCAN_OPTIONS = {"dim", "window", "boundary", "fill_value", "steps", "dt", "coord",
                 "save_every", "progress", "checkpoint", "check_finite", "period", "halo_every"}


class GridMesh:
    """A function mesh on a staggered grid (``ds.stencil.mesh(grid=G, at=...)``):
    regions by position (``m[{"Y": 0}]``), by coordinate label
    (``m.loc[{"y_g": 0.0}]``; axis names select the output's dim) or by a
    boolean mask on the output's dims; kernels read by axis name in cells.

    Examples
    --------
    >>> import numpy as np, xarray as xr, xstencil
    >>> ds = xr.Dataset({"h": (("x_c",), np.array([1.0, 2.0, 4.0]))},
    ...                 coords={"x_c": [0.5, 1.5, 2.5], "x_g": [0.0, 1.0, 2.0]})
    >>> grid = {"X": {"center": "x_c", "left": "x_g"}}
    >>> m = ds.stencil.mesh(grid=grid, at={"X": "left"}, boundary="extend")
    >>> m[...] = lambda s: s.h(X=0.5) - s.h(X=-0.5)
    >>> m.loc[{"x_g": 0.0}] = lambda s: -1.0  # a wall face, by label
    >>> out = m.map()
    >>> out.dims, out.values
    (('x_g',), array([-1.,  1.,  2.]))
    """

    def __init__(self, make: Callable[..., Any], obj: Any, options: dict[str, Any]):
        call = _call(obj, "mesh")
        grid, at = options.pop("grid", None), options.pop("at", None)
        if options.get("mesh", options.get("devices")) is not None:
            raise XStencilError(f"{call}: mesh= (devices) is not supported with grid= yet")
        self._lay, self._at = layout(call, obj, grid, at, options.pop("boundary", None),
                                     options.pop("fill_value", None), options.get("period"))
        lay = self._lay
        for k in ("window", "stride"):
            if k in options:
                options[k] = _by_axis(lay, options[k], k)
        options["period"] = _period(lay, options.get("period"))
        self._spec = lay.spec(self._at)  # a scan's spec lets it read along its dim
        self._make, self._options = make, options
        self._assigned: list[tuple[bool, Any, Any]] = []  # (by label, key, kernel)
        self._names: tuple[str, ...] = ()  # of the kernels' dict results (set by _build)

    def __repr__(self) -> str:
        return f"<xstencil grid mesh at {self._at}, {len(self._assigned)} region(s)>"

    def _assign(self, by_label: bool, key: Any, kernel: Any) -> None:
        _check_kernel(self._lay.call, kernel)
        self._assigned.append((by_label, self._lay.rename_key(key, self._at), kernel))
        self._build(probe=False)  # check the selector now, as a plain mesh does

    def _build(self, probe: bool = True, args: Any = (), kwargs: Any = None,
               dim: str | None = None) -> Any:
        lay = self._lay
        spec = self._spec if dim is None else lay.spec(self._at, dim)
        if probe:
            self._names = _include(lay, [k for _, _, k in self._assigned], spec, args,
                                   kwargs or {}, dim)
        m = self._make(lay.plain, boundary=lay.boundary, fill_value=lay.fill_value,
                       **self._options)
        for by_label, key, kernel in self._assigned:
            if by_label:
                m.loc[key] = wrap(kernel, spec)
            else:
                m[key] = wrap(kernel, spec)
        return m

    def __setitem__(self, key: Any, kernel: Callable[..., Any]) -> None:
        self._assign(False, key, kernel)

    @property
    def loc(self) -> Any:
        """Select by coordinate label: ``m.loc[{"y_g": 0.0}] = f``."""
        return _GridLoc(self)

    def _restore(self, res: Any) -> Any:
        return restore(self._lay, res, dict.fromkeys(self._names, self._at), self._at)

    def map(self, *args: Any, **kwargs: Any) -> Any:
        """Run the mesh; see :meth:`xstencil.Mesh.map`."""
        return self._restore(self._build(True, args, kwargs).map(*args, **kwargs))

    def scan(self, *args: Any, **kwargs: Any) -> Any:
        """Run the mesh as a scan; see :meth:`xstencil.Mesh.scan`."""
        dim = args[0] if args else kwargs.get("dim", "time")
        extra = {k: v for k, v in kwargs.items() if k not in _SCAN_OPTIONS}
        m = self._build(True, args[1:], extra, dim)
        _check_scan_outputs(self._lay, self._names, self._at)
        return self._restore(m.scan(*args, **kwargs))


class _GridLoc:
    def __init__(self, m: GridMesh):
        self._m = m

    def __setitem__(self, key: Any, kernel: Callable[..., Any]) -> None:
        self._m._assign(True, key, kernel)

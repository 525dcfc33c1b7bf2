"""``xarray.DataArray`` and ``xarray.Dataset`` as JAX pytrees.

``import xstencil`` registers both types, so ``jax.jit``, ``jax.grad`` and
``jax.vmap`` accept functions that take and return labelled objects:

* the leaves are the data arrays (one per data variable of a Dataset, in
  ``data_vars`` order);
* dims, coords (all of them, as a static coordinate set), attrs and name are
  static auxiliary data, compared with ``identical``/``array_equal`` so that
  jit caches on them.  Coordinates must therefore be concrete (numpy) values.

When a transform hands back leaves with more dims than the object had (the
batch axis of ``vmap``), the extra leading dims are named ``"batch"``,
``"batch_1"``, ..., skipping names the object already has.  The mapped dim's
own name and coordinate are not known on the way out (inside ``vmap`` the
object has lost that dim): rename and reassign them, e.g.
``out.rename(batch="time").assign_coords(time=da.time)``.  Leaves that are
not arrays (placeholders JAX uses internally) are kept aside and returned
unchanged by the next flatten.

A 64-bit leaf that comes back 32-bit inside a transform (JAX's x64 flag is
off, so ``jax.jit`` and the ``lax`` loops convert it at their boundary) warns
with :class:`~xstencil._labelled.dtypes.PrecisionWarning`: the static part
records which leaves were 64-bit (not compared, so loop carries keep one
structure).

If another library registered either type first, xstencil keeps that
registration and warns with :class:`PytreeRegistrationWarning`: JAX allows one
registration per type, and the other library's rules then apply.
"""

from __future__ import annotations

import warnings
from collections.abc import Hashable, Mapping
from typing import Any

import jax
import numpy as np
import xarray as xr

from xstencil._labelled.dtypes import warn_narrowed

__all__ = ["LabelledStatic", "PytreeRegistrationWarning", "register"]

_LEAF = "__xstencil_pytree_leaf__"  # where a non-array leaf waits for the next flatten

try:  # the tracer vmap hands the function: its batch_dim says which axis it maps
    from jax._src.interpreters.batching import BatchTracer as _BatchTracer
except ImportError:  # pragma: no cover - JAX moved it: the leading-axis rule
    _BatchTracer = None


class PytreeRegistrationWarning(UserWarning):
    """xarray types were registered as JAX pytrees by another library first."""


def _equal(a: Any, b: Any) -> bool:
    """Equality for attrs values (arrays compare elementwise, NaN-aware)."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray | np.generic) or isinstance(b, np.ndarray | np.generic):
        try:
            return bool(np.array_equal(a, b, equal_nan=True))
        except TypeError:
            return bool(np.array_equal(a, b))
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(
            _equal(x, y) for x, y in zip(a, b, strict=True))
    try:
        return bool(a == b)
    except Exception:  # an object whose == is not a bool
        return a is b


class LabelledStatic:
    """The static part of a DataArray or Dataset: hashable and comparable, so
    it can be pytree auxiliary data (and a jit cache key).

    ``__eq__`` compares dims, names and attrs by value and the coordinate
    variables with ``identical`` and their dtypes (identity first, so the
    common case of the same coordinates is cheap; ``identical`` holds int64
    and float64 labels of equal values equal, and a jitted call then gave back
    the first call's coordinate dtype); ``__hash__`` uses only dims, names and
    coord shapes.
    """

    __slots__ = ("kind", "names", "dims", "attrs", "obj_attrs", "name", "coords", "indexes",
                 "_hash", "wide", "shapes")

    def __init__(self, kind: str, names: tuple[Hashable, ...], dims: tuple[tuple[Any, ...], ...],
                 attrs: tuple[dict[Any, Any], ...], obj_attrs: dict[Any, Any], name: Hashable,
                 coords: dict[Hashable, xr.Variable], indexes: dict[Hashable, Any]):
        self.kind, self.names, self.dims, self.attrs = kind, names, dims, attrs
        self.obj_attrs, self.name = obj_attrs, name
        self.coords, self.indexes = coords, indexes
        self.wide: tuple[Any, ...] = ()  # per leaf: its dtype if 64-bit (not compared)
        self.shapes: tuple[Any, ...] = ()  # per leaf: its shape when flattened (not compared)
        shapes = tuple((k, v.dims, v.shape) for k, v in coords.items())
        self._hash = hash((kind, names, dims, name, shapes))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LabelledStatic):
            return NotImplemented
        if self is other:
            return True
        return (self._hash == other._hash and self.kind == other.kind
                and self.names == other.names and self.dims == other.dims
                and _equal(self.name, other.name)
                and _equal(self.obj_attrs, other.obj_attrs)
                and all(_equal(a, b) for a, b in zip(self.attrs, other.attrs, strict=True))
                and self.coords.keys() == other.coords.keys()
                and all(v is other.coords[k] or (v.dtype == other.coords[k].dtype
                                                 and v.identical(other.coords[k]))
                        for k, v in self.coords.items()))

    def __repr__(self) -> str:
        return f"LabelledStatic({self.kind}, dims={self.dims!r}, names={self.names!r})"


def _is_array(x: Any) -> bool:
    return isinstance(x, jax.Array | jax.core.Tracer | np.ndarray | np.generic)


def _mapped_away(leaf: Any, dims: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """The dims ``leaf`` still has inside ``vmap``: JAX hands the function a
    tracer per vmap level whose ``batch_dim`` says which axis of the level
    below it maps over (``in_axes=1`` maps over the second dim, not the
    first).  ``None`` where that cannot be read."""
    chain = []
    x = leaf
    # down to the level the object was flattened at (an outer vmap's object
    # has already lost its own mapped dims)
    while _BatchTracer is not None and isinstance(x, _BatchTracer) and np.ndim(x) < len(dims):
        chain.append(getattr(x, "batch_dim", None))
        x = getattr(x, "val", None)
    if not chain or np.ndim(x) != len(dims):
        return None
    kept = list(dims)
    for axis in reversed(chain):  # the outermost vmap first
        if axis is None:
            continue
        if not isinstance(axis, int) or not 0 <= axis < len(kept):
            return None
        del kept[axis]
    return tuple(kept) if len(kept) == np.ndim(leaf) else None


def _batch_at(leaf: Any, dims: tuple[Any, ...], shape: tuple[int, ...] | None) -> int:
    """Where vmap put the batch axis of ``leaf`` on the way out: first (its
    default), unless the per-example ``shape`` recorded inside shows that
    ``out_axes`` put it elsewhere (a batch of equal size elsewhere cannot be
    told apart from the first: see the pytree notes)."""
    full = tuple(np.shape(leaf))
    if shape is None or full[1:] == tuple(shape):
        return 0
    spots = [p for p in range(len(full)) if full[:p] + full[p + 1:] == tuple(shape)]
    return spots[0] if len(spots) == 1 else 0


def _variable(leaf: Any, dims: tuple[Any, ...], attrs: dict[Any, Any],
              shape: tuple[int, ...] | None = None) -> xr.Variable:
    """A Variable holding ``leaf``.  An extra dim (vmap's batch axis on the
    way out) is named batch, batch_1, ... (where ``out_axes`` put it, if the
    per-example ``shape`` shows it); missing dims (inside vmap) are the ones
    vmap maps over (``in_axes``), else the leading ones."""
    if _is_array(leaf):
        extra = np.ndim(leaf) - len(dims)
        if extra == 1:
            at = _batch_at(leaf, dims, shape)
            names = tuple(dims[:at]) + _batch_names(1, dims) + tuple(dims[at:])
            return xr.Variable(names, leaf, dict(attrs), fastpath=True)
        if extra >= 0:
            names = _batch_names(extra, dims)
            return xr.Variable(names + tuple(dims), leaf, dict(attrs), fastpath=True)
        kept = _mapped_away(leaf, tuple(dims))
        return xr.Variable(kept if kept is not None else tuple(dims)[-extra:], leaf,
                           dict(attrs), fastpath=True)
    # not an array (a JAX placeholder, a ShapeDtypeStruct, ...): a stand-in of
    # the right shape if known, with the leaf kept for the next flatten
    shape = tuple(getattr(leaf, "shape", ()))
    if len(shape) != len(dims):
        shape = (0,) * len(dims)
    dtype = getattr(leaf, "dtype", np.float32)
    try:
        stub = np.broadcast_to(np.zeros((), dtype), shape)
    except TypeError:
        stub = np.broadcast_to(np.zeros((), np.float32), shape)
    return xr.Variable(dims, stub, {**attrs, _LEAF: leaf})


def _batch_names(n: int, dims: tuple[Any, ...]) -> tuple[str, ...]:
    """``n`` names for new leading (batch) dims: batch, batch_1, ..., skipping
    names the object already uses (``vmap`` over data with a dim called
    "batch" must not give two dims of one name)."""
    out: list[str] = []
    i = 0
    while len(out) < n:
        name = "batch" if i == 0 else f"batch_{i}"
        if name not in dims:
            out.append(name)
        i += 1
    return tuple(out)


def _coords_for(static: LabelledStatic, sizes: Mapping[Any, int]
                ) -> tuple[dict[Hashable, xr.Variable], dict[Hashable, Any], bool]:
    """Shallow copies of the coordinates that fit ``sizes`` (inside vmap, the
    coordinates along the mapped dims are gone), their indexes, and whether
    every kept coordinate agrees with ``sizes``."""
    coords, consistent = {}, True
    for k, v in static.coords.items():
        if not set(v.dims) <= sizes.keys():
            continue
        consistent = consistent and all(sizes[d] == n for d, n in zip(v.dims, v.shape,
                                                                      strict=True))
        coords[k] = v.copy(deep=False)
    return coords, {k: i for k, i in static.indexes.items() if k in coords}, consistent


def _leaf(var: xr.Variable) -> tuple[Any, dict[Any, Any]]:
    attrs = dict(var.attrs)
    if _LEAF in attrs:
        return attrs.pop(_LEAF), attrs
    return var.data, attrs


def _shape(leaf: Any) -> tuple[int, ...] | None:
    shape = getattr(leaf, "shape", None)
    return tuple(shape) if shape is not None else None


def _wide(leaf: Any) -> Any:
    """The leaf's dtype if it is a concrete 64-bit array, else None."""
    if isinstance(leaf, np.ndarray | np.generic | jax.Array) \
            and not isinstance(leaf, jax.core.Tracer) and leaf.dtype.itemsize >= 8 \
            and leaf.dtype.kind in "iufc":
        return leaf.dtype
    return None


def _static_coords(obj: xr.DataArray | xr.Dataset) -> tuple[dict[Hashable, xr.Variable],
                                                            dict[Hashable, Any]]:
    return dict(obj.coords.variables), dict(obj.xindexes)


def flatten_dataarray(da: xr.DataArray) -> tuple[tuple[Any], LabelledStatic]:
    leaf, attrs = _leaf(da.variable)
    static = LabelledStatic("DataArray", (), (tuple(da.dims),), (attrs,), {}, da.name,
                            *_static_coords(da))
    static.wide = (_wide(leaf),)
    static.shapes = (_shape(leaf),)
    return (leaf,), static


def unflatten_dataarray(static: LabelledStatic, leaves: Any) -> xr.DataArray:
    (leaf,) = leaves
    if static.wide:
        warn_narrowed(static.wide[0], leaf)
    var = _variable(leaf, static.dims[0], static.attrs[0],
                    static.shapes[0] if static.shapes else None)
    coords, indexes, consistent = _coords_for(static, dict(zip(var.dims, var.shape,
                                                               strict=True)))
    if consistent:
        try:
            return xr.DataArray._construct_direct(var, coords, static.name, indexes)
        except (AttributeError, TypeError):  # xarray internals moved: the public way
            pass
    return xr.DataArray(var.data, dims=var.dims, coords=xr.Coordinates(coords, indexes),
                        attrs=var.attrs, name=static.name)


def flatten_dataset(ds: xr.Dataset) -> tuple[tuple[Any, ...], LabelledStatic]:
    names = tuple(ds.data_vars)
    leaves, attrs, dims = [], [], []
    variables = ds.variables
    for n in names:
        leaf, a = _leaf(variables[n])
        leaves.append(leaf)
        attrs.append(a)
        dims.append(tuple(variables[n].dims))
    static = LabelledStatic("Dataset", names, tuple(dims), tuple(attrs), dict(ds.attrs), None,
                            *_static_coords(ds))
    static.wide = tuple(_wide(leaf) for leaf in leaves)
    static.shapes = tuple(_shape(leaf) for leaf in leaves)
    return tuple(leaves), static


def unflatten_dataset(static: LabelledStatic, leaves: Any) -> xr.Dataset:
    for dt, leaf in zip(static.wide, leaves, strict=False):
        warn_narrowed(dt, leaf)
    shapes = static.shapes or (None,) * len(static.names)
    variables = {n: _variable(leaf, d, a, sh) for n, leaf, d, a, sh in
                 zip(static.names, leaves, static.dims, static.attrs, shapes, strict=True)}
    sizes: dict[Any, int] = {}
    for v in variables.values():
        sizes.update(zip(v.dims, v.shape, strict=True))
    gone = {d for v, dims in zip(variables.values(), static.dims, strict=True)
            for d in dims if d not in v.dims}
    for v in static.coords.values():  # dims that only coordinates have
        if not set(v.dims) & gone:
            sizes.update((d, n) for d, n in zip(v.dims, v.shape, strict=True) if d not in sizes)
    coords, indexes, consistent = _coords_for(static, sizes)
    if consistent:
        try:
            return xr.Dataset._construct_direct({**variables, **coords}, set(coords),
                                                attrs=dict(static.obj_attrs), indexes=indexes)
        except (AttributeError, TypeError, ValueError):  # the public way (and its errors)
            pass
    return xr.Dataset(variables, coords=xr.Coordinates(coords, indexes),
                      attrs=dict(static.obj_attrs))


def _registered_by_us(cls: type) -> bool | None:
    """True/False when ``cls`` is a pytree node registered by us/someone else;
    None when it is a plain leaf (not registered)."""
    probe = cls(np.zeros(1), dims="x") if cls is xr.DataArray else cls({"v": ("x", np.zeros(1))})
    leaves, treedef = jax.tree_util.tree_flatten(probe)
    if len(leaves) == 1 and leaves[0] is probe:
        return None
    node = treedef.node_data()
    aux = node[1] if node is not None else None
    return type(aux).__qualname__ == LabelledStatic.__qualname__ and \
        type(aux).__module__ == LabelledStatic.__module__


def register() -> None:
    """Register DataArray and Dataset as JAX pytrees, unless another library
    already did (then warn with :class:`PytreeRegistrationWarning` and keep
    theirs).  ``import xstencil`` calls it; calling it again does nothing.

    Examples
    --------
    >>> import jax, numpy as np, xarray as xr, xstencil
    >>> da = xr.DataArray(np.arange(3, dtype=np.float32), dims="x",
    ...                   coords={"x": [0, 1, 2]}, name="u")
    >>> out = jax.jit(lambda d: d.stencil.map(lambda u: u(x=1), boundary="periodic"))(da)
    >>> out.name, out.dims, out.values
    ('u', ('x',), array([1., 2., 0.], dtype=float32))
    >>> g = jax.grad(lambda d: (d ** 2).sum().data)(da)
    >>> g.values
    array([0., 2., 4.], dtype=float32)
    """
    for cls, flat, unflat in ((xr.DataArray, flatten_dataarray, unflatten_dataarray),
                              (xr.Dataset, flatten_dataset, unflatten_dataset)):
        state = _registered_by_us(cls)
        if state is True:
            continue
        if state is None:
            try:
                jax.tree_util.register_pytree_node(cls, flat, unflat)
                continue
            except ValueError:  # registered between the check and now
                pass
        warnings.warn(
            f"xstencil: xarray.{cls.__name__} is already registered as a JAX pytree by "
            f"another library, so xstencil keeps that registration; jax.jit/grad/vmap over "
            f"{cls.__name__}s follow that library's flatten rules, not xstencil's (data as "
            f"leaves; dims, coords, attrs and name static). To use xstencil's, import xstencil "
            f"before the other library or disable its registration.",
            PytreeRegistrationWarning, stacklevel=3,
        )

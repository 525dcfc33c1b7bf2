"""The element table behind :mod:`xstencil._engine.lift`.

A lifted window value is a grid of element ids (:class:`Lifted`); the
:class:`Table` maps ids to elements.  What an element is depends on the
algebra: a whole-field JAX array (:class:`ArrayAlgebra`, for lowering) or the
set of window cells it depends on (:class:`DepsAlgebra`, for the dependency
analysis of scans).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

__all__ = ["MAX_ELEMENT_OPS", "Unliftable", "Lifted", "Table", "ArrayAlgebra", "DepsAlgebra",
           "Algebra", "Abstract", "elem", "ids_of", "linear_mode", "linear_operator",
           "unread_zero_weight"]

# Upper bound on unrolled element operations before we give up and fall back.
MAX_ELEMENT_OPS = 60_000


class Unliftable(Exception):
    """The kernel cannot be lowered to shifted slices; use the fallback."""


class Lifted:
    """A per-cell value whose entries are element ids in a :class:`Table`."""

    __slots__ = ("ids", "dtype")

    def __init__(self, ids: np.ndarray, dtype: Any):
        self.ids = ids
        self.dtype = dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return self.ids.shape


class Table:
    """Elements by id.  Window cells are materialized lazily, on first use."""

    def __init__(self, algebra: Algebra):
        self.algebra = algebra
        self._values: list[Any] = []
        self._thunks: list[Callable[[], Any] | None] = []
        self.ops = 0

    def add_lazy(self, thunk: Callable[[], Any]) -> int:
        self._values.append(None)
        self._thunks.append(thunk)
        return len(self._values) - 1

    def add(self, value: Any) -> int:
        self._values.append(value)
        self._thunks.append(None)
        return len(self._values) - 1

    def get(self, i: int) -> Any:
        thunk = self._thunks[i]
        if thunk is not None:
            self._values[i] = thunk()
            self._thunks[i] = None
        return self._values[i]

    def count_op(self, n: int = 1) -> None:
        self.ops += n
        if self.ops > MAX_ELEMENT_OPS:
            raise Unliftable(
                f"the lowered kernel exceeds {MAX_ELEMENT_OPS} element operations"
            )

    def constant_ids(self, value: Any) -> np.ndarray:
        """Register every entry of a non-lifted value as a (lazy) element."""
        shape = np.shape(value)
        ids = np.empty(shape, dtype=np.int64)
        for idx in np.ndindex(*shape):
            ids[idx] = self.add_lazy(lambda idx=idx: self.algebra.constant(value, idx))
        return ids


class ArrayAlgebra:
    """Elements are JAX arrays (or scalars) over the output field."""

    @staticmethod
    def constant(value: Any, idx: tuple[int, ...]) -> Any:
        if isinstance(value, jax.core.Tracer):
            return value[idx] if idx else value
        return np.asarray(value)[idx]

    @staticmethod
    def apply(
        prim: Any, elems: Sequence[Any], params: dict[str, Any], dtypes: Sequence[Any]
    ) -> Any:
        arrays = []
        for e, dt in zip(elems, dtypes, strict=True):
            if isinstance(e, jax.Array | jax.core.Tracer):
                arrays.append(e if e.dtype == dt else lax.convert_element_type(e, dt))
            else:
                arrays.append(np.asarray(e, dtype=dt))
        if prim is lax.mul_p:
            arrays = unread_zero_weight(arrays)
            if not params:  # a product the engine makes (dot, prod, cumprod): JAX's params
                params = _mul_params()
        shapes = [np.shape(a) for a in arrays]
        if len(set(shapes)) > 1:
            target = np.broadcast_shapes(*shapes)
            arrays = [lax.broadcast_in_dim(a, target, _bdims(np.ndim(a), len(target)))
                      if np.shape(a) != target else a for a in arrays]
        out = prim.bind(*arrays, **params)
        return out


@functools.cache
def _mul_params() -> dict[str, Any]:
    """The params JAX gives ``a * b`` (jax 0.10's ``out_dtype=None``): its
    transpose rule needs them, so a bare ``mul_p.bind`` broke ``jax.grad``."""
    return dict(jax.make_jaxpr(lambda a, b: a * b)(1.0, 2.0).eqns[0].params)


_LINEAR: contextvars.ContextVar[bool] = contextvars.ContextVar("xstencil_linear_operator",
                                                               default=False)


@contextlib.contextmanager
def linear_operator() -> Iterator[None]:
    """Lower kernels traced in this block as the operator of a linear solve
    (``xstencil.solve``): a product with a weight of 0 is the plain product
    (:func:`unread_zero_weight` is off).  Its ``where`` has a condition that
    depends on the window values, that is on the unknown, which JAX cannot
    transpose: bicgstab and gmres, whose ``custom_linear_solve`` transposes
    the operator, failed with a bare ``AssertionError`` on a ``0.0 * u()``
    term.  A linear solve's iterates are finite while it converges."""
    token = _LINEAR.set(True)
    try:
        yield
    finally:
        _LINEAR.reset(token)


def linear_mode() -> bool:
    """Whether kernels are being lowered inside :func:`linear_operator`.  Part
    of every compile-cache key a map's lowering is stored under, since the
    lowering differs: a trace made inside a solve, reused by a map outside,
    read a NaN under a weight of 0 as NaN."""
    return _LINEAR.get()


def unread_zero_weight(arrays: list[Any]) -> list[Any]:
    """The operands of a product of a window value (a whole-field array) and
    a weight (a scalar that does not come from the window), where a weight of
    0 does not read its cell: a NaN or inf window value under a zero weight
    counts as 0, as in the dense lowerings (which drop cells of weight 0) and
    the loop backend (:mod:`xstencil._engine.loopgen`).  Finite values and
    nonzero weights are untouched, and so are derivatives there."""
    if linear_mode():  # the operator of a linear solve: see linear_operator
        return arrays
    a, b = arrays
    if np.ndim(a) == 0 and np.ndim(b) > 0:
        return unread_zero_weight([b, a])[::-1]
    if np.ndim(a) == 0 or np.ndim(b) != 0 or not jnp.issubdtype(jnp.result_type(a), jnp.floating):
        return arrays
    if not isinstance(b, jax.core.Tracer) and np.asarray(b) != 0:
        return arrays
    keep = (b != 0) | jnp.isfinite(a)
    return [jnp.where(keep, a, jnp.zeros((), a.dtype)), b]


def _bdims(ndim: int, target_ndim: int) -> tuple[int, ...]:
    return tuple(range(target_ndim - ndim, target_ndim))


class DepsAlgebra:
    """Elements are frozensets of the window cells they depend on."""

    @staticmethod
    def constant(value: Any, idx: tuple[int, ...]) -> Any:
        return frozenset()

    @staticmethod
    def apply(
        prim: Any, elems: Sequence[Any], params: dict[str, Any], dtypes: Sequence[Any]
    ) -> Any:
        out: frozenset = frozenset()
        for e in elems:
            if isinstance(e, frozenset):
                out = out | e
        return out


Algebra = ArrayAlgebra | DepsAlgebra


class Abstract:
    """A non-window value whose content is irrelevant (dependency analysis)."""

    def __init__(self, aval: Any):
        self.aval = aval
        self.shape = aval.shape
        self.dtype = aval.dtype

    def __getitem__(self, idx: Any) -> Abstract:
        return self


def elem(x: Any, idx: tuple[int, ...], table: Table) -> Any:
    if isinstance(x, Lifted):
        return table.get(int(x.ids[idx]))
    if isinstance(x, Abstract):
        return frozenset()
    if np.ndim(x) == 0:
        return table.algebra.constant(x, ())
    return table.algebra.constant(x, idx)


def ids_of(x: Any, table: Table) -> np.ndarray:
    if isinstance(x, Lifted):
        return x.ids
    if isinstance(x, Abstract):
        return abstract_ids(x, table)
    return table.constant_ids(x)


def abstract_ids(x: Abstract, table: Table) -> np.ndarray:
    ids = np.empty(x.shape, dtype=np.int64)
    for idx in np.ndindex(*x.shape):
        ids[idx] = table.add(frozenset())
    return ids

"""Lift a per-cell kernel to whole-field array operations.

The kernel is traced once, as a function of one *window* (a small array of
the window's shape).  The resulting jaxpr is then interpreted with every
window value held as an object grid of *elements*: one element per window
cell, where each element stands for a whole field (the shifted slice of the
padded data that this cell reads at every output position).

* Structural operations (slice, reshape, transpose, gather with constant
  indices, concatenate, pad, ...) only rearrange elements.  They are applied
  to integer id grids, so they cost nothing at run time.
* Elementwise operations are applied element by element: each becomes one
  whole-array operation, which XLA fuses into a single loop.
* Reductions, ``dot_general``, cumulative ops and ``sort`` are unrolled into
  elementwise operations (a sum tree, a sorting network, ...).

Anything else that touches a window value (data-dependent gathers, control
flow on window values, ...) raises :class:`Unliftable`, and the caller falls
back to evaluating the kernel per window with ``vmap``.

The same interpreter runs with an ``Algebra`` that tracks, instead of arrays,
the set of window cells each element depends on; that is how scans find out
which offsets a kernel reads.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax import lax
from jax.extend import core as jcore

__all__ = ["Unliftable", "Lifted", "ArrayAlgebra", "DepsAlgebra", "Table", "interpret"]

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
        shapes = [np.shape(a) for a in arrays]
        if len(set(shapes)) > 1:
            target = np.broadcast_shapes(*shapes)
            arrays = [lax.broadcast_in_dim(a, target, _bdims(np.ndim(a), len(target)))
                      if np.shape(a) != target else a for a in arrays]
        out = prim.bind(*arrays, **params)
        return out


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

# --------------------------------------------------------------------------
# primitive tables

_ELEMENTWISE = frozenset(
    """abs acos acosh add and asin asinh atan atan2 atanh cbrt ceil clamp
    conj convert_element_type cos cosh div eq erf erf_inv erfc exp exp2 expm1
    floor ge gt imag integer_pow is_finite le lgamma digamma log log1p logistic
    lt max min mul ne neg nextafter not or pow real reduce_precision rem round
    rsqrt select_n shift_left shift_right_arithmetic shift_right_logical sign
    sin sinh sqrt square stop_gradient sub tan tanh xor complex population_count
    clz bessel_i0e bessel_i1e copy copy_p optimization_barrier""".split()
)

# primitive name -> indices of operands that are data (rearranged), the rest
# must be concrete (e.g. gather indices).
_STRUCTURAL: dict[str, Callable[[int], tuple[int, ...]]] = {
    "slice": lambda n: (0,),
    "squeeze": lambda n: (0,),
    "reshape": lambda n: (0,),
    "transpose": lambda n: (0,),
    "broadcast_in_dim": lambda n: (0,),
    "rev": lambda n: (0,),
    "expand_dims": lambda n: (0,),
    "concatenate": lambda n: tuple(range(n)),
    "pad": lambda n: (0, 1),
    "gather": lambda n: (0,),
    "dynamic_slice": lambda n: (0,),
    "dynamic_update_slice": lambda n: (0, 1),
    "split": lambda n: (0,),
    "tile": lambda n: (0,),
}

_REDUCERS = {
    "reduce_sum": lax.add_p,
    "reduce_max": lax.max_p,
    "reduce_min": lax.min_p,
    "reduce_prod": lax.mul_p,
    "reduce_and": lax.and_p,
    "reduce_or": lax.or_p,
    "reduce_xor": lax.xor_p,
}

_CUMULATIVE = {
    "cumsum": lax.add_p,
    "cumprod": lax.mul_p,
    "cummax": lax.max_p,
    "cummin": lax.min_p,
}

_CALLS = {"jit", "pjit", "closed_call", "core_call", "custom_jvp_call",
          "custom_vjp_call", "custom_vjp_call_jaxpr", "remat", "checkpoint",
          "custom_lin"}


def _is_concrete(x: Any) -> bool:
    return not isinstance(x, jax.core.Tracer | Lifted | _Abstract)


def _sub_jaxpr(eqn: Any) -> tuple[Any, Sequence[Any]]:
    p = eqn.params
    for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        if key in p:
            j = p[key]
            if isinstance(j, jcore.ClosedJaxpr):
                return j.jaxpr, j.consts
            return j, ()
    raise Unliftable(f"cannot look inside {eqn.primitive.name!r}")


def interpret(jaxpr: Any, consts: Sequence[Any], args: Sequence[Any], table: Table) -> list[Any]:
    """Evaluate ``jaxpr`` where some arguments are :class:`Lifted`."""
    env: dict[Any, Any] = {}

    def read(v: Any) -> Any:
        if isinstance(v, jcore.Literal):
            return v.val
        return env[v]

    for v, x in zip(jaxpr.constvars, consts, strict=True):
        env[v] = x
    for v, x in zip(jaxpr.invars, args, strict=True):
        env[v] = x

    for eqn in jaxpr.eqns:
        invals = [read(v) for v in eqn.invars]
        if any(isinstance(x, Lifted) for x in invals):
            outs = _lifted_eqn(eqn, invals, table)
        else:
            outs = _plain_eqn(eqn, invals, table)
        for v, x in zip(eqn.outvars, outs, strict=True):
            env[v] = x
    return [read(v) for v in jaxpr.outvars]


def _plain_eqn(eqn: Any, invals: list[Any], table: Table) -> list[Any]:
    if isinstance(table.algebra, DepsAlgebra) and not all(map(_is_concrete, invals)):
        # Only shapes matter for the dependency analysis.
        return [_Abstract(v.aval) for v in eqn.outvars]
    if any(isinstance(x, _Abstract) for x in invals):
        return [_Abstract(v.aval) for v in eqn.outvars]
    params = eqn.primitive.get_bind_params(eqn.params)
    if all(map(_is_concrete, invals)):
        with jax.ensure_compile_time_eval():
            out = eqn.primitive.bind(*invals, **params)
    else:
        out = eqn.primitive.bind(*invals, **params)
    return list(out) if eqn.primitive.multiple_results else [out]


class _Abstract:
    """A non-window value whose content is irrelevant (dependency analysis)."""

    def __init__(self, aval: Any):
        self.aval = aval
        self.shape = aval.shape
        self.dtype = aval.dtype

    def __getitem__(self, idx: Any) -> _Abstract:
        return self


def _elem(x: Any, idx: tuple[int, ...], table: Table) -> Any:
    if isinstance(x, Lifted):
        return table.get(int(x.ids[idx]))
    if isinstance(x, _Abstract):
        return frozenset()
    if np.ndim(x) == 0:
        return table.algebra.constant(x, ())
    return table.algebra.constant(x, idx)


def _ids_of(x: Any, table: Table) -> np.ndarray:
    if isinstance(x, Lifted):
        return x.ids
    if isinstance(x, _Abstract):
        return _abstract_ids(x, table)
    return table.constant_ids(x)


def _abstract_ids(x: _Abstract, table: Table) -> np.ndarray:
    ids = np.empty(x.shape, dtype=np.int64)
    for idx in np.ndindex(*x.shape):
        ids[idx] = table.add(frozenset())
    return ids


def _lifted_eqn(eqn: Any, invals: list[Any], table: Table) -> list[Any]:
    name = eqn.primitive.name
    if name in _ELEMENTWISE:
        return [_elementwise(eqn, invals, table)]
    if name in _STRUCTURAL:
        return _structural(eqn, invals, table)
    if name in _REDUCERS:
        return [_reduce(_REDUCERS[name], eqn, invals[0], table)]
    if name in _CUMULATIVE:
        return [_cumulative(_CUMULATIVE[name], eqn, invals[0], table)]
    if name == "dot_general":
        return [_dot_general(eqn, invals, table)]
    if name in ("argmax", "argmin"):
        return [_argminmax(name, eqn, invals[0], table)]
    if name == "sort":
        return _sort(eqn, invals, table)
    if name in _CALLS:
        sub, consts = _sub_jaxpr(eqn)
        n_extra = len(invals) - len(sub.invars)
        return interpret(sub, consts, invals[n_extra:], table)
    raise Unliftable(f"primitive {name!r} applied to window values")


def _elementwise(eqn: Any, invals: list[Any], table: Table) -> Lifted:
    out_aval = eqn.outvars[0].aval
    shape = out_aval.shape
    in_dtypes = [getattr(v.aval, "dtype", None) if not isinstance(v, jcore.Literal)
                 else np.asarray(v.val).dtype for v in eqn.invars]
    ids = np.empty(shape, dtype=np.int64)
    params = eqn.params
    table.count_op(int(np.prod(shape)) if shape else 1)
    for idx in np.ndindex(*shape):
        elems = []
        for x in invals:
            xi = idx if np.ndim(x.ids if isinstance(x, Lifted) else x) else ()
            elems.append(_elem(x, xi, table))
        ids[idx] = table.add(table.algebra.apply(eqn.primitive, elems, params, in_dtypes))
    return Lifted(ids, out_aval.dtype)


def _structural(eqn: Any, invals: list[Any], table: Table) -> list[Lifted]:
    name = eqn.primitive.name
    data_pos = set(_STRUCTURAL[name](len(invals)))
    operands = []
    for i, x in enumerate(invals):
        if i in data_pos:
            operands.append(_ids_of(x, table).astype(np.int32))
        else:
            if not _is_concrete(x):
                raise Unliftable(f"{name!r} with indices that depend on the data")
            operands.append(x)
    params = dict(eqn.primitive.get_bind_params(eqn.params))
    if name == "gather" and params.get("fill_value") is not None:
        params["fill_value"] = -1
    with jax.ensure_compile_time_eval():
        out = eqn.primitive.bind(*operands, **params)
    outs = list(out) if eqn.primitive.multiple_results else [out]
    result = []
    for o, v in zip(outs, eqn.outvars, strict=True):
        ids = np.asarray(o).astype(np.int64)
        if ids.size and (ids.min() < 0):
            raise Unliftable(f"{name!r} reads outside its operand")
        result.append(Lifted(ids, v.aval.dtype))
    return result


def _combine(prim: Any, elems: list[Any], dtype: Any, table: Table) -> Any:
    """Balanced tree of a binary associative primitive."""
    table.count_op(max(len(elems) - 1, 0))
    while len(elems) > 1:
        nxt = [table.algebra.apply(prim, [elems[i], elems[i + 1]], {}, [dtype, dtype])
               for i in range(0, len(elems) - 1, 2)]
        if len(elems) % 2:
            nxt.append(elems[-1])
        elems = nxt
    return elems[0]


def _reduce(prim: Any, eqn: Any, x: Lifted, table: Table) -> Lifted:
    axes = tuple(eqn.params["axes"])
    dtype = eqn.outvars[0].aval.dtype
    keep = [d for d in range(x.ids.ndim) if d not in axes]
    moved = np.transpose(x.ids, keep + list(axes))
    out_shape = moved.shape[: len(keep)]
    flat = moved.reshape(out_shape + (-1,))
    ids = np.empty(out_shape, dtype=np.int64)
    for idx in np.ndindex(*out_shape):
        elems = [table.get(int(i)) for i in flat[idx]]
        ids[idx] = table.add(_combine(prim, elems, dtype, table))
    return Lifted(ids, dtype)


def _cumulative(prim: Any, eqn: Any, x: Lifted, table: Table) -> Lifted:
    axis, reverse = eqn.params["axis"], eqn.params["reverse"]
    dtype = eqn.outvars[0].aval.dtype
    moved = np.moveaxis(x.ids, axis, -1)
    out = np.empty_like(moved)
    table.count_op(moved.size)
    for idx in np.ndindex(*moved.shape[:-1]):
        line = list(moved[idx])
        order = range(len(line) - 1, -1, -1) if reverse else range(len(line))
        acc = None
        for k in order:
            e = table.get(int(line[k]))
            acc = e if acc is None else table.algebra.apply(prim, [acc, e], {}, [dtype, dtype])
            out[idx + (k,)] = table.add(acc)
    return Lifted(np.moveaxis(out, -1, axis), dtype)


def _dot_general(eqn: Any, invals: list[Any], table: Table) -> Lifted:
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    dtype = eqn.outvars[0].aval.dtype
    lhs, rhs = (_ids_of(x, table) for x in invals)
    lf = [d for d in range(lhs.ndim) if d not in lc and d not in lb]
    rf = [d for d in range(rhs.ndim) if d not in rc and d not in rb]
    lhs = np.transpose(lhs, list(lb) + lf + list(lc))
    rhs = np.transpose(rhs, list(rb) + rf + list(rc))
    nb, nlf, nrf = len(lb), len(lf), len(rf)
    out_shape = lhs.shape[: nb + nlf] + rhs.shape[nb: nb + nrf]
    csize = int(np.prod(lhs.shape[nb + nlf:], dtype=np.int64))
    lhs = lhs.reshape(lhs.shape[: nb + nlf] + (csize,))
    rhs = rhs.reshape(rhs.shape[: nb + nrf] + (csize,))
    mul = lax.mul_p
    ids = np.empty(out_shape, dtype=np.int64)
    table.count_op(int(np.prod(out_shape, dtype=np.int64)) * max(csize, 1))
    for idx in np.ndindex(*out_shape):
        b, li, ri = idx[:nb], idx[nb: nb + nlf], idx[nb + nlf:]
        terms = [
            table.algebra.apply(mul, [table.get(int(lhs[b + li + (k,)])),
                                      table.get(int(rhs[b + ri + (k,)]))], {}, [dtype, dtype])
            for k in range(csize)
        ]
        if not terms:
            terms = [table.algebra.constant(np.zeros((), dtype), ())]
        ids[idx] = table.add(_combine(lax.add_p, terms, dtype, table))
    return Lifted(ids, dtype)


def _argminmax(name: str, eqn: Any, x: Lifted, table: Table) -> Lifted:
    (axis,) = eqn.params["axes"]
    index_dtype = eqn.params["index_dtype"]
    vdt = x.dtype
    moved = np.moveaxis(x.ids, axis, -1)
    ids = np.empty(moved.shape[:-1], dtype=np.int64)
    better = lax.gt_p if name == "argmax" else lax.lt_p
    alg = table.algebra
    table.count_op(moved.size * 6)
    floating = np.issubdtype(np.dtype(vdt), np.inexact)
    for idx in np.ndindex(*moved.shape[:-1]):
        line = [table.get(int(i)) for i in moved[idx]]
        best, best_i = line[0], np.zeros((), index_dtype)
        for k, v in enumerate(line[1:], start=1):
            take = alg.apply(better, [v, best], {}, [vdt, vdt])
            if floating:  # the first NaN wins, as in lax.argmax
                v_nan = alg.apply(lax.ne_p, [v, v], {}, [vdt, vdt])
                b_ok = alg.apply(lax.eq_p, [best, best], {}, [vdt, vdt])
                take = alg.apply(lax.or_p, [take, alg.apply(lax.and_p, [v_nan, b_ok], {},
                                                            [np.bool_, np.bool_])],
                                 {}, [np.bool_, np.bool_])
            best = alg.apply(lax.select_n_p, [take, best, v], {}, [np.bool_, vdt, vdt])
            best_i = alg.apply(lax.select_n_p, [take, best_i, np.asarray(k, index_dtype)], {},
                               [np.bool_, index_dtype, index_dtype])
        ids[idx] = table.add(best_i)
    return Lifted(ids, index_dtype)


def _merge_network(n: int) -> list[tuple[int, int]]:
    """Batcher's odd-even merge sort comparators for ``n`` items."""
    pairs: list[tuple[int, int]] = []
    p = 1
    while p < n:
        k = p
        while k >= 1:
            for j in range(k % p, n - k, 2 * k):
                for i in range(min(k, n - j - k)):
                    if (i + j) // (2 * p) == (i + j + k) // (2 * p):
                        pairs.append((i + j, i + j + k))
            k //= 2
        p *= 2
    return pairs


def _sort(eqn: Any, invals: list[Any], table: Table) -> list[Lifted]:
    dim = eqn.params["dimension"]
    num_keys = eqn.params["num_keys"]
    dtypes = [v.aval.dtype for v in eqn.outvars]
    grids = [np.moveaxis(_ids_of(x, table), dim, -1) for x in invals]
    outs = [np.empty_like(g) for g in grids]
    alg = table.algebra
    n = grids[0].shape[-1]
    network = _merge_network(n)
    table.count_op(grids[0].size // max(n, 1) * len(network) * (2 * len(grids) + 2 * num_keys))
    for idx in np.ndindex(*grids[0].shape[:-1]):
        cols = [[table.get(int(i)) for i in g[idx]] for g in grids]
        for a, b in network:
            # swap when (key_b, ...) < (key_a, ...), lexicographically on the keys
            swap, tie = None, None
            for k in range(num_keys):
                dt = dtypes[k]
                lt = alg.apply(lax.lt_p, [cols[k][b], cols[k][a]], {}, [dt, dt])
                term = lt if tie is None else alg.apply(lax.and_p, [tie, lt], {}, [bool, bool])
                swap = term if swap is None else alg.apply(lax.or_p, [swap, term], {},
                                                           [bool, bool])
                if k + 1 < num_keys:
                    eq = alg.apply(lax.eq_p, [cols[k][b], cols[k][a]], {}, [dt, dt])
                    tie = eq if tie is None else alg.apply(lax.and_p, [tie, eq], {}, [bool, bool])
            for c, dt in zip(cols, dtypes, strict=True):
                ea, eb = c[a], c[b]
                c[a] = alg.apply(lax.select_n_p, [swap, ea, eb], {}, [bool, dt, dt])
                c[b] = alg.apply(lax.select_n_p, [swap, eb, ea], {}, [bool, dt, dt])
        for c, o in zip(cols, outs, strict=True):
            for k, e in enumerate(c):
                o[idx + (k,)] = table.add(e)
    return [Lifted(np.moveaxis(o, -1, dim), dt) for o, dt in zip(outs, dtypes, strict=True)]


def cell_grid(table: Table, shape: tuple[int, ...], make: Callable[[tuple[int, ...]], Any],
              dtype: Any) -> Lifted:
    """A lifted window whose cell ``idx`` is ``make(idx)`` (created lazily)."""
    ids = np.empty(shape, dtype=np.int64)
    for idx in itertools.product(*(range(s) for s in shape)):
        ids[idx] = table.add_lazy(lambda idx=idx: make(idx))
    return Lifted(ids, dtype)

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

from xstencil._engine.elements import (
    MAX_ELEMENT_OPS,
    Abstract,
    Algebra,
    ArrayAlgebra,
    DepsAlgebra,
    Lifted,
    Table,
    Unliftable,
    elem,
    ids_of,
)
from xstencil._engine.unroll import argminmax, cumulative, dot_general, reduce, sort

__all__ = ["MAX_ELEMENT_OPS", "Unliftable", "Lifted", "ArrayAlgebra", "DepsAlgebra", "Algebra",
           "Table", "Abstract", "interpret", "cell_grid"]


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
    return not isinstance(x, jax.core.Tracer | Lifted | Abstract)


def sub_jaxpr(eqn: Any) -> tuple[Any, Sequence[Any]]:
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
        return [Abstract(v.aval) for v in eqn.outvars]
    if any(isinstance(x, Abstract) for x in invals):
        return [Abstract(v.aval) for v in eqn.outvars]
    params = eqn.primitive.get_bind_params(eqn.params)
    if all(map(_is_concrete, invals)):
        with jax.ensure_compile_time_eval():
            out = eqn.primitive.bind(*invals, **params)
    else:
        out = eqn.primitive.bind(*invals, **params)
    return list(out) if eqn.primitive.multiple_results else [out]


def _lifted_eqn(eqn: Any, invals: list[Any], table: Table) -> list[Any]:
    name = eqn.primitive.name
    if name in _ELEMENTWISE:
        return [_elementwise(eqn, invals, table)]
    if name in _STRUCTURAL:
        return _structural(eqn, invals, table)
    if name in _REDUCERS:
        return [reduce(_REDUCERS[name], eqn, invals[0], table)]
    if name in _CUMULATIVE:
        return [cumulative(_CUMULATIVE[name], eqn, invals[0], table)]
    if name == "dot_general":
        return [dot_general(eqn, invals, table)]
    if name in ("argmax", "argmin"):
        return [argminmax(name, eqn, invals[0], table)]
    if name == "sort":
        return sort(eqn, invals, table)
    if name in _CALLS:
        sub, consts = sub_jaxpr(eqn)
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
    # lax ops broadcast size-1 dims of equal-rank operands (jnp.var,
    # x / x.sum(keepdims=True)): read element 0 along those dims
    in_shapes = [np.shape(x.ids if isinstance(x, Lifted) else x) for x in invals]
    for idx in np.ndindex(*shape):
        elems = []
        for x, xs in zip(invals, in_shapes, strict=True):
            xi = tuple(0 if n == 1 else i
                       for i, n in zip(idx[len(idx) - len(xs):], xs, strict=True))
            elems.append(elem(x, xi, table))
        ids[idx] = table.add(table.algebra.apply(eqn.primitive, elems, params, in_dtypes))
    return Lifted(ids, out_aval.dtype)


def _structural(eqn: Any, invals: list[Any], table: Table) -> list[Lifted]:
    name = eqn.primitive.name
    data_pos = set(_STRUCTURAL[name](len(invals)))
    operands = []
    for i, x in enumerate(invals):
        if i in data_pos:
            operands.append(ids_of(x, table).astype(np.int32))
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


def cell_grid(table: Table, shape: tuple[int, ...], make: Callable[[tuple[int, ...]], Any],
              dtype: Any) -> Lifted:
    """A lifted window whose cell ``idx`` is ``make(idx)`` (created lazily)."""
    ids = np.empty(shape, dtype=np.int64)
    for idx in itertools.product(*(range(s) for s in shape)):
        ids[idx] = table.add_lazy(lambda idx=idx: make(idx))
    return Lifted(ids, dtype)

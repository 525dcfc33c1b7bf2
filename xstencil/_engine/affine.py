"""Linear window sums whose weights are only known at run time.

Arrays a kernel closes over are inputs of the compiled program
(:mod:`xstencil._engine.kcache`), so in ``lambda u: (u * w).sum()`` the
weights ``w`` are traced values, not constants, and
:func:`xstencil._engine.linear.weights` cannot read them.  This module
splits the question in two:

* :func:`is_affine` decides *symbolically*, from the jaxpr alone, that every
  output is ``sum(W * u) + b`` where ``W`` and ``b`` may depend on anything
  but the window cells: cells may only flow through linear operations (sums,
  rearrangements, a product with or a division by a value that depends on no
  cell, a selection whose predicate depends on no cell, a cast to a float
  at least as wide as every output: a narrower one rounds, which is not
  linear, and the lowering rounds the cells to the output's dtype only);
* :func:`runtime_weights` then computes ``W`` and ``b`` *inside* the program,
  from the current values: ``b`` is the kernel at a zero window and ``W`` its
  derivative there (one ``jax.vjp``; a kernel that is affine has that
  derivative everywhere).  So new weight values give new answers with no
  recompile and nothing can go stale, and gradients with respect to the
  weights flow through.

Custom derivative rules (``custom_jvp``/``custom_vjp``), ``stop_gradient``
and control flow on cell values are refused: there the derivative need not
be the function.

Integer sums (outputs of one integer dtype) have no derivative, but their
arithmetic is exact modulo ``2**bits``: :func:`integer_affine` decides,
from the jaxpr alone, that every operation on cell values is in the output's
dtype (after casts into it of cells that were only rearranged, from dtypes
that cast into it exactly), so each output is affine in the cells modulo
``2**bits``, and :func:`runtime_weights` then reads ``W`` from the kernel at
one-hot windows (``W[c] = f(e_c) - f(0)``, exact in that arithmetic).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jcore

from xstencil._engine.linear import drops_value, width

__all__ = ["is_affine", "integer_affine", "homogeneous", "runtime_weights", "MAX_JACFWD"]

#: ``(window cells) ** 2`` above which a kernel that widens its cells' dtype
#: (float32 cells, float64 output) is not given runtime weights (see
#: :func:`runtime_weights`); such kernels keep the generic lowering.
MAX_JACFWD = 2**22

# primitives linear in every operand (the operands that may carry cells)
_UNARY = frozenset({"neg", "copy", "copy_p", "slice", "squeeze", "reshape",
                    "transpose", "broadcast_in_dim", "rev", "expand_dims", "reduce_sum",
                    "cumsum", "split"})
_JOINT = frozenset({"add", "sub", "add_any", "concatenate", "pad", "optimization_barrier"})
# primitive -> the operand positions that may carry cells (the others, indices or
# predicates, must depend on no cell)
_DATA_AT = {"select_n": lambda n: range(1, n), "gather": lambda n: (0,),
            "dynamic_slice": lambda n: (0,), "dynamic_update_slice": lambda n: (0, 1),
            "scatter-add": lambda n: (0, 2), "scatter_add": lambda n: (0, 2)}
_CALLS = frozenset({"jit", "pjit", "closed_call", "core_call", "remat", "checkpoint"})
_SCATTER_ADD = frozenset({"scatter-add", "scatter_add"})  # the one scatter that is a sum


class _NotAffine(Exception):
    pass


def is_affine(closed: Any, n_cells: int) -> bool:
    """Whether every output of ``closed`` (a ClosedJaxpr whose first
    ``n_cells`` inputs are the window cells) is a floating scalar affine in
    the cells, with coefficients that depend on no cell."""
    jaxpr = closed.jaxpr
    tags = [True] * n_cells + [False] * (len(jaxpr.invars) - n_cells)
    widest = max((width(v.aval.dtype) for v in jaxpr.outvars), default=0)
    try:
        _tags(jaxpr, tags, widest)
    except _NotAffine:
        return False
    return all(v.aval.shape == () and np.dtype(v.aval.dtype).kind in "fc"
               for v in jaxpr.outvars)


def _walk(jaxpr: Any, args: Sequence[Any], rule: Callable[[Any, list[Any]], list[Any]],
          none: Any) -> list[Any]:
    """The tags of ``jaxpr``'s outputs, given its inputs' ``args``: ``none``
    for a value that depends on no cell, else what ``rule(eqn, ins)`` gives
    each equation's outputs from its inputs' tags (raising
    :class:`_NotAffine` where a cell reaches an operation it refuses)."""
    env: dict[Any, Any] = dict.fromkeys(jaxpr.constvars, none)
    env.update(zip(jaxpr.invars, args, strict=True))

    def read(v: Any) -> Any:
        return none if isinstance(v, jcore.Literal) else env[v]

    for eqn in jaxpr.eqns:
        ins = [read(v) for v in eqn.invars]
        if any(t is not none for t in ins):
            outs = rule(eqn, ins)
        else:
            outs = [none] * len(eqn.outvars)
        env.update(zip(eqn.outvars, outs, strict=True))
    return [read(v) for v in jaxpr.outvars]


def _tags(jaxpr: Any, args: Sequence[bool], widest: int) -> list[bool]:
    """Which values depend on a cell (``True``: affinely); raises
    :class:`_NotAffine` where a cell reaches a non-linear operation
    (``widest``: the itemsize of the widest output)."""
    return _walk(jaxpr, args, lambda eqn, ins: _eqn(eqn, ins, widest), False)


def _called(eqn: Any) -> Any:
    """The jaxpr a call equation (:data:`_CALLS`) runs; :class:`_NotAffine`
    where it has none to read."""
    sub = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr"))
    if sub is None:
        raise _NotAffine
    return sub.jaxpr if isinstance(sub, jcore.ClosedJaxpr) else sub


def _eqn(eqn: Any, ins: list[bool], widest: int) -> list[bool]:
    name = eqn.primitive.name
    n_out = len(eqn.outvars)
    if name in _CALLS:
        sub = _called(eqn)
        return _tags(sub, ins[len(ins) - len(sub.invars):], widest)
    if name == "optimization_barrier":
        return list(ins)
    if name in _UNARY or name in _JOINT:
        return [True] * n_out
    if name == "convert_element_type":
        if drops_value(eqn.params["new_dtype"], eqn.invars[0].aval.dtype, widest):
            raise _NotAffine
        return [True]
    if name in ("mul", "dot_general"):
        if all(ins):
            raise _NotAffine  # a product of two cell values
        return [True]
    if name == "div":
        if ins[1]:
            raise _NotAffine
        return [True]
    if name in _DATA_AT:
        data = set(_DATA_AT[name](len(ins)))
        if any(t for i, t in enumerate(ins) if i not in data):
            raise _NotAffine  # an index or predicate computed from cells
        return [True] * n_out
    raise _NotAffine


#: Primitives that only move values (an integer cell moved is still a cell:
#: :func:`integer_affine` lets it be cast into the output's dtype afterwards).
_MOVES = frozenset({"copy", "copy_p", "slice", "squeeze", "reshape", "transpose",
                    "broadcast_in_dim", "rev", "expand_dims", "split", "concatenate", "pad"})
#: Primitives that add or negate (in the output's integer dtype only).
_SUMS = frozenset({"neg", "reduce_sum", "cumsum", "add", "sub", "add_any"})
_RAW, _SUM = "raw", "sum"  # a cell moved only / affine in the output's dtype


def integer_affine(closed: Any, n_cells: int) -> np.dtype | None:
    """The integer dtype ``D`` of ``closed``'s outputs where every output
    is a scalar of ``D`` affine in the cells modulo ``2**bits`` (see the
    module notes), else ``None``: cells may be moved in their own dtype,
    cast into ``D`` where that keeps every value (``np.can_cast(...,
    "safe")``), and from then on only summed, negated, moved, multiplied by
    or selected with values that depend on no cell, all in ``D``."""
    jaxpr = closed.jaxpr
    dtypes = {np.dtype(v.aval.dtype) for v in jaxpr.outvars}
    if len(dtypes) != 1 or not np.issubdtype(next(iter(dtypes)), np.integer):
        return None
    dt = next(iter(dtypes))
    if any(v.aval.shape != () for v in jaxpr.outvars):
        return None
    args = [_SUM if np.dtype(v.aval.dtype) == dt else _RAW for v in jaxpr.invars[:n_cells]]
    try:
        outs = _int_tags(jaxpr, args + [None] * (len(jaxpr.invars) - n_cells), dt)
    except _NotAffine:
        return None
    return dt if all(t in (_SUM, None) for t in outs) else None


def _int_tags(jaxpr: Any, args: Sequence[str | None], dt: np.dtype) -> list[str | None]:
    """Per value: ``None`` (depends on no cell), :data:`_RAW` or
    :data:`_SUM`; raises :class:`_NotAffine` where a cell value meets an
    operation that is not affine modulo ``2**bits`` in ``dt``."""
    return _walk(jaxpr, args, lambda eqn, ins: _int_eqn(eqn, ins, dt), None)


def _int_eqn(eqn: Any, ins: list[str | None], dt: np.dtype) -> list[str | None]:
    name = eqn.primitive.name
    n_out = len(eqn.outvars)
    cells = {t for t in ins if t is not None}
    in_dt = all(np.dtype(v.aval.dtype) == dt for v in eqn.outvars)
    if name in _CALLS:
        sub = _called(eqn)
        return _int_tags(sub, ins[len(ins) - len(sub.invars):], dt)
    if name == "optimization_barrier":
        return list(ins)
    if name == "convert_element_type":
        src = np.dtype(eqn.invars[0].aval.dtype)
        if np.dtype(eqn.params["new_dtype"]) != dt or not np.can_cast(src, dt, "safe"):
            raise _NotAffine  # a cast that can change a value, or out of the sum's dtype
        return [_SUM]
    if len(cells) != 1:
        raise _NotAffine  # moved cells mixed with sums: a cast between them is missing
    tag = next(iter(cells))
    if name in _MOVES:
        return [tag] * n_out
    if name in _DATA_AT:
        data = set(_DATA_AT[name](len(ins)))
        if any(t is not None for i, t in enumerate(ins) if i not in data):
            raise _NotAffine  # an index or predicate computed from cells
        if name not in _SCATTER_ADD:  # moves (a scatter-add adds: a sum, below)
            return [tag] * n_out
    if tag != _SUM or not in_dt:
        raise _NotAffine  # arithmetic on cells outside the sum's dtype (it wraps apart)
    if name in _SUMS or name in _SCATTER_ADD:  # not scatter-mul, -max, -min: not affine
        return [_SUM] * n_out
    if name in ("mul", "dot_general") and sum(t is not None for t in ins) == 1:
        return [_SUM]
    raise _NotAffine


def homogeneous(closed: Any, n_cells: int) -> list[bool]:
    """For each output of an affine ``closed`` (see :func:`is_affine`),
    whether it is *linear* in the cells, with no bias: every path from a
    value that depends on no cell into the output goes through a product
    with (or a division of) a cell value.  Such an output's bias is 0, not
    the kernel at a zero window (which is NaN when a weight is infinite:
    ``0 * inf``)."""
    jaxpr = closed.jaxpr
    kinds = ["H"] * n_cells + ["C"] * (len(jaxpr.invars) - n_cells)
    return [k == "H" for k in _kinds(jaxpr, kinds)]


def _kinds(jaxpr: Any, args: Sequence[str]) -> list[str]:
    """Per value: "C" (depends on no cell), "H" (linear in the cells) or "A"
    (affine: a bias may remain)."""
    env: dict[Any, str] = dict.fromkeys(jaxpr.constvars, "C")
    env.update(zip(jaxpr.invars, args, strict=True))

    def read(v: Any) -> str:
        if isinstance(v, jcore.Literal):
            return "H" if np.all(np.asarray(v.val) == 0) else "C"  # a literal 0 adds nothing
        return env[v]

    for eqn in jaxpr.eqns:
        ins = [read(v) for v in eqn.invars]
        name = eqn.primitive.name
        n_out = len(eqn.outvars)
        if all(k == "C" or isinstance(v, jcore.Literal) for k, v in zip(ins, eqn.invars,
                                                                        strict=True)):
            outs = ["C"] * n_out
        elif name in _CALLS:
            sub = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr"))
            sub = sub.jaxpr if isinstance(sub, jcore.ClosedJaxpr) else sub
            outs = _kinds(sub, ins[len(ins) - len(sub.invars):])
        elif name == "optimization_barrier":
            outs = list(ins)
        elif name in ("mul", "dot_general"):
            outs = ["H" if "H" in ins else "A"]
        elif name == "div":
            outs = [ins[0] if ins[0] != "C" else "A"]
        elif name in _DATA_AT:
            data = [k for i, k in enumerate(ins) if i in set(_DATA_AT[name](len(ins)))]
            outs = ["H" if all(k == "H" for k in data) else "A"] * n_out
        else:  # linear in every operand: a sum, a rearrangement, a cast
            outs = ["H" if all(k == "H" for k in ins) else "A"] * n_out
        env.update(zip(eqn.outvars, outs, strict=True))
    return [read(v) for v in jaxpr.outvars]


def runtime_weights(closed: Any, shapes: Sequence[tuple[int, ...]],
                    dyn: Any) -> list[list[Any]] | None:
    """The weights of each output, per source (traced arrays of the source's
    cell shape), with the bias last, computed in the program from the
    kernel's current inputs ``dyn``; ``None`` when the kernel is not affine
    in its cells (see :func:`is_affine`; an integer kernel, see
    :func:`integer_affine`, gets its weights from one-hot windows).

    The weights come from one ``jax.vjp`` at a zero window, in the cells'
    dtype.  A kernel that computes in a wider dtype than its cells (float32
    data, float64 weights) would lose the weights' low bits that way, so its
    weights come from forward derivatives (one per cell, exact) instead, up
    to :data:`MAX_JACFWD`.
    """
    n = len(shapes)
    if integer_affine(closed, n) is not None:
        return _one_hot(closed, shapes, dyn)
    if not is_affine(closed, n):
        return None
    result = _weights(closed, shapes, dyn)
    if result is not None:  # a bias known to be 0 (see homogeneous) is not computed
        for per, linear in zip(result, homogeneous(closed, n), strict=True):
            if linear:
                per[-1] = np.zeros(())
    return result


def _one_hot(closed: Any, shapes: Sequence[tuple[int, ...]], dyn: Any
             ) -> list[list[Any]] | None:
    """The weights of an integer kernel (:func:`integer_affine`): per
    output, ``f(e_c) - f(0)`` for every one-hot window ``e_c`` of each
    source (``vmap``-ed, a window's cells squared values), and ``f(0)``,
    in the outputs' integer arithmetic (up to :data:`MAX_JACFWD` values)."""
    n = len(shapes)
    if sum(math.prod(s) for s in shapes) ** 2 > MAX_JACFWD:
        return None
    fn = jcore.jaxpr_as_fun(closed)
    leaves = jax.tree_util.tree_leaves(dyn)
    avals = [v.aval for v in closed.jaxpr.invars[:n]]
    zeros = [jnp.zeros(a.shape, a.dtype) for a in avals]
    biases = list(fn(*zeros, *leaves))
    per: list[list[Any]] = [[] for _ in biases]
    for i, a in enumerate(avals):
        size = math.prod(a.shape)
        basis = jnp.eye(size, dtype=a.dtype).reshape((size, *a.shape))

        def at(e: Any, i: int = i) -> list[Any]:
            cells = list(zeros)
            cells[i] = e
            return list(fn(*cells, *leaves))

        for k, got in enumerate(jax.vmap(at)(basis)):
            per[k].append((got - biases[k]).reshape(a.shape))
    return [w + [b] for w, b in zip(per, biases, strict=True)]


def _weights(closed: Any, shapes: Sequence[tuple[int, ...]], dyn: Any) -> list[list[Any]] | None:
    n = len(shapes)
    fn = jcore.jaxpr_as_fun(closed)
    leaves = jax.tree_util.tree_leaves(dyn)
    avals = [v.aval for v in closed.jaxpr.invars[:n]]
    zeros = [jnp.zeros(a.shape, a.dtype) for a in avals]

    def kernel(*cells: Any) -> list[Any]:
        return list(fn(*cells, *leaves))

    outs = [np.dtype(v.aval.dtype) for v in closed.jaxpr.outvars]
    # real cells of a complex output: a vjp would keep the weights' real part only
    widens = any(width(o) > width(a.dtype) or (o.kind == "c" and np.dtype(a.dtype).kind != "c")
                 for o in outs for a in avals)
    if widens:
        if sum(math.prod(s) for s in shapes) ** 2 > MAX_JACFWD:
            return None
        biases = kernel(*zeros)
        jac = jax.jacfwd(kernel, argnums=tuple(range(n)))(*zeros)
        return [list(per) + [b] for per, b in zip(jac, biases, strict=True)]
    biases, pull = jax.vjp(kernel, *zeros)
    result = []
    for k, b in enumerate(biases):
        cts = [jnp.ones_like(c) if i == k else jnp.zeros_like(c) for i, c in enumerate(biases)]
        result.append(list(pull(cts)) + [b])
    return result

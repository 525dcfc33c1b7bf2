"""Kernels whose large window sums feed a non-linear function.

``jnp.maximum((u * w).sum(), 0)`` over a 15 x 15 window, an unsharp mask
with a threshold, a gradient magnitude of two large derivative windows: the
kernel is not linear, so :mod:`xstencil._engine.dense` does not take it,
and the general lowering reads every window cell at every point (one
shifted slice per cell, compiled interior and boundary shell apart, or
above :data:`~xstencil._engine.lower.MAX_LIFTED_CELLS` cells a gather of
every window).  That costs seconds to compile and grows with the window.

:func:`lower` cuts the kernel's program where values linear in the window
(with constant or runtime weights) enter anything else:

* the **cut values** that are floating point are computed as one linear
  kernel, which the dense lowering takes (separable passes, one sum of
  slices or an FFT, every boundary mode and stride honoured, NaN and inf as
  the direct sum gives them);
* the other cut values (integer or complex ones, such as packed
  coordinates) are computed by the general lowering, as a kernel of their
  own;
* the rest of the program is a function of the cut values at one point,
  applied at every point (``vmap`` over the field).

The cut is taken only where it pays: the kernel reads more than
:data:`SPLIT_CELLS` window cells, and the cut has at most a
:data:`SPLIT_RATIO` th of them (a median or a maximum of the window cuts
every cell, and is left alone), and at most :data:`SPLIT_VALUES` values.
A kernel with effects (``jax.debug.print``, callbacks) is not cut.  The
numbers are those of the dense lowering of the same sums, so they can differ
from the cell-by-cell lowering's by rounding (an FFT's, about 1e-6 of
``sum(|w|) * max|u - mean(u)|`` in float32), and a threshold that the sum
meets within rounding can tip.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jcore

from xstencil._engine import dense as dense_windows
from xstencil._engine.call import stand_in
from xstencil._engine.lift import sub_jaxpr

__all__ = ["lower", "plan", "cuts", "SPLIT_CELLS", "SPLIT_RATIO", "SPLIT_VALUES"]

#: A kernel reading at most this many window cells keeps the general
#: lowering: its shifted slices compile fast enough and read each cell once
#: for all of the kernel's sums.
SPLIT_CELLS = 8

#: The cut may hold at most this fraction of the cells read.
SPLIT_RATIO = 4

#: ... and at most this many values: each is a dense correlation of its own,
#: compiled apart (16 sums of 3 x 3 windows under ``tanh`` over a 9 x 9
#: window compiled in 7 s, against 2.6 s cell by cell, on 2 loaded cores).
SPLIT_VALUES = 8

#: Call primitives looked into (their equations are cut like the kernel's own).
_INLINE = frozenset({"jit", "pjit", "closed_call", "core_call"})

#: Primitives that keep a value linear in the window when every other operand
#: is free of it.
_SUMS = frozenset({"add", "sub", "add_any", "neg", "reduce_sum", "cumsum", "copy", "copy_p"})
_ARRANGE = frozenset({"slice", "squeeze", "reshape", "transpose", "broadcast_in_dim", "rev",
                      "expand_dims", "concatenate", "pad", "split", "tile"})
#: Rearrangements whose operands after the first are indices (free of the window).
_INDEXED = frozenset({"gather", "dynamic_slice"})

#: Sums of the window: a scalar made by one of these is computed densely whole.
_TOTALS = frozenset({"reduce_sum", "dot_general"})

#: Kinds of values: free of the window, linear in it, a full sum of it (a
#: cut value that later equations read as given), anything else.
_FREE, _LINEAR, _OTHER, _SUM = 0, 1, 2, 3


def _eval(jaxpr: Any, consts: Sequence[Any], args: Sequence[Any],
          env: dict[Any, Any] | None = None, skip: Callable[[Any], bool] | None = None
          ) -> dict[Any, Any]:
    """Evaluate ``jaxpr`` by binding its equations (call primitives of
    :data:`_INLINE` evaluated inline), skipping those ``skip`` picks; returns
    the environment of every value computed."""
    env = {} if env is None else env
    env.update(zip(jaxpr.constvars, consts, strict=True))
    env.update(zip(jaxpr.invars, args, strict=True))

    def read(v: Any) -> Any:
        return v.val if isinstance(v, jcore.Literal) else env[v]

    for eqn in jaxpr.eqns:
        if skip is not None and skip(eqn):
            continue
        invals = [read(v) for v in eqn.invars]
        if eqn.primitive.name in _INLINE:
            sub, consts = sub_jaxpr(eqn)
            inner = _eval(sub, consts, invals)
            outs = [v.val if isinstance(v, jcore.Literal) else inner[v] for v in sub.outvars]
        else:
            with eqn.ctx.manager:
                out = eqn.primitive.bind(*invals, **eqn.primitive.get_bind_params(eqn.params))
            outs = list(out) if eqn.primitive.multiple_results else [out]
        env.update(zip(eqn.outvars, outs, strict=True))
    return env


def _avals(vs: Sequence[Any]) -> list[Any]:
    return [stand_in(v.aval.shape, v.aval.dtype, getattr(v.aval, "weak_type", False))
            for v in vs]


def _flat(closed: Any) -> Any:
    """``closed`` with the calls of :data:`_INLINE` inlined (one flat program)."""
    if not any(e.primitive.name in _INLINE for e in closed.jaxpr.eqns):
        return closed
    jaxpr = closed.jaxpr

    def run(*args: Any) -> list[Any]:
        env = _eval(jaxpr, closed.consts, args)
        return [v.val if isinstance(v, jcore.Literal) else env[v] for v in jaxpr.outvars]

    return jax.make_jaxpr(run)(*_avals(jaxpr.invars))


def _kind(eqn: Any, kinds: list[int]) -> int:
    """Whether ``eqn``'s outputs are free of the window, linear in it, or
    neither, from its operands' kinds."""
    top = max(kinds, default=_FREE)
    if top != _LINEAR:
        return top
    name = eqn.primitive.name
    linear = [k == _LINEAR for k in kinds]
    if name in _SUMS or name in _ARRANGE:
        return _LINEAR
    if name == "gather" and "FILL" in str(eqn.params.get("mode")):
        return _OTHER  # an index past the end reads the fill value (NaN), not a sum
    if name in _INDEXED or name == "div":
        return _LINEAR if linear[0] and not any(linear[1:]) else _OTHER
    if name in ("mul", "dot_general"):
        return _LINEAR if sum(linear) == 1 else _OTHER
    if name == "select_n":
        return _LINEAR if not linear[0] else _OTHER
    if name == "convert_element_type":
        src = np.dtype(eqn.invars[0].aval.dtype)
        dst = np.dtype(eqn.outvars[0].aval.dtype)
        widens = not np.issubdtype(src, np.floating) or dst.itemsize >= src.itemsize
        return _LINEAR if np.issubdtype(dst, np.floating) and widens else _OTHER
    return _OTHER


def cuts(closed: Any, n_cells: int) -> tuple[list[Any], dict[Any, int]] | None:
    """The values of ``closed`` (flat, :func:`_flat`) to compute densely, in
    program order, and every value's kind; ``None`` where no equation is
    non-linear in the window.  Those values are the full sums of the window
    (a ``reduce_sum`` or ``dot_general`` to a scalar: kept whole, so that a
    Gaussian stays separable in ``u() - (u * g).sum()``), and the other
    values linear in the first ``n_cells`` inputs that enter a non-linear
    equation or are outputs."""
    jaxpr = closed.jaxpr
    kind: dict[Any, int] = {v: _LINEAR for v in jaxpr.invars[:n_cells]}
    cut: dict[Any, None] = {}
    other = False
    for eqn in jaxpr.eqns:
        if eqn.effects:  # jax.debug.print, callbacks: run at every point, as written
            return None
        ins = [kind.get(v, _FREE) if not isinstance(v, jcore.Literal) else _FREE
               for v in eqn.invars]
        k = _kind(eqn, [_OTHER if i == _SUM else i for i in ins])
        if k == _OTHER and (_LINEAR in ins or _SUM in ins):
            other = True
            cut.update((v, None) for v, i in zip(eqn.invars, ins, strict=True) if i == _LINEAR)
        elif k == _LINEAR and eqn.primitive.name in _TOTALS and eqn.outvars[0].aval.shape == ():
            k = _SUM
            cut[eqn.outvars[0]] = None
        for v in eqn.outvars:
            kind[v] = k
    if not other:
        return None
    cut.update((v, None) for v in jaxpr.outvars
               if not isinstance(v, jcore.Literal) and kind.get(v) == _LINEAR)
    return list(cut), kind


def _part(closed: Any, outs: Sequence[Any], flat: bool) -> Any:
    """A kernel of the same inputs computing the values ``outs`` (whole, or
    each flattened to its scalar entries where ``flat``)."""
    jaxpr = closed.jaxpr
    need = _needed(jaxpr, outs)

    def run(*args: Any) -> list[Any]:
        env = _eval(jaxpr, closed.consts, args, skip=lambda e: not any(
            v in need for v in e.outvars))
        vals = [env[v] for v in outs]
        if not flat:
            return vals
        return [x.reshape(-1)[i] if x.ndim else x for x in vals for i in range(max(x.size, 1))]

    return jax.make_jaxpr(run)(*_avals(jaxpr.invars))


def _needed(jaxpr: Any, outs: Sequence[Any]) -> set[Any]:
    """The values that ``outs`` are computed from."""
    need = set(outs)
    for eqn in reversed(jaxpr.eqns):
        if any(v in need for v in eqn.outvars):
            need.update(v for v in eqn.invars if not isinstance(v, jcore.Literal))
    return need


def _analyse(closed: Any, n: int) -> tuple[Any, dict[Any, int], list[Any], list[Any]] | None:
    """``(flat, kind, wide, rest)``: the flat program (:func:`_flat`), its
    values' kinds, and the floating and other cut values (:func:`cuts`), or
    ``None`` where the cut does not pay."""
    read = dense_windows.read_sources(closed, n)
    cells = sum(math.prod(closed.jaxpr.invars[i].aval.shape) for i in read)
    if cells <= SPLIT_CELLS:
        return None
    flat = _flat(closed)
    found = cuts(flat, n)
    if found is None:
        return None
    cut, kind = found
    entries = sum(math.prod(v.aval.shape) for v in cut)
    if entries * SPLIT_RATIO > cells or entries > SPLIT_VALUES or any(
            0 in v.aval.shape for v in cut):
        return None
    wide = [v for v in cut if np.issubdtype(np.dtype(v.aval.dtype), np.floating)]
    if not wide:
        return None
    return flat, kind, wide, [v for v in cut if v not in wide]


def plan(closed: Any, sources: Sequence[Any], geom: Sequence[Any], dyn: Any = None
         ) -> list[tuple[list[tuple[int, Any, Any, str]], Any]] | None:
    """:func:`xstencil._engine.dense.plan` of the kernel's cut sums, or
    ``None`` where :func:`lower` would not cut it."""
    found = _analyse(closed, len(sources))
    if found is None:
        return None
    flat, _, wide, _ = found
    return dense_windows.plan(_part(flat, wide, flat=True), sources, geom, dyn)


def lower(closed: Any, sources: Sequence[Any], geom: Sequence[Any], dyn: Any,
          general: Callable[[Any], list[Any]]) -> list[Any] | None:
    """The kernel's output leaves over the slab ``geom``, its window sums
    lowered densely and the rest applied point by point, or ``None`` where
    the cut does not pay (see the module docstring).  ``general(k)`` runs a
    kernel ``k`` (a closed jaxpr of the same inputs) with the general
    lowering and returns its output leaves."""
    n = len(sources)
    found = _analyse(closed, n)
    if found is None:
        return None
    flat, kind, wide, rest = found
    sums = dense_windows.lower(_part(flat, wide, flat=True), sources, geom, dyn)
    if sums is None:
        return None
    rest_vals = general(_part(flat, rest, flat=False)) if rest else []
    return _apply(flat, n, kind, wide, rest, sums, rest_vals, geom, dyn)


def _apply(flat: Any, n: int, kind: dict[Any, int], wide: Sequence[Any], rest: Sequence[Any],
           sums: list[Any], rest_vals: list[Any], geom: Sequence[Any], dyn: Any) -> list[Any]:
    """The rest of the kernel at every point, from the cut values there: its
    equations that are not linear in the window, ``vmap``-ped over the field."""
    jaxpr = flat.jaxpr

    def point(sum_vals: Sequence[Any], rest_at: Sequence[Any], dvals: Sequence[Any]) -> list[Any]:
        at: dict[Any, Any] = {}
        it = iter(sum_vals)
        for v in wide:
            vals = [next(it) for _ in range(max(math.prod(v.aval.shape), 1))]
            at[v] = vals[0] if not v.aval.shape else jnp.stack(vals).reshape(v.aval.shape)
        at.update(zip(rest, rest_at, strict=True))
        # a window input is read past the cut only where it is a cut value itself
        args = [at.get(v) for v in jaxpr.invars[:n]] + list(dvals)
        env = _eval(jaxpr, flat.consts, args, env=at,
                    skip=lambda e: kind.get(e.outvars[0]) in (_LINEAR, _SUM)
                    if e.outvars else True)
        return [v.val if isinstance(v, jcore.Literal) else env[v] for v in jaxpr.outvars]

    fn = point
    for _ in geom:
        fn = jax.vmap(fn, in_axes=(0, 0, None))
    return fn(sums, rest_vals, jax.tree_util.tree_leaves(dyn))

"""Kernels that are a constant-weight linear sum of the window.

:func:`weights` reads a traced kernel's jaxpr symbolically, with every value
held as its coefficients on the window cells (a sparse matrix, plus a
constant bias), and returns those weights when the kernel is
``sum(w * u) + b`` with constant ``w`` and ``b``: ``(u * w).sum()``,
``jnp.sum(w * u)``, ``u @ v`` with a constant ``v``, sums of
``c * u(x=i)`` terms and so on, and integer sums whose every operation on
window values is in the result's integer dtype (:func:`integer`: ``u.sum()``
over a uint8 image, which wraps modulo ``2**32`` in any order).  Anything
else (a product of two window values, a weight that is a traced argument, a
non-linear function, an integer division) returns ``None``
(:mod:`xstencil._engine.affine` then computes traced weights in the
program).  :mod:`xstencil._engine.dense` lowers such kernels by cost.
"""

from __future__ import annotations

import math
import string
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.extend import core as jcore

__all__ = ["Linear", "MAX_INTEGER_WEIGHT", "component", "drops_value", "integer", "weights",
           "width"]

_LINEAR_UNARY = frozenset({"neg", "copy", "copy_p", "optimization_barrier"})
_STRUCTURAL = frozenset({"slice", "squeeze", "reshape", "transpose", "broadcast_in_dim", "rev",
                         "expand_dims", "concatenate", "pad", "gather", "dynamic_slice",
                         "split", "tile"})
_CALLS = frozenset({"jit", "pjit", "closed_call", "core_call", "custom_jvp_call",
                    "custom_vjp_call", "custom_vjp_call_jaxpr", "remat", "checkpoint"})


class _NotLinear(Exception):
    pass


#: The largest dense coefficient matrix a ``dot_general`` on window values
#: may build while the weights are read (bigger ones keep the gather path).
MAX_DENSE_COEFS = 2**22


@dataclass
class Linear:
    """``value.flat[rows] += vals * cells[cols]``, plus ``bias``.

    A sparse (COO) matrix from the concatenated window cells of every source
    to the value's entries, so that a 63x63 window costs its 3969 weights and
    not a dense identity.  ``bias`` is a float64 array of the value's shape.
    """

    rows: np.ndarray
    cols: np.ndarray
    vals: np.ndarray
    bias: np.ndarray

    @property
    def shape(self) -> tuple[int, ...]:
        return self.bias.shape

    def coalesced(self) -> Linear:
        if not self.rows.size:
            return self
        ncol = int(self.cols.max()) + 1
        key, inv = np.unique(self.rows * ncol + self.cols, return_inverse=True)
        vals = np.zeros(key.size, self.vals.dtype)
        np.add.at(vals, inv, self.vals)
        keep = vals != 0
        return Linear(key[keep] // ncol, key[keep] % ncol, vals[keep], self.bias)

    def take(self, ids: np.ndarray) -> Linear:
        """The value whose entry ``o`` is this value's entry ``ids.flat[o]``."""
        order = np.argsort(self.rows, kind="stable")
        rows, cols, vals = self.rows[order], self.cols[order], self.vals[order]
        size = self.bias.size
        ptr = np.searchsorted(rows, np.arange(size + 1))
        src = ids.reshape(-1)
        counts = ptr[src + 1] - ptr[src]
        new_rows = np.repeat(np.arange(src.size), counts)
        first = np.repeat(ptr[src], counts)
        within = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
        pick = first + within
        bias = self.bias.reshape(-1)[src].reshape(ids.shape)
        return Linear(new_rows, cols[pick], vals[pick], bias)


def _number(c: Any) -> np.ndarray:
    """``c`` as float64, or complex128 where it is complex (a weight such
    as ``exp(1j * phase)``)."""
    return np.asarray(c, dtype=np.complex128 if np.iscomplexobj(c) else np.float64)


def component(dtype: Any) -> np.dtype:
    """The dtype of one real part of ``dtype`` (complex64: float32), or
    ``dtype`` itself where it is real."""
    dt = np.dtype(dtype)
    return np.dtype(np.finfo(dt).dtype) if dt.kind == "c" else dt


def width(dtype: Any) -> int:
    """The bytes of one real component of ``dtype`` (complex64: 4)."""
    return component(dtype).itemsize


def drops_value(new: Any, src: Any, widest: int) -> bool:
    """Whether ``convert_element_type`` from ``src`` to ``new`` is not a
    step of a linear (or affine) float sum whose widest output component
    has ``widest`` bytes: a cast to an integer, to a complex value's real
    part, or a rounding the output does not do."""
    new, src = np.dtype(new), np.dtype(src)
    return new.kind not in "fc" or (src.kind == "c" and new.kind != "c") or (
        width(new) < widest and width(new) < width(src))


def _const_linear(c: Any) -> Linear:
    c = _number(c)
    empty = np.zeros(0, dtype=np.int64)
    return Linear(empty, empty, np.zeros(0), c)


def weights(closed: Any, cell_shapes: Sequence[tuple[int, ...]]) -> list[list[np.ndarray]] | None:
    """The constant weights of each kernel output, per source (arrays of the
    source's cell shape), with the constant bias last; ``None`` when the
    kernel is not a constant-weight linear function of its windows with
    scalar floating outputs, or scalar outputs of one integer dtype whose
    every operation on window values is in that dtype (see :func:`integer`)."""
    jaxpr = closed.jaxpr
    n = len(cell_shapes)
    args: list[Any] = []
    offset = 0
    for shape in cell_shapes:
        size = math.prod(shape)
        idx = np.arange(size, dtype=np.int64)
        args.append(Linear(idx, idx + offset, np.ones(size), np.zeros(shape)))
        offset += size
    args += [_Opaque() for _ in jaxpr.invars[n:]]
    widest = max((width(v.aval.dtype) for v in jaxpr.outvars), default=0)
    ints = integer(closed)
    try:
        outs = _interpret(jaxpr, closed.consts, args, widest, ints)
    except (_NotLinear, ValueError, IndexError, TypeError):
        # the reader is only an optimisation: an equation it cannot follow (say a
        # reduction over an index a scalar read does not have) is "not linear",
        # and the generic lowering then computes, or raises the library's error
        return None
    result = []
    for o, v in zip(outs, jaxpr.outvars, strict=True):
        if v.aval.shape != () or (ints is None and np.dtype(v.aval.dtype).kind not in "fc"):
            return None
        o = o.coalesced() if isinstance(o, Linear) else _const_linear(o)
        if ints is not None and not (_whole(o.vals) and _whole(o.bias)):
            return None  # not an integer sum the lowering can repeat exactly
        dense = np.zeros(offset, o.vals.dtype)
        np.add.at(dense, o.cols, o.vals)
        per, start = [], 0
        for shape in cell_shapes:
            size = math.prod(shape)
            per.append(dense[start:start + size].reshape(shape))
            start += size
        result.append(per + [_number(o.bias)])
    return result


class _Opaque:
    """A traced argument (not a constant)."""


def integer(closed: Any) -> np.dtype | None:
    """The integer dtype of ``closed``'s outputs where they share one, else
    ``None``.  Such a kernel is read as an integer sum only where every
    operation on window values is in that dtype (casts into it, sums,
    products with constants; no division): its arithmetic wraps modulo
    ``2**bits``, and so does the lowering's sum of the same integer weights
    times the cells cast to it, in any order."""
    dtypes = {np.dtype(v.aval.dtype) for v in closed.jaxpr.outvars}
    if len(dtypes) != 1:
        return None
    dt = next(iter(dtypes))
    return dt if np.issubdtype(dt, np.integer) else None


#: The largest integer weight or bias an integer kernel may have (read in
#: float64, exact far beyond it).
MAX_INTEGER_WEIGHT = 2**31


def _whole(x: np.ndarray) -> bool:
    x = np.asarray(x)
    return bool(np.all(np.isfinite(x)) and np.all(x == np.round(x))
                and np.all(np.abs(x) < MAX_INTEGER_WEIGHT))


def _exact_in_f64(x: Any) -> bool:
    """Whether an integer kernel's value read so far holds only coefficients
    and a bias under ``2**53``: the float64 arithmetic that made them from
    integers is then exact, step by step (a product or sum whose exact
    value reached ``2**53`` rounds to at least ``2**53``, and is refused
    here even where a later step brings it back under ``2**31``)."""
    if not isinstance(x, Linear):
        return True
    return bool(np.all(np.abs(x.vals) < 2.0**53) and np.all(np.abs(x.bias) < 2.0**53))


def _interpret(jaxpr: Any, consts: Sequence[Any], args: Sequence[Any],
               widest: int, ints: np.dtype | None = None) -> list[Any]:
    env: dict[Any, Any] = {}

    def read(v: Any) -> Any:
        return v.val if isinstance(v, jcore.Literal) else env[v]

    for v, x in zip(jaxpr.constvars, consts, strict=True):
        env[v] = x
    for v, x in zip(jaxpr.invars, args, strict=True):
        env[v] = x
    for eqn in jaxpr.eqns:
        invals = [read(v) for v in eqn.invars]
        if any(isinstance(x, _Opaque | jax.core.Tracer) for x in invals):
            raise _NotLinear
        if any(isinstance(x, Linear) for x in invals):
            outs = _linear_eqn(eqn, invals, widest, ints)
            if ints is not None and not all(_exact_in_f64(x) for x in outs):
                raise _NotLinear  # a coefficient float64 may have rounded
        else:
            params = eqn.primitive.get_bind_params(eqn.params)
            with jax.ensure_compile_time_eval():
                out = eqn.primitive.bind(*invals, **params)
            outs = list(out) if eqn.primitive.multiple_results else [out]
        for v, x in zip(eqn.outvars, outs, strict=True):
            env[v] = x
    return [read(v) for v in jaxpr.outvars]


def _linear_eqn(eqn: Any, invals: list[Any], widest: int,
                ints: np.dtype | None = None) -> list[Any]:
    """One equation on window values; ``widest``: the itemsize of the widest
    output (a cast to a narrower float rounds, which is not linear, and the
    dense lowering rounds the cells to the output's dtype only); ``ints``:
    the integer outputs' dtype, in which every operation must be (see
    :func:`integer`)."""
    name = eqn.primitive.name
    params = eqn.params
    if ints is not None and name not in _CALLS and name not in _STRUCTURAL:
        if name == "div" or any(np.dtype(v.aval.dtype) != ints for v in eqn.outvars):
            raise _NotLinear  # a division, or arithmetic that wraps at another width
        if name == "convert_element_type":
            src = np.dtype(eqn.invars[0].aval.dtype)
            if not (np.issubdtype(src, np.integer) or src == np.bool_):
                raise _NotLinear  # a float truncated to an integer
            return [invals[0]]
    if name in _CALLS:
        for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
            if key in params:
                j = params[key]
                sub, consts = (j.jaxpr, j.consts) if isinstance(j, jcore.ClosedJaxpr) else (j, ())
                return _interpret(sub, consts, invals[len(invals) - len(sub.invars):], widest,
                                  ints)
        raise _NotLinear
    if name in _STRUCTURAL:
        return [_structural(eqn, invals)]
    if name in _LINEAR_UNARY:
        x = invals[0]
        if name == "neg":
            return [Linear(x.rows, x.cols, -x.vals, -x.bias)]
        return [x] * len(eqn.outvars)
    if name == "convert_element_type":
        if drops_value(params["new_dtype"], eqn.invars[0].aval.dtype, widest):
            raise _NotLinear
        return [invals[0]]
    if name in ("add", "sub", "add_any"):
        a, b = (x if isinstance(x, Linear) else _const_linear(x) for x in invals)
        shape = np.broadcast_shapes(a.shape, b.shape)
        a, b = _broadcast(a, shape), _broadcast(b, shape)
        sign = -1.0 if name == "sub" else 1.0
        return [Linear(np.concatenate([a.rows, b.rows]), np.concatenate([a.cols, b.cols]),
                       np.concatenate([a.vals, sign * b.vals]),
                       a.bias + sign * b.bias).coalesced()]
    if name in ("mul", "div"):
        x, y = invals
        if name == "mul" and not isinstance(x, Linear):
            x, y = y, x
        if isinstance(y, Linear):
            raise _NotLinear
        c = _number(y)
        if name == "div":
            c = 1.0 / c
        shape = np.broadcast_shapes(x.shape, c.shape)
        x = _broadcast(x, shape)
        c = np.broadcast_to(c, shape)
        with np.errstate(invalid="ignore"):  # an infinite weight times a zero bias
            bias = np.where(x.bias == 0, 0, x.bias * c)  # a bias of 0 stays 0
        return [Linear(x.rows, x.cols, x.vals * c.reshape(-1)[x.rows], bias)]
    if name == "reduce_sum":
        x = invals[0]
        axes = tuple(params["axes"])
        keep = [d for d in range(x.bias.ndim) if d not in axes]
        out_shape = tuple(x.shape[d] for d in keep)
        full = np.unravel_index(x.rows, x.shape)
        rows = (np.ravel_multi_index(tuple(full[d] for d in keep), out_shape) if keep
                else np.zeros_like(x.rows))
        return [Linear(rows, x.cols, x.vals, x.bias.sum(axis=axes)).coalesced()]
    if name == "dot_general":
        return [_dot(eqn, invals)]
    raise _NotLinear


def _broadcast(x: Linear, shape: tuple[int, ...]) -> Linear:
    if x.shape == shape:
        return x
    ids = np.arange(x.bias.size).reshape(x.shape)
    return x.take(np.broadcast_to(ids, shape))


def _structural(eqn: Any, invals: list[Any]) -> Linear:
    """Apply a rearranging primitive to an id grid of the value's entries."""
    name = eqn.primitive.name
    data = {"concatenate": range(len(invals)), "pad": (0, 1)}.get(name, (0,))
    lins, operands, offset = [], [], 0
    for i, x in enumerate(invals):
        if i not in data:
            if isinstance(x, Linear):
                raise _NotLinear
            operands.append(x)
            continue
        lin = x if isinstance(x, Linear) else _const_linear(x)
        operands.append((np.arange(lin.bias.size).reshape(lin.shape) + offset).astype(np.int32))
        lins.append((lin, offset))
        offset += lin.bias.size
    bind = dict(eqn.primitive.get_bind_params(eqn.params))
    if name == "gather" and bind.get("fill_value") is not None:
        bind["fill_value"] = -1
    if eqn.primitive.multiple_results:
        raise _NotLinear
    with jax.ensure_compile_time_eval():
        ids = np.asarray(eqn.primitive.bind(*operands, **bind)).astype(np.int64)
    if ids.size and ids.min() < 0:
        raise _NotLinear
    if len(lins) == 1:
        return lins[0][0].take(ids)
    joined = Linear(np.concatenate([lin.rows + off for lin, off in lins]),
                    np.concatenate([lin.cols for lin, _ in lins]),
                    np.concatenate([lin.vals for lin, _ in lins]),
                    np.concatenate([lin.bias.reshape(-1) for lin, _ in lins]))
    return joined.take(ids)


def _dense(x: Linear, ncols: int) -> np.ndarray:
    if x.bias.size * ncols > MAX_DENSE_COEFS:
        raise _NotLinear
    m = np.zeros((x.bias.size, ncols), x.vals.dtype)
    np.add.at(m, (x.rows, x.cols), x.vals)
    return m.reshape(x.shape + (ncols,))


def _dot(eqn: Any, invals: list[Any]) -> Linear:
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    lhs, rhs = invals
    if isinstance(lhs, Linear) == isinstance(rhs, Linear):
        raise _NotLinear
    lin = lhs if isinstance(lhs, Linear) else rhs
    ncols = int(lin.cols.max()) + 1 if lin.cols.size else 1
    letters = iter(string.ascii_letters)
    ls = [next(letters) for _ in range(np.ndim(lhs.bias if lhs is lin else lhs))]
    rs = [next(letters) for _ in range(np.ndim(rhs.bias if rhs is lin else rhs))]
    for a, b in zip(list(lc) + list(lb), list(rc) + list(rb), strict=True):
        rs[b] = ls[a]
    out = ([ls[a] for a in lb] + [ls[a] for a in range(len(ls)) if a not in lc and a not in lb]
           + [rs[b] for b in range(len(rs)) if b not in rc and b not in rb])
    sl, sr, so = "".join(ls), "".join(rs), "".join(out)
    c = _number(rhs if lhs is lin else lhs)
    m = _dense(lin, ncols)
    if lhs is lin:
        coefs = _einsum(f"{sl}z", sr, f"{so}z", m, c, lin_first=True)
        bias = _einsum(sl, sr, so, lin.bias, c, lin_first=True)
    else:
        coefs = _einsum(sl, f"{sr}z", f"{so}z", c, m, lin_first=False)
        bias = _einsum(sl, sr, so, c, lin.bias, lin_first=False)
    flat = coefs.reshape(-1, ncols)
    rows, cols = np.nonzero(flat)
    return Linear(rows, cols, flat[rows, cols], bias)


def _einsum(sa: str, sb: str, so: str, a: np.ndarray, b: np.ndarray, lin_first: bool
            ) -> np.ndarray:
    """``einsum(sa,sb->so)`` in which a term whose window-side factor (``a``
    if ``lin_first`` else ``b``) is 0 adds 0, as in :func:`_linear_eqn`'s
    ``mul``: the zeros of a coefficient matrix are cells the value does not
    depend on, and ``0 * inf`` there must not make the weight NaN."""
    if np.all(np.isfinite(a)) and np.all(np.isfinite(b)):
        return np.einsum(f"{sa},{sb}->{so}", a, b)
    full = "".join(dict.fromkeys(sa + sb))
    sizes = dict(zip(sa, a.shape, strict=True)) | dict(zip(sb, b.shape, strict=True))
    if math.prod(sizes[k] for k in full) > MAX_DENSE_COEFS:
        raise _NotLinear
    with np.errstate(invalid="ignore"):
        terms = np.einsum(f"{sa},{sb}->{full}", a, b)
    side = (a, sa) if lin_first else (b, sb)
    mask = _expand(side[0] == 0, side[1], full, sizes)
    terms = np.where(mask, 0, terms)
    return np.einsum(f"{full}->{so}", terms)


def _expand(x: np.ndarray, spec: str, full: str, sizes: dict[str, int]) -> np.ndarray:
    """``x`` (indexed by ``spec``) broadcast to the index order ``full``."""
    order = [spec.index(k) for k in full if k in spec]
    x = np.transpose(x, order)
    shape = [sizes[k] if k in spec else 1 for k in full]
    return np.broadcast_to(x.reshape(shape), [sizes[k] for k in full])

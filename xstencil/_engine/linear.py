"""Kernels that are a constant-weight linear sum of the window.

:func:`weights` reads a traced kernel's jaxpr symbolically, with every value
held as its coefficients on the window cells (plus a constant bias), and
returns those weights when the kernel is ``sum(w * u) + b`` with constant
``w`` and ``b``: ``(u * w).sum()``, ``jnp.sum(w * u)``, ``u @ v`` with a
constant ``v``, sums of ``c * u(x=i)`` terms and so on.  Anything else (a
product of two window values, a weight that is a traced argument, a
non-linear function) returns ``None`` and the kernel keeps the shifted-slice
lowering of :mod:`xstencil._engine.lower`.

:func:`correlate` lowers such a kernel by cost (DESIGN.md section 5):

* few nonzero weights (:data:`SLICE_TAPS`): the caller keeps its fused
  shifted slices, interior and boundary shell apart;
* weights of rank 1 (box, Gaussian): one pass of shifted slices per axis;
* dense: one sum of shifted slices of the padded block up to
  :data:`FFT_TAPS` weights, an FFT (``jnp.fft.rfftn``) above.

Each pads the block it reads once, with the boundary code of
:mod:`xstencil._engine.boundary`, and then takes a 'valid' correlation, so
every boundary mode and stride is honoured and one expression is compiled
whatever the window size.
"""

from __future__ import annotations

import math
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend import core as jcore

__all__ = ["Linear", "weights", "correlate", "choose", "SLICE_TAPS", "FFT_TAPS"]

#: Up to this many nonzero weights the shifted-slice lowering of
#: :mod:`~xstencil._engine.lower` is kept.  Measured on 2 busy CPU cores,
#: float32: the 5-point Laplacian at 2048**2 ran 3.9 ms that way against 19 ms
#: as one sum over a materialized padded block, but a dense 3x3 at 1024**2
#: ran 2.0 ms against 1.4 ms, a dense 5x5 3.1-5.3 ms against 1.8-2.3 ms, and
#: compile times (interior and shell compiled apart) 0.8-0.9 s against 0.3-0.4.
SLICE_TAPS = 8

#: Up to this many nonzero weights a non-separable window is one fused sum of
#: shifted slices of the padded block; above, an FFT.  Measured at 1024**2
#: float32 on 2 busy CPU cores: slices 2.4/4.4/6.9/7.6 ms at 3x3/7x7/9x9/11x11,
#: the FFT 7.4-8.2 ms for all of them, and ``lax.conv_general_dilated`` 27 ms
#: at 3x3 and 55 ms at 9x9 (XLA:CPU's convolution is not competitive, so it is
#: never chosen; :func:`correlate` keeps it as a cross-check).
FFT_TAPS = 100

_LINEAR_UNARY = frozenset({"neg", "copy", "copy_p", "optimization_barrier", "reduce_precision"})
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
        vals = np.zeros(key.size)
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


def _const_linear(c: Any) -> Linear:
    c = np.asarray(c, dtype=np.float64)
    empty = np.zeros(0, dtype=np.int64)
    return Linear(empty, empty, np.zeros(0), c)


def weights(closed: Any, cell_shapes: Sequence[tuple[int, ...]]) -> list[list[np.ndarray]] | None:
    """The constant weights of each kernel output, per source (arrays of the
    source's cell shape), with the constant bias last; ``None`` when the
    kernel is not a constant-weight linear function of its windows with
    scalar floating outputs."""
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
    try:
        outs = _interpret(jaxpr, closed.consts, args)
    except _NotLinear:
        return None
    result = []
    for o, v in zip(outs, jaxpr.outvars, strict=True):
        if v.aval.shape != () or not np.issubdtype(np.dtype(v.aval.dtype), np.floating):
            return None
        o = o.coalesced() if isinstance(o, Linear) else _const_linear(o)
        dense = np.zeros(offset)
        np.add.at(dense, o.cols, o.vals)
        per, start = [], 0
        for shape in cell_shapes:
            size = math.prod(shape)
            per.append(dense[start:start + size].reshape(shape))
            start += size
        result.append(per + [np.asarray(o.bias, dtype=np.float64)])
    return result


class _Opaque:
    """A traced argument (not a constant)."""


def _interpret(jaxpr: Any, consts: Sequence[Any], args: Sequence[Any]) -> list[Any]:
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
            outs = _linear_eqn(eqn, invals)
        else:
            params = eqn.primitive.get_bind_params(eqn.params)
            with jax.ensure_compile_time_eval():
                out = eqn.primitive.bind(*invals, **params)
            outs = list(out) if eqn.primitive.multiple_results else [out]
        for v, x in zip(eqn.outvars, outs, strict=True):
            env[v] = x
    return [read(v) for v in jaxpr.outvars]


def _linear_eqn(eqn: Any, invals: list[Any]) -> list[Any]:
    name = eqn.primitive.name
    params = eqn.params
    if name in _CALLS:
        for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
            if key in params:
                j = params[key]
                sub, consts = (j.jaxpr, j.consts) if isinstance(j, jcore.ClosedJaxpr) else (j, ())
                return _interpret(sub, consts, invals[len(invals) - len(sub.invars):])
        raise _NotLinear
    if name in _STRUCTURAL:
        return [_structural(eqn, invals)]
    if name in _LINEAR_UNARY:
        x = invals[0]
        if name == "neg":
            return [Linear(x.rows, x.cols, -x.vals, -x.bias)]
        return [x] * len(eqn.outvars)
    if name == "convert_element_type":
        if not np.issubdtype(np.dtype(params["new_dtype"]), np.floating):
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
        c = np.asarray(y, dtype=np.float64)
        if name == "div":
            c = 1.0 / c
        shape = np.broadcast_shapes(x.shape, c.shape)
        x = _broadcast(x, shape)
        c = np.broadcast_to(c, shape)
        return [Linear(x.rows, x.cols, x.vals * c.reshape(-1)[x.rows], x.bias * c)]
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
    m = np.zeros((x.bias.size, ncols))
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
    c = np.asarray(rhs if lhs is lin else lhs, dtype=np.float64)
    m = _dense(lin, ncols)
    if lhs is lin:
        coefs = np.einsum(f"{sl}z,{sr}->{so}z", m, c)
        bias = np.einsum(f"{sl},{sr}->{so}", lin.bias, c)
    else:
        coefs = np.einsum(f"{sl},{sr}z->{so}z", c, m)
        bias = np.einsum(f"{sl},{sr}->{so}", c, lin.bias)
    flat = coefs.reshape(-1, ncols)
    rows, cols = np.nonzero(flat)
    return Linear(rows, cols, flat[rows, cols], bias)


# --------------------------------------------------------------------------
# lowering


def choose(w: np.ndarray) -> str:
    """The lowering for one weight array: 'shell' (keep the shifted-slice
    lowering of :mod:`~xstencil._engine.lower`, interior and boundary shell
    apart), 'separable', 'slices' (one sum over the padded block) or 'fft'."""
    nnz = int(np.count_nonzero(w))
    if nnz <= SLICE_TAPS:
        return "shell"
    if separable(w) is not None:
        return "separable"
    return "slices" if nnz <= FFT_TAPS else "fft"


def separable(w: np.ndarray) -> list[np.ndarray] | None:
    """1-D factors whose outer product is ``w``, or ``None`` (rank > 1)."""
    if w.ndim < 2:
        return None
    flat = np.abs(w)
    pivot = np.unravel_index(int(np.argmax(flat)), w.shape)
    if flat[pivot] == 0:
        return None
    factors = []
    for a in range(w.ndim):
        idx = list(pivot)
        idx[a] = slice(None)
        factors.append(np.array(w[tuple(idx)], dtype=np.float64))
    scale = w[pivot] ** (w.ndim - 1)
    factors[0] = factors[0] / scale
    outer = factors[0]
    for f in factors[1:]:
        outer = np.multiply.outer(outer, f)
    if not np.allclose(outer, w, rtol=1e-12, atol=1e-14 * float(flat.max())):
        return None
    return factors


def correlate(p: Any, w: np.ndarray, steps: Sequence[int], counts: Sequence[int],
              how: str) -> Any:
    """``out[j] = sum_c w[c] * p[j * steps + c]`` for ``j < counts``, where
    ``p`` is the padded block (a 'valid' correlation)."""
    if how == "separable":
        for a, f in enumerate(separable(w)):
            p = _slices(p, f.reshape([-1 if b == a else 1 for b in range(p.ndim)]),
                        [steps[b] if b == a else 1 for b in range(p.ndim)],
                        [counts[b] if b == a else p.shape[b] for b in range(p.ndim)])
        return p
    if how in ("slices", "shell"):
        return _slices(p, w, steps, counts)
    if how == "conv":
        kern = jnp.asarray(w, dtype=p.dtype)[None, None]
        out = lax.conv_general_dilated(p[None, None], kern, tuple(steps), "VALID",
                                       precision=lax.Precision.HIGHEST)
        return out[0, 0][tuple(slice(0, n) for n in counts)]
    return _fft(p, w, steps, counts)


def _slices(p: Any, w: np.ndarray, steps: Sequence[int], counts: Sequence[int]) -> Any:
    terms = []
    for cell in zip(*np.nonzero(w), strict=True):
        starts = [int(c) for c in cell]
        limits = [s + st * (n - 1) + 1 for s, st, n in zip(starts, steps, counts, strict=True)]
        piece = lax.slice(p, starts, limits, tuple(steps))
        c = w[cell]
        terms.append(piece if c == 1 else piece * np.asarray(c, p.dtype))
    if not terms:
        return jnp.zeros(tuple(counts), p.dtype)
    while len(terms) > 1:  # a balanced tree, as the shifted-slice lowering
        terms = [terms[i] + terms[i + 1] if i + 1 < len(terms) else terms[i]
                 for i in range(0, len(terms), 2)]
    return terms[0]


def _fast_size(n: int) -> int:
    """The smallest 2^a 3^b 5^c >= n (FFT-friendly)."""
    best = 1 << max(n - 1, 0).bit_length()
    p5 = 1
    while p5 < best:
        p35 = p5
        while p35 < best:
            m = p35
            while m < n:
                m *= 2
            best = min(best, m)
            p35 *= 3
        p5 *= 5
    return best


def _spectrum(w: np.ndarray, sizes: tuple[int, ...], dtype: Any) -> np.ndarray:
    """``conj(rfftn(w))`` zero-padded to ``sizes``, computed once in float64
    (a constant of the program, not an FFT at run time)."""
    big = np.zeros(sizes)
    big[tuple(slice(0, k) for k in w.shape)] = w
    spec = np.conj(np.fft.rfftn(big))
    return spec.astype(np.complex128 if np.dtype(dtype) == np.float64 else np.complex64)


def _finite_guard(x: Any, w: np.ndarray, run: Callable[[Any, np.ndarray], Any]) -> Any:
    """``run(x, w)`` (an FFT correlation), with non-finite inputs handled as a
    direct sum would: an FFT spreads one NaN or inf over the whole output, so
    when ``x`` holds any, they are zeroed for the FFT and the outputs whose
    windows read one (counted by a second FFT of the weights' support) are
    NaN.  (A direct sum would give +-inf where only infs of one sign meet.)"""
    dtype = x.dtype
    if np.dtype(dtype) not in (np.float32, np.float64):  # no half-precision FFTs
        x = x.astype(np.float32)

    def clean(x: Any) -> Any:
        return run(x, w)

    def dirty(x: Any) -> Any:
        ok = jnp.isfinite(x)
        out = run(jnp.where(ok, x, jnp.zeros((), x.dtype)), w)
        hits = run((~ok).astype(x.dtype), (w != 0).astype(np.float64))
        return jnp.where(hits > 0.5, jnp.asarray(np.nan, out.dtype), out)

    return lax.cond(jnp.all(jnp.isfinite(x)), clean, dirty, x).astype(dtype)


def _fft(p: Any, w: np.ndarray, steps: Sequence[int], counts: Sequence[int]) -> Any:
    """The valid correlation as a circular one over an FFT-friendly size
    (the wrapped-around outputs are the ones dropped), NaN-safe."""
    return _finite_guard(p, w, lambda x, w: _fft_raw(x, w, steps, counts))


def _fft_raw(p: Any, w: np.ndarray, steps: Sequence[int], counts: Sequence[int]) -> Any:
    sizes = tuple(_fast_size(n) for n in p.shape)
    axes = tuple(range(p.ndim))
    full = jnp.fft.irfftn(jnp.fft.rfftn(p, sizes, axes) * _spectrum(w, sizes, p.dtype),
                          sizes, axes)
    index = tuple(slice(0, st * (n - 1) + 1, st) for st, n in zip(steps, counts, strict=True))
    return full[index].astype(p.dtype)


def _whole_periodic(src: Any, geom: Sequence[Any]) -> bool:
    """Whether the slab is the whole periodic field (no padding is needed:
    the FFT's own wrap-around is the boundary)."""
    if not src.pads or any(m != "periodic" for m in src.modes):
        return False
    return all(g.start == 0 and g.count == -(-n // g.step)
               for g, n in zip(geom, src.array.shape, strict=True))


def _circular(x: Any, w: np.ndarray, lows: Sequence[int], steps: Sequence[int],
              counts: Sequence[int]) -> Any:
    """``out[j] = sum_c w[c] * x[(j * steps + c - lows) mod n]``: one FFT pair
    on the unpadded array (the weights wrapped onto it), NaN-safe."""
    return _finite_guard(x, w, lambda x, w: _circular_raw(x, w, lows, steps, counts))


def _circular_raw(x: Any, w: np.ndarray, lows: Sequence[int], steps: Sequence[int],
                  counts: Sequence[int]) -> Any:
    wrapped = np.zeros(x.shape)
    grids = np.meshgrid(*[(np.arange(k) - lo) % n for k, lo, n in zip(w.shape, lows, x.shape,
                                                                      strict=True)],
                        indexing="ij")
    np.add.at(wrapped, tuple(grids), w)
    axes = tuple(range(x.ndim))
    full = jnp.fft.irfftn(jnp.fft.rfftn(x, axes=axes) * _spectrum(wrapped, x.shape, x.dtype),
                          x.shape, axes)
    index = tuple(slice(0, st * (n - 1) + 1, st) for st, n in zip(steps, counts, strict=True))
    return full[index].astype(x.dtype)


def lower(closed: Any, sources: Sequence[Any], geom: Sequence[Any]) -> list[Any] | None:
    """The kernel's output leaves over the slab ``geom``, lowered as
    correlations, or ``None`` when the kernel is not a constant-weight
    linear sum or every weight array is small enough for shifted slices.

    ``sources`` and ``geom`` are :class:`~xstencil._engine.lower.Source` and
    :class:`~xstencil._engine.lower.AxisGeom` objects.
    """
    rank = len(geom)
    shapes = [tuple(geom[a].size for a in s.cell_axes) for s in sources]
    if any(not np.issubdtype(np.dtype(s.array.dtype), np.floating) for s in sources):
        return None
    if sum(math.prod(s) for s in shapes) <= SLICE_TAPS:
        return None
    found = weights(closed, shapes)
    if found is None:
        return None
    plans = []
    for per in found:
        terms = []
        for src, w in zip(sources, per[:-1], strict=True):
            if not np.any(w):
                continue
            if tuple(src.axes) != tuple(range(rank)):
                return None
            full = w.reshape([geom[a].size if a in src.cell_axes else 1 for a in range(rank)])
            terms.append((src, full, choose(full)))
        plans.append((terms, per[-1]))
    if all(how == "shell" for terms, _ in plans for _, _, how in terms):
        return None
    field = tuple(g.count for g in geom)
    steps = [g.step for g in geom]
    leaves = []
    for (terms, bias), v in zip(plans, closed.jaxpr.outvars, strict=True):
        dtype = v.aval.dtype
        out = None
        for src, w, how in terms:
            if how == "fft" and _whole_periodic(src, geom):
                lows = [lo for lo, _ in src.pads]
                part = _circular(src.array.astype(dtype), w, lows, steps, field)
                out = part if out is None else out + part
                continue
            x, shift = src.block(geom)
            starts = [geom[a].start + shift[a] for a in range(rank)]
            limits = [s0 + geom[a].step * (geom[a].count - 1) + w.shape[a]
                      for a, s0 in enumerate(starts)]
            if starts != [0] * rank or limits != list(x.shape):
                x = lax.slice(x, starts, limits)
            if x is not src.array:
                # materialize the padded block once: fused into every shifted
                # slice, its concatenation is recomputed per tap (7x7 'extend'
                # at 1024**2 measured 28 ms against 5 ms for 'periodic')
                x = lax.optimization_barrier(x)
            part = correlate(x.astype(dtype), w, steps, field, how)
            out = part if out is None else out + part
        if out is None:
            out = jnp.zeros(field, dtype)
        if np.any(bias):
            out = out + np.asarray(bias, dtype)
        leaves.append(out.astype(dtype))
    return leaves

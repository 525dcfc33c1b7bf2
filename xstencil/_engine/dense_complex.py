"""Complex window sums for :mod:`xstencil._engine.dense`: real correlations.

A linear window sum over complex data, or with complex weights (``w =
exp(1j * phase)``), is taken as the real correlations of its parts:
``out = (xr * wr - xi * wi) + 1j * (xr * wi + xi * wr)``, each term one real
correlation lowered as real data are (shifted slices, separable passes, the
FFT or the rows loop), with their centring and their handling of NaN and
inf.  Real weights (constants known to be real) take two correlations, real
data under complex weights two, complex data under complex or runtime
weights four.  A part that is 0 is not read, as a cell of weight 0 is not:
``inf + 0j`` times a real weight gives ``inf + 0j`` (as
``scipy.ndimage.correlate`` gives it, part by part), where the kernel's own
complex product gives ``inf + nanj`` (``inf * 0`` in the imaginary part).
The default NaN fill pads complex data with ``nan + nanj`` (:func:`nan_halo`),
so both parts of an output whose window reaches the halo are NaN.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend import core as jcore

from xstencil._engine.linear import component

__all__ = ["component", "is_complex", "nan_halo", "real_weights", "split_correlate"]


def is_complex(x: Any) -> bool:
    """Whether the array or dtype ``x`` is complex."""
    return np.dtype(getattr(x, "dtype", x)).kind == "c"


def nan_halo(src: Any) -> Any:
    """``src`` (a :class:`~xstencil._engine.lower.Source`), whose complex
    array's halo is filled with ``nan + nanj`` where its fill value is a
    real NaN (the default, as xarray's ``rolling`` fills complex data):
    ``nan + 0j`` would leave the imaginary parts of the edge outputs finite
    sums, as if the halo's imaginary part were 0."""
    fill = src.fill_value
    if not is_complex(src.array) or "fill" not in src.modes \
            or not isinstance(fill, float | np.floating) or not math.isnan(fill):
        return src
    return dataclasses.replace(src, fill_value=complex(math.nan, math.nan))


def _parts(a: Any, weights: bool) -> tuple[Any, Any]:
    """The real and imaginary parts of ``a``, ``None`` for a part known to be
    0 (a real array's imaginary part, a part of constant weights that is all
    0: its cells are not read).  A complex data part of zeros is read (an
    infinite weight times it is NaN)."""
    if not is_complex(a):
        return a, None
    if weights and isinstance(a, np.ndarray):
        re, im = np.ascontiguousarray(a.real), np.ascontiguousarray(a.imag)
        return (re if np.any(re) else None), (im if np.any(im) else None)
    return jnp.real(a), jnp.imag(a)


def split_correlate(p: Any, w: Any, run: Callable[[Any, Any], Any], counts: Any,
                    dtype: Any) -> Any:
    """The correlation of ``p`` with ``w``, one of them complex, as the real
    correlations ``run(x, v)`` of their parts, in the complex ``dtype``."""
    pr, pi = _parts(p, False)
    wr, wi = _parts(w, True)

    def total(pairs: list[tuple[Any, Any, float]]) -> Any:
        out = None
        for x, v, sign in pairs:
            if x is None or v is None:
                continue
            part = run(x, v)
            if out is None:
                out = part if sign > 0 else -part
            else:
                out = out + part if sign > 0 else out - part
        return jnp.zeros(tuple(counts), component(dtype)) if out is None else out

    re = total([(pr, wr, 1.0), (pi, wi, -1.0)])
    im = total([(pr, wi, 1.0), (pi, wr, 1.0)])
    return lax.complex(re.astype(component(dtype)), im.astype(component(dtype)))


# what a value is, for real_weights: a cell value whose coefficients are real
# or may not be, a value of no cell that is real (its imaginary part 0) or may not be
_CREAL, _CANY, _REAL, _ANY = "creal", "cany", "real", "any"
# primitives that keep real values real and real coefficients real
_KEEPS = frozenset({"neg", "copy", "copy_p", "slice", "squeeze", "reshape", "transpose",
                    "broadcast_in_dim", "rev", "expand_dims", "reduce_sum", "cumsum", "split",
                    "add", "sub", "add_any", "mul", "div", "dot_general", "concatenate", "pad",
                    "convert_element_type", "optimization_barrier", "select_n", "gather",
                    "dynamic_slice", "dynamic_update_slice", "scatter-add", "scatter_add"})
_CALLS = frozenset({"jit", "pjit", "closed_call", "core_call", "remat", "checkpoint"})


def real_weights(closed: Any, n: int) -> bool:
    """Whether the weights of ``closed`` (an affine kernel whose first ``n``
    inputs are the window cells, see :func:`xstencil._engine.affine.
    is_affine`) are real whatever its inputs: every complex value its
    cells are multiplied by is made of real values (its imaginary part is
    0).  ``(u * w).sum()`` over complex ``u`` with a real ``w`` closed over
    (so traced) casts ``w`` to complex; its runtime weights are complex,
    with an imaginary part known to be 0, and the sum takes two real
    correlations instead of four."""
    jaxpr = closed.jaxpr
    consts = [_const_kind(c) for c in closed.consts]
    ins = [_CREAL] * n + [_REAL if not is_complex(v.aval.dtype) else _ANY
                          for v in jaxpr.invars[n:]]
    try:
        outs = _kinds(jaxpr, consts, ins)
    except KeyError:
        return False
    return all(k in (_CREAL, _REAL, _ANY) for k in outs)  # a bias may be complex


def _const_kind(c: Any) -> str:
    """A constant's kind: real where its imaginary part is known to be 0."""
    if not is_complex(np.result_type(c)):
        return _REAL
    if isinstance(c, jax.core.Tracer):
        return _ANY
    return _ANY if np.any(np.imag(np.asarray(c))) else _REAL


def _kinds(jaxpr: Any, consts: list[str], ins: list[str]) -> list[str]:
    """The kinds (see :func:`real_weights`) of ``jaxpr``'s outputs."""
    env = dict(zip(jaxpr.constvars, consts, strict=True))
    env.update(zip(jaxpr.invars, ins, strict=True))

    def read(v: Any) -> str:
        return _const_kind(v.val) if isinstance(v, jcore.Literal) else env[v]

    for eqn in jaxpr.eqns:
        kinds = [read(v) for v in eqn.invars]
        name = eqn.primitive.name
        cell = [k in (_CREAL, _CANY) for k in kinds]
        if name in _CALLS:
            sub = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr"))
            sub_consts = list(getattr(sub, "consts", ()))
            sub = getattr(sub, "jaxpr", sub)
            outs = _kinds(sub, [_const_kind(c) for c in sub_consts],
                          kinds[len(kinds) - len(sub.invars):])
        elif not any(cell):
            real = name in _KEEPS and all(k == _REAL for k in kinds)
            outs = [_REAL if real or not is_complex(v.aval.dtype) else _ANY
                    for v in eqn.outvars]
        elif name not in _KEEPS:
            raise KeyError(name)  # not affine: is_affine refuses it too
        elif name in ("mul", "div", "dot_general"):
            # a cell value times a value of no cell: real coefficients stay real
            # times a real value (a product of cell values is not affine)
            ok = all(k in (_CREAL, _REAL) for k in kinds)
            outs = [_CREAL if ok else _CANY] * len(eqn.outvars)
        elif name == "select_n":
            ok = all(k in (_CREAL, _REAL) for k in kinds[1:] if k in (_CREAL, _CANY))
            outs = [_CREAL if ok else _CANY] * len(eqn.outvars)
        else:  # sums and moves: a value of no cell added in is a bias
            ok = all(k != _CANY for k in kinds)
            outs = [_CREAL if ok else _CANY] * len(eqn.outvars)
        env.update(zip(eqn.outvars, outs, strict=True))
    return [read(v) for v in jaxpr.outvars]

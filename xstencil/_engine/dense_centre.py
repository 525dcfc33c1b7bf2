"""Local centring of the one sum of shifted slices in :mod:`xstencil._engine.dense`.

A sum ``out[j] = sum_c w[c] * p[j + c]`` whose terms cancel (an anomaly
filter, a Laplacian over a large window) loses the digits that an offset of
the data carries: its partial sums reach ``sum(|w|) * |p|``, so over 9 x 9
on float32 temperatures near 280 K ``(u - u()).sum()`` was off by 0.005
against values near 1.  Each output is therefore computed as

    ``sum_c w[c] * (p[j + c] - r[j]) + r[j] * sum(w)``

with ``r[j]`` the value at the centre cell of output ``j``'s window
(:func:`reference`): the differences are exact where a value is within a
factor 2 of ``r[j]``, the partial sums are of the size of the window's local
spread, and the weight sum is that of the weights as the sum uses them,
carried as two numbers of the data's dtype (:func:`weight_sum`,
:func:`runtime_weight_sum`), so the identity holds to the rounding of the
result.  The reference is taken only where it cannot change which outputs
are finite: it is a finite value, small enough that ``p - r[j]`` and
``r[j] * sum(w)`` cannot overflow, and the weights are finite; elsewhere it
is ``+0.0``, and the sum is bitwise the plain one (``p - 0.0`` is ``p``, and
:func:`restore` adds ``-0.0``).  A NaN or inf cell therefore still spoils
exactly the outputs whose windows hold it under a nonzero weight, and a cell
of weight 0 is still not read (its slice is not taken, or, for runtime
weights, is masked as before).  Constant weights are centred only where
they cancel (:data:`CANCEL`); the separable passes are centred the same way
(:func:`xstencil._engine.dense._separable_centred`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

from xstencil._engine.elements import linear_mode

__all__ = ["CANCEL", "applies", "cancels", "guard", "reference", "restore", "runtime_weight_sum",
           "weight_sum"]


def applies(dtype: Any) -> bool:
    """Whether a sum in ``dtype`` is centred: floating data (integer sums are
    exact), outside the operator of a linear solve (whose transpose needs a
    function linear in the data: :func:`~xstencil._engine.elements.linear_mode`)."""
    return jnp.issubdtype(dtype, jnp.floating) and not linear_mode()


def _limit(dtype: Any) -> float:
    """Half an ulp of the dtype's largest value: ``p - r`` rounds to a
    finite value for every finite ``p`` when ``|r|`` is below it."""
    info = jnp.finfo(dtype)
    return float(2.0 ** (int(info.maxexp) - int(info.nmant) - 2))


def reference(p: Any, shape: Sequence[int], steps: Sequence[int], counts: Sequence[int],
              abs_sum: Any, ok: Any = True) -> Any:
    """Per output, the value at the centre cell of its window (a slice of
    ``p`` like the terms'), or ``+0.0`` where it is not finite, is ``-0.0``,
    or ``|r| * max(1, abs_sum)`` (``abs_sum``: the weights' ``sum(|w|)``)
    reaches :func:`_limit`, or where ``ok`` (a scalar) is false.  No
    derivative flows through it: the centred sum is the same function of
    ``p``."""
    centre = [k // 2 for k in shape]
    limits = [s + st * (n - 1) + 1 for s, st, n in zip(centre, steps, counts, strict=True)]
    return guard(lax.slice(p, centre, limits, tuple(steps)), abs_sum, ok)


def guard(r: Any, abs_sum: Any, ok: Any = True) -> Any:
    """The values ``r`` as references (see :func:`reference`): ``+0.0``
    where not finite, ``-0.0``, too large for ``abs_sum`` or not ``ok``;
    no derivative."""
    r = lax.stop_gradient(r)
    bound = jnp.asarray(_limit(r.dtype) / 2, np.float32 if r.dtype != np.float64 else r.dtype)
    scale = jnp.maximum(jnp.asarray(abs_sum, bound.dtype), 1)
    keep = jnp.isfinite(r) & (r != 0) & (jnp.abs(r).astype(bound.dtype) * scale < bound) & ok
    return jnp.where(keep, r, jnp.zeros((), r.dtype))


def restore(total: Any, r: Any, hi: Any, lo: Any) -> Any:
    """``total + r * (hi + lo)``, where ``hi + lo`` is the weights' sum: the
    centred sum with the reference's share added back.  Where that share is
    0 (no reference) ``-0.0`` is added, which leaves ``total`` as it is,
    signed zeros included; a non-finite share (a reference of 0 times an
    infinite sum) is never added."""
    back = r * hi
    if lo is not None:
        back = back + r * lo
    return total + jnp.where((back != 0) & jnp.isfinite(back), back,
                             jnp.asarray(-0.0, total.dtype))


#: Constant weights are centred where ``sum(|w|)`` exceeds ``|sum(w)|`` this
#: many times (they cancel: a Laplacian, a derivative, an anomaly filter).
#: Elsewhere (a blur, a box, a Gaussian) the plain sum's rounding, about an
#: ulp of ``sum(|w|) * |p|``, is within this many ulps of the result's own
#: scale on offset data, and centring would cost 10-100 % of the sum's time
#: for nothing.  Runtime weights, unknown when compiling, are always centred.
CANCEL = 2.0


def cancels(hi: Any, lo: Any, abs_sum: float) -> bool:
    """Whether constant weights of exact sum ``hi + lo`` and ``sum(|w|)``
    ``abs_sum`` cancel enough to be centred (:data:`CANCEL`)."""
    total = abs(float(hi) + (float(lo) if lo is not None else 0.0))
    return abs_sum > CANCEL * total


def weight_sum(ws: Sequence[Any], dtype: Any) -> tuple[np.ndarray, np.ndarray | None, float]:
    """``(hi, lo, abs_sum)`` of constant weights ``ws`` as the sum uses them
    (already cast to ``dtype``): ``hi + lo`` is their exact sum (correctly
    rounded in float64, ``math.fsum``) in two numbers of ``dtype``
    (``lo`` ``None`` when 0)."""
    vals = [float(np.asarray(c, np.float64)) for c in ws]
    total = math.fsum(vals)
    hi = np.asarray(total, dtype)
    rest = total - float(hi)
    lo = np.asarray(rest, dtype) if rest != 0 else None
    return hi, lo, math.fsum(abs(v) for v in vals)


def runtime_weight_sum(w: Any) -> tuple[Any, Any, Any]:
    """``(hi, lo, abs_sum)`` of runtime weights ``w`` (traced, in the data's
    dtype): ``hi`` their sum as a balanced tree, ``lo`` the rounding errors
    of its additions (each recovered exactly by Knuth's two-sum), summed,
    so that ``hi + lo`` is the exact sum to a rounding of the errors'
    size (an ulp of an ulp)."""
    v = w.reshape(-1)
    lo = jnp.zeros((), w.dtype)
    while v.shape[0] > 1:
        if v.shape[0] % 2:
            v = jnp.concatenate([v, jnp.zeros((1,), v.dtype)])
        a, b = v[0::2], v[1::2]
        s = a + b
        bb = s - a
        err = (a - (s - bb)) + (b - bb)
        lo = lo + jnp.sum(err)
        v = s
    hi = v[0] if v.shape[0] else jnp.zeros((), w.dtype)
    return hi, lo, jnp.sum(jnp.abs(w))

"""Non-finite values in the FFT lowering of :mod:`xstencil._engine.dense`.

A direct weighted sum ``out[j] = sum_c w[c] * x[j + c]`` over the cells of
nonzero weight makes non-finite only the outputs whose windows meet a
non-finite term; an FFT spreads one NaN or inf over the whole field.
:func:`finite_guard` runs the FFT as it is where everything is finite (the
check costs no pass over the data) and :func:`nonfinite` otherwise, which
gives the direct sum's NaN and +-inf footprint.  Both run the FFT through
:func:`scaled`: its sums run over the whole field, so on data or weights
that are huge but finite they overflowed (every output NaN) where each
window's direct sum is finite.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from xstencil._engine.dense_hoist import report

__all__ = ["finite_guard", "nonfinite", "scaled"]


def finite_guard(x: Any, w: Any, run: Callable[..., Any],
                 fast: Callable[..., Any] | None = None) -> Any:
    """``run(x, w)`` (an FFT correlation), with non-finite values handled as
    the direct sum (cells of weight 0 not read) handles them: an FFT spreads
    one NaN or inf over the whole output.  When ``x`` or ``w`` holds any
    (checked at run time), :func:`nonfinite` zeroes them for the FFT and
    sets the outputs whose windows read one to what the direct sum gives.
    ``fast`` replaces ``run`` where all is finite (a spectrum given from
    outside the program, :mod:`xstencil._engine.dense_hoist`).

    With ``fast`` (the staged program of :mod:`xstencil._engine.dense_hoist`,
    all-finite path only), the FFT runs unscaled and the check is the sum of
    all its outputs, read after it (so the program stays one chain of steps,
    with no branch beside the FFTs: read off the data's transform
    mid-program, a check cost 0.4-1 ms a call at 1024**2).  Any NaN or inf
    in ``x`` or ``w`` reaches the outputs (NaN and inf are absorbing under
    the sums and products of an FFT), and so does an overflow of the FFT's
    own sums on huge finite values: each output is computed from finite
    intermediates or is non-finite.  A failed check runs the call again as
    the plain program, which runs the FFT on the data and weights scaled by
    powers of two (:func:`scaled`), so finite values never overflow it, and
    takes :func:`nonfinite` where the data hold NaN or inf.  (The first
    output alone, the check before, did not catch an overflow elsewhere.)
    ``fast`` is called as ``fast(x, w, factor)``, its given spectrum to be
    multiplied by ``factor``."""
    dtype = x.dtype
    if np.dtype(dtype) not in (np.float32, np.float64):  # no half-precision FFTs
        x = x.astype(np.float32)

    def dirty(x: Any, w: Any) -> Any:
        return nonfinite(x, w, run)

    if isinstance(w, np.ndarray) and not np.all(np.isfinite(w)):
        return dirty(x, w).astype(dtype)  # known now: every output reads the weight
    if fast is not None:  # the staged program: all-finite only (see dense_hoist.report)
        out = fast(x, w, jnp.ones((), dtype=x.dtype))
        # the sum of every output: non-finite if any one is (NaN and inf absorb
        # under addition; a sum that merely overflows only takes the exact path).
        # 2-7 % of a 1024**2 call, where all(isfinite) cost 10-15 % and the
        # scaling of the plain program (:func:`scaled`) 15-20 %.
        ok = jnp.all(jnp.isfinite(w)) & jnp.isfinite(jnp.sum(out))
        report(ok)
        return out.astype(dtype)
    # the plain program (in transforms, and for data that are not finite, or
    # whose FFT overflowed): a pass over x, so that the exact path does not
    # transform x for nothing
    ok = jnp.all(jnp.isfinite(x))
    if not isinstance(w, np.ndarray):
        ok = ok & jnp.all(jnp.isfinite(w))

    def clean(x: Any, w: Any) -> Any:
        return scaled(run, x, w)

    if isinstance(w, np.ndarray):
        return lax.cond(ok, lambda x: clean(x, w), lambda x: dirty(x, w), x).astype(dtype)
    return lax.cond(ok, clean, dirty, x, w).astype(dtype)


def nonfinite(x: Any, w: Any, run: Callable[[Any, Any], Any]) -> Any:
    """The correlation of ``x`` and ``w`` where either holds NaN or inf, as
    the direct sum gives it: the FFT of both with those values zeroed, and
    at the outputs whose windows meet one (a term ``w[c] * x[j + c]`` with
    ``w[c] != 0`` that is not finite) NaN where such a term is NaN or the
    infinite terms differ in sign, else the infinity.  The terms are
    counted by FFT correlations of indicator arrays (0/1, exact to well
    under 0.5); an input without infinities skips the sign counts.  A
    finite sum that overflows is not reproduced.

    Runtime weights: the correlations of a group run as one batched FFT
    (``vmap``), which compiles as one (each separate FFT adds compile time)."""
    const = isinstance(w, np.ndarray)
    xp = jnp if not const else np

    def corr(pairs: list[tuple[Any, Any]]) -> list[Any]:
        """The correlation of each pair (data, weights) of arrays."""
        if not const:
            xs = jnp.stack([xm.astype(x.dtype) for xm, _ in pairs])
            ws = jnp.stack([wm.astype(x.dtype) for _, wm in pairs])
            got = jax.vmap(lambda a, b: scaled(run, a, b))(xs, ws)
            return [got[i] for i in range(len(pairs))]
        return [scaled(run, xm.astype(x.dtype), np.asarray(wm, np.float64)) for xm, wm in pairs]

    def hits(pairs: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
        return [(xm, wm) for xm, wm in pairs if not const or np.any(wm)]

    def any_of(parts: list[Any]) -> Any:
        if not parts:
            return jnp.zeros(out_shape, bool)
        total = parts[0]
        for part in parts[1:]:
            total = total + part
        return total > 0.5

    xfin = jnp.isfinite(x)
    x0 = jnp.where(xfin, x, jnp.zeros((), x.dtype))
    w0 = xp.where(xp.isfinite(w), w, xp.zeros((), w.dtype))
    wpos, wneg = w > 0, w < 0
    first = corr([(x0, w0)] + hits([(jnp.isnan(x), w != 0)]))
    out, out_shape = first[0], first[0].shape
    # every output reads every weight: a NaN weight makes all NaN
    nan = any_of(first[1:]) | xp.any(xp.isnan(w))

    def signs(x: Any) -> tuple[Any, Any]:
        xpi, xni = x == np.inf, x == -np.inf
        xposf, xnegf = (x > 0) & xfin, (x < 0) & xfin
        pos = hits([(xpi, wpos), (xni, wneg), (xposf, w == np.inf), (xnegf, w == -np.inf)])
        neg = hits([(xni, wpos), (xpi, wneg), (xposf, w == -np.inf), (xnegf, w == np.inf)])
        zero = hits([(x == 0, xp.isinf(w))])  # inf * 0: NaN
        got = corr(pos + neg + zero)
        return (any_of(got[:len(pos)]), any_of(got[len(pos):len(pos) + len(neg)]),
                any_of(got[len(pos) + len(neg):]))

    def no_signs(x: Any) -> tuple[Any, Any, Any]:
        no = jnp.zeros(out_shape, bool)
        return no, no, no

    winf = xp.isinf(w)
    if const and np.any(winf):
        pos, neg, zero = signs(x)
    else:
        pred = jnp.any(jnp.isinf(x)) if const else jnp.any(jnp.isinf(x)) | jnp.any(winf)
        pos, neg, zero = lax.cond(pred, signs, no_signs, x)
    nan = nan | zero | (pos & neg)
    big = jnp.asarray(np.inf, out.dtype)
    out = jnp.where(pos, big, jnp.where(neg, -big, out))
    return jnp.where(nan, jnp.asarray(np.nan, out.dtype), out)


def _pow2(k: Any, dtype: Any) -> Any:
    """``2.0 ** k`` in ``dtype`` (float32 or float64), exactly: built from its
    bits (``k``: an int32 scalar within the normal exponent range)."""
    if np.dtype(dtype) == np.float64:
        bits = (k.astype(np.int64) + 1023) << 52
        return lax.bitcast_convert_type(bits, np.float64)
    return lax.bitcast_convert_type((k.astype(np.int32) + 127) << 23, np.float32)


def _exponent(a: Any) -> Any:
    """The binary exponent ``e`` of ``a``'s largest finite magnitude
    (``max|a| = m * 2**e``, ``0.5 <= m < 1``; 0 for none), kept within
    the normal range of ``a``'s dtype by a margin."""
    xp = np if isinstance(a, np.ndarray) else jnp
    mag = xp.abs(a)
    top = xp.max(xp.where(xp.isfinite(mag), mag, 0), initial=0)
    e = np.frexp(top)[1] if xp is np else _bits_exponent(top)
    lim = np.finfo(a.dtype).maxexp - 4
    return xp.clip(e, -lim, lim)


def _bits_exponent(m: Any) -> Any:
    """``frexp(m)[1]`` of a finite ``m >= 0`` read from its bits: 0 for 0,
    and for a subnormal 0 where XLA flushes it to zero, else the smallest
    normal exponent (either is within the caller's clip, and scales a
    subnormal field to at most 1).  Not ``jnp.frexp``: under ``vmap`` on a TPU (JAX 0.10.2)
    it failed to compile ("shift-right-arithmetic with different element
    types: s32 and u32"), which broke every FFT-lowered map there."""
    info = np.finfo(m.dtype)
    ints = {2: np.int16, 4: np.int32, 8: np.int64}[np.dtype(m.dtype).itemsize]
    bits = lax.bitcast_convert_type(m, ints)
    biased = (bits >> info.nmant) & (2 * info.maxexp - 1)
    e = biased.astype(np.int32) - (info.maxexp - 2)
    return jnp.where(m == 0, 0, e)


def _times_pow2(v: Any, e: Any, dtype: Any) -> Any:
    """``v * 2**e`` in three exact steps, each factor a normal number for
    ``|e|`` up to twice the dtype's exponent range, all scaling the same
    way (no step overflows or underflows unless the result does)."""
    e = jnp.asarray(e, np.int32)
    third = e // 3
    return v * _pow2(third, dtype) * _pow2(third, dtype) * _pow2(e - 2 * third, dtype)


def scaled(run: Callable[..., Any], x: Any, w: Any, factor: bool = False) -> Any:
    """``run(x, w)`` (a correlation, linear in each) computed on ``x`` and
    ``w`` scaled by powers of two to magnitudes of at most 1 and scaled
    back: an FFT's sums run over the whole field, so on huge finite values
    they overflowed (every output NaN) where each window's direct sum is
    finite.  Scaling by a power of two is exact, so results that did not
    overflow are bitwise the same (save values that underflow, far below
    the FFT's own error).  NaN and inf pass through unchanged.  ``factor``:
    ``run`` takes a third argument, the weights' scale (``2**-e``, in the
    data's dtype), for a weight spectrum computed outside from unscaled
    weights (the scale is exact on it too)."""
    dtype = x.dtype
    lim = np.finfo(dtype).maxexp - 4  # weights beyond the data's range keep their scale
    ex = _exponent(lax.stop_gradient(x))
    xs = _times_pow2(x, -ex, dtype)
    if isinstance(w, np.ndarray):
        w = np.asarray(w, np.float64)
        ew = int(np.clip(_exponent(w), -lim, lim))
        ws = np.ldexp(w, -ew)  # exact in float64
    else:
        if np.dtype(w.dtype) not in (np.float32, np.float64):  # half precision: exact
            w = w.astype(np.float32)
        ew = jnp.clip(_exponent(lax.stop_gradient(w)), -lim, lim)
        ws = _times_pow2(w, -ew, w.dtype)
    out = run(xs, ws, _pow2(-jnp.asarray(ew, np.int32), dtype)) if factor else run(xs, ws)
    return _times_pow2(out, ex + ew, dtype)

"""Non-finite values in the FFT lowering of :mod:`xstencil._engine.dense`.

A direct weighted sum ``out[j] = sum_c w[c] * x[j + c]`` over the cells of
nonzero weight makes non-finite only the outputs whose windows meet a
non-finite term; an FFT spreads one NaN or inf over the whole field.
:func:`finite_guard` runs the FFT as it is where everything is finite (the
check costs no pass over the data) and :func:`nonfinite` otherwise, which
gives the direct sum's NaN and +-inf footprint.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

__all__ = ["finite_guard", "nonfinite"]


def finite_guard(x: Any, w: Any, run: Callable[..., Any], forward: Callable[[Any], Any],
                  fast: Callable[..., Any] | None = None) -> Any:
    """``run(x, w)`` (an FFT correlation), with non-finite values handled as
    the direct sum (cells of weight 0 not read) handles them: an FFT spreads
    one NaN or inf over the whole output.  When ``x`` or ``w`` holds any
    (checked at run time), :func:`nonfinite` zeroes them for the FFT and
    sets the outputs whose windows read one to what the direct sum gives.
    ``fast`` replaces ``run`` where all is finite (a spectrum given from
    outside the program, :mod:`xstencil._engine.dense_hoist`).

    ``forward(x)`` is the data's transform, which ``run(x, w, X)`` takes
    instead of transforming ``x`` again: its zero-frequency entry (the sum
    of ``x``) is finite exactly when every value is (or, falsely, when a
    finite sum overflows, which only takes the slower exact path), so no
    separate pass over ``x`` checks it."""
    dtype = x.dtype
    if np.dtype(dtype) not in (np.float32, np.float64):  # no half-precision FFTs
        x = x.astype(np.float32)

    def dirty(x: Any, w: Any) -> Any:
        return nonfinite(x, w, run)

    if isinstance(w, np.ndarray) and not np.all(np.isfinite(w)):
        return dirty(x, w).astype(dtype)  # known now: every output reads the weight
    big = forward(x)
    ok = jnp.isfinite(big[(0,) * big.ndim])
    if not isinstance(w, np.ndarray):
        ok = ok & jnp.all(jnp.isfinite(w))

    def clean(x: Any, w: Any) -> Any:
        return (run if fast is None else fast)(x, w, big)

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
    finite sum that overflows is not reproduced."""
    const = isinstance(w, np.ndarray)
    xp = jnp if not const else np

    def ind(m: Any) -> Any:  # a 0/1 weight array
        return m.astype(np.float64) if const else m.astype(x.dtype)

    def count(terms: list[tuple[Any, Any]]) -> Any:
        total = None
        for xm, wm in terms:
            if const and not np.any(wm):
                continue  # a weight indicator known to be all 0
            part = run(xm.astype(x.dtype), ind(wm))
            total = part if total is None else total + part
        return None if total is None else total > 0.5

    xfin = jnp.isfinite(x)
    out = run(jnp.where(xfin, x, jnp.zeros((), x.dtype)),
              xp.where(xp.isfinite(w), w, xp.zeros((), w.dtype)))
    wnz, wpos, wneg = w != 0, w > 0, w < 0
    winf, wnan = xp.isinf(w), xp.isnan(w)
    nan_terms = [(jnp.isnan(x), wnz), (x == 0, winf), (jnp.ones_like(xfin), wnan)]

    def signs(x: Any) -> tuple[Any, Any]:
        xpi, xni = x == np.inf, x == -np.inf
        xposf, xnegf = (x > 0) & xfin, (x < 0) & xfin
        pos = count([(xpi, wpos), (xni, wneg), (xposf, w == np.inf), (xnegf, w == -np.inf)])
        neg = count([(xni, wpos), (xpi, wneg), (xposf, w == -np.inf), (xnegf, w == np.inf)])
        no = jnp.zeros(out.shape, bool)
        return (no if pos is None else pos), (no if neg is None else neg)

    def no_signs(x: Any) -> tuple[Any, Any]:
        no = jnp.zeros(out.shape, bool)
        return no, no

    if const and not np.any(winf):
        pos, neg = lax.cond(jnp.any(jnp.isinf(x)), signs, no_signs, x)
    elif const:
        pos, neg = signs(x)
    else:
        pos, neg = lax.cond(jnp.any(jnp.isinf(x)) | jnp.any(winf), signs, no_signs, x)
    nan = count(nan_terms)
    if nan is None:
        nan = jnp.zeros(out.shape, bool)
    nan = nan | (pos & neg)
    big = jnp.asarray(np.inf, out.dtype)
    out = jnp.where(pos, big, jnp.where(neg, -big, out))
    return jnp.where(nan, jnp.asarray(np.nan, out.dtype), out)

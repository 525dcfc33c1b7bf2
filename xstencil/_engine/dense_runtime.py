"""The slices and FFT lowerings of :mod:`xstencil._engine.dense` for runtime
weights: traced arrays, computed in the program by
:func:`xstencil._engine.affine.runtime_weights`, whose values are unknown
when compiling.  The shifts are static (every window cell is a term) and the
weights runtime scalars; the FFT transforms the weights in the program.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.custom_derivatives import SymbolicZero

from xstencil._engine.dense_centre import (
    CANCEL,
    applies,
    reference,
    restore,
    runtime_weight_sum,
)
from xstencil._engine.elements import linear_mode

__all__ = ["runtime_slices", "runtime_spectrum", "wrapped_runtime_spectrum"]


def runtime_slices(p: Any, w: Any, steps: Sequence[int], counts: Sequence[int],
                   centre: bool = False, rows: bool = False) -> Any:
    """The slices of :func:`xstencil._engine.dense.correlate` with runtime
    weights: every cell is a term, times its runtime scalar.  When some
    weight is 0 and ``p`` holds a non-finite value, each slice is masked
    where its weight is 0 (a cell of weight 0 is not read, and ``0 * nan``
    would be NaN).  Integers hold no NaN: their sum is the plain one, and so
    is the operator of a linear solve (:func:`~xstencil._engine.elements.
    linear_operator`), whose branch on ``p`` (the unknown) JAX cannot
    transpose: bicgstab's and gmres's gradients to a traced coefficient
    failed with a bare ``AssertionError``.  ``centre``: floating sums are
    taken of ``p`` less each output's reference value
    (:mod:`xstencil._engine.dense_centre`).  ``rows``: the sum runs as a
    loop over the window's first long axis (:func:`_total`)."""
    if not jnp.issubdtype(p.dtype, jnp.inexact) or linear_mode():
        return _total(p, w.astype(p.dtype), tuple(steps), tuple(counts), False, rows=rows)
    return _runtime_sum(p, w.astype(p.dtype), tuple(steps), tuple(counts),
                        centre and applies(p.dtype), rows)


def _total(p: Any, w: Any, steps: tuple[int, ...], counts: tuple[int, ...],
           masked: bool, centre: bool = False, rows: bool = False) -> Any:
    """``sum_c w[c] * slice_c(p)``, as a balanced tree; ``masked`` drops the
    slices of cells whose weight is 0; ``centre`` takes the sum of ``p``
    less each output's reference value, where the weights are all finite
    (:mod:`xstencil._engine.dense_centre`).

    ``rows``: a ``lax.fori_loop`` over the window's first axis longer than
    1, each step the balanced tree of one row's cells (of a dynamic slice
    of ``p``), added to the rows before it.  The program holds one row's
    terms, not the whole window's, so it compiles in about a second at any
    window size; on a TPU v5e it also ran faster than the one sum of every
    cell and than the FFT up to 31 x 31 (:data:`xstencil._engine.dense.
    ROW_TAPS`).  The sum's order differs from the tree's: the results
    agree to rounding."""
    r = None
    if centre and w.size:
        hi, lo, abs_sum = runtime_weight_sum(w)
        # centred only where the weights cancel (CANCEL), as constant weights
        # are: centring a blur over a window mostly of padding made partial
        # sums of r * sum(w) (11 x 11 weights 0..120 on one float32 row,
        # fill 0, fused rows: off by 7e-4 against 1e-5 by the FFT)
        r = reference(p, w.shape, steps, counts, abs_sum,
                      jnp.isfinite(hi) & jnp.isfinite(abs_sum)
                      & (abs_sum > CANCEL * jnp.abs(hi + lo)))
    long = [a for a in range(w.ndim) if w.shape[a] > 1]
    if rows and long:
        a = long[0]
        span = steps[a] * (counts[a] - 1) + 1
        inner = tuple(1 if b == a else steps[b] for b in range(w.ndim))

        def row(i: Any, acc: Any) -> Any:
            block = lax.dynamic_slice_in_dim(p, i, span, axis=a)
            if steps[a] != 1:
                block = lax.slice_in_dim(block, 0, span, steps[a], axis=a)
            return acc + _cells(block, lax.dynamic_slice_in_dim(w, i, 1, axis=a), inner,
                                counts, masked, r)

        total = lax.fori_loop(0, w.shape[a], row, jnp.zeros(counts, p.dtype))
    else:
        total = _cells(p, w, steps, counts, masked, r)
    return total if r is None else restore(total, r, hi, lo)


def _cells(p: Any, w: Any, steps: tuple[int, ...], counts: tuple[int, ...],
           masked: bool, r: Any) -> Any:
    """The balanced tree of ``w[c] * slice_c(p - r)`` over every cell of
    ``w`` (see :func:`_total`)."""
    terms = []
    for cell in np.ndindex(w.shape):
        limits = [s + st * (n - 1) + 1 for s, st, n in zip(cell, steps, counts, strict=True)]
        piece = lax.slice(p, list(cell), limits, steps)
        if r is not None:
            piece = piece - r
        c = w[cell]
        if masked:
            piece = jnp.where(c != 0, piece, jnp.zeros((), p.dtype))
        terms.append(piece * c)
    if not terms:
        return jnp.zeros(counts, p.dtype)
    while len(terms) > 1:
        terms = [terms[i] + terms[i + 1] if i + 1 < len(terms) else terms[i]
                 for i in range(0, len(terms), 2)]
    return terms[0]


@functools.partial(jax.custom_jvp, nondiff_argnums=(2, 3, 4, 5))
def _runtime_sum(p: Any, w: Any, steps: tuple[int, ...], counts: tuple[int, ...],
                 centre: bool = False, rows: bool = False) -> Any:
    def plain(p: Any, w: Any) -> Any:
        return _total(p, w, steps, counts, False, centre, rows)

    def checked(p: Any, w: Any) -> Any:  # some weight is 0: is there a NaN to mask?
        return lax.cond(jnp.all(jnp.isfinite(p)), plain,
                        lambda p, w: _total(p, w, steps, counts, True, centre, rows), p, w)

    # no weight 0 (dense weights): nothing to mask, and no pass over p to check
    return lax.cond(jnp.all(w != 0), plain, checked, p, w)


@functools.partial(_runtime_sum.defjvp, symbolic_zeros=True)
def _runtime_sum_jvp(steps: tuple[int, ...], counts: tuple[int, ...], centre: bool,
                     rows: bool, primals: Any, tangents: Any) -> tuple[Any, Any]:
    """The sum is bilinear: its tangent is two sums without the branches
    (whose derivatives, through ``lax.cond``, compiled in 13 s for a 9x9
    window against 2 s).  Non-finite values of ``p`` read as 0 in the
    weights' tangent, as a cell of weight 0 is not read."""
    p, w = primals
    dp, dw = tangents
    out = _runtime_sum(p, w, steps, counts, centre, rows)
    t = jnp.zeros(counts, p.dtype)
    if not isinstance(dp, SymbolicZero):
        t = t + _total(dp, w, steps, counts, False, rows=rows)
    if not isinstance(dw, SymbolicZero):
        clean = jnp.where(jnp.isfinite(p), p, jnp.zeros((), p.dtype))
        t = t + _total(clean, dw, steps, counts, False, rows=rows)
    return out, t


def runtime_spectrum(w: Any, sizes: tuple[int, ...], dtype: Any,
                     lows: Sequence[int] | None) -> Any:
    """``conj(rfftn(w))`` of traced weights zero-padded to ``sizes``
    (``w.shape <= sizes``), one axis at a time: each axis is zero-padded to
    its size, and rolled by ``-lows`` when given (the weights wrapped onto a
    periodic field), just before its transform, so every pass but the last
    transforms only the weights' rows."""
    real = np.float64 if np.dtype(dtype) == np.float64 else np.float32
    cplx = np.complex128 if real == np.float64 else np.complex64
    spec = w.astype(real)
    for a in [w.ndim - 1, *range(w.ndim - 1)]:
        widths = [(0, 0)] * w.ndim
        widths[a] = (0, sizes[a] - w.shape[a])
        spec = jnp.pad(spec, widths)
        if lows is not None and lows[a]:
            spec = jnp.roll(spec, -lows[a], axis=a)
        spec = jnp.fft.rfft(spec, axis=a) if a == w.ndim - 1 else jnp.fft.fft(spec, axis=a)
    return jnp.conj(spec).astype(cplx)


def wrapped_runtime_spectrum(w: Any, shape: tuple[int, ...], dtype: Any,
                             lows: Sequence[int]) -> Any:
    """The spectrum of traced weights wrapped onto the periodic field: the
    FFT of the weights rolled by ``-lows``, or (a window wider than the
    field) of the weights wrapped explicitly first."""
    if any(k > n for k, n in zip(w.shape, shape, strict=True)):
        grids = np.meshgrid(*[(np.arange(k) - lo) % n
                              for k, lo, n in zip(w.shape, lows, shape, strict=True)],
                            indexing="ij")
        wrapped = jnp.zeros(shape, w.dtype).at[tuple(grids)].add(w)
        return runtime_spectrum(wrapped, shape, dtype, None)
    return runtime_spectrum(w, shape, dtype, lows)

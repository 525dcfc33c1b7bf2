"""Exact zeros from the FFT lowering of :mod:`xstencil._engine.dense`.

A direct sum over a window whose cells are all zero is exactly zero; an FFT
gives its rounding there instead (about 1e-7 of the field's scale in
float32), which a kernel then turns into a large finite number
(``1 / (u * w).sum()`` gave 131072 where the direct sum gives inf,
``jnp.log`` -11.8 or NaN for -inf, a normalised convolution
``(u * w).sum() / (m * w).sum()`` any ratio for 0 / 0).  :func:`exact_zeros`
sets those outputs to zero: where every cell of the bounding box of the
weights' nonzero cells holds 0 in the data (found exactly by a separable
OR over the box, a pass over the data per axis).  NaN counts as nonzero, so
non-finite windows keep what :mod:`xstencil._engine.dense_finite` gives
them.  Windows whose nonzero cells only meet weights of 0 inside the box,
and windows whose exact sum cancels to zero, keep the FFT's rounding.  The
zero is ``out - stop_gradient(out)``: its derivatives are the FFT's (the
weights), as the direct sum's are.  The host FFT of a purely linear sum on
numpy data (:mod:`xstencil._backends.hostfft`) does not do this yet.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

__all__ = ["exact_zeros"]


def exact_zeros(out: Any, p: Any, w: Any, starts: Sequence[int], steps: Sequence[int],
                counts: Sequence[int]) -> Any:
    """``out`` (the correlation ``out[j] = sum_c w[c] * p[starts + j * steps
    + c]``, from an FFT) with exactly 0 where the window's cells of nonzero
    weight (their bounding box) hold only zeros in ``p``."""
    shape = tuple(w.shape)
    if isinstance(w, np.ndarray):
        nz = np.nonzero(w)
        if not nz[0].size:
            return out  # no weight: the FFT's zero spectrum gives exact zeros
        lo = [int(i.min()) for i in nz]
        hi = [int(i.max()) + 1 for i in nz]
    else:
        lo, hi = [0] * len(shape), list(shape)
    # a window is all zero where no nonzero cell lies within its box: a
    # separable OR over the box (one pass per axis, strided as the outputs;
    # a 1038**2 block took 15 ms on 2 loaded cores, where two int32 cumsums
    # for a summed-area table took 257 ms and the FFT itself 144 ms)
    hit = p != 0
    for a in range(hit.ndim):
        first = starts[a] + lo[a]
        size = hi[a] - lo[a]
        hit = lax.slice_in_dim(hit, first, first + steps[a] * (counts[a] - 1) + size, axis=a)
        dims = [1] * hit.ndim
        dims[a] = size
        strides = [1] * hit.ndim
        strides[a] = steps[a]
        hit = lax.reduce_window(hit, False, lax.bitwise_or, tuple(dims), tuple(strides),
                                "VALID")
    return jnp.where(hit, out, out - lax.stop_gradient(out))

"""Lower constant-weight linear window sums by cost (DESIGN.md section 5).

The weights come from :func:`xstencil._engine.linear.weights` when they are
constants of the program, and otherwise (arrays the kernel closes over are
inputs of the compiled program, see :mod:`xstencil._engine.kcache`) from
:func:`xstencil._engine.affine.runtime_weights`, computed in the program from
the current values.  Constant weights:

* few nonzero weights (:data:`SLICE_TAPS`): the caller keeps its fused
  shifted slices, interior and boundary shell apart;
* weights of rank 1 (box, Gaussian): one pass of shifted slices per axis;
* dense: one sum of shifted slices of the padded block up to
  :data:`FFT_TAPS` weights, an FFT (``jnp.fft.rfftn``) above.  On numpy
  data outside JAX transforms the loop backend runs that FFT on the host
  instead, from :func:`plan` (:mod:`xstencil._backends.hostfft`).  On an
  accelerator (the fused lowering), windows of up to :data:`ROW_TAPS`
  cells run as a loop over their rows instead (:func:`fused_rows`): a TPU
  compiled the FFT in 16-25 s and the loop in about a second.

Each pads the block it reads once, with the boundary code of
:mod:`xstencil._engine.boundary`, and then takes a 'valid' correlation, so
every boundary mode and stride is honoured and one expression is compiled
whatever the window size.  Floating sums keep the digits of data with a
large offset: the FFT runs on the data less their mean (:func:`centred`),
the sum of slices and the separable passes on the data less each window's
centre value (:mod:`xstencil._engine.dense_centre`).

Runtime weights (traced arrays) are lowered by the window's size alone, as
their values are unknown when compiling: up to :data:`SLICE_TAPS` cells the
caller's shifted slices, up to :data:`FFT_TAPS` one sum of shifted slices
with a runtime scalar per cell, above an FFT of the runtime weights.  A cell
whose runtime weight is 0 is not read, as with constant weights: when the
block holds a NaN or an infinity, such cells are masked out.  Outside JAX
transforms the spectrum of runtime weights is computed outside the per-call
program (:mod:`xstencil._engine.dense_hoist`).  NaN and inf in the data or
the weights give the direct sum's answer on every lowering; the FFT's
handling is in :mod:`xstencil._engine.dense_finite`.

Complex data and complex weights are lowered as the real correlations of
their parts, each by its own cost (:mod:`xstencil._engine.dense_complex`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend import core as jcore

from xstencil._engine.affine import runtime_weights
from xstencil._engine.boundary import pads_fuse
from xstencil._engine.call import stand_in
from xstencil._engine.dense_centre import (
    applies,
    cancels,
    guard,
    reference,
    restore,
    weight_sum,
)
from xstencil._engine.dense_complex import (
    component,
    is_complex,
    nan_halo,
    real_weights,
    split_correlate,
)
from xstencil._engine.dense_finite import finite_guard
from xstencil._engine.dense_hoist import provided
from xstencil._engine.dense_runtime import (
    runtime_slices,
    runtime_spectrum,
    wrapped_runtime_spectrum,
)
from xstencil._engine.dense_zero import exact_zeros
from xstencil._engine.intcells import float_cells
from xstencil._engine.linear import integer, weights

__all__ = ["lower", "plan", "correlate", "beats_cells", "choose", "constant", "read_sources",
           "separable",
           "fast_size", "fft_dtype", "fused_rows", "spectrum", "whole_periodic", "wrapped",
           "SLICE_TAPS", "FFT_TAPS", "ROW_TAPS"]

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
#: never chosen for float sums; integer sums over large windows, which have no
#: exact FFT in XLA, take it: :data:`INTEGER_SLICES`).
FFT_TAPS = 100

#: Up to this many cells a window of runtime integer weights (closed over, so
#: traced: :func:`xstencil._engine.affine.runtime_weights`), or this many
#: nonzero constant integer weights, is one fused sum of shifted slices of the
#: padded block, each times its weight; above, one integer
#: ``lax.conv_general_dilated`` (:func:`_conv`).  Measured in XLA at 1024²
#: int32 (2 shared cores): slices 121 cells 3.9 ms, 289 cells 42 ms, 441
#: cells 64 ms, compiled in 0.2-0.8 s; the convolution 119-124 ms over a 25 x
#: 25 window and 174-213 ms over 31 x 31 (bool, uint8, int16 or int32 data), compiled
#: in 0.24-0.54 s.  The kernel's own cell-by-cell lowering, used above this
#: limit before, took 209-249 ms over 25 x 25 on bool and uint8 data and
#: refused int16 and int32 data (every window at once, 1.2-2.3 GiB).
INTEGER_SLICES = 441

#: Where the lowering is fused (:func:`~xstencil._engine.boundary.pads_fuse`:
#: JAX's default backend is a TPU or GPU), a window of more than
#: :data:`FFT_TAPS` and at most this many cells that is not separable is a
#: loop over its rows ('rows': :func:`~xstencil._engine.dense_runtime.
#: runtime_slices`), not one sum of every cell nor an FFT.  Measured on a TPU
#: v5e at 1024² float32 (session 30, lowerings written by hand): the loop
#: compiled in 0.9-1.4 s at every size and ran 0.61 ms a call at 15 x 15 and
#: 2.75 ms at 31 x 31, where the FFT compiled in 11-18 s (16-23 s with the
#: weights' transform; xstencil's 46-49 s under a user's ``jit``, with its
#: non-finite branch) and ran 1.05-1.34 ms (about 3 ms in xstencil, one warm
#: call each); one sum of 225 cells compiled in 4.9 s and ran 3.0 ms.  At
#: 63 x 63 the loop ran 17.5 ms, so larger windows keep the FFT.
ROW_TAPS = 1024



def choose(w: Any, integral: bool = False, integer_fft: int | None = None,
           dtype: Any = None) -> str | None:
    """The lowering for one weight array: 'shell' (keep the shifted-slice
    lowering of :mod:`~xstencil._engine.lower`, interior and boundary shell
    apart), 'separable', 'slices' (one sum over the padded block), 'fft' or
    'conv' (integer sums only); :func:`fused_rows` turns some 'slices' and
    'fft' into 'rows' in XLA programs for an accelerator.
    Runtime (traced) weights are chosen by their size, never 'separable'.
    ``integral``: the sum is in an integer dtype (exact, wrapping), so
    separable only into integer factors, and never an FFT unless
    ``integer_fft`` is given: the nonzero count above which a window that is
    not separable is an 'fft' for the host's exact integer FFT (rounded, see
    :mod:`~xstencil._backends.hostfft`; an XLA program never gets one).  An
    integer window over :data:`INTEGER_SLICES` cells is a 'conv' (one exact
    integer convolution); ``None`` where none of those is cheaper than the
    kernel's own lowering.  ``dtype``: the sum's (see :func:`separable`)."""
    if not isinstance(w, np.ndarray):
        size = math.prod(w.shape)
        if integral:  # runtime integer weights (affine.integer_affine): never an FFT
            return "shell" if size <= SLICE_TAPS else "slices" if size <= INTEGER_SLICES \
                else _integer_conv()
        return "shell" if size <= SLICE_TAPS else "slices" if size <= FFT_TAPS else "fft"
    nnz = int(np.count_nonzero(w))
    if nnz <= SLICE_TAPS:
        return "shell"
    if separable(w, integral, dtype) is not None:
        return "separable"
    if integral:
        if integer_fft is not None and nnz > integer_fft:
            return "fft"
        return "slices" if nnz <= INTEGER_SLICES else _integer_conv()
    return "slices" if nnz <= FFT_TAPS else "fft"


def _integer_conv() -> str | None:
    """'conv' for an integer window over :data:`INTEGER_SLICES` cells where
    XLA compiles for the CPU, whose integer convolution is exact (checked
    against numpy in the tests); elsewhere ``None`` (the kernel's own
    lowering): a GPU's convolutions are cuDNN's, which take integers only in
    some layouts and have not been checked for exact integer sums."""
    return "conv" if jax.default_backend() == "cpu" else None


def beats_cells(how: str, w: Any) -> bool:
    """Whether lowering ``how`` of the weights ``w`` costs less than reading
    every window cell at every point, as a loop nest does: an FFT, or
    separable passes over more than :data:`FFT_TAPS` cells (below that a
    nest reads its few cells faster than passes run).  ``w`` is read only
    for separable weights, which are constants."""
    return how == "fft" or (how == "separable" and np.count_nonzero(w) > FFT_TAPS)


#: Weights are separable where their outer product's deviation from them,
#: summed, is at most this many ulps (of the sum's dtype) of ``sum(|w|)``:
#: the passes' answer is then within that many roundings of the direct sum
#: (less, centred: :func:`_separable_centred`).  A float32 Gaussian (an
#: ``np.outer`` of float32 factors, a 2-D ``exp`` in float32, a
#: ``scipy.ndimage``/``skimage`` kernel, a ``jnp`` array) deviates by at most
#: 0.7 ulp of float32 there (per cell up to 5 ulps), and was not separable
#: under the former 1e-12 per cell (it ran as 81 slices at 9 x 9).
SEPARABLE_ULPS = 2


def separable(w: np.ndarray, integral: bool = False,
              dtype: Any = None) -> list[np.ndarray] | None:
    """1-D factors whose outer product is ``w``, or ``None`` (rank > 1);
    ``integral``: integer factors whose outer product is exactly ``w`` (an
    integer rank-1 array is one: a primitive integer vector per axis after
    the first, times integers), or ``None``.  ``dtype``: a floating sum's
    dtype, which sets the tolerance (:data:`SEPARABLE_ULPS` ulps of float32
    for float32 and narrower sums, of float64 for float64 ones); ``None``:
    float64's."""
    if w.ndim < 2 or is_complex(w) or not np.all(np.isfinite(w)):  # an inf or NaN
        return None  # weight, or complex weights (their real parts are, in correlate)
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
    if integral:
        if not np.allclose(outer, w, rtol=1e-12, atol=1e-14 * float(flat.max())):
            return None
        return _integer_factors(w, pivot)
    narrow = dtype is not None and np.dtype(dtype).itemsize < 8
    eps = float(np.finfo(np.float32 if narrow else np.float64).eps)
    if not np.abs(outer - w).sum() <= SEPARABLE_ULPS * eps * float(flat.sum()) or np.any(
            (outer != 0) != (w != 0)):  # a cell of weight 0 is not read by the passes either
        return None
    return factors


def _integer_factors(w: np.ndarray, pivot: tuple[int, ...]) -> list[np.ndarray] | None:
    """Integer factors of the integer rank-1 ``w`` through ``pivot``: each
    axis's fibre after the first divided by its gcd, the first axis's fibre
    divided by their product at the pivot; ``None`` unless exact."""
    if not np.all(w == np.round(w)):
        return None
    ints = np.round(w).astype(np.int64)
    factors: list[Any] = [None]
    scale = 1
    for a in range(1, w.ndim):
        idx = list(pivot)
        idx[a] = slice(None)
        fibre = ints[tuple(idx)]
        g = int(np.gcd.reduce(np.abs(fibre)))
        factors.append(fibre // g)
        scale *= int(factors[-1][pivot[a]])
    idx = list(pivot)
    idx[0] = slice(None)
    first = ints[tuple(idx)]
    if scale == 0 or np.any(first % scale):
        return None
    factors[0] = first // scale
    outer = factors[0]
    for f in factors[1:]:
        outer = np.multiply.outer(outer, f)
    if not np.array_equal(outer, ints):
        return None
    return [f.astype(np.float64) for f in factors]


def correlate(p: Any, w: np.ndarray, steps: Sequence[int], counts: Sequence[int],
              how: str) -> Any:
    """``out[j] = sum_c w[c] * p[j * steps + c]`` for ``j < counts``, where
    ``p`` is the padded block (a 'valid' correlation).  Complex ``p`` or
    ``w``: the real correlations of their parts
    (:mod:`~xstencil._engine.dense_complex`), each lowered by its own cost."""
    if is_complex(p) or is_complex(w):
        return split_correlate(p, w, lambda x, v: correlate(x, v, steps, counts,
                                                            _part_how(how, v, x.dtype)),
                               counts, _complex_of(p, w))
    if how == "separable":
        factors = separable(w, np.issubdtype(p.dtype, np.integer), p.dtype)
        if applies(p.dtype):
            return _separable_centred(p, w, factors, steps, counts)
        for a, f in enumerate(factors):
            p = _pass(p, f, a, steps[a], counts[a])
        return p
    if how == "slices":
        return _slices(p, w, steps, counts, centre=True)
    if how == "shell":
        return _slices(p, w, steps, counts)
    if how == "conv":
        return _conv(p, w, steps, counts)
    if how == "rows":
        if isinstance(w, np.ndarray):
            w = jnp.asarray(constant(w, p.dtype))
        return runtime_slices(p, w, steps, counts, centre=True, rows=True)
    return _fft(p, w, steps, counts)


def _part_how(how: str, v: Any, dtype: Any) -> str:
    """The lowering of one real part ``v`` of complex weights (lowered as
    ``how`` whole): constant parts are chosen again (the real part of a
    Gabor window is as dense as the whole, a part may be separable), runtime
    ones keep ``how`` (their size is the whole's)."""
    if not isinstance(v, np.ndarray):
        return how
    return fused_rows(choose(v, dtype=dtype) or how, v)


def _complex_of(p: Any, w: Any) -> np.dtype:
    """The complex dtype of the correlation of ``p`` with ``w`` (``p``'s
    precision: constant weights are cast to it)."""
    return np.dtype(np.complex128 if component(p.dtype) == np.float64 else np.complex64)


def fused_rows(how: str, w: Any) -> str:
    """``how``, or 'rows' (see :data:`ROW_TAPS`) where the lowering is fused
    and ``w`` is a window of more than :data:`FFT_TAPS` and at most
    :data:`ROW_TAPS` cells that would be one sum of slices or an FFT."""
    if how in ("slices", "fft") and pads_fuse() and FFT_TAPS < math.prod(w.shape) <= ROW_TAPS:
        return "rows"
    return how


def _pass(x: Any, f: np.ndarray, a: int, step: int, count: int, sub: Any = None) -> Any:
    """One separable pass: ``sum_i f[i] * x[.., j * step + i, ..]`` along
    axis ``a`` (``count`` outputs), of ``x`` less ``sub`` where given."""
    terms = []
    for i in np.nonzero(f)[0]:
        starts = [int(i) if b == a else 0 for b in range(x.ndim)]
        limits = [int(i) + step * (count - 1) + 1 if b == a else x.shape[b]
                  for b in range(x.ndim)]
        piece = lax.slice(x, starts, limits, tuple(step if b == a else 1
                                                   for b in range(x.ndim)))
        if sub is not None:
            piece = piece - sub
        terms.append(piece if f[i] == 1 else piece * constant(f[i], x.dtype))
    while len(terms) > 1:  # a balanced tree, as the shifted-slice lowering
        terms = [terms[i] + terms[i + 1] if i + 1 < len(terms) else terms[i]
                 for i in range(0, len(terms), 2)]
    return terms[0]


def _separable_centred(p: Any, w: np.ndarray, factors: list[np.ndarray],
                       steps: Sequence[int], counts: Sequence[int]) -> Any:
    """The separable passes, centred as the one sum of slices is
    (:mod:`xstencil._engine.dense_centre`), where the weights are finite.

    The pass along the first axis is taken of the block less ``q``, each
    output row's window-centre row (:func:`~xstencil._engine.dense_centre.
    guard`-ed: ``+0.0`` where not finite), and the other passes run on that
    small remainder as they are; ``q``'s own share is its correlation along
    the other axes, centred the same way in turn, down to the last axis,
    whose reference ``r`` is the window's centre value.  ``r`` times the
    exact sum of ``w`` (not of the factors' product) is added last, so the
    factors' rounding weighs only the local spread.  ``q`` and ``r`` are
    finite, so a NaN or inf still reaches exactly the outputs the plain
    passes give it to, and a factor of 0 does not read its cells."""
    cells = [constant(c, p.dtype) for c in w[np.nonzero(w)]]
    hi, lo, abs_sum = weight_sum(cells, p.dtype)
    if not np.all(np.isfinite(w)) or not cancels(hi, lo, abs_sum):
        for a, f in enumerate(factors):
            p = _pass(p, f, a, steps[a], counts[a])
        return p
    total = None
    x, scale = p, None  # the remainder's share so far is ``scale`` times x's correlation
    for a, f in enumerate(factors):
        centre = [f.size // 2 if b == a else 0 for b in range(x.ndim)]
        limits = [f.size // 2 + steps[a] * (counts[a] - 1) + 1 if b == a else x.shape[b]
                  for b in range(x.ndim)]
        q = guard(lax.slice(x, centre, limits, tuple(steps[a] if b == a else 1
                                                     for b in range(x.ndim))), abs_sum)
        part = _pass(x, f, a, steps[a], counts[a], sub=q)
        for b in range(a + 1, x.ndim):  # the remainder's passes along the other axes
            part = _pass(part, factors[b], b, steps[b], counts[b])
        if scale is not None:
            part = part * scale
        total = part if total is None else total + part
        x = q  # q's correlation along the axes left: the next pass's share
        s_a = constant(math.fsum(constant(c, p.dtype).item() for c in f), p.dtype)
        scale = s_a if scale is None else scale * s_a
    return restore(total, x, hi, lo)


def _conv(p: Any, w: Any, steps: Sequence[int], counts: Sequence[int]) -> Any:
    """The valid correlation as one ``lax.conv_general_dilated``.  Chosen for
    integer sums over windows too large for one sum of slices
    (:data:`INTEGER_SLICES`): XLA:CPU's integer convolution multiplies and
    adds in the block's dtype, wrapping as the kernel's own arithmetic does
    (exact for every integer dtype, checked against numpy in the tests), and
    reads the block once per tap with no window materialized.  Constant
    weights are cast to that dtype by :func:`constant` (through int64: a
    negative weight of an unsigned sum wraps), runtime ones as
    :func:`~xstencil._engine.dense_runtime.runtime_slices` casts them."""
    if isinstance(w, np.ndarray):
        kern = jnp.asarray(constant(w, p.dtype))
    else:
        kern = w.astype(p.dtype)
    inexact = jnp.issubdtype(p.dtype, jnp.inexact)
    out = lax.conv_general_dilated(p[None, None], kern[None, None], tuple(steps), "VALID",
                                   precision=lax.Precision.HIGHEST if inexact else None)
    return out[0, 0][tuple(slice(0, n) for n in counts)]


def _slices(p: Any, w: Any, steps: Sequence[int], counts: Sequence[int],
            centre: bool = False) -> Any:
    """``sum_c w[c] * slice_c(p)`` over the cells of nonzero weight, as a
    balanced tree; ``centre``: floating sums are taken of ``p`` less each
    output's reference value (:mod:`xstencil._engine.dense_centre`)."""
    if not isinstance(w, np.ndarray):
        return runtime_slices(p, w, steps, counts, centre)
    cells = list(zip(*np.nonzero(w), strict=True))
    ws = [constant(w[cell], p.dtype) for cell in cells]
    r = None
    if centre and cells and applies(p.dtype) and np.all(np.isfinite(w)):
        hi, lo, abs_sum = weight_sum(ws, p.dtype)
        if cancels(hi, lo, abs_sum):
            r = reference(p, w.shape, steps, counts, abs_sum)
    terms = []
    for cell, c in zip(cells, ws, strict=True):
        starts = [int(i) for i in cell]
        limits = [s + st * (n - 1) + 1 for s, st, n in zip(starts, steps, counts, strict=True)]
        piece = lax.slice(p, starts, limits, tuple(steps))
        if r is not None:
            piece = piece - r
        terms.append(piece if w[cell] == 1 else piece * c)
    if not terms:
        return jnp.zeros(tuple(counts), p.dtype)
    while len(terms) > 1:  # a balanced tree, as the shifted-slice lowering
        terms = [terms[i] + terms[i + 1] if i + 1 < len(terms) else terms[i]
                 for i in range(0, len(terms), 2)]
    return terms[0] if r is None else restore(terms[0], r, hi, lo)


def constant(c: Any, dtype: Any) -> np.ndarray:
    """The weight or bias ``c`` (float64) in ``dtype``; an integer dtype
    takes it through int64, so that a negative weight of an unsigned sum
    wraps as the kernel's own arithmetic does (``-7`` in uint32 is
    ``2**32 - 7``; a float cast to an unsigned integer is undefined)."""
    if np.issubdtype(np.dtype(dtype), np.integer):
        return np.asarray(np.round(c)).astype(np.int64).astype(dtype)
    return np.asarray(c, dtype)


def fast_size(n: int) -> int:
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


def spectrum(w: Any, sizes: tuple[int, ...], dtype: Any,
             lows: Sequence[int] | None = None) -> Any:
    """``conj(rfftn(w))`` zero-padded to ``sizes``, computed once in float64
    (a constant of the program, not an FFT at run time).  Runtime weights
    get an FFT in the program (see :mod:`xstencil._engine.dense_runtime`),
    and ``lows`` rolls them back by that much (see :func:`_circular_raw`)."""
    if not isinstance(w, np.ndarray):
        return runtime_spectrum(w, sizes, dtype, lows)
    big = np.zeros(sizes)
    big[tuple(slice(0, k) for k in w.shape)] = w
    spec = np.conj(np.fft.rfftn(big))
    return spec.astype(np.complex128 if np.dtype(dtype) == np.float64 else np.complex64)


def fft_dtype(dtype: Any) -> Any:
    """The dtype the FFT runs in (no half-precision FFTs)."""
    return np.dtype(dtype) if np.dtype(dtype) in (np.float32, np.float64) else np.dtype(np.float32)


def _fft(p: Any, w: np.ndarray, steps: Sequence[int], counts: Sequence[int]) -> Any:
    """The valid correlation as a circular one over an FFT-friendly size
    (the wrapped-around outputs are the ones dropped), NaN-safe."""
    fast = None
    if not isinstance(w, np.ndarray):  # runtime weights: a spectrum given from outside?
        sizes, dt = tuple(fast_size(n) for n in p.shape), fft_dtype(p.dtype)
        spec = provided(w, ("padded", sizes, dt.str),
                        lambda w: runtime_spectrum(w, sizes, dt, None))
        if spec is not None:
            def fast(x: Any, w: Any, factor: Any) -> Any:
                return _fft_raw(x, w, steps, counts, spec * factor.astype(spec.dtype))
    return finite_guard(p, w, lambda x, w: _fft_raw(x, w, steps, counts), fast)


def _fft_raw(p: Any, w: np.ndarray, steps: Sequence[int], counts: Sequence[int],
             spec: Any = None) -> Any:
    """The correlation over an FFT (of ``p`` less its mean, :func:`centred`);
    ``spec`` is the weights' transform where given from outside."""
    sizes = tuple(fast_size(n) for n in p.shape)
    axes = tuple(range(p.ndim))
    if spec is None:
        spec = spectrum(w, sizes, p.dtype)
    m, p0 = centred(p)
    full = jnp.fft.irfftn(jnp.fft.rfftn(p0, sizes, axes) * spec, sizes, axes)
    index = tuple(slice(0, st * (n - 1) + 1, st) for st, n in zip(steps, counts, strict=True))
    out = uncentred(full[index], m, spec).astype(p.dtype)
    return exact_zeros(out, p, w, (0,) * p.ndim, steps, counts)


def centred(x: Any) -> tuple[Any, Any]:
    """``(m, x - m)``, ``m`` the mean of ``x`` (no derivative: the FFT's
    result is the same function of ``x``).  Correlated by an FFT, ``x - m``
    keeps the digits that data with a large offset lose: the FFT's error is
    about an ulp of ``sum(|w|) * max|x|`` (``(u - u()).sum()`` over 15 x 15
    on float32 temperatures near 280 K was off by 0.015 against values near
    1, and is off by about 4e-7 centred).  Every output of a valid
    correlation reads a whole window, so :func:`uncentred` adds ``m`` times
    the weights' sum back."""
    m = lax.stop_gradient(jnp.mean(x)).astype(x.dtype)
    return m, x - m


def uncentred(out: Any, m: Any, spec: Any) -> Any:
    """``out + m * sum(w)``: the sum is the spectrum's zero frequency."""
    return out + m * jnp.asarray(spec.reshape(-1)[0].real, m.dtype)


def whole_periodic(src: Any, geom: Sequence[Any]) -> bool:
    """Whether the slab is the whole periodic field (no padding is needed:
    the FFT's own wrap-around is the boundary)."""
    if not src.pads or any(m != "periodic" for m in src.modes):
        return False
    return all(g.start == 0 and g.count == -(-n // g.step)
               for g, n in zip(geom, src.array.shape, strict=True))


def _circular(x: Any, w: np.ndarray, lows: Sequence[int], steps: Sequence[int],
              counts: Sequence[int]) -> Any:
    """``out[j] = sum_c w[c] * x[(j * steps + c - lows) mod n]``: one FFT pair
    on the unpadded array (the weights wrapped onto it), NaN-safe; complex
    ``x`` or ``w``: the circular correlations of their real parts."""
    if is_complex(x) or is_complex(w):
        return split_correlate(x, w, lambda x, v: _circular(x, v, lows, steps, counts),
                               counts, _complex_of(x, w))
    fast = None
    if not isinstance(w, np.ndarray):  # runtime weights: a spectrum given from outside?
        shape, dt = tuple(x.shape), fft_dtype(x.dtype)
        spec = provided(w, ("circular", shape, dt.str, tuple(lows)),
                        lambda w: wrapped_runtime_spectrum(w, shape, dt, lows))
        if spec is not None:
            def fast(x: Any, w: Any, factor: Any) -> Any:
                return _circular_raw(x, w, lows, steps, counts,
                                     spec * factor.astype(spec.dtype))
    return finite_guard(x, w, lambda x, w: _circular_raw(x, w, lows, steps, counts), fast)


def _circular_raw(x: Any, w: Any, lows: Sequence[int], steps: Sequence[int],
                  counts: Sequence[int], spec: Any = None) -> Any:
    """The circular correlation (of ``x`` less its mean, :func:`centred`);
    ``spec`` is the weights' transform where given from outside."""
    axes = tuple(range(x.ndim))
    m, x0 = centred(x)
    big = jnp.fft.rfftn(x0, axes=axes)
    if not isinstance(w, np.ndarray):
        if spec is None:
            spec = wrapped_runtime_spectrum(w, x.shape, x.dtype, lows)
    else:
        spec = spectrum(wrapped(w, lows, x.shape), x.shape, x.dtype)
    full = jnp.fft.irfftn(big * spec, x.shape, axes)
    index = tuple(slice(0, st * (n - 1) + 1, st) for st, n in zip(steps, counts, strict=True))
    out = uncentred(full[index], m, spec).astype(x.dtype)
    # the windows wrap: count zeros on the field wrapped by as much as they reach
    los = [max(0, lo) for lo in lows]
    his = [max(0, st * (c - 1) + k - 1 - lo - (n - 1)) for st, c, k, lo, n
           in zip(steps, counts, w.shape, lows, x.shape, strict=True)]
    xp = jnp.pad(x, list(zip(los, his, strict=True)), mode="wrap")
    starts = [a - lo for a, lo in zip(los, lows, strict=True)]
    return exact_zeros(out, xp, w, starts, steps, counts)


def wrapped(w: np.ndarray, lows: Sequence[int], shape: Sequence[int]) -> np.ndarray:
    """The weights ``w`` wrapped onto a periodic field of ``shape`` (float64):
    cell ``c`` lands at ``(c - lows) mod shape``, cells that land together
    add up, so that a circular correlation with them is the window sum."""
    out = np.zeros(tuple(shape))
    grids = np.meshgrid(*[(np.arange(k) - lo) % n for k, lo, n in zip(w.shape, lows, shape,
                                                                      strict=True)],
                        indexing="ij")
    np.add.at(out, tuple(grids), w)
    return out


def read_sources(closed: Any, n: int) -> list[int]:
    """The indices of the first ``n`` inputs (the window sources) the kernel
    reads.  Every labelled kernel is also handed its coordinates (packed,
    complex), which a weighted sum of the data does not read; left in, they
    would hide the linear sum from the dense lowering."""
    jaxpr = closed.jaxpr
    read = {v for eqn in jaxpr.eqns for v in eqn.invars if not isinstance(v, jcore.Literal)}
    read |= {v for v in jaxpr.outvars if not isinstance(v, jcore.Literal)}
    return [i for i in range(n) if jaxpr.invars[i] in read]


def _without_unread(closed: Any, keep: list[int], n: int) -> Any:
    """The kernel's jaxpr re-traced with only the sources ``keep`` as window
    inputs (the others are zeros: their values cannot matter)."""
    jaxpr = closed.jaxpr
    if len(keep) == n:
        return closed
    avals = [v.aval for v in jaxpr.invars]

    def kept(*args: Any) -> Any:
        it = iter(args[:len(keep)])
        cells = [next(it) if i in keep else jnp.zeros(avals[i].shape, avals[i].dtype)
                 for i in range(n)]
        return jax.core.eval_jaxpr(jaxpr, closed.consts, *cells, *args[len(keep):])

    stand = [stand_in(a.shape, a.dtype, a.weak_type) for a in avals]
    return jax.make_jaxpr(kept)(*[stand[i] for i in keep], *stand[n:])


def plan(closed: Any, sources: Sequence[Any], geom: Sequence[Any], dyn: Any = None,
         integer_fft: int | None = None
         ) -> list[tuple[list[tuple[int, Any, Any, str]], Any]] | None:
    """Per output of the kernel, its correlation terms ``(i, source, w, how)``
    (``i``: the index into ``sources``, ``w``: the weights, reshaped to the
    field's rank, ``how``: :func:`choose`'s lowering) and its bias, or
    ``None`` when the kernel is not a linear sum of its windows or every
    weight array is small enough for shifted slices (see :func:`lower`).
    ``integer_fft``: see :func:`choose` (the host's exact integer FFT only)."""
    rank = len(geom)
    keep = read_sources(closed, len(sources))
    n, sources = len(sources), [sources[i] for i in keep]
    if not sources:
        return None
    shapes = [tuple(geom[a].size for a in s.cell_axes) for s in sources]
    if sum(math.prod(s) for s in shapes) <= SLICE_TAPS:
        return None
    closed = _without_unread(closed, keep, n)  # re-traced only for a window worth it
    # integer results: integer sums, exact and wrapping (linear.integer); else integer
    # and bool cells cast to a float before any arithmetic, read as those floats
    # (intcells.py); the lowering casts the block to the output's dtype either way
    integral = integer(closed) is not None
    if not integral:
        closed = float_cells(closed, len(sources))
        if closed is None:
            return None
    found = weights(closed, shapes)
    if found is None:
        if dyn is None or any(tuple(s.axes) != tuple(range(rank)) for s in sources) or all(
                math.prod(s) <= SLICE_TAPS for s in shapes):
            return None
        found = runtime_weights(closed, shapes, dyn)
        if found is None:
            return None
        if any(is_complex(v.aval.dtype) for v in closed.jaxpr.outvars) and real_weights(
                closed, len(sources)):  # complex data, real weights: 2 real correlations
            found = [[jnp.real(w) for w in per[:-1]] + [per[-1]] for per in found]
    plans = []
    for per, v in zip(found, closed.jaxpr.outvars, strict=True):
        terms = []
        for i, src, w in zip(keep, sources, per[:-1], strict=True):
            if isinstance(w, np.ndarray) and not np.any(w):
                continue
            if isinstance(w, np.ndarray) and is_complex(w) and not np.any(w.imag):
                w = np.ascontiguousarray(w.real)  # real weights of complex data: 2 parts, not 4
            if tuple(src.axes) != tuple(range(rank)):
                return None
            full = w.reshape([geom[a].size if a in src.cell_axes else 1 for a in range(rank)])
            how = choose(full, integral, integer_fft, component(v.aval.dtype))
            if how is None:
                return None
            terms.append((i, src, full, how))
        plans.append((terms, per[-1]))
    if all(how == "shell" for terms, _ in plans for *_, how in terms):
        return None
    return plans


def lower(closed: Any, sources: Sequence[Any], geom: Sequence[Any],
          dyn: Any = None) -> list[Any] | None:
    """The kernel's output leaves over the slab ``geom``, lowered as
    correlations, or ``None`` when the kernel is not a linear sum of its
    windows or every weight array is small enough for shifted slices.

    ``sources`` and ``geom`` are :class:`~xstencil._engine.lower.Source` and
    :class:`~xstencil._engine.lower.AxisGeom` objects; ``dyn`` holds the
    kernel's other inputs (the jaxpr's inputs after the cells), from which
    runtime weights are computed when the weights are not constants.
    """
    rank = len(geom)
    plans = plan(closed, sources, geom, dyn)
    if plans is None:
        return None
    field = tuple(g.count for g in geom)
    steps = [g.step for g in geom]
    leaves = []
    for (terms, bias), v in zip(plans, closed.jaxpr.outvars, strict=True):
        dtype = v.aval.dtype
        out = None
        for _, src, w, how in terms:
            how = fused_rows(how, w)
            # complex sums of real data (a Gabor window over an image) keep the data real
            cast = component(dtype) if not is_complex(src.array) else dtype
            if how == "fft" and whole_periodic(src, geom):
                lows = [lo for lo, _ in src.pads]
                part = _circular(src.array.astype(cast), w, lows, steps, field)
                out = part if out is None else out + part
                continue
            x, shift = nan_halo(src).block(geom)
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
            part = correlate(x.astype(cast), w, steps, field, how)
            out = part if out is None else out + part
        if out is None:
            out = jnp.zeros(field, dtype)
        if not isinstance(bias, np.ndarray):  # runtime weights: a traced bias
            out = out + bias.astype(dtype)
        elif np.any(bias):
            out = out + constant(bias, dtype)
        leaves.append(out.astype(dtype))
    return leaves

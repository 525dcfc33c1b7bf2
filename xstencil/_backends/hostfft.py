"""Large dense windows on numpy data: the FFT lowering run by ``scipy.fft``.

A map whose kernel is a weighted sum over a large dense window (over
:data:`~xstencil._engine.dense.FFT_TAPS` weights) is lowered to an FFT
(:mod:`xstencil._engine.dense`).  On numpy data on the CPU, outside JAX
transforms, the loop backend runs that FFT on the host instead of in XLA:
``scipy.fft`` (pocketfft) transforms the numpy array in place, on numba's
thread count (``workers=``), where XLA copies a numpy array that is not
64-byte aligned into its own memory first.  Measured at 1024² float32,
periodic, on 2 shared cores (medians of 150 interleaved rounds, two runs,
15 x 15 and 63 x 63): 0.71-0.85x the time of the XLA program it replaces,
and 1.01-1.08x a hand-written ``scipy.fft`` call on the same threads (see
docs/performance.rst).

The arithmetic is the XLA program's: the correlation is ``irfft(rfft(x) *
conj(rfft(w)))`` over the whole periodic field (the weights wrapped onto it),
or over the padded block at an FFT-friendly size otherwise (written by numpy
straight into a work array of the FFT's size, each position mapped to the
array index it reads by the engine's own
:func:`~xstencil._engine.boundary.source_index`, so every boundary mode is the
engine's, bitwise the block of :meth:`~xstencil._engine.lower.Source.block`;
integer and bool images are cast exactly as numpy writes them, see
:mod:`xstencil._engine.intcells`; float data in another dtype than the
FFT's take that XLA function, and the cast); the weight spectra are computed
in float64 and rounded once, as :func:`xstencil._engine.dense.spectrum`
does for constant weights.  Results differ from ``backend="xla"`` by FFT
rounding (two FFT libraries), a few float32 ulps of the output's scale.

Only the all-finite path runs here: the weights are checked when their
spectra are made, and every output value after the FFT (a NaN or inf in the
data reaches every output through the FFT's sums, and an overflow inside
them stays inf or NaN to the end).  A
call that fails the check returns ``False`` and the caller runs the XLA
program, whose exact non-finite path gives the direct sum's NaN footprint
(:mod:`xstencil._engine.dense_finite`); the next
:data:`~xstencil._engine.dense_hoist.RETRY` calls then decline at once (data
with NaN land keep it), as the XLA program's own all-finite path does.

Weight spectra are kept by the values of the kernel's other inputs (the
arrays it closes over, its arguments) when those are small, else by the
weights' values, so a changed global or an array changed in place gives a
new spectrum, never a stale one.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import scipy.fft as sfft

from xstencil._backends.finite import all_finite
from xstencil._backends.tiered import from_source
from xstencil._engine import dense
from xstencil._engine.boundary import index_runs, source_index
from xstencil._engine.call import precision, stand_in
from xstencil._engine.dense_hoist import RETRY
from xstencil._engine.linear import integer
from xstencil._engine.lower import AxisGeom, Source

try:  # private: the bindings scipy.fft's functions call, which take output arrays
    from scipy.fft._pocketfft.pypocketfft import c2c as _c2c
    from scipy.fft._pocketfft.pypocketfft import c2r as _c2r
    from scipy.fft._pocketfft.pypocketfft import r2c as _r2c
except ImportError:  # pragma: no cover - another scipy: the public functions, and copies
    _c2c = _c2r = _r2c = None

__all__ = ["HostFFT", "host_fft"]

#: Weight spectra kept per compiled map (by value), and at most this many bytes.
SPECTRA = 8
SPECTRA_BYTES = 2**28
#: Up to this many bytes of the kernel's other inputs, spectra are keyed by them.
KEY_BYTES = 2**20
#: Spectra of at least this many bytes are multiplied in several threads.
MULTIPLY_THREADS = 2**25
#: Free work arrays kept per map and shape (one per thread that calls at once),
#: and at most this many bytes of them per map (larger fields make theirs anew).
SPARE = 2
WORK_BYTES = 2**27


@dataclasses.dataclass(frozen=True)
class _Term:
    """One correlation: source ``index`` of the call, over its whole
    periodic field (``lows``: the window's low halo per axis) or over its
    padded block (``block``: the jitted function that makes it)."""

    index: int
    shape: tuple[int, ...]  # the FFT's size
    dtype: np.dtype  # the FFT's (float32 or float64)
    lows: tuple[int, ...] | None
    block: Callable[[Any], Any] | None
    # the padded block written by numpy (see _HostBlock), where it can be: the
    # FFT's input for a padded term, the separable passes' for every 2-D term
    host: _HostBlock | None = None
    # an integer sum (see exact_error): the largest magnitude of the source's dtype
    peak: float | None = None


class HostFFT:
    """Called as a loop nest is, ``fn(*outs, *srcs, *params)`` (``params``
    flattened); writes every output and returns ``True``, or returns
    ``False`` where the data, the weights or the FFT were not all finite
    (the outputs are then unspecified: the caller runs the XLA program)."""

    def __init__(self, terms: list[list[_Term]], weights: Callable[..., Any],
                 params: Sequence[Any], steps: Sequence[int], counts: Sequence[int],
                 workers: Callable[[], int]):
        self.terms, self.weights, self.params = terms, weights, list(params)
        self.index = tuple(slice(0, st * (n - 1) + 1, st)
                           for st, n in zip(steps, counts, strict=True))
        self.whole = tuple(counts) if all(st == 1 for st in steps) else None
        self.field, self.steps = tuple(counts), tuple(steps)
        self.workers = workers
        self.spectra: OrderedDict[Any, list[Any] | None] = OrderedDict()
        self.lock = threading.Lock()
        self.skip = 0  # calls left to decline at once (the data were not finite)
        self.work: dict[Any, list[np.ndarray]] = {}  # free work arrays (see _take)

    def __call__(self, *args: Any) -> bool:
        if self.skip > 0:  # NaN land stays: no FFT to throw away for a while
            self.skip -= 1
            return False
        if not self._run(args):
            self.skip = RETRY
            return False
        return True

    def _run(self, args: Sequence[Any]) -> bool:
        nout = len(self.terms)
        outs, params = args[:nout], args[len(args) - len(self.params):]
        srcs = args[nout:len(args) - len(self.params)]
        values = [np.asarray(v).reshape(p.shape) for v, p in zip(params, self.params,
                                                                  strict=True)]
        spectra = self._spectra(values)
        if spectra is None:  # a weight is NaN or inf
            return False
        workers = self.workers()
        for out, terms, (specs, bias, factors, gains) in zip(outs, self.terms, spectra,
                                                             strict=True):
            acc = None
            exact = out.dtype.kind in "iu"  # an integer sum: float64 FFTs, rounded
            held = dest = None  # the work array an integer sum's last FFT wrote
            err = 0.0  # the FFTs' error bound by this call's data (where gains are given)
            for t, (term, spec, pair) in enumerate(zip(terms, specs, factors, strict=True)):
                x, key = srcs[term.index], None
                # the data as numpy writes it into the FFT's work arrays: floats of the
                # FFT's dtype, or integers (an image) cast exactly (intcells.py; an
                # integer sum's sources are exact in float64, see host_fft)
                cast = x.dtype == term.dtype or (x.dtype.kind in "biu"
                                                 and (exact or out.dtype == term.dtype))
                if pair is not None and cast:  # rank-1 weights
                    one = len(terms) == 1 and bias is None and _writable(out, term.dtype)
                    part = self._separable(x, term, pair, out if one else None)
                    if one:
                        acc = out
                        break
                    acc = part if acc is None else acc + part
                    continue
                if term.block is not None and term.host is not None and cast:
                    key = ("block", term.shape, term.host.extent)  # zeros after it stay
                    x = term.host.write(self._take(key, lambda t=term: np.zeros(t.shape,
                                                                                 t.dtype)), x)
                elif term.block is not None:
                    x = np.asarray(term.block(x))
                if x.dtype != term.dtype:  # in the output's dtype, as XLA's (no half FFTs)
                    x = x.astype(out.dtype).astype(term.dtype)
                try:
                    if gains is not None:  # the dtypes' range does not bound it: the data's norm
                        err += gains[t] * _norm(x)
                        if err > ROUND_SLACK:
                            if held is not None:
                                self._give(held, dest)
                            return False
                    extent = term.host.extent if key is not None else None
                    if len(terms) == 1 and bias is None and _direct(out, term, self.whole):
                        self._correlate(x, term, spec, workers, out, not exact, extent)
                        acc = out  # written in place: no copy
                        break
                    dest = None
                    if exact:  # rounded into the output right after: a work array
                        held = ("sum", term.shape)
                        dest = self._take(held, lambda t=term: np.empty(t.shape, t.dtype))
                    full = self._correlate(x, term, spec, workers, dest, not exact, extent)
                finally:
                    if key is not None:
                        self._give(key, x)
                part = full[self.index]
                if not exact:
                    part = part.astype(out.dtype, copy=False)
                acc = part if acc is None else acc + part
            if acc is None:
                acc = np.zeros(out.shape, np.float64 if exact else out.dtype)
            if bias is not None:
                acc = acc + (bias if exact else bias.astype(out.dtype))
            try:
                if not (_round_check(out, acc, workers) if exact
                        else _copy_check(out, acc, workers)):
                    return False
            finally:
                if held is not None:
                    self._give(held, dest)
        return True

    def _separable(self, x: np.ndarray, term: _Term, pair: tuple[np.ndarray, np.ndarray],
                   dest: np.ndarray | None) -> np.ndarray:
        """The correlation with rank-1 weights ``outer(gy, gx)`` as two 1-D
        passes over the padded block (``ky + kx`` products a point where
        the FFT costs a transform of the whole block, and closer to the
        direct sum), into ``dest`` (a new array where ``None``)."""
        rows = term.host
        (gy, gx), (sy, sx), (ny, nx) = pair, self.steps, self.field
        # the passes' nest has no bounds checks: what it reads and writes, checked here
        if rows is None or rows.extent != (sy * (ny - 1) + gy.size, sx * (nx - 1) + gx.size) \
                or (dest is not None and dest.shape != self.field):
            raise ValueError(f"separable passes: block {rows and rows.extent}, weights "
                             f"{gy.size}x{gx.size}, field {self.field}, strides {self.steps}")
        key = ("rows", rows.extent, term.dtype)
        block = rows.write(self._take(key, lambda: np.empty(rows.extent, term.dtype)), x)
        try:
            if dest is None:
                dest = np.empty(self.field, term.dtype)
            _passes()(block, gy, gx, dest, sy, sx)
        finally:
            self._give(key, block)
        return dest

    def _correlate(self, x: np.ndarray, term: _Term, spec: np.ndarray, workers: int,
                   dest: np.ndarray | None, centre: bool = False,
                   extent: tuple[int, ...] | None = None) -> np.ndarray:
        """:meth:`_fourier`; ``centre``: on ``x`` less its mean, added back
        times the weights' sum (the spectrum's zero frequency), as the XLA
        lowering does (:func:`xstencil._engine.dense.centred`: data with a
        large offset keep their digits).  ``extent``: ``x`` is this map's
        work array, the block in its first ``extent`` cells and zeros after
        (which stay zeros): the block is centred in place, as the next call
        writes it again."""
        block = x if extent is None else x[tuple(slice(0, e) for e in extent)]
        # floats only: an integer image (read by the FFT as it is) has no offset
        # worth the copy, and ``x - m`` would wrap in its dtype
        m = float(np.mean(block, dtype=np.float64)) if centre and block.size and \
            x.dtype.kind == "f" else 0.0
        if not m or not np.isfinite(m):
            return self._fourier(x, term, spec, workers, dest)
        shift = x.dtype.type(m)
        if extent is None:
            x = x - shift
        else:
            np.subtract(block, shift, out=block)
        out = self._fourier(x, term, spec, workers, dest)
        out += out.dtype.type(float(shift) * float(spec.reshape(-1)[0].real))
        return out

    def _fourier(self, x: np.ndarray, term: _Term, spec: np.ndarray, workers: int,
                 dest: np.ndarray | None) -> np.ndarray:
        """``irfftn(rfftn(x, term.shape) * spec)`` into ``dest`` (a new
        array where ``None``), returned.

        By axis, as ``scipy.fft`` does, but in work arrays this map keeps:
        the real transform along the last axis into a complex work array,
        the complex transforms along the other axes in place, the product,
        the inverse complex transforms in place, and the inverse real
        transform along the last axis straight into ``dest``.  These are
        ``scipy.fft.rfftn``'s and ``irfftn``'s own steps in their order, but
        ``irfftn`` makes a temporary complex array of the spectrum's size on
        every call: at 1024² float32 on 2 cores (AMD EPYC, medians of 100
        shuffled rounds) its inverse took 3.4 ms against 2.5 ms by axis in
        work arrays (on this virtual machine fresh memory costs page faults on
        every call, and the temporary is one more pass).  The inverse scales
        by 1/n per axis where ``irfftn`` scales once by their product: the
        same bits where every size is a power of 2, else an ulp's rounding.
        Without the private bindings: the public functions, and a copy."""
        if _r2c is not None:
            try:
                return self._by_axis(x, term, spec, workers, dest)
            except TypeError:  # pragma: no cover - another binding: the public functions
                pass
        axes = tuple(range(x.ndim))
        big = sfft.rfftn(x, term.shape, axes=axes, workers=workers)
        _multiply(big, spec, workers)
        full = sfft.irfftn(big, term.shape, axes=axes, workers=workers, overwrite_x=True)
        if dest is None:
            return full
        np.copyto(dest, full)
        return dest

    def _by_axis(self, x: np.ndarray, term: _Term, spec: np.ndarray, workers: int,
                 dest: np.ndarray | None) -> np.ndarray:
        last = len(term.shape) - 1
        rest = tuple(range(last))
        padded = pkey = None
        if x.shape != term.shape:  # a block: zeros after it up to the FFT's size
            pkey = ("real", term.shape, x.shape)  # the same block each call: zeros stay
            padded = self._take(pkey, lambda: np.zeros(term.shape, term.dtype))
            padded[tuple(slice(0, n) for n in x.shape)] = x
            x = padded
        cshape = (*term.shape[:-1], term.shape[-1] // 2 + 1)
        key = ("spectrum", cshape, spec.dtype)
        big = self._take(key, lambda: np.empty(cshape, spec.dtype))
        try:
            _r2c(x, (last,), True, 0, big, workers)
            if rest:
                _c2c(big, rest, True, 0, big, workers)
            _multiply(big, spec, workers)
            if rest:  # 1/n per axis: bitwise scipy's single 1/N where the sizes are 2**k
                _c2c(big, rest, False, 2, big, workers)
            if dest is None:
                dest = np.empty(term.shape, term.dtype)
            _c2r(big, (last,), term.shape[-1], False, 2, dest, workers)
        finally:
            self._give(key, big)
            if padded is not None:
                self._give(pkey, padded)
        return dest

    def _take(self, key: Any, make: Callable[[], np.ndarray]) -> np.ndarray:
        """A free work array of ``key`` (``make()`` where there is none):
        each call that runs at once (dask's threads) takes its own."""
        free = self.work.get(key)
        try:
            return free.pop() if free else make()
        except IndexError:  # another thread took the last one
            return make()

    def _give(self, key: Any, arr: np.ndarray) -> None:
        free = self.work.setdefault(key, [])
        kept = sum(a.nbytes for arrays in self.work.values() for a in arrays)
        if len(free) < SPARE and kept + arr.nbytes <= WORK_BYTES:
            free.append(arr)

    def _spectra(self, values: list[np.ndarray]) -> list[tuple[Any, ...]] | None:
        """Per output, what :func:`_make` makes (its terms' weight spectra,
        its bias, ...), from the table or made now; ``None`` if a weight is
        not finite."""
        key = None
        if sum(v.nbytes for v in values) <= KEY_BYTES:
            key = ("inputs", tuple((v.dtype.str, v.shape, v.tobytes()) for v in values))
            with self.lock:
                if key in self.spectra:
                    self.spectra.move_to_end(key)
                    return self.spectra[key]
        made = self.weights(*values)
        if made is None:  # integer weights the values no longer give (_IntegerWeights)
            return None
        found = [[np.asarray(w) for w in per] for per in made]
        wkey = ("weights", tuple((w.dtype.str, w.shape, w.tobytes()) for per in found
                                 for w in per))
        with self.lock:
            got = self.spectra.get(wkey, False)
        if got is False:
            got = _make(self.terms, found, self.field)
            self._keep(wkey, got)
        if key is not None:
            self._keep(key, got)
        return got

    def _keep(self, key: Any, got: Any) -> None:
        with self.lock:
            self.spectra[key] = got
            self.spectra.move_to_end(key)
            while len(self.spectra) > 1 and (len(self.spectra) > SPECTRA or sum(
                    s.nbytes for v in self.spectra.values() if v is not None
                    for specs, *_ in v for s in specs) > SPECTRA_BYTES):
                self.spectra.popitem(last=False)


_POOL: list[Any] = []  # [the pool, the process it was made in], made on first use
_POOL_LOCK = threading.Lock()


def _rows(n: int, workers: int, part: Callable[[int, int], float]) -> float:
    """``part(lo, hi)`` over blocks of ``range(n)`` (rows), one per worker
    thread (numpy releases the GIL for large operations), summed."""
    if workers < 2 or n < 2 * workers:
        return part(0, n)
    pid = os.getpid()
    with _POOL_LOCK:  # a forked child has the pool but not its threads: a new one
        if not _POOL or _POOL[1] != pid or _POOL[0]._max_workers < workers - 1:
            _POOL[:] = [ThreadPoolExecutor(workers - 1, thread_name_prefix="xstencil-fft"), pid]
        pool = _POOL[0]
    cuts = [n * i // workers for i in range(workers + 1)]
    futures = [pool.submit(part, cuts[i], cuts[i + 1]) for i in range(1, workers)]
    total = part(cuts[0], cuts[1])
    return total + sum(f.result() for f in futures)


def _multiply(big: np.ndarray, spec: np.ndarray, workers: int) -> None:
    """``big *= spec``, in ``workers`` threads from :data:`MULTIPLY_THREADS`
    bytes on.  Below that the spectrum, just written by the forward FFT, is
    still in the last-level cache and one thread is faster (on an AMD EPYC
    host, 2 cores, warm: 0.14-0.17 against 0.21-0.24 ms at 1024 x 513
    complex64, 1.21 against 1.29 ms at 2048 x 1025, 5.8 against 4.9 ms at
    4096 x 2049)."""
    def part(lo: int, hi: int) -> float:
        np.multiply(big[lo:hi], spec[lo:hi], out=big[lo:hi])
        return 0.0

    with np.errstate(all="ignore"):  # an overflow shows in the outputs' check
        _rows(big.shape[0], workers if big.nbytes >= MULTIPLY_THREADS else 1, part)


def _direct(out: np.ndarray, term: _Term, whole: tuple[int, ...] | None) -> bool:
    """Whether the inverse transform can be written straight into ``out``:
    the FFT's size is the output's shape, in the output's dtype.  That saves
    a copy of the result (``np.copyto`` of 1024² float32 alone: 0.46 ms)."""
    return whole == term.shape and _writable(out, term.dtype)


def _writable(out: np.ndarray, dtype: np.dtype) -> bool:
    """Whether a result of ``out``'s shape in ``dtype`` can be written
    straight into ``out`` (the separable passes write exactly the output)."""
    return out.dtype == dtype and out.flags.c_contiguous and out.flags.writeable


def _copy_check(out: np.ndarray, acc: np.ndarray, workers: int) -> bool:
    """``out[...] = acc`` (unless ``acc`` is ``out``), and whether every
    value of ``out`` is finite (:func:`~xstencil._backends.finite.all_finite`,
    one vectorised read that cannot overflow), in ``workers`` threads
    (blocks of rows: each checks what it has just written, still in cache).
    Measured at 1024² float32 on 2 cores, warm: 0.10 ms for the check
    alone, against 0.25 ms for the threaded sum it replaces."""
    def part(lo: int, hi: int) -> float:
        if acc is not out:
            np.copyto(out[lo:hi], acc[lo:hi])
        return 0.0 if all_finite(out[lo:hi]) else 1.0

    if out.ndim == 0:
        np.copyto(out, acc)
        return all_finite(out)
    if out.size < 2**16 or acc is out:  # small, or the check alone: one thread
        return part(0, out.shape[0]) == 0.0
    return _rows(out.shape[0], workers, part) == 0.0


def _make(terms: list[list[_Term]], found: list[list[np.ndarray]], field: tuple[int, ...]
          ) -> list[tuple[list[Any], Any, list[Any], list[float] | None]] | None:
    """Per output, its terms' spectra, its bias (``None``: 0), its terms'
    rank-1 factors (``None``: an FFT) and, for an integer sum whose FFTs'
    error the range of its sources' dtypes does not bound under
    :data:`ROUND_SLACK`, its terms' :func:`gain` (each call then bounds it
    by its data, see :meth:`HostFFT._run`; else ``None``), or ``None``
    where a weight is not finite or an integer sum's FFT could miss its
    exact value whatever the data (see :func:`exact_error`)."""
    made = []
    for per_terms, per in zip(terms, found, strict=True):
        if not all(np.all(np.isfinite(w)) for w in per):
            return None
        gains = None
        if any(t.peak is not None for t in per_terms):
            gains = _gains(per_terms, per)
            if gains is None:
                return None
            if sum(t.peak * math.sqrt(math.prod(t.shape)) * g  # type: ignore[operator]
                   for t, g in zip(per_terms, gains, strict=True)) <= ROUND_SLACK:
                gains = None  # exact for any data of the sources' dtypes: no check a call
        specs, factors = [], []
        for term, w in zip(per_terms, per[:-1], strict=True):
            factors.append(None if term.peak is not None else _rank_one(w, term, field))
            if term.lows is not None:  # the weights wrapped onto the periodic field
                w = dense.wrapped(w, term.lows, term.shape)
            specs.append(dense.spectrum(w.astype(np.float64), term.shape, term.dtype))
        bias = per[-1]
        made.append((specs, bias if np.any(bias) else None, factors, gains))
    return made


#: The most an integer sum's FFT may be off, by :func:`exact_error`'s bound,
#: for its rounded result to be taken (the exact value is then the nearest
#: integer with a margin of 4); after the FFT, every value must also lie
#: within this distance of an integer (:func:`_round_check`).
ROUND_SLACK = 0.125


def exact_error(w: np.ndarray, peak: float, shape: tuple[int, ...]) -> float:
    """A bound on the largest error of ``irfftn(rfftn(x) * conj(rfftn(w)))``
    over the FFT size ``shape``, computed in float64, for data ``|x| <=
    peak`` (and the spectrum of ``w`` made in float64 by numpy): ``||x||_2
    <= peak sqrt(M)`` times :func:`gain`."""
    return peak * math.sqrt(math.prod(shape)) * gain(w, shape)


def gain(w: np.ndarray, shape: tuple[int, ...]) -> float:
    """The bound of :func:`exact_error` per unit of the data's 2-norm
    ``||x||_2`` (the FFT's input, zeros up to its size included).

    With ``M`` the FFT's size, each transform's relative error in the
    2-norm is at most ``e = log2(M) * eta / (1 - log2(M) * eta)`` (Higham,
    *Accuracy and Stability of Numerical Algorithms*, 2nd ed., Theorem
    24.2), ``eta`` about ``6.7 u`` for accurate twiddle factors (taken as
    ``8 u``, and 4 times that where a size has a prime factor over 5, which
    pocketfft transforms by Bluestein's algorithm).  Following the errors
    through the forward transform of ``x`` (``||X|| = sqrt(M) ||x||``), the
    spectrum of ``w`` (``|W_k| <= ||w||_1``, ``||dW|| <= e sqrt(M)
    ||w||_2``), the product (``3 u``) and the inverse transform gives an
    error of at most ``||x||_2 ((2 e + 3 u) ||w||_1 + e sqrt(M) ||w||_2)``
    in the 2-norm, which bounds every value's."""
    m = math.prod(shape)
    u = np.finfo(np.float64).eps / 2
    eta = 8 * u * (4 if any(_rough(n) for n in shape) else 1)
    le = max(math.log2(m), 1.0) * eta
    e = le / (1 - le)
    w = np.abs(np.asarray(w, np.float64))
    l1, l2 = float(w.sum()), float(np.sqrt((w * w).sum()))
    return (2 * e + 3 * u) * l1 + e * math.sqrt(m) * l2


def _rough(n: int) -> bool:
    """Whether ``n`` has a prime factor over 5."""
    for p in (2, 3, 5):
        while n > 1 and n % p == 0:
            n //= p
    return n > 1


def _gains(terms: list[_Term], per: list[np.ndarray]) -> list[float] | None:
    """The :func:`gain` of each term of an integer sum, or ``None`` where
    its rounded FFTs cannot give its exact value: the sum's largest
    magnitude (by the range of the sources' dtypes) is not exact in float64
    (``2**52`` or more), or a term is not an integer FFT."""
    top = float(np.max(np.abs(per[-1]), initial=0.0))
    gains = []
    for term, w in zip(terms, per[:-1], strict=True):
        if term.peak is None:
            return None
        top += term.peak * float(np.abs(np.asarray(w, np.float64)).sum())
        gains.append(gain(w, term.shape))
    return gains if top < 2.0**52 else None


def _norm(x: np.ndarray) -> float:
    """``||x||_2`` of a float64 FFT input, in float64 (its rounding, a
    relative ``n u``, is far inside the bound's room: :data:`ROUND_SLACK`
    is a quarter of the 1/2 that rounding to the nearest integer needs)."""
    v = x.reshape(-1)
    return math.sqrt(float(np.dot(v, v)))


def _round_check(out: np.ndarray, acc: np.ndarray, workers: int) -> bool:
    """``out[...] = acc`` rounded to the nearest integer, where every value
    of ``acc`` lies within :data:`ROUND_SLACK` of an integer (else
    ``False``, ``out`` unspecified: NaN fails too).  The cast goes through
    int64, so a sum past ``out``'s range wraps modulo ``2**bits``, as the
    kernel's own integer arithmetic does (its magnitude is under ``2**52``,
    see :func:`_exact`).  In blocks of rows (the temporaries stay in
    cache), in ``workers`` threads."""
    if out.ndim == 0:
        r = np.rint(acc)
        if not abs(float(acc) - float(r)) <= ROUND_SLACK:
            return False
        np.copyto(out, r.astype(np.int64), casting="unsafe")
        return True
    step = max(1, ROUND_BLOCK // max(1, math.prod(out.shape[1:])))

    def part(lo: int, hi: int) -> float:
        shape = (min(step, hi - lo), *out.shape[1:])
        r, d, i = np.empty(shape), np.empty(shape), np.empty(shape, np.int64)
        with np.errstate(invalid="ignore"):  # NaN: fails the check
            for a in range(lo, hi, step):
                b = min(hi, a + step)
                v, n = acc[a:b], b - a
                np.rint(v, out=r[:n])
                np.subtract(v, r[:n], out=d[:n])
                if not np.abs(d[:n], out=d[:n]).max() <= ROUND_SLACK:
                    return 1.0
                np.copyto(i[:n], r[:n], casting="unsafe")  # exact: under 2**52
                np.copyto(out[a:b], i[:n], casting="unsafe")  # wraps modulo 2**bits
        return 0.0

    return _rows(out.shape[0], workers if out.size >= 2**16 else 1, part) == 0.0


#: Elements per block of :func:`_round_check` (its temporaries: 4 x 256 KiB).
ROUND_BLOCK = 2**15


#: Weights count as rank 1 where their second singular value is at most this
#: many ulps (of the FFT's dtype) of the first: a rounded outer product.
RANK_ONE_ULPS = 16
#: The separable passes run where their products (``ky`` per point of the
#: block's width, ``kx`` per output point) are fewer than this many times
#: ``n log2 n`` of the FFT's size ``n``.  Measured at 1024² float32 on 2 cores
#: (Gaussian weights): the passes took 3.4-4.0 ms at 15 x 15 to 31 x 31 and
#: 4.3 ms at 45 x 45 where the FFT took 5.4-7.9 ms; at 63 x 63 periodic 6.8
#: against 5.8 ms (the FFT's), at 63 x 63 reflect 7.0 against 7.9 ms.
PASS_PER_FFT = 5.0


def _rank_one(w: np.ndarray, term: _Term, field: tuple[int, ...]
              ) -> tuple[np.ndarray, np.ndarray] | None:
    """``(gy, gx)`` with ``w ≈ outer(gy, gx)``, in the FFT's dtype, where the
    term has the separable passes' block, the passes cost less than the FFT
    (:data:`PASS_PER_FFT`) and ``w`` is rank 1 to within
    :data:`RANK_ONE_ULPS` (its singular values, in float64), else ``None``."""
    if term.host is None or w.ndim != 2 or min(w.shape) < 2:
        return None
    n = math.prod(term.shape)
    passes = field[0] * (w.shape[0] * term.host.extent[1] + w.shape[1] * field[1])
    if passes >= PASS_PER_FFT * n * math.log2(n):
        return None
    u, sv, vt = np.linalg.svd(w.astype(np.float64))
    if not sv[0] > 0 or sv[1] > RANK_ONE_ULPS * np.finfo(term.dtype).eps * sv[0]:
        return None
    root = np.sqrt(sv[0])
    return ((u[:, 0] * root).astype(term.dtype), (vt[0] * root).astype(term.dtype))


def host_fft(closed: Any, sources: Sequence[Source], geom: Sequence[AxisGeom],
             params: Sequence[Any], workers: Callable[[], int], small: bool = False,
             values: Sequence[Any] | None = None) -> HostFFT | None:
    """The host FFT of a map whose kernel (``closed``: its jaxpr, the cells
    first, then ``params``) is a linear sum of its windows lowered to FFTs
    only, or ``None``.

    An integer sum (integer outputs, every operation on window values in
    their dtype: :func:`xstencil._engine.linear.integer`) over sources
    whose values are exact in float64 and cast into the output's dtype
    exactly (bool, and integers of up to 32 bits) runs as float64 FFTs
    rounded to the nearest integer, where :func:`exact_error` bounds the
    FFTs' error well under 1/2 by the range of the sources' dtypes, or
    each call's data bound it by their 2-norm (else the call runs the XLA
    program): the
    windows that are not separable into integer factors, over more than
    :data:`~xstencil._engine.dense.FFT_TAPS` nonzero weights, or with
    ``small`` over :data:`~xstencil._engine.dense.SLICE_TAPS` (for a
    window whose loop nest is too large to compile).  Its weights are read
    from the kernel with the parameters' ``values`` (this call's: the host
    runs outside JAX transforms) as constants, as the integer reading needs
    (:class:`_IntegerWeights`), and again whenever they change."""
    if any(v.aval.shape for v in closed.jaxpr.outvars):  # per-cell vectors: outputs of
        return None  # the field's shape are what the host writes (no broadcasting into them)
    ints = integer(closed)
    if ints is not None:  # an exact integer sum, where every source is exact in float64
        if values is None or not all(_exact_source(np.dtype(sources[i].array.dtype), ints)
                                     for i in dense.read_sources(closed, len(sources))):
            return None
        limit: int | None = dense.SLICE_TAPS if small else dense.FFT_TAPS
    elif not all(np.issubdtype(np.dtype(v.aval.dtype), np.floating)
                 for v in closed.jaxpr.outvars):
        return None
    else:
        limit = None
    light = [dataclasses.replace(s, array=np.broadcast_to(np.zeros((), s.array.dtype),
                                                          np.shape(s.array)))
             for s in sources]
    seen: list[Any] = []  # the plans of the first trace (the structure), then dropped
    recording = [True]

    def weights(*values: Any) -> Any:
        plans = dense.plan(closed, light, geom, list(values), integer_fft=limit)
        if recording:
            seen.append(plans)
        if plans is None:
            return []
        return [[w for _, _, w, _ in terms] + [bias] for terms, bias in plans]

    if ints is None:
        program: Any = jax.jit(weights)
        program.trace(*[stand_in(p.shape, p.dtype) for p in params])  # the first call reuses it
        recording.clear()
        plans = seen.pop()
    else:
        assert values is not None
        program = _IntegerWeights(closed, light, geom, limit)
        plans = program.plans([np.asarray(v) for v in values])
    # FFTs, and constant 2-D weights of rank 1 (a box, a Gaussian in the kernel's
    # own arithmetic) over more cells than a loop nest reads cheaply, which run as
    # the separable passes: checked below
    if plans is None or not all(dense.beats_cells(how, w) and (how == "fft" or w.ndim == 2)
                                for terms, _ in plans for _, _, w, how in terms):
        return None
    if ints is not None:
        if any(how != "fft" for terms, _ in plans for *_, how in terms):
            return None  # integer separable passes: XLA's, in integers (dense.py)
        program = program.of([[(i, w.shape) for i, _, w, _ in terms] for terms, _ in plans])
    counts = tuple(g.count for g in geom)
    terms = []
    for (per, _), v in zip(plans, closed.jaxpr.outvars, strict=True):
        row = []
        dt = dense.fft_dtype(v.aval.dtype) if ints is None else np.dtype(np.float64)
        for i, src, w, how in per:
            host = _HostBlock.of(src, geom, w.shape)
            peak = None if ints is None else _peak(np.dtype(src.array.dtype))
            if dense.whole_periodic(src, geom):  # the FFT reads the field itself
                row.append(_Term(i, tuple(src.array.shape), dt,
                                 tuple(lo for lo, _ in src.pads), None,
                                 host if w.ndim == 2 else None, peak))
            else:
                sizes = tuple(dense.fast_size(g.step * (g.count - 1) + k)
                              for g, k in zip(geom, w.shape, strict=True))
                row.append(_Term(i, sizes, dt, None, _block_fn(src, geom, w.shape), host,
                                 peak))
            if how == "separable" and _rank_one(w, row[-1], counts) is None:
                return None  # cheaper as XLA's separable passes than as an FFT
        terms.append(row)
    return HostFFT(terms, program, params, [g.step for g in geom], counts, workers)


class _IntegerWeights:
    """The weights of an integer sum for the host FFT, computed from the
    parameters' concrete values: the kernel is traced again with them as
    constants, so that :func:`xstencil._engine.linear.weights` reads it as
    an integer sum (a traced weight is opaque to it).  :meth:`plans` gives
    the dense plans (the structure, at build); :meth:`of` the function
    :class:`HostFFT` calls as the float path's jitted weights function:
    per output, the weights of its terms' sources (zeros for a source the
    values no longer weigh) and the bias, or ``None`` where the values make
    the kernel something else (the call then declines, and XLA runs it)."""

    def __init__(self, closed: Any, sources: Sequence[Source], geom: Sequence[AxisGeom],
                 limit: int | None, terms: list[list[tuple[int, Any]]] | None = None):
        self.closed, self.sources, self.geom, self.limit = closed, sources, geom, limit
        self.terms = terms

    def plans(self, values: Sequence[Any]) -> Any:
        """:func:`xstencil._engine.dense.plan` of the kernel with ``values``."""
        jaxpr = self.closed.jaxpr
        n = len(jaxpr.invars) - len(values)

        def with_values(*cells: Any) -> Any:
            return jax.core.eval_jaxpr(jaxpr, self.closed.consts, *cells, *values)

        fixed = jax.make_jaxpr(with_values)(*[stand_in(v.aval.shape, v.aval.dtype)
                                              for v in jaxpr.invars[:n]])
        return dense.plan(fixed, self.sources, self.geom, None, integer_fft=self.limit)

    def of(self, terms: list[list[tuple[int, Any]]]) -> _IntegerWeights:
        """The weights function of ``terms`` (per output, each term's source
        index and weights' shape)."""
        return _IntegerWeights(self.closed, self.sources, self.geom, self.limit, terms)

    def __call__(self, *values: Any) -> Any:
        assert self.terms is not None, "the weights of known terms (see of)"
        plans = self.plans(values)
        if plans is None or len(plans) != len(self.terms):
            return None
        found = []
        for (terms, bias), want in zip(plans, self.terms, strict=True):
            got = {i: w for i, _, w, _ in terms}
            if not set(got) <= {i for i, _ in want}:
                return None
            found.append([got[i] if i in got else np.zeros(shape) for i, shape in want]
                         + [bias])
        return found


def _exact_source(dtype: np.dtype, out: np.dtype) -> bool:
    """Whether an integer sum into ``out`` can read a source of ``dtype``
    as float64: bool or integers of up to 32 bits (exact in float64) that
    cast into ``out`` without changing a value."""
    return dtype.kind in "biu" and dtype.itemsize <= 4 and np.can_cast(dtype, out, "safe")


def _peak(dtype: np.dtype) -> float:
    """The largest magnitude a value of the bool or integer ``dtype`` has."""
    if dtype.kind == "b":
        return 1.0
    info = np.iinfo(dtype)
    return float(max(abs(int(info.min)), int(info.max)))


def _block_fn(src: Source, geom: Sequence[AxisGeom], wshape: tuple[int, ...]
              ) -> Callable[[Any], Any]:
    """The jitted function that makes the padded block a correlation of
    ``src`` over ``geom`` reads (as :func:`xstencil._engine.dense.lower`)."""
    rank = len(geom)

    def block(a: Any) -> Any:
        x, shift = dataclasses.replace(src, array=a).block(geom)
        starts = [geom[d].start + shift[d] for d in range(rank)]
        limits = [s0 + geom[d].step * (geom[d].count - 1) + wshape[d]
                  for d, s0 in enumerate(starts)]
        if starts != [0] * rank or limits != list(x.shape):
            x = jax.lax.slice(x, starts, limits)
        return x

    return jax.jit(block)


class _HostBlock:
    """The padded block of :func:`_block_fn`, written by numpy into the
    start of a zeroed work array of the FFT's size, where XLA would copy the
    numpy input in, pad it and hand back a new array that the FFT then
    copies again.  Each axis's positions map to array indices (or the fill
    value) by the engine's own :func:`~xstencil._engine.boundary.source_index`,
    the map the XLA block is built from, so every boundary mode is the
    engine's; ``write`` copies one rectangular piece per combination of the
    axes' runs (straight, reversed, or one cell repeated) and fills the
    rest."""

    def __init__(self, runs: list[list[tuple[int, int, int]]], fill: Any):
        self.runs, self.fill = runs, fill
        self.extent = tuple(sum(_length(r) for r in rs) for rs in runs)

    @classmethod
    def of(cls, src: Source, geom: Sequence[AxisGeom], wshape: tuple[int, ...]
           ) -> _HostBlock | None:
        """The writer of ``src``'s block (as :func:`_block_fn` makes it), or
        ``None`` where its axes are not the field's in order or it has no
        padding (the XLA function then makes it)."""
        rank = len(geom)
        if not src.pads or tuple(src.axes) != tuple(range(rank)):
            return None
        runs = []
        for d, ((lo, _), mode) in enumerate(zip(src.pads, src.modes, strict=True)):
            g = geom[d]
            length = g.step * (g.count - 1) + wshape[d]
            p = np.arange(g.start, g.start + length) - lo
            runs.append(index_runs(source_index(p, src.array.shape[d], mode)))
        fill = None
        if any(first < 0 for rs in runs for first, _, _ in rs):  # cast as jnp.full casts it
            with precision(src.array):
                fill = np.asarray(jnp.full((), src.fill_value, src.array.dtype))[()]
        return cls(runs, fill)

    def write(self, dest: np.ndarray, x: np.ndarray) -> np.ndarray:
        """``dest`` with the block of ``x`` written into its start."""
        for pieces in itertools.product(*[_placed(rs) for rs in self.runs]):
            at = tuple(slice(o, o + n) for o, n, _ in pieces)
            if any(read is None for _, _, read in pieces):
                dest[at] = self.fill
            else:
                dest[at] = x[tuple(read for _, _, read in pieces)]
        return dest


def _length(run: tuple[int, int, int]) -> int:
    first, last, step = run
    return last if first < 0 else abs(last - first) + 1


def _placed(runs: list[tuple[int, int, int]]) -> list[tuple[int, int, Any]]:
    """Per run of one axis: where it starts in the block, its length, and
    the slice of ``x`` that it reads (``None``: the fill value); repeats of
    one cell (``extend``'s halo) are one piece, its length-1 slice
    broadcast."""
    out: list[tuple[int, int, Any]] = []
    at = 0
    for first, last, step in runs:
        n = _length((first, last, step))
        if first < 0:
            read = None
        elif step == 0:
            read = slice(first, first + 1)
            if out and out[-1][2] == read and out[-1][0] + out[-1][1] == at:
                out[-1] = (out[-1][0], out[-1][1] + n, read)
                at += n
                continue
        elif step > 0:
            read = slice(first, last + 1)
        else:
            read = slice(first, last - 1 if last > 0 else None, -1)
        out.append((at, n, read))
        at += n
    return out


#: The two 1-D passes of a rank-1 correlation, per output row: the column
#: pass over the block's ``ky`` rows into one row of the block's width, then
#: the row pass over that row (``sy``, ``sx``: the output's strides).
PASSES = """\
def kernel(b, gy, gx, out, sy, sx):
    ny, nx = out.shape
    width = b.shape[1]
    for i in prange(ny):
        row = np.zeros(width, b.dtype)
        for t in range(gy.shape[0]):
            g = gy[t]
            src = b[i * sy + t]
            for j in range(width):
                row[j] += g * src[j]
        o = out[i]
        for j in range(nx):
            o[j] = 0
        if sx == 1:  # unit stride: a loop LLVM vectorizes
            for t in range(gx.shape[0]):
                g = gx[t]
                part = row[t:t + nx]
                for j in range(nx):
                    o[j] += g * part[j]
        else:
            for t in range(gx.shape[0]):
                g = gx[t]
                for j in range(nx):
                    o[j] += g * row[j * sx + t]
"""
_PASSES: list[Any] = []  # the tiered nest, made on first use
_PASSES_LOCK = threading.Lock()


def _passes() -> Any:
    if not _PASSES:
        with _PASSES_LOCK:
            if not _PASSES:
                _PASSES.append(from_source(PASSES, "<xstencil separable passes>"))
    return _PASSES[0]

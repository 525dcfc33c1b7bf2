"""Dense FFT maps on host data: scipy's FFT instead of the XLA program.

The FFT lowering of a dense window sum over a whole periodic field
(:func:`xstencil._engine.dense._circular`) is one ``rfftn``, one product
with the weights' spectrum and one ``irfftn``.  XLA:CPU first copies a numpy
input that is not 64-byte aligned; scipy's pocketfft reads numpy memory in
place and can split the transforms over the CPUs this process may use
(:class:`Threads` picks 1 or all of them by measured time).
:class:`HostFFT` is the host runner that
:class:`xstencil._engine.dense_hoist.Staged` calls for such maps outside JAX
transforms, on data on this process's CPU (numpy arrays, or CPU JAX arrays
read without a copy), unless ``backend="xla"`` (or :data:`ENV`) asks for XLA.

The result is written into an aligned buffer of
:mod:`~xstencil._backends.bufpool` and wrapped as a JAX array without a copy
(:mod:`~xstencil._backends.hostwrap`), the kind of result the XLA program
returns.

**Never silently wrong.**  The XLA program checks that the weights and the
sum of every output are finite, and otherwise reruns as the exact program
(:mod:`xstencil._engine.dense_finite`).  Here the check is on the product
spectrum ``P = rfftn(x) * spectrum``, fused with the product (row blocks
that stay in cache): its L1 norm ``sum |Re P| + |Im P|`` must be finite and
below ``finfo(dtype).max / 64`` (:data:`MARGIN`), else :meth:`HostFFT.run`
returns ``None`` and the caller runs the exact program.

* NaN or inf in the data reach ``rfftn(x)`` (NaN and inf are absorbing
  under the FFT's sums, and the zero-frequency term is the sum of all
  data), so ``P`` and its norm; NaN or inf in the weights make their
  spectrum non-finite, and so ``P`` (a zero data term gives ``0 * inf``,
  NaN).  An overflow inside the forward FFT leaves an inf or NaN in its
  output as well (nothing brings an infinity back to a finite value).
* The inverse FFT's every intermediate value, and output, is a partial sum
  of the ``P[k]`` times unit twiddles (times at most 2 for the spectrum's
  mirrored half), so it is bounded by a small multiple of the L1 norm: a
  norm below ``max / 64`` cannot overflow there.

The tolerance against the XLA path is the FFT's own rounding: both compute
the same circular correlation in the data's precision, in a different
order (see tests/engine/test_dense_host.py).
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
import scipy.fft

from xstencil._backends import bufpool
from xstencil._backends.hostwrap import wrap
from xstencil._backends.loops import ENV, on_host_cpu, resolve_mode
from xstencil._engine.dense_hoist import HostPlan

try:  # private: scipy.fft's pocketfft binding, which writes into a given buffer
    from scipy.fft._pocketfft import pypocketfft as _pocket
except ImportError:  # pragma: no cover - another scipy: the public functions and a copy
    _pocket = None


def _checked(pocket: Any) -> Any:
    """``pocket`` where its calls, as :meth:`HostFFT.run` makes them, give
    numpy's transforms on a small array, else ``None`` (the public functions
    are used): a private binding whose arguments changed meaning in another
    scipy must not give wrong numbers silently."""
    if pocket is None:
        return None
    x = np.random.default_rng(0).standard_normal((4, 6))
    try:
        big = np.empty((4, 4), np.complex128)
        pocket.r2c(x, [0, 1], True, 0, big, 1)
        ok = np.allclose(big, np.fft.rfft2(x), rtol=1e-12, atol=1e-12)
        back = np.empty((4, 6))
        pocket.c2c(big, [0], False, 2, big, 1)
        pocket.c2r(big, [1], 6, False, 2, back, 1)
        ok = ok and np.allclose(back, x, rtol=1e-12, atol=1e-12)
    except Exception:  # noqa: BLE001 - any failure: the public functions instead
        return None
    return pocket if ok else None


_pocket = _checked(_pocket)

__all__ = ["ENV", "EXPLORE", "MARGIN", "ROWS", "SAMPLES", "HostFFT", "Threads", "l1_product",
           "workers"]

#: The L1 norm of the product spectrum must stay below ``finfo.max / MARGIN``.
MARGIN = 64
#: Every this many calls, the thread count not in use is timed again.
EXPLORE = 32
#: How many recent times of each thread count :class:`Threads` compares (by median).
SAMPLES = 3
#: Rows of the spectrum multiplied and summed per block (kept in cache).
ROWS = 32


def workers() -> int:
    """The CPUs this process may run on (its affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - no affinity API (macOS, Windows)
        return max(1, os.cpu_count() or 1)


def l1_product(big: np.ndarray, spec: np.ndarray) -> float:
    """``big *= spec`` in place, returning ``sum(|Re| + |Im|)`` of the
    product (NaN or inf where any term is not finite).  Both arrays are
    complex of one dtype and shape; the sum runs per block of :data:`ROWS`
    rows of the first axis, each still in cache from its product."""
    with np.errstate(all="ignore"):  # NaN, inf and overflow: the caller's to judge
        return _l1_product(big, spec)


def _l1_product(big: np.ndarray, spec: np.ndarray) -> float:
    real = big.real.dtype
    flat_big = big.reshape(big.shape[0], -1)
    flat_spec = spec.reshape(spec.shape[0], -1)
    tmp = np.empty(min(ROWS, flat_big.shape[0]) * flat_big.shape[1] * 2, real)
    total = 0.0
    for i in range(0, flat_big.shape[0], ROWS):
        rows = flat_big[i:i + ROWS]
        np.multiply(rows, flat_spec[i:i + ROWS], out=rows)
        parts = rows.view(real).reshape(-1)
        t = tmp[:parts.size]
        np.abs(parts, out=t)
        total += float(np.add.reduce(t))
    return total


class Threads:
    """The thread count of one map's FFTs, 1 or all of :func:`workers`,
    picked by their measured times: on a machine whose other cores are
    busy, a second FFT thread waits for its share and the call takes longer
    than on one thread (measured 2-2.5x on 2 loaded cores), on an idle one
    it takes about half.  Each count is timed :data:`SAMPLES` times first
    (alternating), then the one with the lower median of its last
    :data:`SAMPLES` times is used, and the other one is timed again every
    :data:`EXPLORE` calls, so a change in the machine's load is seen.  A
    median, not a mean: one slow call (a page fault, another process) must
    not send the next :data:`EXPLORE` calls to the slower count (a running
    mean did, measured: 63 x 63 at 1024**2 ran 1.6x slower for a whole
    benchmark pass on a quiet machine)."""

    __slots__ = ("times", "calls")

    def __init__(self) -> None:
        self.times: dict[int, deque[float]] = {}
        self.calls = 0

    def _median(self, n: int) -> float:
        return float(np.median(self.times[n]))

    def pick(self) -> int:
        """The thread count for the next call."""
        most = workers()
        if most == 1:
            return 1
        self.calls += 1
        counts = (most, 1)
        fewest = min(counts, key=lambda n: len(self.times.get(n, ())))
        if len(self.times.get(fewest, ())) < SAMPLES:
            return fewest
        best = min(counts, key=self._median)
        if self.calls % EXPLORE == 0:
            return 1 if best == most else most
        return best

    def record(self, n: int, seconds: float) -> None:
        """Time one call that ran on ``n`` threads."""
        self.times.setdefault(n, deque(maxlen=SAMPLES)).append(seconds)


class HostFFT:
    """The host runner of :class:`~xstencil._engine.dense_hoist.Staged`
    for the map of one ``backend=`` choice (``None``: :data:`ENV`'s)."""

    def __init__(self, backend: str | None):
        self.backend = backend
        self.threads = Threads()

    def usable(self, data: Sequence[Any], rest: Sequence[Any]) -> bool:
        """Whether a call on these data (and other inputs) runs here: JAX's
        default backend is the CPU, the backend choice is not ``"xla"``, the
        one data array is a float32/float64 numpy array or a JAX array on
        this process's CPU, and no other input is a tracer or elsewhere."""
        if len(data) != 1 or resolve_mode(self.backend) == "xla":
            return False
        x = data[0]
        if not isinstance(x, np.ndarray | jax.Array) or np.dtype(x.dtype) not in (
                np.float32, np.float64):
            return False
        return on_host_cpu([x, *rest]) and jax.default_backend() == "cpu"

    def run(self, plan: HostPlan, x: Any, spectrum: Any, bias: Any) -> Any:
        """``plan``'s output on the host (its pytree of one JAX array), or
        ``None`` where the data, the weights or the bias are not finite or
        the product spectrum's norm is too large (see the module notes)."""
        x = np.asarray(x)  # a CPU JAX array: its memory, no copy
        spec = np.asarray(spectrum)
        dtype = plan.dtype
        cplx = np.result_type(dtype, np.complex64)
        shape = x.shape[:-1] + (x.shape[-1] // 2 + 1,)
        b = np.asarray(bias, dtype)
        if (x.dtype != dtype or spec.dtype != cplx or spec.shape != shape
                or not np.isfinite(b)):
            return None
        axes = list(range(x.ndim))
        n = self.threads.pick()
        start = time.perf_counter()
        if _pocket is not None:
            big = bufpool.empty(shape, cplx)
            _pocket.r2c(x, axes, True, 0, big, n)
        else:  # pragma: no cover - see the import
            big = scipy.fft.rfftn(x, workers=n)
        norm = l1_product(big, spec)
        if not norm < float(np.finfo(dtype).max) / MARGIN:  # NaN fails too
            return None
        whole = all(s == 1 for s in plan.steps)
        if _pocket is not None:
            full = bufpool.empty(x.shape, dtype)
            # the leading axes in place first: c2r over all axes at once copies
            # its input into a new temporary (measured 5-6 ms against 2 ms at 1024**2)
            if x.ndim > 1:
                _pocket.c2c(big, axes[:-1], False, 2, big, n)
            _pocket.c2r(big, axes[-1:], x.shape[-1], False, 2, full, n)
        else:  # pragma: no cover - see the import
            full = scipy.fft.irfftn(big, x.shape, workers=n, overwrite_x=True)
            whole = False  # not from the pool: copied into an aligned buffer below
        del big  # its buffer back to the pool before the next one is taken
        self.threads.record(n, time.perf_counter() - start)
        if whole:
            out = full
        else:
            index = tuple(slice(0, st * (c - 1) + 1, st)
                          for st, c in zip(plan.steps, plan.counts, strict=True))
            out = bufpool.empty(plan.counts, dtype)
            np.copyto(out, full[index])
        if b != 0:
            with np.errstate(over="ignore"):  # as XLA: a sum past the range is inf
                np.add(out, b, out=out)
        return jax.tree_util.tree_unflatten(plan.tree, [wrap(out)])

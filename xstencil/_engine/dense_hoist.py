"""Weight spectra of the FFT lowering computed outside the per-call program.

Arrays a kernel closes over are inputs of the compiled program
(:mod:`xstencil._engine.kcache`), so the FFT lowering of
``lambda u: (u * w).sum()`` (:mod:`xstencil._engine.dense`) transforms the
weights in the program, one more FFT per call than a hand-written FFT
filter whose weight spectrum is a constant (measured 1.5-2x its time at
1024**2).  :class:`Staged` stands in for the jitted engine function of a
map and, on calls outside JAX transforms, splits it in two:

* ``weights``: the program cut down to the runtime weight arrays the FFT
  lowering transforms (everything else is dead code), a few numbers each;
* ``main``: the program with those weights' spectra as extra inputs, and
  only the FFT's all-finite path: a call whose data or weights hold NaN or
  inf runs the plain program instead (its exact non-finite path,
  :mod:`xstencil._engine.dense_finite`, compiles when first needed).

Between the two, the spectra come from a small LRU table keyed by the
weights' *values* (their bytes, dtype and shape, and the static FFT size),
and, where they are small, by the values of the inputs the weights are
computed from (then the weights program does not even run):
new weights, a changed global or an array changed in place give new values
and so a new spectrum, never a stale one; equal weights reuse theirs.  A
missing spectrum is computed by the same jitted function the program would
have run, so the results are the same.

Inside a transform (``grad`` with respect to the weights, ``vmap``, a
user's ``jit``) the plain program runs, computing the spectra in it.  A
kernel without runtime FFT weights runs the plain program only: the first
call traces it once with a :class:`_Collect` to find out.
"""

from __future__ import annotations

import contextvars
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from xstencil._engine.call import outside_transforms
from xstencil._engine.kcache import freeze

__all__ = ["Staged", "provided", "report", "SPECTRA", "SPECTRA_BYTES", "INPUT_KEY_BYTES", "RETRY"]

#: How many sets of weight spectra each compiled map keeps (by the weights'
#: values), and at most how many bytes of them (the newest set is always kept).
SPECTRA = 8
SPECTRA_BYTES = 2**28
#: After a call whose data or weights were not finite, this many more calls
#: run the plain program directly before the all-finite one is tried again.
RETRY = 15
#: Up to this many bytes of inputs other than the data, the spectra are also
#: found by those inputs' values, without running the weights program.
INPUT_KEY_BYTES = 2**20


class _Collect:
    """Records the runtime weights (and how to transform them) in a trace."""

    def __init__(self) -> None:
        self.items: list[tuple[Any, Hashable, Callable[[Any], Any]]] = []


class _Provide:
    """Hands out the spectra given to the program, in the order traced."""

    def __init__(self, spectra: list[Any]) -> None:
        self.spectra = spectra
        self.next = 0
        self.finite: list[Any] = []  # per FFT: were the data and weights finite?


_MODE: contextvars.ContextVar[_Collect | _Provide | None] = contextvars.ContextVar(
    "xstencil_dense_hoist", default=None)


def provided(w: Any, static: Hashable, make: Callable[[Any], Any]) -> Any:
    """The spectrum ``make(w)`` of the traced weights ``w`` when it is given
    to the program from outside (else ``None``: compute it in the program).
    ``static`` identifies ``make`` (the FFT size, dtype and roll)."""
    mode = _MODE.get()
    if isinstance(mode, _Collect):
        mode.items.append((w, static, make))
    elif isinstance(mode, _Provide) and mode.next < len(mode.spectra):
        mode.next += 1
        return mode.spectra[mode.next - 1]
    return None


def report(finite: Any) -> None:
    """Where a spectrum was given (:func:`provided`), the FFT lowering runs
    its all-finite path only and reports here whether that was right; a
    call where it was not runs again as the plain program (whose exact
    non-finite path then compiles only when first needed)."""
    mode = _MODE.get()
    if isinstance(mode, _Provide):
        mode.finite.append(finite)


class Staged:
    """A jitted ``run(*args)`` that takes its FFT weight spectra from outside
    where it can (see the module notes).  ``.lower``, ``.trace`` and other
    attributes are those of the plain jitted function."""

    def __init__(self, run: Callable[..., Any]):
        self.run = run
        self.plain = jax.jit(run)
        self.split: bool | None = None  # None: not known before the first call
        self.statics: dict[int, list[tuple[Hashable, Callable[[Any], Any]]]] = {}
        self.spectra: OrderedDict[Hashable, list[Any]] = OrderedDict()
        self.makers: dict[Hashable, Callable[[Any], Any]] = {}
        self.lock = threading.Lock()
        self.skip = 0  # calls left to run as the plain program (data were not finite)
        # through a weak reference: a jitted bound method would hold ``self`` in
        # a cycle through the jit object that the garbage collector cannot see
        # (a compiled map, with its executables, was never freed: ~1 MiB a map)
        ref = weakref.ref(self)
        self.weights = jax.jit(lambda *args: ref()._weights(*args))  # type: ignore[union-attr]
        self.main = jax.jit(lambda *args: ref()._main(*args))  # type: ignore[union-attr]

    def __getattr__(self, name: str) -> Any:
        if name in ("plain", "split"):
            raise AttributeError(name)
        return getattr(self.plain, name)

    def _weights(self, *args: Any) -> tuple[Any, list[Any]]:
        col = _Collect()
        token = _MODE.set(col)
        try:
            self.run(*args)
        finally:
            _MODE.reset(token)
        with self.lock:
            tag = len(self.statics)
            self.statics[tag] = [(static, make) for _, static, make in col.items]
        return np.int32(tag), [w for w, _, _ in col.items]

    def _main(self, *args: Any) -> Any:
        *args, spectra = args
        mode = _Provide(list(spectra))
        token = _MODE.set(mode)
        try:
            out = self.run(*args)
        finally:
            _MODE.reset(token)
        finite = jnp.all(jnp.stack(mode.finite)) if mode.finite else jnp.asarray(True)
        return out, finite

    def __call__(self, *args: Any) -> Any:
        if self.split is False:
            return self.plain(*args)
        # flattened once: for the transform check and for the spectra's key
        data = jax.tree_util.tree_leaves(args[0])
        rest, tree = jax.tree_util.tree_flatten(args[1:])
        if not outside_transforms(data + rest):
            return self.plain(*args)
        if self.skip > 0:  # NaN land stays: skip the all-finite try for a while
            self.skip -= 1
            return self.plain(*args)
        if self.split is None:
            col = _Collect()
            token = _MODE.set(col)
            try:
                self.plain.trace(*args)  # the trace is cached: a call reuses it
            finally:
                _MODE.reset(token)
            self.split = bool(col.items)
            if not self.split:
                return self.plain(*args)
            if not all(np.isfinite(np.asarray(x)).all() for x in data):
                self.skip = RETRY  # NaN land from the start: no all-finite program yet
                return self.plain(*args)
        key = _input_key(data, rest, tree)
        with self.lock:
            spectra = None if key is None else self.spectra.get(key)
        if spectra is None:
            tag, ws = self.weights(*args)
            spectra = self._spectra(int(tag), ws)
            if key is not None:
                self._keep(key, spectra)
        out, finite = self.main(*args, spectra)
        if np.asarray(finite):  # bool() of the JAX array: ~130 us more per call
            return out
        self.skip = RETRY  # NaN or inf: the exact path, for this call and the next ones
        return self.plain(*args)

    def _keep(self, key: Hashable, spectra: list[Any]) -> None:
        with self.lock:
            self.spectra[key] = spectra
            while len(self.spectra) > 1 and (len(self.spectra) > SPECTRA or sum(
                    s.nbytes for got in self.spectra.values() for s in got) > SPECTRA_BYTES):
                self.spectra.popitem(last=False)

    def _spectra(self, tag: int, ws: list[Any]) -> list[Any]:
        """The spectra of ``ws`` from the table, computed where missing."""
        statics = self.statics[tag]
        values = [np.asarray(w) for w in ws]
        key = tuple((static, v.dtype.str, v.shape, v.tobytes())
                    for (static, _), v in zip(statics, values, strict=True))
        with self.lock:
            got = self.spectra.get(key)
            if got is not None:
                self.spectra.move_to_end(key)
                return got
        made = []
        for (static, make), w in zip(statics, ws, strict=True):
            fn = self.makers.get(static)
            if fn is None:
                fn = self.makers[static] = jax.jit(make)
            made.append(fn(w))
        self._keep(key, made)
        return made


def _input_key(data_leaves: list[Any], leaves: list[Any], tree: Any) -> Hashable | None:
    """The values everything but the data holds (coordinates, arguments,
    closed-over arrays), when they are small (:data:`INPUT_KEY_BYTES`): the
    weights are computed from these alone, so equal values give equal
    spectra without running the weights program.  ``None`` otherwise.
    ``data_leaves``: the leaves of the data argument; ``leaves`` and
    ``tree``: the other arguments, flattened."""
    # x.dtype (the dtype object: no str() per call); np.result_type of a JAX
    # array warns (a deprecated conversion)
    data = tuple([(np.shape(x), x.dtype if hasattr(x, "dtype") else np.result_type(x))
                  for x in data_leaves])
    rest, size = [], 0
    for x in leaves:
        if isinstance(x, jax.Array | np.ndarray):
            size += x.nbytes
            if size > INPUT_KEY_BYTES:
                return None
            x = np.asarray(x)
        rest.append(freeze(x))
    key = ("inputs", data, tree, tuple(rest))
    try:
        hash(key)
    except TypeError:
        return None
    return key

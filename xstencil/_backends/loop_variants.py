"""A loop nest compiled in two variants for the zero-weight rule.

A window value times a weight of exactly 0 does not read its cell: NaN or
inf there counts as 0 (as ``scipy.ndimage`` does; on XLA
:func:`xstencil._engine.elements.unread_zero_weight`).  For a weight known
when compiling this costs nothing, but a runtime weight (an array the kernel
closes over, an argument) needs a select per term in the generated loop,
which doubled a 5 x 5 weighted sum's call and tripled its numba compile
(1.5 to 4.9 s).

The loop backend runs outside JAX transforms, so the runtime weights are
concrete at every call.  :class:`Nest` holds the two sources of
:func:`xstencil._engine.loopweights.generate_variants`:

* ``plain``: no masks; it first checks, in the compiled code itself, that
  none of the runtime weights is 0, and returns ``False`` without writing
  anything when one is;
* ``masked``: the masks, right for every weight.

A call runs ``plain`` and, where it refuses, ``masked``: a zero weight can
never reach the unmasked products, whatever was compiled or run before.
Each variant compiles on its first use; which one to try first comes from
the same check run on the host (numpy), which costs a few microseconds and
is only a guess (a wrong guess costs a compile, never a wrong result).
Dense weights (no zero) thus compile and run only the unmasked nest.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from xstencil._backends.tiered import Tiered
from xstencil._engine.loopweights import Variants

__all__ = ["Nest"]


class Nest:
    """The compiled nest of ``variants`` (see the module notes).

    ``make(source)`` makes the numba function of a source; the last
    ``nparams`` arguments of a call are the runtime parameter arrays the
    weights come from.  ``compiled`` lists the variants compiled so far
    (``"plain"``, ``"masked"``) and ``last`` the one that wrote the last
    call's outputs.
    """

    def __init__(self, variants: Variants, make: Callable[[str], Any], nparams: int):
        self.variants = variants
        self.source = variants.masked
        self._make = make
        self.nparams = nparams
        self.fns: dict[str, Any] = {}
        self._lock = threading.Lock()  # one numba function per variant (dask threads)
        self.last: str | None = None
        self._plain = False  # the last call ran ``plain``: try it first, without the guess
        self._eager = False  # variants take their parallel build at once (prefer_parallel)
        self._check: Callable[..., Any] | None = None
        if variants.check is not None:
            namespace: dict[str, Any] = {"np": np}
            code = compile(variants.check, "<xstencil loop weights check>", "exec")
            exec(code, namespace)  # noqa: S102
            self._check = namespace["check"]

    @property
    def compiled(self) -> tuple[str, ...]:
        return tuple(self.fns)

    def _fn(self, which: str) -> Any:
        fn = self.fns.get(which)
        if fn is None:
            with self._lock:
                fn = self.fns.get(which)
                if fn is None:
                    src = self.variants.plain if which == "plain" else self.variants.masked
                    assert src is not None
                    fn = self.fns[which] = self._make(src)
                    if self._eager and isinstance(fn, Tiered):
                        fn.after = 0.0
        return fn

    def prefer_parallel(self) -> None:
        """Every variant, made or to be made, runs its parallel build from
        its next call on (:class:`~xstencil._backends.tiered.Tiered` with a
        threshold of 0): for a long scan, whose time-loop driver needs that
        build anyway, so that its first step does not compile a serial one
        too."""
        with self._lock:
            self._eager = True
            for fn in self.fns.values():
                if isinstance(fn, Tiered):
                    fn.after = 0.0

    def __call__(self, *args: Any) -> None:
        if self.variants.plain is not None and (
                self._plain or self._guess(args[len(args) - self.nparams:])):
            if self._fn("plain")(*args):  # it checked the weights itself
                self._plain, self.last = True, "plain"
                return
        self._plain = False
        self._fn("masked")(*args)
        self.last = "masked"

    def _guess(self, params: Sequence[np.ndarray]) -> bool:
        """Whether no runtime weight is 0, computed on the host."""
        assert self._check is not None
        try:  # (errstate, not catch_warnings: that is not thread-safe)
            with np.errstate(all="ignore"):
                return bool(self._check(*params))
        except Exception:  # noqa: BLE001 - a guess only: the compiled nest checks again
            return True

"""The body of a compiled loop (:func:`xstencil.iterate`, :func:`xstencil.solve`,
``scan(step=...)``) for the compile cache: keyed by its structure, with the
arrays it closes over as inputs of the loop (:class:`LoopBody`), or baked in
by value for a ``step=`` function that needs them concrete (:func:`baking`).

A mesh is told apart by its attributes (:func:`is_mesh`), as
:func:`~xstencil._engine.kcache.table_of` does: importing
:class:`~xstencil.Mesh` here would import the scans, which import this module.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

from xstencil._engine.advice import is_traced_error
from xstencil._engine.kcache import current_copy, describe, rebuild, settle, values_key
from xstencil._errors import XStencilError

__all__ = ["MeshSpec", "LoopBody", "body_key", "baking", "needs_baking", "baked_now",
           "step_error", "is_mesh"]


def is_mesh(body: Any) -> bool:
    """Whether ``body`` is a :class:`~xstencil.Mesh` (or a subclass)."""
    return any(c.__name__ == "Mesh" and c.__module__ == "xstencil._labelled.mesh"
               for c in type(body).__mro__)


class MeshSpec:
    """A mesh's regions and options, without its data, for a compiled loop:
    its kernels are copies reading the loop's inputs (:class:`LoopBody`)."""

    def __init__(self, regions: list[Any], kernels: list[Any], options: dict[str, Any]):
        self._regions = list(zip(regions, kernels, strict=True))
        self._options = options

    def regions(self) -> list[tuple[Any, Any]]:
        return list(self._regions)


class LoopBody:
    """A loop's body (a kernel, a ``step=`` function or a mesh) for the
    compile cache of :func:`xstencil.iterate` and :func:`xstencil.solve`.

    It is keyed by its structure (the :func:`~xstencil._engine.kcache.describe`
    key of its kernels, and a mesh's regions and options): the arrays the
    kernels close over are inputs of the compiled loop (``leaves``), read
    afresh on every call, as a map's are.  A kernel written inline in a loop,
    or a mesh rebuilt with new kernels, reuses the loop compiled for the
    first (0.2-0.8 s a call at 64² before), and an array changed in place is
    read as it is now.  ``resolve(leaves)`` gives the body at trace time
    (a mesh as a :class:`MeshSpec`); ``lifted`` is what the key was read
    from (to :func:`settle` after the call: a list the trace wrote to is a
    counter, keyed by identity from then on).
    """

    def __init__(self, body: Any):
        if is_mesh(body) and body._regions:
            regions = [r for r, _ in body._regions]
            options = dict(body._options)
            self.lifted = describe([k for _, k in body._regions])
            self.key: Any = ("mesh", body_key(body), self.lifted.key)
            self._make: Callable[[list[Any]], Any] = \
                lambda kernels: MeshSpec(regions, kernels, options)
        else:
            self.lifted = describe([body])
            self.key = ("structure", self.lifted.key)
            self._make = lambda kernels: kernels[0]
        lifted, make = self.lifted, self._make
        self.leaves: list[Any] = list(lifted.leaves)
        self.resolve: Callable[[Any], Any] = lambda leaves: make(rebuild(lifted, leaves))

    def bake(self) -> None:
        """The arrays as constants of the loop, keyed by value: for a ``step=``
        function that needs them concrete (``np.roll(w, 1)``, ``float(w[0])``),
        as the loops took them before they became inputs.  The loop reads
        copies taken when it is traced (:func:`current_copy`: a trace of the
        cached loop for new argument shapes bakes in the calling body)."""
        self.key = ("baked", self.key, values_key(self.lifted.templates, self.lifted)[1])
        self.leaves = []
        lifted, make = self.lifted, self._make
        self.resolve = lambda leaves: make(current_copy(lifted))


#: Structure keys of ``step=`` functions that needed their closed-over arrays
#: concrete: later calls bake them in at once (no failed trace first).
_BAKED: OrderedDict[Any, None] = OrderedDict()
_BAKED_LOCK = threading.Lock()


def needs_baking(key: Any) -> bool:
    with _BAKED_LOCK:
        return key in _BAKED


def baked_now(key: Any) -> None:
    """Note that the step function of structure ``key`` needs its arrays concrete."""
    with _BAKED_LOCK:
        _BAKED[key] = None
        while len(_BAKED) > 128:
            _BAKED.popitem(last=False)


def step_error(call: str, fn: Any, e: Exception) -> XStencilError:
    """A clear error for a ``step=`` function that asked a traced value for a
    concrete one (numpy or ``float()`` on the state)."""
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    name = getattr(fn, "__name__", type(fn).__name__)
    return XStencilError(
        f"{call}: step= function {name!r} used a traced value where Python needs a concrete "
        f"one ({type(e).__name__}: {first:.120}); step functions are traced by JAX: the "
        f"state holds traced arrays, so numpy functions (np.roll, np.sin), math, "
        f"float()/int()/bool() and a Python `if` on its values cannot work; use jax.numpy "
        f"(jnp.roll, jnp.where) or the state's own methods (s.roll(x=1), xr.where)")


def baking(call: str, body: Any, free: bool, attempt: Callable[[LoopBody], Any]) -> Any:
    """``attempt(LoopBody(body))``.  A ``step=`` function (``free``) that needs
    an array it closes over concrete (``np.roll(w, 1)``, ``float(w[0])``: the
    arrays are traced inputs of the loop) runs again with them baked in,
    keyed by value (:meth:`LoopBody.bake`), as it did before they became
    inputs; a traced value it needs otherwise (the state's) is a clear error."""
    lb = LoopBody(body)
    if free and lb.leaves and needs_baking(lb.key):
        lb.bake()
    try:
        out = attempt(lb)
    except Exception as e:
        if not (free and is_traced_error(e)):
            raise
        if not lb.leaves:
            raise step_error(call, body, e) from e
        baked_now(lb.key)
        lb = LoopBody(body)
        lb.bake()
        try:
            out = attempt(lb)
        except Exception as e2:
            if is_traced_error(e2):
                raise step_error(call, body, e2) from e2
            raise
    settle(lb.lifted)
    return out


def body_key(body: Any) -> Any:
    """A mesh's regions and options (its kernels are keyed by structure
    beside it, in region order)."""
    if not is_mesh(body):
        return None
    out = []
    for region, _ in body._regions:
        if region is None:
            r: Any = None
        elif isinstance(region, np.ndarray):
            r = hashlib.blake2b(np.packbits(region).tobytes(), digest_size=16).hexdigest()
        else:
            r = tuple((d, tuple(v.tolist())) for d, v in region.items())
        out.append(r)
    return (tuple(out), tuple(sorted((k, repr(v)) for k, v in body._options.items())))

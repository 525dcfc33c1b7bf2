"""Integer and boolean windows read as floats: the dense lowering for images.

A weighted sum over a ``uint8`` image, ``(u * w).sum()`` with float weights
or ``u.mean()``, casts every cell to a float before any arithmetic: its
jaxpr reads ``convert_element_type(u, float32)`` first.  The dense lowering
(:mod:`xstencil._engine.dense`) reads the weights of a kernel whose cells
are floats; :func:`float_cells` gives it such a kernel where the integer
cells reach arithmetic only through that cast: the same jaxpr with float
cells, each integer cell replaced by its exact float value.  The lowering
then casts the padded block to the output's dtype once (the cast of every
cell the kernel made, in one pass) and runs the FFT or the separable passes,
as for float data.

The cast is exact, so the two kernels agree on every window: integer dtypes
are taken only where every value they hold is a float of the output's dtype
(``bool``, 8- and 16-bit integers for float32; also 32-bit integers for
float64), and every cast the kernel makes must be exact too.  Before the
cast the cells may only be rearranged (slices, reshapes, pads,
concatenations: :data:`REARRANGE`); integer arithmetic on cells (``u(x=1) +
u(x=-1)`` on ``uint8`` wraps at 256) is not linear, and such kernels, like
integer results (``u.sum()`` is an integer), keep the generic lowering,
which computes exactly what the kernel says.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.extend import core as jcore

from xstencil._engine.call import stand_in
from xstencil._engine.linear import component

__all__ = ["REARRANGE", "exact_in", "float_cells"]

#: Primitives that only move integer cells about: they run on the float
#: cells unchanged (their other data operands cast too, their indices not).
REARRANGE = frozenset({"slice", "squeeze", "reshape", "transpose", "broadcast_in_dim", "rev",
                       "concatenate", "pad", "dynamic_slice", "split", "copy", "copy_p",
                       "optimization_barrier"})
# the operand positions of REARRANGE primitives that hold data (the rest: indices)
_DATA = {"dynamic_slice": (0,)}


class _Refused(Exception):
    pass


def exact_in(dtype: Any, fdtype: Any) -> bool:
    """Whether every value of ``dtype`` (a bool or integer dtype) is a
    ``fdtype`` float (or both components of a complex ``fdtype`` are): its
    bits fit the float's significand."""
    dtype, fdtype = np.dtype(dtype), component(fdtype)
    if not np.issubdtype(fdtype, np.floating):
        return False
    if dtype == np.bool_:
        return True
    if not np.issubdtype(dtype, np.integer):
        return False
    bits = np.iinfo(dtype).bits - (1 if np.issubdtype(dtype, np.signedinteger) else 0)
    return bits <= np.finfo(fdtype).nmant + 1


def float_cells(closed: Any, n: int) -> Any:
    """``closed`` (a ClosedJaxpr whose first ``n`` inputs are window cells)
    with its bool and integer cells as floats of its outputs' dtype (of its
    real components, for complex outputs: a uint8 image under a complex
    kernel), or ``None`` where that would change a value: an output that is
    not a float or complex of one dtype, a cell dtype that float does not
    hold exactly, a cast to a float that does not, or a cell that reaches
    anything but :data:`REARRANGE` before its cast.  ``closed`` itself
    where every cell is a float or complex already."""
    jaxpr = closed.jaxpr
    avals = [v.aval for v in jaxpr.invars]
    ints = [i for i in range(n) if not np.issubdtype(np.dtype(avals[i].dtype), np.inexact)]
    if not ints:
        return closed
    outs = {np.dtype(v.aval.dtype) for v in jaxpr.outvars}
    if len(outs) != 1 or not np.issubdtype(next(iter(outs)), np.inexact):
        return None
    fdtype = component(next(iter(outs)))
    if not all(exact_in(avals[i].dtype, fdtype) for i in ints):
        return None

    def kernel(*args: Any) -> list[Any]:
        return _evaluate(jaxpr, closed.consts, args, set(ints), fdtype)

    stand = [stand_in(a.shape, fdtype if i in ints else a.dtype,
                      False if i in ints else a.weak_type)
             for i, a in enumerate(avals)]
    try:
        out = jax.make_jaxpr(kernel)(*stand)
    except Exception:  # noqa: BLE001 - _Refused, or a primitive that takes no float
        return None  # operands: the kernel's own lowering decides (and reports)
    if [v.aval.dtype for v in out.jaxpr.outvars] != [v.aval.dtype for v in jaxpr.outvars]:
        return None
    return out


def _evaluate(jaxpr: Any, consts: Sequence[Any], args: Sequence[Any], cast: set[int],
              fdtype: np.dtype) -> list[Any]:
    """``jaxpr`` on ``args``, where the inputs at ``cast`` are the float
    values of integer cells: what they reach is followed (raises
    :class:`_Refused` at anything but a rearrangement or an exact cast)."""
    env: dict[Any, Any] = {}
    moved: set[Any] = set()  # variables that hold integer cells as floats

    def read(v: Any) -> Any:
        return v.val if isinstance(v, jcore.Literal) else env[v]

    env.update(zip(jaxpr.constvars, consts, strict=True))
    for i, (v, x) in enumerate(zip(jaxpr.invars, args, strict=True)):
        env[v] = x
        if i in cast:
            moved.add(v)
    for eqn in jaxpr.eqns:
        invals = [read(v) for v in eqn.invars]
        hit = [not isinstance(v, jcore.Literal) and v in moved for v in eqn.invars]
        name = eqn.primitive.name
        params = eqn.primitive.get_bind_params(eqn.params)  # as jax.core.eval_jaxpr binds
        if not any(hit):
            out = eqn.primitive.bind(*invals, **params)
        elif name == "convert_element_type":
            new = np.dtype(eqn.params["new_dtype"])
            if not exact_in(eqn.invars[0].aval.dtype, new):
                raise _Refused
            out = jax.lax.convert_element_type(invals[0], new)
        elif name in REARRANGE:
            data = _DATA.get(name, range(len(invals)))
            if any(hit[k] for k in range(len(invals)) if k not in data):
                raise _Refused  # an index computed from cells (a data-dependent read)
            for k in data:
                if not hit[k]:  # a constant among cells (a pad value): exactly a float
                    x = np.asarray(invals[k])
                    if not (np.issubdtype(x.dtype, np.integer) or x.dtype == np.bool_) \
                            or not exact_in(x.dtype, fdtype):
                        raise _Refused
                    invals[k] = x.astype(fdtype)
            out = eqn.primitive.bind(*invals, **params)
        else:  # integer arithmetic on cells (it wraps) or anything else: not for floats
            raise _Refused
        outs = list(out) if eqn.primitive.multiple_results else [out]
        for v, x in zip(eqn.outvars, outs, strict=True):
            env[v] = x
        if any(hit) and name != "convert_element_type":
            moved.update(eqn.outvars)
    return [read(v) for v in jaxpr.outvars]

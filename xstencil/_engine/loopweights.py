"""The two loop nests of the zero-weight rule (:mod:`xstencil._engine.loopgen`).

A window value times a runtime weight (an array the kernel closes over, an
argument) is masked in the generated loop: a weight of exactly 0 does not
read its cell, so NaN or inf there counts as 0.  The select per term
doubled a 5 x 5 weighted sum's call and tripled its numba compile.
:func:`generate_variants` writes the nest with the masks and, where there
are runtime weights, also the nest without them, which tests those weights
on entry and refuses (returns ``False``, writing nothing) where one is 0;
:mod:`xstencil._backends.loop_variants` runs the one that applies.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from xstencil._engine.loopgen import CodeAlgebra, Param, scalar_program
from xstencil._engine.loopnest import outline, render
from xstencil._engine.lower import AxisGeom, Source

__all__ = ["Variants", "generate_variants"]


@dataclass(frozen=True)
class Variants:
    """The sources of one loop nest (:func:`generate_variants`).

    ``masked``: the nest with the zero-weight rule's masks (always right).
    ``plain``: ``None`` where no window value is multiplied by a runtime
    weight; else the nest without those masks, which returns ``False``
    before touching anything when one of those weights is 0 and ``True``
    after writing the outputs.  ``check``: a plain Python function of the
    parameters that says the same on the host (a guess for which nest to
    compile first; ``plain``'s own check is the one that counts).
    """

    masked: str
    plain: str | None
    check: str | None
    outputs: int


def generate_variants(closed: Any, sources: Sequence[Source], geom: Sequence[AxisGeom],
                      params: Sequence[Param], limit: int = 1000,
                      out_dtypes: Sequence[Any] | None = None, masked: bool = False,
                      out_steps: Sequence[int] | None = None, finite: bool = False
                      ) -> Variants:
    """:func:`~xstencil._engine.loopgen.generate`'s nest and, where the
    kernel multiplies window values by runtime weights, also the nest
    without the zero-weight masks (a weight of 0 does not read its cell),
    shorter to compile and to run, for calls where none of those weights is
    0 (see :class:`Variants`).  ``finite``: both nests also take a first
    argument ``fz`` that says, per index along the first axis, whether every
    floating-point value written there is finite (see
    :func:`~xstencil._engine.loopnest.render`)."""
    algebra = CodeAlgebra()
    lines, reads, results = scalar_program(algebra, closed, sources, geom, params, limit,
                                           out_dtypes)

    checked = None
    if finite:
        dts = out_dtypes if out_dtypes is not None else [v.aval.dtype
                                                         for v in closed.jaxpr.outvars]
        checked = [m for m, dt in enumerate(dts) if np.dtype(dt).kind == "f"]

    def nest(body: list[str], guards: list[str], tail: str) -> str:
        src = render(sources, geom, params, body, reads, results, masked, out_steps, checked)
        head, _, rest = src.partition("\n")
        prologue = "".join(f"    {line}\n" for line in algebra.prologue + guards)
        return f"{head}\n{prologue}{rest}{tail}"

    full = nest(lines, [], "")
    if not algebra.weights:
        return Variants(full, None, None, len(results))
    full = outline(full)  # its selects: numba's parallel passes compile it 2-3x faster
    plain = [algebra.plain.get(i, line) for i, line in enumerate(lines)]
    # one test per 32 weights: fewer blocks for numba than one per weight
    ws = algebra.weights
    guards = [f"if {' | '.join(f'({w} == 0)' for w in ws[i:i + 32])}:\n        return False"
              for i in range(0, len(ws), 32)]
    names = ", ".join(f"p{p.index}" for p in params)
    check = (f"def check({names}):\n" + "".join(f"    {line}\n" for line in algebra.prologue)
             + f"    return not ({' or '.join(f'{w} == 0' for w in algebra.weights)})\n")
    return Variants(full, nest(plain, guards, "    return True\n"), check, len(results))

"""Generate a numba loop nest from a traced kernel (the CPU loop backend).

The kernel's per-cell jaxpr is replayed by :func:`~xstencil._engine.lift.interpret`
with :class:`CodeAlgebra`: every element is a scalar expression of Python
source instead of a whole-field array.  Structural window operations,
reductions and ``dot_general`` are unrolled exactly as for the XLA lowering
(:mod:`xstencil._engine.lift`, :mod:`xstencil._engine.unroll`), so the scalar
program performs the same operations in the same order.

:func:`generate` turns the result into the source of one function::

    kernel(out0, ..., src0, ..., table0_0, ..., fill0, ..., param0, ...)

that loops over the output field (``prange`` over the first axis) and writes
every output point.  The interior of the field reads the arrays with direct
indexing; the boundary shell maps every padded position through a per-axis
table built by :func:`~xstencil._engine.boundary.source_index` (-1: the fill
value), the very function the XLA path's halos are built from, so both paths
read the same cells.  Anything outside the supported primitives raises
:class:`~xstencil._engine.lift.Unliftable` (the caller falls back to XLA).

Values computed from constants and parameters only are computed once, before
the loops.  A window value times a runtime weight carries the zero-weight
rule (a weight of 0 does not read its cell) as a select per term;
:mod:`xstencil._engine.loopweights` also writes the nest without those
selects, for calls whose runtime weights are all nonzero.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from xstencil._engine.boundary import source_index
from xstencil._engine.lift import Lifted, Table, Unliftable, cell_grid, interpret
from xstencil._engine.loopcode import (
    Code,
    CodeAlgebra,
    Param,
    cast,
    dtype_of,
    literal,
    source_dtype,
)
from xstencil._engine.loopnest import outline, render
from xstencil._engine.lower import AxisGeom, Source

__all__ = ["Code", "CodeAlgebra", "Param", "generate", "boundary_tables", "scalar_program"]


def boundary_tables(sources: Sequence[Source], geom: Sequence[AxisGeom]) -> list[np.ndarray]:
    """Per padded source axis: the array index each padded position of the
    slab reads (-1 for the fill value), from ``geom[a].start`` on."""
    out = []
    for s in sources:
        if not s.pads:
            continue
        for k, a in enumerate(s.axes):
            g = geom[a]
            size = g.size if a in s.cell_axes else 1
            p = np.arange(g.start, g.start + g.step * max(g.count - 1, 0) + size)
            out.append(source_index(p - s.pads[k][0], s.array.shape[k], s.modes[k]))
    return out


def generate(closed: Any, sources: Sequence[Source], geom: Sequence[AxisGeom],
             params: Sequence[Param], limit: int = 1000,
             out_dtypes: Sequence[Any] | None = None, masked: bool = False,
             out_steps: Sequence[int] | None = None) -> tuple[str, int]:
    """The source of the loop function and its number of outputs.

    ``closed`` is the per-cell jaxpr with invars ``cells + params``.  Raises
    :class:`Unliftable` when the kernel cannot be written as scalar code, or
    takes more than ``limit`` statements (reads and operations) per point.
    ``out_dtypes``: cast each result (after its own dtype) to these, as the
    XLA mesh casts every region's values into the one result (``astype``).
    ``masked``: the function takes a boolean array ``mk`` of the field's
    shape after the parameters and writes only where it is true (a mask
    region of a function mesh).  ``out_steps``: a *boxed* nest, whose box
    is a runtime argument (see :func:`~xstencil._engine.loopnest.render`).
    """
    algebra = CodeAlgebra()
    lines, reads, results = scalar_program(algebra, closed, sources, geom, params, limit,
                                           out_dtypes)
    src = render(sources, geom, params, lines, reads, results, masked, out_steps)
    head, _, body = src.partition("\n")
    prologue = "".join(f"    {line}\n" for line in algebra.prologue)
    src = f"{head}\n{prologue}{body}"
    # runtime weights: the zero-weight rule's selects, which numba compiles faster outlined
    return (outline(src) if algebra.weights else src), len(results)


def scalar_program(algebra: CodeAlgebra, closed: Any, sources: Sequence[Source],
                   geom: Sequence[AxisGeom], params: Sequence[Param], limit: int,
                   out_dtypes: Sequence[Any] | None
                   ) -> tuple[list[str], list[tuple[int, tuple[int, ...], str]], list[str]]:
    """Replay the kernel with ``algebra``: its loop-body statements, window
    reads and result expressions (the prologue stays in ``algebra``)."""
    table = Table(algebra)  # type: ignore[arg-type]
    reads: list[tuple[int, tuple[int, ...], str]] = []

    def read(k: int, idx: tuple[int, ...], dt: np.dtype) -> Code:
        name = f"r{k}_{'_'.join(map(str, idx))}"
        reads.append((k, idx, name))
        algebra.cells.add(name)
        return Code(name, source_dtype(dt))

    cells = []
    for k, s in enumerate(sources):
        # checked when read: an unread source of another dtype does not stop
        # the loops (a float32 kernel's coordinates, packed in complex64, are
        # read through their real and imaginary parts: source_dtype)
        dt = np.dtype(s.array.dtype)
        shape = tuple(geom[a].size for a in s.cell_axes)
        cells.append(cell_grid(table, shape, lambda idx, k=k, dt=dt: read(k, idx, dt), dt))
    args: list[Any] = list(cells)
    for p in params:
        dtype_of(p.dtype)
        args.append(Lifted(table.constant_ids(p), p.dtype))
    outs = interpret(closed.jaxpr, closed.consts, args, table)
    results = []
    for o, v in zip(outs, closed.jaxpr.outvars, strict=True):
        dt = dtype_of(v.aval.dtype)
        if v.aval.shape:
            raise Unliftable("the kernel returns an array per point")
        if isinstance(o, Lifted):
            e = table.get(int(o.ids[()]))
        else:
            e = algebra.constant(o, ())
        r = cast(e, dt) if isinstance(e, Code) else literal(e, dt)
        if out_dtypes is not None:
            r = cast(Code(f"({r})", dt), dtype_of(out_dtypes[len(results)]))
        results.append(r)
    # statements computed from parameters only (in the prologue) count too
    count = len(reads) + len(algebra.lines) + algebra.invariant
    if count > limit:
        raise Unliftable(f"{count} statements per point, over the loop backend's {limit}")
    return algebra.lines, reads, results

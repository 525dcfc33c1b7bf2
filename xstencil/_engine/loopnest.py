"""The loop nest of the CPU loop backend (:mod:`xstencil._engine.loopgen`).

:func:`render` writes the Python source of ``kernel(*args)``: a loop over the
output field, ``prange`` over the first axis.  Each row along the last axis
runs its interior with direct indexing (through 1-D row views, so that the
innermost loop indexes one axis) and then its boundary points through the
per-axis boundary tables.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from xstencil._engine.lower import AxisGeom, Source, interior_ranges

__all__ = ["render"]


def _index(s: Source, k: int, idx: tuple[int, ...], geom: Sequence[AxisGeom],
           boundary: bool, t0: int) -> tuple[list[str], list[str]]:
    """Index expressions of read ``idx`` of source ``k`` and fill conditions."""
    offs = dict(zip(s.cell_axes, idx, strict=True))
    index, conds = [], []
    for j, a in enumerate(s.axes):
        g = geom[a]
        o = offs.get(a, 0)
        pos = f"{o} + j{a} * {g.step}" if g.step != 1 else f"{o} + j{a}"
        if s.pads and boundary:
            index.append(f"t{t0 + j}[{pos}]")
            if s.modes[j] == "fill":
                conds.append(f"{index[-1]} >= 0")
        else:
            lo = s.pads[j][0] if s.pads else 0
            index.append(f"{g.start + o - lo} + j{a} * {g.step}" if g.step != 1
                         else f"{g.start + o - lo} + j{a}")
    return index, conds


def _body(sources: Sequence[Source], geom: Sequence[AxisGeom], lines: list[str],
          reads: list[tuple[int, tuple[int, ...], str]], results: list[str],
          boundary: bool, masked: bool = False) -> tuple[list[str], list[str]]:
    """The statements of one output point, and (interior only) the row views
    hoisted out of the innermost loop.  ``masked``: all of them run only
    where the boolean array ``mk`` (of the field's shape) is true."""
    starts, t = [], 0
    for s in sources:
        starts.append(t)
        t += len(s.axes) if s.pads else 0
    last = len(geom) - 1
    hoisted: dict[str, str] = {}
    out = []
    for k, idx, name in reads:
        src = sources[k]
        index, conds = _index(src, k, idx, geom, boundary, starts[k])
        if not boundary and len(index) > 1 and src.axes[-1] == last:
            # a 1-D view of the row: the innermost loop indexes one axis only
            row = f"a{k}[{', '.join(index[:-1])}]"
            view = hoisted.setdefault(row, f"w{len(hoisted)}")
            out.append(f"{name} = {view}[{index[-1]}]")
            continue
        ref = f"a{k}[{', '.join(index)}]" if index else f"a{k}[()]"
        if conds:
            out.append(f"{name} = {ref} if ({' and '.join(conds)}) else f{k}")
        else:
            out.append(f"{name} = {ref}")
    out += lines
    at = ", ".join(f"j{a}" for a in range(len(geom)))
    views = [f"{v} = {row}" for row, v in hoisted.items()]
    for m, r in enumerate(results):
        if boundary or last == 0:
            out.append(f"o{m}[{at}] = {r}")
        else:  # the output row as a 1-D view too
            views.append(f"x{m} = o{m}[{at.rsplit(', ', 1)[0]}]")
            out.append(f"x{m}[j{last}] = {r}")
    if masked:
        if boundary or last == 0:
            cond = f"mk[{at}]"
        else:
            views.append(f"mr = mk[{at.rsplit(', ', 1)[0]}]")
            cond = f"mr[j{last}]"
        out = [f"if {cond}:"] + [f"    {line}" for line in out]
    return out, views


def render(sources: Sequence[Source], geom: Sequence[AxisGeom], params: Sequence[Any],
            lines: list[str], reads: list[tuple[int, tuple[int, ...], str]],
            results: list[str], masked: bool = False) -> str:
    """``kernel(*args)``: a loop over the field (``prange`` over the first
    axis).  Each row along the last axis runs its interior with direct
    indexing and then its boundary points (two runs, or the whole row where
    an outer index is in the shell) through the boundary tables; the shell
    body is written once to keep numba's compile short.  ``masked``: a last
    argument ``mk`` (booleans of the field's shape) says where to write."""
    rank = len(geom)
    inner, views = _body(sources, geom, lines, reads, results, boundary=False, masked=masked)
    shell, _ = _body(sources, geom, lines, reads, results, boundary=True, masked=masked)
    ntab = sum(len(s.axes) for s in sources if s.pads)
    names = ", ".join([f"o{m}" for m in range(len(results))]
                      + [f"a{k}" for k in range(len(sources))]
                      + [f"t{i}" for i in range(ntab)] + [f"f{k}" for k in range(len(sources))]
                      + [f"p{p.index}" for p in params] + (["mk"] if masked else []))
    last = rank - 1
    src = [f"def kernel({names}):"]
    ranges = [interior_ranges(sources, a, g) for a, g in enumerate(geom)]
    lo, hi = ranges[last]
    n = geom[last].count

    def emit(depth: int, head: str, body: list[str]) -> None:
        src.append("    " * depth + head)
        src.extend("    " * (depth + 1) + b for b in body)

    if rank == 1:
        emit(1, f"for j0 in prange({lo}, {hi}):", inner)
        emit(1, "for seg in range(2):", [f"b, e = (0, {lo}) if seg == 0 else ({hi}, {n})"])
        emit(2, "for j0 in range(b, e):", shell)
        return "\n".join(src) + "\n"
    depth = 1
    for a in range(last):
        loop = "prange" if a == 0 else "range"
        src.append("    " * depth + f"for j{a} in {loop}({geom[a].count}):")
        depth += 1
        a_lo, a_hi = ranges[a]
        cond = f"({a_lo} <= j{a} < {a_hi})"
        src.append("    " * depth + (f"i{a} = {cond}" if a == 0 else f"i{a} = i{a - 1} and {cond}"))
    pad = "    " * (depth + 1)
    src.append("    " * depth + f"if i{last - 1}:")
    src.extend(pad + v for v in views)
    emit(depth + 1, f"for j{last} in range({lo}, {hi}):", inner)
    src.append(pad + f"b0, e0, b1, e1 = 0, {lo}, {hi}, {n}")
    src.append("    " * depth + "else:")
    src.append(pad + f"b0, e0, b1, e1 = 0, {n}, 0, 0")
    emit(depth, "for seg in range(2):", ["b, e = (b0, e0) if seg == 0 else (b1, e1)"])
    emit(depth + 1, f"for j{last} in range(b, e):", shell)
    return "\n".join(src) + "\n"

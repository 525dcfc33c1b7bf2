"""The loop nest of the CPU loop backend (:mod:`xstencil._engine.loopgen`).

:func:`render` writes the Python source of ``kernel(*args)``: a loop over the
output field, ``prange`` over the first axis.  Each row along the last axis
runs its interior with direct indexing (through 1-D row views, so that the
innermost loop indexes one axis) and then its boundary points through the
per-axis boundary tables.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from xstencil._engine.lower import AxisGeom, Source, interior_ranges

__all__ = ["box_args", "render"]


def _index(s: Source, k: int, idx: tuple[int, ...], geom: Sequence[AxisGeom],
           boundary: bool, t0: int, boxed: bool = False) -> tuple[list[str], list[str]]:
    """Index expressions of read ``idx`` of source ``k`` and fill conditions
    (``boxed``: each axis's start is the runtime value ``s{axis}``)."""
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
            first = f"{o - lo} + s{a}" if boxed else f"{g.start + o - lo}"
            index.append(f"{first} + j{a} * {g.step}" if g.step != 1 else f"{first} + j{a}")
    return index, conds


def _body(sources: Sequence[Source], geom: Sequence[AxisGeom], lines: list[str],
          reads: list[tuple[int, tuple[int, ...], str]], results: list[str],
          boundary: bool, masked: bool = False,
          out_steps: Sequence[int] | None = None,
          finite: Sequence[int] = ()) -> tuple[list[str], list[str]]:
    """The statements of one output point, and (interior only) the row views
    hoisted out of the innermost loop.  ``masked``: all of them run only
    where the boolean array ``mk`` (of the field's shape) is true.
    ``out_steps``: the outputs (and ``mk``) are whole fields and point ``j``
    of the box is at ``q{axis} + j{axis} * step`` (see :func:`render`).
    ``finite``: the results whose finiteness is folded into ``fin_ok``."""
    boxed = out_steps is not None
    starts, t = [], 0
    for s in sources:
        starts.append(t)
        t += len(s.axes) if s.pads else 0
    last = len(geom) - 1
    hoisted: dict[str, str] = {}
    out = []
    # the shell's boundary-table lookups, each once per point (a k x k
    # window reads 2k of them, not 2k**2: numba compiles the nest faster)
    looked: dict[str, str] = {}
    columns: dict[str, str] = {}
    for k, idx, name in reads:
        src = sources[k]
        index, conds = _index(src, k, idx, geom, boundary, starts[k], boxed)
        if boundary and src.pads:
            for j, e in enumerate(index):
                if e not in looked:
                    looked[e] = f"y{len(looked)}"
                    out.insert(len(looked) - 1, f"{looked[e]} = {e}")
                conds = [f"{looked[e]} >= 0" if c == f"{e} >= 0" else c for c in conds]
                index[j] = looked[e]
        if not boundary and len(index) > 1 and src.axes[-1] == last:
            # a 1-D view of the row: the innermost loop indexes one axis only,
            # at a position computed once per point for all reads at that offset
            row = f"a{k}[{', '.join(index[:-1])}]"
            view = hoisted.setdefault(row, f"w{len(hoisted)}")
            col = columns.setdefault(index[-1], f"jc{len(columns)}")
            out.append(f"{name} = {view}[{col}]")
            continue
        ref = f"a{k}[{', '.join(index)}]" if index else f"a{k}[()]"
        if conds:
            out.append(f"{name} = {ref} if ({' and '.join(conds)}) else f{k}")
        else:
            out.append(f"{name} = {ref}")
    out[:0] = [f"{c} = {e}" for e, c in columns.items()]
    out += lines
    at = ", ".join(f"j{a}" if out_steps is None else f"q{a} + j{a}" if out_steps[a] == 1
                   else f"q{a} + j{a} * {out_steps[a]}" for a in range(len(geom)))
    views = [f"{v} = {row}" for row, v in hoisted.items()]
    for m, r in enumerate(results):
        if m in finite:  # x - x is 0 exactly for every finite x, NaN for NaN and Inf
            out.append(f"fin_r{m} = {r}")
            out.append(f"fin_ok = fin_ok & ((fin_r{m} - fin_r{m}) == 0)")
            r = f"fin_r{m}"
        if boundary or last == 0:
            out.append(f"o{m}[{at}] = {r}")
        else:  # the output row as a 1-D view too
            views.append(f"x{m} = o{m}[{at.rsplit(', ', 1)[0]}]")
            out.append(f"x{m}[{at.rsplit(', ', 1)[1]}] = {r}")
    if boundary:  # names of their own: one assignment per name in the whole nest
        out = _renamed(out, "s")
    if masked:
        if boundary or last == 0:
            cond = f"mk[{at}]"
        else:
            views.append(f"mr = mk[{at.rsplit(', ', 1)[0]}]")
            cond = f"mr[{at.rsplit(', ', 1)[1]}]"
        out = [f"if {cond}:"] + [f"    {line}" for line in out]
    return out, views


_ASSIGN = re.compile(r"^(\w+) = (.*)$")
_WORD = re.compile(r"\b\w+\b")


def _substituted(text: str, names: dict[str, str]) -> str:
    """``text`` with each whole word that is a key of ``names`` replaced."""
    return _WORD.sub(lambda w: names.get(w.group(0), w.group(0)), text) if names else text


def _forward_copies(lines: list[str], results: list[str]) -> tuple[list[str], list[str]]:
    """``lines`` without the plain copies ``v = name`` (the unmasked nest of
    :mod:`~xstencil._engine.loopweights` writes one per weighted read), each
    use of ``v`` after it reading ``name`` instead, and ``results`` likewise.
    Fewer variables: numba types and lowers every statement, a few
    milliseconds each (a multiply-add tap of a weighted sum cost about 14 ms
    to compile serial, 25 ms with ``parallel=True``).  A name assigned twice
    keeps its copies."""
    assigned: dict[str, int] = {}
    for line in lines:
        if m := _ASSIGN.match(line):
            assigned[m.group(1)] = assigned.get(m.group(1), 0) + 1
    alias: dict[str, str] = {}
    kept = []
    for line in lines:
        m = _ASSIGN.match(line)
        if (m and re.fullmatch(r"[A-Za-z_]\w*", m.group(2)) and assigned[m.group(1)] == 1
                and assigned.get(m.group(2), 0) <= 1):
            alias[m.group(1)] = alias.get(m.group(2), m.group(2))
            continue
        kept.append(_substituted(line, alias))
    return kept, [_substituted(r, alias) for r in results]


def _renamed(out: list[str], prefix: str) -> list[str]:
    """``out`` with every name it assigns prefixed (``fin_ok``, the row's
    running flag, excepted): the shell body repeats the interior's
    statements, and numba's SSA pass rewrote every name assigned in both
    (giving the shell names of its own took a cold 7 x 7 weighted sum's
    nest from 5.05 s to 4.57 s of compile, a 5 x 5 one's from 3.23 s to
    2.84 s)."""
    names = {m.group(1) for line in out if (m := _ASSIGN.match(line))} - {"fin_ok"}
    renames = {n: prefix + n for n in names}
    return [_substituted(line, renames) for line in out]


def box_args(sources: Sequence[Source], geom: Sequence[AxisGeom],
             out_starts: Sequence[int]) -> np.ndarray:
    """The runtime argument ``gm`` of a boxed nest (:func:`render`): per
    axis its output count, first padded input position, interior range and
    first output position."""
    vals: list[int] = []
    for a, (g, q) in enumerate(zip(geom, out_starts, strict=True)):
        vals += [g.count, g.start, *interior_ranges(sources, a, g), q]
    return np.array(vals, np.int64)


def render(sources: Sequence[Source], geom: Sequence[AxisGeom], params: Sequence[Any],
            lines: list[str], reads: list[tuple[int, tuple[int, ...], str]],
            results: list[str], masked: bool = False,
            out_steps: Sequence[int] | None = None, finite: Sequence[int] | None = None) -> str:
    """``kernel(*args)``: a loop over the field (``prange`` over the first
    axis).  Each row along the last axis runs its interior with direct
    indexing and then its boundary points (two runs, or the whole row where
    an outer index is in the shell) through the boundary tables; the shell
    body is written once to keep numba's compile short.  ``masked``: an
    argument ``mk`` (booleans of the field's shape) says where to write.

    ``out_steps`` (a *boxed* nest, for a function mesh's regions): the
    outputs and ``mk`` are the whole field, the box's point ``j`` is written
    at ``q + j * step`` along each axis, and where the box lies (its counts,
    input starts, interior ranges and output starts: :func:`box_args`) is a
    last runtime argument ``gm``, not constants in the source; so regions of
    one kernel with the same steps share one source and one compile.

    ``finite`` (indices of float results; not for boxed nests): a first
    argument ``fz`` (booleans, one per index along the first axis) receives,
    per index ``j0``, whether every value those results wrote there is
    finite, computed in the same pass (a boolean AND per point, which LLVM
    vectorizes): ``check_finite`` of the loop scans reads ``fz`` instead of
    the whole new state.  ``None`` (the default) writes the nest without it.
    """
    rank = len(geom)
    boxed = out_steps is not None
    if finite is not None and boxed:
        raise ValueError("render: finite= is not supported for boxed nests")
    checked = tuple(finite or ())
    lines, results = _forward_copies(lines, results)
    inner, views = _body(sources, geom, lines, reads, results, boundary=False, masked=masked,
                         out_steps=out_steps, finite=checked)
    shell, _ = _body(sources, geom, lines, reads, results, boundary=True, masked=masked,
                     out_steps=out_steps, finite=checked)
    if finite is not None and rank == 1:  # one point per index j0
        inner = ["fin_ok = True", *inner, "fz[j0] = fin_ok"]
        shell = ["fin_ok = True", *shell, "fz[j0] = fin_ok"]
    ntab = sum(len(s.axes) for s in sources if s.pads)
    names = ", ".join((["fz"] if finite is not None else [])
                      + [f"o{m}" for m in range(len(results))]
                      + [f"a{k}" for k in range(len(sources))]
                      + [f"t{i}" for i in range(ntab)] + [f"f{k}" for k in range(len(sources))]
                      + [f"p{p.index}" for p in params] + (["mk"] if masked else [])
                      + (["gm"] if boxed else []))
    last = rank - 1
    src = [f"def kernel({names}):"]
    if boxed:
        src += [f"    n{a}, s{a}, l{a}, h{a}, q{a} = "
                f"gm[{5 * a}], gm[{5 * a + 1}], gm[{5 * a + 2}], gm[{5 * a + 3}], gm[{5 * a + 4}]"
                for a in range(rank)]
        ranges: list[tuple[Any, Any]] = [(f"l{a}", f"h{a}") for a in range(rank)]
        counts: list[Any] = [f"n{a}" for a in range(rank)]
    else:
        ranges = [interior_ranges(sources, a, g) for a, g in enumerate(geom)]
        counts = [g.count for g in geom]
    lo, hi = ranges[last]
    n = counts[last]

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
        src.append("    " * depth + f"for j{a} in {loop}({counts[a]}):")
        depth += 1
        if a == 0 and finite is not None:
            src.append("    " * depth + "fin_ok = True")
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
    if finite is not None:
        src.append("        fz[j0] = fin_ok")
    return "\n".join(src) + "\n"

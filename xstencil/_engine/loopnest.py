"""The loop nest of the CPU loop backend (:mod:`xstencil._engine.loopgen`).

:func:`render` writes the Python source of ``kernel(*args)``: a loop over the
output field, ``prange`` over the first axis.  Each row along the last axis
looks up the positions it reads along the other axes in their boundary
tables once, takes a 1-D view of each row it reads, and runs its interior
through those views with direct indexing and then its two ends through the
last axis's table.  A row that reads past a ``fill`` edge along another axis
runs the ends' body over its whole length instead, which reads the fill
value there.

So every row but those few runs its interior at full speed, the rows along
the other axes' edges included, and the boundary body looks up one axis per
point, not every axis.  Against a shell body that looked up every axis at
every boundary point (same arguments, interleaved, two runs): a 7-point
Laplacian at 256**3 (two boundary points per row of 256) took 0.84-0.90 of
the time, a 5-point one at 2048**2 0.92-0.98, a dense 7 x 7 sum 0.90-0.95,
but a dense 5 x 5 periodic sum 1.03-1.07 (not understood: computing its
interior rows' indices directly instead of through the table did not
help); results are bitwise the same, and first calls are 0.2-0.8 s shorter.
"""

from __future__ import annotations

import re
from collections.abc import Container, Sequence
from typing import Any

import numpy as np

from xstencil._engine.lower import AxisGeom, Source, interior_ranges

__all__ = ["box_args", "outline", "render"]


def _index(s: Source, k: int, idx: tuple[int, ...], geom: Sequence[AxisGeom],
           tabled: Container[int], t0: int, boxed: bool = False) -> tuple[list[str], list[str]]:
    """Index expressions of read ``idx`` of source ``k`` and fill conditions
    (``boxed``: each axis's start is the runtime value ``s{axis}``).  Along
    the field axes in ``tabled`` a padded source is read through its
    boundary table (``conds[j]``: the fill test of index ``j``, or ``None``);
    along the others directly."""
    offs = dict(zip(s.cell_axes, idx, strict=True))
    index: list[str] = []
    conds: list[str | None] = []
    for j, a in enumerate(s.axes):
        g = geom[a]
        o = offs.get(a, 0)
        pos = f"{o} + j{a} * {g.step}" if g.step != 1 else f"{o} + j{a}"
        if s.pads and a in tabled:
            index.append(f"t{t0 + j}[{pos}]")
            conds.append(f"{index[-1]} >= 0" if s.modes[j] == "fill" else None)
        else:
            lo = s.pads[j][0] if s.pads else 0
            first = f"{o - lo} + s{a}" if boxed else f"{g.start + o - lo}"
            index.append(f"{first} + j{a} * {g.step}" if g.step != 1 else f"{first} + j{a}")
            conds.append(None)
    return index, conds


class _Rows:
    """The statements of one row along the last axis, shared by its bodies:
    the boundary-table lookups of the other axes, the fill tests they make
    and the 1-D row views the innermost loop reads, each written once per
    row.  ``flags``: the fill tests, all true where the row's reads lie
    inside the field along the other axes."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._names: dict[str, str] = {}
        self.flags: list[str] = []

    def name(self, expr: str, prefix: str) -> str:
        """The row's name for ``expr`` (assigned once)."""
        name = self._names.get(expr)
        if name is None:
            name = self._names[expr] = f"{prefix}{len(self._names)}"
            self.lines.append(f"{name} = {expr}")
        return name

    def flag(self, test: str) -> str:
        """The row's name for the fill test ``test``, one of :attr:`flags`."""
        name = self.name(test, "g")
        if name not in self.flags:
            self.flags.append(name)
        return name


def _body(sources: Sequence[Source], geom: Sequence[AxisGeom], lines: list[str],
          reads: list[tuple[int, tuple[int, ...], str]], results: list[str],
          boundary: bool, masked: bool = False,
          out_steps: Sequence[int] | None = None,
          finite: Sequence[int] = (), rows: _Rows | None = None) -> list[str]:
    """The statements of one output point.

    ``rows`` (fields of two or more axes): the row's statements go there
    (:class:`_Rows`), and every padded source is read through a view of its
    row, the other axes' positions looked up in their boundary tables once
    per row; along the last axis the interior (``boundary`` false) reads
    directly and the ends of the row (``boundary`` true) through the last
    axis's table.  Without ``rows`` (one axis) ``boundary`` reads the table.
    ``masked``: all of them run only where the boolean array ``mk`` (of the
    field's shape) is true.  ``out_steps``: the outputs (and ``mk``) are
    whole fields and point ``j`` of the box is at ``q{axis} + j{axis} *
    step`` (see :func:`render`).  ``finite``: the results whose finiteness
    is folded into ``fin_ok``."""
    boxed = out_steps is not None
    starts, t = [], 0
    for s in sources:
        starts.append(t)
        t += len(s.axes) if s.pads else 0
    last = len(geom) - 1
    out: list[str] = []
    # per point: each boundary-table lookup and interior column position once
    # (a k x k window reads 2k of them, not 2k**2: numba compiles the nest faster)
    looked: dict[str, str] = {}
    columns: dict[str, str] = {}
    # the axes read through the tables (the interior's last axis is direct)
    tabled = range(len(geom) if boundary else last if rows is not None else 0)
    for k, idx, name in reads:
        src = sources[k]
        index, conds = _index(src, k, idx, geom, tabled, starts[k], boxed)
        tests, outer = [], []
        for j, (e, c) in enumerate(zip(index, conds, strict=True)):
            if not (src.pads and src.axes[j] in tabled):
                continue
            if rows is not None and src.axes[j] != last:  # once per row
                index[j] = rows.name(e, "u")
                if c is not None:
                    outer.append(rows.flag(f"({index[j]} >= 0)"))
                continue
            if e not in looked:
                looked[e] = f"y{len(looked)}"
                out.insert(len(looked) - 1, f"{looked[e]} = {e}")
            index[j] = looked[e]
            if c is not None:
                tests.append(f"({index[j]} >= 0)")
        if rows is not None and len(index) > 1 and src.axes[-1] == last:
            # a 1-D view of the row: the innermost loop indexes one axis only,
            # at a position computed once per point for all reads at that offset
            view = rows.name(f"a{k}[{', '.join(index[:-1])}]", "w")
            col = index[-1]
            if not boundary:
                col = columns.setdefault(col, f"jc{len(columns)}")
            ref = f"{view}[{col}]"
        else:
            ref = f"a{k}[{', '.join(index)}]" if index else f"a{k}[()]"
        if boundary:  # the interior runs only where every flag of the row is true
            tests = outer + tests
        # non-short-circuit tests: an ``and`` chain is a branch per test, and
        # numba's compile grows with the branches (a 5-point Laplacian's
        # nest compiled in 1.5-1.7 s with them, 0.8-1.1 s without)
        out.append(f"{name} = {ref} if ({' & '.join(tests)}) else f{k}" if tests
                   else f"{name} = {ref}")
    out[len(looked):len(looked)] = [f"{c} = {e}" for e, c in columns.items()]
    out += lines
    at = ", ".join(f"j{a}" if out_steps is None else f"q{a} + j{a}" if out_steps[a] == 1
                   else f"q{a} + j{a} * {out_steps[a]}" for a in range(len(geom)))
    head, _, col = at.rpartition(", ")
    for m, r in enumerate(results):
        if m in finite:  # x - x is 0 exactly for every finite x, NaN for NaN and Inf
            out.append(f"fin_r{m} = {r}")
            out.append(f"fin_ok = fin_ok & ((fin_r{m} - fin_r{m}) == 0)")
            r = f"fin_r{m}"
        if rows is None:
            out.append(f"o{m}[{at}] = {r}")
        else:  # the output row as a 1-D view too
            out.append(f"{rows.name(f'o{m}[{head}]', 'x')}[{col}] = {r}")
    if boundary:  # names of their own: one assignment per name in the whole nest
        out = _renamed(out, "s")
    if masked:
        cond = f"mk[{at}]" if rows is None else f"{rows.name(f'mk[{head}]', 'm')}[{col}]"
        out = [f"if {cond}:"] + [f"    {line}" for line in out]
    return out


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
    indexing and then its two ends (or, where it reads past a ``fill`` edge
    along another axis, its whole length) through the last axis's boundary
    table, both through the row views (see the module notes); the boundary
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
    rows = _Rows() if rank > 1 else None
    inner = _body(sources, geom, lines, reads, results, boundary=False, masked=masked,
                  out_steps=out_steps, finite=checked, rows=rows)
    shell = _body(sources, geom, lines, reads, results, boundary=True, masked=masked,
                  out_steps=out_steps, finite=checked, rows=rows)
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
        counts: list[Any] = [f"n{a}" for a in range(rank)]
        bounds: tuple[Any, Any] = (f"l{last}", f"h{last}")  # the last axis's interior
    else:
        counts = [g.count for g in geom]
        bounds = interior_ranges(sources, last, geom[last])
    lo, hi = bounds
    n = counts[last]

    def emit(depth: int, head: str, body: list[str]) -> None:
        src.append("    " * depth + head)
        src.extend("    " * (depth + 1) + b for b in body)

    if rank == 1:
        emit(1, f"for j0 in prange({lo}, {hi}):", inner)
        emit(1, "for seg in range(2):", [f"b, e = (0, {lo}) if seg == 0 else ({hi}, {n})"])
        emit(2, "for j0 in range(b, e):", shell)
        return "\n".join(src) + "\n"
    assert rows is not None
    depth = 1
    for a in range(last):
        loop = "prange" if a == 0 else "range"
        src.append("    " * depth + f"for j{a} in {loop}({counts[a]}):")
        depth += 1
        if a == 0 and finite is not None:
            src.append("    " * depth + "fin_ok = True")
    src.extend("    " * depth + line for line in rows.lines)
    if rows.flags:  # a row whose reads all lie inside runs its interior directly
        pad = "    " * (depth + 1)
        src.append("    " * depth + f"if {' & '.join(rows.flags)}:")
        emit(depth + 1, f"for j{last} in range({lo}, {hi}):", inner)
        src.append(pad + f"b0, e0, b1, e1 = 0, {lo}, {hi}, {n}")
        src.append("    " * depth + "else:")
        src.append(pad + f"b0, e0, b1, e1 = 0, {n}, 0, 0")
        ends = ["b, e = (b0, e0) if seg == 0 else (b1, e1)"]
    else:  # no fill edge: every row does
        emit(depth, f"for j{last} in range({lo}, {hi}):", inner)
        ends = [f"b, e = (0, {lo}) if seg == 0 else ({hi}, {n})"]
    emit(depth, "for seg in range(2):", ends)
    emit(depth + 1, f"for j{last} in range(b, e):", shell)
    if finite is not None:
        src.append("        fz[j0] = fin_ok")
    return "\n".join(src) + "\n"


#: The blocks of rows an outlined nest's ``prange`` hands out (numba splits
#: them evenly between its threads, in order, as it splits the rows of a
#: nest that is not outlined).
ROW_BLOCKS = 256

_PRANGE = re.compile(r"    for j0 in prange\(([^,()]+)\):")


def outline(source: str) -> str:
    """``source`` (a rendered nest, its prologue included) with the body of
    its ``prange`` loop moved into a serial function ``rows(lo_, hi_,
    *args)`` that runs rows ``lo_ .. hi_`` of the first axis: ``kernel``
    keeps its prologue (the plain variant's weight test included) and runs
    ``prange`` over :data:`ROW_BLOCKS` equal blocks of rows.

    numba's ``parallel=True`` passes grow fast with the branches in the
    loop body: the zero-weight rule's selects (one per runtime weight)
    made a 5 x 5 weighted sum's masked nest take 5.1-6.8 s to compile,
    against 1.9-2.3 s outlined, with the same run time (0.99-1.00x) and
    bitwise the same result (two runs, numba already started).  A nest
    without them gains nothing (a 5-point Laplacian compiled in 0.42-0.57
    against 0.60-0.79 s outlined), so only nests with such selects are
    outlined.  ``rows`` is compiled serially with the nest's own options
    (:func:`xstencil._backends.loopcache.njit_source`).  A source without a
    one-argument ``prange`` loop at the top level (a 1-D nest) is returned
    unchanged."""
    lines = source.rstrip("\n").split("\n")
    head = lines[0]
    found = next(((i, m) for i, line in enumerate(lines) if (m := _PRANGE.fullmatch(line))),
                 None)
    if not head.startswith("def kernel(") or found is None:
        return source
    at, count, names = found[0], found[1].group(1), head[len("def kernel("):-2]
    end = at + 1
    while end < len(lines) and lines[end].startswith("        "):
        end += 1
    prologue, body, tail = lines[1:at], lines[at + 1:end], lines[end:]
    serial, i = [], 0  # the prologue without the plain variant's test (if ...: return)
    while i < len(prologue):
        if prologue[i].startswith("    if ") and i + 1 < len(prologue) \
                and prologue[i + 1].strip().startswith("return"):
            i += 2
            continue
        serial.append(prologue[i])
        i += 1
    rows = [f"def rows(lo_, hi_, {names}):", *serial, "    for j0 in range(lo_, hi_):", *body]
    kernel = [head, *prologue, f"    nb_ = min({count}, {ROW_BLOCKS})",
              "    for c_ in prange(nb_):",
              f"        rows(c_ * ({count}) // nb_, (c_ + 1) * ({count}) // nb_, {names})",
              *tail]
    return "\n".join(rows) + "\n\n\n" + "\n".join(kernel) + "\n"

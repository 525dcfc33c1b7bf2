"""The loop nest's statements are written for numba's compile time
(``xstencil/_engine/loopnest.py``): each name is assigned once in the whole
nest (the shell body's names are its own), the unmasked nest has no plain
copies ``v = r``, and the interior computes each column position once per
point.  numba types and lowers every statement, and rewrote every name
assigned in both bodies in its SSA pass."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import jax
import numpy as np
import pytest

from xstencil._engine.loopgen import Param
from xstencil._engine.loopnest import _forward_copies, _renamed
from xstencil._engine.loopweights import generate_variants
from xstencil._engine.lower import AxisGeom, Source

#: names the nest's loop structure assigns in more than one place by design
_STRUCTURE = {"b", "e", "b0", "e0", "b1", "e1", "fin_ok"}


def _nests(k: int, mode: str, finite: bool = False) -> Any:
    """The variants of a k x k weighted sum with runtime weights (5 x 6 field)."""
    h = k // 2
    src = np.zeros((5, 6), np.float32)
    geom = [AxisGeom(h, 1, 5, k), AxisGeom(h, 1, 6, k)]
    sources = [Source(src, (0, 1), (0, 1), ((h, h), (h, h)), (mode, mode))]

    def kern(cells: Any, w: Any) -> Any:
        return (cells * w).sum()

    closed = jax.make_jaxpr(kern)(jax.ShapeDtypeStruct((k, k), np.float32),
                                  jax.ShapeDtypeStruct((k, k), np.float32))
    params = [Param(0, (k, k), np.dtype(np.float32))]
    return generate_variants(closed, sources, geom, params, finite=finite)


def _assigned(source: str) -> Counter[str]:
    """How often each name is assigned, in the function that assigns it most
    (an outlined nest's ``rows`` and ``kernel`` each load the weights)."""
    most: Counter[str] = Counter()
    for function in re.split(r"\n(?=def )", source):
        most |= Counter(m.group(1) for line in function.splitlines()
                        if (m := re.match(r"^\s*(\w+) = ", line)))
    return most


@pytest.mark.parametrize("mode", ["wrap", "fill"])
@pytest.mark.parametrize("finite", [False, True])
def test_every_name_is_assigned_once(mode: str, finite: bool) -> None:
    v = _nests(3, mode, finite)
    for source in (v.masked, v.plain):
        twice = {n for n, c in _assigned(source).items() if c > 1} - _STRUCTURE
        assert not twice, source
        # the shell's copy of the sum is there, under its own names
        assert re.search(r"\bsv\d+ = sv\d+ \+ sv\d+", source)
        assert re.search(r"\bv\d+ = v\d+ \+ v\d+", source)


def test_the_plain_nest_has_no_copies_and_reads_columns_once() -> None:
    v = _nests(5, "wrap")
    assert v.plain is not None
    copies = [line for line in v.plain.splitlines()
              if re.fullmatch(r"\s*\w+ = [A-Za-z_]\w*", line)]
    assert not copies
    # 25 reads, 5 column positions, each computed once per point
    assert len(re.findall(r"\bjc\d+ = ", v.plain)) == 5
    assert len(re.findall(r"= w\d+\[jc\d+\]", v.plain)) == 25
    # the masked nest keeps its masks
    assert v.masked.count("np.isfinite") == 50


def test_forward_copies_substitutes_later_uses_only() -> None:
    lines = ["v0 = r0_1", "v1 = v0 * c0", "v2 = v1", "v3 = v2 + v0"]
    kept, results = _forward_copies(lines, ["v3", "v2"])
    assert kept == ["v1 = r0_1 * c0", "v3 = v1 + r0_1"]
    assert results == ["v3", "v1"]
    # a copy of a name assigned twice stays: which value it read depends on the place
    twice = ["v0 = r0_1", "v0 = v0 * c0", "v1 = v0"]
    assert _forward_copies(twice, ["v1"]) == (twice, ["v1"])
    # words that merely contain a copied name are left alone
    assert _forward_copies(["v1 = a", "v10 = v1 + fv1"], [])[0] == ["v10 = a + fv1"]


def test_renamed_prefixes_assigned_names_only() -> None:
    out = ["y0 = t0[j0]", "r0_0 = a0[y0, j1] if (y0 >= 0) else f0", "v3 = r0_0 * c3",
           "fin_ok = fin_ok & ((v3 - v3) == 0)", "o0[j0, j1] = v3"]
    assert _renamed(out, "s") == [
        "sy0 = t0[j0]", "sr0_0 = a0[sy0, j1] if (sy0 >= 0) else f0", "sv3 = sr0_0 * c3",
        "fin_ok = fin_ok & ((sv3 - sv3) == 0)", "o0[j0, j1] = sv3"]

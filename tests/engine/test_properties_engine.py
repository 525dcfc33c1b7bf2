"""Property tests: random shapes, kernel sizes, paddings, strides, per-axis
boundary modes, kinds and meshes against the numpy loop reference.

The number of examples comes from the hypothesis profile in tests/conftest.py
(``ci``: 25 per test; ``HYPOTHESIS_PROFILE=dev`` for more).
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
from hypothesis import assume, given
from hypothesis import strategies as st

import xstencil
from tests import reference as ref

MODES = ["fill", "extend", "periodic", "reflect", "symmetric", "valid"]


@st.composite
def axis_options(draw: Any, kind: str) -> dict[str, Any]:
    n = draw(st.integers(1, 6))
    mode = draw(st.sampled_from(MODES))
    k = draw(st.sampled_from([1, 2, 3, 4, -1]))
    size = n if k == -1 else k
    out: dict[str, Any] = {"n": n, "k": k, "mode": mode,
                           "stride": draw(st.integers(1, 3))}
    if kind in ("kmap", "kscan"):
        if mode == "valid":  # no halo: padding may only trim
            pad = draw(st.sampled_from(["valid", 0, (-1, 0), (0, -1)]))
        else:
            pad = draw(st.one_of(st.sampled_from(["same", "valid"]), st.integers(-1, 2),
                                 st.tuples(st.integers(-2, 3), st.integers(-2, 3))))
        lo, hi = ref.resolve(kind, (n,), (k,), 1, (pad,), 0, mode)["pads"][0]
        assume(n + lo + hi >= size)
        out["padding"] = pad
    else:
        reach = ((size - 1) // 2, size // 2) if mode == "valid" else (0, 0)
        out["offset"] = (draw(st.integers(reach[0], reach[0] + 2)),
                         draw(st.integers(reach[1], reach[1] + 2)))
    return out


@st.composite
def problems(draw: Any) -> dict[str, Any]:
    kind = draw(st.sampled_from(["kmap", "kscan", "smap", "sscan"]))
    ndim = draw(st.integers(1, 3))
    axes = [draw(axis_options(kind)) for _ in range(ndim)]
    shape = tuple(a["n"] for a in axes)
    sizes = tuple(a["n"] if a["k"] == -1 else a["k"] for a in axes)
    relative = draw(st.booleans())
    opts: dict[str, Any] = {
        "kernel_size": tuple(a["k"] for a in axes),
        "strides": tuple(a["stride"] for a in axes),
        "boundary": tuple(a["mode"] for a in axes),
        "relative": relative,
        "fill_value": draw(st.sampled_from([0.0, -2.5, 7.0])),
    }
    if kind in ("kmap", "kscan"):
        opts["padding"] = tuple(a["padding"] for a in axes)
    else:
        opts["offset"] = tuple(a["offset"] for a in axes)
    cells = list(itertools.product(*(range(k) for k in sizes)))
    picked = draw(st.lists(st.sampled_from(cells), min_size=1, max_size=4))
    use_max = kind == "kmap" and draw(st.booleans())
    return {"kind": kind, "shape": shape, "sizes": sizes, "opts": opts, "cells": picked,
            "use_max": use_max, "seed": draw(st.integers(0, 2**16))}


def make_kernel(p: dict[str, Any]) -> Any:
    reads = ref.offset_kernel(p["sizes"], p["opts"]["relative"], p["cells"])
    if not p["use_max"]:
        return reads
    return lambda x: reads(x) - x.max() * 2


@given(problems())
def test_matches_reference(p):
    x = np.random.default_rng(p["seed"]).standard_normal(p["shape"]).astype(np.float32)
    kernel = make_kernel(p)
    out = getattr(xstencil, p["kind"])(**p["opts"])(kernel)(x)
    expected = ref.stencil(p["kind"], x, kernel, **p["opts"])
    assert np.shape(out) == expected.shape
    np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-4, atol=1e-4)


@st.composite
def index(draw: Any, counts: tuple[int, ...]) -> Any:
    if draw(st.integers(0, 9)) == 0:  # a boolean mask
        size = int(np.prod(counts))
        flat = draw(st.lists(st.booleans(), min_size=size, max_size=size))
        return np.array(flat, dtype=bool).reshape(counts)
    items = []
    for n in counts[:draw(st.integers(1, len(counts)))]:
        if draw(st.booleans()):
            items.append(draw(st.integers(-n, n - 1)))
        else:
            bound = st.none() | st.integers(-n - 1, n + 1)
            items.append(slice(draw(bound), draw(bound),
                               draw(st.sampled_from([None, 1, 2, 3, -1, -2]))))
    return tuple(items) if len(items) > 1 or draw(st.booleans()) else items[0]


@st.composite
def meshes(draw: Any) -> dict[str, Any]:
    kind = draw(st.sampled_from(["kmap", "kscan", "smap", "sscan"]))
    ndim = draw(st.integers(1, 2))
    shape = tuple(draw(st.integers(1, 6)) for _ in range(ndim))
    sizes = tuple(draw(st.integers(1, 3)) for _ in range(ndim))
    opts: dict[str, Any] = {"kernel_size": sizes, "relative": True,
                            "boundary": tuple(draw(st.sampled_from(MODES[:5]))
                                              for _ in range(ndim)),
                            "strides": tuple(draw(st.integers(1, 2)) for _ in range(ndim))}
    if kind in ("kmap", "kscan"):
        opts["padding"] = "same"
        r = ref.resolve(kind, shape, sizes, opts["strides"], "same")
        counts = tuple((n + lo + hi - k) // s + 1 for n, (lo, hi), k, s
                       in zip(shape, r["pads"], sizes, opts["strides"], strict=True))
    else:
        opts["offset"] = tuple((draw(st.integers(0, 1)), draw(st.integers(0, 1)))
                               for _ in range(ndim))
        counts = shape
    cells = list(itertools.product(*(range(k) for k in sizes)))
    regions = []
    for _ in range(draw(st.integers(1, 3))):
        picked = draw(st.lists(st.sampled_from(cells), min_size=1, max_size=3))
        regions.append((draw(index(counts)), ref.offset_kernel(sizes, True, picked)))
    return {"kind": kind, "shape": shape, "opts": opts, "regions": regions,
            "seed": draw(st.integers(0, 2**16))}


@given(meshes())
def test_mesh_matches_reference(p):
    x = np.random.default_rng(p["seed"]).standard_normal(p["shape"]).astype(np.float32)
    F = getattr(xstencil, p["kind"])(**p["opts"])
    for idx, kernel in p["regions"]:
        F[idx] = kernel
    expected = ref.stencil(p["kind"], x, regions=p["regions"], **p["opts"])
    np.testing.assert_allclose(np.asarray(F(x)), expected, rtol=1e-4, atol=1e-4)

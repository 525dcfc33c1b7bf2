"""The loop nest reads each row through views looked up once per row
(``xstencil/_engine/loopnest.py``): the interior and the row's ends share
them, the ends look up the last axis only, and a row that reads past a
``fill`` edge along another axis runs the ends' body over its whole length.

Checked against numpy's ``np.pad`` (integer-valued data, so every sum is
exact whatever its order) and against the XLA path, bitwise, and on the
nest's text: what it looks up per point, and that its fill tests are not
``and`` chains (numba's compile grows with their branches)."""

from __future__ import annotations

import itertools
import re
from typing import Any

import jax
import numpy as np
import pytest
import xarray as xr

import xstencil  # noqa: F401 - registers the accessor
from tests.reference import extend
from tests.spies import count_calls
from xstencil._backends import loops_mesh
from xstencil._engine.loopgen import generate
from xstencil._engine.lower import AxisGeom, Source

pytest.importorskip("numba")

def _reference(a: np.ndarray, offsets: list[tuple[int, ...]], weights: list[int],
               modes: tuple[str, ...], fill: float) -> np.ndarray:
    """``sum_t w_t * a[i + offset_t]`` with each axis padded by ``np.pad``."""
    reach = [max(abs(o[d]) for o in offsets) for d in range(a.ndim)]
    p = extend(a, [(r, r) for r in reach], modes, fill)
    out = np.zeros(a.shape, np.float64)
    for o, w in zip(offsets, weights, strict=True):
        sl = tuple(slice(r + oo, r + oo + n) for r, oo, n in zip(reach, o, a.shape, strict=True))
        out += w * p[sl]
    return out


_CASES = [
    # shape, per-axis modes (outer axes first)
    ((9, 11, 13), ("fill", "fill", "fill")),
    ((9, 11, 13), ("fill", "periodic", "reflect")),
    ((6, 7, 12), ("periodic", "fill", "extend")),
    ((5, 3, 2), ("symmetric", "fill", "fill")),   # narrower than the window
    ((40, 3), ("fill", "periodic")),
    ((3, 40), ("fill", "fill")),
    ((17, 19), ("extend", "fill")),
]


@pytest.mark.parametrize(("shape", "modes"), _CASES)
def test_rows_through_views_match_numpy(shape: tuple[int, ...], modes: tuple[str, ...],
                                        ran: list[int]) -> None:
    rng = np.random.default_rng(len(shape) * 100 + sum(shape))
    dims = ("z", "y", "x")[-len(shape):]
    a = rng.integers(-9, 10, shape).astype(np.float64)
    # an asymmetric window: reads up to 2 back and 1 ahead on every axis
    cells = list(itertools.product(*[range(-2, 2)] * len(shape)))
    picks = rng.choice(len(cells), size=7, replace=False)
    offsets = [cells[i] for i in picks]
    weights = [int(w) for w in rng.integers(1, 6, len(offsets))]

    def kernel(u: Any) -> Any:
        total = 0.0
        for o, w in zip(offsets, weights, strict=True):
            total = total + w * u(**dict(zip(dims, o, strict=True)))
        return total

    da = xr.DataArray(a, dims=dims)
    boundary = dict(zip(dims, modes, strict=True))
    got = da.stencil.map(kernel, boundary=boundary, fill_value=7.0, backend="loops")
    assert ran, "the map fell back to XLA"
    ref = _reference(a, offsets, weights, modes, 7.0)
    np.testing.assert_array_equal(got.values, ref)
    xla = da.stencil.map(kernel, boundary=boundary, fill_value=7.0, backend="xla")
    np.testing.assert_array_equal(got.values, np.asarray(xla.values))


def test_a_variable_without_the_last_dim_reads_fill_per_row(ran: list[int]) -> None:
    """A source that does not span the last axis has no row view: its
    reads past a fill edge test their row's lookup."""
    rng = np.random.default_rng(5)
    ny, nx = 23, 9
    ds = xr.Dataset({"a": (("y", "x"), rng.integers(0, 9, (ny, nx)).astype(np.float64)),
                     "b": (("y",), rng.integers(0, 9, ny).astype(np.float64))})

    def kernel(s: Any) -> Any:
        return s["a"](x=1, y=-1) + 2 * s["b"](y=2) + 3 * s["b"](y=-3)

    got = ds.stencil.map(kernel, boundary="fill", fill_value=5.0, backend="loops")
    assert ran
    a = np.pad(ds.a.values, 3, constant_values=5.0)
    b = np.pad(ds.b.values, 3, constant_values=5.0)
    ref = a[2:2 + ny, 4:4 + nx] + 2 * b[5:5 + ny, None] + 3 * b[0:ny, None]
    np.testing.assert_array_equal(got.values, ref)


def _nest(shape: tuple[int, ...], mode: str) -> str:
    """The nest of a (2 * ndim + 1)-point Laplacian on ``shape``."""
    nd = len(shape)
    src = np.zeros(shape, np.float32)
    geom = [AxisGeom(0, 1, n, 3) for n in shape]
    sources = [Source(src, tuple(range(nd)), tuple(range(nd)), ((1, 1),) * nd, (mode,) * nd)]

    def kern(c: Any) -> Any:
        centre = (1,) * nd
        total = -2 * nd * c[centre]
        for d in range(nd):
            for s in (0, 2):
                total = total + c[tuple(s if e == d else 1 for e in range(nd))]
        return total

    closed = jax.make_jaxpr(kern)(jax.ShapeDtypeStruct((3,) * nd, np.float32))
    return generate(closed, sources, geom, [])[0]


@pytest.mark.parametrize("mode", ["fill", "periodic"])
def test_the_ends_look_up_the_last_axis_only(mode: str) -> None:
    source = _nest((6, 7, 8), mode)
    loop = source.index("for j2 in range(1, 7):")
    rows, bodies = source[:loop], source[loop:]
    # the other axes are looked up once per row (3 offsets along each), before the bodies
    assert len(re.findall(r"\bu\d+ = t0\[", rows)) == 3
    assert len(re.findall(r"\bu\d+ = t1\[", rows)) == 3
    assert not re.search(r"t[01]\[", bodies)
    # every read goes through a row view, in the interior and at the ends
    assert not re.search(r"\ba0\[", bodies)
    assert len(re.findall(r"= w\d+\[jc\d+\]", bodies)) == 7
    assert len(re.findall(r"= w\d+\[sy\d+\]", bodies)) == 7
    assert len(re.findall(r"\bsy\d+ = t2\[", bodies)) == 3
    # fill tests (where there are any) are not short-circuit chains
    assert " and " not in source
    if mode == "fill":
        assert re.search(r"^\s+if g\d+ & g\d+", source, re.M)
        assert re.search(r"if \(g\d+ & g\d+ & \(sy\d+ >= 0\)\) else f0", source)
    else:  # no fill edge: every row runs its interior
        assert "if g" not in source and "b0, e0" not in source


def test_one_axis_keeps_its_shell() -> None:
    source = _nest((9,), "fill")
    assert "for j0 in prange(1, 8):" in source
    assert re.search(r"sr0_0 = a0\[sy\d+\] if \(\(sy\d+ >= 0\)\) else f0", source)


@pytest.mark.parametrize(("shape", "modes"), [((12, 9, 10), ("periodic", "fill", "reflect")),
                                              ((3, 2, 40), ("fill", "symmetric", "fill"))])
def test_a_mesh_in_three_dims_matches_xla(shape: tuple[int, ...], modes: tuple[str, ...],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A function mesh's regions run as boxed nests, rows and all: a slab by
    position along the first and the last axis, a mask, the rest."""
    ran = count_calls(monkeypatch, loops_mesh, "write_nests")
    rng = np.random.default_rng(3)
    dims = ("z", "y", "x")
    a = rng.integers(-5, 6, shape).astype(np.float64)
    mask = xr.DataArray(rng.random(shape) < 0.3, dims=dims)
    da = xr.DataArray(a, dims=dims)
    got = {}
    for backend in ("loops", "xla"):
        m = da.stencil.mesh(boundary=dict(zip(dims, modes, strict=True)), fill_value=3.0,
                            backend=backend)
        m[...] = lambda u: (u(x=1) + u(x=-1) + u(y=1) + u(y=-1) + u(z=1) + u(z=-1)
                            - 6 * u())
        m[{"z": slice(0, 2)}] = lambda u: 2 * u(x=-2) + u(z=1)
        m[{"x": slice(-3, None)}] = lambda u: u(z=-1, x=1) * 3 - u()
        m[mask] = lambda u: u(z=2) + 0.5 * u(x=-1)
        got[backend] = m.map().values
    assert ran, "the mesh ran with XLA"
    np.testing.assert_array_equal(got["loops"], got["xla"])

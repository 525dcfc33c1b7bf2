"""Outlined loop nests (``xstencil._engine.loopnest.outline``).

The masked nest of a kernel with runtime weights (the zero-weight rule's
selects) is compiled as a serial ``rows`` function and a small ``prange``
over blocks of rows, which numba compiles 2-3x faster.  These tests check
that an outlined nest computes bitwise what the same nest not outlined
computes (maps in 2-D and 3-D, periodic and zero fill, a function mesh's
boxed regions, a loop scan through its compiled time-loop driver), that the
source has the shape the outliner expects, and that numba's disk cache
keeps and reloads an outlined nest.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xarray as xr

import xstencil
from tests.spies import recorded

pytest.importorskip("numba")

from xstencil._backends import loopcache  # noqa: E402 - after the numba check
from xstencil._backends import loops as L  # noqa: E402
from xstencil._backends import loops_mesh as LM  # noqa: E402
from xstencil._backends.loop_variants import Nest  # noqa: E402
from xstencil._engine import loopgen, loopnest, loopweights  # noqa: E402


@pytest.fixture
def nests(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Nest]]:
    """The nest of each map call that ran as loops (in-memory compiles)."""
    monkeypatch.setenv(loopcache.ENV, "off")
    yield recorded(monkeypatch, L, "run_loops", lambda args, out: args[0].fn)


def _weights(shape: tuple[int, ...], seed: int) -> np.ndarray:
    w = np.random.default_rng(seed).uniform(0.5, 1.5, shape).astype(np.float32)
    w.reshape(-1)[::3] = 0.0  # zeros: the masked nest
    return w


def _marked(shape: tuple[int, ...], seed: int) -> np.ndarray:
    a = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    flat = a.reshape(-1)
    flat[[3, flat.size // 2, flat.size - 1]] = [np.nan, np.inf, -np.inf]
    return a


def _not_outlined(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loopweights, "outline", lambda source: source)
    monkeypatch.setattr(loopgen, "outline", lambda source: source)


def _same_bits(a: Any, b: Any) -> None:
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape
    assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("shape,boundary", [
    ((37, 29), "periodic"),
    # about 30 s each on 2 cores (the 3-D nests 26-38 s to compile): with the slow tests
    pytest.param((37, 29), "fill", marks=pytest.mark.slow),
    pytest.param((9, 11, 13), "periodic", marks=pytest.mark.slow),
    pytest.param((9, 11, 13), "fill", marks=pytest.mark.slow)])
def test_an_outlined_masked_map_is_bitwise_the_nest_it_replaces(
        nests: list[Nest], monkeypatch: pytest.MonkeyPatch, shape: tuple[int, ...],
        boundary: str) -> None:
    dims = ("z", "y", "x")[-len(shape):]
    w = _weights((3,) * len(shape), seed=len(shape))
    da = xr.DataArray(_marked(shape, seed=1), dims=dims)
    opts: dict[str, Any] = dict(window={d: 3 for d in dims}, boundary=boundary,
                                backend="loops")
    if boundary == "fill":
        opts["fill_value"] = 0.5

    def kernel(u: Any) -> Any:
        return (u * w).sum()

    got = da.stencil.map(kernel, **opts)
    assert nests[-1].last == "masked"
    assert "def rows(" in nests[-1].variants.masked
    xstencil.clear_caches()
    _not_outlined(monkeypatch)
    ref = da.stencil.map(kernel, **opts)
    assert nests[-1].last == "masked" and "def rows(" not in nests[-1].variants.masked
    _same_bits(got.data, ref.data)
    # and the values are the zero-weight rule's: XLA agrees to rounding
    xla = da.stencil.map(kernel, **{**opts, "backend": "xla"})
    np.testing.assert_allclose(got.values, xla.values, rtol=1e-5, atol=1e-5)


def test_a_mesh_region_box_nest_is_outlined_and_bitwise_the_same(
        nests: list[Nest], monkeypatch: pytest.MonkeyPatch) -> None:
    """A function mesh's boxed nest (the box a runtime argument ``gm``:
    its row count is a name, ``n0``)."""
    w = _weights((3, 3), seed=4)
    da = xr.DataArray(_marked((40, 30), seed=2), dims=("y", "x"))
    made = recorded(monkeypatch, LM, "generate", lambda args, out: out[0])  # the sources

    def run() -> Any:
        m = da.stencil.mesh(window={"y": 3, "x": 3}, boundary="periodic", backend="loops")
        m[{"y": slice(5, 25)}] = lambda u: (u * w).sum()
        m[{"y": slice(25, None), "x": slice(10, None)}] = lambda u: 2 * u()
        return m.map()

    got = run()
    assert any("def rows(" in v and "gm" in v for v in made)  # a boxed nest, outlined
    xstencil.clear_caches()
    _not_outlined(monkeypatch)
    ref = run()
    _same_bits(got.data, ref.data)
    assert np.isnan(got.values).sum() > 0  # the NaN reached the outputs of nonzero weights


@pytest.mark.slow  # 146 s on a loaded 2-core host
def test_a_loop_scan_through_its_driver_runs_the_outlined_nest(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Enough steps for the compiled time-loop driver, which calls the
    outlined nest by its address."""
    monkeypatch.setenv(loopcache.ENV, "off")
    made = recorded(monkeypatch, L, "generate_variants")
    w = np.array([[0.0, 0.1, 0.0], [0.1, 0.6, 0.1], [0.0, 0.1, 0.0]], np.float32)
    a = np.random.default_rng(3).random((24, 20)).astype(np.float32)

    def kernel(u: Any) -> Any:  # w's entries are runtime weights (w is closed over)
        return sum(w[i, j] * u(time=-1, y=i - 1, x=j - 1) for i in range(3) for j in range(3))

    def run() -> Any:
        return xr.DataArray(a, dims=("y", "x")).stencil.scan(
            kernel, "time", steps=1200, save_every="last", boundary="periodic",
            backend="loops")

    got = run()
    assert any("def rows(" in v.masked for v in made)
    xstencil.clear_caches()
    _not_outlined(monkeypatch)
    ref = run()
    _same_bits(got.data, ref.data)
    p = a.astype(np.float64)  # a numpy time loop, in float64
    for _ in range(1200):
        q = np.pad(p, 1, mode="wrap")
        p = 0.6 * p + 0.1 * (q[:-2, 1:-1] + q[2:, 1:-1] + q[1:-1, :-2] + q[1:-1, 2:])
    np.testing.assert_allclose(got.values, p, rtol=1e-4)


def test_outline_keeps_the_prologue_and_moves_the_rows() -> None:
    source = textwrap.dedent("""\
        def kernel(o0, a0, p0):
            c0 = p0[0]
            if (c0 == 0):
                return False
            for j0 in prange(n0 + 1):
                x = o0[j0]
                for j1 in range(4):
                    x[j1] = a0[j0, j1] * c0
            return True
        """)
    out = loopnest.outline(source)
    rows, kernel = out.split("\n\n\n")
    assert rows.splitlines() == [
        "def rows(lo_, hi_, o0, a0, p0):", "    c0 = p0[0]", "    for j0 in range(lo_, hi_):",
        "        x = o0[j0]", "        for j1 in range(4):", "            x[j1] = a0[j0, j1] * c0"]
    assert kernel.splitlines() == [
        "def kernel(o0, a0, p0):", "    c0 = p0[0]", "    if (c0 == 0):", "        return False",
        f"    nb_ = min(n0 + 1, {loopnest.ROW_BLOCKS})", "    for c_ in prange(nb_):",
        "        rows(c_ * (n0 + 1) // nb_, (c_ + 1) * (n0 + 1) // nb_, o0, a0, p0)",
        "    return True"]
    one_d = "def kernel(o0, a0):\n    for j0 in prange(1, 9):\n        o0[j0] = a0[j0]\n"
    assert loopnest.outline(one_d) == one_d  # no one-argument prange: unchanged


@pytest.mark.parametrize("rows", [1, 5, 256, 700])
def test_the_blocks_cover_every_row_once(rows: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """An outlined nest, compiled, visits every row of its first axis
    exactly once, for row counts below, at and above ``ROW_BLOCKS`` (the
    count a runtime value, as in a boxed nest)."""
    monkeypatch.setenv(loopcache.ENV, "off")
    source = loopnest.outline(textwrap.dedent("""\
        def kernel(o0, gm):
            n0 = gm[0]
            for j0 in prange(n0):
                x = o0[j0]
                x[0] += 1
        """))
    assert "def rows(" in source
    fn = loopcache.njit_source(source, "<test>", parallel=True)
    hits = np.zeros((rows, 1), np.int64)
    fn(hits, np.array([rows], np.int64))
    np.testing.assert_array_equal(hits, 1)


@pytest.mark.slow  # 106 s on a loaded 2-core host; the nests' disk cache is tested fast
def test_the_disk_cache_keeps_an_outlined_nest(tmp_path: Path) -> None:
    """Compiled with ``cache=True`` without numba's "cannot cache" warning,
    and a second process loads it and gets the same numbers."""
    script = textwrap.dedent("""
        import sys, warnings
        import numpy as np, xarray as xr, xstencil
        from xstencil._backends import loops as L
        w = np.ones((3, 3), np.float32); w[0, 0] = 0.0
        a = np.arange(400, dtype=np.float32).reshape(20, 20); a[0, 0] = np.nan
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # numba's NumbaWarning: cannot cache
            out = xr.DataArray(a, dims=("y", "x")).stencil.map(
                lambda u: (u * w).sum(), window={"y": 3, "x": 3}, boundary="periodic",
                backend="loops")
        np.save(sys.argv[1], out.values)
        """)
    env = {**__import__("os").environ, loopcache.ENV: str(tmp_path / "cache")}
    for i in (1, 2):
        subprocess.run([sys.executable, "-c", script, str(tmp_path / f"{i}.npy")], env=env,
                       check=True, timeout=300)
    files = list((tmp_path / "cache" / "loops").glob("*.py"))
    assert len(files) == 1 and "def rows(" in files[0].read_text()
    assert list((tmp_path / "cache" / "loops" / "__pycache__").glob("*.nbi"))
    _same_bits(np.load(tmp_path / "1.npy"), np.load(tmp_path / "2.npy"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert np.isnan(np.load(tmp_path / "1.npy")).sum() == 8  # 9 readers, one weight 0

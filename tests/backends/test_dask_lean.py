"""Lean dask graphs (issue 18 items 3-6): one compiled block program per chunk
shape for dask scans, at most 10 tasks per chunk for maps and scan segments,
dask's progress display with ``progress=True``, and map's option list
(xstencil._backends.dask_halo, xstencil._backends.dask, dask_scan)."""

from __future__ import annotations

import numpy as np
import pytest

import xstencil  # noqa: F401 - registers .stencil
import xstencil._backends.dask as xd
from tests.fields import field, heat
from xstencil import XStencilError

dsa = pytest.importorskip("dask.array")

NP_MODE = {"periodic": "wrap", "extend": "edge", "reflect": "reflect",
           "symmetric": "symmetric"}


def _padded(u: np.ndarray, modes: dict[str, str]) -> np.ndarray:
    """``u`` (y, x) padded by one cell per side, y first, then x, as numpy does."""
    u = np.pad(u, ((1, 1), (0, 0)), mode=NP_MODE[modes["y"]])
    return np.pad(u, ((0, 0), (1, 1)), mode=NP_MODE[modes["x"]])


def corners(u):
    """Reads the four diagonal neighbours: the corners of every block's halo."""
    return u(x=1, y=1) - 2 * u(x=-1, y=1) + 3 * u(x=1, y=-1) + u(x=-1, y=-1) - u()


def _corners_ref(u: np.ndarray, modes: dict[str, str]) -> np.ndarray:
    p = _padded(u, modes)
    return (p[2:, 2:] - 2 * p[2:, :-2] + 3 * p[:-2, 2:] + p[:-2, :-2] - p[1:-1, 1:-1])


def _heat_ref(u: np.ndarray, modes: dict[str, str], steps: int) -> np.ndarray:
    for _ in range(steps):
        p = _padded(u, modes)
        u = u + np.float32(0.1) * (p[1:-1, 2:] + p[1:-1, :-2] + p[2:, 1:-1] + p[:-2, 1:-1]
                                   - 4 * u)
    return u


def _per_chunk(x, nchunks: int) -> float:
    return len(dict(x.__dask_graph__())) / nchunks


@pytest.mark.parametrize("modes", [
    {"y": "periodic", "x": "periodic"}, {"y": "extend", "x": "periodic"},
    pytest.param({"y": "extend", "x": "extend"}, marks=pytest.mark.slow),
    {"y": "reflect", "x": "symmetric"},
    pytest.param({"y": "periodic", "x": "reflect"}, marks=pytest.mark.slow)])
def test_map_corners_match_numpy(modes):
    """The halo corners come from the diagonal neighbours, or are padded in
    both modes on the global edges, on uneven chunks (one of 1 point)."""
    u = field(np.float64)
    out = u.chunk({"y": (9, 9, 9, 9, 1), "x": (20, 13, 17)}).stencil.map(corners, boundary=modes)
    assert isinstance(out.data, dsa.Array)
    np.testing.assert_allclose(out.values, _corners_ref(u.values, modes), rtol=1e-12)


@pytest.mark.parametrize("modes", [{"y": "periodic", "x": "periodic"},
                                   {"y": "extend", "x": "extend"}])
def test_map_tasks_per_chunk(modes):
    u = field(shape=(64, 64)).chunk({"y": 16, "x": 16})
    out = u.stencil.map(corners, boundary=modes)
    assert _per_chunk(out.data, 16) <= 10
    np.testing.assert_allclose(out.values, _corners_ref(u.values, modes), rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize("modes", [pytest.param({"y": "extend", "x": "extend"},
                                                marks=pytest.mark.slow),  # 17 s on 2 cores
                                   {"y": "extend", "x": "periodic"},
                                   {"y": "periodic", "x": "periodic"}])
def test_scan_compiles_once_per_chunk_shape(modes):
    """Chunk position (halo or physical edge) and step count are run-time
    inputs: one compile for every block and segment of equal-chunked data
    (steps 4, 4, 2 per segment), two with a smaller last chunk along y."""
    u0 = field(shape=(64, 64))
    for chunks, compiles in (({"y": 16, "x": 16}, 1), ({"y": (24, 24, 16), "x": 32}, 2)):
        xd.clear_cache()
        before = xd.compile_count()
        out = u0.chunk(chunks).stencil.scan(heat, "time", steps=10, save_every="last",
                                            halo_every=4, boundary=modes)
        got = out.values
        assert xd.compile_count() - before == compiles
        np.testing.assert_allclose(got, _heat_ref(u0.values, modes, 10), rtol=1e-5, atol=1e-5)


def test_scan_tasks_per_segment():
    u0 = field(shape=(64, 64)).chunk({"y": 16, "x": 16})
    for modes in ("periodic", "extend"):
        one = u0.stencil.scan(heat, "time", steps=4, save_every="last", halo_every=4,
                              boundary=modes)
        three = u0.stencil.scan(heat, "time", steps=12, save_every="last", halo_every=4,
                                boundary=modes)
        assert _per_chunk(one.data, 16) <= 10
        per_segment = (_per_chunk(three.data, 16) - _per_chunk(one.data, 16)) / 2
        assert per_segment <= 10


def test_progress_on_dask_data(capsys):
    """progress=True persists the result under dask's ProgressBar (threaded
    scheduler here), for a map and a scan, with the lazy result's values."""
    u = field(shape=(32, 40)).chunk({"y": 16, "x": 20})
    lazy = u.stencil.map(corners, boundary="periodic")
    capsys.readouterr()
    out = u.stencil.map(corners, boundary="periodic", progress=True)
    printed = capsys.readouterr().out
    assert "100% Completed" in printed
    assert isinstance(out.data, dsa.Array)
    np.testing.assert_array_equal(out.values, lazy.values)
    out = u.stencil.scan(heat, "time", steps=5, boundary="extend", progress=True)
    assert "100% Completed" in capsys.readouterr().out
    np.testing.assert_allclose(out.isel(time=-1).values, _heat_ref(u.values, {
        "y": "extend", "x": "extend"}, 5), rtol=1e-5, atol=1e-5)


def test_progress_in_memory_map_is_accepted():
    u = field(np.float64)
    out = u.stencil.map(corners, boundary="periodic", progress=True)
    np.testing.assert_allclose(out.values, _corners_ref(u.values, {"y": "periodic",
                                                                   "x": "periodic"}))


def test_map_unknown_keyword_lists_map_options_only():
    u = field()
    with pytest.raises(XStencilError, match=r"unknown keyword checkpoint=True.*the options "
                                            r"are \('window'.*'backend', 'out'\)$") as e:
        u.stencil.map(lambda v: v(x=1), checkpoint=True)
    for scan_only in ("'steps'", "'save_every'", "'check_finite'", "'halo_every'"):
        assert scan_only not in str(e.value)


def test_progress_with_a_distributed_client(capsys):
    """With a distributed Client active, progress=True persists on the
    cluster under distributed.progress (its text bar, outside a notebook)."""
    distributed = pytest.importorskip("distributed")
    u = field(shape=(32, 40)).chunk({"y": 16, "x": 20})
    expected = _corners_ref(u.values, {"y": "periodic", "x": "periodic"})
    with distributed.Client(processes=False, n_workers=1, threads_per_worker=1,
                            dashboard_address=":0"):
        capsys.readouterr()
        out = u.stencil.map(corners, boundary="periodic", progress=True)
        assert "100% Completed" in capsys.readouterr().out
        assert isinstance(out.data, dsa.Array)
        np.testing.assert_allclose(out.values, expected, rtol=1e-5, atol=1e-5)

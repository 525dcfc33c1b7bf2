"""Staggered calls (``grid=``/``at=``) and the compile cache: a kernel is
traced once per structure (also an inline lambda new on every call, a mesh
rebuilt in a loop, a scan), and a changed global or closure value the
kernel reads is never served stale, including one that changes which
coordinates the kernel reads.  References are numpy rolls (doubly periodic)."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

import xstencil
from tests.compiles import compiles

GRID = {"X": {"center": "x_c", "left": "x_g"}, "Y": {"center": "y_c", "left": "y_g"}}
CENTRE = {"X": "center", "Y": "center"}
TRACES: list[int] = []  # bumped while a kernel is traced (a sink list, see kcache.settle)
SCALE = 1.0
USE_COORD = False


def c_grid(nx: int = 12, ny: int = 6, seed: int = 0) -> xr.Dataset:
    rng = np.random.default_rng(seed)
    return xr.Dataset(
        {"u": (("y_c", "x_g"), rng.standard_normal((ny, nx))),
         "v": (("y_g", "x_c"), rng.standard_normal((ny, nx))),
         "h": (("y_c", "x_c"), 1 + 0.1 * rng.standard_normal((ny, nx)))},
        coords={"x_c": np.arange(nx) + 0.5, "x_g": np.arange(nx) * 1.0,
                "y_c": np.arange(ny) + 0.5, "y_g": np.arange(ny) * 1.0})


def traced() -> int:
    TRACES.append(1)
    return 0


def divergence(s):
    return traced() + s.u(X=0.5) - s.u(X=-0.5) + s.v(Y=0.5) - s.v(Y=-0.5)


def divergence_numpy(ds: xr.Dataset) -> np.ndarray:
    u, v = ds.u.values, ds.v.values
    return np.roll(u, -1, 1) - u + np.roll(v, -1, 0) - v


def scaled(s):
    return SCALE * divergence(s)


def maybe_coord(s):
    """Reads the x coordinate (a hidden variable of the plain call) only
    when the global flag is set."""
    if USE_COORD:
        return 0 * s.h() + s.h.coord("X")()
    return s.h()


def run(kernel, ds: xr.Dataset | None = None) -> xr.DataArray:
    ds = c_grid() if ds is None else ds
    return ds.stencil.map(kernel, grid=GRID, at=CENTRE, boundary="periodic")


def test_inline_lambdas_trace_once() -> None:
    """A lambda written inline is new on every call: the first call traces,
    the later ones (same structure) do not, and still give the right result."""
    ds = c_grid()
    for i in range(4):
        if i == 1:
            first = len(TRACES)
        out = run(lambda s: 2 * divergence(s), ds)
    assert len(TRACES) == first
    np.testing.assert_allclose(out.values, 2 * divergence_numpy(ds), rtol=1e-12)
    assert out.dims == ("y_c", "x_c")


def test_changed_global_is_not_served_stale() -> None:
    ds = c_grid()
    globals()["SCALE"] = 1.0
    np.testing.assert_allclose(run(scaled, ds).values, divergence_numpy(ds), rtol=1e-12)
    globals()["SCALE"] = 3.0
    try:
        np.testing.assert_allclose(run(scaled, ds).values, 3 * divergence_numpy(ds),
                                   rtol=1e-12)
    finally:
        globals()["SCALE"] = 1.0
    np.testing.assert_allclose(run(scaled, ds).values, divergence_numpy(ds), rtol=1e-12)


def test_changed_closure_value_is_not_served_stale() -> None:
    ds = c_grid()

    def make(c: float):
        return lambda s: c * divergence(s)

    for c in (1.0, -2.0, 0.5, -2.0):
        np.testing.assert_allclose(run(make(c), ds).values, c * divergence_numpy(ds),
                                   rtol=1e-12)
    before = len(TRACES)
    run(make(0.5), ds)  # seen before: no new trace
    assert len(TRACES) == before


def test_changed_global_changes_the_coordinates_read() -> None:
    """The hidden variables a kernel reads are found per kernel structure: a
    flag that makes it read a coordinate traces again (no stale 'did not
    read it on its first call' and no stale result)."""
    ds = c_grid()
    globals()["USE_COORD"] = False
    try:
        np.testing.assert_allclose(run(maybe_coord, ds).values, ds.h.values, rtol=1e-12)
        globals()["USE_COORD"] = True
        out = run(maybe_coord, ds)
        np.testing.assert_allclose(out.values, np.broadcast_to(ds.x_c.values, ds.h.shape),
                                   rtol=1e-12)
        globals()["USE_COORD"] = False
        np.testing.assert_allclose(run(maybe_coord, ds).values, ds.h.values, rtol=1e-12)
    finally:
        globals()["USE_COORD"] = False


def _mesh(ds: xr.Dataset, c: float) -> xstencil.GridMesh:
    m = ds.stencil.mesh(grid=GRID, at=CENTRE, boundary="periodic")
    m[...] = lambda s: c * divergence(s)
    m[{"X": 0}] = lambda s: traced() + c
    return m


def test_rebuilt_grid_mesh_compiles_once_and_sees_new_values() -> None:
    """(A Dataset mesh traces its kernels once per call to find each result's
    dims, grid or not; it does not compile again.)"""
    ds = c_grid()
    _mesh(ds, 2.0).map()
    with compiles() as got:
        for _ in range(3):
            out = _mesh(ds, 2.0).map()
    assert not got["compiles"]
    ref = 2 * divergence_numpy(ds)
    ref[:, 0] = 2.0
    np.testing.assert_allclose(out.values, ref, rtol=1e-12)
    ref = -1 * divergence_numpy(ds)
    ref[:, 0] = -1.0
    np.testing.assert_allclose(_mesh(ds, -1.0).map().values, ref, rtol=1e-12)


def test_scans_compile_once() -> None:
    """One kernel, and one kernel per variable: repeated scans do not compile
    (a Dataset scan traces once per call to find the names returned, grid or
    not)."""
    ds = c_grid()[["u", "h"]]
    ds = ds.assign(u=0 * ds.u + 0.5)

    def upwind(s):
        return {"h": traced() + s.h(time=-1) - 0.2 * (s.u(X=0.5) * s.h(time=-1)
                                                     - s.u(X=-0.5) * s.h(time=-1, X=-1))}

    each = {"h": lambda s: traced() + s.h(time=-1) - 0.1 * (s.h(time=-1)
                                                           - s.h(time=-1, X=-1)),
            "u": lambda s: traced() + s.u(time=-1)}
    outs = []
    for kernel, kw in ((upwind, {"at": CENTRE}), (each, {})):
        ds.stencil.scan(kernel, dim="time", steps=5, grid=GRID, boundary="periodic",
                        save_every="last", **kw)
        with compiles() as got:
            for _ in range(2):
                out = ds.stencil.scan(kernel, dim="time", steps=5, grid=GRID,
                                      boundary="periodic", save_every="last", **kw)
        assert not got["compiles"]
        outs.append(out)
    h = ds.h.values
    for _ in range(5):
        h = h - 0.2 * 0.5 * (h - np.roll(h, 1, 1))
    np.testing.assert_allclose(outs[0].h.values, h, rtol=1e-12)
    h = ds.h.values
    for _ in range(5):
        h = h - 0.1 * (h - np.roll(h, 1, 1))
    np.testing.assert_allclose(outs[1].h.values, h, rtol=1e-12)
    np.testing.assert_allclose(outs[1].u.values, ds.u.values, rtol=1e-12)


def test_new_vars_reach_the_grid_call() -> None:
    """A dict result with a new name needs ``new_vars`` on a grid too (it
    used to be dropped, so the error's advice could not be followed)."""
    ds = c_grid()
    kernel = lambda s: {"hu": 0.5 * (s.h(X=-0.5) + s.h(X=0.5))}  # noqa: E731
    at = {"X": "left", "Y": "center"}
    with pytest.raises(xstencil.XStencilError, match=r"returned 'hu'.*new_vars=\('hu',\)"):
        ds.stencil.map(kernel, grid=GRID, at=at, boundary="periodic")
    out = ds.stencil.map(kernel, grid=GRID, at=at, boundary="periodic", new_vars=("hu",))
    h = ds.h.values
    assert out.hu.dims == ("y_c", "x_g")
    np.testing.assert_allclose(out.hu.values, 0.5 * (np.roll(h, 1, 1) + h), rtol=1e-12)
    with pytest.raises(xstencil.XStencilError, match=r"new_vars=.*is for Dataset kernels"):
        ds.h.stencil.map(lambda u: u(X=0), grid=GRID, at=CENTRE, boundary="periodic",
                         new_vars=("hu",))

"""Dims outside a staggered grid (a vertical level) read along without a
boundary mode: they would take the grid's fill value, 0, past their edges
(silently, where a plain map reads NaN), so such a read raises and asks for
a mode; a given mode is honoured, and a scan reads along its own dim."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

import xstencil  # noqa: F401 - the accessor
from xstencil import XStencilError

NZ, NY, NX = 4, 3, 5
G = {"X": {"center": "x", "left": "xg"}, "Y": {"center": "y", "left": "yg"}}
AT = {"X": "center", "Y": "center"}
B = {"X": "periodic", "Y": "periodic"}


def _ds(dim: str = "z", chunk: bool = False) -> xr.Dataset:
    h = np.random.default_rng(0).random((NZ, NY, NX))
    ds = xr.Dataset({"h": ((dim, "y", "x"), h)},
                    coords={"x": np.arange(NX) + 0.5, "xg": np.arange(NX) * 1.0,
                            "y": np.arange(NY) + 0.5, "yg": np.arange(NY) * 1.0,
                            dim: np.arange(NZ)})
    return ds.chunk({"y": 2}) if chunk else ds


def _second(s):
    return s.h(z=-1) - 2 * s.h() + s.h(z=1)


def _np_second(h: np.ndarray, pad: str) -> np.ndarray:
    p = np.pad(h, ((1, 1), (0, 0), (0, 0)), mode=pad)
    return p[:-2] - 2 * p[1:-1] + p[2:]


@pytest.mark.parametrize("chunk", [False, True])
def test_read_along_an_unmoded_outside_dim_raises(chunk):
    with pytest.raises(XStencilError, match=r"s\['h'\]\(z=-1\): 'z' is a dim outside the "
                       r"grid and has no boundary mode.*boundary=\{\.\.\., 'z': 'extend'\}"):
        _ds(chunk=chunk).stencil.map(_second, grid=G, at=AT, boundary=B)


def test_mesh_read_along_an_unmoded_outside_dim_raises():
    m = _ds().stencil.mesh(grid=G, at=AT, boundary=B)
    m[...] = lambda s: s.h(z=1)
    with pytest.raises(XStencilError, match=r"'z' is a dim outside the grid"):
        m.map()


@pytest.mark.parametrize("chunk", [False, True])
@pytest.mark.parametrize(("mode", "pad"), [("extend", "edge"), ("periodic", "wrap"),
                                           ("symmetric", "symmetric")])
def test_a_given_mode_is_honoured(chunk, mode, pad):
    ds = _ds(chunk=chunk)
    out = ds.stencil.map(_second, grid=G, at=AT, boundary={**B, "z": mode})
    np.testing.assert_allclose(np.asarray(out.transpose("z", "y", "x")),
                               _np_second(ds.h.values, pad), rtol=1e-6, atol=1e-12)


def test_fill_reads_the_grids_fill_value_when_asked():
    ds = _ds()
    out = ds.stencil.map(_second, grid=G, at=AT, boundary={**B, "z": "fill"})
    np.testing.assert_allclose(np.asarray(out.transpose("z", "y", "x")),
                               _np_second(ds.h.values, "constant"), rtol=1e-6, atol=1e-12)
    one = ds.stencil.map(_second, grid=G, at=AT, boundary="periodic")  # one mode for all
    np.testing.assert_allclose(np.asarray(one.transpose("z", "y", "x")),
                               _np_second(ds.h.values, "wrap"), rtol=1e-6, atol=1e-12)


def test_reads_at_the_centre_and_along_the_grid_need_no_mode():
    ds = _ds()
    out = ds.stencil.map(lambda s: s.h(X=1, z=0) - s.h(), grid=G, at=AT, boundary=B)
    h = ds.h.values
    np.testing.assert_allclose(np.asarray(out.transpose("z", "y", "x")),
                               np.roll(h, -1, axis=2) - h, rtol=1e-6, atol=1e-12)


def test_scans_read_along_their_own_dim_without_a_mode():
    ds = _ds("time")
    h0 = ds.h.values[0]
    sc = ds.stencil.scan(lambda s: {"h": 0.5 * (s.h(time=-1) + s.h(X=1, time=-1))},
                         dim="time", grid=G, at=AT, boundary=B)
    ref = [h0]
    for _ in range(NZ - 1):
        ref.append(0.5 * (ref[-1] + np.roll(ref[-1], -1, axis=1)))
    np.testing.assert_allclose(sc.h.transpose("time", "y", "x").values, np.stack(ref),
                               rtol=1e-6)
    m = ds.stencil.mesh(grid=G, at=AT, boundary=B)
    m[...] = lambda s: {"h": 2 * s.h(time=-1)}
    got = m.scan("time").h.transpose("time", "y", "x").values
    np.testing.assert_allclose(got, np.stack([h0 * 2.0**k for k in range(NZ)]), rtol=1e-6)

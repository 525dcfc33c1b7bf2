"""help() and IDE signatures of the function mesh: ``xstencil.mesh`` lists its
options, and ``Mesh.map`` / ``Mesh.scan`` show theirs (issue 16)."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import xarray as xr

import xstencil
from xstencil._labelled.options import MESH

SCAN_OPTIONS = ("window", "boundary", "fill_value", "steps", "dt", "coord", "save_every",
                "progress", "checkpoint", "check_finite", "period", "halo_every", "dtype")


def test_mesh_has_an_explicit_signature_and_docs() -> None:
    sig = inspect.signature(xstencil.mesh)
    params = sig.parameters
    assert list(params)[0] == "obj"
    assert set(MESH) <= set(params)
    for name in MESH:
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY
        assert params[name].default is None
        assert f"\n    {name}" in xstencil.mesh.__doc__ or f", {name}\n" in xstencil.mesh.__doc__
    assert str(sig.return_annotation) != "Any"


@pytest.mark.parametrize("owner", [xr.DataArray, xr.Dataset])
def test_the_accessor_mesh_shows_the_same_options(owner: type) -> None:
    want = [p for p in inspect.signature(xstencil.mesh).parameters.values() if p.name != "obj"]
    got = list(inspect.signature(owner.stencil.mesh).parameters.values())[1:]
    assert got == want
    assert "window" in (owner.stencil.mesh.__doc__ or "")


def test_mesh_map_and_scan_show_real_signatures() -> None:
    mp = inspect.signature(xstencil.Mesh.map).parameters
    assert "dtype" in mp and mp["dtype"].kind is inspect.Parameter.KEYWORD_ONLY
    sp = inspect.signature(xstencil.Mesh.scan).parameters
    assert list(sp)[:2] == ["self", "dim"]
    assert sp["dim"].default == "time"
    for name in SCAN_OPTIONS:
        assert sp[name].kind is inspect.Parameter.KEYWORD_ONLY, name
        assert name in xstencil.Mesh.scan.__doc__, name
    for method in (xstencil.Mesh.map, xstencil.Mesh.scan):
        assert "Parameters\n" in method.__doc__ and "Returns\n" in method.__doc__


def test_mesh_scan_options_default_to_the_mesh() -> None:
    da = xr.DataArray(np.zeros((3, 5)), dims=("time", "x"))
    da[0] = np.arange(5.0)
    m = da.stencil.mesh(boundary="periodic")
    m[...] = lambda u: u(time=-1, x=1)
    out = m.scan("time")
    np.testing.assert_array_equal(out.values[1], np.roll(np.arange(5.0), -1))
    np.testing.assert_array_equal(out.values[2], np.roll(np.arange(5.0), -2))
    out = m.scan("time", boundary="extend")  # given: overrides the mesh's own
    np.testing.assert_array_equal(out.values[1], [1.0, 2.0, 3.0, 4.0, 4.0])


def test_an_unknown_mesh_option_still_names_the_accepted_ones() -> None:
    da = xr.DataArray(np.zeros(3), dims="x")
    with pytest.raises(xstencil.XStencilError,
                       match=r"da\.stencil\.mesh\(\.\.\.\): unknown option\(s\) \['bndry'\]; "
                             r"accepted are \['at', 'backend', 'boundary'"):
        xstencil.mesh(da, bndry="fill")

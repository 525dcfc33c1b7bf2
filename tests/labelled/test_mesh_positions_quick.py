"""Positions of ``m[{dim: sel}]`` for an int or a slice of ints take a short
path (``mesh_regions._int_positions``, for meshes rebuilt before every call);
it must give exactly what the general ``.isel``-style path gives, and leave
every other selector, and every error, to it."""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest
import xarray as xr

import xstencil  # noqa: F401 - registers the accessor
from xstencil._errors import XStencilError
from xstencil._labelled import mesh_regions as MR

_VALUES = [None, -9, -6, -5, -4, -1, 0, 1, 3, 4, 5, 6, 9]


@pytest.mark.parametrize("n", [0, 1, 5, 8])
def test_ints_and_slices_are_what_numpy_indexing_gives(n: int) -> None:
    for a, b, c in itertools.product(_VALUES, _VALUES, [None, -3, -1, 1, 2, 7]):
        sel = slice(a, b, c)
        got, want = MR._int_positions(sel, n), np.atleast_1d(np.arange(n)[sel])
        assert got is not None and got.dtype == want.dtype, sel
        np.testing.assert_array_equal(got, want)
    for i in range(-n, n):
        got = MR._int_positions(i, n)
        assert got is not None and got.dtype == np.arange(1).dtype
        np.testing.assert_array_equal(got, np.atleast_1d(np.arange(n)[i]))
    # out of range, bools, numpy ints, lists, floats and a zero step: the general path
    for sel in (n, -n - 1, True, np.int64(0), [0], 1.0, slice(0, 2, 0), slice(0.0, 2)):
        assert MR._int_positions(sel, n) is None


def test_a_mesh_gets_the_same_regions_and_errors_either_way(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Maps of a mesh whose regions go through the short path against the
    same mesh with it switched off; errors and the empty-region warning are
    the general path's."""
    da = xr.DataArray(np.random.default_rng(0).random((12, 10), dtype=np.float32),
                      dims=("y", "x"))
    keys = [{"y": 3}, {"y": -1}, {"x": slice(2, None, 3)}, {"y": slice(None, None, -2)},
            {"y": slice(1, 4), "x": -2}]

    def run() -> np.ndarray:
        m = da.stencil.mesh(boundary="periodic")
        m[...] = lambda u: u(x=1) - u(x=-1)
        for i, k in enumerate(keys):
            m[k] = lambda u, i=i: u() * (i + 2)
        return np.asarray(m.map().values)

    quick = run()
    monkeypatch.setattr(MR, "_int_positions", lambda sel, n: None)
    np.testing.assert_array_equal(quick, run())
    monkeypatch.undo()
    m = da.stencil.mesh()
    with pytest.raises(XStencilError, match="out of range"):
        m[{"y": 12}] = lambda u: u()
    with pytest.raises(XStencilError, match="not found"):
        m[{"z": 0}] = lambda u: u()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m[{"y": slice(5, 2)}] = lambda u: u()
    assert any("selects no cells" in str(w.message) for w in caught)

"""``m.loc[...]`` resolves plain numeric labels and label slices straight from
pandas (fast enough to rebuild a mesh in a loop); the positions must be the
ones ``.sel`` gives, and anything else still goes through ``.sel``."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

import xstencil
from xstencil._labelled.core import unwrap
from xstencil._labelled.mesh_regions import by_label

INDEXES = {
    "float_up": np.linspace(0.0, 1.0, 11),
    "float_down": np.linspace(1.0, 0.0, 11),
    "int_up": np.arange(0, 22, 2),
    "float32": np.linspace(0.0, 1.0, 11).astype(np.float32),
    "uneven": np.array([0.0, 0.1, 0.15, 0.5, 0.55, 0.9, 1.0, 2.0, 2.5, 3.0, 7.0]),
}
SELECTORS = [0.0, 0.5, 1.0, 2, 4, np.float64(0.3), np.int64(6), 0.1, 0.7000000000000001,
             slice(0.2, 0.6), slice(None, 0.35), slice(0.35, None), slice(0.6, 0.2),
             slice(2, 9), slice(None, None), slice(5.5, 5.6), slice(np.float32(0.2), 0.8),
             [0.0, 0.5], 3.0, 7.0]


def _sel(index: np.ndarray, sel):
    pos = xr.DataArray(np.arange(len(index)), dims="x", coords={"x": index})
    try:
        return np.atleast_1d(pos.sel(x=sel).values)
    except KeyError:
        return KeyError


@pytest.mark.parametrize("name", list(INDEXES))
@pytest.mark.parametrize("sel", SELECTORS, ids=repr)
def test_positions_equal_sel(name: str, sel) -> None:
    index = INDEXES[name]
    da = xr.DataArray(np.zeros(len(index)), dims="x", coords={"x": index})
    want = _sel(index, sel)
    call = "da.stencil.mesh(...)"
    if want is KeyError:
        with pytest.raises(KeyError, match="not found in coordinate 'x'"):
            by_label(call, da, unwrap(call, da), {"x": sel})
        return
    got = by_label(call, da, unwrap(call, da), {"x": sel})["x"]
    np.testing.assert_array_equal(got, want)


def test_duplicated_labels_still_follow_sel() -> None:
    da = xr.DataArray(np.arange(5.0), dims="x", coords={"x": [0.0, 1.0, 1.0, 2.0, 3.0]})
    m = da.stencil.mesh()
    m.loc[{"x": 1.0}] = lambda u: -u()
    np.testing.assert_array_equal(m.map().values, [0.0, -1.0, -2.0, 3.0, 4.0])


def test_rebuilt_label_mesh_matches_positions() -> None:
    da = xr.DataArray(np.arange(6.0), dims="x", coords={"x": np.linspace(0, 1, 6)})
    for lab, pos in ((0.2, 1), (0.6000000000000001, 3), (1.0, 5)):
        m = da.stencil.mesh()
        m.loc[{"x": lab}] = lambda u: u() * 10
        want = da.values.copy()
        want[pos] *= 10
        np.testing.assert_array_equal(m.map().values, want)
    m = da.stencil.mesh()
    with pytest.raises(xstencil.LabelError, match=r"label 0\.25 not found in coordinate 'x'"):
        m.loc[{"x": 0.25}] = lambda u: u()

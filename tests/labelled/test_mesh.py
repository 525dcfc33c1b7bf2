"""Function meshes on labelled data against the numpy reference."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

import xstencil
from tests.labelled.reference import ref_mesh


def interior(u):
    return u(x=-1) + u(x=1) + u(y=1)


def edge(u):
    return 10 * u()


def sponge(u):
    return -u(x=-1)


def const(u):
    return u() * 0 + 7


W = {"y": (0, 1), "x": (1, 1)}  # the window inferred from the kernels


def _data() -> xr.DataArray:
    rng = np.random.default_rng(0)
    return xr.DataArray(rng.random((4, 6)), dims=("y", "x"),
                        coords={"y": [10, 20, 30, 40], "x": np.linspace(0.0, 2.5, 6),
                                "note": ("x", list("abcdef"))},
                        attrs={"units": "m"}, name="T")


def _sel(da: xr.DataArray, **isel) -> np.ndarray:
    m = xr.zeros_like(da, dtype=bool)
    m[isel] = True
    return m.values


def test_later_wins_uncovered_keep_input():
    da = _data()
    m = da.stencil.mesh(boundary="extend")
    m[{"x": slice(1, 4)}] = interior
    m[{"y": 0}] = edge
    out = m.map()
    ref = ref_mesh(da.values, da.dims, [(_sel(da, x=slice(1, 4)), interior),
                                        (_sel(da, y=0), edge)],
                   window=W, boundary="extend")
    np.testing.assert_allclose(out.values, ref)
    np.testing.assert_array_equal(out.values[1:, 0], da.values[1:, 0])  # uncovered
    assert out.attrs == da.attrs and out.name == "T"
    xr.testing.assert_identical(out.coords.to_dataset(), da.coords.to_dataset())


def test_label_slices_inclusive_and_ellipsis_default():
    da = _data()
    m = da.stencil.mesh(boundary="periodic")
    m[...] = interior
    m.loc[{"x": slice(1.5, None)}] = sponge
    m.loc[{"x": 0.0}] = const
    m.loc[{"y": slice(20, 30)}] = edge  # inclusive: rows 1 and 2
    out = m.map()
    ref = ref_mesh(da.values, da.dims, [(None, interior), (_sel(da, x=slice(3, None)), sponge),
                                        (_sel(da, x=0), const), (_sel(da, y=[1, 2]), edge)],
                   window=W, boundary="periodic")
    np.testing.assert_allclose(out.values, ref)


def test_positions_with_negative_indices_and_lists():
    da = _data()
    m = da.stencil.mesh(boundary="extend")
    m[{"x": -1}] = edge
    m[{"y": slice(-2, None), "x": [0, 2, 3]}] = sponge
    out = m.map()
    ref = ref_mesh(da.values, da.dims, [(_sel(da, x=-1), edge),
                                        (_sel(da, y=slice(-2, None), x=[0, 2, 3]), sponge)],
                   window=W, boundary="extend")
    np.testing.assert_allclose(out.values, ref)


def test_mask_broadcasts_against_data():
    da = _data()
    land = da.x > 1.0  # 1-D mask over x, broadcast along y
    m = da.stencil.mesh(boundary="reflect")
    m[...] = interior
    m[land] = const
    m[da > 0.8] = edge  # a full 2-D mask
    out = m.map()
    mask1 = np.broadcast_to(land.values, da.shape)
    ref = ref_mesh(da.values, da.dims, [(None, interior), (mask1, const),
                                        ((da > 0.8).values, edge)],
                   window=W, boundary="reflect")
    np.testing.assert_allclose(out.values, ref)


def test_mask_with_transposed_dims():
    da = _data()
    mask = xr.DataArray(np.random.default_rng(2).random((6, 4)) > 0.5, dims=("x", "y"))
    m = da.stencil.mesh(boundary="extend")
    m[mask] = edge
    out = m.map()
    np.testing.assert_allclose(out.values, np.where(mask.values.T, 10 * da.values, da.values))


def test_nearest_helper():
    da = _data()
    m = da.stencil.mesh(boundary="extend")
    m.loc[xstencil.nearest(x=0.31)] = const  # nearest label is 0.5 (index 1)
    out = m.map()
    expect = da.values.copy()
    expect[:, 1] = 7
    np.testing.assert_allclose(out.values, expect)


@pytest.mark.parametrize("boundary", ["valid", "extend"])
def test_mesh_with_stride_and_valid(boundary):
    da = _data()
    m = da.stencil.mesh(boundary=boundary, stride={"x": 2})
    m[...] = interior
    m[{"x": 2}] = sponge
    m.loc[{"x": 2.0}] = edge  # x=2.0 is index 4; on the strided grid when not valid
    out = m.map()
    regions = [(None, interior), (_sel(da, x=2), sponge), (_sel(da, x=4), edge)]
    ref = ref_mesh(da.values, da.dims, regions, window=W, boundary=boundary,
                   stride={"x": 2})
    np.testing.assert_allclose(out.values, ref)
    trimmed = da.isel(y=slice(0, -1), x=slice(1, -1, 2)) if boundary == "valid" \
        else da.isel(x=slice(None, None, 2))
    xr.testing.assert_identical(out.coords.to_dataset(), trimmed.coords.to_dataset())


def test_mesh_runs_with_args_and_does_not_mutate_input():
    da = _data()
    before = da.copy(deep=True)
    m = da.stencil.mesh(boundary="extend")
    m[...] = lambda u, c: c * u()
    m[{"x": 0}] = lambda u, c: -c * u()
    out = m.map(np.float64(2.0))
    expect = 2 * da.values
    expect[:, 0] *= -1
    np.testing.assert_allclose(out.values, expect)
    xr.testing.assert_identical(da, before)


def test_accessor_and_function_agree():
    da = _data()
    a = da.stencil.mesh(boundary="extend")
    b = xstencil.mesh(da, boundary="extend")
    for m in (a, b):
        m[...] = interior
        m[{"x": 0}] = edge
    xr.testing.assert_identical(a.map(), b.map())


# -- bad input ---------------------------------------------------------------------------

def test_missing_label_raises_keyerror_naming_dim_label_nearest():
    m = _data().stencil.mesh()
    with pytest.raises(KeyError, match=r"label 0\.33 not found in coordinate 'x'; nearest "
                                       r"available are \[0\.5, 0\.0, 1\.0\]"):
        m.loc[{"x": 0.33}] = edge
    with pytest.raises(xstencil.LabelError, match=r"label 25 not found in coordinate 'y'"):
        m.loc[{"y": 25}] = edge


def test_selector_on_dim_without_index():
    m = _data().drop_vars("x").stencil.mesh()
    with pytest.raises(xstencil.XStencilError,
                       match=r"m\.loc\[\{'x': \.\.\.\}\]: dim 'x' has no index coordinate.*"
                             r"m\[\{'x': \.\.\.\}\]"):
        m.loc[{"x": 0.5}] = edge


def test_selector_dim_not_in_data():
    m = _data().stencil.mesh()
    with pytest.raises(xstencil.XStencilError, match=r"dimension 'z' not found; available dims"
                                                     r" are \('y', 'x'\)"):
        m[{"z": 0}] = edge
    with pytest.raises(xstencil.XStencilError, match=r"position 9 is out of range for dim 'x'"):
        m[{"x": 9}] = edge


def test_mask_dims_mismatch():
    m = _data().stencil.mesh()
    with pytest.raises(xstencil.XStencilError, match=r"the mask has dims \('z',\).*\['z'\] are "
                                                     r"not dims of the data"):
        m[xr.DataArray(np.ones(3, bool), dims="z")] = edge
    with pytest.raises(xstencil.XStencilError, match=r"mask has length 3 along 'x' but the data"
                                                     r" has 6"):
        m[xr.DataArray(np.ones(3, bool), dims="x")] = edge
    with pytest.raises(xstencil.XStencilError, match=r"mask has dtype float64; use a boolean"):
        m[xr.DataArray(np.ones(6), dims="x")] = edge


def test_mesh_bad_assignments():
    m = _data().stencil.mesh()
    with pytest.raises(xstencil.XStencilError, match=r"assign a kernel function"):
        m[...] = 3.0
    with pytest.raises(xstencil.XStencilError, match=r"select with '\.\.\.'"):
        m[0] = edge
    with pytest.raises(xstencil.XStencilError, match=r"the mesh has no regions"):
        m.map()
    with pytest.raises(xstencil.XStencilError, match=r"unknown option\(s\) \['windw'\]"):
        _data().stencil.mesh(windw={"x": 3})

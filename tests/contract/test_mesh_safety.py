"""Meshes and periodic grids that used to give silently wrong results
(issues 11 and 12): empty regions, masks with other labels, stale data,
float positions, duplicated labels, repeated periodic endpoints, and
``jax.vmap`` naming."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr

import xstencil
from xstencil import XStencilError


def test_a_region_on_a_descending_coordinate_that_selects_nothing_warns() -> None:
    da = xr.DataArray(np.arange(9.0), dims="lat", coords={"lat": np.linspace(80, -80, 9)})
    m = da.stencil.mesh()
    with pytest.warns(UserWarning, match=r"m.loc\[\{'lat': slice\(30, 60, None\)\}\].*selects "
                                         r"no cells.*descending.*use slice\(60, 30\)"):
        m.loc[{"lat": slice(30, 60)}] = lambda u: 0.0
    m.loc[{"lat": slice(60, 30)}] = lambda u: -1.0  # the right way round: no warning
    expected = np.where((da.lat >= 30) & (da.lat <= 60), -1.0, da.values)
    np.testing.assert_array_equal(m.map().values, expected)


def test_other_empty_regions_warn() -> None:
    da = xr.DataArray(np.arange(4.0), dims="x", coords={"x": np.arange(4.0)})
    m = da.stencil.mesh()
    with pytest.warns(UserWarning, match=r"m.loc\[\{'x': slice\(10, 20, None\)\}\].*selects no "
                                         r"cells along \('x',\)") as rec:
        m.loc[{"x": slice(10, 20)}] = lambda u: 0.0
    assert "descending" not in str(rec[0].message)
    with pytest.warns(UserWarning, match=r"m\[\{'x': \[\]\}\].*selects no cells"):
        m[{"x": []}] = lambda u: 0.0
    with pytest.warns(UserWarning, match=r"m\[mask\].*False everywhere"):
        m[da > 10] = lambda u: 0.0


def test_a_flipped_mask_is_aligned_by_label() -> None:
    T = xr.DataArray(np.arange(6.0), dims="x", coords={"x": np.arange(6.0)})
    mask = T.x < 2
    flipped = mask.isel(x=slice(None, None, -1))
    m = T.stencil.mesh()
    m[flipped] = lambda u: -u()
    np.testing.assert_array_equal(m.map().values, np.where(T.x.values < 2, -T.values, T.values))


def test_a_mask_with_other_labels_raises() -> None:
    T = xr.DataArray(np.arange(6.0), dims="x", coords={"x": np.arange(6.0)})
    m = T.stencil.mesh()
    with pytest.raises(XStencilError, match=r"the mask has \[0.5, 1.5, 2.5\]"
                                            r".*reindex_like"):
        m[(T.x < 2).assign_coords(x=T.x + 0.5)] = lambda u: -u()


def test_the_mesh_reads_the_data_when_it_runs() -> None:
    T = xr.DataArray(np.arange(6.0), dims="x", coords={"x": np.arange(6.0)})
    m = T.stencil.mesh()
    m[...] = lambda u: u() * 2
    stepper = T.stencil.mesh()
    stepper[...] = lambda u: u(t=-1) * 2
    np.testing.assert_array_equal(m.map().values, np.arange(6.0) * 2)
    T.data = np.full(6, 5.0)
    np.testing.assert_array_equal(m.map().values, np.full(6, 10.0))
    traj = stepper.scan(dim="t", steps=1)
    np.testing.assert_array_equal(traj.isel(t=-1).values, np.full(6, 10.0))


def test_changed_labels_after_the_regions_raise() -> None:
    T = xr.DataArray(np.arange(6.0), dims="x", coords={"x": np.arange(6.0)})
    m = T.stencil.mesh()
    m.loc[{"x": 1.0}] = lambda u: 0.0
    T["x"] = np.arange(6.0) * 10
    with pytest.raises(XStencilError, match="coordinate labels changed after the mesh was "
                                            "created.*create the mesh again"):
        m.map()


@pytest.mark.parametrize("pos", [1.0, np.float32(2.0), [0.0, 1.0]])
def test_a_float_position_says_positions_are_ints(pos: object) -> None:
    m = xr.DataArray(np.arange(4.0), dims="x").stencil.mesh()
    with pytest.raises(XStencilError, match=r"positions are ints.*m.loc\["):
        m[{"x": pos}] = lambda u: 0.0


def test_nearest_on_duplicated_labels_raises_clearly() -> None:
    da = xr.DataArray(np.arange(4.0), dims="x", coords={"x": [0.0, 1.0, 1.0, 2.0]})
    m = da.stencil.mesh()
    with pytest.raises(XStencilError, match=r"xstencil.nearest\(x=0.9\).*duplicated labels "
                                            r"\[1.0\]"):
        m.loc[xstencil.nearest(x=0.9)] = lambda u: 0.0


def _ddx(u: xstencil.Window) -> jax.Array:
    return (u(x=1) - u(x=-1)) / (u.coord("x")(x=1) - u.coord("x")(x=-1))


def test_a_periodic_grid_repeating_its_endpoint_warns() -> None:
    x = np.linspace(0, 2 * np.pi, 21)
    da = xr.DataArray(np.sin(x), dims="x", coords={"x": x})
    with pytest.warns(UserWarning, match=r"periodic' on 'x'.*one period \(6.28319\) apart.*"
                                         r"Drop the last point"):
        da.stencil.map(lambda u: u(x=1) - u(x=-1), boundary="periodic")
    deg = xr.DataArray(np.zeros(37), dims="lon", coords={"lon": np.linspace(-180, 180, 37)})
    with pytest.warns(UserWarning, match="one period \\(360\\) apart"):
        deg.stencil.map(lambda u: u(lon=1), boundary={"lon": "periodic"})
    y = np.linspace(0, 3, 4)
    given = xr.DataArray(y, dims="x", coords={"x": y})
    with pytest.warns(UserWarning, match=r"one period \(3\) apart"):
        given.stencil.map(_ddx, boundary="periodic", period={"x": 3.0})


def test_ordinary_periodic_grids_do_not_warn() -> None:
    # pytest turns any warning into an error here
    x = np.linspace(0, 2 * np.pi, 20, endpoint=False)
    da = xr.DataArray(np.sin(x), dims="x", coords={"x": x})
    out = da.stencil.map(_ddx, boundary="periodic")
    np.testing.assert_allclose(out.values, np.cos(x), atol=0.02)
    lon = xr.DataArray(np.zeros(36), dims="lon", coords={"lon": np.arange(0.0, 360.0, 10.0)})
    lon.stencil.map(lambda u: u(lon=1), boundary="periodic")
    full = xr.DataArray(np.sin(x), dims="x", coords={"x": x})
    full.stencil.map(_ddx, boundary="periodic", period={"x": 2 * np.pi})
    # a non-periodic boundary on a grid with both endpoints is fine
    y = np.linspace(0, 2 * np.pi, 21)
    xr.DataArray(y, dims="x", coords={"x": y}).stencil.map(lambda u: u(x=1), boundary="extend")


def test_vmap_never_gives_two_dims_of_one_name() -> None:
    da = xr.DataArray(np.arange(12.0).reshape(3, 4), dims=("batch", "x"),
                      coords={"batch": [10, 20, 30], "x": np.arange(4.0)})
    out = jax.vmap(lambda a: da * a)(jnp.arange(2.0))
    assert out.dims == ("batch_1", "batch", "x")
    np.testing.assert_array_equal(out.batch.values, [10, 20, 30])
    np.testing.assert_allclose(out.values, np.arange(2.0)[:, None, None] * da.values)

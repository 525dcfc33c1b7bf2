"""What a Dataset kernel returns: names, dims (and their order), coordinates
and dtypes, checked against numpy (issues 11 and 12: staggered outer
products, typo names, replaced coordinates, grown dims, transposed results)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr
from hypothesis import given
from hypothesis import strategies as st

import xstencil
from xstencil import XStencilError


def _ds() -> xr.Dataset:
    rng = np.random.default_rng(0)
    return xr.Dataset(
        {"h": (("y", "x"), rng.random((3, 4))), "u": (("x", "y"), rng.random((4, 3))),
         "lat": ("y", np.array([10.0, 20.0, 30.0]))},
        coords={"x": np.arange(4.0), "y": np.arange(3.0), "c": ("x", np.arange(4.0) * 2)},
        attrs={"title": "t"})


def test_staggered_variables_raise_instead_of_an_outer_product() -> None:
    ds = xr.Dataset({"u": (("y_c", "x_g"), np.ones((3, 4))),
                     "v": (("y_g", "x_c"), np.ones((4, 3)))})
    with pytest.raises(XStencilError, match=r"outer product over \('y_c', 'x_g', 'y_g', "
                                            r"'x_c'\).*interpolate to common points.*grid="):
        ds.stencil.map(lambda s: s.u(x_g=1) - s.u() + s.v(y_g=1) - s.v())
    with pytest.raises(XStencilError, match="outer product"):
        ds.stencil.map(lambda s: {"u": s.u() + s.v()})


def test_staggered_variables_read_separately_keep_their_dims() -> None:
    ds = xr.Dataset({"u": (("y_c", "x_g"), np.arange(12.0).reshape(3, 4)),
                     "v": (("y_g", "x_c"), np.arange(12.0).reshape(4, 3))})
    out = ds.stencil.map(lambda s: {"u": s.u(x_g=1) - s.u(), "v": s.v(y_g=1) - s.v()},
                         boundary="periodic")
    assert out.u.dims == ("y_c", "x_g") and out.v.dims == ("y_g", "x_c")
    np.testing.assert_allclose(out.u.values, np.roll(ds.u.values, -1, 1) - ds.u.values)
    np.testing.assert_allclose(out.v.values, np.roll(ds.v.values, -1, 0) - ds.v.values)


@pytest.mark.parametrize("name", ["hh", "U"])
def test_a_typo_name_raises(name: str) -> None:
    ds = _ds()
    with pytest.raises(XStencilError, match=rf"returned '{name}', which is not a data variable.*"
                                            rf"new_vars=\('{name}',\)"):
        ds.stencil.map(lambda s: {name: s.h() * 2})


def test_a_declared_new_name_is_added() -> None:
    ds = _ds()
    out = ds.stencil.map(lambda s: {"speed": s.h() * 2}, new_vars="speed")
    np.testing.assert_allclose(out.speed.values, ds.h.values * 2)
    assert out.speed.dims == ("y", "x")
    xr.testing.assert_identical(out.drop_vars("speed"), ds)
    m = ds.stencil.mesh(new_vars=("speed",))
    m[...] = lambda s: {"speed": s.lat() + 1}
    res = m.map()
    assert res.speed.dims == ("y",)
    np.testing.assert_allclose(res.speed.values, ds.lat.values + 1)


def test_new_vars_on_a_dataarray_raises() -> None:
    with pytest.raises(XStencilError, match="new_vars=.*Dataset kernels"):
        _ds().h.stencil.map(lambda u: u(), new_vars="a")


@pytest.mark.parametrize("name, kind", [("x", "an index coordinate"), ("c", "a coordinate")])
def test_returning_a_coordinate_name_raises(name: str, kind: str) -> None:
    ds = _ds()
    with pytest.raises(XStencilError, match=f"returned '{name}', which is {kind}.*never "
                                            f"replace coordinates"):
        ds.stencil.map(lambda s: {name: s.h()}, new_vars=(name,))
    np.testing.assert_array_equal(ds.x.values, np.arange(4.0))  # the input is untouched


def test_a_1d_variable_from_a_2d_field_raises_instead_of_growing() -> None:
    with pytest.raises(XStencilError, match=r"returned 'lat' computed from dims \('x',\).*grow "
                                            r"a dim"):
        _ds().stencil.map(lambda s: {"lat": s.lat() + s.h()})


def test_a_1d_variable_from_1d_reads_keeps_its_dims() -> None:
    ds = _ds()
    out = ds.stencil.map(lambda s: {"lat": s.lat(y=1) - s.lat()}, boundary="periodic")
    assert out.lat.dims == ("y",)
    np.testing.assert_allclose(out.lat.values, np.roll(ds.lat.values, -1) - ds.lat.values)
    single = ds.stencil.map(lambda s: s.lat() * 2)
    assert single.dims == ("y",)
    xr.testing.assert_identical(single.coords.to_dataset(), ds.lat.coords.to_dataset())


def test_a_variable_keeps_its_own_dim_order() -> None:
    ds = _ds()
    out = ds.stencil.map(lambda s: {"u": s.u(x=1) * 2, "h": s.h(x=1)}, boundary="periodic")
    assert out.u.dims == ("x", "y") and out.h.dims == ("y", "x")
    np.testing.assert_allclose(out.u.values, np.roll(ds.u.values, -1, 0) * 2)
    np.testing.assert_allclose(out.h.values, np.roll(ds.h.values, -1, 1))
    m = ds.stencil.mesh(boundary="periodic")
    m[...] = lambda s: {"u": s.u(x=1) * 2}
    np.testing.assert_allclose(m.map().u.transpose("x", "y").values, out.u.values)
    assert m.map().u.dims == ("x", "y")


def test_output_dims_clashing_with_a_scalar_coordinate_or_a_variable_raise() -> None:
    da = xr.DataArray(np.zeros(3), dims="y", coords={"s": 1.0})
    with pytest.raises(XStencilError, match="output_dims='s' names new dim 's', which is already "
                                            "a coordinate"):
        da.stencil.map(lambda u: jnp.stack([u(), u()]), output_dims="s")
    ds = xr.Dataset({"a": ("y", np.zeros(3)), "k": ("y", np.zeros(3))})
    with pytest.raises(XStencilError, match=r"output_dims=\('k',\) names new dim 'k', which is "
                                            r"already a data variable"):
        ds.stencil.map(lambda s: {"a": jnp.stack([s.a(), s.a()])}, output_dims=("k",))


_DIMS = [("y", "x"), ("x", "y"), ("y",), ("x",)]


@st.composite
def _datasets(draw: st.DrawFn) -> tuple[xr.Dataset, list[str], bool]:
    nvar = draw(st.integers(1, 3))
    sizes = {"y": draw(st.integers(2, 4)), "x": draw(st.integers(2, 5))}
    variables = {}
    # one dtype per Dataset: the dtype of a new variable is then the same
    # whether it follows the kernel (JAX's rule) or promotes all variables
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    for k in range(nvar):
        dims = draw(st.sampled_from(_DIMS))
        data = np.arange(np.prod([sizes[d] for d in dims]), dtype=dtype).reshape(
            [sizes[d] for d in dims]) * (k + 1)
        variables[f"v{k}"] = (dims, data)
    if draw(st.booleans()):
        variables["v0"] = (("y", "x"), variables["v0"][1].reshape(-1)[:1].repeat(
            sizes["y"] * sizes["x"]).reshape(sizes["y"], sizes["x"]))
    ds = xr.Dataset(variables, coords={"x": np.arange(sizes["x"]) * 0.5,
                                       "y": -np.arange(sizes["y"]) * 1.0,
                                       "lab": ("x", np.arange(sizes["x"]) + 100)},
                    attrs={"a": 1})
    returned = draw(st.lists(st.sampled_from(sorted(variables)), min_size=1, unique=True))
    return ds, returned, draw(st.booleans())


@given(_datasets())
def test_dataset_returns_match_numpy(case: tuple[xr.Dataset, list[str], bool]) -> None:
    ds, returned, add_new = case

    def kernel(s: xstencil.WindowSet) -> dict[str, object]:
        out = {n: s[n](**{ds[n].dims[0]: 1}) * 2 for n in returned}
        if add_new:
            out["new"] = s[returned[0]]() + 1
        return out

    res = ds.stencil.map(kernel, boundary="periodic", new_vars="new")
    expected_names = list(ds.data_vars) + (["new"] if add_new else [])
    assert list(res.data_vars) == expected_names
    assert res.attrs == ds.attrs
    xr.testing.assert_identical(res.coords.to_dataset(), ds.coords.to_dataset())
    for n in ds.data_vars:
        v = ds[n]
        ref = np.roll(v.values, -1, axis=0) * 2 if n in returned else v.values
        assert res[n].dims == v.dims, n
        assert res[n].dtype == v.dtype, n
        np.testing.assert_allclose(res[n].values, ref, rtol=1e-6)
    if add_new:
        src = ds[returned[0]]
        assert res["new"].dims == src.dims
        assert res["new"].dtype == src.dtype
        np.testing.assert_allclose(res["new"].values, src.values + 1, rtol=1e-6)

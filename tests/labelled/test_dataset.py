"""Dataset kernels: ``s["u"]`` windows, dict outputs, variables of different dims."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

import xstencil
from tests.labelled.reference import ref_map


def tendencies(s):
    return {"u": -(s["h"](x=1) - s["h"](x=-1)) / 2, "h": -(s.u(x=1) - s.u(x=-1)) / 2}


def mixed(s):
    return s["field"](x=1) * s["profile"]() + s["field"](y=-1)


def only_u(s):
    return {"u": s["u"](x=1)}


def _ds() -> xr.Dataset:
    rng = np.random.default_rng(0)
    x = np.arange(6) * 0.5
    return xr.Dataset(
        {"u": (("x",), rng.random(6), {"units": "m/s"}),
         "h": (("x",), rng.random(6), {"units": "m"}),
         "tracer": (("x",), np.arange(6, dtype=np.int32))},
        coords={"x": x}, attrs={"title": "shallow water"},
    )


@pytest.mark.parametrize("boundary", ["periodic", "extend", "valid"])
def test_dict_output_becomes_dataset(boundary):
    ds = _ds()
    out = ds.stencil.map(tendencies, boundary=boundary)
    assert isinstance(out, xr.Dataset)
    assert out.attrs == ds.attrs
    for name, src in (("u", "h"), ("h", "u")):
        ref, _ = ref_map(ds[src].values, ("x",), lambda w: -(w(x=1) - w(x=-1)) / 2,
                         window={"x": 3}, boundary=boundary)
        np.testing.assert_allclose(out[name].values, ref)
        assert out[name].attrs == ds[name].attrs
    # variables the kernel does not return are kept (trimmed with the coords for valid)
    keep = ds.tracer if boundary != "valid" else ds.tracer.isel(x=slice(1, -1))
    xr.testing.assert_identical(out.tracer, keep)
    assert out.tracer.dtype == np.int32


def test_single_value_output_becomes_dataarray_with_different_dims():
    rng = np.random.default_rng(1)
    ds = xr.Dataset({"field": (("y", "x"), rng.random((4, 5))),
                     "profile": (("y",), rng.random(4))},
                    coords={"y": np.arange(4.0), "x": np.arange(5.0)})
    out = ds.stencil.map(mixed, boundary="periodic")
    assert isinstance(out, xr.DataArray) and out.dims == ("y", "x")
    f, p = ds.field.values, ds.profile.values
    np.testing.assert_allclose(out.values, np.roll(f, -1, 1) * p[:, None] + np.roll(f, 1, 0))
    xr.testing.assert_identical(out.coords.to_dataset(), ds.coords.to_dataset())


def test_unread_variables_untouched_and_input_not_mutated():
    ds = _ds()
    before = ds.copy(deep=True)
    out = ds.stencil.map(only_u, boundary="periodic")
    xr.testing.assert_identical(out.h, ds.h)
    xr.testing.assert_identical(out.tracer, ds.tracer)
    np.testing.assert_allclose(out.u.values, np.roll(ds.u.values, -1))
    xr.testing.assert_identical(ds, before)


def test_dataset_float32_and_int_dtypes_kept():
    ds = _ds().assign(u=lambda d: d.u.astype(np.float32))
    out = ds.stencil.map(lambda s: {"u": s.u(x=1), "tracer": s.tracer(x=1)},
                         boundary="periodic")
    assert out.u.dtype == np.float32 and out.tracer.dtype == np.int32
    np.testing.assert_array_equal(out.tracer.values, np.roll(ds.tracer.values, -1))


def test_dataset_mesh():
    ds = _ds()
    m = ds.stencil.mesh(boundary="periodic")
    m[...] = tendencies
    m.loc[{"x": 0.0}] = lambda s: {"u": s.u() * 0, "h": s.h()}
    out = m.map()
    full = ds.stencil.map(tendencies, boundary="periodic")
    np.testing.assert_allclose(out.u.values[1:], full.u.values[1:])
    assert out.u.values[0] == 0 and out.h.values[0] == ds.h.values[0]


def test_accessor_and_function_agree():
    ds = _ds()
    xr.testing.assert_identical(ds.stencil.map(tendencies, boundary="periodic"),
                                xstencil.map(ds, tendencies, boundary="periodic"))


def test_missing_variable():
    ds = _ds()
    with pytest.raises(xstencil.XStencilError,
                       match=r"s\['q'\]: the Dataset has no data variable 'q'; available are "
                             r"\('u', 'h', 'tracer'\)"):
        ds.stencil.map(lambda s: s["q"](x=1))
    with pytest.raises(xstencil.XStencilError, match=r"no data variable 'q'"):
        ds.stencil.map(lambda s: s.q(x=1), window={"x": 3}, boundary="periodic")


def test_non_numeric_variable_and_bad_dict_keys():
    ds = _ds().assign(name=("x", list("abcdef")))
    with pytest.raises(xstencil.XStencilError,
                       match=r"ds\.stencil\.map\(\.\.\.\): data variable 'name' has dtype <U1, "
                             r"which is not numeric.*astype\(float\)"):
        ds.stencil.map(only_u)
    with pytest.raises(xstencil.XStencilError, match=r"returned a dict with key 1; keys must be"):
        _ds().stencil.map(lambda s: {1: s.u(x=1)}, boundary="periodic")
    with pytest.raises(xstencil.XStencilError, match=r"returned a dict, which only a Dataset"):
        _ds().u.stencil.map(lambda u: {"u": u(x=1)})
    with pytest.raises(xstencil.XStencilError,
                       match=r"boundary 'fill' on int32 data needs fill_value=\.\.\.; the "
                             r"default NaN has no int32 value \(variable 'tracer'\)"):
        _ds().stencil.map(only_u)

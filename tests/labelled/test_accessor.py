"""The ``.stencil`` accessor: registration, delegation, and the bad-input
messages of the labelled calls (each names the call, argument, value and fix)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import xarray as xr

import xstencil
from xstencil import KernelError, LabelError, WindowIndexError, XStencilError


def grad_x(u):
    return u(x=1) - u(x=-1)


@pytest.fixture
def da() -> xr.DataArray:
    return xr.DataArray(np.arange(12.0).reshape(3, 4), dims=("y", "x"),
                        coords={"x": np.arange(4.0)}, name="a", attrs={"k": 1})


def test_accessor_registered_on_both_types(da):
    assert isinstance(da.stencil, xstencil.StencilAccessor)
    assert isinstance(da.to_dataset().stencil, xstencil.StencilAccessor)
    assert da.stencil._obj is da
    assert {"map", "mesh", "scan"} <= set(dir(xstencil.StencilAccessor))


def test_accessor_and_function_agree(da):
    xr.testing.assert_identical(da.stencil.map(grad_x, boundary="periodic"),
                                xstencil.map(da, grad_x, boundary="periodic"))
    assert repr(da.stencil.mesh()).startswith("<xstencil.Mesh over")


def test_accessor_works_on_transformed_objects(da):
    out = (da * 2).isel(y=slice(0, 2)).stencil.map(grad_x, boundary="extend")
    assert out.shape == (2, 4)


# -- bad input -------------------------------------------------------------------------

CALL = re.escape("da.stencil.map(...)")


@pytest.mark.parametrize("kwargs, match", [
    ({"window": {"z": 3}},
     CALL + r": window=\{'z': 3\}: dimension 'z' not found; available dims are \('y', 'x'\)"),
    ({"boundary": {"z": "fill"}},
     CALL + r": boundary=\{'z': 'fill'\}: dimension 'z' not found; available dims are"),
    ({"stride": {"z": 2}},
     CALL + r": stride=\{'z': 2\}: dimension 'z' not found; available dims are"),
    ({"window": {"x": 0}},
     CALL + r": window=\{'x': 0\}: a window size must be >= 1; use \{'x': 3\}"),
    ({"window": {"x": -2}}, CALL + r": window=\{'x': -2\}: a window size must be >= 1"),
    ({"window": {"x": 9}, "boundary": "valid"},
     CALL + r": window=\{'x': 9\} spans 9 cells along 'x', which has only 4; with boundary "
            r"'valid' nothing is left \(use a smaller window or a padding boundary mode\)"),
    ({"boundary": "clamp"},
     CALL + r": boundary='clamp' is not a boundary mode; use one of \('fill', 'extend', "
            r"'periodic', 'reflect', 'symmetric', 'valid'\)"),
    ({"boundary": {"x": "zero"}},
     CALL + r": boundary=\{'x': 'zero'\}: 'zero' is not a boundary mode for dim 'x'"),
])
def test_bad_options(da, kwargs, match):
    with pytest.raises(XStencilError, match=match):
        da.stencil.map(lambda u: u.sum(), **({"window": {"x": 3}} | kwargs))


def test_int_data_with_default_nan_fill():
    di = xr.DataArray(np.arange(5), dims="x")
    with pytest.raises(XStencilError, match=CALL + r": boundary 'fill' on int64 data needs "
                                                   r"fill_value=\.\.\.;.*fill_value=0"):
        di.stencil.map(grad_x)
    with pytest.raises(XStencilError, match=r"fill_value=0\.5 cannot be stored in int64 data"):
        di.stencil.map(grad_x, fill_value=0.5)


def test_kernel_reads_a_dim_the_data_lacks(da):
    with pytest.raises(XStencilError, match=CALL + r".*u\(z=\.\.\.\): dimension 'z' not found; "
                                                   r"available dims are"):
        da.stencil.map(lambda u: u(z=1))
    with pytest.raises(XStencilError, match=r"u\(z=\.\.\.\): dimension 'z' not found"):
        da.stencil.map(lambda u: u(z=1), window={"x": 3})


def test_read_outside_declared_window(da):
    with pytest.raises(WindowIndexError, match=r"u read at offset 2 along 'x' is outside the "
                                               r"window, which reaches offsets -1\.\.1"):
        da.stencil.map(lambda u: u(x=2), window={"x": 3})


def test_kernel_returns_wrong_shape_for_output_dims(da):
    with pytest.raises(XStencilError, match=r"returned shape \(3,\) per point, which does not "
                                            r"match output_dims=\('a', 'b'\)"):
        da.stencil.map(lambda u: u.array, window={"x": 3}, output_dims=("a", "b"))
    with pytest.raises(XStencilError, match=r"returned an array of shape \(3,\) per point; name "
                                            r"its dims with output_dims="):
        da.stencil.map(lambda u: u.array, window={"x": 3})


def test_window_inference_needs_explicit_window_for_array_use(da):
    with pytest.raises(XStencilError, match=r"cannot infer the window.*pass window="):
        da.stencil.map(lambda u: u.sum())


def test_kernel_failure_is_wrapped(da):
    def broken(u):
        return u(x=1) + "a"

    with pytest.raises(KernelError, match=r"kernel 'broken' failed"):
        da.stencil.map(broken, window={"x": 3})


def test_non_numeric_data():
    s = xr.DataArray(np.array(list("abc")), dims="x")
    with pytest.raises(XStencilError, match=CALL + r": the data has dtype <U1, which is not "
                                                   r"numeric.*\.astype\(float\)"):
        s.stencil.map(grad_x)
    o = xr.DataArray(np.array([None, 1, 2], dtype=object), dims="x")
    with pytest.raises(XStencilError, match=r"dtype object, which is not numeric"):
        o.stencil.map(grad_x)


def test_not_callable_and_not_xarray(da):
    with pytest.raises(XStencilError, match=r"kernel=3 is not callable"):
        da.stencil.map(3)
    with pytest.raises(XStencilError, match=r"expected an xarray DataArray or Dataset, got "
                                            r"ndarray"):
        xstencil.map(np.zeros(3), grad_x)


def test_mesh_label_missing_is_a_keyerror(da):
    m = da.stencil.mesh()
    with pytest.raises(KeyError) as info:
        m.loc[{"x": 1.2}] = grad_x
    assert isinstance(info.value, LabelError)
    assert "label 1.2 not found in coordinate 'x'; nearest available are [1.0, 2.0, 0.0]" \
        in str(info.value)

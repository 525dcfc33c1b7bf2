"""Property tests over ``xarray.testing.strategies`` against the numpy loop
reference: random dims, sizes, dtypes, attrs, windows, boundaries and strides."""

from __future__ import annotations

import hypothesis.extra.numpy as npst
import hypothesis.strategies as st
import numpy as np
import xarray as xr
import xarray.testing.strategies as xrst
from hypothesis import assume, given

import xstencil  # noqa: F401 - registers the .stencil accessor
from tests.labelled.reference import ref_map

MODES = ["fill", "extend", "periodic", "reflect", "symmetric", "valid"]
DTYPES = st.sampled_from([np.dtype("float32"), np.dtype("float64")])


def box_sum(u):
    return u.sum()


def centre(u):
    return u()


def _finite(shape, dtype):
    return npst.arrays(dtype, shape, elements=st.floats(-100, 100, width=dtype.itemsize * 8))


VARIABLES = xrst.variables(
    dims=xrst.dimension_sizes(dim_names=st.sampled_from(["t", "y", "x"]), min_dims=1,
                              max_dims=3, min_side=2, max_side=5),
    dtype=DTYPES, array_strategy_fn=_finite, attrs=xrst.simple_attrs,
)


@st.composite
def cases(draw):
    var = draw(VARIABLES)
    da = xr.DataArray(var, name=draw(st.sampled_from([None, "a"])))
    da = da.assign_coords({d: np.arange(n) * 0.5 for d, n in da.sizes.items()
                           if draw(st.booleans())})
    dims = tuple(map(str, da.dims))
    wdims = draw(st.lists(st.sampled_from(dims), min_size=1, unique=True))
    window = {d: draw(st.sampled_from([1, 2, 3, (1, 0), (0, 1)])) for d in wdims}
    boundary = {d: draw(st.sampled_from(MODES)) for d in dims}
    stride = {d: draw(st.integers(1, 2)) for d in dims} if draw(st.booleans()) else None
    for d, w in window.items():
        k = w if isinstance(w, int) else sum(w) + 1
        assume(boundary[d] != "valid" or k <= da.sizes[d])
    return da, window, boundary, stride


def _tol(dtype):
    return {"rtol": 1e-4, "atol": 1e-3} if dtype == np.float32 else {"rtol": 1e-10,
                                                                     "atol": 1e-10}


@given(cases())
def test_map_matches_numpy_reference(case):
    da, window, boundary, stride = case
    out = da.stencil.map(box_sum, window=window, boundary=boundary, stride=stride)
    ref, pos = ref_map(da.values, tuple(map(str, da.dims)), box_sum, window=window,
                       boundary=boundary, stride=stride)
    assert out.dtype == da.dtype and out.dims == da.dims
    assert out.attrs == da.attrs and out.name == da.name
    np.testing.assert_allclose(out.values, ref, **_tol(da.dtype))
    for d in da.coords:
        np.testing.assert_array_equal(out[d].values, da[d].values[pos[str(d)]])


@given(cases())
def test_centre_kernel_is_identity_on_the_output_grid(case):
    da, window, boundary, stride = case
    out = da.stencil.map(centre, window=window, boundary=boundary, stride=stride)
    _, pos = ref_map(da.values, tuple(map(str, da.dims)), centre, window=window,
                     boundary=boundary, stride=stride)
    expect = da.values[np.ix_(*(pos[str(d)] for d in da.dims))]
    np.testing.assert_array_equal(out.values, expect)

"""Property tests (hypothesis) of map, mesh and scan against numpy and against
each other.

* random dims (``xarray.testing.strategies``), sizes, windows, a boundary
  mode per dim and strides, against a plain numpy reference (``np.pad`` +
  ``sliding_window_view``);
* periodic shift invariance: map then roll equals roll then map;
* ``valid`` equals ``fill`` trimmed;
* a mesh with one region covering everything equals map;
* a scan with ``save_every=k`` equals the full scan subsampled.

The profile is chosen in ``tests/conftest.py`` (``ci`` by default, ``dev``
for long local runs: ``HYPOTHESIS_PROFILE=dev``).
"""

from __future__ import annotations

from typing import Any

import hypothesis.strategies as st
import numpy as np
import pytest
import xarray as xr
import xarray.testing.strategies as xrst
from hypothesis import given, settings

import xstencil  # noqa: F401  (registers the accessor)

MODES = ("fill", "extend", "periodic", "reflect", "symmetric", "valid")
NP_MODE = {"fill": "constant", "extend": "edge", "periodic": "wrap", "reflect": "reflect",
           "symmetric": "symmetric"}

# dim names: plain, unicode and with spaces (all valid xarray dims)
dim_names = st.sampled_from(["x", "y", "time", "é", "lat lon", "Ω"])


@st.composite
def cases(draw: Any) -> dict[str, Any]:
    sizes = draw(xrst.dimension_sizes(dim_names=dim_names, min_dims=1, max_dims=3,
                                      min_side=1, max_side=6))
    dims = tuple(sizes)
    window, boundary, stride = {}, {}, {}
    for d in dims:
        n = sizes[d]
        mode = draw(st.sampled_from(MODES))
        k = draw(st.integers(1, 4))
        if mode == "valid":
            k = min(k, n)
        if mode == "reflect" and n < 2:
            mode = "symmetric"
        if draw(st.booleans()) or k > 1:
            window[d] = k
        boundary[d] = mode
        stride[d] = draw(st.integers(1, 3))
    seed = draw(st.integers(0, 2**16))
    return {"sizes": sizes, "dims": dims, "window": window, "boundary": boundary,
            "stride": stride, "seed": seed}


def _reference(a: np.ndarray, dims: tuple[str, ...], window: dict[str, int],
               boundary: dict[str, str], stride: dict[str, int], w: np.ndarray,
               fill: float) -> np.ndarray:
    """Weighted window sums by np.pad + sliding_window_view (a plain numpy loop)."""
    for ax, d in enumerate(dims):
        k = window.get(d, 1)
        mode = boundary[d] if d in window else "fill"
        if mode == "valid":
            continue
        pads = [(0, 0)] * a.ndim
        pads[ax] = ((k - 1) // 2, k // 2)
        kw = {"constant_values": fill} if mode == "fill" else {}
        a = np.pad(a, pads, mode=NP_MODE[mode], **kw)
    shape = tuple(window.get(d, 1) for d in dims)
    win = np.lib.stride_tricks.sliding_window_view(a, shape)
    out = (win * w.reshape(shape)).sum(axis=tuple(range(a.ndim, 2 * a.ndim)))
    return out[tuple(slice(None, None, stride[d]) for d in dims)]


@given(cases())
def test_map_matches_numpy_reference(case: dict[str, Any]) -> None:
    rng = np.random.default_rng(case["seed"])
    dims, sizes, window = case["dims"], case["sizes"], case["window"]
    a = rng.standard_normal(tuple(sizes[d] for d in dims))
    da = xr.DataArray(a, dims=dims, coords={d: np.arange(sizes[d]) * 0.5 for d in dims})
    wdims = tuple(d for d in dims if d in window)
    w = rng.standard_normal(tuple(window[d] for d in wdims))
    out = da.stencil.map(lambda u: (u * w).sum() if wdims else u() * w.sum(),
                         window=window or None, boundary=case["boundary"],
                         stride=case["stride"], fill_value=0.25)
    ref = _reference(a, dims, window, case["boundary"], case["stride"], w, 0.25)
    assert out.dims == dims
    np.testing.assert_allclose(out.values, ref, rtol=1e-12, atol=1e-12)
    # coords are the input's at the output positions
    for d in dims:
        k = window.get(d, 1)
        first = (k - 1) // 2 if case["boundary"][d] == "valid" and d in window else 0
        np.testing.assert_array_equal(out[d].values,
                                      da[d].values[first::case["stride"][d]][:out.sizes[d]])


def spread(u: Any) -> Any:
    return u.max() - u.min()


def _nonlinear(u: Any) -> Any:
    return u(x=1) * u(y=-1) - u() ** 2 + 0.5 * u(x=-2, y=1)


@given(st.integers(3, 7), st.integers(3, 7), st.integers(-9, 9), st.integers(-9, 9),
       st.integers(0, 2**16))
def test_periodic_shift_invariance(ny: int, nx: int, sy: int, sx: int, seed: int) -> None:
    a = np.random.default_rng(seed).standard_normal((ny, nx))
    da = xr.DataArray(a, dims=("y", "x"))
    shifts = {"y": sy, "x": sx}
    lhs = da.stencil.map(_nonlinear, boundary="periodic").roll(shifts, roll_coords=False)
    rhs = da.roll(shifts, roll_coords=False).stencil.map(_nonlinear, boundary="periodic")
    np.testing.assert_allclose(lhs.values, rhs.values, rtol=1e-13, atol=1e-13)


@given(st.integers(4, 8), st.integers(4, 8), st.integers(1, 4), st.integers(1, 3),
       st.integers(1, 2), st.integers(0, 2**16))
def test_valid_equals_fill_trimmed(ny: int, nx: int, kx: int, ky: int, step: int,
                                   seed: int) -> None:
    a = np.random.default_rng(seed).standard_normal((ny, nx))
    da = xr.DataArray(a, dims=("y", "x"), coords={"x": np.arange(nx) * 0.1, "y": -np.arange(ny)},
                      attrs={"units": "m"}, name="h")
    window = {"y": ky, "x": kx}
    valid = da.stencil.map(spread, window=window, boundary="valid", stride={"x": step})
    trim = {"y": slice((ky - 1) // 2, ny - ky // 2),
            "x": slice((kx - 1) // 2, nx - kx // 2)}
    full = da.stencil.map(spread, window=window, boundary="fill")
    assert full.sizes == da.sizes
    xr.testing.assert_allclose(valid, full.isel(trim).isel(x=slice(None, None, step)))
    assert valid.attrs == da.attrs and valid.name == da.name


# every example builds a new mesh, which compiles: a third of the profile's examples
@settings(max_examples=max(5, settings.default.max_examples // 3))
@given(st.sampled_from(MODES[:-1]), st.integers(1, 3), st.integers(0, 2**16),
       st.booleans())
def test_mesh_with_one_full_region_equals_map(mode: str, step: int, seed: int,
                                              by_slice: bool) -> None:
    a = np.random.default_rng(seed).standard_normal((5, 6))
    da = xr.DataArray(a, dims=("y", "x"), coords={"x": np.linspace(0, 1, 6)})
    m = da.stencil.mesh(boundary=mode, stride={"y": step}, fill_value=-1.0)
    if by_slice:
        m[{"x": slice(None)}] = _nonlinear
    else:
        m[...] = _nonlinear
    xr.testing.assert_allclose(
        m.map(), da.stencil.map(_nonlinear, boundary=mode, stride={"y": step}, fill_value=-1.0))


# -- scan ---------------------------------------------------------------------------------

needs_scan = pytest.mark.skipif(not hasattr(xstencil, "scan"),
                                reason="xstencil.scan has not landed yet")


def heat(u: Any) -> Any:
    return u(time=-1) + 0.2 * (u(time=-1, x=1) - 2 * u(time=-1) + u(time=-1, x=-1))


@needs_scan
@given(st.integers(1, 4), st.integers(1, 4), st.integers(0, 2**16))
def test_scan_save_every_equals_subsampled(k: int, m: int, seed: int) -> None:
    steps = k * m  # save_every must divide steps
    a = np.random.default_rng(seed).standard_normal(6)
    u0 = xr.DataArray(a, dims="x")
    full = u0.stencil.scan(heat, dim="time", steps=steps, boundary={"x": "periodic"})
    some = u0.stencil.scan(heat, dim="time", steps=steps, save_every=k,
                           boundary={"x": "periodic"})
    idx = [i for i in range(full.sizes["time"]) if full["time"].values[i] in some["time"].values]
    xr.testing.assert_allclose(some, full.isel(time=idx))
    assert some.sizes["time"] == len(idx) >= 1

"""Findings from user ports, session 28.

* A periodic coordinate that is not monotonic (a rolled longitude: 180 ..
  357.5, 0 .. 177.5) was accepted with ``period=`` and read wrong by a
  period at its internal jump and at the seam; it is refused now, on every
  path.  Descending labels with a positive ``period=`` were wrong at the seam.
* A numpy mask as a mesh key put its whole repr in the error.
* A dask-backed map or scan read the arrays its kernel closes over when the
  graph was computed, not when it was built, and the compiled block cached
  under the token of the old values served the new ones.  A kernel that
  needs one of them concrete (``float(w[0])``) ran on dask and failed in
  memory; it fails on both now.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr

import xstencil  # noqa: F401 - the .stencil accessor
from xstencil import KernelError, XStencilError

LON = np.arange(0, 360, 2.5)
SHIFT = 72  # 180 degrees


def _field() -> xr.DataArray:
    rng = np.random.default_rng(28)
    return xr.DataArray(rng.random((5, LON.size)), dims=("lat", "lon"),
                        coords={"lat": np.linspace(-60, 60, 5), "lon": LON})


def _ddlon(u):
    x = u.coord("lon")
    return (u(lon=1) - u(lon=-1)) / (x(lon=1) - x(lon=-1))


def _reference(a: np.ndarray) -> np.ndarray:
    """The centred derivative along lon of sorted data, periodic, in numpy."""
    return (np.roll(a, -1, -1) - np.roll(a, 1, -1)) / (2 * 2.5)


def _periodic_dims(obj):
    return {"lon": "periodic", "lat": "fill"}


# -- 1. periodic coordinates ----------------------------------------------------------

@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("period", [None, {"lon": 360.0}])
def test_rolled_longitude_is_refused(chunked, period):
    rolled = _field().roll(lon=SHIFT, roll_coords=True)
    if chunked:
        rolled = rolled.chunk(lon=36)
    with pytest.raises(XStencilError, match=r"da\.stencil\.map\(\.\.\.\): boundary 'periodic' "
                       r"on 'lon', whose coordinate is not monotonic: it falls from 357\.5 to "
                       r"0 between positions 71 and 72.*sortby\('lon'\)"):
        rolled.stencil.map(_ddlon, boundary=_periodic_dims(rolled), period=period)


@pytest.mark.parametrize("chunked", [False, True])
def test_rolled_longitude_scan_and_mesh_are_refused(chunked):
    U = _field().rename(lat="time").assign_coords(time=np.arange(5.0))
    rolled = U.roll(lon=SHIFT, roll_coords=True)
    if chunked:
        rolled = rolled.chunk(lon=36)

    def step(u):
        x = u.coord("lon")
        return u(time=-1) + (u(time=-1, lon=1) - u(time=-1, lon=-1)) / (x(lon=1) - x(lon=-1))

    with pytest.raises(XStencilError, match=r"scan\(\.\.\.\): .* not monotonic.*sortby"):
        rolled.stencil.scan(step, dim="time", boundary={"lon": "periodic"},
                            period={"lon": 360.0})
    m = rolled.stencil.mesh(boundary={"lon": "periodic"}, period={"lon": 360.0})
    m[...] = _ddlon
    with pytest.raises(XStencilError, match=r"not monotonic.*sortby"):
        m.map()


def test_sorted_result_rolled_back_matches_numpy():
    da = _field()
    rolled = da.roll(lon=SHIFT, roll_coords=True)
    out = rolled.sortby("lon").stencil.map(_ddlon, boundary=_periodic_dims(da))
    np.testing.assert_allclose(out.values, _reference(da.values), rtol=1e-12)
    back = out.roll(lon=SHIFT, roll_coords=True)
    np.testing.assert_allclose(back.values, np.roll(_reference(da.values), SHIFT, -1),
                               rtol=1e-12)
    np.testing.assert_array_equal(back.lon.values, rolled.lon.values)


@pytest.mark.parametrize("chunked", [False, True])
def test_unwrapped_labels_give_the_sorted_result_rolled(chunked):
    """The error's other remedy: labels unwrapped by the period (180 .. 537.5)."""
    da = _field()
    rolled = da.roll(lon=SHIFT, roll_coords=True)
    unwrapped = rolled.assign_coords(lon=np.unwrap(rolled["lon"], period=360))
    if chunked:
        unwrapped = unwrapped.chunk(lon=36)
    out = unwrapped.stencil.map(_ddlon, boundary=_periodic_dims(da), period={"lon": 360.0})
    np.testing.assert_allclose(np.asarray(out), np.roll(_reference(da.values), SHIFT, -1),
                               rtol=1e-12)


@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("period", [None, {"lon": 360.0}])
def test_descending_longitude_matches_numpy(chunked, period):
    desc = _field().isel(lon=slice(None, None, -1))  # 357.5 .. 0
    obj = desc.chunk(lon=36) if chunked else desc
    out = obj.stencil.map(_ddlon, boundary=_periodic_dims(desc), period=period)
    # d/dlon of the reversed data: the neighbours swap and the spacing is -2.5
    ref = (np.roll(desc.values, -1, -1) - np.roll(desc.values, 1, -1)) / (2 * -2.5)
    np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-12)


@pytest.mark.parametrize("chunked", [False, True])
def test_descending_longitude_scan_with_period(chunked):
    U = _field().rename(lat="time").assign_coords(time=np.arange(5.0))

    def step(u):
        x = u.coord("lon")
        return u(time=-1) + 0.1 * (u(time=-1, lon=1) - u(time=-1, lon=-1)) / (
            x(lon=1) - x(lon=-1))

    ref = U.stencil.scan(step, dim="time", boundary={"lon": "periodic"})
    desc = U.isel(lon=slice(None, None, -1))
    obj = desc.chunk(lon=72) if chunked else desc
    out = obj.stencil.scan(step, dim="time", boundary={"lon": "periodic"},
                           period={"lon": 360.0})
    np.testing.assert_allclose(np.asarray(out), ref.values[:, ::-1], rtol=1e-12)


def test_period_shorter_than_the_span_is_refused():
    with pytest.raises(XStencilError, match=r"period=\{'lon': 180\.0\} is shorter than the "
                       r"span of coordinate 'lon' \(0 to 357\.5\)"):
        _field().stencil.map(_ddlon, boundary=_periodic_dims(None), period={"lon": 180.0})


def test_rolled_longitude_not_read_is_fine():
    """Only a kernel reading the coordinate needs monotonic labels."""
    da = _field()
    rolled = da.roll(lon=SHIFT, roll_coords=True)
    out = rolled.stencil.map(lambda u: u(lon=1) - u(lon=-1), boundary=_periodic_dims(da),
                             period={"lon": 360.0})
    ref = np.roll(da.values, -1, -1) - np.roll(da.values, 1, -1)
    np.testing.assert_allclose(out.values, np.roll(ref, SHIFT, -1), rtol=1e-12)


GRID = {"X": {"center": "x_c", "left": "x_g"}}


def _grid_ds() -> xr.Dataset:
    x_g = np.arange(8) * 45.0
    rng = np.random.default_rng(3)
    return xr.Dataset({"h": ("x_c", rng.random(8)), "u": ("x_g", rng.random(8))},
                      coords={"x_c": x_g + 22.5, "x_g": x_g})


def _grid_slope(s):
    x = s.h.coord("X")
    return (s.h(X=0.5) - s.h(X=-0.5)) / (x(X=0.5) - x(X=-0.5))


def test_grid_rolled_coordinate_read_is_refused():
    rolled = _grid_ds().roll(x_c=3, x_g=3, roll_coords=True)
    opts = dict(grid=GRID, at={"X": "left"}, boundary={"X": "periodic"})
    with pytest.raises(XStencilError, match=r"centre coordinate is not monotonic.*sortby"):
        rolled.stencil.map(_grid_slope, period={"X": 360.0}, **opts)
    # a kernel that reads no coordinate is unaffected
    out = rolled.stencil.map(lambda s: s.h(X=0.5) - s.h(X=-0.5), **opts)
    ref = _grid_ds().stencil.map(lambda s: s.h(X=0.5) - s.h(X=-0.5), **opts)
    np.testing.assert_allclose(out.values, np.roll(ref.values, 3), rtol=1e-12)


def test_grid_descending_coordinate_with_period():
    ds = _grid_ds()
    opts = dict(grid=GRID, at={"X": "left"}, boundary={"X": "periodic"})
    desc = ds.isel(x_c=slice(None, None, -1), x_g=slice(None, None, -1))
    inferred = desc.stencil.map(_grid_slope, **opts)
    given = desc.stencil.map(_grid_slope, period={"X": 360.0}, **opts)
    np.testing.assert_allclose(given.values, inferred.values, rtol=1e-12)
    h = desc.h.values  # left of x_g[i] (descending) is x_c[i]; its other neighbour x_c[i-1]
    ref = (np.roll(h, 1) - h) / 45.0
    np.testing.assert_allclose(given.values, ref, rtol=1e-12)


# -- 2. a numpy mask as a mesh key --------------------------------------------------

def test_numpy_mask_key_names_type_and_shape():
    da = xr.DataArray(np.random.default_rng(0).random((6, 7)), dims=("y", "x"))
    m = da.stencil.mesh()
    msg = (r"da\.stencil\.mesh\(\.\.\.\): m\[key\] = \.\.\.: key is a numpy array of shape "
           r"\(6, 7\) and dtype bool; masks select by dim name, so wrap it in a DataArray with "
           r"dims \('y', 'x'\): m\[xr\.DataArray\(mask, dims=\('y', 'x'\)\)\] = \.\.\.$")
    with pytest.raises(XStencilError, match=msg) as info:
        m[da.values > 0.5] = lambda u: 0.0
    assert "\n" not in str(info.value) and "True" not in str(info.value)
    with pytest.raises(XStencilError, match=r"m\.loc\[key\]: key is a numpy array of shape "
                       r"\(6, 7\) and dtype bool; .*wrap it in a DataArray"):
        m.loc[da.values > 0.5] = lambda u: 0.0
    with pytest.raises(XStencilError, match=r"m\[key\] = \.\.\.: key is a numpy array of "
                       r"shape \(3,\) and dtype int64; select with '\.\.\.'"):
        m[np.arange(3, dtype=np.int64)] = lambda u: 0.0
    with pytest.raises(XStencilError, match=r"m\[3\] = \.\.\.: select with '\.\.\.'"):
        m[3] = lambda u: 0.0
    # the fix the message gives works
    m[xr.DataArray(da.values > 0.5, dims=("y", "x"))] = lambda u: 0.0
    np.testing.assert_array_equal(m.map().values, np.where(da.values > 0.5, 0.0, da.values))


# -- 4. closed-over arrays on dask ---------------------------------------------------

def _weights_kernel(w):
    return lambda u: w[0] * u(x=-1) + w[1] * u() + w[2] * u(x=1)


def _np_ref(a, w):
    p = np.concatenate([a[:1], a, a[-1:]])  # extend
    return w[0] * p[:-2] + w[1] * p[1:-1] + w[2] * p[2:]


def test_dask_map_reads_closed_over_arrays_when_called():
    W = np.array([1.0, -2.0, 1.0])
    k = _weights_kernel(W)
    da = xr.DataArray(np.arange(8.0) ** 2, dims="x")
    old = _np_ref(da.values, W.copy())
    lazy = da.chunk(4).stencil.map(k, boundary="extend")
    W[:] = [1.0, 1.0, 1.0]
    np.testing.assert_allclose(lazy.values, old)  # the call's W, not the compute's
    np.testing.assert_allclose(da.chunk(4).stencil.map(k, boundary="extend").values,
                               _np_ref(da.values, W))
    W[:] = [1.0, -2.0, 1.0]  # the old values again: no compiled block served stale
    np.testing.assert_allclose(da.chunk(4).stencil.map(k, boundary="extend").values, old)
    np.testing.assert_allclose(da.stencil.map(k, boundary="extend").values, old)


def test_dask_scan_reads_closed_over_arrays_when_called():
    W = np.array([0.25, 0.5, 0.25])

    def step(u):
        return W[0] * u(t=-1, x=-1) + W[1] * u(t=-1) + W[2] * u(t=-1, x=1)

    U = xr.DataArray(np.random.default_rng(1).random((5, 8)), dims=("t", "x"))
    ref = U.stencil.scan(step, dim="t", boundary="extend").values
    lazy = U.chunk(x=4).stencil.scan(step, dim="t", boundary="extend")
    W[:] = [0.0, 1.0, 0.0]
    np.testing.assert_allclose(lazy.values, ref)


@pytest.mark.parametrize("chunked", [False, True])
def test_concrete_use_of_a_closed_over_array_fails_alike(chunked):
    W = np.array([1.0, -2.0, 1.0])

    def k(u):
        return sum(float(W[j + 1]) * u(x=j) for j in (-1, 0, 1))

    da = xr.DataArray(np.arange(8.0) ** 2, dims="x")
    obj = da.chunk(4) if chunked else da
    with pytest.raises(KernelError, match=r"da\.stencil\.map\(\.\.\.\): kernel 'k' used a "
                       r"traced value .*rr = rr\.tolist\(\)"):
        obj.stencil.map(k, boundary="extend")
    w = W.tolist()  # the remedy the message gives, on both
    out = obj.stencil.map(lambda u: sum(w[j + 1] * u(x=j) for j in (-1, 0, 1)),
                          boundary="extend")
    np.testing.assert_allclose(np.asarray(out), _np_ref(da.values, W))


def test_float64_dtype_infers_the_window_under_x64_too():
    """``dtype="float64"`` runs the kernel under x64; the trace that infers its
    window did not, so a kernel casting its reads to float64 (the float32
    cancellation recipe of docs/dtypes.rst) warned that float64 is not
    available (an error under this suite's filterwarnings), although the map
    computed in float64."""
    z = xr.DataArray((1e4 + np.arange(12.0) ** 2).astype(np.float32), dims="x")

    def kernel(u):
        return u(x=1).astype(jnp.float64) - 2 * u().astype(jnp.float64) \
            + u(x=-1).astype(jnp.float64)

    out = z.stencil.map(kernel, boundary="extend", dtype="float64")
    zz = np.pad(z.values.astype(np.float64), 1, mode="edge")
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out.values, zz[2:] - 2 * zz[1:-1] + zz[:-2])
    m = z.stencil.mesh(boundary="extend")
    m[...] = kernel
    np.testing.assert_array_equal(m.map(dtype="float64").values, out.values)

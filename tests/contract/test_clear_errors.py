"""Errors that tell the user what to do (issue 11, "Errors that must tell the
user what to do"; issue 12, section 3), and the cases that now work instead of
crashing: scipy/numpy boundary names, window-array kernels that broadcast
size-1 dims, and large dense windows."""

from __future__ import annotations

import math

import dask.array as dsa
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.ndimage as ndi
import xarray as xr
from numpy.lib.stride_tricks import sliding_window_view

import xstencil
from xstencil import KernelError, XStencilError

RNG = np.random.default_rng(0)
A = RNG.random((7, 9)).astype(np.float32)
DA = xr.DataArray(A, dims=("y", "x"), coords={"y": np.arange(7.0), "x": np.arange(9.0)})

TRACED = r"kernels are traced by JAX.*jnp\.where\(cond, a, b\) for branches"


# -- kernels are traced ---------------------------------------------------------------

@pytest.mark.parametrize("kernel", [
    lambda u: np.sin(u()) + u(x=1),
    lambda u: np.where(u() > 0.5, u(x=1), u(x=-1)),
    lambda u: float(u()) + u(x=1),
    lambda u: math.sin(u()) + u(x=1),
    lambda u: u(x=1) if u() > 5 else u(x=-1),
], ids=["np.sin", "np.where", "float", "math.sin", "if"])
def test_numpy_math_or_if_on_traced_values(kernel):
    with pytest.raises(KernelError, match=r"da\.stencil\.map\(\.\.\.\): kernel '<lambda>' "
                                          r"used a traced value .*" + TRACED):
        DA.stencil.map(kernel, boundary="extend")


def test_traced_error_with_an_explicit_window_and_in_a_scan():
    # an explicit window skips inference: the error comes from the lowering trace
    with pytest.raises(KernelError, match=TRACED):
        DA.stencil.map(lambda u: np.sin(u()), window={"x": 3}, boundary="extend")
    with pytest.raises(KernelError, match=r"da\.stencil\.scan\(\.\.\.\).*" + TRACED):
        DA.stencil.scan(lambda u: u(y=-1) if u(y=-1) > 0 else u(), dim="y")


def test_traced_error_in_the_array_api():
    with pytest.raises(KernelError, match=r"xstencil\.kmap: kernel '<lambda>' failed on a "
                                          r"window of shape \(3,\).*" + TRACED):
        xstencil.kmap(kernel_size=(3,), relative=True)(lambda x: x[1] if x[0] > 0 else x[-1])(
            A[0])


def test_the_advised_rewrite_works():
    out = DA.stencil.map(lambda u: jnp.where(u() > 0.5, u(x=1), u(x=-1)), boundary="extend")
    pad = np.pad(A, ((0, 0), (1, 1)), mode="edge")
    np.testing.assert_allclose(out.values, np.where(A > 0.5, pad[:, 2:], pad[:, :-2]))


# -- coordinates ----------------------------------------------------------------------

def test_coord_of_a_dim_outside_the_window_suggests_the_window():
    with pytest.raises(XStencilError, match=r"u\.coord\('y'\): no coordinate 'y' is "
                                            r"available.*put it in the window, e\.g\. "
                                            r"window=\{'y': 1, \.\.\.\}"):
        DA.stencil.map(lambda u: u(x=1) * u.coord("y")(), boundary="extend")
    # and the advice works: size 1 along y reads the centre's coordinate
    out = DA.stencil.map(lambda u: u() * 0 + u.coord("y")(), window={"y": 1, "x": 3},
                         boundary="extend")
    np.testing.assert_array_equal(out.values, np.broadcast_to(DA.y.values[:, None], A.shape))


def test_coord_2d_says_how_to_pass_it():
    lat = RNG.random(A.shape).astype(np.float32)
    da = DA.assign_coords(lat=(("y", "x"), lat))
    with pytest.raises(XStencilError, match=r"u\.coord\('lat'\).*curvilinear.*"
                                            r"reset_coords\('lat'\).*s\['lat'\]\(\)"):
        da.stencil.map(lambda u: u(x=1) * u.coord("lat")(), boundary="extend")
    ds = da.to_dataset(name="u").reset_coords("lat")
    out = ds.stencil.map(lambda s: s["u"](x=1) * s["lat"](), boundary="extend")
    ref = np.pad(A, ((0, 0), (0, 1)), mode="edge")[:, 1:] * lat
    np.testing.assert_allclose(out.values, ref, rtol=1e-6)


# -- extra arguments ------------------------------------------------------------------

@pytest.mark.parametrize("how", ["kwarg", "positional"])
def test_dataarray_as_extra_argument(how):
    w = DA * 2
    if how == "kwarg":
        call = lambda: DA.stencil.map(lambda u, w: u(x=1) * w, w=w)  # noqa: E731
        where = r"w="
    else:
        call = lambda: xstencil.map(DA, lambda u, w: u(x=1) * w, w)  # noqa: E731
        where = r"args\[0\]"
    with pytest.raises(XStencilError, match=rf"extra kernel argument {where} is an xarray "
                                            r"DataArray with sizes \{'y': 7, 'x': 9\}.*"
                                            r"xr\.Dataset.*\.values"):
        call()


def test_plain_array_extra_argument_still_works():
    w = np.arange(3.0, dtype=np.float32)
    out = DA.stencil.map(lambda u, w: (u * w).sum(), w, window={"x": 3}, boundary="extend")
    pad = np.pad(A, ((0, 0), (1, 1)), mode="edge")
    np.testing.assert_allclose(out.values, sliding_window_view(pad, 3, axis=1) @ w, rtol=1e-6)


# -- what a kernel returns ------------------------------------------------------------

def _no_return(u):
    u(x=1) - u(x=-1)  # noqa: B018 - the bug under test


@pytest.mark.parametrize(("kernel", "msg"), [
    (_no_return, r"kernel '_no_return' returned None; .*missing `return`"),
    (lambda u: "abc", r"returned the string 'abc'; a kernel must return a number"),
    (lambda u: (u(x=i) for i in range(2)), r"returned a generator; .*jnp\.stack"),
    (lambda u: map(float, [1]), r"returned a map; "),
])
def test_kernel_returning_a_non_value(kernel, msg):
    with pytest.raises(XStencilError, match=r"da\.stencil\.map\(\.\.\.\): .*" + msg):
        DA.stencil.map(kernel, boundary="extend")
    with pytest.raises(XStencilError, match=msg):  # explicit window: the lowering path
        DA.stencil.map(kernel, window={"x": 3}, boundary="extend")


def test_dataset_kernel_returning_a_nested_dict_or_none():
    ds = xr.Dataset({"u": DA, "h": DA})
    with pytest.raises(XStencilError, match=r"ds\.stencil\.map\(\.\.\.\): kernel '<lambda>' "
                                            r"returned a nested dict \(key 'u' holds a dict\)"):
        ds.stencil.map(lambda s: {"u": {"v": s["u"](x=1)}}, boundary="extend")
    with pytest.raises(XStencilError, match=r"returned None for 'h'"):
        ds.stencil.map(lambda s: {"u": s["u"](x=1), "h": None}, boundary="extend")


def test_positional_dim_name():
    with pytest.raises(XStencilError, match=r"u\('x'\): reads take offsets as keywords by dim "
                                            r"name.*u\(x=1\) is the next cell along 'x'"):
        DA.stencil.map(lambda u: u("x"))
    with pytest.raises(XStencilError, match=r"u\(1\): reads take offsets as keywords"):
        DA.stencil.map(lambda u: u(1), window={"x": 3}, boundary="extend")


def test_step_returning_the_wrong_shape():
    u0 = DA.isel(y=0, drop=True)
    with pytest.raises(XStencilError, match=r"da\.stencil\.scan\(\.\.\.\): step= returned "
                                            r"shape \(8,\) \(sizes \{'x': 8\}\) for the state, "
                                            r"which has sizes \{'x': 9\}"):
        u0.stencil.scan(step=lambda s: s.isel(x=slice(1, None)), dim="time", steps=2, dt=1.0)
    ds = xr.Dataset({"a": u0, "b": u0})
    with pytest.raises(XStencilError, match=r"step= returned shape \(7,\).* for 'a'"):
        ds.stencil.scan(step=lambda s: {"a": s["a"].isel(x=slice(2, None))}, dim="time",
                        steps=2, dt=1.0)
    # a right-shaped step still runs: two doublings
    out = u0.stencil.scan(step=lambda s: s * 2, dim="time", steps=2, dt=1.0)
    np.testing.assert_allclose(out.values[-1], 4 * u0.values)


# -- boundary names from scipy.ndimage and numpy --------------------------------------

WEIGHTS = np.array([[0, 0, 0], [1, 0, 2], [0, 3, 0]], dtype=np.float32)


def _weighted(u):
    return u(x=-1) + 2 * u(x=1) + 3 * u(y=1)


@pytest.mark.parametrize(("alias", "scipy_mode"), [
    ("wrap", "wrap"), ("grid-wrap", "wrap"), ("nearest", "nearest"), ("edge", "nearest"),
    ("mirror", "mirror"), ("grid-mirror", "reflect"), ("symmetric", "reflect"),
])
def test_boundary_aliases_match_scipy(alias, scipy_mode):
    ref = ndi.correlate(A, WEIGHTS, mode=scipy_mode)
    np.testing.assert_allclose(DA.stencil.map(_weighted, boundary=alias).values, ref,
                               rtol=1e-6)
    per_dim = DA.stencil.map(_weighted, boundary={"y": alias, "x": alias})
    np.testing.assert_allclose(per_dim.values, ref, rtol=1e-6)


def test_constant_is_fill():
    ref = ndi.correlate(A, WEIGHTS, mode="constant", cval=-1.0)
    out = DA.stencil.map(_weighted, boundary="constant", fill_value=-1.0)
    np.testing.assert_allclose(out.values, ref, rtol=1e-6)


def test_aliases_in_scans_and_the_array_api():
    u0 = DA.isel(y=0, drop=True)
    got = u0.expand_dims(t=3).stencil.scan(lambda u: u(t=-1, x=1), dim="t",
                                           boundary={"x": "wrap"})
    np.testing.assert_array_equal(got.values[2], np.roll(u0.values, -2))
    got = xstencil.kmap(kernel_size=(3,), padding="same", boundary="edge")(lambda w: w[2])(A[0])
    np.testing.assert_array_equal(np.asarray(got), np.append(A[0, 1:], A[0, -1]))


def test_unknown_boundary_explains_scipy_reflect():
    msg = r"boundary='clamp' is not a boundary mode.*scipy's 'reflect' .* is xstencil's " \
          r"'symmetric'"
    with pytest.raises(XStencilError, match=r"da\.stencil\.map\(\.\.\.\): .*" + msg):
        DA.stencil.map(_weighted, boundary="clamp")
    with pytest.raises(XStencilError, match=r"'clamp' is not a boundary mode for dim 'x'.*"
                                            r"'wrap' \(periodic\)"):
        DA.stencil.map(_weighted, boundary={"x": "clamp"})
    with pytest.raises(XStencilError, match=r"xstencil\.kmap: boundary='clamp'.*scipy's"):
        xstencil.kmap(kernel_size=(3,), boundary="clamp")(lambda w: w[0])(A[0])


# -- window-array kernels that broadcast size-1 dims ----------------------------------

def _windows(k=3):
    pad = np.pad(A, k // 2, mode="edge").astype(np.float64)
    return sliding_window_view(pad, (k, k))


def _softmax_centre(w):
    # jax.nn.softmax normalises along the last axis by default
    e = np.exp(w - w.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True))[..., 1, 1]


@pytest.mark.parametrize(("kernel", "reference"), [
    (lambda u: jnp.var(u.array), lambda w: w.var(axis=(-2, -1))),
    (lambda u: jnp.std(u.array), lambda w: w.std(axis=(-2, -1))),
    (lambda u: jax.nn.softmax(u.array)[1, 1], _softmax_centre),
    (lambda u: jax.nn.softmax(u.array, axis=(0, 1))[1, 1],
     lambda w: np.exp(w[..., 1, 1]) / np.exp(w).sum(axis=(-2, -1))),
    (lambda u: (u.array / u.array.sum(keepdims=True))[1, 1],
     lambda w: w[..., 1, 1] / w.sum(axis=(-2, -1))),
    (lambda u: (u.array - u.array.mean(axis=0, keepdims=True)).max(),
     lambda w: (w - w.mean(axis=-2, keepdims=True)).max(axis=(-2, -1))),
], ids=["var", "std", "softmax", "softmax-2d", "keepdims", "centred-max"])
def test_window_array_kernels_that_broadcast(kernel, reference):
    out = DA.stencil.map(kernel, window={"y": 3, "x": 3}, boundary="extend")
    np.testing.assert_allclose(out.values, reference(_windows()), rtol=2e-5, atol=1e-6)


def test_broadcasting_kernel_in_the_array_api():
    out = xstencil.kmap(kernel_size=(3, 3), padding="same", boundary="extend")(
        lambda w: jnp.var(w))(A)
    np.testing.assert_allclose(np.asarray(out), _windows().var(axis=(-2, -1)), rtol=2e-5,
                               atol=1e-6)


# -- dask chunks of unknown size ------------------------------------------------------

def test_dask_chunks_of_unknown_size():
    x = dsa.from_array(A, chunks=(3, 3))
    x = x[x[:, 0] > -1]  # boolean indexing: the row chunks become NaN
    da = xr.DataArray(x, dims=("y", "x"))
    assert any(math.isnan(c) for c in da.chunks[0])
    with pytest.raises(XStencilError, match=r"da\.stencil\.map\(\.\.\.\): the data is a dask "
                                            r"array with chunks of unknown size along 'y' "
                                            r"\(chunks=\(nan, nan, nan\).*"
                                            r"compute_chunk_sizes\(\)"):
        da.stencil.map(lambda u: u(x=1) + u(y=1), boundary="extend")
    ds = da.chunk({"x": -1}).to_dataset(name="a")
    with pytest.raises(XStencilError, match=r"ds\.stencil\.scan\(\.\.\.\): variable 'a' is a "
                                            r"dask array with chunks of unknown size along 'y'"):
        ds.stencil.scan(lambda s: {"a": s["a"](x=-1, y=0)}, dim="x", boundary="extend")
    fixed = da.copy(data=x.compute_chunk_sizes())
    out = fixed.stencil.map(lambda u: u(x=1) + u(y=1), boundary="extend").compute()
    pad = np.pad(A, ((0, 1), (0, 1)), mode="edge")
    np.testing.assert_allclose(out.values, pad[:-1, 1:] + pad[1:, :-1], rtol=1e-6)


# -- large dense windows --------------------------------------------------------------

@pytest.mark.parametrize(("k", "boundary", "mode"), [(17, "extend", "nearest"),
                                                     (31, "periodic", "wrap")])
def test_large_dense_window_is_gathered_and_right(k, boundary, mode):
    a = RNG.random((40, 45)).astype(np.float32)
    w = RNG.random((k, k)).astype(np.float32)
    wj = jnp.asarray(w)
    da = xr.DataArray(a, dims=("y", "x"))
    out = da.stencil.map(lambda u: (u * wj).sum(), window={"y": k, "x": k}, boundary=boundary)
    np.testing.assert_allclose(out.values, ndi.correlate(a, w, mode=mode), rtol=1e-4)
    mx = da.stencil.map(lambda u: u.max(), window={"y": k, "x": k}, boundary=boundary,
                        stride={"y": 3, "x": 2})
    np.testing.assert_array_equal(mx.values, ndi.maximum_filter(a, k, mode=mode)[::3, ::2])


def test_window_too_large_is_refused_with_alternatives():
    big = xr.DataArray(np.zeros((100, 100), np.float32), dims=("y", "x"))
    with pytest.raises(XStencilError, match=r"a 241x241 window \(58081 cells\) over "
                                            r"\(100, 100\) outputs .*GiB.*"
                                            r"scipy\.ndimage\.correlate.*fftconvolve"):
        big.stencil.map(lambda u: u.max(), window={"y": 241, "x": 241}, boundary="extend")

"""Ports of three public codes, checked against independent numpy/scipy references.

1. Gray-Scott reaction-diffusion (Dataset scan, periodic, 5- and 9-point Laplacian);
2. Conway's Game of Life on uint8/bool (scan, iterate to a still life, integer
   neighbour counts) against scipy.signal.convolve2d;
3. Landlab-style hillslope diffusion + uplift on a non-uniform raster with a
   fixed-value mask boundary (mesh scan), and a D8 steepest-descent slope.

Public API only. Grids are small so the whole file runs in a few seconds.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr
from scipy.signal import convolve2d

import xstencil

BACKENDS = ["auto", "xla", "loops"]

# ---------------------------------------------------------------- Gray-Scott
DU, DV, FEED, KILL, DT = 0.16, 0.08, 0.035, 0.065, 1.0


def _gs_start(n: int, dtype) -> xr.Dataset:
    rng = np.random.default_rng(0)
    u = np.ones((n, n), dtype)
    v = np.zeros((n, n), dtype)
    c, r = n // 2, n // 8
    u[c - r:c + r, c - r:c + r] = 0.5
    v[c - r:c + r, c - r:c + r] = 0.25
    u += (0.02 * rng.random((n, n))).astype(dtype)
    v += (0.02 * rng.random((n, n))).astype(dtype)
    return xr.Dataset({"u": (("y", "x"), u, {"units": "1"}), "v": (("y", "x"), v)},
                      coords={"y": np.arange(n) * 1.0, "x": np.arange(n) * 1.0},
                      attrs={"model": "gray-scott"})


def _gs_numpy(u, v, steps, save_every, w9=None):
    def lap(a):
        if w9 is None:
            return (np.roll(a, -1, 1) + np.roll(a, 1, 1) + np.roll(a, -1, 0)
                    + np.roll(a, 1, 0) - 4 * a)
        return sum(w9[i + 1, j + 1] * np.roll(np.roll(a, -i, 0), -j, 1)
                   for i in (-1, 0, 1) for j in (-1, 0, 1))
    saved = [(u, v)]
    for i in range(1, steps + 1):
        uvv = u * v * v
        u, v = (u + DT * (DU * lap(u) - uvv + FEED * (1 - u)),
                v + DT * (DV * lap(v) + uvv - (FEED + KILL) * v))
        if i % save_every == 0:
            saved.append((u, v))
    return saved


W9 = [[0.05, 0.2, 0.05], [0.2, -1.0, 0.2], [0.05, 0.2, 0.05]]  # a list: Python numbers


def _gs_kernel(nine: bool):
    def lap(w):
        if nine:
            return sum(W9[i + 1][j + 1] * w(time=-1, y=i, x=j)
                       for i in (-1, 0, 1) for j in (-1, 0, 1))
        return (w(time=-1, x=1) + w(time=-1, x=-1) + w(time=-1, y=1) + w(time=-1, y=-1)
                - 4 * w(time=-1))

    def gray_scott(s):
        u, v = s["u"](time=-1), s["v"](time=-1)
        uvv = u * v * v
        return {"u": u + DT * (DU * lap(s["u"]) - uvv + FEED * (1 - u)),
                "v": v + DT * (DV * lap(s["v"]) + uvv - (FEED + KILL) * v)}
    return gray_scott


@pytest.mark.parametrize(("backend", "nine"), [("xla", False), ("loops", False), ("loops", True)],
                         ids=["5pt-xla", "5pt-loops", "9pt-loops"])
def test_gray_scott_float64_matches_numpy_roll(x64, backend, nine):
    ds = _gs_start(40, np.float64)
    ref = _gs_numpy(ds.u.values, ds.v.values, 60, 20, np.array(W9) if nine else None)
    out = ds.stencil.scan(_gs_kernel(nine), dim="time", steps=60, dt=1.0, save_every=20,
                          boundary="periodic", backend=backend)
    assert out.u.dtype == np.float64 and out.v.dtype == np.float64
    np.testing.assert_array_equal(out.time.values, [0.0, 20.0, 40.0, 60.0])
    assert out.attrs == {"model": "gray-scott"} and out.u.attrs == {"units": "1"}
    assert out.u.dims == ("time", "y", "x")
    for i, (ru, rv) in enumerate(ref):
        np.testing.assert_allclose(np.asarray(out.u.isel(time=i)), ru, rtol=0, atol=1e-13)
        np.testing.assert_allclose(np.asarray(out.v.isel(time=i)), rv, rtol=0, atol=1e-13)
    # the pattern has actually developed (the test can fail on a no-op scan)
    assert np.abs(ref[-1][1] - ref[0][1]).max() > 1e-3


def test_gray_scott_dask_chunks_float32_last():
    pytest.importorskip("dask")
    ds = _gs_start(48, np.float32)
    ref = _gs_numpy(ds.u.values, ds.v.values, 40, 40)
    out = ds.chunk({"y": 16, "x": 24}).stencil.scan(
        _gs_kernel(False), dim="time", steps=40, save_every="last", boundary="periodic")
    assert type(out.u.data).__module__.startswith("dask")
    out = out.compute()
    assert out.u.dtype == np.float32 and out.v.dtype == np.float32
    assert out.u.dims == ("y", "x") and int(out.time) == 40
    np.testing.assert_allclose(out.u.values, ref[-1][0], atol=2e-6)
    np.testing.assert_allclose(out.v.values, ref[-1][1], atol=2e-6)


# ------------------------------------------------------------- Game of Life
_NB = np.ones((3, 3), int)
_NB[1, 1] = 0


def _life_numpy(b, periodic):
    n = convolve2d(b.astype(int), _NB, mode="same", boundary="wrap" if periodic else "fill")
    return ((n == 3) | ((b != 0) & (n == 2))).astype(b.dtype)


def _life_u8(u):
    nb = sum(u(gen=-1, y=i, x=j) for i in (-1, 0, 1) for j in (-1, 0, 1) if (i, j) != (0, 0))
    alive = u(gen=-1)
    return jnp.where((nb == 3) | ((alive == 1) & (nb == 2)), 1, 0).astype(alive.dtype)


def _life_bool(u):
    nb = sum(u(gen=-1, y=i, x=j).astype(jnp.int32)
             for i in (-1, 0, 1) for j in (-1, 0, 1) if (i, j) != (0, 0))
    return (nb == 3) | (u(gen=-1) & (nb == 2))


@pytest.mark.parametrize(("kind", "periodic", "backend"), [
    ("uint8", True, "xla"), ("uint8", False, "loops"), ("bool", True, "loops"),
    ("bool", False, "xla")])
def test_life_scan_matches_convolve2d(backend, periodic, kind):
    rng = np.random.default_rng(1)
    b8 = (rng.random((32, 40)) < 0.35).astype(np.uint8)
    da = xr.DataArray(b8, dims=("y", "x"), coords={"y": np.arange(32), "x": np.arange(40)},
                      name="alive", attrs={"rule": "B3/S23"})
    kernel = _life_u8
    fill = 0
    if kind == "bool":
        da, kernel, fill = (da == 1).rename("alive").assign_attrs(rule="B3/S23"), _life_bool, False
    kw = {"boundary": "periodic"} if periodic else {"boundary": "fill", "fill_value": fill}
    out = da.stencil.scan(kernel, dim="gen", steps=30, save_every=10, backend=backend, **kw)
    assert out.dtype == da.dtype
    assert out.name == "alive" and out.attrs == {"rule": "B3/S23"}
    assert list(out.gen.values) == [0, 10, 20, 30]
    ref = b8
    for g in range(31):
        if g % 10 == 0:
            np.testing.assert_array_equal(np.asarray(out.isel(gen=g // 10)).astype(np.uint8), ref)
        ref = _life_numpy(ref, periodic)


@pytest.mark.parametrize(("periodic", "backend"), [(True, "xla"), (False, "loops")],
                         ids=["periodic-xla", "fill-loops"])
def test_true_neighbour_count_is_integer(backend, periodic):
    b = np.random.default_rng(2).random((24, 30)) < 0.4
    da = xr.DataArray(b, dims=("y", "x"))
    kw = {"boundary": "periodic"} if periodic else {"boundary": "fill", "fill_value": False}
    ref = convolve2d(b.astype(int), _NB, mode="same", boundary="wrap" if periodic else "fill")
    by_window = da.stencil.map(lambda u: u.sum() - u().astype(jnp.int32),
                               window={"y": 3, "x": 3}, backend=backend, **kw)
    by_reads = da.stencil.map(
        lambda u: sum((u(y=i, x=j).astype(jnp.int32) for i in (-1, 0, 1) for j in (-1, 0, 1)
                       if (i, j) != (0, 0)), jnp.int32(0)), backend=backend, **kw)
    for cnt in (by_window, by_reads):
        assert np.issubdtype(cnt.dtype, np.integer), cnt.dtype
        np.testing.assert_array_equal(np.asarray(cnt), ref)
    assert ref.max() >= 5  # counts above 1: a bool result could not pass


def test_life_iterate_until_still_and_blinker_does_not_converge():
    # seed 0 on a 20x20 dead-bordered board settles to a still life after 34 generations
    b = (np.random.default_rng(0).random((20, 20)) < 0.3).astype(np.uint8)
    ref, gens = b, 0
    while True:
        nxt = _life_numpy(ref, periodic=False)
        gens += 1
        if np.array_equal(nxt, ref):
            break
        ref = nxt

    def rule(u):
        nb = sum(u(y=i, x=j) for i in (-1, 0, 1) for j in (-1, 0, 1) if (i, j) != (0, 0))
        return jnp.where((nb == 3) | ((u() == 1) & (nb == 2)), 1, 0).astype(u().dtype)

    da = xr.DataArray(b, dims=("y", "x"), name="alive")
    res = da.stencil.iterate(rule, tol=0, boundary="fill", fill_value=0, max_steps=500)
    assert res.converged and res.residual == 0
    assert res.iterations == gens == 34
    assert res.field.dtype == np.uint8 and res.field.name == "alive"
    np.testing.assert_array_equal(np.asarray(res.field), ref)

    res_b = (da == 1).stencil.iterate(_life_bool_now, tol=0, boundary="fill", fill_value=False,
                                      max_steps=500)
    assert res_b.field.dtype == bool and res_b.iterations == 34
    np.testing.assert_array_equal(np.asarray(res_b.field), ref.astype(bool))

    blinker = np.zeros((7, 7), np.uint8)
    blinker[3, 2:5] = 1
    with pytest.warns(xstencil.ConvergenceWarning):
        res = xr.DataArray(blinker, dims=("y", "x")).stencil.iterate(
            rule, tol=0, boundary="periodic", max_steps=11)
    assert not res.converged and res.residual == 4
    np.testing.assert_array_equal(np.asarray(res.field), blinker.T)  # odd generation


def _life_bool_now(u):
    nb = sum(u(y=i, x=j).astype(jnp.int32)
             for i in (-1, 0, 1) for j in (-1, 0, 1) if (i, j) != (0, 0))
    return (nb == 3) | (u() & (nb == 2))


# --------------------------------------------------- Landlab-style hillslope
D_HILL, UPLIFT, DT_HILL = 0.01, 1e-3, 10.0
_rng = np.random.default_rng(3)
HX = np.concatenate([[0.0], np.cumsum(_rng.uniform(0.8, 1.2, 31))])
HY = np.concatenate([[0.0], np.cumsum(_rng.uniform(0.9, 1.5, 23))])
Z0 = _rng.random((24, 32))
FIXED = np.zeros((24, 32), bool)
FIXED[0, :] = FIXED[-1, :] = FIXED[:, 0] = FIXED[:, -1] = True
FIXED[10, 12] = True  # an interior fixed node (a lake outlet)


def _hill_numpy(z, steps):
    dl, dr = HX[1:-1] - HX[:-2], HX[2:] - HX[1:-1]
    dd, du = (HY[1:-1] - HY[:-2])[:, None], (HY[2:] - HY[1:-1])[:, None]
    for _ in range(steps):
        zc = z[1:-1, 1:-1]
        lx = 2 / (dl + dr) * ((z[1:-1, 2:] - zc) / dr - (zc - z[1:-1, :-2]) / dl)
        ly = 2 / (dd + du) * ((z[2:, 1:-1] - zc) / du - (zc - z[:-2, 1:-1]) / dd)
        new = z.copy()
        new[1:-1, 1:-1] = zc + DT_HILL * (UPLIFT + D_HILL * (lx + ly))
        z = np.where(FIXED, z, new)
    return z


def _hill_step(u):
    cx, cy = u.coord("x"), u.coord("y")
    dl, dr = cx() - cx(x=-1), cx(x=1) - cx()
    dd, du = cy() - cy(y=-1), cy(y=1) - cy()
    zc = u(time=-1)
    lx = 2 / (dl + dr) * ((u(time=-1, x=1) - zc) / dr - (zc - u(time=-1, x=-1)) / dl)
    ly = 2 / (dd + du) * ((u(time=-1, y=1) - zc) / du - (zc - u(time=-1, y=-1)) / dd)
    return zc + DT_HILL * (UPLIFT + D_HILL * (lx + ly))


@pytest.mark.parametrize(("chunked", "backend"), [(False, "xla"), (False, "loops"),
                                                  (True, "auto")], ids=["numpy-xla",
                                                                        "numpy-loops", "dask-auto"])
def test_hillslope_mesh_scan_fixed_mask_nonuniform(x64, backend, chunked):
    da = xr.DataArray(Z0, dims=("y", "x"), coords={"y": HY, "x": HX}, name="z",
                      attrs={"units": "m"})
    if chunked:
        pytest.importorskip("dask")
        da = da.chunk({"y": 8, "x": 11})
    mask = xr.DataArray(FIXED, dims=("y", "x"), coords={"y": HY, "x": HX})
    m = da.stencil.mesh(boundary="extend", backend=backend)
    m[...] = _hill_step
    m[mask] = lambda u: u(time=-1)
    out = m.scan(dim="time", steps=50, dt=DT_HILL, save_every="last")
    ref = _hill_numpy(Z0, 50)
    assert out.dtype == np.float64 and out.name == "z" and out.attrs == {"units": "m"}
    assert float(out.time) == 50 * DT_HILL
    got = np.asarray(out.values)
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-13)
    np.testing.assert_array_equal(got[FIXED], Z0[FIXED])  # fixed nodes held exactly
    assert np.abs(got - Z0)[~FIXED].min() > 0  # and the rest moved


_OFFS = [(i, j) for i in (-1, 0, 1) for j in (-1, 0, 1) if (i, j) != (0, 0)]


def _d8_numpy(z):
    ny, nx = z.shape
    zp = np.pad(z, 1, mode="edge")
    xp = np.concatenate([[2 * HX[0] - HX[1]], HX, [2 * HX[-1] - HX[-2]]])
    yp = np.concatenate([[2 * HY[0] - HY[1]], HY, [2 * HY[-1] - HY[-2]]])
    best = np.full(z.shape, -np.inf)
    arg = np.zeros(z.shape, int)
    for k, (i, j) in enumerate(_OFFS):
        dx = xp[1 + j:1 + j + nx] - HX
        dy = (yp[1 + i:1 + i + ny] - HY)[:, None]
        s = (z - zp[1 + i:1 + i + ny, 1 + j:1 + j + nx]) / np.sqrt(dx**2 + dy**2)
        arg = np.where(s > best, k, arg)
        best = np.maximum(best, s)
    return best, arg


def _d8(u):
    cx, cy = u.coord("x"), u.coord("y")
    out = None
    for i, j in _OFFS:
        dx, dy = cx(x=j) - cx(), cy(y=i) - cy()
        s = (u() - u(y=i, x=j)) / jnp.sqrt(dx * dx + dy * dy)
        out = s if out is None else jnp.maximum(out, s)
    return out


def _d8_receiver(u):
    cx, cy = u.coord("x"), u.coord("y")
    s = [(u() - u(y=i, x=j)) / jnp.sqrt((cx(x=j) - cx()) ** 2 + (cy(y=i) - cy()) ** 2)
         for i, j in _OFFS]
    return jnp.argmax(jnp.stack(s), axis=0).astype(jnp.int32)


@pytest.mark.parametrize(("dtype", "backend"), [(np.float32, "loops"), (np.float64, "xla")],
                         ids=["float32-loops", "float64-xla"])
def test_d8_steepest_descent_nonuniform(backend, dtype):
    z = Z0.astype(dtype)
    da = xr.DataArray(z, dims=("y", "x"), coords={"y": HY, "x": HX}, name="z",
                      attrs={"units": "m"})
    best, arg = _d8_numpy(z.astype(np.float64))
    s = da.stencil.map(_d8, boundary="extend", backend=backend)
    v = da.stencil.map(_d8, boundary="valid", backend=backend)
    assert s.dtype == dtype and v.dtype == dtype
    assert s.name == "z" and s.attrs == {"units": "m"}
    tol = 1e-6 if dtype == np.float32 else 1e-14
    np.testing.assert_allclose(np.asarray(s), best, rtol=0, atol=tol)
    np.testing.assert_allclose(np.asarray(v), best[1:-1, 1:-1], rtol=0, atol=tol)
    np.testing.assert_array_equal(v.x.values, HX[1:-1])
    np.testing.assert_array_equal(v.y.values, HY[1:-1])
    if dtype == np.float32:  # the receiver (argmax over the stack) compiles slowly: once
        r = da.stencil.map(_d8_receiver, boundary="extend", backend=backend)
        assert r.dtype == np.int32
        np.testing.assert_array_equal(np.asarray(r), arg)


def test_float64_without_x64_stays_float64():
    """float64 data with JAX's x64 flag off: every port keeps float64 (numpy results)."""
    assert not jax.config.jax_enable_x64
    ds = _gs_start(16, np.float64)
    out = ds.stencil.scan(_gs_kernel(False), dim="time", steps=5, save_every="last",
                          boundary="periodic")
    ref = _gs_numpy(ds.u.values, ds.v.values, 5, 5)[-1]
    assert out.u.dtype == np.float64
    np.testing.assert_allclose(out.u.values, ref[0], rtol=0, atol=1e-14)


def test_closed_over_numpy_weights_as_python_numbers_same_on_numpy_and_dask():
    """``float(W[i])`` of a closed-over array: refused alike in memory and on
    dask (the arrays are inputs of the compiled program on both), and the
    advice (``.tolist()``) works on both."""
    pytest.importorskip("dask")
    w = np.array([1.0, -2.0, 1.0])

    def kernel(u):
        return sum(float(w[j + 1]) * u(x=j) for j in (-1, 0, 1))

    da = xr.DataArray(np.arange(8.0) ** 2, dims="x")
    for data in (da, da.chunk(4)):
        with pytest.raises(xstencil.KernelError, match="tolist"):
            data.stencil.map(kernel, boundary="extend").compute()
    wl = w.tolist()

    def listed(u):
        return sum(wl[j + 1] * u(x=j) for j in (-1, 0, 1))

    lazy = da.chunk(4).stencil.map(listed, boundary="extend").values
    eager = da.stencil.map(listed, boundary="extend").values
    ref = np.convolve(np.pad(da.values, 1, mode="edge"), w[::-1], mode="valid")
    np.testing.assert_allclose(eager, ref)
    np.testing.assert_array_equal(eager, lazy)

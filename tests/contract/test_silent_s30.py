"""Suspected silent defects checked in session 30, each against an
independent reference (numpy loops, ``np.pad``, analytic values)."""

from __future__ import annotations

import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr

import xstencil  # noqa: F401 - registers .stencil
from xstencil import XStencilError

# -- 1. period= with a boundary that is not periodic ---------------------------------

LON = np.arange(0.0, 360.0, 30.0)
DA = xr.DataArray(np.sin(np.deg2rad(LON)), dims="lon", coords={"lon": LON}, name="t")


def dlon(u: Any) -> Any:
    c = u.coord("lon")
    return c(lon=1) - c(lon=-1)


@pytest.mark.parametrize("mode", ["fill", "extend", "reflect", "symmetric", "valid"])
def test_period_with_a_boundary_that_is_not_periodic_raises(mode: str) -> None:
    """``period=`` only says how far a coordinate moves across a periodic seam;
    with any other boundary it was ignored (the same numbers as without it),
    which a user who took it to make the dim periodic could not tell."""
    with pytest.raises(XStencilError, match=re.escape(
            f"da.stencil.map(...): period={{'lon': 360.0}}: the boundary of 'lon' is "
            f"{mode!r}") + ".*pass boundary=.'lon': 'periodic'"):
        DA.stencil.map(dlon, boundary=mode, period={"lon": 360.0})


def test_period_not_periodic_raises_in_mesh_and_scan() -> None:
    m = DA.stencil.mesh(boundary="extend", period={"lon": 360.0})
    m[...] = lambda u: u(lon=1)
    with pytest.raises(XStencilError, match="the boundary of 'lon' is 'extend'"):
        m.map()
    traj = xr.DataArray(np.ones((3, 12)), dims=("time", "lon"), coords={"lon": LON})
    with pytest.raises(XStencilError, match=r"da\.stencil\.scan\(\.\.\.\): period=.*'lon' "
                                            r"is 'fill'"):
        traj.stencil.scan(lambda u: u(time=-1, lon=1), dim="time", period={"lon": 360.0})


def test_period_still_applies_across_a_periodic_seam() -> None:
    """Where it applies it still counts: the neighbour of the last label reads
    as the first plus the period (analytic: 30 everywhere, and 30 + 360 - 360
    at the seam; with a wrong period 400 the seam difference is 70)."""
    ok = DA.stencil.map(dlon, boundary={"lon": "periodic"}, period={"lon": 360.0})
    np.testing.assert_array_equal(ok.values, np.full(12, 60.0))
    off = DA.stencil.map(dlon, boundary="periodic", period={"lon": 400.0})
    np.testing.assert_array_equal(off.values[[0, -1]], [100.0, 100.0])
    # a dim outside the window is not padded: its period changes nothing, either way
    d2 = xr.DataArray(np.ones((2, 12)), dims=("y", "lon"), coords={"y": [0.0, 1.0], "lon": LON})
    out = d2.stencil.map(lambda u: u(lon=1), boundary="periodic", period={"y": 2.0})
    np.testing.assert_array_equal(out.values, np.ones((2, 12)))


# -- 5. reflect on a dim of length 1 -------------------------------------------------

def test_reflect_on_one_point_says_to_use_symmetric() -> None:
    """The message names the fix, keeping the other dims' modes, and the fix
    gives np.pad's 'symmetric' (which on one point repeats the value)."""
    rng = np.random.default_rng(1)
    a = rng.random((1, 6))
    da = xr.DataArray(a, dims=("y", "x"))

    def k(u: Any) -> Any:
        return u(y=-1) + 2 * u(y=1) + 3 * u(x=-1) + 5 * u(x=1)

    with pytest.raises(XStencilError, match=re.escape(
            "boundary 'reflect' along 'y' needs at least 2 points, it has 1") + ".*" +
            re.escape("use 'symmetric' along 'y'") + ".*" +
            re.escape("e.g. boundary={'y': 'symmetric', 'x': 'reflect'}")):
        da.stencil.map(k, boundary="reflect")
    out = da.stencil.map(k, boundary={"y": "symmetric", "x": "reflect"})
    p = np.pad(np.pad(a, ((1, 1), (0, 0)), mode="symmetric"), ((0, 0), (1, 1)), mode="reflect")
    ref = p[:-2, 1:-1] + 2 * p[2:, 1:-1] + 3 * p[1:-1, :-2] + 5 * p[1:-1, 2:]
    np.testing.assert_allclose(out.values, ref, rtol=1e-12)


# -- 4. window= over a periodic dim whose labels wrap -----------------------------------

def test_explicit_window_over_wrapped_labels_says_what_to_do() -> None:
    """A box mean with ``window=`` over a longitude whose labels wrap (350,
    355, 0, 5, ...) is refused, as its coordinate is padded read or not; the
    message now says why and gives two ways out, both of which give the
    numpy reference (np.roll)."""
    lon = (np.arange(72) * 5.0 + 350.0) % 360
    a = np.random.default_rng(2).random(72)
    da = xr.DataArray(a, dims="lon", coords={"lon": lon}, name="t", attrs={"units": "K"})
    ref = (np.roll(a, 1) + a + np.roll(a, -1)) / 3
    with pytest.raises(XStencilError, match=re.escape(
            "With window= given, every coordinate of a window dim is padded for "
            "u.coord('lon'), read or not") + ".*" + re.escape(
            "obj.drop_vars('lon').stencil.map(...).assign_coords(lon=obj['lon'])")):
        da.stencil.map(lambda u: u.mean(), window={"lon": 3}, boundary="periodic")
    out = da.drop_vars("lon").stencil.map(lambda u: u.mean(), window={"lon": 3},
                                          boundary="periodic").assign_coords(lon=da["lon"])
    np.testing.assert_allclose(out.values, ref, rtol=1e-12)
    assert out.attrs == da.attrs and out.name == "t"
    np.testing.assert_array_equal(out["lon"].values, lon)
    by_offsets = da.stencil.map(lambda u: (u(lon=-1) + u() + u(lon=1)) / 3, boundary="periodic")
    np.testing.assert_allclose(by_offsets.values, ref, rtol=1e-12)
    np.testing.assert_array_equal(by_offsets["lon"].values, lon)


# -- 3. cached loops called again with other coordinate values -----------------------

def _on(scale: float) -> xr.DataArray:
    x = scale * np.arange(8.0)
    return xr.DataArray(np.sin(np.arange(8) / 3.0), dims="x", coords={"x": x}, name="u")


def _k(u: Any) -> Any:
    c = u.coord("x")
    return u() + 0.0 * u(x=1) + 0.01 * (c(x=1) - c(x=-1))


def _ref(d: xr.DataArray, steps: int) -> np.ndarray:
    """``steps`` applications of ``_k`` by numpy: the coordinate extended
    linearly past the edges (boundary 'extend')."""
    c = d["x"].values
    cp = np.concatenate([[2 * c[0] - c[1]], c, [2 * c[-1] - c[-2]]])
    return d.values + steps * 0.01 * (cp[2:] - cp[:-2])


def _mesh_iterate(d: xr.DataArray) -> Any:
    m = d.stencil.mesh(boundary="extend")
    m[...] = _k
    return xstencil.iterate(None, m, max_steps=3, min_steps=3, tol=None).field


def _scan_step(d: xr.DataArray) -> Any:
    return d.stencil.scan(step=lambda s: s.stencil.map(_k, boundary="extend"), dim="time",
                          steps=3, dt=1.0).isel(time=-1)


def _iterate_step(d: xr.DataArray) -> Any:
    return xstencil.iterate(d, step=lambda s: s.stencil.map(_k, boundary="extend"),
                            max_steps=3, min_steps=3, tol=None).field


@pytest.mark.parametrize("run", [
    lambda d: d.stencil.iterate(_k, boundary="extend", max_steps=3, min_steps=3, tol=None).field,
    _mesh_iterate, _iterate_step, _scan_step])
def test_repeated_loops_read_the_new_coordinates(run: Any) -> None:
    """A loop compiled for one DataArray and called on another of the same
    shape with other coordinate values reads (and returns) the new ones."""
    for scale in (1.0, 10.0, 1.0, 3.0):
        d = _on(scale)
        out = run(d)
        np.testing.assert_allclose(out.values, _ref(d, 3), rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(out["x"].values, d["x"].values)


def test_repeated_solve_reads_the_new_coordinates() -> None:
    """``A(x) = x * (c(x=1) - c(x=-1)) / 2`` is diagonal: the solution is the
    right-hand side over the centred spacing (np.gradient's)."""
    def op(u: Any) -> Any:
        c = u.coord("x")
        return u() * 0.5 * (c(x=1) - c(x=-1))

    for scale in (1.0, 10.0, 1.0):
        d = _on(scale)
        out = d.stencil.solve(op, boundary="extend", tol=1e-10, method="bicgstab").field
        np.testing.assert_allclose(out.values, d.values / np.gradient(d["x"].values),
                                   rtol=1e-5, atol=1e-7)
        np.testing.assert_array_equal(out["x"].values, d["x"].values)


# -- 2. FFT-lowered sums over windows that are all zero ------------------------------

def _zero_block(n: int = 64) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    a = (rng.random((n, n)) + 0.5).astype("float32")
    a[20:44, 16:48] = 0.0
    w = (rng.random((15, 15)) - 0.3).astype("float32")  # not separable: an FFT
    return a, w


def _direct(a: np.ndarray, w: np.ndarray, mode: str, stride: int) -> np.ndarray:
    k = w.shape[0]
    pad = np.pad(a.astype(np.float64), k // 2,
                 mode={"fill": "constant", "periodic": "wrap", "reflect": "reflect"}[mode])
    n = a.shape[0]
    return np.array([[(pad[i:i + k, j:j + k] * w).sum() for j in range(0, n, stride)]
                     for i in range(0, n, stride)])


@pytest.mark.slow
@pytest.mark.parametrize("backend", [None, "xla"])
@pytest.mark.parametrize(("mode", "stride"), [("fill", 1), ("periodic", 1), ("reflect", 2)])
def test_fft_sum_over_all_zero_windows_is_exactly_zero(backend: Any, mode: str,
                                                       stride: int) -> None:
    """A 15 x 15 weighted sum is an FFT; where a window holds only zeros the
    direct sum is exactly 0, and a kernel's 1 / sum is inf and log(sum)
    -inf.  The FFT's rounding gave 131072 and -11.8 (or NaN) there."""
    a, w = _zero_block()
    da = xr.DataArray(a, dims=("y", "x"))
    opts: dict[str, Any] = dict(window={"y": 15, "x": 15}, boundary=mode, fill_value=0.0,
                                stride={"y": stride, "x": stride}, backend=backend)
    ref = _direct(a, w, mode, stride)
    zero = ref == 0
    assert zero.sum() > 20
    lin = da.stencil.map(lambda u: (u * w).sum(), **opts).values
    np.testing.assert_array_equal(lin == 0, zero)
    np.testing.assert_allclose(lin, ref, atol=1e-4)
    inv = da.stencil.map(lambda u: 1.0 / (u * w).sum(), **opts).values
    np.testing.assert_array_equal(np.isposinf(inv), zero)
    log = da.stencil.map(lambda u: jnp.log(jnp.abs((u * w).sum())), **opts).values
    np.testing.assert_array_equal(np.isneginf(log), zero)


@pytest.mark.slow
def test_fft_zero_windows_keep_their_gradient() -> None:
    """The exact zero keeps the derivative of the sum (the weights), as the
    direct sum has it: d/da of sum over outputs of (u * w).sum() is, at each
    cell, the sum of the weights over the windows that read it (fill 0)."""
    a, w = _zero_block(40)
    a[:, :] = 0.0  # every window is zero

    def total(x: Any) -> Any:
        da = xr.DataArray(x, dims=("y", "x"))
        out = da.stencil.map(lambda u: (u * w).sum(), window={"y": 15, "x": 15},
                             boundary="fill", fill_value=0.0, backend="xla")
        return out.data.sum()

    g = np.asarray(jax.grad(total)(jnp.asarray(a)))
    # the adjoint: at each cell, the weights with which the windows on it read it
    ref = np.array([[sum(w[p, q] for p in range(15) for q in range(15)
                         if 0 <= i - p + 7 < 40 and 0 <= j - q + 7 < 40)
                     for j in range(40)] for i in range(40)])
    np.testing.assert_allclose(g, ref, rtol=1e-4, atol=1e-4)

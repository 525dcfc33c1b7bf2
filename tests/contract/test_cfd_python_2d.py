"""CFD Python (Lorena Barba's 12 steps) steps 5-8 in two dimensions: linear
convection, nonlinear convection, diffusion and Burgers, written as an xarray
user would write them with xstencil, and checked against the notebooks' numpy
updates (typed out here as reference functions).

The notebooks hold ``u = 1`` on the four edges after every step. Three
natural ways to say that are ported and must agree with the numpy loop:

* a function mesh with the update inside and ``1`` on the edge regions, run
  as a time scan (``m.scan``; always XLA);
* the same mesh as a spatial update, called once per step (``m.map()``;
  numba loops under ``backend="auto"`` from 512 x 512 points);
* the interior alone, scanned with ``boundary="fill", fill_value=1.0``: the
  edges are then ghost cells that stay 1 (numba loops for a DataArray from
  512 x 512 points).

The initial hat is set on labels (``0.5 <= x <= 1``), which is the notebooks'
index slice at 41, 81 and 101 points; at 31 (step 7's size) and 1024 points
the slice ``int(.5 / dx):int(1 / dx + 1)`` also takes the point just below
0.5, so the references start from the labelled field.  The notebooks loop ``nt + 1``
times; so do the ports.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np
import pytest
import xarray as xr

import xstencil
from xstencil import XStencilError

EDGES = ({"x": 0}, {"x": -1}, {"y": 0}, {"y": -1})


def hat_state(n: int, names: tuple[str, ...] = ("u",), dtype: Any = np.float64) -> xr.Dataset:
    """``ones`` on [0, 2]^2 with 2 where 0.5 <= x <= 1 and 0.5 <= y <= 1."""
    c = np.linspace(0, 2, n)
    ones = xr.DataArray(np.ones((n, n), dtype), dims=("y", "x"), coords={"y": c, "x": c})
    hat = (ones.x >= 0.5) & (ones.x <= 1) & (ones.y >= 0.5) & (ones.y <= 1)
    return xr.Dataset({k: ones.where(~hat, 2.0).astype(dtype) for k in names})


def notebook_hat(n: int) -> np.ndarray:
    d = 2 / (n - 1)
    u = np.ones((n, n))
    u[int(.5 / d):int(1 / d + 1), int(.5 / d):int(1 / d + 1)] = 2
    return u


@pytest.mark.parametrize("n", [41, 81, 101])
def test_labelled_hat_is_the_notebooks_slice(n):
    np.testing.assert_array_equal(hat_state(n)["u"].values, notebook_hat(n))


@pytest.mark.parametrize("n", [31, 1024])
def test_notebooks_slice_takes_a_point_below_half(n):
    """``int(.5 / dx)`` rounds 7.5 (n=31) or 255.75 (n=1024) down: the slice
    starts one point below x = 0.5, which the labelled hat leaves out."""
    d = 2 / (n - 1)
    lo = int(.5 / d)
    c = np.linspace(0, 2, n)
    assert c[lo] < 0.5 <= c[lo + 1]
    extra = notebook_hat(n) - hat_state(n)["u"].values
    assert set(np.unique(extra)) == {0.0, 1.0}
    rows, cols = np.nonzero(extra)
    assert set(rows) | set(cols) >= {lo} and np.all((rows == lo) | (cols == lo))


def edges_one(u: np.ndarray) -> None:
    u[0, :] = 1
    u[-1, :] = 1
    u[:, 0] = 1
    u[:, -1] = 1


# ----------------------------------------------------------------------------------------
# the numpy references (the notebooks' array versions)


def step5_numpy(u, nt, dx, dt, c=1.0):
    u, dy = u.copy(), dx
    for _ in range(nt + 1):
        un = u.copy()
        u[1:, 1:] = (un[1:, 1:] - (c * dt / dx * (un[1:, 1:] - un[1:, :-1]))
                     - (c * dt / dy * (un[1:, 1:] - un[:-1, 1:])))
        edges_one(u)
    return u


def step6_numpy(u, v, nt, dx, dt, c=1.0):
    u, v, dy = u.copy(), v.copy(), dx
    for _ in range(nt + 1):
        un, vn = u.copy(), v.copy()
        u[1:, 1:] = (un[1:, 1:] - (un[1:, 1:] * c * dt / dx * (un[1:, 1:] - un[1:, :-1]))
                     - vn[1:, 1:] * c * dt / dy * (un[1:, 1:] - un[:-1, 1:]))
        v[1:, 1:] = (vn[1:, 1:] - (un[1:, 1:] * c * dt / dx * (vn[1:, 1:] - vn[1:, :-1]))
                     - vn[1:, 1:] * c * dt / dy * (vn[1:, 1:] - vn[:-1, 1:]))
        edges_one(u)
        edges_one(v)
    return u, v


def step7_numpy(u, nt, dx, dt, nu):
    u, dy = u.copy(), dx
    for _ in range(nt + 1):
        un = u.copy()
        u[1:-1, 1:-1] = (un[1:-1, 1:-1]
                         + nu * dt / dx**2 * (un[1:-1, 2:] - 2 * un[1:-1, 1:-1] + un[1:-1, 0:-2])
                         + nu * dt / dy**2 * (un[2:, 1:-1] - 2 * un[1:-1, 1:-1] + un[0:-2, 1:-1]))
        edges_one(u)
    return u


def step8_numpy(u, v, nt, dx, dt, nu):
    u, v, dy = u.copy(), v.copy(), dx
    for _ in range(nt + 1):
        un, vn = u.copy(), v.copy()
        c = (slice(1, -1), slice(1, -1))
        w, s, e, n = (slice(1, -1), slice(0, -2)), (slice(0, -2), slice(1, -1)), \
            (slice(1, -1), slice(2, None)), (slice(2, None), slice(1, -1))
        u[c] = (un[c] - dt / dx * un[c] * (un[c] - un[w]) - dt / dy * vn[c] * (un[c] - un[s])
                + nu * dt / dx**2 * (un[e] - 2 * un[c] + un[w])
                + nu * dt / dy**2 * (un[n] - 2 * un[c] + un[s]))
        v[c] = (vn[c] - dt / dx * un[c] * (vn[c] - vn[w]) - dt / dy * vn[c] * (vn[c] - vn[s])
                + nu * dt / dx**2 * (vn[e] - 2 * vn[c] + vn[w])
                + nu * dt / dy**2 * (vn[n] - 2 * vn[c] + vn[s]))
        edges_one(u)
        edges_one(v)
    return u, v


# ----------------------------------------------------------------------------------------
# the updates, written once on a reader ``r(x=.., y=..)`` of the previous state


def conv5(r, dx, dt, c=1.0):
    return r() - c * dt / dx * (r() - r(x=-1)) - c * dt / dx * (r() - r(y=-1))


def conv6(u, v, dx, dt, c=1.0):
    return {"u": u() - u() * c * dt / dx * (u() - u(x=-1)) - v() * c * dt / dx * (u() - u(y=-1)),
            "v": v() - u() * c * dt / dx * (v() - v(x=-1)) - v() * c * dt / dx * (v() - v(y=-1))}


def lap(r, dx, dt, nu):
    return (nu * dt / dx**2 * (r(x=1) - 2 * r() + r(x=-1))
            + nu * dt / dx**2 * (r(y=1) - 2 * r() + r(y=-1)))


def diff7(r, dx, dt, nu):
    return r() + lap(r, dx, dt, nu)


def burgers8(u, v, dx, dt, nu):
    return {"u": (u() - dt / dx * u() * (u() - u(x=-1)) - dt / dx * v() * (u() - u(y=-1))
                  + lap(u, dx, dt, nu)),
            "v": (v() - dt / dx * u() * (v() - v(x=-1)) - dt / dx * v() * (v() - v(y=-1))
                  + lap(v, dx, dt, nu))}


def prev(r):
    """A reader of the previous time position of ``r`` (inside a scan)."""
    return lambda **o: r(time=-1, **o)


def scan_kernel(update: Callable[..., Any], names: tuple[str, ...], **k: Any) -> Callable:
    if names == ("u",):
        return lambda u: update(prev(u), **k)
    return lambda s: update(*(prev(s[n]) for n in names), **k)


def map_kernel(update: Callable[..., Any], names: tuple[str, ...], **k: Any) -> Callable:
    if names == ("u",):
        return lambda u: update(u, **k)
    return lambda s: update(*(s[n] for n in names), **k)


def edge_value(names: tuple[str, ...]) -> Callable:
    if names == ("u",):
        return lambda u: 1.0
    return lambda s: dict.fromkeys(names, 1.0)


def run(way: str, state: xr.Dataset, update: Callable, nt: int, dt: float,
        backend: str = "auto", as_numpy: bool = False, **k: Any) -> xr.Dataset:
    """``nt + 1`` steps of ``update`` with ``u = 1`` on the edges, one of three ways."""
    names = tuple(str(n) for n in state.data_vars)
    obj = state["u"] if names == ("u",) else state
    if way == "mesh_scan":
        m = obj.stencil.mesh(boundary="extend")
        m[...] = scan_kernel(update, names, dt=dt, **k)
        for e in EDGES:
            m[e] = edge_value(names)
        out = m.scan(dim="time", steps=nt + 1, dt=dt, save_every="last", backend=backend)
    elif way == "fill_scan":
        inner = obj.isel(x=slice(1, -1), y=slice(1, -1))
        out = inner.stencil.scan(scan_kernel(update, names, dt=dt, **k), dim="time",
                                 steps=nt + 1, dt=dt, save_every="last", boundary="fill",
                                 fill_value=1.0, backend=backend)
        out = out.pad(x=1, y=1, constant_values=1.0).assign_coords(x=obj.x, y=obj.y)
    else:
        out = obj
        for _ in range(nt + 1):
            m = out.stencil.mesh(boundary="extend", backend=backend)
            m[...] = map_kernel(update, names, dt=dt, **k)
            for e in EDGES:
                m[e] = edge_value(names)
            out = m.map().as_numpy() if as_numpy else m.map()
    if way != "mesh_maps":  # save_every="last" keeps the final time as a scalar coordinate
        assert float(out["time"]) == pytest.approx((nt + 1) * dt)
        out = out.drop_vars("time")
    return out.to_dataset(name="u") if names == ("u",) else out


WAYS = ["mesh_scan", "fill_scan", "mesh_maps"]
DTYPES = [pytest.param(np.float64, id="f64"), pytest.param(np.float32, id="f32")]


def check(got: xr.Dataset, want: dict[str, np.ndarray], dtype: Any, like: xr.Dataset) -> None:
    tol = {"rtol": 1e-12, "atol": 1e-12} if dtype == np.float64 else {"rtol": 3e-6, "atol": 3e-6}
    for name, w in want.items():
        assert got[name].dtype == dtype and got[name].dims == ("y", "x")
        assert got[name].x.equals(like.x) and got[name].y.equals(like.y)
        np.testing.assert_allclose(np.asarray(got[name].values), w, **tol)


@pytest.fixture(params=DTYPES)
def precision(request) -> Iterator[Any]:
    """float64 under ``jax.enable_x64(True)``; float32 with JAX's default (x64 off)."""
    if request.param == np.float64:
        with jax.enable_x64(True):
            yield request.param
    else:
        yield request.param


# ----------------------------------------------------------------------------------------
# the notebooks' sizes (XLA: below 512 x 512 points)


@pytest.mark.parametrize("way", WAYS)
def test_step5_linear_convection(precision, way):
    n, nt = 81, 100
    dx = 2 / (n - 1)
    dt = 0.2 * dx
    s0 = hat_state(n, dtype=precision)
    want = step5_numpy(s0["u"].values, nt, dx, dt)
    check(run(way, s0, conv5, nt, dt, dx=dx), {"u": want}, precision, s0)
    assert want.max() > 1.5 and want.argmax() != notebook_hat(n).argmax()  # the hat moved


@pytest.mark.parametrize("way", WAYS)
def test_step6_nonlinear_convection(precision, way):
    n, nt = 101, 80
    dx = 2 / (n - 1)
    dt = 0.2 * dx
    s0 = hat_state(n, ("u", "v"), dtype=precision)
    u, v = step6_numpy(s0["u"].values, s0["v"].values, nt, dx, dt)
    check(run(way, s0, conv6, nt, dt, dx=dx), {"u": u, "v": v}, precision, s0)


@pytest.mark.parametrize("way", WAYS)
def test_step7_diffusion(precision, way):
    n, nt, nu = 31, 50, 0.05
    dx = 2 / (n - 1)
    dt = 0.25 * dx * dx / nu
    s0 = hat_state(n, dtype=precision)
    want = step7_numpy(s0["u"].values, nt, dx, dt, nu)
    check(run(way, s0, diff7, nt, dt, dx=dx, nu=nu), {"u": want}, precision, s0)


def test_step7_diffuse_cells_chained(x64):
    """The notebook calls ``diffuse(10)`` then ``diffuse(14)`` on the same ``u``,
    each call resetting only the hat: ``where`` on labels does that."""
    n, nu = 31, 0.05
    dx = 2 / (n - 1)
    dt = 0.25 * dx * dx / nu
    s0 = hat_state(n)
    hat = s0["u"] == 2
    want = step7_numpy(s0["u"].values, 10, dx, dt, nu)
    want = step7_numpy(np.where(hat.values, 2.0, want), 14, dx, dt, nu)
    first = run("fill_scan", s0, diff7, 10, dt, dx=dx, nu=nu)
    again = run("fill_scan", first.where(~hat, 2.0), diff7, 14, dt, dx=dx,
                nu=nu)
    np.testing.assert_allclose(again["u"].values, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("way", WAYS)
def test_step8_burgers(precision, way):
    n, nt, nu = 41, 120, 0.01
    dx = 2 / (n - 1)
    dt = 0.0009 * dx * dx / nu
    s0 = hat_state(n, ("u", "v"), dtype=precision)
    u, v = step8_numpy(s0["u"].values, s0["v"].values, nt, dx, dt, nu)
    check(run(way, s0, burgers8, nt, dt, dx=dx, nu=nu), {"u": u, "v": v}, precision, s0)


# ----------------------------------------------------------------------------------------
# 1024 x 1024: numba loops under "auto" (fill scans of a DataArray and mesh maps)


def conv6_one(r, dx, dt, c=1.0):
    """Step 6's ``u`` update with ``v = u``: the notebook starts ``u`` and ``v``
    equal, and its updates keep them equal (``dx == dy``)."""
    return r() - r() * c * dt / dx * (r() - r(x=-1)) - r() * c * dt / dx * (r() - r(y=-1))


def test_large_auto_runs_the_loops(caplog):
    """float32, 1024 x 1024: the loops round as numpy does, XLA:CPU turns
    ``u() * c * dt / dx`` into a multiplication by a reciprocal (one ulp off).
    So ``auto`` is bitwise the numpy loop where it runs the loops at every
    step: the fill scan, and a time loop of mesh maps, whether it hands each
    call numpy data or the last call's result (a JAX array on the CPU, read
    by the loops through a numpy view)."""
    n, nt = 1024, 3
    dx = 2 / (n - 1)
    dt = 0.2 * dx
    s0 = hat_state(n, dtype=np.float32)
    want = step6_numpy(s0["u"].values, s0["u"].values, nt, dx, dt)[0]
    scan = run("fill_scan", s0, conv6_one, nt, dt, dx=dx)["u"]
    np.testing.assert_array_equal(np.asarray(scan.values), want)
    maps = run("mesh_maps", s0, conv6_one, nt, dt, as_numpy=True, dx=dx)["u"]
    np.testing.assert_array_equal(maps.values, want)
    xla = run("mesh_maps", s0, conv6_one, nt, dt, backend="xla", dx=dx)["u"]
    assert not np.array_equal(np.asarray(xla.values), want)  # the paths are told apart
    np.testing.assert_allclose(np.asarray(xla.values), want, rtol=3e-6, atol=3e-6)
    with caplog.at_level(logging.DEBUG, logger="xstencil.loops"):
        jaxed = run("mesh_maps", s0, conv6_one, nt, dt, dx=dx)["u"]
    np.testing.assert_array_equal(np.asarray(jaxed.values), want)
    assert "runs with XLA" not in caplog.text
    assert scan.dtype == maps.dtype == np.float32 and scan.x.equals(s0.x)


@pytest.mark.slow
@pytest.mark.parametrize("step", [5, 6, 7, 8])
def test_large_every_step_every_backend(precision, step):
    n = 1024
    dx = 2 / (n - 1)
    if step in (5, 6):
        nt, dt, k, update = 10, 0.2 * dx, {}, {5: conv5, 6: conv6}[step]
    else:
        nu = 0.05 if step == 7 else 0.01
        nt, dt, k = 10, (0.25 if step == 7 else 0.0009) * dx * dx / nu, {"nu": nu}
        update = {7: diff7, 8: burgers8}[step]
    names = ("u",) if step in (5, 7) else ("u", "v")
    s0 = hat_state(n, names, dtype=precision)
    ref = {5: step5_numpy, 6: step6_numpy, 7: step7_numpy, 8: step8_numpy}[step]
    want = ref(*(s0[v].values for v in names), nt, dx, dt, **k)
    want = dict(zip(names, want if len(names) == 2 else (want,), strict=True))
    for way in WAYS:
        for b in ("auto", "loops", "xla"):
            check(run(way, s0, update, nt, dt, backend=b, dx=dx, **k), want, precision, s0)


# ----------------------------------------------------------------------------------------
# found while porting


def test_mesh_scan_takes_backend():
    """``m.scan(backend=...)`` was passed to the kernels (and refused with an
    error saying backend= is not an option while listing it); it is checked
    and the mesh scan runs with XLA."""
    s0 = hat_state(41)["u"]
    m = s0.stencil.mesh(boundary="extend")
    m[...] = lambda u: 0.5 * (u(time=-1, x=-1) + u(time=-1))
    m[{"x": 0}] = lambda u: 1.0
    base = m.scan(dim="time", steps=3, dt=0.1)
    for b in ("auto", "loops", "xla"):
        xr.testing.assert_identical(m.scan(dim="time", steps=3, dt=0.1, backend=b), base)
    want = s0.values.copy()
    for _ in range(3):
        want[:, 1:] = 0.5 * (want[:, :-1] + want[:, 1:])
        want[:, 0] = 1.0
    np.testing.assert_allclose(base.isel(time=-1).values, want, rtol=1e-6)
    with pytest.raises(XStencilError, match=r"mesh\(\.\.\.\)\.scan\(\): backend='gpu' is not a "
                                            r"backend; expected one of"):
        m.scan(dim="time", steps=3, dt=0.1, backend="gpu")


def test_mesh_map_out_says_it_is_not_an_option():
    """``map(out=)`` users try ``m.map(out=buf)``: say out= is map's option,
    not that a DataArray cannot be a kernel argument."""
    s0 = hat_state(41)["u"]
    m = s0.stencil.mesh(boundary="extend")
    m[...] = lambda u: u(x=-1)
    buf = s0.copy()
    with pytest.raises(XStencilError, match=r"mesh\(\.\.\.\)\.map\(\): out= \(writing into a "
                                            r"preallocated array\) is an option of "
                                            r"da\.stencil\.map, not of a mesh's map"):
        m.map(out=buf)
    np.testing.assert_array_equal(buf.values, s0.values)  # untouched
    assert xstencil.map(s0, lambda u: u(x=-1), out=buf) is not None  # map's own out= works
    np.testing.assert_array_equal(buf.values[:, 1:], s0.values[:, :-1])

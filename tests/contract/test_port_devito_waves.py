"""Devito's acoustic modelling tutorial (examples/seismic/tutorials/01_modelling)
ported to xstencil, and checked against Devito itself.

The tutorial solves ``m u_tt - lap(u) = q`` (``m = 1 / vp**2``) with leapfrog
in time: ``u.forward = solve(pde, u.forward)``, a Ricker wavelet injected at
one point with ``src.inject(field=u.forward, expr=src * dt**2 / m)`` and
receivers read with ``rec.interpolate(expr=u)``.  Here without the absorbing
layer (``nbl=0``, no damping) and on a two-layer velocity model, so every
number is comparable:

* Devito's halo (``space_order // 2`` points) holds zeros that the operator
  never writes: xstencil's ``boundary="fill", fill_value=0.0``;
* the tutorial's Dirichlet variant writes ``u[t+1] = 0`` on the edge nodes
  after the update: a function mesh with ``0`` on the four edges;
* with ``time_M`` iterations, Devito computes ``u[2] ... u[nt-1]`` from the
  two zero slices ``u[0], u[1]``; iteration ``t`` injects ``src[t]`` into
  ``u[t+1]`` and samples ``rec[t] = u[t]`` (``rec[0]`` and ``rec[nt-1]`` are
  left zero);
* a receiver between grid nodes is Devito's bilinear interpolation, which is
  ``traj.interp(x=..., z=...)``.

Devito prints its finite-difference weights with 9 significant digits
(``1.333333330``, ``-8.33333333e-2``), so in float64 its wavefield differs
from the exact weights by up to 5e-8 of the amplitude after 58 steps (measured):
it is compared to 3e-7 of the amplitude, and xstencil with a numpy time loop (the
independent reference here, exact weights) to 1e-12.

The xstencil ports are written three ways, as a user would: a full
trajectory whose positions >= 2 hold the injected source term (reads at
offset 0 see the input), a trajectory grown with ``steps=`` whose kernel
computes the wavelet from the time coordinate, and ``scan(step=)`` carrying
the two time levels as a Dataset.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr

import xstencil  # noqa: F401
from tests.spies import count_calls

os.environ.setdefault("DEVITO_LOGGING", "ERROR")
os.environ.setdefault("DEVITO_LANGUAGE", "C")
# Devito's optimising modes start every operator by switching the CPU to flush
# subnormals to zero (its 'denormals' pass), and compile with -ffast-math unless
# safe-math is set: that state stays for the rest of the process, and later
# tests in the same worker saw no subnormals (hypothesis refused to draw floats,
# and any subnormal result would have been flushed silently). The 'noop' mode
# has no such pass; its plain sums are also the closest to the kernels here.
os.environ["DEVITO_SAFE_MATH"] = "1"
devito = pytest.importorskip("devito")
devito.configuration["safe-math"] = True
OPT = "noop"

NX, NZ, H = 21, 17, 10.0     # grid nodes along x and z, spacing (m)
NT, DT, F0 = 60, 2.0e-3, 25.0  # time positions, step (s), peak frequency (Hz)
SRC = (10, 5)                # source node (x, z)
REC = np.array([[30.0, 20.0], [100.0, 20.0], [155.0, 20.0], [42.5, 37.5]])  # last two off-grid
WEIGHTS = {2: (-2.0, 1.0), 4: (-5 / 2, 4 / 3, -1 / 12)}  # centre, +-1, +-2


def velocity() -> np.ndarray:
    """Two layers: 1500 m/s above z = 80 m, 2500 m/s from there down."""
    vp = np.full((NX, NZ), 1500.0)
    vp[:, NZ // 2:] = 2500.0
    return vp


def ricker(t: Any, xp: Any = np) -> Any:
    """Devito's ``RickerSource`` (delay ``1 / f0``)."""
    a = (np.pi * F0 * (t - 1 / F0)) ** 2
    return (1 - 2 * a) * xp.exp(-a)


TIMES = np.arange(NT) * DT
WAVELET = ricker(TIMES)


@functools.cache
def devito_run(so: int, dtype: type, dirichlet: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Devito's wavefield (every position) and receiver traces."""
    from devito import Eq, Function, Operator, SparseTimeFunction, TimeFunction, solve

    grid = devito.Grid(shape=(NX, NZ), extent=((NX - 1) * H, (NZ - 1) * H), dtype=dtype)
    vp = Function(name="vp", grid=grid, space_order=so)
    vp.data[:] = velocity()
    u = TimeFunction(name="u", grid=grid, time_order=2, space_order=so, save=NT)
    src = SparseTimeFunction(name="src", grid=grid, npoint=1, nt=NT)
    src.coordinates.data[:] = [[SRC[0] * H, SRC[1] * H]]
    src.data[:, 0] = WAVELET
    rec = SparseTimeFunction(name="rec", grid=grid, npoint=len(REC), nt=NT)
    rec.coordinates.data[:] = REC
    update = Eq(u.forward, solve(u.dt2 - vp**2 * u.laplace, u.forward))
    dt = grid.time_dim.spacing
    eqs = [update, src.inject(field=u.forward, expr=src * dt**2 * vp**2)]
    if dirichlet:
        t1 = u.indices[0] + 1
        x, z = grid.dimensions
        eqs += [Eq(u[t1, 0, z], 0.0), Eq(u[t1, NX - 1, z], 0.0),
                Eq(u[t1, x, 0], 0.0), Eq(u[t1, x, NZ - 1], 0.0)]
    op = Operator([*eqs, rec.interpolate(expr=u)], opt=OPT)
    args = op.arguments(dt=DT)
    assert (args["time_m"], args["time_M"]) == (1, NT - 2)
    op(dt=DT)
    return np.array(u.data), np.array(rec.data)


def numpy_run(so: int, dirichlet: bool = False) -> np.ndarray:
    """The same leapfrog as a numpy time loop over a zero-padded field."""
    vp, r = velocity(), so // 2
    w = WEIGHTS[so]
    inner = (slice(r, r + NX), slice(r, r + NZ))
    u = np.zeros((NT, NX + 2 * r, NZ + 2 * r))
    for n in range(2, NT):
        p = u[n - 1]
        lap = 2 * w[0] * p[inner]
        for k in range(1, r + 1):
            lap = lap + w[k] * (p[r + k:r + k + NX, r:r + NZ] + p[r - k:r - k + NX, r:r + NZ]
                                + p[r:r + NX, r + k:r + k + NZ] + p[r:r + NX, r - k:r - k + NZ])
        u[n][inner] = 2 * p[inner] - u[n - 2][inner] + DT**2 * vp**2 * lap / H**2
        u[n][r + SRC[0], r + SRC[1]] += WAVELET[n - 1] * DT**2 * vp[SRC] ** 2
        if dirichlet:
            u[n][r, :] = u[n][r + NX - 1, :] = u[n][:, r] = u[n][:, r + NZ - 1] = 0
    return u[:, r:r + NX, r:r + NZ]


def laplacian(read: Any, so: int) -> Any:
    """``read(**offsets)`` -> the ``so``-th order Laplacian, as Devito's ``u.laplace``."""
    w = WEIGHTS[so]
    total = 0.0
    for d in ("x", "z"):
        total = total + w[0] * read()
        for k in range(1, so // 2 + 1):
            total = total + w[k] * (read(**{d: k}) + read(**{d: -k}))
    return total / H**2


def leapfrog(so: int) -> Any:
    def kernel(s: Any) -> Any:
        u = s["u"]
        lap = laplacian(lambda **o: u(time=-1, **o), so)
        # u() is the input at this position: the injected source term
        return {"u": 2 * u(time=-1) - u(time=-2) + DT**2 * s["vp"]() ** 2 * lap + u()}
    return kernel


def forced_input(dtype: Any = np.float64) -> xr.Dataset:
    """The full trajectory: zeros, plus ``src[n-1] dt^2 vp^2`` at the source
    node of every position ``n >= 2``."""
    vp = velocity()
    u = np.zeros((NT, NX, NZ))
    u[2:, SRC[0], SRC[1]] = WAVELET[1:-1] * DT**2 * vp[SRC] ** 2
    coords = {"time": TIMES, "x": np.arange(NX) * H, "z": np.arange(NZ) * H}
    return xr.Dataset({"u": (("time", "x", "z"), u.astype(dtype)),
                       "vp": (("x", "z"), vp.astype(dtype))}, coords=coords,
                      attrs={"title": "layered model"})


def receivers(u: xr.DataArray) -> np.ndarray:
    """Devito's ``rec`` layout: ``rec[t] = u[t]`` for ``t = 1 ... nt-2``, else 0."""
    at = u.interp(x=xr.DataArray(REC[:, 0], dims="rec"), z=xr.DataArray(REC[:, 1], dims="rec"))
    out = np.zeros((NT, len(REC)))
    out[1:-1] = at.transpose("time", "rec").values[1:-1]
    return out


@pytest.mark.parametrize("so", [2, 4])
def test_wavefield_and_traces_match_devito(so):
    ds = forced_input()
    before = ds.copy(deep=True)
    out = ds.stencil.scan(leapfrog(so), dim="time", boundary={"x": "fill", "z": "fill"},
                          fill_value=0.0)
    xr.testing.assert_identical(ds, before)  # the input is not mutated
    assert out.u.dtype == np.float64 and out.attrs == ds.attrs
    np.testing.assert_array_equal(out.time, TIMES)
    xr.testing.assert_identical(out.vp, ds.vp)
    want_u, want_rec = devito_run(so, np.float64)
    scale = np.abs(want_u).max()
    assert scale > 20  # the wave is there (the injected term peaks at 9)
    np.testing.assert_allclose(out.u.values, want_u, rtol=0, atol=3e-7 * scale)
    np.testing.assert_allclose(receivers(out.u), want_rec, rtol=0, atol=3e-7 * scale)
    assert np.abs(want_rec[:, 0]).max() > 0.05 * scale  # the far receiver has been reached
    np.testing.assert_allclose(out.u.values, numpy_run(so), rtol=0, atol=1e-12 * scale)


def test_second_and_fourth_order_differ_by_more_than_the_tolerance():
    """The comparison above can tell the two orders apart."""
    u2, _ = devito_run(2, np.float64)
    u4, _ = devito_run(4, np.float64)
    assert np.abs(u2 - u4).max() > 1e-3 * np.abs(u4).max()


def test_dirichlet_edges_match_devito_boundary_equations():
    ds = forced_input()
    m = ds.stencil.mesh(boundary={"x": "fill", "z": "fill"}, fill_value=0.0)
    m[...] = leapfrog(4)
    for edge in ({"x": 0}, {"x": -1}, {"z": 0}, {"z": -1}):
        m[edge] = lambda s: {"u": 0.0}
    out = m.scan(dim="time")
    want_u, want_rec = devito_run(4, np.float64, dirichlet=True)
    scale = np.abs(want_u).max()
    np.testing.assert_allclose(out.u.values, want_u, rtol=0, atol=3e-7 * scale)
    np.testing.assert_allclose(receivers(out.u), want_rec, rtol=0, atol=3e-7 * scale)
    np.testing.assert_allclose(out.u.values, numpy_run(4, dirichlet=True), rtol=0,
                               atol=1e-12 * scale)
    # the edges matter at this length: the zero-halo run differs there
    assert np.abs(want_u - devito_run(4, np.float64)[0]).max() > 1e-3 * scale


@pytest.mark.slow
def test_float32_matches_devito_float32():
    ds = forced_input(np.float32)
    out = ds.stencil.scan(leapfrog(4), dim="time", boundary="fill", fill_value=0.0)
    assert out.u.dtype == np.float32
    want_u, want_rec = devito_run(4, np.float32)
    scale = np.abs(want_u).max()
    np.testing.assert_allclose(out.u.values, want_u, rtol=0, atol=1e-5 * scale)
    np.testing.assert_allclose(receivers(out.u), want_rec, rtol=0, atol=1e-5 * scale)


def grown(dtype: Any = np.float64) -> xr.Dataset:
    """The initial state of a grown trajectory: two zero slices, the velocity
    model and the source's position as a mask."""
    mask = np.zeros((NX, NZ))
    mask[SRC] = 1.0
    coords = {"time": TIMES[:2], "x": np.arange(NX) * H, "z": np.arange(NZ) * H}
    return xr.Dataset({"u": (("time", "x", "z"), np.zeros((2, NX, NZ), dtype)),
                       "vp": (("x", "z"), velocity().astype(dtype)),
                       "src": (("x", "z"), mask.astype(dtype))}, coords=coords)


def wave_from_time(s: Any) -> Any:
    """The wavelet from the time coordinate: ``src[n-1]`` is read at ``time=-1``."""
    u = s["u"]
    t = u.coord("time")(time=-1)
    lap = laplacian(lambda **o: u(time=-1, **o), 4)
    q = s["src"]() * ricker(t, jnp)
    return {"u": 2 * u(time=-1) - u(time=-2) + DT**2 * s["vp"]() ** 2 * (lap + q)}


@pytest.mark.parametrize("x64_on", [False, True])
def test_grown_scan_reading_time_gives_devitos_field_in_float64(x64_on):
    """float64 stays float64, and computes in float64, with JAX's x64 flag off too."""
    with jax.enable_x64(x64_on):
        out = grown().stencil.scan(wave_from_time, dim="time", steps=NT - 2, dt=DT,
                                   boundary="fill", fill_value=0.0)
    assert out.u.dtype == np.float64
    np.testing.assert_allclose(out.time, TIMES, rtol=0, atol=1e-15)
    want = numpy_run(4)
    # float32 arithmetic would be off by about 1e-7 of the amplitude
    np.testing.assert_allclose(out.u.values, want, rtol=0, atol=1e-12 * np.abs(want).max())
    want_u, _ = devito_run(4, np.float64)
    np.testing.assert_allclose(out.u.values, want_u, rtol=0, atol=3e-7 * np.abs(want).max())


@pytest.mark.slow
def test_save_every_keeps_the_same_positions():
    every = grown().stencil.scan(wave_from_time, dim="time", steps=NT - 2, dt=DT,
                                 boundary="fill", fill_value=0.0)
    sparse = grown().stencil.scan(wave_from_time, dim="time", steps=NT - 2, dt=DT,
                                  boundary="fill", fill_value=0.0, save_every=2)
    # the two initial positions, then every second computed one
    keep = [0, 1, *range(3, NT, 2)]
    np.testing.assert_allclose(sparse.time, TIMES[keep], rtol=1e-15)
    np.testing.assert_array_equal(sparse.u.values, every.u.values[keep])
    last = grown().stencil.scan(wave_from_time, dim="time", steps=NT - 2, dt=DT,
                                boundary="fill", fill_value=0.0, save_every="last")
    assert last.u.dims == ("x", "z") and float(last.time) == pytest.approx(TIMES[-1])
    np.testing.assert_array_equal(last.u.values, every.u.values[-1])


def two_levels(dtype: Any = np.float64) -> xr.Dataset:
    """Leapfrog as a one-step scan of the pair (u[n], u[n-1])."""
    g = grown(dtype).isel(time=1)
    return g.assign(prev=g["u"])


def test_step_function_with_the_time_gives_devitos_field():
    def step(s: Any, time: Any) -> Any:
        lap = s["u"].stencil.map(lambda u: laplacian(u, 4), boundary="fill", fill_value=0.0)
        q = s["src"] * ricker(time, jnp)
        new = 2 * s["u"] - s["prev"] + DT**2 * s["vp"] ** 2 * (lap + q)
        return s.assign(u=new, prev=s["u"])

    out = two_levels().stencil.scan(None, "time", step=step, steps=NT - 2, dt=DT)
    want_u, want_rec = devito_run(4, np.float64)
    scale = np.abs(want_u).max()
    np.testing.assert_allclose(out.time, TIMES[1:], rtol=0, atol=1e-15)
    np.testing.assert_allclose(out.u.values, want_u[1:], rtol=0, atol=3e-7 * scale)
    np.testing.assert_allclose(out.prev.values[1:], want_u[1:-1], rtol=0, atol=3e-7 * scale)


def pulse_leapfrog(s: Any) -> Any:
    """No source: the numba loops take kernels that read only ``time=-1``."""
    u = s["u"]
    lap = laplacian(lambda **o: u(time=-1, **o), 4)
    return {"u": 2 * u(time=-1) - s["prev"](time=-1) + DT**2 * s["vp"]() ** 2 * lap,
            "prev": u(time=-1)}


@pytest.mark.parametrize("dtype", [pytest.param(np.float32, marks=pytest.mark.slow), np.float64])
def test_loops_and_xla_give_the_same_wavefield(monkeypatch, dtype):
    from xstencil._labelled import loop_scan

    monkeypatch.delenv("XSTENCIL_BACKEND", raising=False)
    x, z = np.meshgrid(np.arange(NX) * H, np.arange(NZ) * H, indexing="ij")
    bump = np.exp(-((x - 100) ** 2 + (z - 60) ** 2) / 400).astype(dtype)
    start = two_levels(dtype).assign(u=(("x", "z"), bump), prev=(("x", "z"), bump))
    ran = count_calls(monkeypatch, loop_scan.loop_scan_steps, "run_loop")
    loops = start.stencil.scan(pulse_leapfrog, "time", steps=NT - 2, dt=DT, boundary="fill",
                               fill_value=0.0, backend="loops")
    assert ran, "the scan did not run on the numba loops"
    xla = start.stencil.scan(pulse_leapfrog, "time", steps=NT - 2, dt=DT, boundary="fill",
                             fill_value=0.0, backend="xla")
    assert loops.u.dtype == xla.u.dtype == dtype
    tol = 1e-12 if dtype == np.float64 else 2e-6
    np.testing.assert_allclose(loops.u.values, xla.u.values, rtol=0, atol=tol)
    # and both are the numpy leapfrog
    u = np.zeros((NT, NX + 4, NZ + 4))
    u[0:2, 2:-2, 2:-2] = bump
    vp2 = velocity() ** 2
    for n in range(2, NT):
        p = u[n - 1]
        lap = 2 * -5 / 2 * p[2:-2, 2:-2]
        for k, w in ((1, 4 / 3), (2, -1 / 12)):
            lap = lap + w * (p[2 + k:NX + 2 + k, 2:-2] + p[2 - k:NX + 2 - k, 2:-2]
                             + p[2:-2, 2 + k:NZ + 2 + k] + p[2:-2, 2 - k:NZ + 2 - k])
        u[n, 2:-2, 2:-2] = 2 * p[2:-2, 2:-2] - u[n - 2, 2:-2, 2:-2] + DT**2 * vp2 * lap / H**2
    tol = 1e-12 if dtype == np.float64 else 1e-5
    np.testing.assert_allclose(loops.u.values, u[1:, 2:-2, 2:-2], rtol=0, atol=tol)


@pytest.mark.slow
@pytest.mark.parametrize("checkpoint", [False, True])
def test_gradient_of_a_receiver_misfit_wrt_the_velocity(x64, checkpoint):
    """Full-waveform inversion's gradient on a small grid, against central
    differences (``jax.test_util.check_grads``) and one directional derivative."""
    from jax.test_util import check_grads

    start = grown().isel(x=slice(4, 17), z=slice(0, 10))

    def traces(vp):
        ds = start.assign(vp=(("x", "z"), vp))
        out = ds.stencil.scan(wave_from_time, dim="time", steps=30, dt=DT, boundary="fill",
                              fill_value=0.0, checkpoint=checkpoint)
        return out.u.data[:, :, 2]  # a line of receivers at z = 20 m

    vp0 = jnp.asarray(start.vp.values)
    observed = traces(vp0 * 1.03)

    def misfit(vp):
        return jnp.sum((traces(vp) - observed) ** 2)

    grad = jax.grad(misfit)(vp0)
    d = np.random.default_rng(0).normal(size=vp0.shape)
    eps = 1e-3
    fd = (misfit(vp0 + eps * d) - misfit(vp0 - eps * d)) / (2 * eps)
    assert abs(fd) > 1e-3
    np.testing.assert_allclose(float(jnp.sum(grad * d)), float(fd), rtol=1e-7)
    check_grads(misfit, (vp0,), order=1, modes=("rev",), eps=1e-3)


# Devito's first-order acoustic tutorial (05_staggered_acoustic): pressure p at
# the nodes, v_x (v_z) half a cell to the right along x (z); v is updated from
# p, then p from the new v (``div(v.forward)``), and the source is injected
# into ``p.forward``. Devito's v_x[i] sits at x_i + h/2 and reads p[i], p[i+1]:
# xgcm's "right" position.
STAGGERED_WEIGHTS = {2: (1.0,), 4: (9 / 8, -1 / 24)}
GRID = {"X": {"center": "x", "right": "x_r"}, "Z": {"center": "z", "right": "z_r"}}


@functools.cache
def devito_staggered(so: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    from devito import (
        NODE,
        Eq,
        Function,
        Operator,
        SparseTimeFunction,
        TimeFunction,
        VectorTimeFunction,
        div,
        grad,
        solve,
    )

    grid = devito.Grid(shape=(NX, NZ), extent=((NX - 1) * H, (NZ - 1) * H), dtype=np.float64)
    p = TimeFunction(name="p", grid=grid, staggered=NODE, space_order=so, time_order=1,
                     save=NT)
    v = VectorTimeFunction(name="v", grid=grid, space_order=so, time_order=1, save=NT)
    vp = Function(name="vp", grid=grid, space_order=so)
    vp.data[:] = velocity()
    src = SparseTimeFunction(name="src", grid=grid, npoint=1, nt=NT)
    src.coordinates.data[:] = [[SRC[0] * H, SRC[1] * H]]
    src.data[:, 0] = WAVELET
    eqs = [Eq(v.forward, solve(v.dt - grad(p), v.forward)),
           Eq(p.forward, solve(p.dt - vp**2 * div(v.forward), p.forward)),
           src.inject(field=p.forward, expr=src * grid.time_dim.spacing)]
    op = Operator(eqs, opt=OPT)
    args = op.arguments(dt=DT)
    assert (args["time_m"], args["time_M"]) == (0, NT - 2)
    op(dt=DT)
    return np.array(p.data), np.array(v[0].data), np.array(v[1].data)


def staggered_state() -> xr.Dataset:
    x, z = np.arange(NX) * H, np.arange(NZ) * H
    mask = np.zeros((NX, NZ))
    mask[SRC] = 1.0
    zeros = np.zeros((NX, NZ))
    return xr.Dataset({"p": (("x", "z"), zeros), "vx": (("x_r", "z"), zeros),
                       "vz": (("x", "z_r"), zeros), "vp": (("x", "z"), velocity()),
                       "src": (("x", "z"), mask)},
                      coords={"x": x, "z": z, "x_r": x + H / 2, "z_r": z + H / 2, "time": 0.0})


def half_diff(read: Any, axis: str, so: int, at: float = 0.0) -> Any:
    """d/d(axis) at ``at`` cells of a field half a cell off it."""
    w = STAGGERED_WEIGHTS[so]
    return sum(c * (read(**{axis: at + k + 0.5}) - read(**{axis: at - k - 0.5}))
               for k, c in enumerate(w)) / H


def check_staggered(out: xr.Dataset, so: int, start: xr.Dataset) -> None:
    want_p, want_vx, want_vz = devito_staggered(so)
    assert out.vx.dims == ("time", "x_r", "z") and out.vz.dims == ("time", "x", "z_r")
    np.testing.assert_array_equal(out.x_r, start.x_r)
    np.testing.assert_allclose(out.time, TIMES, rtol=0, atol=1e-15)
    for got, want in ((out.p, want_p), (out.vx, want_vx), (out.vz, want_vz)):
        scale = np.abs(want).max()
        assert scale > 0
        np.testing.assert_allclose(got.values, want, rtol=0, atol=3e-7 * scale)


@pytest.mark.parametrize("so", [pytest.param(2, marks=pytest.mark.slow), 4])
def test_staggered_first_order_acoustic_matches_devito_step_form(so):
    def step(s: Any, time: Any) -> Any:
        opts = {"grid": GRID, "boundary": "fill", "fill_value": 0.0}
        vx = s.stencil.map(lambda s: s["vx"]() + DT * half_diff(s["p"], "X", so),
                           at={"X": "right", "Z": "center"}, **opts)
        vz = s.stencil.map(lambda s: s["vz"]() + DT * half_diff(s["p"], "Z", so),
                           at={"X": "center", "Z": "right"}, **opts)
        s = s.assign(vx=vx, vz=vz)
        p = s.stencil.map(lambda s: s["p"]() + DT * s["vp"]() ** 2 * (
            half_diff(s["vx"], "X", so) + half_diff(s["vz"], "Z", so)), at={"X": "center",
                                                                          "Z": "center"}, **opts)
        return s.assign(p=p + DT * s["src"] * ricker(time, jnp))

    start = staggered_state()
    out = start.stencil.scan(None, "time", step=step, steps=NT - 1, dt=DT)
    check_staggered(out, so, start)


def staggered_kernels(so: int) -> dict[str, Any]:
    """One scan kernel per variable; p reads the new v as v + dt grad(p) on its
    faces.  Devito never writes the faces in its halo (v_x[-1] stays 0), so the
    halo is filled with NaN and the reads say where they fall: a new v there is
    0, not v + dt grad(p), and p's halo reads 0."""
    def zero(r: Any) -> Any:
        return jnp.where(jnp.isnan(r), 0.0, r)

    def prev(s: Any, name: str) -> Any:
        return lambda **o: zero(s[name](time=-1, **o))

    def new_v(s: Any, name: str, axis: str) -> Any:
        def read(**o: Any) -> Any:
            r = s[name](time=-1, **o)
            return jnp.where(jnp.isnan(r), 0.0,
                             r + DT * half_diff(prev(s, "p"), axis, so, at=o[axis]))
        return read

    def pressure(s: Any) -> Any:
        div = half_diff(new_v(s, "vx", "X"), "X", so) + half_diff(new_v(s, "vz", "Z"), "Z", so)
        t = s["p"].coord("time")(time=-1)
        return (s["p"](time=-1) + DT * s["vp"]() ** 2 * div
                + DT * s["src"]() * ricker(t, jnp))

    return {"vx": lambda s: s["vx"](time=-1) + DT * half_diff(prev(s, "p"), "X", so),
            "vz": lambda s: s["vz"](time=-1) + DT * half_diff(prev(s, "p"), "Z", so),
            "p": pressure}


@pytest.mark.parametrize("so", [pytest.param(2, marks=pytest.mark.slow), 4])
def test_staggered_first_order_acoustic_matches_devito_kernel_form(so):
    """A grown staggered scan whose kernel reads the time coordinate (the input
    has no time dim: this raised 'no coordinate time is available' before)."""
    start = staggered_state()
    out = start.stencil.scan(staggered_kernels(so), "time", steps=NT - 1, dt=DT, grid=GRID,
                             boundary="fill", fill_value=np.nan)
    check_staggered(out, so, start)
    # continued from the state half way, whose time is a scalar coordinate (this
    # raised xarray's "dimension 'time' already exists as a scalar variable")
    half = NT // 2
    first = start.stencil.scan(staggered_kernels(so), "time", steps=half, dt=DT, grid=GRID,
                               boundary="fill", fill_value=np.nan, save_every="last")
    assert float(first.time) == pytest.approx(TIMES[half])
    rest = first.stencil.scan(staggered_kernels(so), "time", steps=NT - 1 - half, dt=DT,
                              grid=GRID, boundary="fill", fill_value=np.nan)
    np.testing.assert_allclose(rest.time, TIMES[half:], rtol=1e-12)
    for name in ("p", "vx", "vz"):
        np.testing.assert_allclose(rest[name].values, out[name].values[half:], rtol=0,
                                   atol=1e-12 * np.abs(out[name].values).max())


def free_surface_row(i: int) -> Any:
    """Leapfrog at z row ``i`` next to a free surface at row 0 (Devito's
    free-surface tutorials mirror the field oddly into the halo): a read at row
    ``j < 0`` is ``-u`` at row ``-j``, an offset that depends on the row, so
    each row within reach gets its own mesh region."""
    def kernel(s: Any) -> Any:
        u = s["u"]

        def read(**o: int) -> Any:
            dz = o.get("z", 0)
            if i + dz < 0:
                return -u(time=-1, **{**o, "z": -2 * i - dz})
            return u(time=-1, **o)

        return {"u": 2 * u(time=-1) - s["prev"](time=-1)
                + DT**2 * s["vp"]() ** 2 * laplacian(read, 4), "prev": u(time=-1)}
    return kernel


@pytest.mark.parametrize("backend", ["loops", "xla"])
def test_free_surface_by_mesh_rows(monkeypatch, backend):
    from xstencil._labelled import loop_scan

    monkeypatch.delenv("XSTENCIL_BACKEND", raising=False)
    x, z = np.meshgrid(np.arange(NX) * H, np.arange(NZ) * H, indexing="ij")
    bump = np.exp(-((x - 100) ** 2 + (z - 30) ** 2) / 400)
    start = two_levels().assign(u=(("x", "z"), bump), prev=(("x", "z"), bump))
    m = start.stencil.mesh(boundary="fill", fill_value=0.0)
    m[...] = free_surface_row(2)  # rows from 2 on read no further than row 0
    m[{"z": 1}] = free_surface_row(1)
    m[{"z": 0}] = lambda s: {"u": 0.0, "prev": s["u"](time=-1)}
    ran = count_calls(monkeypatch, loop_scan.loop_scan_steps, "run_loop")
    out = m.scan("time", steps=40, dt=DT, backend=backend)
    assert bool(ran) == (backend == "loops")
    # numpy: an odd mirror in a two-row halo above row 0, zeros elsewhere
    w, vp2 = WEIGHTS[4], velocity() ** 2
    levels = [bump, bump]
    for _ in range(40):
        u = levels[-1]
        g = np.zeros((NX + 4, NZ + 4))
        g[2:-2, 2:-2] = u
        g[2:-2, 1], g[2:-2, 0] = -u[:, 1], -u[:, 2]
        lap = 2 * w[0] * u
        for k in (1, 2):
            lap = lap + w[k] * (g[2 + k:NX + 2 + k, 2:-2] + g[2 - k:NX + 2 - k, 2:-2]
                                + g[2:-2, 2 + k:NZ + 2 + k] + g[2:-2, 2 - k:NZ + 2 - k])
        new = 2 * u - levels[-2] + DT**2 * vp2 * lap / H**2
        new[:, 0] = 0.0
        levels.append(new)
    np.testing.assert_allclose(out.u.values[1:], np.array(levels[2:]), rtol=0, atol=1e-13)
    # the mirror matters: the zero halo differs near the surface
    zero_halo = start.stencil.scan(pulse_leapfrog, "time", steps=40, dt=DT, boundary="fill",
                                   fill_value=0.0)
    assert np.abs(zero_halo.u.values[-1, :, 1:4] - levels[-1][:, 1:4]).max() > 1e-2


def test_devito_operators_leave_subnormals_alone():
    """After a Devito operator has run in this process, subnormal floats
    still exist: code built with -ffast-math switches the CPU to flush them
    to zero for the whole process, which made later tests in the same worker
    fail (hypothesis refuses to draw floats then) and would flush any
    subnormal result silently."""
    devito_run(2, np.float64)
    tiny = np.finfo(np.float64).tiny
    assert np.float64(tiny) / 4 > 0
    assert np.float32(np.finfo(np.float32).tiny) / np.float32(4) > 0

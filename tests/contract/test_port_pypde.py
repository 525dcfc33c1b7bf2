"""py-pde's diffusion, Allen-Cahn and Cahn-Hilliard equations on Cartesian
grids, stepped with its fixed-step Euler solver (``solver="euler"``,
``adaptive=False``), ported to xstencil scans and checked against py-pde.

py-pde's grids are cell-centred (``x_i = x0 + (i + 1/2) dx``) and its
boundary conditions set a ghost cell outside each edge cell.  They map onto
xstencil as follows, checked on py-pde's own Laplacian first:

* ``periodic=True``: ``"periodic"``;
* ``{"derivative": 0}`` (Neumann): the ghost equals the edge cell, which for
  the one-cell reads of a Laplacian is both ``"symmetric"`` and ``"extend"``;
  for Cahn-Hilliard's Laplacian of a Laplacian (reads two cells out),
  ``"symmetric"`` is the one that mirrors the chemical potential too;
* ``{"value": v}`` (Dirichlet on the face half a cell outside): the ghost is
  ``2 v - u_edge``.  No boundary mode gives that; the port fills the halo
  with NaN and replaces the read.  ``fill_value=v`` (a value at the ghost's
  centre, a cell further out) is a different condition, and is shown to be.
"""

from __future__ import annotations

import warnings
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr

import xstencil  # noqa: F401
from tests.spies import count_calls

pde = pytest.importorskip("pde")

RNG = np.random.default_rng(7)


def make_grid(periodic: tuple[bool, bool], shape: tuple[int, int] = (16, 10)) -> Any:
    """A grid with different spacings along x (0.25) and y (0.2)."""
    return pde.CartesianGrid([[0.0, 4.0], [-1.0, 1.0]], list(shape), periodic=list(periodic))


def as_dataarray(field: Any) -> xr.DataArray:
    g = field.grid
    return xr.DataArray(field.data.copy(), dims=("x", "y"),
                        coords={"x": g.axes_coords[0], "y": g.axes_coords[1]}, name="c")


def solve(eq: Any, field: Any, t_range: float, dt: float, tracker: Any = None) -> Any:
    with warnings.catch_warnings():  # py-pde's own notices are not under test here
        warnings.simplefilter("ignore")
        return eq.solve(field.copy(), t_range=t_range, dt=dt, solver="euler", adaptive=False,
                        tracker=tracker, backend="numpy")


def spacing(da: xr.DataArray) -> tuple[float, float]:
    return float(da.x[1] - da.x[0]), float(da.y[1] - da.y[0])


def laplace(read: Any, dx: float, dy: float) -> Any:
    """``read(**offsets)`` -> the 5-point Laplacian."""
    c = read()
    return ((read(x=1) - 2 * c + read(x=-1)) / dx**2
            + (read(y=1) - 2 * c + read(y=-1)) / dy**2)


def dirichlet_read(u: Any, value: float, **at: int) -> Any:
    """The read of a halo filled with NaN, replaced by py-pde's ghost ``2 v - u``
    (the edge cell is the centre when a read falls off the grid)."""
    def read(**o: int) -> Any:
        r = u(**at, **o)
        return jnp.where(jnp.isnan(r), 2 * value - u(**at), r)
    return read


def test_grid_is_cell_centred():
    g = make_grid((False, False))
    np.testing.assert_allclose(g.axes_coords[0], 0.125 + 0.25 * np.arange(16))
    np.testing.assert_allclose(g.discretization, [0.25, 0.2])


@pytest.mark.parametrize(("bc", "mode"), [
    ("periodic", "periodic"),
    ({"derivative": 0}, "symmetric"),
    ({"derivative": 0}, "extend"),
])
def test_laplacian_boundary_modes_are_pypdes(bc, mode):
    periodic = bc == "periodic"
    field = pde.ScalarField(make_grid((periodic, periodic)), RNG.normal(size=(16, 10)))
    want = field.laplace(bc=bc if not periodic else "periodic").data
    da = as_dataarray(field)
    dx, dy = spacing(da)
    got = da.stencil.map(lambda u: laplace(u, dx, dy), boundary=mode)
    np.testing.assert_allclose(got.values, want, rtol=1e-12, atol=1e-12)


def test_laplacian_dirichlet_value_is_a_ghost_mirrored_about_the_face():
    v = 0.3
    field = pde.ScalarField(make_grid((False, False)), RNG.normal(size=(16, 10)))
    want = field.laplace(bc={"value": v}).data
    da = as_dataarray(field)
    dx, dy = spacing(da)
    got = da.stencil.map(lambda u: laplace(dirichlet_read(u, v), dx, dy), boundary="fill",
                         fill_value=np.nan)
    np.testing.assert_allclose(got.values, want, rtol=1e-12, atol=1e-12)
    # a fill with the boundary value itself is a different condition: the edge
    # cells are off by (v - u_edge) / dx**2, the interior is the same
    naive = da.stencil.map(lambda u: laplace(u, dx, dy), boundary="fill", fill_value=v)
    err = np.abs(naive.values - want)
    assert err[1:-1, 1:-1].max() < 1e-12
    np.testing.assert_allclose(err[0, 1:-1], np.abs(v - da.values[0, 1:-1]) / dx**2, rtol=1e-9)


@pytest.mark.parametrize("mode", ["symmetric", "extend"])
def test_allen_cahn_periodic_x_neumann_y(mode):
    grid = make_grid((True, False))
    field = pde.ScalarField(grid, RNG.uniform(-1, 1, grid.shape))
    eq = pde.AllenCahnPDE(interface_width=0.05, bc={"x": "periodic", "y": {"derivative": 0}})
    dt, t_range = 0.004, 0.2
    want = solve(eq, field, t_range, dt)
    da = as_dataarray(field)
    dx, dy = spacing(da)

    def allen_cahn(u):
        c = u(time=-1)
        lap = laplace(lambda **o: u(time=-1, **o), dx, dy)
        return c + dt * (0.05 * lap - c**3 + c)

    out = da.stencil.scan(allen_cahn, "time", steps=round(t_range / dt), dt=dt,
                          boundary={"x": "periodic", "y": mode}, save_every="last")
    assert float(out.time) == pytest.approx(t_range)
    np.testing.assert_allclose(out.values, want.data, rtol=0, atol=1e-12)
    # the state has moved well away from the start
    assert np.abs(da.values - want.data).max() > 0.1


def test_diffusion_dirichlet_and_neumann_on_loops_and_xla(monkeypatch):
    from xstencil._labelled import loop_scan

    monkeypatch.delenv("XSTENCIL_BACKEND", raising=False)
    v, D, dt, t_range = 0.3, 0.7, 0.005, 0.25
    grid = make_grid((False, False))
    field = pde.ScalarField(grid, RNG.uniform(0, 1, grid.shape))
    eq = pde.DiffusionPDE(diffusivity=D, bc={"x": {"value": v}, "y": {"derivative": 0}})
    want = solve(eq, field, t_range, dt)
    da = as_dataarray(field)
    dx, dy = spacing(da)

    def heat(u):
        x_read = dirichlet_read(u, v, time=-1)
        c = u(time=-1)
        lap = ((x_read(x=1) - 2 * c + x_read(x=-1)) / dx**2
               + (u(time=-1, y=1) - 2 * c + u(time=-1, y=-1)) / dy**2)
        return c + dt * D * lap

    ran = count_calls(monkeypatch, loop_scan.loop_scan_steps, "run_loop")
    opts = {"steps": round(t_range / dt), "dt": dt, "boundary": {"x": "fill", "y": "symmetric"},
            "fill_value": np.nan, "save_every": "last"}
    loops = da.stencil.scan(heat, "time", backend="loops", **opts)
    assert ran, "the scan did not run on the numba loops"
    xla = da.stencil.scan(heat, "time", backend="xla", **opts)
    for out in (loops, xla):
        np.testing.assert_allclose(out.values, want.data, rtol=0, atol=1e-12)
    # the boundary value has pulled the edges: a zero-flux run is far off
    free = solve(pde.DiffusionPDE(diffusivity=D, bc={"derivative": 0}), field, t_range, dt)
    assert np.abs(free.data - want.data).max() > 0.05


def cahn_hilliard_step(dx: float, dy: float, dt: float, w: float, mode: str) -> Any:
    """``c += dt lap(c**3 - c - w lap(c))`` with two maps, as py-pde evaluates it."""
    def step(s):
        lap_c = s.stencil.map(lambda u: laplace(u, dx, dy), boundary=mode)
        mu = s**3 - s - w * lap_c
        return s + dt * mu.stencil.map(lambda u: laplace(u, dx, dy), boundary=mode)
    return step


@pytest.mark.parametrize(("bc", "mode"), [("periodic", "periodic"),
                                          ({"derivative": 0}, "symmetric")])
def test_cahn_hilliard_trajectory(bc, mode):
    periodic = bc == "periodic"
    grid = make_grid((periodic, periodic))
    field = pde.ScalarField(grid, RNG.uniform(-1, 1, grid.shape))
    w, dt, t_range, every = 0.3, 1e-4, 0.02, 50
    eq = pde.CahnHilliardPDE(interface_width=w, bc_c=bc, bc_mu=bc)
    storage = pde.MemoryStorage()
    solve(eq, field, t_range, dt, tracker=[storage.tracker(every * dt)])
    want = np.stack([f.data for f in storage])
    assert len(want) == 5 and np.abs(want[-1] - want[0]).max() > 0.1
    da = as_dataarray(field)
    dx, dy = spacing(da)
    steps = round(t_range / dt)
    two_maps = da.stencil.scan(None, "time", step=cahn_hilliard_step(dx, dy, dt, w, mode),
                               steps=steps, dt=dt, save_every=every)
    np.testing.assert_allclose(two_maps.time, storage.times, rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(two_maps.values, want, rtol=0, atol=1e-9)

    # one kernel reading two cells out: the mirror of c gives mu's mirror too
    def fused(u):
        def mu(**o):
            at = {k: o.get(k, 0) for k in ("x", "y")}

            def read(**p):
                return u(time=-1, **{k: at[k] + p.get(k, 0) for k in at})
            c = read()
            return c**3 - c - w * laplace(read, dx, dy)
        return u(time=-1) + dt * laplace(mu, dx, dy)

    one = da.stencil.scan(fused, "time", steps=steps, dt=dt, boundary=mode, save_every=every)
    np.testing.assert_allclose(one.values, want, rtol=0, atol=1e-9)
    if mode == "symmetric":  # "extend" repeats the edge twice: mu's ghost is not mu's edge
        ext = da.stencil.scan(fused, "time", steps=steps, dt=dt, boundary="extend",
                              save_every=every)
        assert np.abs(ext.values[-1] - want[-1]).max() > 1e-3


class ForcedAllenCahn(pde.PDEBase):
    """``c_t = 0.5 lap(c) - c**3 + sin(3 t)``, a py-pde PDE class with an explicit
    time dependence (``pde.PDE({"c": "0.5 * laplace(c) - c**3 + sin(3 * t)"})``
    gives the same numbers bitwise, after 7-20 s of compiling its expression)."""

    def evolution_rate(self, state: Any, t: float = 0) -> Any:
        return 0.5 * state.laplace(bc="periodic") - state**3 + np.sin(3 * t)


def forced_allen_cahn() -> tuple[Any, Any]:
    grid = make_grid((True, True))
    return ForcedAllenCahn(), pde.ScalarField(grid, RNG.uniform(-1, 1, grid.shape))


def test_runge_kutta_step_function_with_the_time():
    """py-pde's fixed-step RK4 evaluates the right-hand side at t, t + dt/2 and
    t + dt: a ``scan(step=)`` that takes ``time`` does the same."""
    eq, field = forced_allen_cahn()
    dt, t_range = 0.004, 0.2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = eq.solve(field.copy(), t_range=t_range, dt=dt, solver="runge-kutta",
                        adaptive=False, tracker=None, backend="numpy")
    da = as_dataarray(field)
    dx, dy = spacing(da)

    def rhs(s, t):
        return 0.5 * s.stencil.map(lambda u: laplace(u, dx, dy), boundary="periodic") \
            - s**3 + jnp.sin(3 * t)

    def rk4(s, time):
        k1 = dt * rhs(s, time)
        k2 = dt * rhs(s + 0.5 * k1, time + 0.5 * dt)
        k3 = dt * rhs(s + 0.5 * k2, time + 0.5 * dt)
        k4 = dt * rhs(s + k3, time + dt)
        return s + (k1 + 2 * k2 + 2 * k3 + k4) / 6

    out = da.stencil.scan(None, "time", step=rk4, steps=round(t_range / dt), dt=dt,
                          save_every="last")
    assert out.dtype == np.float64
    np.testing.assert_allclose(out.values, want.data, rtol=0, atol=1e-12)
    assert np.abs(want.data - field.data).max() > 0.5


def test_adams_bashforth_is_a_two_level_scan():
    """py-pde's Adams-Bashforth starts from c(-dt) = c(0) - dt f(c(0), 0); the
    scan takes both as its initial positions and reads ``time=-1`` and ``-2``."""
    eq, field = forced_allen_cahn()
    dt, t_range = 0.004, 0.2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = eq.solve(field.copy(), t_range=t_range, dt=dt, solver="adams-bashforth",
                        tracker=None, backend="numpy")
    da = as_dataarray(field)
    dx, dy = spacing(da)

    def f(u, level):
        read = lambda **o: u(time=level, **o)  # noqa: E731
        t = u.coord("time")(time=level)
        return 0.5 * laplace(read, dx, dy) - read() ** 3 + jnp.sin(3 * t)

    def ab2(u):
        return u(time=-1) + dt * (1.5 * f(u, -1) - 0.5 * f(u, -2))

    # numpy only here: a jnp scalar would make the sum a float32 JAX array (x64 off)
    f0 = 0.5 * da.stencil.map(lambda u: laplace(u, dx, dy), boundary="periodic") - da**3
    start = xr.concat([da - dt * f0, da], dim=xr.DataArray([-dt, 0.0], dims="time",
                                                            name="time"))
    out = start.stencil.scan(ab2, "time", steps=round(t_range / dt), dt=dt,
                             boundary="periodic", save_every="last")
    assert float(out.time) == pytest.approx(t_range)
    np.testing.assert_allclose(out.values, want.data, rtol=0, atol=1e-12)

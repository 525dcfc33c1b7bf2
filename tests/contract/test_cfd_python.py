"""CFD Python (Lorena Barba's 12 steps) steps 9-12, written with
``xstencil.iterate``, ``xstencil.solve`` and ``scan(step=...)``, checked
against the numpy originals (written out here as in the notebooks; periodic
columns of step 12 use ``np.roll`` instead of the notebook's three explicit
column formulas, which compute the same numbers).

The meshes reproduce the originals exactly, including their order of
boundary assignments: a boundary row that copies the *new* interior
(``p[0, :] = p[1, :]`` after the interior update) is the interior update
evaluated one cell in, ``jacobi(s, oy=1)``.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as spl
import xarray as xr

import xstencil

# ----------------------------------------------------------------------------------------
# step 9: Laplace, Jacobi until the l1 change < 1e-4


def laplace_numpy(nx: int = 31, ny: int = 31, target: float = 1e-4) -> tuple[np.ndarray, int]:
    dx, dy = 2 / (nx - 1), 1 / (ny - 1)
    y = np.linspace(0, 1, ny)
    p = np.zeros((ny, nx))
    p[:, 0] = 0
    p[:, -1] = y
    p[0, :] = p[1, :]
    p[-1, :] = p[-2, :]
    l1norm, n = 1.0, 0
    while l1norm > target:
        pn = p.copy()
        p[1:-1, 1:-1] = ((dy**2 * (pn[1:-1, 2:] + pn[1:-1, 0:-2])
                          + dx**2 * (pn[2:, 1:-1] + pn[0:-2, 1:-1]))
                         / (2 * (dx**2 + dy**2)))
        p[:, 0] = 0
        p[:, -1] = y
        p[0, :] = p[1, :]
        p[-1, :] = p[-2, :]
        l1norm = np.sum(np.abs(p[:]) - np.abs(pn[:])) / np.sum(np.abs(pn[:]))
        n += 1
    return p, n


def laplace_xstencil(nx: int = 31, ny: int = 31, target: float = 1e-4) -> xstencil.Converged:
    dx, dy = 2 / (nx - 1), 1 / (ny - 1)
    x, y = np.linspace(0, 2, nx), np.linspace(0, 1, ny)
    p0 = xr.DataArray(np.zeros((ny, nx)), dims=("y", "x"), coords={"y": y, "x": x})
    p0[:, -1] = y
    p0[0, :] = p0[1, :]
    p0[-1, :] = p0[-2, :]

    def jacobi(u, oy=0, ox=0):
        return ((dy**2 * (u(y=oy, x=ox + 1) + u(y=oy, x=ox - 1))
                 + dx**2 * (u(y=oy + 1, x=ox) + u(y=oy - 1, x=ox))) / (2 * (dx**2 + dy**2)))

    m = p0.stencil.mesh(boundary="extend")
    m[...] = jacobi
    m[{"x": 0}] = lambda u: 0.0
    m[{"x": -1}] = lambda u: u.coord("y")()
    m[{"y": 0}] = lambda u: jacobi(u, oy=1)          # p[0, :] = p[1, :] (new)
    m[{"y": 0, "x": 0}] = lambda u: 0.0
    m[{"y": 0, "x": -1}] = lambda u: u.coord("y")(y=1)
    m[{"y": -1}] = lambda u: jacobi(u, oy=-1)        # p[-1, :] = p[-2, :] (new)
    m[{"y": -1, "x": 0}] = lambda u: 0.0
    m[{"y": -1, "x": -1}] = lambda u: u.coord("y")(y=-1)
    return p0.stencil.iterate(m, tol=target, norm="l1", max_steps=100_000)


def test_step9_laplace_matches_numpy(x64):
    want, n = laplace_numpy()
    res = laplace_xstencil()
    assert res.converged and res.residual <= 1e-4
    assert res.iterations == n
    np.testing.assert_allclose(res.field.values, want, rtol=1e-10, atol=1e-12)
    assert res.field.dtype == np.float64 and res.field.dims == ("y", "x")
    # the right edge holds p = y (its corners copy the row next to them)
    assert np.abs(res.field.values[1:-1, -1] - np.linspace(0, 1, 31)[1:-1]).max() < 1e-15


# ----------------------------------------------------------------------------------------
# step 10: Poisson, 100 Jacobi sweeps; and solved exactly by multigrid and cg

NX10, NY10 = 50, 50
DX10, DY10 = 2 / (NX10 - 1), 1 / (NY10 - 1)


def poisson_b() -> np.ndarray:
    b = np.zeros((NY10, NX10))
    b[int(NY10 / 4), int(NX10 / 4)] = 100
    b[int(3 * NY10 / 4), int(3 * NX10 / 4)] = -100
    return b


@functools.lru_cache(maxsize=2)
def poisson_numpy(nt: int = 100) -> np.ndarray:
    dx, dy = DX10, DY10
    p, b = np.zeros((NY10, NX10)), poisson_b()
    for _ in range(nt):
        pd = p.copy()
        p[1:-1, 1:-1] = (((pd[1:-1, 2:] + pd[1:-1, :-2]) * dy**2
                          + (pd[2:, 1:-1] + pd[:-2, 1:-1]) * dx**2
                          - b[1:-1, 1:-1] * dx**2 * dy**2) / (2 * (dx**2 + dy**2)))
        p[0, :] = 0
        p[NY10 - 1, :] = 0
        p[:, 0] = 0
        p[:, NX10 - 1] = 0
    p.flags.writeable = False  # cached: shared between tests
    return p


def poisson_state() -> xr.Dataset:
    x, y = np.linspace(0, 2, NX10), np.linspace(0, 1, NY10)
    return xr.Dataset({"p": (("y", "x"), np.zeros((NY10, NX10))),
                       "b": (("y", "x"), poisson_b())}, coords={"y": y, "x": x})


def test_step10_poisson_jacobi_matches_numpy(x64):
    dx, dy = DX10, DY10

    def jacobi(s):
        p, b = s["p"], s["b"]
        return {"p": ((p(x=1) + p(x=-1)) * dy**2 + (p(y=1) + p(y=-1)) * dx**2
                      - b() * dx**2 * dy**2) / (2 * (dx**2 + dy**2))}

    m = poisson_state().stencil.mesh(boundary="extend")
    m[...] = jacobi
    for edge in ({"y": 0}, {"y": -1}, {"x": 0}, {"x": -1}):
        m[edge] = lambda s: {"p": 0.0}
    res = xstencil.iterate(None, m, tol=None, max_steps=100)
    assert res.iterations == 100 and res.converged
    np.testing.assert_allclose(res.field["p"].values, poisson_numpy(), rtol=1e-10, atol=1e-13)
    np.testing.assert_array_equal(res.field["b"].values, poisson_b())


def laplacian_matrix(ny: int, nx: int, dy: float, dx: float) -> sp.csr_matrix:
    """The 5-point Laplacian on ny x nx interior points, zero Dirichlet ghosts."""
    def d2(n: int, h: float) -> sp.spmatrix:
        return sp.diags([np.ones(n - 1), -2 * np.ones(n), np.ones(n - 1)], [-1, 0, 1]) / h**2

    return (sp.kron(d2(ny, dy), sp.identity(nx)) + sp.kron(sp.identity(ny), d2(nx, dx))).tocsr()


# multigrid and gmres take 20-30 s here on 2 cores (tests/labelled/test_solve.py and
# tests/engine/test_multigrid.py test them in the fast run): with the slow tests
@pytest.mark.parametrize("method", [pytest.param("multigrid", marks=pytest.mark.slow), "cg",
                                    "bicgstab", pytest.param("gmres", marks=pytest.mark.slow)])
def test_step10_poisson_solve_matches_spsolve(x64, method):
    dx, dy = DX10, DY10
    rhs = poisson_state()["b"].isel(y=slice(1, -1), x=slice(1, -1))
    want = spl.spsolve(laplacian_matrix(NY10 - 2, NX10 - 2, dy, dx), rhs.values.ravel())
    lap = lambda u: (u(x=1) - 2 * u() + u(x=-1)) / dx**2 + (u(y=1) - 2 * u() + u(y=-1)) / dy**2  # noqa: E731
    res = rhs.stencil.solve(lap, method=method, tol=1e-10, boundary="fill", fill_value=0.0,
                            maxiter=5000 if method != "gmres" else 20_000)
    assert res.converged and res.residual <= 1e-10
    np.testing.assert_allclose(res.field.values.ravel(), want, rtol=1e-7,
                               atol=1e-8 * np.abs(want).max())
    assert res.field.dtype == np.float64 and res.field.coords.equals(rhs.coords)
    # the Jacobi sweeps of step 10 head to the same solution
    far = poisson_numpy(nt=20_000)[1:-1, 1:-1]
    assert np.abs(far - res.field.values).max() < 1e-3 * np.abs(want).max()


# ----------------------------------------------------------------------------------------
# step 11: cavity flow


NX, NY, NIT = 41, 41, 50
DX, DY = 2 / (NX - 1), 2 / (NY - 1)
RHO, NU, DT = 1.0, 0.1, 0.001


def build_up_b(u: np.ndarray, v: np.ndarray, dx: float, dy: float, rho: float = RHO,
               dt: float = DT) -> np.ndarray:
    b = np.zeros_like(u)
    b[1:-1, 1:-1] = (rho * (1 / dt * ((u[1:-1, 2:] - u[1:-1, 0:-2]) / (2 * dx)
                                      + (v[2:, 1:-1] - v[0:-2, 1:-1]) / (2 * dy))
                            - ((u[1:-1, 2:] - u[1:-1, 0:-2]) / (2 * dx))**2
                            - 2 * ((u[2:, 1:-1] - u[0:-2, 1:-1]) / (2 * dy)
                                   * (v[1:-1, 2:] - v[1:-1, 0:-2]) / (2 * dx))
                            - ((v[2:, 1:-1] - v[0:-2, 1:-1]) / (2 * dy))**2))
    return b


def cavity_pressure(p: np.ndarray, b: np.ndarray) -> np.ndarray:
    dx, dy = DX, DY
    for _ in range(NIT):
        pn = p.copy()
        p[1:-1, 1:-1] = (((pn[1:-1, 2:] + pn[1:-1, 0:-2]) * dy**2
                          + (pn[2:, 1:-1] + pn[0:-2, 1:-1]) * dx**2) / (2 * (dx**2 + dy**2))
                         - dx**2 * dy**2 / (2 * (dx**2 + dy**2)) * b[1:-1, 1:-1])
        p[:, -1] = p[:, -2]
        p[0, :] = p[1, :]
        p[:, 0] = p[:, 1]
        p[-1, :] = 0
    return p


def cavity_matrix() -> sp.csr_matrix:
    """The equations the ``solve`` variant's mesh operator states, row by row."""
    n = NY * NX
    k = 2 / DX**2 + 2 / DY**2
    a = sp.lil_matrix((n, n))
    idx = np.arange(n).reshape(NY, NX)
    for i in range(NY):
        for j in range(NX):
            r = idx[i, j]
            if i == NY - 1:
                a[r, r] = 1.0
            elif j == 0:
                a[r, r], a[r, idx[i, 1]] = k, -k
            elif i == 0:
                a[r, r], a[r, idx[1, j]] = k, -k
            elif j == NX - 1:
                a[r, r], a[r, idx[i, j - 1]] = k, -k
            else:
                a[r, r] = -k
                a[r, idx[i, j + 1]] = a[r, idx[i, j - 1]] = 1 / DX**2
                a[r, idx[i + 1, j]] = a[r, idx[i - 1, j]] = 1 / DY**2
    return a.tocsr()


def cavity_numpy(nt: int, exact: bool = False) -> tuple[np.ndarray, ...]:
    dx, dy, dt, rho, nu = DX, DY, DT, RHO, NU
    u, v, p = np.zeros((NY, NX)), np.zeros((NY, NX)), np.zeros((NY, NX))
    lu = spl.splu(cavity_matrix().tocsc()) if exact else None
    for _ in range(nt):
        un, vn = u.copy(), v.copy()
        b = build_up_b(u, v, dx, dy)
        p = lu.solve(b.ravel()).reshape(NY, NX) if exact else cavity_pressure(p, b)
        u[1:-1, 1:-1] = (un[1:-1, 1:-1]
                         - un[1:-1, 1:-1] * dt / dx * (un[1:-1, 1:-1] - un[1:-1, 0:-2])
                         - vn[1:-1, 1:-1] * dt / dy * (un[1:-1, 1:-1] - un[0:-2, 1:-1])
                         - dt / (2 * rho * dx) * (p[1:-1, 2:] - p[1:-1, 0:-2])
                         + nu * (dt / dx**2 * (un[1:-1, 2:] - 2 * un[1:-1, 1:-1] + un[1:-1, 0:-2])
                                 + dt / dy**2 * (un[2:, 1:-1] - 2 * un[1:-1, 1:-1]
                                                 + un[0:-2, 1:-1])))
        v[1:-1, 1:-1] = (vn[1:-1, 1:-1]
                         - un[1:-1, 1:-1] * dt / dx * (vn[1:-1, 1:-1] - vn[1:-1, 0:-2])
                         - vn[1:-1, 1:-1] * dt / dy * (vn[1:-1, 1:-1] - vn[0:-2, 1:-1])
                         - dt / (2 * rho * dy) * (p[2:, 1:-1] - p[0:-2, 1:-1])
                         + nu * (dt / dx**2 * (vn[1:-1, 2:] - 2 * vn[1:-1, 1:-1] + vn[1:-1, 0:-2])
                                 + dt / dy**2 * (vn[2:, 1:-1] - 2 * vn[1:-1, 1:-1]
                                                 + vn[0:-2, 1:-1])))
        u[0, :] = 0
        u[:, 0] = 0
        u[:, -1] = 0
        u[-1, :] = 1
        v[0, :] = 0
        v[-1, :] = 0
        v[:, 0] = 0
        v[:, -1] = 0
    return u, v, p


def b_kernel(s, dx=DX, dy=DY, rho=RHO, dt=DT):
    u, v = s["u"], s["v"]
    dudx = (u(x=1) - u(x=-1)) / (2 * dx)
    dvdy = (v(y=1) - v(y=-1)) / (2 * dy)
    return (rho * (1 / dt * (dudx + dvdy) - dudx**2
                   - 2 * ((u(y=1) - u(y=-1)) / (2 * dy) * (v(x=1) - v(x=-1)) / (2 * dx))
                   - dvdy**2))


def jacobi(s, oy=0, ox=0, dx=DX, dy=DY):
    """The pressure Jacobi update, evaluated ``(oy, ox)`` cells away."""
    p, b = s["p"], s["b"]
    return {"p": ((p(y=oy, x=ox + 1) + p(y=oy, x=ox - 1)) * dy**2
                  + (p(y=oy + 1, x=ox) + p(y=oy - 1, x=ox)) * dx**2) / (2 * (dx**2 + dy**2))
            - dx**2 * dy**2 / (2 * (dx**2 + dy**2)) * b(y=oy, x=ox)}


def momentum(s, dx=DX, dy=DY, dt=DT, rho=RHO, nu=NU, force=0.0):
    u, v, p = s["u"], s["v"], s["p"]

    def lap(w):
        return (dt / dx**2 * (w(x=1) - 2 * w() + w(x=-1))
                + dt / dy**2 * (w(y=1) - 2 * w() + w(y=-1)))

    return {"u": (u() - u() * dt / dx * (u() - u(x=-1)) - v() * dt / dy * (u() - u(y=-1))
                  - dt / (2 * rho * dx) * (p(x=1) - p(x=-1)) + nu * lap(u) + force * dt),
            "v": (v() - u() * dt / dx * (v() - v(x=-1)) - v() * dt / dy * (v() - v(y=-1))
                  - dt / (2 * rho * dy) * (p(y=1) - p(y=-1)) + nu * lap(v))}


def edges_zero(obj, kernel, boundary):
    """``kernel`` inside, 0 on the four edges (the originals fill only ``[1:-1, 1:-1]``)."""
    m = obj.stencil.mesh(boundary=boundary)
    m[...] = kernel
    for edge in ({"y": 0}, {"y": -1}):
        m[edge] = lambda s: 0.0
    if boundary == "extend":
        for edge in ({"x": 0}, {"x": -1}):
            m[edge] = lambda s: 0.0
    return m.map()


def cavity_pressure_mesh(pb: xr.Dataset):
    """The Jacobi sweep of ``cavity_pressure``, boundary order included."""
    m = pb.stencil.mesh(boundary="extend")
    m[...] = jacobi
    m[{"x": -1}] = lambda s: jacobi(s, 0, -1)        # p[:, -1] = p[:, -2]
    m[{"y": 0}] = lambda s: jacobi(s, 1, 0)          # p[0, :] = p[1, :]
    m[{"y": 0, "x": -1}] = lambda s: jacobi(s, 1, -1)
    m[{"x": 0}] = lambda s: jacobi(s, 0, 1)          # p[:, 0] = p[:, 1]
    m[{"y": 0, "x": 0}] = lambda s: jacobi(s, 1, 1)
    m[{"y": -1}] = lambda s: {"p": 0.0}              # p[-1, :] = 0
    return m


def cavity_velocity(s: xr.Dataset) -> xr.Dataset:
    m = s.stencil.mesh(boundary="extend")
    m[...] = momentum
    for edge in ({"y": 0}, {"x": 0}, {"x": -1}):
        m[edge] = lambda w: {"u": 0.0, "v": 0.0}
    m[{"y": -1}] = lambda w: {"u": 1.0, "v": 0.0}    # the lid
    return m.map()


def cavity_step_iterate(s: xr.Dataset) -> xr.Dataset:
    b = edges_zero(s[["u", "v"]], b_kernel, "extend")
    pb = xr.Dataset({"p": s["p"], "b": b})
    p = xstencil.iterate(None, cavity_pressure_mesh(pb), tol=None, max_steps=NIT).field["p"]
    new = cavity_velocity(s.assign(p=p))
    return new.assign(p=p)


def cavity_operator(p: xr.DataArray):
    """The pressure equations as a mesh: the Laplacian inside, boundary rows
    (scaled like the diagonal) on the edges."""
    k = 2 / DX**2 + 2 / DY**2
    m = p.stencil.mesh(boundary="extend")
    m[...] = lambda u: (u(x=1) - 2 * u() + u(x=-1)) / DX**2 + (u(y=1) - 2 * u() + u(y=-1)) / DY**2
    m[{"x": -1}] = lambda u: k * (u() - u(x=-1))
    m[{"y": 0}] = lambda u: k * (u() - u(y=1))
    m[{"x": 0}] = lambda u: k * (u() - u(x=1))
    m[{"y": -1}] = lambda u: u()
    return m


def cavity_step_solve(s: xr.Dataset) -> xr.Dataset:
    b = edges_zero(s[["u", "v"]], b_kernel, "extend")
    p = xstencil.solve(cavity_operator(s["p"]), b, method="bicgstab", tol=1e-11,
                       x0=s["p"], maxiter=2000).field
    new = cavity_velocity(s.assign(p=p))
    return new.assign(p=p)


def cavity_state() -> xr.Dataset:
    x, y = np.linspace(0, 2, NX), np.linspace(0, 2, NY)
    z = np.zeros((NY, NX))
    return xr.Dataset({"u": (("y", "x"), z), "v": (("y", "x"), z), "p": (("y", "x"), z)},
                      coords={"y": y, "x": x})


def test_step11_cavity_iterate_matches_numpy(x64):
    nt = 100
    u, v, p = cavity_numpy(nt)
    out = cavity_state().stencil.scan(step=cavity_step_iterate, dim="time", steps=nt,
                                      dt=DT, save_every="last")
    for name, want in (("u", u), ("v", v), ("p", p)):
        np.testing.assert_allclose(out[name].values, want, rtol=1e-9, atol=1e-11)
    assert float(np.abs(out["u"]).max()) == 1.0 and float(np.abs(p).max()) > 0.1


def test_step11_cavity_solve_matches_numpy(x64):
    nt = 30
    u, v, p = cavity_numpy(nt, exact=True)
    out = cavity_state().stencil.scan(step=cavity_step_solve, dim="time", steps=nt,
                                      dt=DT, save_every="last")
    for name, want in (("u", u), ("v", v), ("p", p)):
        np.testing.assert_allclose(out[name].values, want, rtol=1e-6,
                                   atol=1e-8 * np.abs(want).max())


# ----------------------------------------------------------------------------------------
# step 12: channel flow, periodic in x, until the change of sum(u) < 0.001

NX12 = NY12 = 41
DX12 = DY12 = 2 / (NX12 - 1)
DT12, F12 = 0.01, 1.0


def channel_numpy(target: float = 0.001) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    dx, dy, dt, rho, nu, force = DX12, DY12, DT12, RHO, NU, F12

    def xp(a):  # a[:, j + 1], periodic
        return np.roll(a, -1, axis=1)

    def xm(a):  # a[:, j - 1], periodic
        return np.roll(a, 1, axis=1)

    u, v, p = np.zeros((NY12, NX12)), np.zeros((NY12, NX12)), np.ones((NY12, NX12))
    udiff, n = 1.0, 0
    while udiff > target:
        un, vn = u.copy(), v.copy()
        b = np.zeros_like(u)
        b[1:-1] = (rho * (1 / dt * ((xp(u) - xm(u))[1:-1] / (2 * dx)
                                    + (v[2:] - v[:-2]) / (2 * dy))
                          - ((xp(u) - xm(u))[1:-1] / (2 * dx))**2
                          - 2 * ((u[2:] - u[:-2]) / (2 * dy) * (xp(v) - xm(v))[1:-1] / (2 * dx))
                          - ((v[2:] - v[:-2]) / (2 * dy))**2))
        for _ in range(NIT):
            pn = p.copy()
            p[1:-1] = (((xp(pn) + xm(pn))[1:-1] * dy**2 + (pn[2:] + pn[:-2]) * dx**2)
                       / (2 * (dx**2 + dy**2))
                       - dx**2 * dy**2 / (2 * (dx**2 + dy**2)) * b[1:-1])
            p[-1, :] = p[-2, :]
            p[0, :] = p[1, :]
        u[1:-1] = (un - un * dt / dx * (un - xm(un)) - vn * dt / dy * (un - np.roll(un, 1, 0))
                   - dt / (2 * rho * dx) * (xp(p) - xm(p))
                   + nu * (dt / dx**2 * (xp(un) - 2 * un + xm(un))
                           + dt / dy**2 * (np.roll(un, -1, 0) - 2 * un + np.roll(un, 1, 0)))
                   + force * dt)[1:-1]
        v[1:-1] = (vn - un * dt / dx * (vn - xm(vn)) - vn * dt / dy * (vn - np.roll(vn, 1, 0))
                   - dt / (2 * rho * dy) * (np.roll(p, -1, 0) - np.roll(p, 1, 0))
                   + nu * (dt / dx**2 * (xp(vn) - 2 * vn + xm(vn))
                           + dt / dy**2 * (np.roll(vn, -1, 0) - 2 * vn + np.roll(vn, 1, 0))))[1:-1]
        u[0, :] = u[-1, :] = 0
        v[0, :] = v[-1, :] = 0
        udiff = (np.sum(u) - np.sum(un)) / np.sum(u)
        n += 1
    return u, v, p, n


def channel_step(s: xr.Dataset) -> xr.Dataset:
    bnd = {"x": "periodic", "y": "extend"}
    kw = {"dx": DX12, "dy": DY12}
    b = edges_zero(s[["u", "v"]], lambda w: b_kernel(w, dt=DT12, **kw), bnd)
    m = xr.Dataset({"p": s["p"], "b": b}).stencil.mesh(boundary=bnd)
    m[...] = lambda w: jacobi(w, **kw)
    m[{"y": -1}] = lambda w: jacobi(w, -1, 0, **kw)  # p[-1, :] = p[-2, :]
    m[{"y": 0}] = lambda w: jacobi(w, 1, 0, **kw)    # p[0, :] = p[1, :]
    p = xstencil.iterate(None, m, tol=None, max_steps=NIT).field["p"]
    mv = s.assign(p=p).stencil.mesh(boundary=bnd)
    mv[...] = lambda w: momentum(w, dt=DT12, force=F12, **kw)
    for edge in ({"y": 0}, {"y": -1}):
        mv[edge] = lambda w: {"u": 0.0, "v": 0.0}
    return mv.map().assign(p=p)


def udiff(new, old):
    return (new["u"].sum() - old["u"].sum()) / new["u"].sum()


def test_step12_channel_matches_numpy(x64):
    u, v, p, n = channel_numpy()
    x, y = np.linspace(0, 2, NX12), np.linspace(0, 2, NY12)
    z = np.zeros((NY12, NX12))
    s0 = xr.Dataset({"u": (("y", "x"), z), "v": (("y", "x"), z),
                     "p": (("y", "x"), np.ones_like(z))}, coords={"y": y, "x": x})
    res = xstencil.iterate(s0, step=channel_step, tol=0.001, norm=udiff, max_steps=5000)
    assert res.converged and res.iterations == n
    for name, want in (("u", u), ("v", v), ("p", p)):
        np.testing.assert_allclose(res.field[name].values, want, rtol=1e-8, atol=1e-10)
    # the flow is uniform along the periodic direction and driven by the force
    assert np.abs(res.field["u"].values - res.field["u"].values[:, :1]).max() < 1e-8
    assert float(res.field["u"].max()) > 0.5

"""
CFD Python step 11: lid-driven cavity flow
==========================================

Step 11 of *12 steps to Navier-Stokes*: a square cavity whose lid moves at
``u = 1``. Each time step builds the source ``b`` of the pressure Poisson
equation from the velocity, solves for the pressure, and advances the
velocity. The whole time loop is one ``scan(step=...)``; the pressure solve
inside it is written twice:

* as in the original, 50 Jacobi sweeps of a function mesh whose boundary rows
  are the original's (``dp/dx = 0`` at ``x = 0, 2``, ``dp/dy = 0`` at
  ``y = 0``, ``p = 0`` on the lid) with :func:`xstencil.iterate`;
* solved to a tolerance by :func:`xstencil.solve`, with a mesh as the
  operator: the Laplacian inside and the boundary conditions as rows.

Both match their numpy originals in ``tests/contract/test_cfd_python.py``.
"""

import os

import matplotlib.pyplot as plt
import numpy as np
import xarray as xr

import xstencil

SMALL = os.environ.get("XSTENCIL_GALLERY_SMALL", "") not in ("", "0")
n, nt = (21, 30) if SMALL else (41, 300)
nit, rho, nu, dt = 50, 1.0, 0.1, 0.001
dx = dy = 2 / (n - 1)


def source(s):
    """The right-hand side b of the pressure Poisson equation."""
    u, v = s["u"], s["v"]
    dudx, dvdy = (u(x=1) - u(x=-1)) / (2 * dx), (v(y=1) - v(y=-1)) / (2 * dy)
    return rho * (1 / dt * (dudx + dvdy) - dudx**2
                  - 2 * (u(y=1) - u(y=-1)) / (2 * dy) * (v(x=1) - v(x=-1)) / (2 * dx)
                  - dvdy**2)


def jacobi(s, oy=0, ox=0):
    """One Jacobi update of p, evaluated (oy, ox) cells away."""
    p, b = s["p"], s["b"]
    return {"p": ((p(y=oy, x=ox + 1) + p(y=oy, x=ox - 1)) * dy**2
                  + (p(y=oy + 1, x=ox) + p(y=oy - 1, x=ox)) * dx**2) / (2 * (dx**2 + dy**2))
            - dx**2 * dy**2 / (2 * (dx**2 + dy**2)) * b(y=oy, x=ox)}


def momentum(s):
    u, v, p = s["u"], s["v"], s["p"]

    def diffusion(w):
        return nu * (dt / dx**2 * (w(x=1) - 2 * w() + w(x=-1))
                     + dt / dy**2 * (w(y=1) - 2 * w() + w(y=-1)))

    return {"u": u() - u() * dt / dx * (u() - u(x=-1)) - v() * dt / dy * (u() - u(y=-1))
            - dt / (2 * rho * dx) * (p(x=1) - p(x=-1)) + diffusion(u),
            "v": v() - u() * dt / dx * (v() - v(x=-1)) - v() * dt / dy * (v() - v(y=-1))
            - dt / (2 * rho * dy) * (p(y=1) - p(y=-1)) + diffusion(v)}


def rhs_of(s):
    m = s[["u", "v"]].stencil.mesh(boundary="extend")
    m[...] = source
    for edge in ({"y": 0}, {"y": -1}, {"x": 0}, {"x": -1}):
        m[edge] = lambda w: 0.0
    return m.map()


def advance(s, p):
    m = s.assign(p=p).stencil.mesh(boundary="extend")
    m[...] = momentum
    for edge in ({"y": 0}, {"x": 0}, {"x": -1}):
        m[edge] = lambda w: {"u": 0.0, "v": 0.0}
    m[{"y": -1}] = lambda w: {"u": 1.0, "v": 0.0}  # the lid
    return m.map().assign(p=p)


# %%
# The pressure by 50 Jacobi sweeps per step, boundary rows in the original's order.
def step_jacobi(s):
    m = xr.Dataset({"p": s["p"], "b": rhs_of(s)}).stencil.mesh(boundary="extend")
    m[...] = jacobi
    m[{"x": -1}] = lambda w: jacobi(w, 0, -1)
    m[{"y": 0}] = lambda w: jacobi(w, 1, 0)
    m[{"y": 0, "x": -1}] = lambda w: jacobi(w, 1, -1)
    m[{"x": 0}] = lambda w: jacobi(w, 0, 1)
    m[{"y": 0, "x": 0}] = lambda w: jacobi(w, 1, 1)
    m[{"y": -1}] = lambda w: {"p": 0.0}
    return advance(s, xstencil.iterate(None, m, tol=None, max_steps=nit).field["p"])


# %%
# The pressure solved to a tolerance: the boundary conditions are rows of the operator.
def step_solve(s):
    k = 2 / dx**2 + 2 / dy**2
    m = s["p"].stencil.mesh(boundary="extend")
    m[...] = lambda u: (u(x=1) - 2 * u() + u(x=-1)) / dx**2 + (u(y=1) - 2 * u() + u(y=-1)) / dy**2
    m[{"x": -1}] = lambda u: k * (u() - u(x=-1))
    m[{"y": 0}] = lambda u: k * (u() - u(y=1))
    m[{"x": 0}] = lambda u: k * (u() - u(x=1))
    m[{"y": -1}] = lambda u: u()
    p = xstencil.solve(m, rhs_of(s), method="bicgstab", tol=1e-8, x0=s["p"]).field
    return advance(s, p)


x = np.linspace(0, 2, n)
zero = np.zeros((n, n))
s0 = xr.Dataset({"u": (("y", "x"), zero), "v": (("y", "x"), zero), "p": (("y", "x"), zero)},
                coords={"y": x, "x": x})
by_jacobi = s0.stencil.scan(step=step_jacobi, dim="time", steps=nt, dt=dt, save_every="last")
by_solve = s0.stencil.scan(step=step_solve, dim="time", steps=nt, dt=dt, save_every="last")
print("max |u(Jacobi) - u(solve)|:", float(abs(by_jacobi["u"] - by_solve["u"]).max()))

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharey=True)
for ax, out, title in ((axes[0], by_jacobi, "pressure by 50 Jacobi sweeps (iterate)"),
                       (axes[1], by_solve, "pressure solved (solve, bicgstab)")):
    out["p"].plot.contourf(ax=ax, levels=20, cmap="viridis")
    q = slice(None, None, 2)
    ax.quiver(x[q], x[q], out["u"].values[q, q], out["v"].values[q, q])
    ax.set_title(title)
plt.show()

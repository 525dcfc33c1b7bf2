"""
CFD Python step 12: channel flow, periodic in x
===============================================

Step 12 of *12 steps to Navier-Stokes*: flow between two walls driven by a
uniform force ``F``, periodic in ``x``. The original repeats time steps
until the relative change of ``sum(u)`` falls below 0.001.

Here ``boundary={"x": "periodic", "y": "extend"}`` wraps the channel, mesh
rows give the walls, and the time loop itself is
:func:`xstencil.iterate` with ``step=`` (a function of the state, as for
``scan(step=...)``) and a callable norm: the loop stops on the device when
the flow is steady. Inside each step, the pressure takes 50 Jacobi sweeps
of another ``iterate``.
"""

import os

import matplotlib.pyplot as plt
import numpy as np
import xarray as xr

import xstencil

SMALL = os.environ.get("XSTENCIL_GALLERY_SMALL", "") not in ("", "0")
n = 21 if SMALL else 41
nit, rho, nu, force, dt = 50, 1.0, 0.1, 1.0, 0.01
dx = dy = 2 / (n - 1)
periodic_x = {"x": "periodic", "y": "extend"}


def source(s):
    u, v = s["u"], s["v"]
    dudx, dvdy = (u(x=1) - u(x=-1)) / (2 * dx), (v(y=1) - v(y=-1)) / (2 * dy)
    return rho * (1 / dt * (dudx + dvdy) - dudx**2
                  - 2 * (u(y=1) - u(y=-1)) / (2 * dy) * (v(x=1) - v(x=-1)) / (2 * dx)
                  - dvdy**2)


def jacobi(s, oy=0):
    p, b = s["p"], s["b"]
    return {"p": ((p(y=oy, x=1) + p(y=oy, x=-1)) * dy**2
                  + (p(y=oy + 1) + p(y=oy - 1)) * dx**2) / (2 * (dx**2 + dy**2))
            - dx**2 * dy**2 / (2 * (dx**2 + dy**2)) * b(y=oy)}


def momentum(s):
    u, v, p = s["u"], s["v"], s["p"]

    def diffusion(w):
        return nu * (dt / dx**2 * (w(x=1) - 2 * w() + w(x=-1))
                     + dt / dy**2 * (w(y=1) - 2 * w() + w(y=-1)))

    return {"u": u() - u() * dt / dx * (u() - u(x=-1)) - v() * dt / dy * (u() - u(y=-1))
            - dt / (2 * rho * dx) * (p(x=1) - p(x=-1)) + diffusion(u) + force * dt,
            "v": v() - u() * dt / dx * (v() - v(x=-1)) - v() * dt / dy * (v() - v(y=-1))
            - dt / (2 * rho * dy) * (p(y=1) - p(y=-1)) + diffusion(v)}


def step(s):
    mb = s[["u", "v"]].stencil.mesh(boundary=periodic_x)
    mb[...] = source
    mb[{"y": 0}] = mb[{"y": -1}] = lambda w: 0.0
    mp = xr.Dataset({"p": s["p"], "b": mb.map()}).stencil.mesh(boundary=periodic_x)
    mp[...] = jacobi
    mp[{"y": -1}] = lambda w: jacobi(w, -1)  # dp/dy = 0: copy the new row inside
    mp[{"y": 0}] = lambda w: jacobi(w, 1)
    p = xstencil.iterate(None, mp, tol=None, max_steps=nit).field["p"]
    mv = s.assign(p=p).stencil.mesh(boundary=periodic_x)
    mv[...] = momentum
    mv[{"y": 0}] = mv[{"y": -1}] = lambda w: {"u": 0.0, "v": 0.0}
    return mv.map().assign(p=p)


def udiff(new, old):
    return (new["u"].sum() - old["u"].sum()) / new["u"].sum()


x = np.linspace(0, 2, n)
zero = np.zeros((n, n))
s0 = xr.Dataset({"u": (("y", "x"), zero), "v": (("y", "x"), zero),
                 "p": (("y", "x"), np.ones((n, n)))}, coords={"y": x, "x": x})
res = xstencil.iterate(s0, step=step, tol=0.001, norm=udiff, max_steps=5000)
print(f"steady after {res.iterations} steps (change of sum(u): {res.residual:.1e})")

# %%
# The steady profile is the parabola of plane Poiseuille flow.
fig, axes = plt.subplots(1, 2, figsize=(11, 4))
q = slice(None, None, 2)
axes[0].quiver(x[q], x[q], res.field["u"].values[q, q], res.field["v"].values[q, q])
axes[0].set(title=f"velocity after {res.iterations} steps", xlabel="x", ylabel="y")
res.field["u"].isel(x=n // 2).plot(ax=axes[1], y="y")
axes[1].set_title("u across the channel")
plt.show()

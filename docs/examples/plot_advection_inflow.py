"""
Advection with an inflow region
===============================

1-D linear advection ``u_t + c u_x = 0`` with the first-order upwind scheme.
The inflow region, the cells with ``x <= 0.05``, is picked by label and set by
a kernel that reads the **time coordinate** (``u.coord("time")``), so the
boundary condition changes in time: a train of pulses enters on the left and
travels to the right. The upwind kernel only reads ``x=-1``, so the right edge
is a free outflow.
"""

import os

import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import xarray as xr

import xstencil  # noqa: F401

SMALL = os.environ.get("XSTENCIL_GALLERY_SMALL", "") not in ("", "0")
n = 50 if SMALL else 300
c = 1.0
x = np.linspace(0.0, 1.0, n)
dx = float(x[1] - x[0])
dt = 0.8 * dx / c  # Courant number 0.8
C = c * dt / dx

u0 = xr.DataArray(np.zeros(n, dtype=np.float32), dims="x",
                  coords={"x": ("x", x, {"units": "m"})}, name="u",
                  attrs={"long_name": "concentration", "units": "g/L"})


def upwind(u):
    return u(time=-1) - C * (u(time=-1) - u(time=-1, x=-1))


def inflow(u):
    t = u.coord("time")()
    pulse = jnp.sin(2 * jnp.pi * t / 0.5) ** 2
    return jnp.where(t % 1.0 < 0.5, pulse, 0.0).astype(u.dtype)


m = u0.stencil.mesh(boundary="extend")
m[...] = upwind
m.loc[{"x": slice(None, 0.05)}] = inflow  # label slices are inclusive

steps = int(2.0 / dt)
traj = m.scan(dim="time", steps=steps, dt=dt)
traj["time"].attrs["units"] = "s"

# %%
# A Hovmöller diagram: each pulse is a band moving right at speed ``c``. The
# upwind scheme smears it a little as it goes (numerical diffusion).
fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(11, 4), layout="constrained")
traj.plot(x="x", y="time", ax=ax0, cmap="viridis")
ax0.set_title("u(x, t)")
traj.isel(time=-1).plot(ax=ax1)
ax1.set_title(f"t = {float(traj.time[-1]):.2f} s")

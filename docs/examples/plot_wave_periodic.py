"""
2-D wave equation, periodic
===========================

The wave equation ``u_tt = c^2 (u_xx + u_yy)`` with leapfrog time stepping on a
doubly periodic square. Leapfrog needs two time levels, so the kernel reads
``u(time=-1)`` and ``u(time=-2)``, and the input holds the first two slices.
The second slice comes from a Taylor step computed with ``stencil.map``.
"""

import os

import numpy as np
import xarray as xr

import xstencil  # noqa: F401

SMALL = os.environ.get("XSTENCIL_GALLERY_SMALL", "") not in ("", "0")
n = 48 if SMALL else 256
c = 1.0
dx = 1.0 / n
dt = 0.5 * dx / c  # below the 2-D limit dx / (c sqrt 2)
C2 = (c * dt / dx) ** 2

x = np.arange(n) * dx
X, Y = np.meshgrid(x, x)
u0 = np.exp(-((X - 0.5) ** 2 + (Y - 0.5) ** 2) / 0.003) - 0.6 * np.exp(
    -((X - 0.25) ** 2 + (Y - 0.7) ** 2) / 0.001)
u0 = xr.DataArray(
    u0.astype(np.float32),
    dims=("y", "x"),
    coords={"y": ("y", x, {"units": "m"}), "x": ("x", x, {"units": "m"})},
    name="u",
    attrs={"long_name": "displacement", "units": "mm"},
)

# %%
# A map gives the Laplacian for the first step: starting at rest,
# ``u(dt) = u(0) + C^2 / 2 * lap(u(0))``.
lap0 = u0.stencil.map(lambda u: u(x=1) + u(x=-1) + u(y=1) + u(y=-1) - 4 * u(),
                      boundary="periodic")
u1 = u0 + 0.5 * C2 * lap0
U = xr.concat([u0, u1], dim=xr.DataArray([0.0, dt], dims="time", name="time"))


def leapfrog(u):
    lap = (u(time=-1, x=1) + u(time=-1, x=-1) + u(time=-1, y=1) + u(time=-1, y=-1)
           - 4 * u(time=-1))
    return 2 * u(time=-1) - u(time=-2) + C2 * lap


steps = 3 * int(0.6 / dt / 3)
traj = U.stencil.scan(leapfrog, dim="time", steps=steps, dt=dt,
                      boundary={"x": "periodic", "y": "periodic"}, save_every=steps // 3)
traj["time"].attrs["units"] = "s"

# %%
# Waves leaving through one edge come back through the opposite one. The
# trajectory starts with the two initial positions; drop the second.
snaps = traj.drop_isel(time=1)
snaps["time"] = snaps.time.round(2)
g = snaps.plot(col="time", cmap="RdBu_r", vmin=-0.3, vmax=0.3, size=3, aspect=1)
for ax, t in zip(g.axs.flat, snaps.time.values, strict=True):
    ax.set_aspect("equal")
    ax.set_title(f"t = {t:.2f} s")

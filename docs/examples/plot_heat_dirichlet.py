"""
Heat equation with walls set by label
=====================================

A plate 2 m wide and 1 m high. The left wall (``x = 0``) is held at 100 °C and
the right wall (``x = 2``) at 0 °C. Both walls are picked by coordinate
**label** with a function mesh, ``m.loc[{"x": 0.0}] = ...``, so the same code
runs at any resolution. The top and bottom walls are insulated:
``boundary="extend"`` repeats the edge value, which is a zero normal gradient.

The heat equation is stepped with explicit Euler in one compiled scan along a
new ``time`` dim. The steady state is the straight line
``T = 100 (1 - x / 2)``.
"""

import os

import matplotlib.pyplot as plt
import numpy as np
import xarray as xr

import xstencil  # noqa: F401  (registers the .stencil accessor)

SMALL = os.environ.get("XSTENCIL_GALLERY_SMALL", "") not in ("", "0")
ny, nx = (12, 24) if SMALL else (50, 100)

x = np.linspace(0.0, 2.0, nx)
y = np.linspace(0.0, 1.0, ny)
T0 = xr.DataArray(
    np.zeros((ny, nx), dtype=np.float32),
    dims=("y", "x"),
    coords={"y": ("y", y, {"units": "m"}), "x": ("x", x, {"units": "m"})},
    name="T",
    attrs={"units": "°C", "long_name": "temperature"},
)

# %%
# The kernel reads the previous time level, ``u(time=-1, ...)``; offsets along
# the scanned dim that are negative see values already computed.
kappa = 0.05  # m^2/s
dx = float(x[1] - x[0])
dt = 0.2 * dx**2 / kappa  # the explicit limit in 2-D is 0.25 dx^2 / kappa
r = kappa * dt / dx**2


def diffuse(u):
    lap = (u(time=-1, x=1) + u(time=-1, x=-1) + u(time=-1, y=1) + u(time=-1, y=-1)
           - 4 * u(time=-1))
    return u(time=-1) + r * lap


m = T0.stencil.mesh(boundary="extend")
m[...] = diffuse
m.loc[{"x": 0.0}] = lambda u: 100.0  # a Dirichlet wall, by label
m.loc[{"x": 2.0}] = lambda u: 0.0

# three e-folding times of the slowest mode, in a multiple of the 6 saved intervals
steps = 6 * int(3 * 4.0 / (np.pi**2 * kappa) / dt / 6)
traj = m.scan(dim="time", steps=steps, dt=dt, save_every=steps // 6)
traj["time"].attrs["units"] = "s"
print(f"{steps} steps of {dt:.3g} s on a {ny} x {nx} grid")

# %%
# The final field, and the profile along the middle of the plate approaching
# the analytic steady state.
fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(11, 3.8), layout="constrained")
traj.isel(time=-1).plot(ax=ax0, cmap="magma", vmin=0, vmax=100)
ax0.set_aspect("equal")
ax0.set_title(f"t = {float(traj.time[-1]):.0f} s")
mid = traj.sel(y=0.5, method="nearest")
mid["time"] = mid.time.round(0)
lines = mid.plot.line(x="x", hue="time", ax=ax1, add_legend=False)
for line, t in zip(lines, mid.time.values, strict=True):
    line.set_label(f"t = {t:.0f} s")
ax1.plot(x, 100 * (1 - x / 2), "k--", label="steady state")
ax1.set_title("profile at y = 0.5 m")
ax1.legend(loc="upper right", fontsize="small")

"""
Shallow water: three coupled fields
===================================

The linearised rotating shallow-water equations on a doubly periodic square,

.. math::

   u_t = f v - g h_x, \\qquad v_t = -f u - g h_y, \\qquad h_t = -H (u_x + v_y),

held in one :class:`xarray.Dataset` with variables ``u``, ``v`` and ``h``. The
kernel receives all three windows (``s["h"]``, ...) and returns a dict, so the
scan returns a Dataset. A bump in the surface height splits into gravity waves
that radiate away and a balanced (geostrophic) vortex that stays: the classic
geostrophic adjustment problem.

Time stepping is leapfrog, which reads two earlier levels. The first step is a
forward Euler step computed with ``ds.stencil.map`` on the initial Dataset.
"""

import os

import matplotlib.pyplot as plt
import numpy as np
import xarray as xr

import xstencil  # noqa: F401

SMALL = os.environ.get("XSTENCIL_GALLERY_SMALL", "") not in ("", "0")
n = 32 if SMALL else 128
L = 2.0e6  # m
g, H, f = 9.81, 100.0, 1.0e-4  # gravity, mean depth, Coriolis parameter
dx = L / n
dt = 0.25 * dx / np.sqrt(g * H)

x = (np.arange(n) - n / 2) * dx
X, Y = np.meshgrid(x, x)
h0 = np.exp(-(X**2 + Y**2) / (2 * (L / 12) ** 2)).astype(np.float32)
coords = {"y": ("y", x / 1e3, {"units": "km"}), "x": ("x", x / 1e3, {"units": "km"})}
state0 = xr.Dataset(
    {
        "u": (("y", "x"), np.zeros_like(h0), {"units": "m/s"}),
        "v": (("y", "x"), np.zeros_like(h0), {"units": "m/s"}),
        "h": (("y", "x"), h0, {"units": "m", "long_name": "surface height"}),
    },
    coords=coords,
)

# %%
# One set of tendencies serves both the map (no time dim, ``lag=None``) and the
# scan (read the previous level, ``lag=-1``).


def tendencies(s, lag=None):
    def at(w, **off):
        return w(**off) if lag is None else w(time=lag, **off)

    def ddx(w):
        return (at(w, x=1) - at(w, x=-1)) / (2 * dx)

    def ddy(w):
        return (at(w, y=1) - at(w, y=-1)) / (2 * dx)

    u, v, h = s["u"], s["v"], s["h"]
    return {
        "u": f * at(v) - g * ddx(h),
        "v": -f * at(u) - g * ddy(h),
        "h": -H * (ddx(u) + ddy(v)),
    }


tend0 = state0.stencil.map(tendencies, boundary="periodic")
state1 = state0 + dt * tend0
start = xr.concat([state0, state1], dim=xr.DataArray([0.0, dt], dims="time", name="time"))


def leapfrog(s):
    tend = tendencies(s, lag=-1)
    return {k: s[k](time=-2) + 2 * dt * tend[k] for k in ("u", "v", "h")}


hours = 8 if SMALL else 30
nsave = 12 if SMALL else 60  # saved snapshots
steps = nsave * max(1, int(hours * 3600 / dt / nsave))
traj = start.stencil.scan(leapfrog, dim="time", steps=steps, dt=dt,
                          boundary={"x": "periodic", "y": "periodic"},
                          save_every=steps // nsave)
traj["time"] = traj.time / 3600
traj["time"].attrs["units"] = "h"

# %%
# Surface height at four times, and how well the discrete scheme keeps the
# total mass (the centred differences conserve it to rounding).
picks = np.linspace(0, traj.sizes["time"] - 1, 4).round().astype(int)
snap = traj.h.isel(time=picks)
snap["time"] = snap.time.round(1)
fg = snap.plot(col="time", col_wrap=2, cmap="RdBu_r", vmin=-0.6, vmax=0.6, size=3.2,
               aspect=1)
for ax, t in zip(fg.axs.flat, snap.time.values, strict=True):
    ax.set_aspect("equal")
    ax.set_title(f"t = {t:.1f} h")

mass = traj.h.as_numpy().astype("float64").sum(("x", "y")) * dx**2
drift = mass / mass[0] - 1
drift.attrs = {"long_name": "relative change of total mass"}
plt.figure(figsize=(6, 3), layout="constrained")
drift.plot(marker=".")
plt.gca().ticklabel_format(axis="y", useOffset=False, style="sci", scilimits=(0, 0))
plt.title(f"total mass: max relative change {float(abs(drift).max()):.1e}")

"""
Shallow water on a C-grid: a periodic channel between walls
============================================================

The nonlinear rotating shallow-water equations in flux form,

.. math::

   h_t + (h u)_x + (h v)_y = 0, \\qquad u_t = f \\bar v - g h_x, \\qquad
   v_t = -f \\bar u - g h_y,

on an Arakawa C-grid, the staggering of ocean models and of xgcm: the height
``h`` at cell centres, ``u`` on the x faces (``x_g``, half a cell left of the
centres), ``v`` on the y faces. The channel is periodic in x and closed by
walls in y: ``v`` is zero on the southern face ``y_g = 0``, set by coordinate
label with a mesh, and beyond the northern edge, by the grid's ``fill``
padding.

Kernels read by **axis name in cells from the output point**: at a centre,
``s.u(X=0.5)`` is the east face and ``s.u(X=-0.5)`` the west face; at a u
point, ``s.h(X=0.5) - s.h(X=-0.5)`` is the difference of the two cells the
face separates. xstencil turns each read into the right index of each
variable's own dim, whatever its position.

Time stepping is forward-backward: ``h`` steps forward with the old
velocities, ``u`` with the new ``h``, and ``v`` with the new ``h`` and the new
``u``. Written as a ``step=`` function of the state, the scan compiles the
three maps into one loop. The flux form conserves mass to round-off.
"""

import os

import jax
import matplotlib.pyplot as plt
import numpy as np
import xarray as xr

import xstencil  # noqa: F401

SMALL = os.environ.get("XSTENCIL_GALLERY_SMALL", "") not in ("", "0")
nx, ny = (48, 24) if SMALL else (192, 96)
steps = 200 if SMALL else 1500
L = 4.0e6  # channel length, m
dx = L / nx
g, H, f = 9.81, 500.0, 1.0e-4
dt = 0.3 * dx / np.sqrt(g * H)

# %%
# The Dataset carries xgcm's names: ``x_c``/``y_c`` at centres, ``x_g``/``y_g``
# on the faces to the left. The grid is the same mapping xgcm's ``coords=``
# takes (an ``xgcm.Grid`` works as well).

x_g, y_g = np.arange(nx) * dx, np.arange(ny) * dx
x_c, y_c = x_g + dx / 2, y_g + dx / 2
X, Y = np.meshgrid(x_c, y_c)
h0 = H + 20.0 * np.exp(-((X - L / 4) ** 2 + (Y - ny * dx / 2) ** 2) / (2 * (6 * dx) ** 2))
state0 = xr.Dataset(
    {"u": (("y_c", "x_g"), np.zeros((ny, nx)), {"units": "m/s"}),
     "v": (("y_g", "x_c"), np.zeros((ny, nx)), {"units": "m/s"}),
     "h": (("y_c", "x_c"), h0, {"units": "m", "long_name": "layer thickness"})},
    coords={"x_c": x_c, "x_g": x_g, "y_c": y_c, "y_g": y_g},
)
grid = {"X": {"center": "x_c", "left": "x_g"}, "Y": {"center": "y_c", "left": "y_g"}}
walls = {"X": "periodic", "Y": "fill"}  # fill is 0, as in xgcm

# %%
# Three kernels, each at its own position. ``at=`` says where the output goes.


def continuity(s):
    east = 0.5 * (s.h() + s.h(X=1)) * s.u(X=0.5)
    west = 0.5 * (s.h() + s.h(X=-1)) * s.u(X=-0.5)
    north = 0.5 * (s.h() + s.h(Y=1)) * s.v(Y=0.5)
    south = 0.5 * (s.h() + s.h(Y=-1)) * s.v(Y=-0.5)
    return s.h() - dt * (east - west + north - south) / dx


def x_momentum(s):  # at u points: v from the four surrounding y faces
    v_here = 0.25 * (s.v(X=-0.5, Y=-0.5) + s.v(X=0.5, Y=-0.5)
                     + s.v(X=-0.5, Y=0.5) + s.v(X=0.5, Y=0.5))
    return s.u() + dt * (f * v_here - g * (s.h(X=0.5) - s.h(X=-0.5)) / dx)


def y_momentum(s):  # at v points
    u_here = 0.25 * (s.u(X=-0.5, Y=-0.5) + s.u(X=0.5, Y=-0.5)
                     + s.u(X=-0.5, Y=0.5) + s.u(X=0.5, Y=0.5))
    return s.v() + dt * (-f * u_here - g * (s.h(Y=0.5) - s.h(Y=-0.5)) / dx)


def forward_backward(state):
    state = state.assign(h=state.stencil.map(continuity, grid=grid, boundary=walls,
                                             at={"X": "center", "Y": "center"}))
    state = state.assign(u=state.stencil.map(x_momentum, grid=grid, boundary=walls,
                                             at={"X": "left", "Y": "center"}))
    m = state.stencil.mesh(grid=grid, boundary=walls, at={"X": "center", "Y": "left"})
    m[...] = y_momentum
    m.loc[{"y_g": 0.0}] = lambda s: 0.0  # the southern wall, by coordinate label
    return state.assign(v=m.map())


with jax.enable_x64(True):  # float64, so that round-off is float64's
    traj = state0.stencil.scan(step=forward_backward, steps=steps,
                               save_every=steps // 10, dt=dt)
    traj = jax.tree.map(np.asarray, traj)  # to numpy (a Dataset is a pytree)

# %%
# Mass is conserved to round-off; the energy (here its quadratic part,
# ``g h^2 / 2 + H |u|^2 / 2``) drifts at the scheme's order.

mass = (traj.h.sum(("y_c", "x_c")) * dx * dx).values
print(f"relative mass change after {steps} steps: {abs(mass[-1] / mass[0] - 1):.1e}")
assert abs(mass[-1] / mass[0] - 1) < 1e-12
energy = (0.5 * g * (traj.h**2).sum(("y_c", "x_c"))
          + 0.5 * H * ((traj.u**2).sum(("y_c", "x_g")) + (traj.v**2).sum(("y_g", "x_c"))))
print(f"relative energy change: {float(abs(energy[-1] / energy[0] - 1)):.1e}")

# %%
# The result keeps xgcm's dims and coords: ``traj.v`` is on ``(time, y_g, x_c)``,
# so ``xgcm.Grid(...).interp(traj.v, "Y")`` takes it as it is.

fig, axes = plt.subplots(1, 2, figsize=(11, 3.6), width_ratios=(2, 1))
(traj.h.isel(time=-1) - H).plot(ax=axes[0], x="x_c", cmap="RdBu_r", center=0.0)
axes[0].set_title(f"h - H after {steps} steps (periodic in x, walls in y)")
axes[1].plot(traj.time / 3600, mass / mass[0] - 1, label="mass")
axes[1].plot(traj.time / 3600, energy / energy[0] - 1, label="energy")
axes[1].set_xlabel("hours")
axes[1].set_title("relative change")
axes[1].legend()
fig.tight_layout()

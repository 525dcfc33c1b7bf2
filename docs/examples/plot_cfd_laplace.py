"""
CFD Python step 9: Laplace's equation to a tolerance
====================================================

Step 9 of Lorena Barba's *12 steps to Navier-Stokes*: the steady
temperature in a 2 x 1 plate with ``p = 0`` at ``x = 0``, ``p = y`` at
``x = 2`` and insulated top and bottom walls, by Jacobi iterations until the
relative l1 change falls below 1e-4.

The original is a Python ``while`` loop around numpy slices. Here the
Jacobi update and its boundary rows form one function mesh, and
:func:`xstencil.iterate` runs it until converged inside a single compiled
``lax.while_loop``. The insulated walls copy the *new* row next to them,
as the original does after its interior update: that is the interior update
evaluated one row in, ``jacobi(u, oy=1)``. The result equals the numpy
original to rounding (``tests/contract/test_cfd_python.py``).
"""

import os

import matplotlib.pyplot as plt
import numpy as np
import xarray as xr

import xstencil  # noqa: F401  (registers the .stencil accessor)

SMALL = os.environ.get("XSTENCIL_GALLERY_SMALL", "") not in ("", "0")
nx, ny = (16, 16) if SMALL else (31, 31)
dx, dy = 2 / (nx - 1), 1 / (ny - 1)
x, y = np.linspace(0, 2, nx), np.linspace(0, 1, ny)

p0 = xr.DataArray(np.zeros((ny, nx)), dims=("y", "x"), coords={"y": y, "x": x}, name="p")
p0[:, -1] = y
p0[0, :] = p0[1, :]
p0[-1, :] = p0[-2, :]


def jacobi(u, oy=0):
    """The Jacobi update, evaluated ``oy`` rows away."""
    return ((dy**2 * (u(y=oy, x=1) + u(y=oy, x=-1))
             + dx**2 * (u(y=oy + 1) + u(y=oy - 1))) / (2 * (dx**2 + dy**2)))


# %%
# The mesh: later assignments win, in the original's order of boundary updates.
m = p0.stencil.mesh(boundary="extend")
m[...] = jacobi
m[{"x": 0}] = lambda u: 0.0
m[{"x": -1}] = lambda u: u.coord("y")()
m[{"y": 0}] = lambda u: jacobi(u, oy=1)
m[{"y": 0, "x": 0}] = lambda u: 0.0
m[{"y": 0, "x": -1}] = lambda u: u.coord("y")(y=1)
m[{"y": -1}] = lambda u: jacobi(u, oy=-1)
m[{"y": -1, "x": 0}] = lambda u: 0.0
m[{"y": -1, "x": -1}] = lambda u: u.coord("y")(y=-1)

res = p0.stencil.iterate(m, tol=1e-4, norm="l1", max_steps=100_000)
print(f"{res.iterations} iterations, last relative l1 change {res.residual:.2e}")

# %%
fig, ax = plt.subplots(figsize=(7, 3.5))
res.field.plot.contourf(ax=ax, levels=20, cmap="viridis")
ax.set_title(f"Laplace, {res.iterations} Jacobi iterations to l1 < 1e-4")
plt.show()

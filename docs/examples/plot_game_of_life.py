"""
Conway's Game of Life
=====================

Integer data: each cell is 0 (dead) or 1 (alive). A scan along ``generation``
counts the eight neighbours of the previous generation. Outside the board
every cell is dead, so the boundary is ``"fill"`` with ``fill_value=0``;
integer data needs an explicit fill value (the default fill is NaN). The
starting pattern is Bill Gosper's glider gun, which emits a glider every 30
generations.
"""

import os

import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import xarray as xr

import xstencil  # noqa: F401

SMALL = os.environ.get("XSTENCIL_GALLERY_SMALL", "") not in ("", "0")
ny, nx = 40, 60
gun = [(5, 1), (5, 2), (6, 1), (6, 2), (3, 13), (3, 14), (4, 12), (4, 16), (5, 11),
       (5, 17), (6, 11), (6, 15), (6, 17), (6, 18), (7, 11), (7, 17), (8, 12), (8, 16),
       (9, 13), (9, 14), (1, 25), (2, 23), (2, 25), (3, 21), (3, 22), (4, 21), (4, 22),
       (5, 21), (5, 22), (6, 23), (6, 25), (7, 25), (3, 35), (3, 36), (4, 35), (4, 36)]
board = np.zeros((ny, nx), dtype=np.int32)
for i, j in gun:
    board[i + 2, j + 2] = 1
life0 = xr.DataArray(board, dims=("row", "col"),
                     coords={"row": np.arange(ny), "col": np.arange(nx)}, name="alive")


def life(u):
    neighbours = sum(u(generation=-1, row=i, col=j)
                     for i in (-1, 0, 1) for j in (-1, 0, 1) if (i, j) != (0, 0))
    alive = u(generation=-1)
    born_or_kept = (neighbours == 3) | ((alive == 1) & (neighbours == 2))
    return jnp.where(born_or_kept, 1, 0).astype(alive.dtype)


steps = 40 if SMALL else 120
gens = life0.stencil.scan(life, dim="generation", steps=steps, boundary="fill",
                          fill_value=0, save_every=steps // 4)
print(gens.dtype, gens.sum(("row", "col")).values)

# %%
# The glider gun and its gliders at four generations.
gens["generation"] = np.round(gens.generation).astype(int)
g = gens.plot(col="generation", col_wrap=3, cmap="binary", add_colorbar=False, size=2.4,
              aspect=nx / ny, yincrease=False)

# %%
# The last generation, larger: the gun on the left and the gliders it has
# emitted travelling down to the right.

# sphinx_gallery_thumbnail_number = 2
fig, ax = plt.subplots(figsize=(6, 4), layout="constrained")
gens.isel(generation=-1).plot.imshow(ax=ax, cmap="Greens", vmin=0, vmax=1,
                                     add_colorbar=False, yincrease=False)
ax.set_aspect("equal")
ax.set_title(f"generation {int(gens.generation[-1])}")

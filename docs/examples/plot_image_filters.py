"""
Gaussian blur and Sobel edges
=============================

Image filters on the photograph of Grace Hopper that ships with matplotlib
(``matplotlib.cbook.get_sample_data``; nothing is downloaded). The blur uses the
window **as an array**, ``(u * w).sum()`` over an explicit 5 x 5 window; the
Sobel filter reads single neighbours by dim name. Both use
``boundary="reflect"``, which mirrors the image about its edge pixels.
"""

import os

import matplotlib.pyplot as plt
import numpy as np
import xarray as xr
from matplotlib.cbook import get_sample_data

import xstencil  # noqa: F401

SMALL = os.environ.get("XSTENCIL_GALLERY_SMALL", "") not in ("", "0")
rgb = plt.imread(get_sample_data("grace_hopper.jpg", asfileobj=False))
grey = rgb.astype(np.float32).mean(axis=-1) / 255
if SMALL:
    grey = grey[::5, ::5]
img = xr.DataArray(
    grey,
    dims=("y", "x"),
    coords={"y": np.arange(grey.shape[0]), "x": np.arange(grey.shape[1])},
    name="brightness",
)

# %%
# A 5 x 5 Gaussian, normalised, in the image's dtype (float32).
k = np.arange(-2, 3)
w = np.exp(-(k[:, None] ** 2 + k[None, :] ** 2) / (2 * 1.2**2))
w = (w / w.sum()).astype(np.float32)
blur = img.stencil.map(lambda u: (u * w).sum(), window={"y": 5, "x": 5},
                       boundary="reflect")

# %%
# The Sobel operator on the blurred image.


def sobel(u):
    gx = (u(x=1, y=-1) + 2 * u(x=1) + u(x=1, y=1)) - (u(x=-1, y=-1) + 2 * u(x=-1) + u(x=-1, y=1))
    gy = (u(y=1, x=-1) + 2 * u(y=1) + u(y=1, x=1)) - (u(y=-1, x=-1) + 2 * u(y=-1) + u(y=-1, x=1))
    return (gx**2 + gy**2) ** 0.5


edges = blur.stencil.map(sobel, boundary="reflect").rename("edge strength")

fig, axs = plt.subplots(1, 3, figsize=(12, 4.6), layout="constrained")
for ax, da, title, cmap in [(axs[0], img, "original", "gray"),
                            (axs[1], blur, "Gaussian blur (5 x 5)", "gray"),
                            (axs[2], edges, "Sobel edges", "magma")]:
    da.plot.imshow(ax=ax, cmap=cmap, yincrease=False, add_colorbar=False)
    ax.set_title(title)
    ax.set_aspect("equal")

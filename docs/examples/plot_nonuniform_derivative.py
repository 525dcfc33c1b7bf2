"""
Derivative on a non-uniform grid
================================

Inside a kernel, ``u.coord("x")`` is a window over the coordinate values, read
with the same offsets as the data. That is all a finite difference on a
irregular grid needs. The grid here has randomly jittered spacing, as
measurement positions often do. The naive centred difference
``(f[+1] - f[-1]) / (x[+1] - x[-1])`` is only first-order accurate on such a
grid; the three-point formula that weights each side by its own spacing is
second order. ``boundary="valid"`` drops the two end points, where
the stencil does not fit, and trims the ``x`` coordinate to match.
"""

import os

import matplotlib.pyplot as plt
import numpy as np
import xarray as xr

import xstencil  # noqa: F401

SMALL = os.environ.get("XSTENCIL_GALLERY_SMALL", "") not in ("", "0")


def field(n):
    x = np.linspace(0.0, 1.0, n)
    jitter = np.random.default_rng(n).uniform(-0.4, 0.4, n - 2) / (n - 1)
    x[1:-1] += jitter  # each spacing is 0.2 to 1.8 times the mean
    f = np.sin(6 * x) * np.exp(-x)
    return xr.DataArray(f, dims="x", coords={"x": x}, name="f")


def naive(u):
    x = u.coord("x")
    return (u(x=1) - u(x=-1)) / (x(x=1) - x(x=-1))


def weighted(u):
    x = u.coord("x")
    hp, hm = x(x=1) - x(), x() - x(x=-1)
    return (hm**2 * u(x=1) - hp**2 * u(x=-1) + (hp**2 - hm**2) * u()) / (hp * hm * (hp + hm))


def exact(x):
    return (6 * np.cos(6 * x) - np.sin(6 * x)) * np.exp(-x)


f = field(30 if SMALL else 60)
d1 = f.stencil.map(naive, boundary="valid")
d2 = f.stencil.map(weighted, boundary="valid")
print(f.sizes["x"], "points in,", d2.sizes["x"], "out")

# %%
# Error against the exact derivative, and its decay as the grid is refined.
sizes = [16, 32, 64, 128] if SMALL else [16, 32, 64, 128, 256, 512, 1024]
errs = {"naive centred": [], "spacing-weighted": []}
for n in sizes:
    fn = field(n)
    for name, k in (("naive centred", naive), ("spacing-weighted", weighted)):
        d = fn.stencil.map(k, boundary="valid").as_numpy()  # a JAX array -> numpy
        errs[name].append(float(np.abs(d - exact(d.x)).max()))

fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(11, 4), layout="constrained")
xf = np.linspace(0, 1, 400)
ax0.plot(xf, exact(xf), "k-", lw=1, label="exact")
ax0.plot(d1.x, d1, "o", ms=4, label="naive centred")
ax0.plot(d2.x, d2, "s", ms=4, mfc="none", label="spacing-weighted")
ax0.plot(f.x, np.full(f.sizes["x"], -4.6), "|", color="gray", label="grid points")
ax0.set_xlabel("x")
ax0.set_ylabel("df/dx")
ax0.legend(fontsize="small")
for name, e in errs.items():
    ax1.loglog(sizes, e, "o-", label=name)
ax1.loglog(sizes, 5 * np.array(sizes, float) ** -1.0, "k--", lw=0.8, label="slope -1")
ax1.loglog(sizes, 5 * np.array(sizes, float) ** -2.0, "k:", label="slope -2")
ax1.set_xlabel("grid points")
ax1.set_ylabel("max error")
ax1.legend(fontsize="small")

"""A small shallow-water Dataset and its kernel, shared by the dask and
sharded scan tests: two advanced fields stored in different dim orders, and
a constant bathymetry that the kernel reads but does not return."""

from __future__ import annotations

from typing import Any

import numpy as np
import xarray as xr


def dataset(ny: int = 20, nx: int = 24) -> xr.Dataset:
    rng = np.random.default_rng(3)
    return xr.Dataset(
        {"h": (("y", "x"), 1 + 0.1 * rng.random((ny, nx)), {"units": "m"}),
         "u": (("x", "y"), 0.1 * rng.random((nx, ny))),
         "b": (("y", "x"), 0.05 * rng.random((ny, nx)))},
        coords={"y": np.linspace(0.0, 1.0, ny), "x": np.linspace(0.0, 2.0, nx)},
        attrs={"title": "1-D shallow water"})


def kernel(s: Any) -> dict[str, Any]:
    """Linearised shallow water along x, with diffusion of h along y."""
    h, u, b = s["h"], s["u"], s["b"]
    return {"h": h(time=-1) - 0.025 * (u(time=-1, x=1) * h(time=-1, x=1)
                                       - u(time=-1, x=-1) * h(time=-1, x=-1))
            + 0.01 * (h(time=-1, y=1) - 2 * h(time=-1) + h(time=-1, y=-1)),
            "u": u(time=-1) - 0.245 * (h(time=-1, x=1) + b(x=1) - h(time=-1, x=-1) - b(x=-1))}

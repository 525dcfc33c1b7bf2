"""A staggered scan grown with ``steps=`` from a state without the scanned dim
(session 29's Devito staggered-acoustic port):

* its kernel can read the time coordinate, as a plain scan's can (the probe
  trace of the staggered path left ``time`` out of the readable coordinates
  and raised "no coordinate 'time' is available");
* the state may carry the scalar ``time`` label that ``obj.isel(time=-1)``
  leaves, to continue a run (putting the grid's coordinates back brought that
  scalar along and xarray raised "dimension 'time' already exists as a scalar
  variable").
"""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

import xstencil  # noqa: F401

GRID = {"X": {"center": "x", "right": "x_r"}}


def state(**coords: float) -> xr.Dataset:
    x = np.arange(5.0)
    return xr.Dataset({"p": ("x", np.linspace(0, 1, 5)), "v": ("x_r", np.zeros(5))},
                      coords={"x": x, "x_r": ("x_r", x + 0.5, {"units": "m"}), **coords})


KERNELS = {"p": lambda s: s["p"](time=-1) + 0.5 * (s["v"](time=-1, X=0.5)
                                                    - s["v"](time=-1, X=-0.5))
           + s["p"].coord("time")(time=-1),
           "v": lambda s: s["v"](time=-1) + 0.25 * (s["p"](time=-1, X=0.5)
                                                     - s["p"](time=-1, X=-0.5))}


def numpy_run(steps: int, dt: float, t0: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    p, v = [state()["p"].values], [np.zeros(5)]
    for n in range(steps):
        pp, vv = p[-1], v[-1]
        vpad = np.r_[0.0, vv]          # v at x - 1/2 is v[i-1]; 0 past the edge
        ppad = np.r_[pp, 0.0]          # p at x_r + 1/2 is p[i+1]
        p.append(pp + 0.5 * (vpad[1:] - vpad[:-1]) + t0 + n * dt)
        v.append(vv + 0.25 * (ppad[1:] - ppad[:-1]))
    return np.array(p), np.array(v)


@pytest.mark.parametrize("coords", [{}, {"time": 0.0}])
def test_grown_staggered_scan_reads_time(coords):
    out = state(**coords).stencil.scan(KERNELS, "time", steps=4, dt=0.5, grid=GRID,
                                       boundary="fill", fill_value=0.0)
    p, v = numpy_run(4, 0.5)
    np.testing.assert_allclose(out.time, 0.5 * np.arange(5))
    np.testing.assert_allclose(out.p.values, p, rtol=1e-12)
    np.testing.assert_allclose(out.v.values, v, rtol=1e-12)
    assert out.v.dims == ("time", "x_r") and out.x_r.attrs == {"units": "m"}


def test_continuing_from_the_last_state_gives_the_one_run():
    whole = state().stencil.scan(KERNELS, "time", steps=6, dt=0.5, grid=GRID,
                                 boundary="fill", fill_value=0.0)
    first = state().stencil.scan(KERNELS, "time", steps=3, dt=0.5, grid=GRID,
                                 boundary="fill", fill_value=0.0)
    rest = first.isel(time=-1).stencil.scan(KERNELS, "time", steps=3, dt=0.5, grid=GRID,
                                            boundary="fill", fill_value=0.0)
    np.testing.assert_allclose(rest.time, whole.time[3:])
    xr.testing.assert_allclose(rest, whole.isel(time=slice(3, None)), rtol=1e-12)

"""The scans of tests/contract/test_cross_backend.py, run on one backend.

Each case builds an input and a scan call; :func:`run` runs it in memory, on
dask chunks or sharded over the devices, and returns ``("ok", result)``
(numpy-backed, computed) or ``("error", type name, message)``.  Run as a
script (``python cross_backend_cases.py OUT``, with
``XLA_FLAGS=--xla_force_host_platform_device_count=4``), it runs every case
sharded and pickles the outcomes to OUT.
"""

from __future__ import annotations

import os
import pickle
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import xarray as xr

import xstencil


def heat(u: Any) -> Any:
    return u(time=-1) + 0.1 * (u(time=-1, x=1) + u(time=-1, x=-1) + u(time=-1, y=1)
                               + u(time=-1, y=-1) - 4 * u(time=-1))


def cool(u: Any) -> Any:
    return 0.5 * u(time=-1)


def forced(u: Any) -> Any:  # reads its input at the position computed (a trajectory)
    return 0.5 * (u(time=-1, x=1) + u(time=-1, x=-1)) + 0.1 * u()


def timed(u: Any) -> Any:  # reads the time coordinate
    t = u.coord("time")
    return u(time=-1) + 0.01 * (t() - t(time=-1)) * u(time=-1, x=1)


def ds_kernel(s: Any) -> dict[str, Any]:
    u, v, h = s["u"], s["v"], s["h"]
    return {"u": u(time=-1) + 0.1 * (v(time=-1, x=1) - v(time=-1, x=-1)) * h(),
            "v": v(time=-1) + 0.1 * (u(time=-1, y=1) - u(time=-1, y=-1))}


def ds_all(s: Any) -> dict[str, Any]:
    return {"u": s["u"](time=-1, x=1), "v": s["v"](time=-1, x=-1)}


def no_past(u: Any) -> Any:  # reads no earlier position: nothing to scan
    return u(x=1)


def _field(ny: int = 8, nx: int = 16, dtype: Any = np.float64, seed: int = 0) -> xr.DataArray:
    rng = np.random.default_rng(seed)
    return xr.DataArray(rng.random((ny, nx)).astype(dtype), dims=("y", "x"),
                        coords={"y": np.arange(ny) * 0.5, "x": np.arange(nx) * 0.25},
                        attrs={"units": "K"}, name="T")


def _traj(n: int = 5) -> xr.DataArray:
    u = _field()
    return xr.concat([u * (1 + 0.1 * j) for j in range(n)], "time").assign_coords(
        time=np.arange(n) * 2.0)


def _ds(traj: bool = False) -> xr.Dataset:
    u, v = _field(seed=1), _field(seed=2)
    h = _field(seed=3).drop_attrs() + 1
    if traj:
        u = xr.concat([u] * 4, "time")
        v = xr.concat([v] * 4, "time")
    return xr.Dataset({"u": u, "v": v, "h": h}, attrs={"title": "two"})


def _mask() -> xr.DataArray:
    u = _field()
    return (u.x > 1.0) & (u.y < 2.0)


# name -> (input, kernel or a mesh builder, scan keywords)
CASES: dict[str, tuple[Callable[[], Any], Any, dict[str, Any]]] = {
    "da-grown": (_field, heat, dict(steps=6, boundary="periodic")),
    "da-grown-every-3": (_field, heat, dict(steps=6, boundary="extend", save_every=3)),
    "da-grown-last": (_field, heat, dict(steps=5, boundary="reflect", save_every="last")),
    "da-trajectory": (_traj, forced, dict(boundary="periodic")),
    "da-trajectory-every-2": (_traj, forced, dict(boundary="symmetric", save_every=2)),
    "da-trajectory-last": (_traj, forced, dict(boundary="periodic", save_every="last")),
    "da-time-coordinate-dt": (_field, timed, dict(steps=4, dt=0.5, boundary="periodic")),
    "da-time-coordinate-given": (_traj, timed, dict(boundary="extend")),
    "ds-grown": (_ds, ds_kernel, dict(steps=4, boundary="periodic")),
    "ds-trajectory-with-forcing": (lambda: _ds(True), ds_kernel, dict(boundary="periodic")),
    "ds-trajectory-constant-first": (lambda: _ds(True)[["h", "u", "v"]], ds_kernel,
                                     dict(boundary="periodic", save_every=3)),
    "mesh-position": (_field, "position", dict(steps=4, boundary="periodic")),
    "mesh-label": (_field, "label", dict(steps=4, boundary="periodic", save_every=2)),
    "mesh-mask": (_field, "mask", dict(steps=4, boundary="extend")),
    # the differences the review found (issue 15)
    "ds-all-advanced-no-time-coordinate": (
        lambda: _ds(True).drop_vars("h"), ds_all, dict(boundary="periodic")),
    "no-earlier-position": (_traj, no_past, dict(boundary="periodic")),
    "save-every-past-the-end": (lambda: _traj(4), forced, dict(save_every=10,
                                                                boundary="periodic")),
    "bad-save-every": (_field, heat, dict(steps=4, save_every=0)),
    "steps-not-a-multiple": (_field, heat, dict(steps=5, save_every=2)),
    # only the initial conditions: memory used to return them unchanged with 'last'
    "only-initial-positions-last": (lambda: _traj(1), forced, dict(save_every="last",
                                                                  boundary="periodic")),
    "only-initial-positions": (lambda: _traj(1), forced, dict(boundary="periodic")),
    # the block scans used to skip the in-memory scan's time checks: growing with a
    # kernel that reads ahead ran (reading the last slab), and an unread, unsorted
    # time coordinate was refused
    "grown-reading-ahead": (_field, forced, dict(steps=2, boundary="periodic")),
    "unread-unsorted-time-coordinate": (
        lambda: _traj().assign_coords(time=[0.0, 4.0, 2.0, 6.0, 8.0]), forced,
        dict(boundary="periodic")),
}


def _mesh(obj: Any, how: str, **options: Any) -> Any:
    m = xstencil.mesh(obj, **options)
    m[...] = heat
    if how == "position":
        m[{"x": slice(0, 4)}] = cool
    elif how == "label":
        m.loc[{"x": slice(1.0, 2.0)}] = cool
    else:
        m[_mask()] = cool
    return m


def _numpy(out: Any) -> Any:
    out = out.compute()
    if isinstance(out, xr.Dataset):
        return out.map(lambda v: v.copy(data=np.asarray(v.data)), keep_attrs=True)
    return out.copy(data=np.asarray(out.data))


def run(name: str, backend: str) -> tuple[Any, ...]:
    """One case on ``backend`` ("memory", "dask" or "shard")."""
    make, kernel, kw = CASES[name]
    obj = make()
    kw = dict(kw)
    opts: dict[str, Any] = {}
    if backend == "dask":
        obj = obj.chunk({"x": 8})
    elif backend == "shard":
        opts["devices"] = {"x": "i"}
    try:
        if isinstance(kernel, str):
            m = _mesh(obj, kernel, boundary=kw.pop("boundary"), **opts)
            out = m.scan("time", **kw)
        else:
            out = obj.stencil.scan(kernel, "time", **kw, **opts)
        return ("ok", _numpy(out))
    except Exception as e:  # the outcome compared across backends
        return ("error", type(e).__name__, str(e))


def main(path: str) -> None:
    import jax

    assert jax.device_count() == 4, jax.devices()
    with open(path, "wb") as f:
        pickle.dump({name: run(name, "shard") for name in CASES}, f)


if __name__ == "__main__":
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
    main(sys.argv[1])

"""Streamed saves of sharded data write each device's blocks, never the whole
segment: run on 4 simulated CPU devices in a subprocess by
tests/backends/test_shard_stream_blocks.py, which checks the JSON printed.

Every ``Dataset.to_zarr`` call of a streamed run is recorded: the data it is
handed must be numpy blocks no larger than one device's block (or the lazy
zeros of the metadata write), never a JAX array spanning the devices (which
``to_zarr`` would gather to the host whole).  The store's chunks must be the
devices' blocks, one position deep along ``time``, and the result bitwise
equal to the uninterrupted sharded scan and to a numpy loop.
"""

from __future__ import annotations

import json
import os
import tempfile
import warnings
from pathlib import Path

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import xarray as xr  # noqa: E402
import zarr  # noqa: E402

import xstencil  # noqa: E402

C = np.float64(0.2)
OPTS = dict(dim="time", steps=12, save_every=3, boundary={"x": "periodic", "y": "extend"})


def heat(u):
    return u(time=-1) + C * (u(time=-1, x=1) + u(time=-1, x=-1) + u(time=-1, y=1)
                             + u(time=-1, y=-1) - 4 * u(time=-1))


def numpy_heat(u0: np.ndarray) -> np.ndarray:
    u, out = u0.copy(), [u0.copy()]
    for i in range(1, OPTS["steps"] + 1):
        p = np.pad(u, ((1, 1), (0, 0)), mode="edge")
        u = u + C * (np.roll(u, -1, 1) + np.roll(u, 1, 1) + p[2:] + p[:-2] - 4 * u)
        if i % OPTS["save_every"] == 0:
            out.append(u.copy())
    return np.stack(out)


def record(calls: list) -> object:
    write = xr.Dataset.to_zarr

    def spy(self, *args, **kwargs):
        calls.append([(type(v.data).__module__.split(".")[0], list(v.shape))
                      for v in self.data_vars.values()])
        return write(self, *args, **kwargs)

    xr.Dataset.to_zarr = spy
    return write


def run(tmp: Path, name: str, obj: xr.DataArray, **kw) -> dict:
    calls: list = []
    write = record(calls)
    try:
        out = obj.stencil.scan(heat, **OPTS, **kw, store=tmp / name, segment=2)
    finally:
        xr.Dataset.to_zarr = write
    ref = obj.stencil.scan(heat, **OPTS, **{k: v for k, v in kw.items()})
    return {"calls": calls, "chunks": list(zarr.open_group(tmp / name)["T"].chunks),
            "bitwise": bool(np.array_equal(out.values, np.asarray(ref.values))),
            "numpy": bool(np.allclose(out.values, numpy_heat(obj.values), rtol=1e-12)),
            "identical": out.load().identical(ref.copy(data=np.asarray(ref.values))),
            "dtype": str(out.dtype)}


def precision_warnings(T: xr.DataArray, mesh) -> dict:
    """open_sharded warns for float64 sharded over several devices with x64 off (JAX
    operations on it outside xstencil would truncate or fail), not for float32 or with
    x64 on; with x64 on, .sum() of the result is float64."""
    out = {}
    for name, data, x64 in (("float64", T, False), ("float32", T.astype(np.float32), False),
                            ("float64_x64", T, True)):
        with warnings.catch_warnings(record=True) as caught, jax.enable_x64(x64):
            warnings.simplefilter("always")
            opened = xstencil.open_sharded(data, mesh)
            total = opened.stencil.scan(heat, **OPTS).sum() if x64 else None
        out[name] = [f"{w.category.__name__}: {w.message}" for w in caught]
        if total is not None:
            out["sum_x64"] = [str(total.dtype), float(total)]
    out["sum_numpy"] = float(numpy_heat(T.values).sum())
    return out


def main() -> dict:
    assert jax.device_count() == 4, jax.devices()
    rng = np.random.default_rng(11)
    T = xr.DataArray(rng.random((16, 24)), dims=("y", "x"), name="T", attrs={"units": "K"},
                     coords={"x": np.arange(24.0)})
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        mesh = xstencil.make_devices({"y": 2, "x": 2})
        with warnings.catch_warnings():  # float64 sharded with x64 off: warned, and kept
            warnings.simplefilter("ignore", xstencil.PrecisionWarning)
            Ts = xstencil.open_sharded(T, mesh)
        return {"warnings": precision_warnings(T, mesh),
                "presharded": run(tmp, "p.zarr", Ts),
                "devices": run(tmp, "d.zarr", T, devices={"y": "a", "x": "b"})}


if __name__ == "__main__":
    print(json.dumps(main()))

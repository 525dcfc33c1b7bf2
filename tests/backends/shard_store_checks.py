"""Streamed saves of sharded scans, run on 4 simulated CPU devices in a subprocess
by tests/backends/test_shard_store.py.

``python shard_store_checks.py equal``
    prints one JSON object, check name -> "ok" or the failure's traceback.
``python shard_store_checks.py kill STORE WHEN``
    starts a streamed sharded run into ``STORE`` and SIGKILLs itself at the
    third write (``WHEN``: ``mid-write``, ``before-marker`` or ``after-marker``).
``python shard_store_checks.py resume STORE``
    resumes it and checks the result against an uninterrupted sharded run;
    prints the JSON of the checks.

The kernel reads the time coordinate (so a resumed segment must get the
whole run's coordinate) and a boundary that is not periodic along a sharded
dim (so the edge devices rebuild their halo after every step).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import traceback
import types
from collections.abc import Callable
from pathlib import Path

# kernex 0.2.1 installs a top-level ``tests`` package that would shadow this repository's
_tests = sys.modules.setdefault("tests", types.ModuleType("tests"))
_tests.__path__ = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import xarray as xr  # noqa: E402

import xstencil  # noqa: E402
from xstencil import XStencilError  # noqa: E402
from xstencil._labelled import stream  # noqa: E402

jax.config.update("jax_numpy_dtype_promotion", "strict")

C = np.float32(0.2)
OPTS = dict(dim="time", steps=24, save_every=3, dt=0.5,
            boundary={"x": "periodic", "y": "extend"}, halo_every=2)
DEVICES = {"y": "a", "x": "b"}


def diffuse(u):
    t = u.coord("time")
    lap = (u(time=-1, x=1) + u(time=-1, x=-1) + u(time=-1, y=1) + u(time=-1, y=-1)
           - 4 * u(time=-1))
    return u(time=-1) + C * lap + np.float32(1e-3) * (t() - t(time=-1))


def initial() -> xr.DataArray:
    x = np.random.default_rng(3).random((16, 24)).astype(np.float32)
    return xr.DataArray(x, dims=("y", "x"), coords={"x": np.arange(24) * 0.5}, name="h",
                        attrs={"units": "m"})


def sharded() -> xr.DataArray:
    return xstencil.open_sharded(initial(), devices=xstencil.make_devices({"y": 2, "x": 2}))


def host(da: xr.DataArray) -> xr.DataArray:
    """A result with its data gathered to numpy, for assert_identical."""
    return da.copy(data=np.asarray(da.values))


def numpy_reference(u0: np.ndarray) -> np.ndarray:
    """The scan by hand: periodic in x, extend in y; dt adds 1e-3 * 0.5 a step."""
    u, out = u0.copy(), [u0.copy()]
    for i in range(1, OPTS["steps"] + 1):
        p = np.pad(u, ((1, 1), (0, 0)), mode="edge")
        lap = np.roll(u, -1, 1) + np.roll(u, 1, 1) + p[2:] + p[:-2] - 4 * u
        u = u + C * lap + np.float32(1e-3) * np.float32(0.5)
        if i % OPTS["save_every"] == 0:
            out.append(u.copy())
    return np.stack(out)


def check_devices_equal_to_uninterrupted(tmp: Path) -> None:
    u0 = initial()
    ref = u0.stencil.scan(diffuse, **OPTS, devices=DEVICES)
    for segment in (1, 3, 100):
        out = u0.stencil.scan(diffuse, **OPTS, devices=DEVICES, store=tmp / f"d{segment}",
                              segment=segment)
        assert out.chunks is None and type(out.data) is np.ndarray  # read from the store
        xr.testing.assert_identical(out.load(), host(ref))
    np.testing.assert_allclose(ref.values, numpy_reference(u0.values), rtol=1e-5, atol=1e-6)


def check_presharded_keeps_devices(tmp: Path) -> None:
    """Data already sharded streams without devices=; every segment runs sharded."""
    us = sharded()
    ref = us.stencil.scan(diffuse, **OPTS)
    seen = []
    segment = stream._segment

    def spy(scan, run, state, *a):
        seen.append(state.data.sharding.spec)  # the segment's input stays on the devices
        out = segment(scan, run, state, *a)
        seen.append(out.data.sharding.spec)
        return out

    stream._segment = spy
    try:
        out = us.stencil.scan(diffuse, **OPTS, store=tmp / "p", segment=2)
    finally:
        stream._segment = segment
    xr.testing.assert_identical(out.load(), host(ref))
    assert len(seen) == 2 * 4, seen  # 9 saved positions: 1 + 2, then 2, 2, 2
    assert seen[0] == jax.sharding.PartitionSpec("y", "x"), seen
    assert all(s == jax.sharding.PartitionSpec(None, "y", "x") for s in seen[1:]), seen


def check_dataset(tmp: Path) -> None:
    rng = np.random.default_rng(4)
    ds = xr.Dataset({"a": (("y", "x"), rng.random((8, 16)).astype(np.float32)),
                     "c": (("y", "x"), rng.random((8, 16)).astype(np.float32))},
                    attrs={"title": "two fields"})

    def kern(s):
        return {"a": s["a"](time=-1) + np.float32(0.1) * s["c"]()
                * (s["a"](time=-1, x=1) - s["a"](time=-1, x=-1))}

    opts = dict(dim="time", steps=8, save_every=2, boundary="periodic", devices={"x": "i"})
    ref = ds.stencil.scan(kern, **opts)
    out = ds.stencil.scan(kern, **opts, store=tmp / "ds", segment=1)
    xr.testing.assert_identical(out.load(), ref.map(host, keep_attrs=True))


def check_mesh_alias_warns_once(tmp: Path) -> None:
    u0 = initial()
    ref = u0.stencil.scan(diffuse, **OPTS, devices=DEVICES)
    with pytest.warns(DeprecationWarning, match=r"mesh= is deprecated") as rec:
        out = u0.stencil.scan(diffuse, **OPTS, mesh=DEVICES, store=tmp / "m", segment=2)
    assert len(rec) == 1, [str(w.message) for w in rec]
    xr.testing.assert_identical(out.load(), host(ref))


def check_resume_refuses_another_layout(tmp: Path) -> None:
    store = tmp / "l"
    sharded().stencil.scan(diffuse, **OPTS, store=store, segment=4)
    with pytest.raises(XStencilError, match=r"different run: the options differ: sharded="
                                            r"mesh \{'y': 2, 'x': 2\}.* in the store, "
                                            r"sharded=None now"):
        initial().stencil.scan(diffuse, **OPTS, store=store, resume=True)
    with pytest.raises(XStencilError, match=r"the options differ: devices=None in the store, "
                                            r"devices=\{'x': 'b'\} now"):
        sharded().stencil.scan(diffuse, **OPTS, devices={"x": "b"}, store=store, resume=True)


def check_mixed_layouts_refused(tmp: Path) -> None:
    mesh = xstencil.make_devices({"y": 2, "x": 2})
    rng = np.random.default_rng(5)

    def put(spec):
        return jax.device_put(rng.random((8, 16)).astype(np.float32),
                              jax.sharding.NamedSharding(mesh, spec))

    P = jax.sharding.PartitionSpec
    ds = xr.Dataset({"a": (("y", "x"), put(P(None, "x"))), "b": (("y", "x"), put(P(None, "y")))})
    with pytest.raises(XStencilError, match=r"variable 'b' is sharded as P\(None, "
                                            r"'y'\).*unlike the other variables.*store= needs "
                                            r"one layout"):
        ds.stencil.scan(lambda s: {"a": s["a"](time=-1), "b": s["b"](time=-1)}, steps=2,
                        boundary="periodic", store=tmp / "x")
    assert not (tmp / "x").exists()


def check_staggered_still_refused(tmp: Path) -> None:
    with pytest.raises(XStencilError, match=r"store= is not available with grid= \(a "
                                            r"staggered scan\)"):
        initial().to_dataset().stencil.scan(diffuse, **OPTS, grid={"X": {"center": "x"}},
                                             store=tmp / "g")
    assert not (tmp / "g").exists()


def run_checks() -> dict[str, str]:
    out = {}
    for name, fn in sorted(globals().items()):
        if name.startswith("check_") and callable(fn):
            try:
                with tempfile.TemporaryDirectory() as d:
                    fn(Path(d))
                out[name[len("check_"):]] = "ok"
            except (Exception, pytest.fail.Exception):  # noqa: BLE001 - reported per check
                out[name[len("check_"):]] = traceback.format_exc()
    return out


def kill(store: str, when: str) -> None:
    write, mark, n = stream._write, stream._mark, [0]

    def w(ds: xr.Dataset, path: str, run: object, first: bool) -> None:
        n[0] += 1
        if n[0] == 3 and when == "mid-write":
            write(ds.isel(time=slice(0, ds.sizes["time"] // 2)), path, run, first)
            os.kill(os.getpid(), signal.SIGKILL)
        write(ds, path, run, first)
        if n[0] == 3 and when == "before-marker":
            os.kill(os.getpid(), signal.SIGKILL)

    def m(path: str, meta: dict, done: int) -> None:
        mark(path, meta, done)
        if n[0] == 3 and when == "after-marker":
            os.kill(os.getpid(), signal.SIGKILL)

    stream._write, stream._mark = w, m
    sharded().stencil.scan(diffuse, **OPTS, store=store, segment=2)


def resume(store: str) -> dict[str, str]:
    out = {}
    try:
        done = xr.open_zarr(store, consolidated=False).attrs[stream.STORE_KEY]["complete"]
        res = sharded().stencil.scan(diffuse, **OPTS, store=store, resume=True, segment=2)
        ref = sharded().stencil.scan(diffuse, **OPTS)
        xr.testing.assert_identical(res.load(), host(ref))  # nothing lost or duplicated
        again = sharded().stencil.scan(diffuse, **OPTS, store=store, resume=True)
        xr.testing.assert_identical(again.load(), host(ref))  # complete: reopened
        out["resume"] = "ok"
        out["complete_before"] = str(done)
    except (Exception, pytest.fail.Exception):  # noqa: BLE001 - reported to the test
        out["resume"] = traceback.format_exc()
    return out


def main(argv: list[str]) -> None:
    assert jax.device_count() == 4, jax.devices()
    commands: dict[str, Callable[..., object]] = {"equal": run_checks, "kill": kill,
                                                  "resume": resume}
    result = commands[argv[1]](*argv[2:])
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv)

"""Sharding checks, run in a subprocess by tests/test_shard.py.

JAX reads ``XLA_FLAGS`` once, at import, so 4 simulated CPU devices need a
fresh interpreter: ``XLA_FLAGS=--xla_force_host_platform_device_count=4
python tests/shard_checks.py`` prints one JSON object, check name -> "ok" or
the failure's traceback.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
import types

# kernex 0.2.1 (the bench group) installs a top-level ``tests`` package, which
# would shadow this repository's tests/ (a namespace package) in a subprocess
_tests = sys.modules.setdefault("tests", types.ModuleType("tests"))
_tests.__path__ = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import xarray as xr  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import xstencil  # noqa: E402, F401
from tests import fields  # noqa: E402
from tests.fields import heat, same  # noqa: E402
from xstencil import XStencilError  # noqa: E402
from xstencil._backends.shard import make_mesh  # noqa: E402
from xstencil._labelled.dispatch import sharded_hlo  # noqa: E402

jax.config.update("jax_numpy_dtype_promotion", "strict")

MODES = ("fill", "extend", "periodic", "reflect", "symmetric")
MESHES = ({"x": "i"}, {"y": "i"}, {"y": "a", "x": "b"})


def field(dtype=np.float32):
    return fields.field(dtype, (32, 48))  # divisible over 4 devices


def lap(u):
    return u(x=1) + u(x=-2) + 2 * u(y=1) - u(y=-1) - 4 * u()


def check_devices():
    assert jax.device_count() == 4, jax.devices()


def check_modes_and_meshes():
    da = field()
    for mode in MODES:
        ref = da.stencil.map(lap, boundary=mode)
        for mesh in MESHES:
            same(da.stencil.map(lap, boundary=mode, devices=mesh), ref)


def check_backend_mix():
    """dask arrays and sharded JAX arrays in one call: no backend runs both."""
    from xstencil._backends import backend_for

    da = field()
    x = jax.device_put(da.values, NamedSharding(make_mesh(("y", "x")), P("y", "x")))
    lazy = da.chunk({"x": 25})
    assert backend_for([x]) == "shard" and backend_for([lazy.data]) == "dask"
    ds = xr.Dataset({"a": lazy, "b": da.copy(data=x)})
    msg = r"array 0 is a dask array but array 1 is a JAX array sharded over devices"
    _raises(lambda: ds.stencil.map(lambda s: s["a"](x=1) + s["b"]()), msg)
    _raises(lambda: ds.stencil.scan(lambda s: {"a": s["a"](time=-1), "b": s["b"](time=-1)},
                                    "time", steps=2), msg)


def check_output_sharding():
    da = field()
    out = da.stencil.map(lap, boundary="periodic", devices={"y": "a", "x": "b"})
    sh = out.data.sharding
    assert isinstance(sh, NamedSharding) and sh.spec == P("a", "b"), sh
    assert len(out.data.addressable_shards) == 4
    assert out.data.addressable_shards[0].data.shape == (16, 24)


def check_presharded_input():
    da = field()
    for mesh in (make_mesh(("y", "x")), jax.make_mesh((2, 2), ("y", "x"))):  # Auto, Explicit
        x = jax.device_put(da.values, NamedSharding(mesh, P("y", "x")))
        out = da.copy(data=x).stencil.map(lap, boundary="reflect")
        same(out, da.stencil.map(lap, boundary="reflect"))
        assert out.data.sharding.spec == P("y", "x")


def check_hlo_collective_permute():
    da = field()
    for mode in ("periodic", "extend"):
        hlo = sharded_hlo(da, lap, boundary=mode, devices={"y": "a", "x": "b"})
        assert "collective-permute" in hlo, mode
        assert "all-gather" not in hlo and "all-reduce" not in hlo, mode


def check_float64():
    da = field(np.float64)
    for mode in ("periodic", "symmetric"):
        out = da.stencil.map(lap, boundary=mode, devices={"x": "i"})
        assert out.dtype == np.float64
        same(out, da.stencil.map(lap, boundary=mode), rtol=1e-12)


def check_coords_stride_mesh_window():
    da = field()
    nonuniform = da.assign_coords(x=np.linspace(0.0, 2.0, 48) ** 2)

    def ddx(u):
        x = u.coord("x")
        return (u(x=1) - u(x=-1)) / (x(x=1) - x(x=-1))

    for mode in ("extend", "periodic", "reflect"):
        # a period only across a periodic seam (elsewhere it is refused: it would be ignored)
        kw = dict(boundary=mode, period={"x": 5.0} if mode == "periodic" else None)
        same(nonuniform.stencil.map(ddx, devices={"x": "i"}, **kw),
             nonuniform.stencil.map(ddx, **kw), rtol=1e-5)
    kw = dict(boundary="extend", stride={"x": 2, "y": 4})
    same(da.stencil.map(lap, devices={"y": "a", "x": "b"}, **kw), da.stencil.map(lap, **kw))
    w = np.arange(9, dtype=np.float32).reshape(3, 3)
    kw = dict(window={"y": 3, "x": 3}, boundary={"y": "reflect", "x": "periodic"})
    same(da.stencil.map(lambda u: (u * w).sum(), devices={"y": "a", "x": "b"}, **kw),
         da.stencil.map(lambda u: (u * w).sum(), **kw))

    def regions(m):
        m[...] = lap
        m.loc[{"x": slice(1.0, 2.5)}] = lambda u: 3 * u(x=1)
        m[{"y": -1}] = lambda u: 7.0
        m[da > 0.9] = lambda u: -u()
        return m.map()

    same(regions(da.stencil.mesh(boundary="extend", devices={"y": "a", "x": "b"})),
         regions(da.stencil.mesh(boundary="extend")))


def check_dataset():
    da = field()
    ds = xr.Dataset({"u": da, "h": 2 * da})

    def k(s):
        return {"u": s["h"](x=1) - s["h"](x=-1), "h": 2 * s["u"](y=1)}

    ref = ds.stencil.map(k, boundary="periodic")
    out = ds.stencil.map(k, boundary="periodic", devices={"y": "a", "x": "b"})
    for n in ("u", "h"):
        same(out[n], ref[n])
        assert out[n].data.sharding.spec == P("a", "b")


def check_bad_input():
    da = field()
    cases = [
        (dict(devices={"z": "i"}), r"devices=\{'z': 'i'\}: dimension 'z' not found"),
        (dict(devices="x"), r"must map dim names to mesh axis names"),
        (dict(devices={"x": "i"}, boundary="valid"), r"'valid' along the sharded dim 'x'"),
    ]
    for kw, match in cases:
        _raises(lambda kw=kw: da.stencil.map(lap, **kw), match)
    _raises(lambda: da.isel(x=slice(0, 47)).stencil.map(lap, devices={"x": "i"}),
            r"47 points, which does not divide evenly over the 4 devices of mesh axis 'i'")
    _raises(lambda: da.isel(x=slice(0, 4)).stencil.map(lambda u: u(x=2), boundary="reflect",
                                                       devices={"x": "i"}),
            r"each device holds 1 points of 'x'")


def check_scan_modes_and_halo_depth():
    from xstencil._labelled.scale import scan_sharded
    from xstencil._labelled.scan import scan

    u0 = field()
    for mode, mesh, k in (("periodic", {"x": "i"}, 1), ("extend", {"y": "a", "x": "b"}, 4),
                          ("reflect", {"y": "i"}, 3), ("symmetric", {"y": "a", "x": "b"}, 2),
                          ("fill", {"x": "i"}, 5)):
        kw = dict(steps=10, boundary=mode, save_every=5, fill_value=0.0 if mode == "fill"
                  else None)
        out = scan_sharded(u0, heat, "time", devices=mesh, halo_every=k, **kw)
        same(out, scan(u0, heat, dim="time", **kw), rtol=1e-5)
        names = tuple(mesh.get(d) for d in ("y", "x"))
        assert out.data.sharding.spec == P(None, *names), out.data.sharding


def check_scan_hlo():
    from xstencil._labelled.scale import scan_sharded

    hlo = scan_sharded(field(), heat, "time", steps=8, save_every="last", boundary="extend",
                       devices={"y": "a", "x": "b"}, halo_every=4, hlo=True)
    assert "collective-permute" in hlo and "all-gather" not in hlo


def check_scan_coords():
    from xstencil._labelled.scale import scan_sharded
    from xstencil._labelled.scan import scan

    u0 = field(np.float64).assign_coords(x=np.linspace(0.0, 1.0, 48) ** 2)

    def k(u):
        x = u.coord("x")
        return (u(time=-1) + 1e-3 * (u(time=-1, x=1) - u(time=-1, x=-1)) / (x(x=1) - x(x=-1))
                + 0.01 * u(time=-1, y=1) * u.coord("y")())

    for mode, mesh, steps in (("periodic", {"x": "i"}, 2), ("reflect", {"y": "a", "x": "b"}, 3)):
        kw = dict(steps=6, boundary=mode, period={"x": 1.5} if mode == "periodic" else None)
        same(scan_sharded(u0, k, "time", devices=mesh, halo_every=steps, **kw),
             scan(u0, k, dim="time", **kw), rtol=1e-12)


def check_scan_trajectory_last_float64():
    from xstencil._labelled.scale import scan_sharded
    from xstencil._labelled.scan import scan

    u0 = field(np.float64)
    traj = xr.concat([u0] + [0.5 * u0] * 5, "time").assign_coords(time=np.arange(6.0))

    def k(u):
        return u(time=-1) + 0.1 * (u(time=-1, x=1) - u(time=-1)) + 0.01 * u(time=1)

    same(scan_sharded(traj, k, "time", devices={"x": "i"}, halo_every=2, boundary="periodic"),
         scan(traj, k, dim="time", boundary="periodic"), rtol=1e-12)
    kw = dict(steps=9, save_every="last", boundary="extend")
    out = scan_sharded(u0, heat, "time", devices={"y": "a", "x": "b"}, halo_every=3, **kw)
    assert out.dtype == np.float64 and out.data.sharding.spec == P("a", "b")
    same(out, scan(u0, heat, dim="time", **kw), rtol=1e-12)


def _scan_mesh(obj, devices, boundary):
    """A function mesh with a position slab, a label slab, a strided line, a
    mask and (over a trajectory) a time window."""
    m = xstencil.mesh(obj, boundary=boundary, devices=devices)
    m[...] = heat
    m[{"x": slice(0, 5)}] = lambda u: 0.5 * u(time=-1)
    m.loc[{"y": slice(0.3, 0.5)}] = lambda u: u(time=-1) + 1.0
    m[{"x": 20, "y": slice(None, None, 3)}] = lambda u: 0.0 * u(time=-1)
    mask = (obj.x > 1.5) & (obj.y < 0.2)
    if "time" in obj.dims:
        mask = mask & (obj.time > 2)
        m[{"time": slice(4, 6)}] = lambda u: 2.0 + 0.0 * u(time=-1)
    m[mask] = lambda u: -1.0 + 0.0 * u(time=-1)
    return m


def check_scan_function_mesh():
    u0 = field()
    traj = xr.concat([u0] * 7, "time").assign_coords(time=np.arange(7.0))
    for obj, kw in ((u0, dict(steps=9)), (traj, {})):
        for mode, devices, k in (("periodic", {"x": "i"}, 2), ("extend", {"y": "a", "x": "b"}, 3),
                                 ("fill", {"y": "i"}, 1)):
            kw2 = dict(kw, fill_value=0.0) if mode == "fill" else kw
            ref = _scan_mesh(obj, None, mode).scan("time", **kw2)
            out = _scan_mesh(obj, devices, mode).scan("time", halo_every=k, **kw2)
            assert len(out.data.sharding.device_set) == 4, out.data.sharding
            same(out, ref, rtol=1e-5)
            plain = obj.stencil.scan(heat, "time", boundary=mode, **kw2)
            assert not np.allclose(np.asarray(plain.data), np.asarray(ref.data))


def check_scan_dataset():
    """Two advanced fields (in different dim orders) and a constant one."""
    from tests.shallow import dataset
    from tests.shallow import kernel as sw

    ds = dataset(32, 48)
    traj = xr.concat([ds[["h", "u"]]] * 5, "time").assign_coords(time=np.arange(5.0))
    traj["b"] = ds["b"]
    forced = traj.assign(F=xr.DataArray(np.random.default_rng(5).random((5, 32, 48)),
                                        dims=("time", "y", "x")))

    def sw_forced(s):
        out = sw(s)
        return {"h": out["h"] + 0.01 * s["F"](time=0) - 0.005 * s["F"](time=-1), "u": out["u"]}

    for obj, kw, kernel in ((ds, dict(steps=8, save_every=4), sw),
                            (ds, dict(steps=5, save_every="last"), sw), (traj, {}, sw),
                            (forced, dict(save_every=2), sw_forced)):
        for devices, mode, k in (({"x": "i"}, "periodic", 2),
                                 ({"y": "a", "x": "b"}, {"x": "periodic", "y": "reflect"}, 3)):
            ref = obj.stencil.scan(kernel, "time", boundary=mode, **kw)
            out = obj.stencil.scan(kernel, "time", boundary=mode, devices=devices, halo_every=k,
                                   **kw)
            assert list(out.data_vars) == list(ref.data_vars) and out.attrs == ref.attrs
            for n in ref.data_vars:
                same(out[n], ref[n], rtol=1e-12)
            assert len(out["h"].data.sharding.device_set) == 4


def check_scan_check_finite():
    from xstencil._labelled.scale import scan_sharded
    from xstencil._labelled.scan import scan

    def unstable(u):
        return u(time=-1) + 0.9 * (u(time=-1, x=1) + u(time=-1, x=-1) + u(time=-1, y=1)
                                   + u(time=-1, y=-1) - 4 * u(time=-1))

    u0 = field(np.float64)
    kw = dict(steps=450, boundary="periodic", check_finite=True, save_every="last")
    try:
        scan(u0, unstable, dim="time", **kw)
        raise AssertionError("the in-memory scan did not raise")
    except XStencilError as e:
        want = str(e).split("position ")[1].split(" ")[0]
    for devices, k in (({"x": "i"}, 1), ({"y": "a", "x": "b"}, 4)):
        _raises(lambda devices=devices, k=k: scan_sharded(u0, unstable, "time", devices=devices,
                                                          halo_every=k, **kw),
                rf"first appeared at position {want} along 'time'")
    out = scan_sharded(u0, heat, "time", steps=6, boundary="extend", check_finite=True,
                       devices={"x": "i"}, halo_every=3)
    assert np.isfinite(np.asarray(out.data)).all()


def check_scan_time_coord():
    """u.coord('time') per step, and absolute coordinates across a periodic
    seam with a deep halo."""
    import jax.numpy as jnp

    from xstencil._labelled.scale import scan_sharded
    from xstencil._labelled.scan import scan

    def forced(u):
        t, x = u.coord("time"), u.coord("x")
        return (u(time=-1) + 0.1 * (u(time=-1, x=1) - 2 * u(time=-1) + u(time=-1, x=-1))
                + 0.01 * jnp.sin(t()) * x() + 0.001 * (t() - t(time=-1)))

    u0 = field(np.float64)
    for kw in (dict(steps=9, dt=0.3), dict(steps=8, save_every="last")):
        for devices, k in (({"x": "i"}, 3), ({"y": "a", "x": "b"}, 2)):
            kw2 = dict(kw, boundary="periodic")
            same(scan_sharded(u0, forced, "time", devices=devices, halo_every=k, **kw2),
                 scan(u0, forced, dim="time", **kw2), rtol=1e-12)


def check_scan_progress():
    """progress=True: a bar fed from inside the sharded loop by the first
    device, at the step counts the host asks for (the adaptive rule of the
    in-memory scans), and completed at the end."""
    from xstencil import _progress
    from xstencil._labelled.scale import scan_sharded
    from xstencil._labelled.scan import scan

    seen = []
    report, interval = _progress.report, _progress.INTERVAL
    _progress.report = lambda token, done: (seen.append(int(done)), report(token, done))[1]
    _progress.INTERVAL = 0.0  # the host asks for a report at each test
    try:
        kw = dict(steps=40, boundary="periodic", save_every="last")
        out = scan_sharded(field(), heat, "time", devices={"x": "i"}, halo_every=4,
                           progress=True, **kw)
    finally:
        _progress.report, _progress.INTERVAL = report, interval
    same(out, scan(field(), heat, dim="time", **kw), rtol=1e-5)
    # one report per block of 4 steps, from one device only (no repeats)
    assert seen == list(range(4, 41, 4)), seen
    assert not _progress._OPEN  # the bar was closed


def check_scan_gradients_and_checkpoint():
    """jax.grad through a sharded scan equals the in-memory gradient, and
    checkpoint=True (one carry per block of K steps) needs less memory."""
    u0 = field()

    def heat_nu(u, nu):
        return u(time=-1) + nu * (u(time=-1, x=1) - 2 * u(time=-1) + u(time=-1, x=-1)
                                  + u(time=-1, y=1) - u(time=-1, y=-1))

    def loss(nu, **kw):
        out = u0.stencil.scan(heat_nu, "time", nu, steps=60, boundary="periodic",
                              save_every="last", **kw)
        return (out ** 2).sum().data

    nu = np.float32(0.1)
    ref = jax.grad(loss)(nu)
    temps = {}
    for ck in (False, True):
        f = jax.jit(jax.grad(lambda nu, ck=ck: loss(nu, devices={"x": "i"}, halo_every=6,
                                                    checkpoint=ck)))
        # float32 through 60 steps and a sum of 1536 squares: the two programs sum in
        # different orders (measured 1.07e-5 apart)
        np.testing.assert_allclose(np.asarray(f(nu)), np.asarray(ref), rtol=5e-5)
        temps[ck] = f.lower(nu).compile().memory_analysis().temp_size_in_bytes
    assert temps[True] < temps[False] / 2, temps


def check_scan_bad_input():
    from xstencil._labelled.scale import scan_sharded

    u0 = field()
    _raises(lambda: scan_sharded(u0, heat, "time", steps=4, devices={"z": "i"}),
            r"dimension 'z' not found")
    _raises(lambda: scan_sharded(u0, heat, "time", steps=4, devices={"x": "i"}, halo_every=13),
            r"each device holds 12 points of 'x', fewer than a halo of halo_every=13")
    _raises(lambda: scan_sharded(u0.isel(x=slice(0, 46)), heat, "time", steps=4,
                                 devices={"x": "i"}), r"46 points, which does not divide evenly")
    sharded = u0.copy(data=jax.device_put(u0.values, NamedSharding(make_mesh({"i": 4}),
                                                                   P(None, "i"))))
    _raises(lambda: xstencil.scan(sharded, step=lambda s: s, steps=2),
            r"step= runs on one device, but the data is sharded over several")


def _raises(fn, match):
    import re

    try:
        fn()
    except XStencilError as e:
        assert re.search(match, str(e)), (match, str(e))
        return
    raise AssertionError(f"no XStencilError matching {match!r}")


CHECKS = {name[6:]: fn for name, fn in dict(globals()).items() if name.startswith("check_")}


def main(names):
    out = {}
    for name in names or CHECKS:
        try:
            CHECKS[name]()
            out[name] = "ok"
        except Exception:
            out[name] = traceback.format_exc()
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])

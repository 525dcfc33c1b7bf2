"""dask-backed DataArrays: lazy maps and scans identical to in-memory ones
(xstencil._backends.dask, xstencil._backends.dask_scan)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr
from hypothesis import given, settings

import xstencil  # noqa: F401 - registers .stencil
from tests.fields import field, heat, same
from tests.shallow import dataset as shallow_dataset
from tests.shallow import kernel as shallow_kernel
from xstencil import XStencilError

dask = pytest.importorskip("dask")
dsa = pytest.importorskip("dask.array")

MODES = ["fill", "extend", "periodic", "reflect", "symmetric", "valid"]


def slow(*values: Any) -> Any:
    """One parametrization that runs with the slow tests (``.ci/run``'s second stage)."""
    return pytest.param(*values, marks=pytest.mark.slow)


def lap(u):
    return u(x=1) + u(x=-1) + 2 * u(y=1) - u(y=-2) - 4 * u()


def _worker_ok() -> bool:
    """Runs on a dask worker: this module's functions reach it."""
    return lap is not None


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("chunks", [slow({"y": 10, "x": 16}), {"y": (3, 20, 14), "x": 25}])
def test_map_matches_memory(mode, chunks):
    da = field()
    ref = da.stencil.map(lap, boundary=mode)
    out = da.chunk(chunks).stencil.map(lap, boundary=mode)
    assert isinstance(out.data, dsa.Array)
    if mode != "valid":
        assert out.chunks == da.chunk(chunks).chunks
    same(out.compute(scheduler="threads"), ref)


@pytest.mark.parametrize("mode", ["fill", slow("extend"), slow("periodic"), "reflect",
                                  slow("symmetric")])
def test_float64_stays_float64(mode):
    da = field(np.float64)
    out = da.chunk({"y": 10, "x": 20}).stencil.map(lap, boundary=mode)
    assert out.dtype == np.float64
    ref = da.stencil.map(lap, boundary=mode)
    same(out.compute(), ref, rtol=1e-12)


def test_per_dim_boundary_window_array_and_stride():
    da = field()
    w = np.arange(9, dtype=np.float32).reshape(3, 3) / 9
    kw = dict(window={"y": 3, "x": 3}, boundary={"x": "periodic", "y": "reflect"})
    same(da.chunk({"y": 9, "x": 11}).stencil.map(lambda u: (u * w).sum(), **kw),
         da.stencil.map(lambda u: (u * w).sum(), **kw))
    for mode in ("extend", "valid"):
        kw = dict(boundary=mode, stride={"x": 3, "y": 2})
        same(da.chunk({"y": 10, "x": 16}).stencil.map(lap, **kw), da.stencil.map(lap, **kw))


def test_coordinate_windows_per_block():
    da = field().assign_coords(x=np.linspace(0.0, 2.0, 50) ** 2)

    def ddx(u):
        x = u.coord("x")
        return (u(x=1) - u(x=-1)) / (x(x=1) - x(x=-1))

    for mode in ("extend", "periodic", "reflect", "symmetric"):
        kw = dict(boundary=mode, period={"x": 5.0} if mode == "periodic" else None)
        same(da.chunk({"x": 7}).stencil.map(ddx, **kw), da.stencil.map(ddx, **kw), rtol=1e-5)


def test_mesh_across_chunk_borders():
    da = field()

    def build(obj):
        m = obj.stencil.mesh(boundary="extend")
        m[...] = lap
        m.loc[{"x": slice(0.5, 1.3)}] = lambda u: 3 * u(x=1)
        m[{"y": slice(5, 30, 4)}] = lambda u: u(y=-1) - u()
        m[{"y": -1}] = lambda u: 7.0
        m[da > 0.9] = lambda u: -u()
        return m.map()

    same(build(da.chunk({"y": 8, "x": 13})), build(da))


def test_dataset_and_output_dims():
    da = field()
    ds = xr.Dataset({"u": da, "h": 2 * da})

    def k(s):
        return {"u": s["h"](x=1) - s["h"](x=-1), "h": 2 * s["u"](y=1)}

    ref = ds.stencil.map(k, boundary="periodic")
    out = ds.chunk({"x": 20}).stencil.map(k, boundary="periodic")
    for n in ("u", "h"):
        same(out[n], ref[n])
    kw = dict(window={"x": 3}, boundary="extend", output_dims="k")
    same(da.chunk({"x": 20}).stencil.map(lambda u: u.array, **kw), da.stencil.map(
        lambda u: u.array, **kw))


def _explode(block):
    raise RuntimeError("computed during construction")


def bomb_of(da, chunks):
    """``da`` backed by a dask array whose every block raises when computed."""
    return da.copy(data=dsa.from_array(da.values, chunks=chunks).map_blocks(
        _explode, dtype=da.dtype))


def test_lazy_until_computed():
    da = field()
    bomb = bomb_of(da, (10, 16))
    out = bomb.stencil.map(lap, boundary="periodic")
    m = bomb.stencil.mesh(boundary="reflect")
    m[...] = lap
    m[{"x": 0}] = lambda u: 0.0
    out2 = m.map()
    assert isinstance(out.data, dsa.Array) and isinstance(out2.data, dsa.Array)
    with pytest.raises(RuntimeError, match="computed during construction"):
        out.compute()


def test_mesh_option_on_dask_data():
    with pytest.raises(XStencilError, match=r"devices=\{'x': 'i'\} shards JAX arrays.*dask array"):
        field().chunk({"x": 10}).stencil.map(lap, devices={"x": "i"})


def test_chunks_smaller_than_halo():
    da = field().chunk({"y": 12})  # 12, 12, 12, 1
    with pytest.raises(XStencilError, match=r"dim 'y' has a chunk of 1 points, smaller than "
                                            r"the window's halo of 2.*\(12, 12, 13\)"):
        da.stencil.map(lap, boundary="extend")


def test_dim_shorter_than_halo_says_no_chunking_helps():
    """A dim of 3 points under a halo of 4: rechunking cannot help (the old
    message suggested the chunks it already had, ``.chunk({'y': 3})``)."""
    da = xr.DataArray(dsa.from_array(np.ones((3, 8)), chunks=(3, 4)), dims=("y", "x"))
    with pytest.raises(XStencilError, match=r"dim 'y' has 3 points in all, fewer than the "
                                            r"window's halo of 4.*no rechunking can supply it"
                                            r".*obj.compute\(\)"):
        da.stencil.map(lambda u: u(y=4) + u(x=1), boundary="extend")


@pytest.mark.parametrize("backend", ["xla", "loops"])
@pytest.mark.parametrize("n", [2, 3, 4])
def test_reflect_on_one_chunk_as_long_as_the_halo(backend: str, n: int):
    """One chunk of ``n`` points along a ``"reflect"`` dim under a halo of
    ``n``: the low halo needs ``n + 1`` cells (numpy's reflect), one past the
    chunk, and read the high halo before it was rebuilt (max error 1.35 at
    n = 3, silently, on both block backends). Reference: ``np.pad`` and a
    plain loop."""
    rng = np.random.default_rng(n)
    a = rng.random((n, 6))
    w = rng.random(2 * n + 1)
    ref = np.pad(a, ((n, n), (0, 0)), mode="reflect")
    ref = sum(w[j] * ref[j:j + n] for j in range(2 * n + 1))
    da = xr.DataArray(dsa.from_array(a, chunks=(n, 3)), dims=("y", "x"))
    out = da.stencil.map(lambda u: sum(w[j] * u(y=j - n) for j in range(2 * n + 1)),
                         boundary={"y": "reflect", "x": "extend"}, backend=backend)
    assert isinstance(out.data, dsa.Array)
    np.testing.assert_allclose(out.values, ref, rtol=1e-5)


@pytest.mark.slow  # a LocalCluster of two worker processes: about a minute
def test_distributed_local_cluster() -> None:
    distributed = pytest.importorskip("distributed")
    import xstencil._backends.dask as xd
    from xstencil._labelled.scale import scan_dask

    # The kernels live in this tests tree, which dask pickles by reference, and the worker
    # processes must import it by the same names.  ``tests`` here is a namespace package
    # (no __init__.py, pytest's importlib mode); with the bench extra installed, kernex's
    # wheel puts a regular ``tests`` package in site-packages, which wins in a fresh
    # process ("No module named 'tests.backends'"), and a worker that cannot unpickle a
    # task hangs the client's gather forever.  So point each worker's ``tests`` here
    # first, and check, with a timeout, that it runs this module's functions.
    tests_dir = str(Path(__file__).resolve().parents[1])
    here = ("import sys, types\n"
            "sys.modules.pop('tests', None)\n"
            "m = types.ModuleType('tests')\n"
            f"m.__path__ = [{tests_dir!r}]\n"
            "sys.modules['tests'] = m\n")
    da = field(shape=(64, 64))
    refs = {m: da.stencil.map(lap, boundary=m) for m in ("periodic", "reflect")}
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=":0", worker_dashboard_address=":0") \
            as cluster, distributed.Client(cluster) as client:
        client.run(exec, here, {})
        # a worker that cannot run this module's functions fails here, not in a hang
        for w in client.scheduler_info()["workers"]:
            assert client.submit(_worker_ok, workers=[w], pure=False).result(timeout=120)
        for m, ref in refs.items():
            out = da.chunk({"y": 16, "x": 16}).stencil.map(lap, boundary=m)
            same(out.compute(), ref)
        counts = client.run(xd.compile_count)
        # 32 steps, 4 per task: 8 layers of 16 tasks, one block geometry
        kw = dict(dim="time", steps=32, save_every=16, boundary="periodic")
        out = scan_dask(da.chunk({"y": 16, "x": 16}), heat, halo_every=4, **kw)
        same(out.compute(), memory_scan(da, heat, **kw), rtol=1e-5)
        after = client.run(xd.compile_count)
        mesh_ref = _heat_mesh(da, "periodic").scan(**kw)
        out = _heat_mesh(da.chunk({"y": 16, "x": 16}), "periodic").scan(halo_every=4, **kw)
        same(out.compute(), mesh_ref, rtol=1e-5)
        with_mesh = client.run(xd.compile_count)
        # the CPU loop backend on the workers (dask_loops.py, dask_loop_scan.py): the
        # blocks' nests and the tasks' loop scans are pickled there and run as in memory
        if importlib.util.find_spec("numba") is not None:
            ref = da.stencil.map(lap, boundary="reflect", backend="loops")
            out = da.chunk({"y": 16, "x": 32}).stencil.map(lap, boundary="reflect",
                                                           backend="loops")
            np.testing.assert_array_equal(out.compute().values, ref.values)
            loops = client.run(xd.compile_count)
            assert all(loops[w] - with_mesh[w] <= 4 for w in loops), (with_mesh, loops)
            kw = dict(steps=8, save_every=4, boundary="extend", backend="loops")
            ref = da.stencil.scan(heat, "time", **kw)
            out = da.chunk({"y": 16, "x": 32}).stencil.scan(heat, "time", halo_every=4, **kw)
            np.testing.assert_array_equal(out.compute().values, ref.values)
            # a function mesh's tasks: each block's mesh (of Mesh's class) built on a worker
            kw = dict(steps=8, save_every=4, backend="loops")
            ref = _heat_mesh(da, "extend").scan("time", **kw)
            out = _heat_mesh(da.chunk({"y": 16, "x": 32}), "extend").scan("time", halo_every=4,
                                                                          **kw)
            np.testing.assert_array_equal(out.compute().values, ref.values)
    # a function mesh: one more compile per worker (positions are run-time arguments)
    assert all(with_mesh[w] - after[w] <= 1 for w in after), (after, with_mesh)
    # 16 tasks per map; 9 block geometries at most for the in-block padded reflect
    # (corner/edge/interior) and 1 for periodic: compiles stay per geometry, not per task.
    assert all(0 < c <= 10 for c in counts.values()), counts
    assert all(after[w] - counts[w] <= 1 for w in counts), (counts, after)


# -- scans ------------------------------------------------------------------------------


def memory_scan(obj, kernel, **kw):
    scan = pytest.importorskip("xstencil._labelled.scan").scan
    return scan(obj, kernel, **kw)


@pytest.mark.parametrize(("mode", "chunks", "k"), [
    ("periodic", {"x": 11}, None),
    ("extend", {"y": (8, 12, 10), "x": 15}, 1),
    ("reflect", {"y": (8, 12, 10), "x": 15}, 5),
    ("symmetric", {"x": 22}, 2),
    ("fill", {"y": 15}, 3),
])
def test_scan_matches_memory(mode, chunks, k):
    from xstencil._labelled.scale import scan_dask

    u0 = field(shape=(30, 44))
    kw = dict(dim="time", steps=10, boundary=mode, save_every=5,
              fill_value=0.0 if mode == "fill" else None)
    out = scan_dask(u0.chunk(chunks), heat, halo_every=k, **kw)
    assert isinstance(out.data, dsa.Array)
    same(out.compute(), memory_scan(u0, heat, **kw), rtol=1e-5)


def test_scan_trajectory_reads_input_and_float64():
    from xstencil._labelled.scale import scan_dask

    u0 = field(np.float64, shape=(20, 30))
    traj = xr.concat([u0] + [0.5 * u0] * 7, "time").assign_coords(time=np.arange(8.0))
    traj = traj.transpose("y", "time", "x")

    def k(u):
        return u(time=-1) + 0.1 * (u(time=-1, x=1) - u(time=-1)) + 0.01 * u() + 0.01 * u(time=1)

    ref = memory_scan(traj, k, dim="time", boundary="periodic")
    out = scan_dask(traj.chunk({"x": 10}), k, "time", halo_every=2, boundary="periodic")
    assert out.dtype == np.float64 and out.dims == ("y", "time", "x")
    same(out.compute(), ref, rtol=1e-12)
    last = scan_dask(u0.chunk({"y": 10}), heat, "time", steps=10, save_every="last",
                     boundary="reflect", halo_every=3)
    same(last.compute(), memory_scan(u0, heat, dim="time", steps=10, save_every="last",
                                     boundary="reflect"), rtol=1e-12)


def test_scan_coords_per_block():
    from xstencil._labelled.scale import scan_dask

    u0 = field(np.float64, shape=(20, 30)).assign_coords(x=np.linspace(0.0, 1.0, 30) ** 2)

    def k(u):
        x = u.coord("x")
        return (u(time=-1) + 1e-3 * (u(time=-1, x=1) - u(time=-1, x=-1)) / (x(x=1) - x(x=-1))
                + 0.01 * u(time=-1, y=1) * u.coord("y")())

    for mode in ("periodic", "reflect"):  # a period only across a periodic seam
        kw = dict(steps=6, boundary=mode, period={"x": 1.5} if mode == "periodic" else None)
        out = scan_dask(u0.chunk({"y": 7, "x": 10}), k, "time", halo_every=3, **kw)
        same(out.compute(), memory_scan(u0, k, dim="time", **kw), rtol=1e-12)


def _heat_mesh(obj, boundary):
    """Heat with a cold strip by position, a source by label, a strided line,
    a mask and (over a trajectory) a time window."""
    m = obj.stencil.mesh(boundary=boundary)
    m[...] = heat
    m[{"x": slice(0, 4)}] = lambda u: 0.5 * u(time=-1)
    m.loc[{"y": slice(0.2, 0.4)}] = lambda u: u(time=-1) + 1.0
    m[{"x": 17, "y": slice(None, None, 3)}] = lambda u: 0.0
    mask = (obj.x > 1.2) & (obj.y < 0.3)
    if "time" in obj.dims:
        mask = mask & (obj.time > 2)
        m[{"time": slice(4, 6)}] = lambda u: 2.0
    m[mask] = lambda u: -1.0
    return m


@pytest.mark.parametrize(("mode", "chunks", "k"), [
    ("periodic", {"y": 10, "x": 12}, None),
    slow({"y": "extend", "x": "periodic", "time": "extend"}, {"x": 9}, 2),
    slow("fill", {"y": 8}, 1),
])
def test_scan_function_mesh_matches_memory(mode, chunks, k):
    """Regions by position, label, stride and mask, and a time window, on
    chunks with deep halos: the halo cells need the right kernels too, so
    membership follows each cell's global position."""
    u0 = field(shape=(24, 30))
    traj = xr.concat([u0] * 7, "time").assign_coords(time=np.arange(7.0))
    fill = {"fill_value": 0.0} if mode == "fill" else {}
    for obj, kw in ((u0, dict(steps=9, save_every=3)), (traj, {})):
        ref = _heat_mesh(obj, mode).scan("time", **kw, **fill)
        out = _heat_mesh(obj.chunk(chunks), mode).scan("time", halo_every=k, **kw, **fill)
        assert isinstance(out.data, dsa.Array)
        same(out.compute(), ref, rtol=1e-5)
        plain = memory_scan(obj, heat, dim="time", boundary=mode, **kw, **fill)
        assert not np.allclose(plain.values, ref.values)  # the mesh matters


def test_scan_function_mesh_is_lazy():
    u0 = field()
    out = _heat_mesh(bomb_of(u0, (10, 25)), "periodic").scan("time", steps=20)
    assert isinstance(out.data, dsa.Array)
    with pytest.raises(RuntimeError, match="computed during construction"):
        out.compute()


def same_dataset(out, ref):
    assert list(out.data_vars) == list(ref.data_vars) and out.attrs == ref.attrs
    for n in ref.data_vars:
        same(out[n], ref[n], rtol=1e-12)


@pytest.mark.parametrize(("boundary", "chunks", "k"), [
    slow("periodic", {"y": 10, "x": 8}, None),
    ({"x": "periodic", "y": "extend"}, {"x": 6}, 2),
    slow({"x": "reflect", "y": "fill"}, {"y": 5}, 1),
])
def test_scan_dataset_matches_memory(boundary, chunks, k):
    """The advanced variables travel stacked; the one the kernel does not
    return (the bathymetry) is a constant field with the same halo."""
    ds = shallow_dataset()
    fill = {"fill_value": 0.0} if "fill" in str(boundary) else {}
    for kw in (dict(steps=10, save_every=2), dict(steps=7, save_every="last")):
        ref = ds.stencil.scan(shallow_kernel, "time", boundary=boundary, **kw, **fill)
        out = ds.chunk(chunks).stencil.scan(shallow_kernel, "time", boundary=boundary, halo_every=k,
                                             **kw, **fill)
        assert all(isinstance(v.data, dsa.Array) for v in out.data_vars.values())
        same_dataset(out.compute(), ref)
    traj = xr.concat([ds[["h", "u"]]] * 6, "time").assign_coords(time=np.arange(6.0))
    traj["b"] = ds["b"]
    ref = traj.stencil.scan(shallow_kernel, "time", boundary=boundary, **fill)
    out = traj.chunk(chunks).stencil.scan(shallow_kernel, "time", boundary=boundary, halo_every=k,
                                           **fill)
    same_dataset(out.compute(), ref)


def forced_shallow(s):
    """Shallow water with a prescribed forcing F(time, y, x), read at the
    current and the previous position but not advanced."""
    out = shallow_kernel(s)
    return {"h": out["h"] + 0.01 * s["F"](time=0) - 0.005 * s["F"](time=-1), "u": out["u"]}


@pytest.mark.parametrize("save_every", [slow(1), 2, slow("last")])
def test_scan_dataset_with_forcing(save_every):
    ds = shallow_dataset()
    traj = xr.concat([ds[["h", "u"]]] * 7, "time").assign_coords(time=np.arange(7.0))
    traj["b"] = ds["b"]
    traj["F"] = xr.DataArray(np.random.default_rng(5).random((7, 20, 24)),
                             dims=("time", "y", "x"), attrs={"units": "m/s"})
    for boundary, chunks, k in (("periodic", {"x": 12}, 1),
                                ({"x": "reflect", "y": "extend"}, {"x": 8, "y": 10}, 3)):
        ref = traj.stencil.scan(forced_shallow, "time", boundary=boundary,
                                save_every=save_every)
        out = traj.chunk(chunks).stencil.scan(forced_shallow, "time", boundary=boundary,
                                               halo_every=k, save_every=save_every)
        same_dataset(out.compute(), ref)


def test_scan_dataset_function_mesh():
    ds = shallow_dataset()

    def mesh(obj):
        m = obj.stencil.mesh(boundary="periodic")
        m[...] = shallow_kernel
        m[{"x": slice(0, 3)}] = lambda s: {"h": s["h"](time=-1), "u": 0.0 * s["u"](time=-1)}
        m[obj.b > 0.04] = lambda s: {"h": s["h"](time=-1) + 0.01, "u": s["u"](time=-1)}
        return m

    ref = mesh(ds).scan("time", steps=8, save_every=4)
    out = mesh(ds.chunk({"x": 12, "y": 10})).scan("time", steps=8, save_every=4, halo_every=2)
    same_dataset(out.compute(), ref)


def test_scan_dataset_bad_input():
    ds = shallow_dataset().chunk({"x": 12})
    # the in-memory scan's check and message (one setup for every backend)
    with pytest.raises(XStencilError, match=r"the kernel returned \['h', 'u'\], which have no "
                                            r"dim 'time'; variables without 'time' are constants"):
        ds.assign(b=ds.b.expand_dims(time=1)).stencil.scan(shallow_kernel, "time", steps=2)
    with pytest.raises(XStencilError, match=r"need every variable over the same dims"):
        ds.assign(p=ds.h.isel(x=0)).stencil.scan(shallow_kernel, "time", steps=2)
    with pytest.raises(XStencilError, match=r"give them one dtype"):
        ds.assign(u=ds.u.astype(np.float32)).stencil.scan(
            lambda s: {"h": s["h"](time=-1), "u": s["u"](time=-1)}, "time", steps=2)


def unstable(u):
    return u(time=-1) + 0.9 * (u(time=-1, x=1) + u(time=-1, x=-1) + u(time=-1, y=1)
                               + u(time=-1, y=-1) - 4 * u(time=-1))


@pytest.mark.parametrize("save_every", [1, "last"])
def test_scan_check_finite(save_every):
    """The first non-finite position within a chunk's own cells raises when the
    graph runs (the halo's outer cells may hold garbage and are not checked);
    it is the position the in-memory scan names."""
    u0 = field(np.float64, shape=(24, 30))
    kw = dict(steps=400, boundary="periodic", check_finite=True, save_every=save_every)
    with pytest.raises(XStencilError, match=r"first appeared at position (\d+)") as mem:
        memory_scan(u0, unstable, dim="time", **kw)
    first = re.search(r"position (\d+)", str(mem.value)).group(1)
    out = u0.chunk({"x": 10}).stencil.scan(unstable, "time", halo_every=4, **kw)
    assert isinstance(out.data, dsa.Array)  # nothing runs before compute()
    with pytest.raises(XStencilError, match=rf"position {first} along 'time' \(time={first}\) "
                                            rf"in the chunk at x\[(\d+):(\d+)\]; check the "
                                            rf"time step") as e:
        out.compute()
    a, b = map(int, re.search(r"x\[(\d+):(\d+)\]", str(e.value)).groups())
    assert b - a == 10 and a % 10 == 0  # a whole chunk, named by its start and stop
    # fill with NaN (the default fill_value) only ever reaches the halo's outer cells
    ok = u0.chunk({"x": 10}).stencil.scan(heat, "time", steps=20, check_finite=True,
                                          boundary={"x": "fill", "y": "periodic"},
                                          fill_value=0.0, halo_every=5)
    assert np.isfinite(ok.values).all()


def test_scan_options_that_need_memory():
    u0 = field().chunk({"x": 25})
    with pytest.raises(XStencilError, match=r"checkpoint=True saves memory in gradients"):
        u0.stencil.scan(heat, "time", steps=3, checkpoint=True)
    with pytest.raises(XStencilError, match=r"step= runs in memory, but the data is "
                                            r"dask-backed; \.compute\(\) it first"):
        xstencil.scan(u0, step=lambda s: s, steps=3)


def forced(u):
    """Reads the time coordinate (a forcing and the step length) and the
    absolute x coordinate."""
    t, x = u.coord("time"), u.coord("x")
    return (u(time=-1) + 0.1 * (u(time=-1, x=1) - 2 * u(time=-1) + u(time=-1, x=-1))
            + 0.01 * jnp.sin(t()) * x() + 0.001 * (t() - t(time=-1)))


@pytest.mark.parametrize("kw", [dict(steps=9, dt=0.3), dict(steps=9, save_every="last"),
                                dict(steps=9, coord=np.arange(10.0) ** 2, save_every=3)],
                         ids=["dt", "positions", "coord"])
@pytest.mark.parametrize("boundary", ["periodic", slow("reflect")])
def test_scan_reads_time_and_absolute_coords(kw, boundary):
    """u.coord('time') is read per step; a cell of the deep halo from across
    a periodic seam reads x as that cell does in memory (the continued
    coordinate shifted back by the period)."""
    u0 = field(np.float64, shape=(16, 30))
    ref = memory_scan(u0, forced, dim="time", boundary=boundary, **kw)
    for k in (1, 3):
        out = u0.chunk({"x": 10}).stencil.scan(forced, "time", boundary=boundary,
                                                halo_every=k, **kw)
        same(out.compute(), ref, rtol=1e-12)
    traj = xr.concat([u0] * 6, "time").assign_coords(time=np.arange(6.0) ** 2)
    same(traj.chunk({"x": 10}).stencil.scan(forced, "time", boundary=boundary,
                                             halo_every=2).compute(),
         memory_scan(traj, forced, dim="time", boundary=boundary), rtol=1e-12)


def test_scan_is_lazy_and_rejects_chunked_scan_dim():
    from xstencil._labelled.scale import scan_dask

    u0 = field()
    bomb = bomb_of(u0, (10, 25))
    out = scan_dask(bomb, heat, "time", steps=50, boundary="periodic")
    with pytest.raises(RuntimeError, match="computed during construction"):
        out.compute()
    traj = xr.concat([u0] * 4, "time").chunk({"time": 2})
    with pytest.raises(XStencilError, match=r"chunked along the scanned dim 'time'.*"
                                            r"\.chunk\(\{'time': -1\}\)"):
        scan_dask(traj, heat, "time")
    with pytest.raises(XStencilError, match=r"halo of 8 that halo_every=8"):
        scan_dask(u0.chunk({"x": 5}), heat, "time", steps=8, halo_every=8)


def test_scale_out_dispatch():
    from xstencil._labelled.scale import scale_out

    u0 = field(shape=(20, 30))
    kw = dict(steps=4, boundary="periodic", save_every=2)
    assert scale_out(u0, heat, "time", (), kw) is None  # in memory: the caller scans
    out = scale_out(u0.chunk({"x": 10}), heat, "time", (), kw)
    assert isinstance(out.data, dsa.Array)
    same(out.compute(), memory_scan(u0, heat, dim="time", **kw), rtol=1e-5)
    with pytest.raises(XStencilError, match=r"checkpoint=True saves memory in gradients, but a "
                                            r"dask-backed scan is not differentiable"):
        scale_out(u0.chunk({"x": 10}), heat, "time", (), dict(kw, checkpoint=True))


# -- property: dask scans equal in-memory scans ---------------------------------------------

SCAN_MODES = ("fill", "extend", "periodic", "reflect", "symmetric")


def _scan_case_kernel(kind: str) -> Any:
    if kind == "diffuse":
        return lambda u: u(t=-1) + 0.2 * (u(t=-1, x=1) - 2 * u(t=-1) + u(t=-1, x=-1)
                                          + u(t=-1, y=1) - u(t=-1, y=-1))
    if kind == "two-back":  # reach 2 back in time and 2 along x
        return lambda u: 0.5 * u(t=-1) + 0.3 * u(t=-2) + 0.1 * (u(t=-1, x=2) - u(t=-2, x=-2))
    return lambda u: (u(t=-1) + 0.05 * (u(t=-1, y=1) - u(t=-1, x=-1)) * u.coord("x")()
                      + 0.01 * u.coord("t")())  # coordinates, absolute


def _chunks(n: int, c: int, need: int) -> tuple[int, ...]:
    """Chunks of ``c`` along a dim of ``n``, a last one shorter than ``need`` merged."""
    out = [c] * (n // c) + ([n % c] if n % c else [])
    if len(out) > 1 and out[-1] < need:
        out[-2:] = [out[-2] + out[-1]]
    return tuple(out)


@given(st.data())
@settings(max_examples=4)
def test_scan_dask_equals_memory_few(data: Any) -> None:
    """Four examples of the property below (each compiles two scans)."""
    check_scan_dask_equals_memory(data)


@pytest.mark.slow  # the profile's 25 examples: two minutes
@given(st.data())
def test_scan_dask_equals_memory(data: Any) -> None:
    check_scan_dask_equals_memory(data)


def check_scan_dask_equals_memory(data: Any) -> None:
    """Random sizes, chunks, halo depths, boundary modes per dim, save modes and
    kernels (a reach of 2 in time and space; absolute coordinates, the time
    coordinate included): the lazy scan equals the in-memory one."""
    ny = data.draw(st.integers(6, 14), label="ny")
    nx = data.draw(st.integers(6, 14), label="nx")
    kind = data.draw(st.sampled_from(["diffuse", "two-back", "coords"]), label="kernel")
    modes = {"x": data.draw(st.sampled_from(SCAN_MODES), label="x mode"),
             "y": data.draw(st.sampled_from(SCAN_MODES), label="y mode")}
    cx = data.draw(st.integers(3, nx), label="x chunk")
    cy = data.draw(st.integers(3, ny), label="y chunk")
    K = data.draw(st.integers(1, 3), label="halo_every")
    steps = data.draw(st.integers(2, 7), label="steps")
    every = data.draw(st.sampled_from([1, "last"]), label="save_every")
    k = 2 if kind == "two-back" else 1
    rng = np.random.default_rng(0)
    u0 = xr.DataArray(rng.random((k, ny, nx)), dims=("t", "y", "x"),
                      coords={"x": np.linspace(0.0, 1.0, nx), "y": np.arange(ny)})
    kw = dict(steps=steps, boundary={**modes, "t": "extend"}, fill_value=0.5, dt=0.1,
              save_every=every)
    kernel = _scan_case_kernel(kind)
    reach = 2 if kind == "two-back" else 1
    if min(cx, cy) < K * reach:
        K = 1
    # a chunk smaller than the halo is an error case (tested elsewhere): a short
    # last chunk is merged into the one before it
    chunks = {"x": _chunks(nx, cx, K * reach), "y": _chunks(ny, cy, K * reach)}
    ref = memory_scan(u0, kernel, dim="t", **kw)
    out = u0.chunk(chunks).stencil.scan(kernel, "t", halo_every=K, **kw)
    same(out.compute(), ref, rtol=1e-12)

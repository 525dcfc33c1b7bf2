"""Streamed saves and restart: ``scan(..., steps=N, save_every=s, store=path)``.

The reference is the same scan run uninterrupted in memory (itself checked
against numpy elsewhere) and, for the heat equation, a numpy loop here.  A
streamed run must be bitwise equal to it, also after a SIGKILL and a resume.
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import xarray as xr

import xstencil
from xstencil._errors import XStencilError
from xstencil._labelled import stream

pytest.importorskip("zarr")

ROOT = pathlib.Path(__file__).resolve().parents[2]
C = np.float32(0.25)


def heat(u):
    return u(time=-1) + C * (u(time=-1, x=1) - 2 * u(time=-1) + u(time=-1, x=-1))


def _u0(n: int = 48) -> xr.DataArray:
    x = np.random.default_rng(0).random(n).astype(np.float32)
    return xr.DataArray(x, dims="x", coords={"x": np.arange(n) * 0.5}, name="T",
                        attrs={"units": "K"})


def _numpy_heat(u0: np.ndarray, steps: int, every: int) -> np.ndarray:
    u, out = u0.copy(), [u0.copy()]
    for i in range(1, steps + 1):
        u = u + C * (np.roll(u, -1) - 2 * u + np.roll(u, 1))
        if i % every == 0:
            out.append(u.copy())
    return np.stack(out)


@pytest.mark.parametrize("segment", [1, 3, 100])
@pytest.mark.parametrize("every", [1, 4])
def test_equal_to_uninterrupted_run(tmp_path, segment, every):
    u0 = _u0()
    opts = dict(dim="time", steps=40, save_every=every, dt=0.5, boundary="periodic")
    ref = u0.stencil.scan(heat, **opts)
    out = u0.stencil.scan(heat, **opts, store=tmp_path / "run.zarr", segment=segment)
    assert out.chunks is None  # numpy, read from the store on first use
    xr.testing.assert_identical(out.load(), ref)
    np.testing.assert_allclose(out.values, _numpy_heat(u0.values, 40, every), rtol=1e-5)
    # the store itself carries the time coordinate and attrs
    ds = xr.open_zarr(tmp_path / "run.zarr", consolidated=False)
    np.testing.assert_array_equal(ds["time"].values, ref["time"].values)
    assert ds["T"].attrs["units"] == "K"
    assert ds.attrs[stream.STORE_KEY]["complete"] == ref.sizes["time"]


@pytest.mark.parametrize("segment", [2, 7])
def test_dask_backed_equal_to_in_memory(tmp_path, segment):
    """Each segment is a lazy dask scan, computed by its write; the next one
    starts from the last position read back lazily from the store."""
    u0 = xr.DataArray(np.random.default_rng(2).random((24, 36)).astype(np.float32),
                      dims=("y", "x"), name="h", attrs={"long_name": "height"})

    def diffuse(u):
        return u(time=-1) + np.float32(0.2) * (u(time=-1, x=1) + u(time=-1, x=-1)
                                               + u(time=-1, y=1) + u(time=-1, y=-1)
                                               - 4 * u(time=-1))

    opts = dict(steps=18, save_every=3, dt=0.1, boundary={"x": "periodic", "y": "extend"})
    ref = u0.stencil.scan(diffuse, **opts)
    out = u0.chunk({"y": 12, "x": 18}).stencil.scan(diffuse, **opts, segment=segment,
                                                     store=tmp_path / "d.zarr")
    xr.testing.assert_identical(out.load(), ref)
    z = xr.open_zarr(tmp_path / "d.zarr", consolidated=False)
    assert z["h"].encoding["chunks"] == (1, 12, 18)  # aligned with the dask chunks


def test_dataset_window_two_back_and_datetimes(tmp_path):
    """Two fields, a window reaching two positions back (leapfrog), a constant
    variable and a datetime coordinate read by the kernel."""
    t0 = np.array(["2020-01-01T00", "2020-01-01T06"], dtype="datetime64[ns]")
    rng = np.random.default_rng(1)
    ds = xr.Dataset({"a": (("time", "x"), rng.random((2, 16)).astype(np.float32)),
                     "b": (("time", "x"), rng.random((2, 16)).astype(np.float32)),
                     "c": ("x", rng.random(16).astype(np.float32))},
                    coords={"time": t0}, attrs={"title": "leapfrog"})

    def kern(s):
        t = s["a"].coord("time")
        dt = t(time=-1) - t(time=-2)
        return {"a": s["a"](time=-2) + dt * np.float32(1e-6) * (s["b"](time=-1, x=1)
                                                                - s["b"](time=-1, x=-1)),
                "b": s["b"](time=-2) - np.float32(0.1) * s["c"]() * s["a"](time=-1)}

    opts = dict(dim="time", steps=12, dt=np.timedelta64(6, "h"), boundary="periodic")
    ref = ds.stencil.scan(kern, **opts)
    out = ds.stencil.scan(kern, **opts, store=tmp_path / "s.zarr", segment=5)
    xr.testing.assert_identical(out.load(), ref)


def test_memory_holds_one_segment(tmp_path, monkeypatch):
    """Each write (and so each segment held) has at most ``segment`` new
    positions, and each segment's scan starts from the window depth only."""
    writes, inputs = [], []
    write, segment_fn = stream._write, stream._segment

    def spy_write(ds, path, run, first):
        writes.append(ds.sizes["time"])
        write(ds, path, run, first)

    def spy_segment(scan, run, state, *a):
        inputs.append(state.sizes.get("time", 0))
        return segment_fn(scan, run, state, *a)

    monkeypatch.setattr(stream, "_write", spy_write)
    monkeypatch.setattr(stream, "_segment", spy_segment)
    u0 = _u0()
    out = u0.stencil.scan(heat, dim="time", steps=60, save_every=2, boundary="periodic",
                          store=tmp_path / "m.zarr", segment=4)
    assert writes == [5] + [4] * 6 + [2]  # the initial position + 4, then 4 at a time
    assert inputs == [0] + [1] * 7  # the input, then one position (the window depth)
    assert sum(writes) == out.sizes["time"] == 31


def _script(store: pathlib.Path, kill_at: int | None, when: str, chunked: bool) -> str:
    return textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {str(ROOT)!r})
        sys.path.insert(0, {str(ROOT / 'tests' / 'contract')!r})
        import xstencil
        from xstencil._labelled import stream
        from test_streamed_saves import _u0, heat
        kill_at, when = {kill_at!r}, {when!r}
        write, mark, n = stream._write, stream._mark, [0]

        def w(ds, path, run, first):
            n[0] += 1
            if n[0] == kill_at and when == "mid-write":
                half = ds.isel(time=slice(0, ds.sizes["time"] // 2))
                write(half, path, run, first)
                os.kill(os.getpid(), signal.SIGKILL)
            write(ds, path, run, first)
            if n[0] == kill_at and when == "before-marker":
                os.kill(os.getpid(), signal.SIGKILL)

        def m(path, meta, done):
            mark(path, meta, done)
            if n[0] == kill_at and when == "after-marker":
                os.kill(os.getpid(), signal.SIGKILL)

        stream._write, stream._mark = w, m
        u0 = _u0().chunk({{"x": 16}}) if {chunked!r} else _u0()
        u0.stencil.scan(heat, dim="time", steps=60, save_every=3, dt=0.5,
                           boundary="periodic", store={str(store)!r}, segment=4)
    """)


@pytest.mark.parametrize(("when", "chunked"), [("mid-write", False), ("before-marker", False),
                                               ("after-marker", False), ("mid-write", True)])
def test_sigkill_and_resume(tmp_path, when, chunked):
    store = tmp_path / "k.zarr"
    proc = subprocess.run([sys.executable, "-c", _script(store, 3, when, chunked)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    done = xr.open_zarr(store, consolidated=False).attrs[stream.STORE_KEY]["complete"]
    assert done == (13 if when == "after-marker" else 9)
    opts = dict(dim="time", steps=60, save_every=3, dt=0.5, boundary="periodic")
    u0 = _u0().chunk({"x": 16}) if chunked else _u0()
    out = u0.stencil.scan(heat, **opts, store=store, resume=True, segment=4)
    ref = _u0().stencil.scan(heat, **opts)
    xr.testing.assert_identical(out.load(), ref)  # nothing lost, nothing duplicated
    again = u0.stencil.scan(heat, **opts, store=store, resume=True)  # complete: reopened
    xr.testing.assert_identical(again.load(), ref)


def test_resume_refuses_other_kernels_and_options(tmp_path):
    store = tmp_path / "r.zarr"
    u0 = _u0()
    opts = dict(dim="time", steps=8, save_every=2, dt=0.5, boundary="periodic")
    u0.stencil.scan(heat, **opts, store=store)
    with pytest.raises(XStencilError, match=r"store=.*already exists; pass resume=True"):
        u0.stencil.scan(heat, **opts, store=store)

    def other(u):
        return u(time=-1) + np.float32(0.3) * (u(time=-1, x=1) - 2 * u(time=-1)
                                              + u(time=-1, x=-1))

    with pytest.raises(XStencilError, match=r"different run: the kernel"):
        u0.stencil.scan(other, **opts, store=store, resume=True)
    with pytest.raises(XStencilError, match=r"the options differ: boundary='periodic' in the "
                                            r"store, boundary='extend' now"):
        u0.stencil.scan(heat, **{**opts, "boundary": "extend"}, store=store, resume=True)
    with pytest.raises(XStencilError, match=r"the options differ: dt=0.5 in the store"):
        u0.stencil.scan(heat, **{**opts, "dt": 0.25}, store=store, resume=True)
    coord = np.arange(9) * 0.5
    u0.stencil.scan(heat, **{**opts, "dt": None, "coord": coord}, store=tmp_path / "c")
    coord[5] += 0.125  # one value deep inside a long coord= differs
    with pytest.raises(XStencilError, match=r"the options differ: coord=<array \(9,\) float64"):
        u0.stencil.scan(heat, **{**opts, "dt": None, "coord": coord}, store=tmp_path / "c",
                        resume=True)
    with pytest.raises(XStencilError, match=r"the initial state differ"):
        (u0 + 1).stencil.scan(heat, **opts, store=store, resume=True)


def test_clear_errors(tmp_path):
    u0 = _u0()
    with pytest.raises(XStencilError, match=r"store= streams a trajectory grown with steps=N"):
        u0.expand_dims(time=3).stencil.scan(heat, store=tmp_path / "a.zarr")
    with pytest.raises(XStencilError, match=r"save_every='last'"):
        u0.stencil.scan(heat, steps=4, save_every="last", store=tmp_path / "a.zarr")
    # devices= streams now (tests/backends/test_shard_store.py)
    with pytest.raises(XStencilError, match=r"resume= and segment= go with store="):
        u0.stencil.scan(heat, steps=4, resume=True)
    with pytest.raises(XStencilError, match=r"steps=6 must be an int >= 1 and a multiple of "
                                            r"save_every=4"):
        u0.stencil.scan(heat, steps=6, save_every=4, store=tmp_path / "a.zarr")
    assert not (tmp_path / "a.zarr").exists()
    with pytest.raises(XStencilError, match=r"segment=0 must be an int >= 1"):
        u0.stencil.scan(heat, steps=4, store=tmp_path / "a.zarr", segment=0)
    (tmp_path / "b.zarr").mkdir()
    with pytest.raises(XStencilError, match=r"not (a Zarr store )?written by a streamed scan"):
        u0.stencil.scan(heat, steps=4, store=tmp_path / "b.zarr", resume=True)
    assert (tmp_path / "b.zarr").exists()  # someone else's directory is never removed


def test_function_and_accessor_agree(tmp_path):
    u0 = _u0()
    a = xstencil.scan(u0, heat, "time", steps=6, boundary="periodic", store=tmp_path / "f")
    b = u0.stencil.scan(heat, steps=6, boundary="periodic", store=tmp_path / "a")
    xr.testing.assert_identical(a.load(), b.load())
    assert os.path.isdir(tmp_path / "f")


def test_step_function(tmp_path):
    """``step=`` (a Runge-Kutta step calling maps) streams the same way."""
    u0 = xr.DataArray(np.sin(np.linspace(0, 2 * np.pi, 32, endpoint=False)).astype(np.float32),
                      dims="x")

    def rk2(s):
        def f(s):
            return s.stencil.map(lambda u: -(u(x=1) - u(x=-1)) / 2, boundary="periodic")

        k1 = f(s)
        return s + 0.1 * f(s + 0.05 * k1)

    ref = xstencil.scan(u0, step=rk2, steps=12, save_every=2)
    out = xstencil.scan(u0, step=rk2, steps=12, save_every=2, store=tmp_path / "s", segment=2)
    xr.testing.assert_identical(out.load(), ref)


def test_function_mesh_refused(tmp_path):
    m = _u0().stencil.mesh(boundary="periodic")
    m[...] = heat
    with pytest.raises(XStencilError, match=r"store= \(streamed saves\) is not available for a "
                                            r"function mesh"):
        m.scan("time", steps=4, store=tmp_path / "m")

"""Two JAX processes on 127.0.0.1: sharded reads, a sharded mesh scan, sharded writes.

tests/backends/multiprocess_checks.py runs as two processes joined by
``jax.distributed.initialize`` (2 simulated CPU devices each, gloo collectives)
and, separately, as one process with 4 devices.  Both open the same Zarr and
NetCDF inputs with ``xstencil.open_sharded``, scan on a 2 x 2 device mesh and
write with ``xstencil.write_sharded``.  The stores must be bitwise equal to each
other and to the in-memory scan run here.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import xstencil

pytest.importorskip("zarr")
SCRIPT = Path(__file__).with_name("multiprocess_checks.py")
ROOT = str(Path(__file__).resolve().parents[2])
# Two JAX processes joined over gloo on localhost: it passed here when the machine was
# quiet, and timed out in gloo's fixed 30 s rendezvous when it was loaded, so it runs on
# request (XSTENCIL_MULTIPROCESS=1) until that is made robust.
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.environ.get("XSTENCIL_MULTIPROCESS") != "1",
                                 reason="set XSTENCIL_MULTIPROCESS=1 to start two JAX processes")]


def heat(u):  # the kernels of multiprocess_checks.py
    return u(time=-1) + 0.2 * (u(time=-1, x=1) + u(time=-1, x=-1) + u(time=-1, y=1)
                               + u(time=-1, y=-1) - 4 * u(time=-1))


def wall(u):
    return 0.0 * u(time=-1) + 1.0


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    env.pop("XLA_FLAGS", None)
    return env


def _launch(commands: list[list[str]], cwd: Path | None = None) -> list[str]:
    """Run the commands at once (they join one JAX runtime); their stdouts."""
    with contextlib.ExitStack() as stack:
        procs = [stack.enter_context(subprocess.Popen(
            [sys.executable, "-W", "error", *c], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, env=_env(), cwd=cwd)) for c in commands]
        outs = []
        for pid, p in enumerate(procs):
            try:
                out, err = p.communicate(timeout=300)
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                raise
            assert p.returncode == 0, f"process {pid} of {len(procs)}:\n{err[-4000:]}"
            outs.append(out)
        return outs


def _run(work: Path, nproc: int) -> list[dict]:
    port = str(_port())
    outs = _launch([[str(SCRIPT), str(work), str(nproc), str(pid), port]
                    for pid in range(nproc)])
    return [json.loads(out.strip().splitlines()[-1]) for out in outs]


def _input() -> xr.Dataset:
    rng = np.random.default_rng(18)
    u = xr.DataArray(rng.random((16, 24)), dims=("y", "x"),
                     coords={"y": np.arange(16.0), "x": np.linspace(0.0, 1.0, 24)},
                     name="u", attrs={"units": "K"})
    return u.to_dataset()


def _open(path: Path) -> xr.DataArray:
    with xr.open_dataarray(path, engine="zarr", consolidated=False) as da:
        return da.load()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    work = tmp_path_factory.mktemp("multiprocess")
    ds = _input()
    ds.to_zarr(work / "in.zarr", consolidated=False)
    ds.to_netcdf(work / "in.nc")
    return work, ds, _run(work, 2), _run(work, 1)


def test_each_process_reads_only_its_blocks(runs):
    work, ds, two, one = runs
    assert [s["process"] for s in two] == [0, 1]
    assert all(s["devices"] == 4 and s["local"] == 2 for s in two)
    assert one[0]["devices"] == 4 and one[0]["local"] == 4
    # on a 2 x 2 mesh over (y, x), process 0 holds the top half and process 1 the bottom
    assert two[0]["blocks"] == [[[0, 8], [0, 12]], [[0, 8], [12, 24]]]
    assert two[1]["blocks"] == [[[8, 16], [0, 12]], [[8, 16], [12, 24]]]
    assert all(s["blocks_match"] for s in two + one)
    # from a lazily indexed source each process reads its own two blocks, once each
    assert two[0]["reads"] == two[0]["blocks"] and two[1]["reads"] == two[1]["blocks"]
    assert len(one[0]["reads"]) == 4
    assert [s["addressable"] for s in two] == [False, False] and one[0]["addressable"]
    assert all(s["dtype"] == "float64" for s in two + one)
    assert all(s["out_sharding"] == "P(None, 'y', 'x')" for s in two + one)


def test_two_processes_write_what_one_process_writes(runs):
    work, ds, two, one = runs
    for name in ("mesh", "last"):
        a, b = _open(work / f"out2_{name}.zarr"), _open(work / f"out1_{name}.zarr")
        assert a.dtype == np.float64 and a.attrs == {"units": "K"} and a.name == "u"
        np.testing.assert_array_equal(a.values, b.values)  # bitwise
        xr.testing.assert_identical(a, b)


def test_two_processes_match_in_memory(runs):
    work, ds, two, one = runs
    m = xstencil.mesh(ds["u"], boundary="extend")
    m[...] = heat
    m.loc[{"x": slice(None, 0.2)}] = wall
    ref = m.scan("time", steps=12, save_every=4)
    got = _open(work / "out2_mesh.zarr")
    xr.testing.assert_identical(got, ref)  # coords (time included), attrs, name
    np.testing.assert_array_equal(got.values, ref.values)  # bitwise
    assert (got.sel(x=slice(None, 0.2)).isel(time=slice(1, None)) == 1.0).all()
    last = ds["u"].stencil.scan(heat, "time", steps=12, save_every="last",
                                boundary={"y": "periodic", "x": "reflect"})
    got = _open(work / "out2_last.zarr")
    xr.testing.assert_identical(got, last)
    np.testing.assert_array_equal(got.values, last.values)

def test_gather_and_values(runs):
    work, ds, two, one = runs
    whole = [np.load(work / f"gathered2_{pid}.npy") for pid in (0, 1)]
    np.testing.assert_array_equal(whole[0], whole[1])
    np.testing.assert_array_equal(whole[0], _open(work / "out2_last.zarr").values)
    # .values of a global array raises JAX's error, which names process_allgather
    for s in two:
        assert s["values"].startswith("RuntimeError") and "process_allgather" in s["values"]
    assert one[0]["values"] == "no error"



DOCS_SCRIPT = Path(ROOT) / "docs" / "several_processes.py"


def test_docs_script_runs_as_written(tmp_path):
    """docs/several_processes.py (shown in docs/scaling.rst) on two processes."""
    T = _input()["u"].rename("T")
    T.to_dataset().to_zarr(tmp_path / "in.zarr", consolidated=False)
    port = str(_port())
    outs = _launch([[str(DOCS_SCRIPT), str(pid), port, str(tmp_path)] for pid in (0, 1)],
                   cwd=tmp_path)
    assert "process 0 wrote blocks [((0, 8), (0, 12)), ((0, 8), (12, 24))]" in outs[0]
    assert "process 1 wrote blocks [((8, 16), (0, 12)), ((8, 16), (12, 24))]" in outs[1]

    def heat_doc(u):
        lap = (u(time=-1, x=1) + u(time=-1, x=-1) + u(time=-1, y=1) + u(time=-1, y=-1)
               - 4 * u(time=-1))
        return u(time=-1) + 0.2 * lap

    ref = T.stencil.scan(heat_doc, "time", steps=100, save_every=25,
                         boundary={"y": "extend", "x": "periodic"})
    got = _open(tmp_path / "out.zarr")
    xr.testing.assert_identical(got, ref)
    np.testing.assert_array_equal(got.values, ref.values)

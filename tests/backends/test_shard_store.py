"""Streamed saves of sharded scans (issue 18): ``scan(..., store=..., resume=True)``
on data sharded over 4 simulated CPU devices.

XLA_FLAGS must be set before JAX starts, so the checks live in
tests/backends/shard_store_checks.py and run in subprocesses.  The reference
is the same sharded scan run uninterrupted (itself checked against a numpy
loop there, and against the in-memory scan in tests/backends/shard_checks.py);
a streamed run, and one killed with SIGKILL and resumed, must be bitwise
equal to it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import xarray as xr

pytest.importorskip("zarr")

SCRIPT = Path(__file__).with_name("shard_store_checks.py")
ROOT = Path(__file__).resolve().parents[2]
NAMES = ["dataset", "devices_equal_to_uninterrupted", "mesh_alias_warns_once",
         "mixed_layouts_refused", "presharded_keeps_devices", "resume_refuses_another_layout",
         "staggered_still_refused"]


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-W", "error", str(SCRIPT), *argv],
                          capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)


@pytest.fixture(scope="module")
def results() -> dict[str, str]:
    proc = _run("equal")
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_all_checks_listed(results):
    assert sorted(results) == sorted(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_sharded_store(results, name):
    if results.get(name) != "ok":
        pytest.fail(f"{name}:\n{results.get(name)}")


@pytest.mark.slow
@pytest.mark.parametrize("when", ["mid-write", "before-marker", "after-marker"])
def test_sigkill_and_resume(tmp_path, when):
    """Killed at the third write (saved positions 1 + 2, then 2 per segment),
    the store's marker counts only whole segments; the resume continues from
    it, bitwise equal to an uninterrupted sharded run."""
    store = str(tmp_path / "k.zarr")
    killed = _run("kill", store, when)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-4000:]
    done = xr.open_zarr(store, consolidated=False).attrs["xstencil_stream"]["complete"]
    assert done == (7 if when == "after-marker" else 5)
    resumed = _run("resume", store)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    got = json.loads(resumed.stdout.strip().splitlines()[-1])
    assert got == {"resume": "ok", "complete_before": str(done)}, got.get("resume")

"""Multi-device maps under shard_map, on 4 simulated CPU devices.

XLA_FLAGS must be set before JAX starts, so the checks live in
tests/shard_checks.py and run once, in a subprocess; each check is one test here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("shard_checks.py")
NAMES = ["devices", "backend_mix", "modes_and_meshes", "output_sharding", "presharded_input",
         "hlo_collective_permute", "float64", "coords_stride_mesh_window", "bad_input",
         "dataset", "scan_modes_and_halo_depth", "scan_trajectory_last_float64",
         "scan_bad_input", "scan_hlo", "scan_coords", "scan_function_mesh",
         "scan_dataset", "scan_check_finite", "scan_time_coord",
         "scan_progress", "scan_gradients_and_checkpoint"]


@pytest.fixture(scope="module")
def results() -> dict[str, str]:
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
               JAX_PLATFORMS="cpu")  # simulated CPU devices, also on a GPU machine
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-W", "error", str(SCRIPT)], capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_all_checks_listed(results):
    assert sorted(results) == sorted(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_sharded(results, name):
    if results.get(name) != "ok":
        pytest.fail(f"{name}:\n{results.get(name)}")

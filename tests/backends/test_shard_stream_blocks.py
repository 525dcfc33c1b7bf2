"""Streamed saves of data sharded over 4 simulated devices write each device's
blocks with ``to_zarr(region=...)`` instead of gathering every segment to the
host (tests/backends/shard_stream_blocks_checks.py runs in a subprocess: JAX
reads ``XLA_FLAGS`` once, at import)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("zarr")
pytest.importorskip("dask")
SCRIPT = Path(__file__).with_name("shard_stream_blocks_checks.py")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def seen() -> dict:
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-W", "error", str(SCRIPT)], capture_output=True,
                          text=True, env=env, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("how", ["presharded", "devices"])
def test_each_device_writes_its_own_blocks(seen, how):
    got = seen[how]
    # 5 saved positions in segments of 1 + 2, then 2: per segment one metadata write
    # (lazy dask zeros) and one write per device block (numpy, 8 x 12 of 16 x 24)
    assert got["calls"] == [[["dask", [3, 16, 24]]]] + [[["numpy", [3, 8, 12]]]] * 4 \
        + [[["dask", [2, 16, 24]]]] + [[["numpy", [2, 8, 12]]]] * 4, got["calls"]
    assert got["chunks"] == [1, 8, 12]  # the store's chunks are the devices' blocks
    assert got["bitwise"] and got["identical"] and got["numpy"]
    assert got["dtype"] == "float64"


def test_open_sharded_warns_for_float64_with_x64_off(seen):
    got = seen["warnings"]
    assert len(got["float64"]) == 1, got["float64"]
    assert got["float64"][0].startswith("PrecisionWarning: xstencil.open_sharded(...): "
                                        "{'T': 'float64'} are 64-bit JAX arrays sharded")
    assert "jax.config.update('jax_enable_x64', True)" in got["float64"][0]
    assert got["float32"] == [] and got["float64_x64"] == []
    assert got["sum_x64"][0] == "float64"
    np.testing.assert_allclose(got["sum_x64"][1], got["sum_numpy"], rtol=1e-13)

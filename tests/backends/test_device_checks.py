"""The ``devices=`` checks, written once in ``_backends/shard.py``
(:func:`~xstencil._backends.shard.device_axes`,
:func:`~xstencil._backends.shard.check_divides`), give the same words for a
sharded map, a sharded scan and :func:`xstencil.open_sharded`.

A length that does not divide over 4 devices needs 4 simulated devices, so
that part runs in a subprocess; the ``devices=`` spelling checks need none.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import xstencil
from xstencil import XStencilError
from xstencil._backends.shard import device_axes

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import json, numpy as np, xarray as xr, xstencil
    T = xr.DataArray(np.zeros((4, 10), np.float32), dims=("y", "x"), name="T")
    calls = {
        "map": lambda: T.stencil.map(lambda u: u(x=1), boundary="periodic",
                                     devices={"x": "i"}),
        "scan": lambda: T.stencil.scan(lambda u: u(time=-1, x=1), steps=2,
                                       boundary="periodic", devices={"x": "i"}),
        "open_sharded": lambda: xstencil.open_sharded(T, devices={"x": "i"}),
    }
    out = {}
    for name, f in calls.items():
        try:
            f()
            out[name] = "no error"
        except xstencil.XStencilError as e:
            out[name] = str(e)
    print(json.dumps(out))
""")


def test_a_length_that_does_not_divide_gets_one_message():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-W", "error", "-c", SCRIPT], capture_output=True,
                          text=True, env=env, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    tail = ("which does not divide evenly over the 4 devices of mesh axis 'i'; pad the data to "
            "12 points (e.g. with .pad({'x': (0, 2)}, mode='edge')) or use a mesh axis whose "
            "size divides 10")
    assert got["map"] == f"da.stencil.map(...): dim 'x' has 10 points, {tail}"
    assert got["scan"] == f"da.stencil.scan(...): dim 'x' has 10 points, {tail}"
    assert got["open_sharded"] == (f"xstencil.open_sharded(...): variable 'T' has 10 points "
                                   f"along 'x', {tail}")


@pytest.mark.parametrize(("devices", "match"), [
    ({}, r"devices=\{\} must map dim names to mesh axis names, such as \{'x': 'i'\}"),
    (["x"], r"devices=\['x'\] must map dim names to mesh axis names"),
    ({"z": "i"}, r"devices=\{'z': 'i'\}: dimension 'z' not found; available dims are "
                 r"\('y', 'x'\)"),
    ({"y": "i", "x": "i"}, r"devices=\{'y': 'i', 'x': 'i'\} shards two dims over one "
                           r"mesh axis; give each dim its own axis"),
])
def test_devices_spelling_is_checked_alike_by_map_and_open_sharded(devices, match):
    T = xr.DataArray(np.zeros((4, 8)), dims=("y", "x"))
    with pytest.raises(XStencilError, match=r"da.stencil.map\(...\): " + match):
        T.stencil.map(lambda u: u(x=1), boundary="periodic", devices=devices)
    with pytest.raises(XStencilError, match=r"xstencil.open_sharded\(...\): " + match):
        xstencil.open_sharded(T, devices=devices)
    with pytest.raises(XStencilError, match=r"f\(\): " + match):
        device_axes("f()", devices, ("y", "x"))


def test_a_mesh_with_an_axis_that_is_not_a_dim():
    mesh = xstencil.make_devices(("z",))
    T = xr.DataArray(np.zeros((4, 8)), dims=("y", "x"))
    for call, f in (("da.stencil.map", lambda: T.stencil.map(lambda u: u(x=1), devices=mesh)),
                    ("xstencil.open_sharded", lambda: xstencil.open_sharded(T, mesh))):
        with pytest.raises(XStencilError, match=call + r"\(...\): devices=.* has axis 'z', "
                                                       r"which is not a dim of the data"):
            f()

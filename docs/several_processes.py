"""A heat-equation scan over two JAX processes on one machine, on CPU.

Start both processes, each with its process id::

    python several_processes.py 0 & python several_processes.py 1

Optional arguments after the id: the coordinator port (default 12355) and the
folder that holds ``in.zarr`` (default: the current folder).  The result is
written to ``out.zarr`` in that folder.  tests/backends/test_multiprocess.py
runs this file as it is.
"""

import os
import sys

# CPU only: two simulated devices per process (on GPUs, each process sees its own).
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")

import jax  # noqa: E402

process_id = int(sys.argv[1])
port = sys.argv[2] if len(sys.argv) > 2 else "12355"
folder = sys.argv[3] if len(sys.argv) > 3 else "."

jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU only
# float64 data: with x64 on, JAX operations on the results (traj.sum()) stay float64
jax.config.update("jax_enable_x64", True)
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2,
                           process_id=process_id)

import xstencil  # noqa: E402


def heat(u):
    lap = (u(time=-1, x=1) + u(time=-1, x=-1) + u(time=-1, y=1) + u(time=-1, y=-1)
           - 4 * u(time=-1))
    return u(time=-1) + 0.2 * lap


devices = xstencil.make_devices({"y": 2, "x": 2})  # the 4 devices of both processes
ds = xstencil.open_sharded(os.path.join(folder, "in.zarr"), devices)  # reads own blocks only
T = ds["T"]
traj = T.stencil.scan(heat, "time", steps=100, save_every=25, halo_every=4,
                      boundary={"y": "extend", "x": "periodic"})
xstencil.write_sharded(traj, os.path.join(folder, "out.zarr"), mode="w")  # own blocks only
print(f"process {jax.process_index()} wrote blocks",
      [tuple((s.start, s.stop) for s in sh.index[1:]) for sh in traj.data.addressable_shards])
jax.distributed.shutdown()

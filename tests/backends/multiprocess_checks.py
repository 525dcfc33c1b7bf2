"""One process of the multi-process run of tests/backends/test_multiprocess.py.

``python multiprocess_checks.py WORKDIR NPROC PID PORT``: with NPROC=2, two
copies (PID 0 and 1) join one JAX runtime through
:func:`jax.distributed.initialize` on 127.0.0.1:PORT, with 2 simulated CPU
devices each; with NPROC=1 one process has 4 devices.  Either way the same
program runs on a 2 x 2 device mesh: it opens ``WORKDIR/in.zarr`` and
``WORKDIR/in.nc`` with :func:`xstencil.open_sharded`, runs a sharded function
mesh scan and a sharded periodic scan, writes both with
:func:`xstencil.write_sharded` to ``WORKDIR/out{NPROC}_*.zarr``, and prints one
JSON object of observations (the parent test checks them).  It also runs a
streamed scan (``store=``) of the global array into ``WORKDIR/out{NPROC}_stream.zarr``
and resumes it, and sums a float64 result with x64 off and on.
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings

WORK, NPROC, PID, PORT = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={4 // NPROC}"

import jax  # noqa: E402

if NPROC > 1:
    # JAX's CPU backend needs a collectives implementation for cross-process ppermute
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{PORT}", num_processes=NPROC,
                               process_id=PID)

import numpy as np  # noqa: E402
import xarray as xr  # noqa: E402
import zarr  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from xarray.backends import BackendArray  # noqa: E402
from xarray.core import indexing  # noqa: E402

import xstencil  # noqa: E402


class Recorder(BackendArray):
    """A lazily indexed array that records every slice read from it."""

    def __init__(self, array: np.ndarray) -> None:
        self.array, self.shape, self.dtype, self.reads = array, array.shape, array.dtype, []

    def __getitem__(self, key):
        return indexing.explicit_indexing_adapter(key, self.shape,
                                                  indexing.IndexingSupport.BASIC, self._read)

    def _read(self, key):
        self.reads.append([list(k.indices(n)[:2]) for k, n in zip(key, self.shape, strict=True)])
        return self.array[key]


def heat(u):
    return u(time=-1) + 0.2 * (u(time=-1, x=1) + u(time=-1, x=-1) + u(time=-1, y=1)
                               + u(time=-1, y=-1) - 4 * u(time=-1))


def wall(u):
    return 0.0 * u(time=-1) + 1.0


def opened(seen: dict, source, devices):
    """``xstencil.open_sharded``, recording its PrecisionWarnings (float64 data sharded
    over several devices with x64 off: JAX operations on it outside xstencil would
    truncate or fail)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", xstencil.PrecisionWarning)
        out = xstencil.open_sharded(source, devices)
    seen.setdefault("open_warnings", []).extend(str(w.message) for w in caught)
    return out


def streamed(seen: dict, u0: xr.DataArray) -> None:
    """A streamed scan of the global array (each process writes its own blocks), then a
    resume after the marker is set back to 2 saved positions, as a kill would leave it:
    the store is cut back and the run continues from positions read back per process."""
    store = os.path.join(WORK, f"out{NPROC}_stream.zarr")
    kw = dict(steps=12, save_every=4, halo_every=2, boundary={"y": "periodic", "x": "reflect"})
    st = u0.stencil.scan(heat, "time", **kw, store=store, segment=1)
    seen["stream_type"] = type(st.data).__name__
    first = st.values
    seen["stream_chunks"] = list(zarr.open_group(store, mode="r")["u"].chunks)
    if PID == 0:
        g = zarr.open_group(store, mode="r+")
        g.attrs["xstencil_stream"] = {**dict(g.attrs)["xstencil_stream"], "complete": 2}
    if NPROC > 1:
        multihost_utils.sync_global_devices("marker set back")
    again = u0.stencil.scan(heat, "time", **kw, store=store, segment=1, resume=True)
    seen["stream_resumed_bitwise"] = bool(np.array_equal(again.values, first))
    seen["stream_complete"] = dict(zarr.open_group(store, mode="r").attrs)[
        "xstencil_stream"]["complete"]


def sums(seen: dict, last: xr.DataArray) -> None:
    """``.sum()`` of a float64 result: with x64 off JAX fails on an array sharded over
    several devices (the PrecisionWarning of open_sharded says so); with x64 on it is
    float64."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # JAX's "float64 ... truncated" warnings
            seen["sum_x64_off"] = str(last.sum().dtype)
    except Exception as e:  # JAX's error for a sharded 64-bit array with x64 off
        seen["sum_x64_off"] = f"{type(e).__name__}: {e}"
    with jax.enable_x64(True):
        total = last.sum()
        seen["sum_x64_on"] = [str(total.dtype), float(total)]


def main() -> dict:
    seen: dict = {"devices": jax.device_count(), "local": jax.local_device_count(),
                  "process": jax.process_index()}
    devices = xstencil.make_devices({"y": 2, "x": 2})
    ds = opened(seen, os.path.join(WORK, "in.zarr"), devices)
    u0 = ds["u"]
    with xr.open_dataset(os.path.join(WORK, "in.nc")) as f:
        ref = f["u"].values
    # each process holds only its own blocks, and they are the file's slices
    seen["blocks"] = [[[s.start, s.stop] for s in sh.index] for sh in u0.data.addressable_shards]
    seen["blocks_match"] = all(np.array_equal(np.asarray(sh.data), ref[sh.index])
                               for sh in u0.data.addressable_shards)
    seen["addressable"] = u0.data.is_fully_addressable
    seen["dtype"] = str(u0.dtype)
    # a lazily indexed source: which slices does this process read?
    rec = Recorder(ref)
    lazy = xr.DataArray(xr.Variable(("y", "x"), indexing.LazilyIndexedArray(rec)), name="u")
    opened(seen, lazy, devices)
    seen["reads"] = sorted(rec.reads)

    m = xstencil.mesh(u0, boundary="extend")
    m[...] = heat
    m.loc[{"x": slice(None, 0.2)}] = wall
    out = m.scan("time", steps=12, save_every=4, halo_every=2)
    seen["out_sharding"] = str(out.data.sharding.spec)
    if PID == 1:
        # arrive late, as a loaded machine makes a process do: write_sharded used to
        # look for an existing store on every process, and this one then found the
        # store process 0 had just created, refused it and left process 0 waiting
        time.sleep(2)
    xstencil.write_sharded(out, os.path.join(WORK, f"out{NPROC}_mesh.zarr"))

    streamed(seen, u0)
    nc = opened(seen, os.path.join(WORK, "in.nc"), {"y": "y", "x": "x"})
    last = nc["u"].stencil.scan(heat, "time", steps=12, save_every="last",
                                boundary={"y": "periodic", "x": "reflect"})
    xstencil.write_sharded(last, os.path.join(WORK, f"out{NPROC}_last.zarr"))
    whole = xstencil.gather(last)
    np.save(os.path.join(WORK, f"gathered{NPROC}_{PID}.npy"), whole.values)
    sums(seen, last)
    try:
        last.values  # noqa: B018
        seen["values"] = "no error"
    except Exception as e:  # JAX's error for a global array spanning other processes
        seen["values"] = f"{type(e).__name__}: {e}"
    return seen


if __name__ == "__main__":
    result = main()
    if NPROC > 1:
        jax.distributed.shutdown()
    print(json.dumps(result))

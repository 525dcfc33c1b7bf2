"""Scaling out: dask-backed maps and sharded scans.

    PYTHONPATH=. python benchmarks/scale.py            # full sizes, writes RESULTS.md
    PYTHONPATH=. python benchmarks/scale.py --quick    # small sizes; prints only

Three parts:

* **dask map.** A 5-point Laplacian (periodic) over an 8192² float32 field
  (256 MiB): in memory (a numpy array) vs a dask array in 2048² chunks, computed
  with the threaded scheduler and on a ``LocalCluster`` of 2 worker processes
  with one thread each (the input persisted on the workers first, the result
  left there), each on the default numba loops and with ``backend="xla"``.
  Reported: median wall time and the ratio to in-memory.  ``--map`` runs
  this part only and prints it.
* **sharded scan.** A 2048² heat equation (y: extend, x: periodic), 200 explicit
  steps, final state only, on 4 simulated CPU devices
  (``XLA_FLAGS=--xla_force_host_platform_device_count=4``, run in a
  subprocess): the in-memory scan on one device vs ``scan_sharded`` over a
  1-D mesh with the halo exchanged every step (K=1) and every 4 steps (K=4),
  and a 2×2 mesh with K=4.  Reported: wall time, ratio, per-device memory from
  XLA's buffer assignment, halo bytes per exchange and exchanges per run.
  Four simulated devices share the machine's cores, so no speed-up is
  expected; the table shows correctness, communication and memory.
* **dask scan.** A 2048² heat equation, 256 steps in 1024² chunks with
  ``halo_every=16`` (threaded scheduler), plain (on the default loop backend
  and with ``backend="xla"``) and under a function mesh
  (regions by position, label and mask), and a shallow-water Dataset (h, u
  advanced over a constant bathymetry), each against the in-memory scan.
* **lean dask graphs** (issue 18).  Tasks per chunk of a map (periodic and
  extend) and of one scan segment, against plain ``map_overlap``; block
  programs compiled per worker process by a 40-step scan (``halo_every=16``:
  segments of 16, 16 and 8 steps) for each boundary mix, on a
  ``LocalCluster`` of 2 processes; and the map's wall time against plain
  ``map_overlap`` + numpy, threaded and on the cluster, and the peak resident
  memory of each worker process for a map and a scan.  The figures before
  the change (commit f5018ab, measured with the same script) are listed next
  to them.  ``--lean`` runs this part only.

    PYTHONPATH=. python benchmarks/scale.py --quick --lean   # about a minute
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

sys.path.insert(0, str(HERE))

try:  # run as ``python benchmarks/scale.py``: benchmarks/ is sys.path[0]
    import _harness as H
except ImportError:  # imported as ``benchmarks.scale`` from the repository root
    from benchmarks import _harness as H


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def lap(u: Any) -> Any:
    return u(x=1) + u(x=-1) + u(y=1) + u(y=-1) - 4 * u()


def heat(u: Any) -> Any:
    return u(time=-1) + 0.2 * (u(time=-1, x=1) + u(time=-1, x=-1) + u(time=-1, y=1)
                               + u(time=-1, y=-1) - 4 * u(time=-1))


def _medians(fns: list[Any], runs: int) -> list[float]:
    """Median wall time of each function, timed round-robin (run 1 of each, then
    run 2 of each, ...) after one warm-up call each, so that drifting load from
    other jobs hits every column alike and mostly cancels in the ratios."""
    for f in fns:
        f()  # warm-up (compiles)
    ts: list[list[float]] = [[] for _ in fns]
    for _ in range(runs):
        for f, t in zip(fns, ts, strict=True):
            t0 = time.perf_counter()
            f()
            t.append(time.perf_counter() - t0)
    return [sorted(t)[len(t) // 2] for t in ts]


# -- part 1: dask map -------------------------------------------------------------------

def dask_map(n: int, chunk: int, runs: int) -> dict[str, Any]:
    """The same map in memory and on dask, each on the numba loop backend (the
    default for numpy data and numpy blocks on the CPU) and on XLA
    (``backend="xla"``)."""
    import dask
    import distributed
    import jax
    import numpy as np
    import xarray as xr

    import xstencil  # noqa: F401
    import xstencil._backends.dask as xd

    rng = np.random.default_rng(0)
    host = rng.random((n, n), dtype=np.float32)
    mem = xr.DataArray(host, dims=("y", "x"))
    lazy = mem.chunk({"y": chunk, "x": chunk})
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=":0") as cluster, \
            distributed.Client(cluster) as client:
        # generated on the workers (same shape and chunks), not shipped from here
        import dask.array as dsa

        gen = dsa.random.default_rng(0).random((n, n), dtype=np.float32,
                                               chunks=(chunk, chunk))
        on_workers = client.persist(xr.DataArray(gen, dims=("y", "x")))
        distributed.wait(on_workers)

        def in_memory(backend: str) -> Any:
            def run() -> None:
                jax.block_until_ready(mem.stencil.map(lap, boundary="periodic",
                                                      backend=backend).data)
            return run

        def threads(backend: str) -> Any:
            def run() -> None:
                lazy.stencil.map(lap, boundary="periodic", backend=backend).compute(
                    scheduler="threads")
            return run

        def on_cluster(backend: str) -> Any:
            def run() -> None:
                out = client.persist(on_workers.stencil.map(lap, boundary="periodic",
                                                            backend=backend))
                distributed.wait(out)
                del out
            return run

        fns = {f"{where}, {b}": make(b) for b in ("auto", "xla")
               for where, make in (("memory", in_memory), ("threads", threads),
                                   ("cluster", on_cluster))}
        t = dict(zip(fns, _medians(list(fns.values()), runs), strict=True))
        compiles = client.run(xd.compile_count)
        want = mem.stencil.map(lap, boundary="periodic").values
        err = max(float(np.max(np.abs(lazy.stencil.map(lap, boundary="periodic",
                                                       backend=b).values - want)))
                  for b in ("auto", "xla"))
    del dask
    _log("  " + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in t.items())
         + f"; compiles per worker {compiles}")
    return {"n": n, "chunk": chunk, "t": t, "err": err,
            "compiles": sorted(compiles.values()), "tasks": (n // chunk) ** 2}


# -- part 3: dask scan, plain and with a function mesh -------------------------------------

def _walls(obj: Any) -> Any:
    """Heat with a cold strip by position, a hot band by label and a mask."""
    m = obj.stencil.mesh(boundary="periodic")
    m[...] = heat
    m[{"x": slice(0, 8)}] = lambda u: 0.5 * u(time=-1)
    m.loc[{"y": slice(0.2, 0.4)}] = lambda u: u(time=-1) + 1.0
    m[(obj.x > 1.2) & (obj.y < 0.3)] = lambda u: 0.0 * u(time=-1)
    return m


def shallow(s: Any) -> Any:
    """Linearised 1-D shallow water along x with diffusion along y, over a bathymetry."""
    h, u, b = s["h"], s["u"], s["b"]
    return {"h": h(time=-1) - 0.025 * (u(time=-1, x=1) * h(time=-1, x=1)
                                       - u(time=-1, x=-1) * h(time=-1, x=-1))
            + 0.01 * (h(time=-1, y=1) - 2 * h(time=-1) + h(time=-1, y=-1)),
            "u": u(time=-1) - 0.245 * (h(time=-1, x=1) + b(x=1) - h(time=-1, x=-1) - b(x=-1))}


def dask_scan(n: int, chunk: int, steps: int, K: int, runs: int) -> dict[str, Any]:
    import numpy as np
    import xarray as xr

    import xstencil  # noqa: F401

    rng = np.random.default_rng(0)
    u0 = xr.DataArray(rng.random((n, n), dtype=np.float32), dims=("y", "x"),
                      coords={"y": np.linspace(0.0, 1.0, n), "x": np.linspace(0.0, 2.0, n)})
    lazy = u0.chunk({"y": chunk, "x": chunk})
    kw = dict(steps=steps, save_every="last")
    m_mem, m_lazy = _walls(u0), _walls(lazy)
    ds = xr.Dataset({"h": 1 + 0.1 * u0, "u": 0.1 * u0.T, "b": 0.05 * u0[::-1]})
    ds_lazy = ds.chunk({"y": chunk, "x": chunk})
    pkw = dict(kw, boundary="periodic")
    runs_ = {
        "plain, in memory": lambda: u0.stencil.scan(heat, "time", boundary="periodic",
                                                    **kw).values,
        "plain, dask": lambda: lazy.stencil.scan(heat, "time", boundary="periodic",
                                                 halo_every=K, **kw).values,
        "plain, in memory, XLA": lambda: u0.stencil.scan(heat, "time", boundary="periodic",
                                                         backend="xla", **kw).values,
        "plain, dask, XLA": lambda: lazy.stencil.scan(heat, "time", boundary="periodic",
                                                      halo_every=K, backend="xla",
                                                      **kw).values,
        "mesh, in memory": lambda: m_mem.scan("time", **kw).values,
        "mesh, dask": lambda: m_lazy.scan("time", halo_every=K, **kw).values,
        "Dataset, in memory": lambda: ds.stencil.scan(shallow, "time", **pkw).h.values,
        "Dataset, dask": lambda: ds_lazy.stencil.scan(shallow, "time", halo_every=K,
                                                      **pkw).h.values,
    }
    ts = _medians(list(runs_.values()), runs)
    err = float(np.max(np.abs(runs_["mesh, dask"]() - runs_["mesh, in memory"]())))
    _log("  " + ", ".join(f"{k} {t * 1e3:.0f} ms" for k, t in zip(runs_, ts, strict=True)))
    return {"n": n, "chunk": chunk, "steps": steps, "K": K, "err": err,
            "t": dict(zip(runs_, ts, strict=True))}


# -- part 4: lean dask graphs -------------------------------------------------------------

#: Part 4 before the halo graph (commit f5018ab: ``map_overlap``, one compile per chunk
#: position and step count), 1024² float32 in 256² chunks, same script, --quick sizes.
LEAN_BEFORE = {
    "map periodic": 25.25, "map extend": 25.25,
    "scan periodic × periodic": 27.25, "scan extend × periodic": 17.5,
    "scan extend × extend": 10.25,
    "compiles periodic × periodic": [2, 2], "compiles extend × periodic": [6, 6],
    "compiles extend × extend": [11, 14],
    "xstencil, threads": 0.043, "map_overlap + numpy, threads": 0.025,
    "xstencil, LocalCluster": 0.392, "map_overlap + numpy, LocalCluster": 0.466,
}


def _np_lap(b: Any) -> Any:
    """The 5-point Laplacian of an overlapped numpy block (halo 1, trimmed)."""
    return b[1:-1, 2:] + b[1:-1, :-2] + b[2:, 1:-1] + b[:-2, 1:-1] - 4 * b[1:-1, 1:-1]


def _reset_peak() -> int:
    """Reset this process's peak resident memory (Linux: ``clear_refs`` 5) and return
    the resident memory now, in bytes; -1 where it cannot be reset."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
    except OSError:
        return -1


def _peak() -> int:
    """This process's peak resident memory since the last :func:`_reset_peak`, in bytes
    (``VmHWM``; without /proc, the peak of its life from ``getrusage``)."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
    except OSError:
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _worker_peaks(client: Any, job: Any) -> list[tuple[int, int]]:
    """(resident memory before, peak during) ``job()`` in each worker process, sorted."""
    before = client.run(_reset_peak)
    job()
    after = client.run(_peak)
    return sorted((before[w], after[w]) for w in after)


def dask_lean(n: int, chunk: int, runs: int) -> dict[str, Any]:
    import dask.array as dsa
    import distributed
    import numpy as np
    import xarray as xr

    import xstencil  # noqa: F401
    import xstencil._backends.dask as xd

    nch = (n // chunk) ** 2
    rng = np.random.default_rng(0)
    host = rng.random((n, n), dtype=np.float32)
    lazy = xr.DataArray(host, dims=("y", "x")).chunk({"y": chunk, "x": chunk})
    raw = lazy.data
    base = len(dict(raw.__dask_graph__()))

    def per_chunk(x: Any) -> float:  # tasks per chunk, the input's own excluded
        return (len(dict(x.__dask_graph__())) - base) / nch

    def plain(b: str) -> Any:
        return dsa.map_overlap(_np_lap, raw, depth=1, boundary="nearest" if b == "extend"
                               else b, trim=False, chunks=raw.chunks, dtype=raw.dtype)

    tasks = {}
    for b in ("periodic", "extend"):
        tasks[f"map {b}"] = per_chunk(lazy.stencil.map(lap, boundary=b).data)
        tasks[f"map_overlap {b}"] = per_chunk(plain(b))
    mixes = [("periodic", "periodic"), ("extend", "periodic"), ("extend", "extend")]
    kw = dict(steps=16, save_every="last", halo_every=16)
    for y, x in mixes:
        seg = lazy.stencil.scan(heat, "time", boundary={"y": y, "x": x}, **kw)
        tasks[f"scan {y} × {x}"] = per_chunk(seg.data)
    compiles = {}
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=":0") as cluster, \
            distributed.Client(cluster) as client:
        on_workers = client.persist(lazy)
        distributed.wait(on_workers)
        for y, x in mixes:
            client.run(xd.clear_cache)
            before = client.run(xd.compile_count)
            out = on_workers.stencil.scan(heat, "time", steps=40, save_every="last",
                                          halo_every=16, boundary={"y": y, "x": x})
            distributed.wait(client.persist(out))
            after = client.run(xd.compile_count)
            compiles[f"{y} × {x}"] = sorted(after[w] - before[w] for w in after)

        def xs_cluster() -> None:
            distributed.wait(client.persist(on_workers.stencil.map(lap, boundary="periodic")))

        def mo_cluster() -> None:
            o = dsa.map_overlap(_np_lap, on_workers.data, depth=1, boundary="periodic",
                                trim=False, chunks=raw.chunks, dtype=raw.dtype)
            distributed.wait(client.persist(o))

        def xs_threads() -> None:
            lazy.stencil.map(lap, boundary="periodic").data.compute(scheduler="threads")

        def mo_threads() -> None:
            plain("periodic").compute(scheduler="threads")

        t = _medians([xs_threads, mo_threads, xs_cluster, mo_cluster], runs)

        def xs_scan() -> None:
            out = on_workers.stencil.scan(heat, "time", steps=40, save_every="last",
                                          halo_every=16, boundary="periodic")
            distributed.wait(client.persist(out))

        # warm (compiled) runs, so the peaks are the work's and not the compiler's
        memory = {"xstencil map": _worker_peaks(client, xs_cluster),
                  "map_overlap + numpy map": _worker_peaks(client, mo_cluster),
                  "xstencil scan, 40 steps": _worker_peaks(client, xs_scan)}
    _log(f"  tasks per chunk {tasks}; compiles per worker {compiles}; times "
         + ", ".join(f"{v * 1e3:.0f} ms" for v in t) + f"; worker memory {memory}")
    return {"n": n, "chunk": chunk, "tasks": tasks, "compiles": compiles, "memory": memory,
            "t": dict(zip(["xstencil, threads", "map_overlap + numpy, threads",
                           "xstencil, LocalCluster", "map_overlap + numpy, LocalCluster"], t,
                          strict=True))}


def lean_section(L: dict[str, Any]) -> str:
    n, c = L["n"], L["chunk"]
    lines = [
        f"### lean dask graphs: {n}² float32 in {c}² chunks",
        "",
        "Tasks per chunk (the input's own excluded; a scan: one segment of 16 steps):",
        "",
        "| graph | xstencil before (f5018ab) | xstencil now | plain `map_overlap` |",
        "|---|---|---|---|",
    ]
    for b in ("periodic", "extend"):
        lines.append(f"| map, {b} | {LEAN_BEFORE[f'map {b}']:.1f} | "
                     f"{L['tasks'][f'map {b}']:.1f} | {L['tasks'][f'map_overlap {b}']:.1f} |")
    for mix in L["compiles"]:
        lines.append(f"| scan, {mix} | {LEAN_BEFORE[f'scan {mix}']:.1f} | "
                     f"{L['tasks'][f'scan {mix}']:.1f} | — |")
    lines += [
        "",
        "Block programs compiled per worker process (LocalCluster, 2 processes), "
        "40-step scan in segments of 16, 16 and 8 steps:",
        "",
        "| boundary (y × x) | before (f5018ab), per worker | now, per worker |",
        "|---|---|---|",
    ]
    for mix, comp in L["compiles"].items():
        lines.append(f"| {mix} | {LEAN_BEFORE[f'compiles {mix}']} | {comp} |")
    t = L["t"]
    lines += [
        "",
        "Periodic 5-point Laplacian, wall time (median):",
        "",
        "| how | time | vs map_overlap + numpy | before (f5018ab) |",
        "|---|---|---|---|",
    ]
    for where in ("threads", "LocalCluster"):
        ref = t[f"map_overlap + numpy, {where}"]
        for who in ("xstencil", "map_overlap + numpy"):
            v, old = t[f"{who}, {where}"], LEAN_BEFORE[f"{who}, {where}"]
            lines.append(f"| {who}, {where} | {v * 1e3:.0f} ms | {v / ref:.2f}× | "
                         f"{old * 1e3:.0f} ms |")
    mib = 2.0 ** 20
    lines += [
        "",
        "Peak resident memory of each worker process (LocalCluster, 2 processes, the "
        "input persisted on them), warm runs; the peak is reset before each job "
        "(Linux `clear_refs`), and the resident memory at that moment (JAX, dask and "
        "the worker's share of the input) is shown next to it:",
        "",
        "| job | peak per worker | resident before | peak above it |",
        "|---|---|---|---|",
    ]
    for job, per in L.get("memory", {}).items():
        lines.append(f"| {job} | " + ", ".join(f"{p / mib:.0f}" for _, p in per) + " MiB | "
                     + ", ".join(f"{b / mib:.0f}" for b, _ in per) + " MiB | "
                     + ", ".join(f"{(p - b) / mib:.0f}" for b, p in per) + " MiB |")
    lines += ["", "Times are from one shared 2-core machine under load from other jobs: "
              "only the task and compile counts are stable."]
    return "\n".join(lines)


# -- part 2: sharded scan (runs in a subprocess with 4 devices) ---------------------------

def _scan_child(n: int, steps: int, runs: int) -> dict[str, Any]:
    import jax
    import numpy as np
    import xarray as xr

    import xstencil  # noqa: F401
    from xstencil._labelled.scale import scan_sharded
    from xstencil._labelled.scan import scan

    assert jax.device_count() == 4, jax.devices()
    rng = np.random.default_rng(0)
    u0 = xr.DataArray(jax.device_put(rng.random((n, n), dtype=np.float32), jax.devices()[0]),
                      dims=("y", "x"))
    kw = dict(steps=steps, save_every="last", boundary={"y": "extend", "x": "periodic"})
    ref = np.asarray(scan(u0, heat, dim="time", **kw).data)

    def mem1() -> int:
        f = jax.jit(lambda a: scan(xr.DataArray(a, dims=("y", "x")), heat, dim="time",
                                   **kw).data)
        m = f.lower(u0.data).compile().memory_analysis()
        return int(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
                   - m.alias_size_in_bytes)

    configs = [(None, None, "1 device, in-memory scan"),
               ({"y": "i"}, 1, "4 devices (4×1), K=1"),
               ({"y": "i"}, 4, "4 devices (4×1), K=4"),
               ({"y": "a", "x": "b"}, 4, "4 devices (2×2), K=4")]

    def runner(mesh: Any, K: Any) -> Any:
        if mesh is None:
            return lambda: jax.block_until_ready(scan(u0, heat, dim="time", **kw).data)
        return lambda: jax.block_until_ready(
            scan_sharded(u0, heat, "time", devices=mesh, halo_every=K, **kw).data)

    times = _medians([runner(m, K) for m, K, _ in configs], runs)
    rows = []
    for (mesh, K, label), t in zip(configs, times, strict=True):
        if mesh is None:
            rows.append({"name": label, "devices": 1, "K": None, "t": t, "mem": mem1(),
                         "halo": 0, "exchanges": 0, "err": 0.0})
            continue
        out = np.asarray(scan_sharded(u0, heat, "time", devices=mesh, halo_every=K, **kw).data)
        exe = scan_sharded(u0, heat, "time", devices=mesh, halo_every=K, hlo="compiled", **kw)
        m = exe.memory_analysis()
        per_dev = int(m.argument_size_in_bytes + m.output_size_in_bytes
                      + m.temp_size_in_bytes - m.alias_size_in_bytes)
        # halo cells received per device per exchange: K rows (cols) on each side of
        # each sharded dim, along the local extent of the other dim (plus corners)
        py = 4 if len(mesh) == 1 else 2
        px = 1 if len(mesh) == 1 else 2
        ly, lx = n // py, n // px
        cells = 2 * K * lx + (2 * K * (ly + 2 * K) if px > 1 else 0)
        rows.append({"name": label, "devices": 4, "K": K, "t": t, "mem": per_dev,
                     "halo": cells * 4, "exchanges": -(-steps // K),
                     "err": float(np.max(np.abs(out - ref)))})
        _log(f"  {label}: {t * 1e3:.1f} ms, {per_dev / 2**20:.1f} MiB per device")
    return {"n": n, "steps": steps, "rows": rows}


def sharded_scan(n: int, steps: int, runs: int) -> dict[str, Any]:
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4")
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, __file__, "--child", str(n), str(steps), str(runs)],
                          capture_output=True, text=True, env=env)
    sys.stderr.write(proc.stderr)
    if proc.returncode:
        raise RuntimeError(f"sharded scan subprocess failed ({proc.returncode})")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -- report -----------------------------------------------------------------------------

def section(d: dict[str, Any], s: dict[str, Any], q: dict[str, Any], quick: bool) -> str:
    n, c = d["n"], d["chunk"]
    mib = n * n * 4 / 2**20
    lines = [
        "## Scaling out (`benchmarks/scale.py`)" + (" — quick sizes" if quick else ""),
        "",
        f"Machine: {os.cpu_count()} CPU cores, load average {os.getloadavg()[0]:.0f} at the "
        f"end of the run (other jobs share it; the columns of each table are timed "
        f"round-robin so that load hits them alike).  Medians of several runs, compile "
        f"excluded.",
        "",
        f"### dask map: 5-point Laplacian, {n}² float32 ({mib:.0f} MiB), "
        f"{c}² chunks ({d['tasks']} tasks)",
        "",
        "| where | numba loops (default) | XLA (`backend=\"xla\"`) | XLA ÷ loops |",
        "|---|---|---|---|",
    ]
    t = d["t"]
    for where, name in (("memory", "in memory (one numpy array)"),
                        ("threads", "dask, threaded scheduler (`.compute()`)"),
                        ("cluster", "dask, LocalCluster 2 procs × 1 thread (persisted "
                                    "in and out)")):
        a, x = t[f"{where}, auto"], t[f"{where}, xla"]
        lines.append(f"| {name} | {a * 1e3:.0f} ms ({a / t['memory, auto']:.2f}×) | "
                     f"{x * 1e3:.0f} ms ({x / t['memory, xla']:.2f}×) | {x / a:.2f}× |")
    lines += [
        "",
        f"In brackets: the ratio to the same backend in memory.  Each dask block is "
        f"joined with its neighbours' edge strips in numpy and runs the in-memory map's "
        f"loop nest (docs/performance.rst, \"dask blocks on the loop backend\"); max abs "
        f"difference from the in-memory map: {d['err']:.1e}.  Block programs compiled per "
        f"worker process over all runs: {d['compiles']} (one block geometry: one loop nest "
        f"and one XLA function per process, not one per task).  The threaded "
        f"scheduler's time includes assembling the result into one numpy array.",
        "",
        f"### dask scan: {q['n']}² fields, {q['steps']} steps, {q['chunk']}² chunks, "
        f"halo_every={q['K']}, threaded scheduler, final state only",
        "",
        "| how | time | vs in memory |",
        "|---|---|---|",
    ]
    for what in ("plain", "plain, XLA", "mesh", "Dataset"):
        kind, _, how = what.partition(", ")
        suffix = f", {how}" if how else ""
        t_mem, t_dask = q["t"][f"{kind}, in memory{suffix}"], q["t"][f"{kind}, dask{suffix}"]
        lines += [f"| {kind}, in memory{suffix} | {t_mem * 1e3:.0f} ms | 1.00× |",
                  f"| {kind}, dask{suffix} | {t_dask * 1e3:.0f} ms | {t_dask / t_mem:.2f}× |"]
    mesh_cost = q["t"]["mesh, dask"] / q["t"]["plain, dask"]
    lines += [
        "",
        f"The plain and Dataset scans run on the numba loops by default, in memory and "
        f"in each dask task (the chunk extended by its halo, scanned by the in-memory "
        f"loop scan); `XLA` rows use `backend=\"xla\"`.  The mesh scan runs on the loops "
        f"in memory, but its dask tasks run the XLA block program, so the two differ by "
        f"float32 rounding.  The mesh (a cold strip by position, a hot band by label, a "
        f"mask; periodic) costs {mesh_cost:.2f}× the plain dask scan.  Max abs "
        f"difference from the in-memory mesh scan: {q['err']:.1e}.  The Dataset case "
        f"advances h and u (stacked in one array per task) over a constant bathymetry b "
        f"(one more overlapped input).",
        "",
        f"### sharded scan: heat equation {s['n']}², {s['steps']} steps, final state only",
        "",
        "| how | time | vs 1 device | memory per device | halo per exchange per device "
        "| exchanges | max abs diff vs 1 device |",
        "|---|---|---|---|---|---|---|",
    ]
    base = s["rows"][0]["t"]
    for r in s["rows"]:
        halo = "—" if not r["halo"] else f"{r['halo'] / 1024:.0f} KiB"
        lines.append(f"| {r['name']} | {r['t'] * 1e3:.0f} ms | {r['t'] / base:.2f}× | "
                     f"{r['mem'] / 2**20:.1f} MiB | {halo} | {r['exchanges'] or '—'} | "
                     f"{r['err']:.1e} |")
    lines += [
        "",
        "The 4 devices are simulated on the same CPU cores, so these times are not "
        "a prediction for real devices: the simulated devices run their loops side by "
        "side on the machine's cores, which can beat the single-device loop, and a "
        "`ppermute` between them is a memory copy with almost no latency.  On CPU, "
        "then, K=4 (a quarter of the messages, the same bytes, a few redundant rows "
        "per block) need not beat K=1; on GPUs, where each message costs latency, "
        "it is meant to (see docs/scaling.rst).  What the table does show: the "
        "results are identical, the halo bytes are what the layout predicts, and "
        "each device holds a quarter of the field plus its halo.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "--child":
        n, steps, runs = (int(a) for a in argv[1:4])
        print(json.dumps(_scan_child(n, steps, runs)))
        return 0
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    H.add_output_flags(p)
    p.add_argument("--runs", type=int, default=None, help="timed runs per figure")
    p.add_argument("--lean", action="store_true", help="the lean-graph part only; prints")
    p.add_argument("--map", action="store_true", help="the dask-map part only; prints")
    p.add_argument("--scan", action="store_true", help="the dask-scan part only; prints")
    a = p.parse_args(argv)
    runs = a.runs or (3 if a.quick else 5)
    n, chunk = (1024, 256) if a.quick else (8192, 2048)
    if a.map:
        print(json.dumps(dask_map(n, chunk, runs), indent=1))
        return 0
    qn, qc, qsteps = (256, 128, 32) if a.quick else (2048, 1024, 256)
    if a.scan:
        print(json.dumps(dask_scan(qn, qc, qsteps, 16, runs), indent=1))
        return 0
    _log(f"lean dask graphs {n // 2 if not a.quick else n}² ")
    L = dask_lean(n // 2 if not a.quick else n, chunk // 2 if not a.quick else chunk, runs)
    if a.lean:
        print(lean_section(L))
        return 0
    sn, steps = (256, 40) if a.quick else (2048, 200)
    _log(f"dask map {n}² in {chunk}² chunks")
    d = dask_map(n, chunk, runs)
    _log(f"sharded scan {sn}², {steps} steps")
    s = sharded_scan(sn, steps, runs)
    _log(f"dask scan {qn}² in {qc}² chunks, {qsteps} steps")
    q = dask_scan(qn, qc, qsteps, 16, runs)
    H.publish("scale", section(d, s, q, a.quick) + "\n\n" + lean_section(L), a, _log)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Memory and robustness.

* A map over a 4096 x 4096 float32 array needs less than 4x the array in
  extra memory (XLA's own accounting of the compiled call: temporaries plus
  the output, against the argument), and leaves only its output alive.
* Thousands of accessor calls with fresh lambdas do not grow memory without
  bound: the compile cache holds kernels weakly.
* A KeyboardInterrupt during a long scan with ``progress=True`` leaves no
  progress bar open and no thread behind.
"""

from __future__ import annotations

import _thread
import gc
import os
import resource
import threading
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr

import xstencil

N = 4096


def lap(u: Any) -> Any:
    return u(x=1) + u(x=-1) + u(y=1) + u(y=-1) - 4 * u()


W = np.full((3, 3), 1 / 9, np.float32)


def blur(u: Any) -> Any:
    return (u * W).sum()


CASES = {
    "laplacian-fill": (lap, {"boundary": "fill"}),
    "laplacian-periodic": (lap, {"boundary": "periodic"}),
    "laplacian-reflect": (lap, {"boundary": "reflect"}),
    "blur-3x3-extend": (blur, {"window": {"y": 3, "x": 3}, "boundary": "extend"}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_map_peak_memory_below_4x_array(name: str) -> None:
    kernel, options = CASES[name]
    x = jax.ShapeDtypeStruct((N, N), jnp.float32)

    def run(a: Any) -> Any:
        return xr.DataArray(a, dims=("y", "x")).stencil.map(kernel, **options).data

    stats = jax.jit(run).lower(x).compile().memory_analysis()
    if stats is None:
        pytest.skip("this backend reports no memory analysis")
    size = N * N * 4
    assert stats.argument_size_in_bytes == size
    extra = stats.temp_size_in_bytes + stats.output_size_in_bytes
    print(f"\n{name}: output {stats.output_size_in_bytes / size:.2f}x, temporaries "
          f"{stats.temp_size_in_bytes / size:.2f}x the {size / 2**20:.0f} MiB array")
    assert extra < 4 * size, (name, stats)


def test_map_leaves_only_its_output_alive() -> None:
    a = jnp.ones((1024, 1024), jnp.float32)
    da = xr.DataArray(a, dims=("y", "x"))
    da.stencil.map(lap, boundary="periodic")  # compile and warm up
    gc.collect()
    before = {id(b) for b in jax.live_arrays()}
    out = da.stencil.map(lap, boundary="periodic")
    gc.collect()
    new = [b for b in jax.live_arrays() if id(b) not in before]
    assert sum(b.nbytes for b in new) == out.data.nbytes


def _rss_mib() -> float:
    with open("/proc/self/statm") as fh:
        pages = int(fh.read().split()[1])
    return pages * resource.getpagesize() / 2**20


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/statm"),
                    reason="needs /proc to read the resident set size")
def test_fresh_lambdas_do_not_grow_memory() -> None:
    """A fresh lambda whose closed-over number changes on every call cannot
    share a cache entry (see kcache.py), so each call compiles it (~10-50 ms);
    after a warm-up the resident set stays flat and the cache stays bounded."""
    from xstencil._engine.kcache import _TABLE, SIZE

    da = xr.DataArray(np.arange(16.0, dtype=np.float32), dims="x")

    def calls(n: int) -> None:
        for i in range(n):
            c = float(i)  # a number: keyed by value, so a new one compiles
            out = da.stencil.map(lambda u, c=c: u(x=1) - u(x=-1) + c, boundary="periodic")
            del out
        gc.collect()

    # every call compiles (~40 ms on one core): 1000 calls in all take ~40 s;
    # XSTENCIL_MEMORY_CALLS=5000 runs more
    n = int(os.environ.get("XSTENCIL_MEMORY_CALLS", "960"))
    start = time.perf_counter()
    calls(max(40, SIZE // 2))  # warm-up: allocator pools, JAX, XLA and xstencil caches fill
    warm = _rss_mib()
    calls(n)
    grown = _rss_mib() - warm
    elapsed = time.perf_counter() - start
    print(f"\n{40 + n} calls with fresh lambdas in {elapsed:.1f} s; RSS grew {grown:.1f} MiB "
          f"over the last {n}")
    # old entries are dropped with their compiled code (a bounded LRU table)
    assert len(_TABLE) <= SIZE, len(_TABLE)
    # a leak of one compiled executable per call would be >= 100 KiB each
    assert grown < max(10, n * 0.04), f"RSS grew by {grown:.1f} MiB over {n} calls"


_TRACES = [0]


def _traced() -> int:
    """Counts how often a kernel body runs (it runs only while being traced)."""
    _TRACES[0] += 1
    return 0


def test_fresh_lambdas_with_equal_code_and_values_share_one_compile() -> None:
    """The same inline kernel written in a loop compiles once; one that closes
    over different values, or reads a global whose value changed, does not
    share; the shared kernels kept alive are bounded."""
    from xstencil._engine import kcache

    da = xr.DataArray(np.arange(16.0, dtype=np.float32), dims="x")
    before = _TRACES[0]
    outs = [da.stencil.map(lambda u: _traced() + u(x=1) - u(x=-1), boundary="periodic")
            for _ in range(50)]
    first = _TRACES[0] - before
    assert first >= 1
    assert all(np.array_equal(o.values, outs[0].values) for o in outs)
    assert _TRACES[0] - before == first  # the 49 later lambdas reused the first's code
    for k in (1, 2):  # different closure values: their own traces and results
        out = da.stencil.map(_times(k), boundary="fill", fill_value=0.0)
        np.testing.assert_array_equal(out.values, k * da.values)
    global _SCALE
    for scale in (2.0, 3.0):  # the same code, reading a global that changed in between
        _SCALE = scale
        out = da.stencil.map(_scaled(), boundary="fill", fill_value=0.0)
        np.testing.assert_array_equal(out.values, scale * da.values)
    for k in range(kcache.SIZE + 8):
        da.stencil.map(lambda u, k=k: u() + k)
    assert len(kcache._TABLE) <= kcache.SIZE


_SCALE = 1.0


def _times(k: Any) -> Any:
    return lambda u: _traced() + k * u()


def _scaled() -> Any:
    return lambda u: _SCALE * u()


def test_keyboard_interrupt_during_scan_leaves_nothing_behind(monkeypatch: Any) -> None:
    from tqdm.auto import tqdm

    from xstencil import _progress

    monkeypatch.setattr(_progress, "INTERVAL", 0.0)  # update at every test
    interrupted = threading.Event()
    real_report = _progress.report

    def report(token: Any, done: Any) -> None:
        real_report(token, done)
        if not interrupted.is_set():
            interrupted.set()
            _thread.interrupt_main()  # as if the user pressed Ctrl-C now

    monkeypatch.setattr(_progress, "report", report)
    threads_before = set(threading.enumerate())
    u0 = xr.DataArray(np.linspace(0.0, 1.0, 32), dims="x")

    def heat(u: Any) -> Any:
        return u(time=-1) + 0.25 * (u(time=-1, x=1) - 2 * u(time=-1) + u(time=-1, x=-1))

    # On CPU the progress callback runs on the main thread, so the interrupt is
    # raised inside it; the runtime wraps it and the scan re-raises it as a
    # KeyboardInterrupt, after closing the bar.
    with pytest.raises(KeyboardInterrupt) as info:
        out = xstencil.scan(u0, heat, dim="time", steps=200_000, save_every="last",
                            boundary={"x": "periodic"}, progress=True)
        jax.block_until_ready(out.data)
        time.sleep(5)  # if the interrupt is delivered only after the call returns
    assert interrupted.is_set()
    assert info.type is KeyboardInterrupt
    jax.effects_barrier()
    assert _progress._OPEN == {}
    assert not [b for b in getattr(tqdm, "_instances", ()) if not b.disable]
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        extra = [t for t in threading.enumerate() if t not in threads_before and t.is_alive()]
        if not extra:
            break
        time.sleep(0.05)
    assert not extra, extra

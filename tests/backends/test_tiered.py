"""Loop nests run serially first and in parallel once promoted
(``xstencil/_backends/tiered.py``).

The serial and the parallel build of a nest compute every output element
with the same operations in the same order, so promotion must never change
a number: each map case is run serially, promoted, run again in parallel and
compared bitwise, and with the numpy reference where there is a simple one.
Also checked: the threshold (``XSTENCIL_PROMOTE_AFTER``: a large value never
promotes, ``0`` builds in parallel at once, a bad value is refused by name),
a parallel build that fails (the serial nest stays, and is right), new
argument types after promotion, a scan's time-loop driver, ``os.fork`` while
a build is under way, and an interpreter that exits during one.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pytest
import xarray as xr

import xstencil
from tests.backends.test_scan_timeloop import heat, np_heat
from tests.spies import count_calls, recorded
from xstencil._backends import loop_steps, loopcache, loops, loops_mesh, tiered

pytest.importorskip("numba")

#: A nest source of the generator's shape (a ``prange`` over rows), for the
#: unit cases that need no JAX.
SOURCE = textwrap.dedent("""\
    def kernel(o, a):
        for i in prange(a.shape[0]):
            for j in range(a.shape[1]):
                o[i, j] = a[i, j] * 3.0 + a[i, 0] * 0.5
        return True
    """)


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> list[tiered.Tiered]:
    """The tiered nests the maps of a test make, promoted after any run."""
    xstencil.clear_caches()
    monkeypatch.setenv(tiered.ENV, "1e-9")
    monkeypatch.delenv(loops.ENV, raising=False)
    return recorded(monkeypatch, loops, "_compile")


def lap(u: Any) -> Any:
    return u(x=1) + u(x=-1) + u(y=1) + u(y=-1) - 4 * u()


def _lap_ref(a: np.ndarray) -> np.ndarray:
    r = np.roll
    return r(a, -1, 1) + r(a, 1, 1) + r(a, -1, 0) + r(a, 1, 0) - a.dtype.type(4) * a


def _weighted(w: np.ndarray) -> Any:
    def kernel(u: Any) -> Any:
        return (u * w).sum()
    return kernel


def _cases() -> dict[str, tuple[Any, np.ndarray, dict[str, Any]]]:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((5, 5)).astype(np.float32)
    w0 = w.copy()
    w0[1, 3] = 0.0  # a runtime zero weight: the masked variant
    w3 = rng.standard_normal((3, 3, 3)).astype(np.float32)
    return {
        "laplace periodic": (lap, rng.standard_normal((70, 90)).astype(np.float32),
                             {"boundary": "periodic"}),
        "laplace fill int16": (lap, rng.integers(-99, 99, (64, 40)).astype(np.int16),
                               {"boundary": "fill", "fill_value": 7}),
        "5x5 dense": (_weighted(w), rng.standard_normal((60, 66)).astype(np.float32),
                      {"window": {"y": 5, "x": 5}, "boundary": "reflect"}),
        "5x5 zero weight": (_weighted(w0), rng.standard_normal((60, 66)).astype(np.float32),
                            {"window": {"y": 5, "x": 5}, "boundary": "periodic"}),
        "3-D outlined": (_weighted(w3), rng.standard_normal((12, 14, 16)).astype(np.float32),
                         {"window": {"z": 3, "y": 3, "x": 3}, "boundary": "extend"}),
    }


@pytest.mark.parametrize("case", list(_cases()))
def test_promotion_keeps_every_number(made: list[tiered.Tiered], case: str) -> None:
    kernel, a, opts = _cases()[case]
    dims = ("z", "y", "x")[3 - a.ndim:]
    da = xr.DataArray(a, dims=dims, name="v", attrs={"units": "m"})
    keep = a.copy()

    def run() -> xr.DataArray:
        return da.stencil.map(kernel, backend="loops", **opts)

    first = run()  # compiles the serial build and runs it (not counted)
    second = run()  # counted: asks for the parallel build
    assert made and all(t.ran == "serial" for t in made)
    assert tiered.settle(timeout=300)
    assert all(t.parallel is not None and not t.failed for t in made)
    third = run()
    assert all(t.ran == "parallel" for t in made if t.ran is not None)
    np.testing.assert_array_equal(first.values, second.values)
    np.testing.assert_array_equal(first.values, third.values)
    assert third.dtype == first.dtype and third.attrs == {"units": "m"} and third.name == "v"
    np.testing.assert_array_equal(a, keep)
    if case == "laplace periodic":
        np.testing.assert_array_equal(third.values, _lap_ref(a))


def test_a_function_mesh_promotes_its_large_regions(monkeypatch: pytest.MonkeyPatch,
                                                    made: list[tiered.Tiered]) -> None:
    """A mesh region of at least ``PARALLEL_MIN_POINTS`` points is a tiered
    nest (a small one stays serial for good): bitwise the same before and
    after promotion, and the numpy reference."""
    nests = recorded(monkeypatch, loops_mesh, "_compile")
    a = np.random.default_rng(6).standard_normal((260, 270)).astype(np.float32)
    m = xr.DataArray(a, dims=("y", "x")).stencil.mesh(boundary="periodic", backend="loops")
    m[...] = lap
    m[{"x": 0}] = lambda u: u(x=-1) * 2
    want = _lap_ref(a)
    want[:, 0] = np.roll(a, 1, 1)[:, 0] * np.float32(2)
    first = m.map()
    second = m.map()
    big = [t for t in nests if isinstance(t, tiered.Tiered)]
    assert len(big) == 1 and big[0].ran == "serial" and len(nests) == 2
    assert tiered.settle(timeout=300) and big[0].parallel is not None
    third = m.map()
    assert big[0].ran == "parallel"
    for got in (first, second, third):
        np.testing.assert_array_equal(got.values, want)


def test_a_large_threshold_never_promotes(monkeypatch: pytest.MonkeyPatch,
                                          made: list[tiered.Tiered]) -> None:
    monkeypatch.setenv(tiered.ENV, "1000")
    a = np.random.default_rng(1).standard_normal((50, 60)).astype(np.float32)
    da = xr.DataArray(a, dims=("y", "x"))
    for _ in range(6):
        got = da.stencil.map(lap, boundary="periodic", backend="loops")
    (t,) = made
    assert t.ran == "serial" and t.parallel is None and 0 < t.spent < 1000
    assert t.serial is not None and not t._queued
    np.testing.assert_array_equal(got.values, _lap_ref(a))


def test_zero_builds_in_parallel_on_the_first_call(monkeypatch: pytest.MonkeyPatch,
                                                   made: list[tiered.Tiered]) -> None:
    monkeypatch.setenv(tiered.ENV, "0")
    a = np.random.default_rng(2).standard_normal((50, 60)).astype(np.float32)
    got = xr.DataArray(a, dims=("y", "x")).stencil.map(lap, boundary="periodic",
                                                       backend="loops")
    (t,) = made
    assert t.ran == "parallel" and t.serial is None and t.parallel is not None
    np.testing.assert_array_equal(got.values, _lap_ref(a))


@pytest.mark.parametrize("text", ["-1", "soon", "nan"])
def test_a_bad_threshold_is_refused_by_name(monkeypatch: pytest.MonkeyPatch,
                                            made: list[tiered.Tiered], text: str) -> None:
    monkeypatch.setenv(tiered.ENV, text)
    da = xr.DataArray(np.ones((30, 30), np.float32), dims=("y", "x"))
    with pytest.raises(ValueError, match=f"XSTENCIL_PROMOTE_AFTER={text!r}.*'0'"):
        da.stencil.map(lap, boundary="periodic", backend="loops")


def test_a_failed_parallel_build_keeps_the_serial_nest() -> None:
    made: list[bool] = []

    def make(parallel: bool) -> Any:
        made.append(parallel)
        if parallel:
            raise RuntimeError("no parallel build here")
        return loopcache.njit_source(SOURCE, "<t>", error_model="numpy", nogil=True)

    t = tiered.Tiered(make, 1e-9)
    a = np.arange(12.0).reshape(3, 4)
    for _ in range(3):
        out = np.zeros_like(a)
        assert t(out, a) is True
        np.testing.assert_array_equal(out, a * 3.0 + a[:, :1] * 0.5)
    assert tiered.settle(timeout=300)
    out = np.zeros_like(a)
    t(out, a)
    assert t.failed and t.parallel is None and t.ran == "serial" and made == [False, True]
    np.testing.assert_array_equal(out, a * 3.0 + a[:, :1] * 0.5)


def test_new_argument_types_after_promotion_run_serially_then_promote() -> None:
    t = loops._compile(SOURCE)
    t.after = 1e-9
    a = np.arange(20.0).reshape(4, 5)
    for _ in range(2):
        t(np.zeros_like(a), a)
    assert tiered.settle(timeout=300) and t.parallel is not None
    ro = a.astype(np.float32)
    ro.flags.writeable = False  # a read-only float32 input: new types for both builds
    out = np.zeros(ro.shape, np.float32)
    t(out, ro)
    assert t.ran == "serial"  # the parallel build refuses types it was not built for
    want = ro * np.float32(3.0) + ro[:, :1] * np.float32(0.5)
    np.testing.assert_array_equal(out, want)
    t(out, ro)  # a counted run: the parallel build is asked for these types too
    assert tiered.settle(timeout=300)
    out2 = np.zeros_like(out)
    t(out2, ro)
    assert t.ran == "parallel" and len(t.parallel.signatures) == 2
    np.testing.assert_array_equal(out2, out)


def test_a_hot_scan_drives_the_parallel_build_with_the_same_numbers(
        monkeypatch: pytest.MonkeyPatch, made: list[tiered.Tiered]) -> None:
    """A hot scan's first step (from Python) and its time-loop driver both
    run the parallel build, made at once: bitwise the numpy loop in the
    kernel's order of operations."""
    monkeypatch.setenv(tiered.ENV, "1000")  # never promoted by run time: by the driver
    monkeypatch.setattr(loop_steps, "HOT_STEPS", 1)
    monkeypatch.setattr(loop_steps, "MIN_STEPS", 2)
    drove = count_calls(monkeypatch, loop_steps, "run")
    a = np.random.default_rng(3).standard_normal((40, 48)).astype(np.float32)
    da = xr.DataArray(a, dims=("y", "x"))
    want = np_heat(a, 30)[-1]
    got = da.stencil.scan(heat, "time", steps=30, save_every="last", boundary="fill",
                          fill_value=0.0, backend="loops")
    assert drove, "the driver did not run"
    # a hot scan's first step runs the parallel build too: no serial compile at all
    assert made and all(t.serial is None and t.parallel is not None for t in made)
    assert got.values.tobytes() == want.tobytes()


def test_a_hot_scan_whose_parallel_build_fails_drives_the_serial_one(
        monkeypatch: pytest.MonkeyPatch, made: list[tiered.Tiered]) -> None:
    real = tiered.njit_source

    def no_parallel(source: str, label: str, **options: Any) -> Any:
        if options.get("parallel"):
            raise RuntimeError("no parallel build here")
        return real(source, label, **options)

    monkeypatch.setattr(tiered, "njit_source", no_parallel)
    monkeypatch.setattr(loop_steps, "HOT_STEPS", 1)
    monkeypatch.setattr(loop_steps, "MIN_STEPS", 2)
    drove = count_calls(monkeypatch, loop_steps, "run")
    a = np.random.default_rng(7).standard_normal((30, 36)).astype(np.float32)
    got = xr.DataArray(a, dims=("y", "x")).stencil.scan(
        heat, "time", steps=20, save_every="last", boundary="fill", fill_value=0.0,
        backend="loops")
    assert drove and any(t.failed and t.parallel is None for t in made)
    assert got.values.tobytes() == np_heat(a, 20)[-1].tobytes()


def _child(conn: Any) -> None:  # a forked child: numba compiles here (no JAX)
    t = loops._compile(SOURCE.replace("3.0", "5.0"))
    t.after = 1e-9
    a = np.arange(6.0).reshape(2, 3)
    out = np.zeros_like(a)
    t(out, a)
    t(out, a)
    conn.send((out.tolist(), tiered.settle(timeout=200), t.parallel is not None))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork here")
# JAX warns at every fork (its threads); the child here runs numba only, no JAX
@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_fork_during_a_build_leaves_the_child_able_to_compile() -> None:
    t = loops._compile(SOURCE.replace("3.0", "4.0"))
    t.after = 1e-9
    a = np.arange(8.0).reshape(2, 4)
    t(np.zeros_like(a), a)
    t(np.zeros_like(a), a)  # the build is queued, and likely under way at the fork
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_child, args=(child,))
    proc.start()
    assert parent.poll(240), "the forked child did not finish (a deadlock?)"
    out, settled, promoted = parent.recv()
    proc.join(60)
    assert proc.exitcode == 0 and settled and promoted
    x = np.arange(6.0).reshape(2, 3)
    np.testing.assert_array_equal(out, x * 5.0 + x[:, :1] * 0.5)
    assert tiered.settle(timeout=300) and t.parallel is not None


@pytest.mark.slow  # a fresh interpreter that starts a build: 69 s on a loaded 2-core host
def test_the_interpreter_exits_cleanly_during_a_build(tmp_path: Any) -> None:
    script = textwrap.dedent(f"""\
        import numpy as np
        from xstencil._backends import loops
        t = loops._compile({SOURCE.replace("3.0", "6.0")!r})
        t.after = 1e-9
        a = np.ones((3, 3))
        t(np.zeros_like(a), a)
        t(np.zeros_like(a), a)
        print("queued", t._queued)
        """)
    env = {**os.environ, "XSTENCIL_CACHE_DIR": str(tmp_path)}  # a cold compile, under way
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, env=env, cwd=os.path.dirname(os.path.dirname(
                              os.path.dirname(os.path.abspath(__file__)))))
    assert done.returncode == 0, done.stderr
    assert "queued True" in done.stdout and "Traceback" not in done.stderr

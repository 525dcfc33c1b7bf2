"""The loop scans' time loop in compiled chunks (``xstencil/_backends/loop_steps.py``).

Once a nest has been asked for ``HOT_STEPS`` steps, a grown loop scan runs
its first step in Python and the rest in a numba driver that calls the same
nest many steps per call.  Checked here, each against the per-step Python
loop (the route before the driver: ``HOT_STEPS`` out of reach) and against a
plain numpy time loop that performs the kernel's operations in its order:
bitwise the same values for every save form (every step, every k-th, the
last, the first and last only), float32 and float64, 1-D, 2-D and 3-D
fields, Dataset scans with a constant, runtime weights (both nest variants),
chunks of one step, progress bars and repeated calls; ``check_finite`` with
a value that turns infinite mid-run raises the same error, naming the same
step, as the per-step loop; the driver really ran (a spy on
``loop_steps.run``), and only once the nest is hot.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import xarray as xr

import xstencil
from tests.spies import count_calls
from xstencil._errors import XStencilError

numba = pytest.importorskip("numba")

from xstencil._backends import loop_steps  # noqa: E402 - after the numba check
from xstencil._labelled import loop_scan as LS  # noqa: E402

A = 0.2


@pytest.fixture
def drove(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Every nest is hot at once (scans of 2 steps on); counts the driver runs."""
    monkeypatch.delenv("XSTENCIL_BACKEND", raising=False)
    monkeypatch.setattr(loop_steps, "HOT_STEPS", 1)
    monkeypatch.setattr(loop_steps, "MIN_STEPS", 2)
    yield count_calls(monkeypatch, loop_steps, "run")


def python_loop(monkeypatch: pytest.MonkeyPatch, fn: Callable[[], Any]) -> Any:
    """``fn()`` with the per-step Python loop (no nest is ever hot), on fresh caches."""
    with monkeypatch.context() as m:
        m.setattr(loop_steps, "HOT_STEPS", 10**12)
        xstencil.clear_caches()
        try:
            return fn()
        finally:
            xstencil.clear_caches()


def heat(u: Any) -> Any:
    c = u(time=-1)
    return c + A * (u(time=-1, x=1) + u(time=-1, x=-1) + u(time=-1, y=1) + u(time=-1, y=-1)
                    - 4 * c)


def np_heat(u0: np.ndarray, steps: int) -> list[np.ndarray]:
    """Every state of ``heat`` with a zero fill, in the kernel's operation order."""
    a, four = u0.dtype.type(A), u0.dtype.type(4)
    out = [u0]
    for _ in range(steps):
        p = np.pad(out[-1], 1)
        c = p[1:-1, 1:-1]
        s = p[1:-1, 2:] + p[1:-1, :-2]
        s = s + p[2:, 1:-1]
        s = s + p[:-2, 1:-1]
        out.append(c + a * (s - four * c))
    return out


def _field(shape: tuple[int, ...], dtype: Any, dims: tuple[str, ...] = ("y", "x")) -> Any:
    v = np.random.default_rng(3).random(shape).astype(dtype)
    return xr.DataArray(v, dims=dims, name="T", attrs={"units": "K"})


def _saved(traj: list[np.ndarray], save_every: Any) -> np.ndarray:
    return traj[-1] if save_every == "last" else np.stack(traj[::save_every])


# 6-15 s a case on 2 cores: each save mode once in the fast run, both dtypes among them
@pytest.mark.parametrize(("save_every", "dtype"), [
    pytest.param(every, dtype, id=f"{every}-{np.dtype(dtype).name}",
                 marks=() if (i + j) % 2 == 0 else pytest.mark.slow)
    for i, every in enumerate([1, 4, 40, "last"])
    for j, dtype in enumerate([np.float32, np.float64])])
def test_bitwise_the_per_step_loop_and_numpy(drove: list[int], monkeypatch: pytest.MonkeyPatch,
                                             save_every: Any, dtype: Any) -> None:
    u0 = _field((19, 23), dtype)
    before = u0.copy(deep=True)
    kw = dict(steps=40, save_every=save_every, boundary="fill", fill_value=0.0,
              backend="loops")
    ref = python_loop(monkeypatch, lambda: u0.stencil.scan(heat, "time", **kw))
    assert not drove
    out = u0.stencil.scan(heat, "time", **kw)
    assert drove, "the driver did not run"
    xr.testing.assert_identical(out, ref)
    assert out.values.tobytes() == ref.values.tobytes() and out.dtype == dtype
    assert out.values.tobytes() == _saved(np_heat(u0.values, 40), save_every).tobytes()
    again = u0.stencil.scan(heat, "time", **kw)  # the repeat-call fast path drives too
    assert len(drove) == 2 and again.values.tobytes() == ref.values.tobytes()
    xr.testing.assert_identical(u0, before)  # the input is never written


def test_chunks_of_one_step_and_a_bar(drove: list[int], monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Every driver call runs one step (``CHUNK_SECONDS = 0``), then with a
    progress bar (its chunks end at each due report): the same values."""
    u0 = _field((16, 16), np.float32)
    kw = dict(steps=30, save_every=3, boundary="fill", fill_value=0.0, backend="loops")
    want = np.stack(np_heat(u0.values, 30)[::3])
    monkeypatch.setattr(loop_steps, "CHUNK_SECONDS", 0.0)
    out = u0.stencil.scan(heat, "time", **kw)
    assert drove and out.values.tobytes() == want.tobytes()
    monkeypatch.setattr(loop_steps, "CHUNK_SECONDS", 0.05)
    bar = u0.stencil.scan(heat, "time", progress=True, **kw)
    assert len(drove) == 2 and bar.values.tobytes() == want.tobytes()
    assert "30/30" in capsys.readouterr().err


def test_a_read_only_input(drove: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    """The first step reads the input itself (here read-only, a nest type of
    its own); the driver then reads and writes its own buffers."""
    v = np.random.default_rng(4).random((14, 9)).astype(np.float32)
    v.flags.writeable = False
    u0 = xr.DataArray(v, dims=("y", "x"))
    kw = dict(steps=20, save_every=5, boundary="fill", fill_value=0.0, backend="loops")
    out = u0.stencil.scan(heat, "time", **kw)
    assert drove and out.values.tobytes() == np.stack(np_heat(v, 20)[::5]).tobytes()


@pytest.mark.parametrize("shape", [(50,), (6, 7, 8)])
def test_one_and_three_dimensional_fields(drove: list[int], monkeypatch: pytest.MonkeyPatch,
                                          shape: tuple[int, ...]) -> None:
    dims = ("z", "y", "x")[-len(shape):]
    u0 = _field(shape, np.float64, dims)

    def k(u: Any) -> Any:
        return u(time=-1) + A * sum(u(time=-1, **{d: s}) - u(time=-1) for d in dims
                                    for s in (1, -1))

    kw = dict(steps=25, save_every=5, boundary="periodic", backend="loops")
    ref = python_loop(monkeypatch, lambda: u0.stencil.scan(k, "time", **kw))
    out = u0.stencil.scan(k, "time", **kw)
    assert drove and out.values.tobytes() == ref.values.tobytes()
    x, want = u0.values, [u0.values]
    for _ in range(25):
        acc = None
        for d in range(len(dims)):
            for s in (1, -1):
                term = np.roll(x, -s, d) - x
                acc = term if acc is None else acc + term
        x = x + A * acc
        want.append(x)
    assert out.values.tobytes() == np.stack(want[::5]).tobytes()


def coupled(s: Any) -> Any:
    u, v, c = s["u"], s["v"], s["c"]
    return {"u": u(time=-1) + c() * (v(time=-1, x=1) - v(time=-1, x=-1)),
            "v": v(time=-1) + A * (u(time=-1, x=1) - u(time=-1, x=-1))}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_dataset_with_a_constant(drove: list[int], monkeypatch: pytest.MonkeyPatch,
                                   dtype: Any) -> None:
    rng = np.random.default_rng(8)
    ds = xr.Dataset({"u": ("x", rng.random(33).astype(dtype)),
                     "v": ("x", rng.random(33).astype(dtype)),
                     "c": ("x", (0.1 * rng.random(33)).astype(dtype))})
    kw = dict(steps=20, save_every=2, boundary="periodic", backend="loops")
    ref = python_loop(monkeypatch, lambda: ds.stencil.scan(coupled, "time", **kw))
    out = ds.stencil.scan(coupled, "time", **kw)
    assert drove
    xr.testing.assert_identical(out, ref)
    u, v, c = ds["u"].values, ds["v"].values, ds["c"].values
    us, vs = [u], [v]
    for _ in range(20):
        u, v = (u + c * (np.roll(v, -1) - np.roll(v, 1)),
                v + dtype(A) * (np.roll(u, -1) - np.roll(u, 1)))
        us.append(u)
        vs.append(v)
    for name, traj in (("u", us), ("v", vs)):
        assert out[name].values.tobytes() == np.stack(traj[::2]).tobytes(), name
        assert out[name].values.tobytes() == ref[name].values.tobytes(), name


@pytest.mark.parametrize("w0", [0.25, 0.0])
def test_runtime_weights_both_nest_variants(drove: list[int], monkeypatch: pytest.MonkeyPatch,
                                            w0: float) -> None:
    """Weights the kernel closes over: all nonzero runs the unmasked nest
    (which checks the weights itself), a zero weight the masked one."""
    w = np.array([w0, 0.5, 0.25])

    def k(u: Any) -> Any:
        return w[0] * u(time=-1, x=-1) + w[1] * u(time=-1) + w[2] * u(time=-1, x=1)

    u0 = _field((41,), np.float64, ("x",))
    kw = dict(steps=30, save_every="last", boundary="periodic", backend="loops")
    ref = python_loop(monkeypatch, lambda: u0.stencil.scan(k, "time", **kw))
    out = u0.stencil.scan(k, "time", **kw)
    assert drove and out.values.tobytes() == ref.values.tobytes()
    x = u0.values
    for _ in range(30):
        left = np.roll(x, 1)
        left = left if w0 != 0 else np.where(np.isfinite(left), left, 0.0)
        x = (left * w[0] + x * w[1]) + np.roll(x, -1) * w[2]
    assert out.values.tobytes() == x.tobytes()


def grow(u: Any) -> Any:
    """Growth by 1e4 per step: a float32 field overflows after about ten steps."""
    return 1e4 * (u(time=-1) + A * (u(time=-1, x=1) - u(time=-1)))


@pytest.mark.parametrize("save_every", [1, "last"])
def test_check_finite_stops_at_the_same_step(drove: list[int], monkeypatch: pytest.MonkeyPatch,
                                             save_every: Any) -> None:
    u0 = xr.DataArray((1 + np.random.default_rng(1).random((9, 12))).astype(np.float32),
                      dims=("y", "x"))
    kw = dict(steps=40, save_every=save_every, boundary="periodic", check_finite=True,
              backend="loops")
    with pytest.raises(XStencilError) as info:
        python_loop(monkeypatch, lambda: u0.stencil.scan(grow, "time", **kw))
    message = str(info.value)
    x, bad = u0.values, None
    with np.errstate(over="ignore", invalid="ignore"):
        for t in range(1, 41):
            x = np.float32(1e4) * (x + np.float32(A) * (np.roll(x, -1, 1) - x))
            if not np.isfinite(x).all():
                bad = t
                break
    assert bad is not None and 2 < bad < 40  # mid-run: after the driver's first chunk
    assert re.search(rf"\b{bad}\b", message), (bad, message)
    with pytest.raises(XStencilError, match=f"^{re.escape(message)}$"):
        u0.stencil.scan(grow, "time", **kw)
    assert drove, "the driver did not run"
    finite = u0.stencil.scan(heat, "time", **{**kw, "steps": 12, "boundary": "fill",
                                               "fill_value": 0.0})  # finite: no error
    assert finite.values.tobytes() == _saved(np_heat(u0.values, 12), save_every).tobytes()


def test_only_a_hot_nest_gets_a_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    """A first short scan keeps the Python loop (no driver to compile); once
    the nest has been asked for ``HOT_STEPS`` steps in all, scans drive."""
    monkeypatch.delenv("XSTENCIL_BACKEND", raising=False)
    monkeypatch.setattr(loop_steps, "HOT_STEPS", 100)
    monkeypatch.setattr(loop_steps, "MIN_STEPS", 16)
    runs = count_calls(monkeypatch, loop_steps, "run")
    xstencil.clear_caches()
    u0 = _field((12, 10), np.float32)
    want = np_heat(u0.values, 60)
    kw = dict(save_every="last", boundary="fill", fill_value=0.0, backend="loops")
    short = u0.stencil.scan(heat, "time", steps=8, **kw)  # under MIN_STEPS: not counted
    first = u0.stencil.scan(heat, "time", steps=60, **kw)
    assert not runs  # 60 steps asked so far
    second = u0.stencil.scan(heat, "time", steps=60, **kw)
    assert len(runs) == 1  # 120: hot
    for out, n in ((short, 8), (first, 60), (second, 60)):
        assert out.values.tobytes() == want[n].tobytes()


def test_the_module_keeps_its_heuristics_documented() -> None:
    """The constants the docs quote."""
    assert loop_steps.HOT_STEPS == 1000 and loop_steps.MIN_STEPS == 16
    assert 0 < loop_steps.CHUNK_SECONDS <= 0.1
    assert LS.loop_scan_steps.loop_steps is loop_steps


@pytest.mark.parametrize("threads", [1, 2])
def test_one_thread_or_all_the_same_values(drove: list[int], monkeypatch: pytest.MonkeyPatch,
                                           threads: int) -> None:
    """Whatever thread count the driver's tuner picks, the values are the
    same; the caller's numba thread count is restored after."""
    monkeypatch.setattr(loop_steps.Threads, "pick", lambda self: threads)
    monkeypatch.setattr(loop_steps.Threads, "MIN_SAMPLE", 1)
    monkeypatch.setattr(loop_steps, "CHUNK_SECONDS", 0.0)  # many chunks
    before = numba.get_num_threads()
    u0 = _field((64, 24), np.float32)
    out = u0.stencil.scan(heat, "time", steps=20, save_every="last", boundary="fill",
                          fill_value=0.0, backend="loops")
    assert drove and numba.get_num_threads() == before
    assert out.values.tobytes() == np_heat(u0.values, 20)[-1].tobytes()


def test_the_thread_tuner_explores_then_keeps_the_faster() -> None:
    tune = loop_steps.Threads(4)
    assert tune.best() == 4  # nothing measured: all threads
    picks = []
    for _ in range(2):
        n = tune.pick()
        picks.append(n)
        tune.record(n, 1e-5 if n == 1 else 3e-5)  # one thread is faster here
    assert picks == [4, 1] and tune.best() == 1
    later = [tune.pick() for _ in range(2 * tune.EXPLORE)]
    assert later.count(4) == 2 and later.count(1) == 2 * tune.EXPLORE - 2  # re-tried
    tune.record(4, 1e-7)  # the load changed: all threads now win (averaged in)
    assert tune.best() == 1
    tune.record(4, 1e-7)
    assert tune.best() == 4
    assert loop_steps.Threads(1).options == (1,)
    # a step of 1 ms on all threads (0.25 ms stopped the re-tries before) is re-tried on one
    mid = loop_steps.Threads(2)
    mid.record(mid.pick(), 1e-3)
    assert mid.pick() == 1
    big = loop_steps.Threads(2)  # a long step on all threads: one thread is never tried
    big.record(big.pick(), 10 * big.SMALL)
    assert [big.pick() for _ in range(3 * big.EXPLORE)] == [2] * 3 * big.EXPLORE
    big.record(1, big.SMALL / 10)  # (one thread measured anyway: all threads are kept)
    assert big.best() == 2 and big.pick() == 2


def test_a_losing_re_try_comes_back_later_and_a_winning_one_sooner() -> None:
    """The interval between re-tries of the other thread count doubles each
    time the re-try loses (up to MAX_EXPLORE) and starts over when it wins."""
    tune = loop_steps.Threads(2)
    tune.record(tune.pick(), 1e-4)  # all threads: measured first
    tune.record(tune.pick(), 3e-4)  # one thread: slower
    gaps, since = [], 0
    for _ in range(16 * tune.EXPLORE):
        since += 1
        n = tune.pick()
        if n == 1:
            gaps.append(since)
            since = 0
            tune.record(1, 3e-4)  # loses again
    assert gaps[:4] == [tune.EXPLORE, 2 * tune.EXPLORE, 4 * tune.EXPLORE, 8 * tune.EXPLORE]
    capped = loop_steps.Threads(2)
    capped.every = capped.MAX_EXPLORE
    capped.trial = 1
    capped.record(2, 1e-4)
    capped.record(1, 3e-4)
    assert capped.every == capped.MAX_EXPLORE  # no further than the cap
    # the load changes: the re-try wins, and the interval starts over
    picks = [tune.pick() for _ in range(tune.wait)]  # the next re-try closes them
    assert picks[-1] == 1 and picks.count(1) == 1
    tune.record(1, 1e-6)
    assert tune.every == tune.EXPLORE  # (the average still favours all threads)
    tune.record(1, 1e-6)
    assert tune.best() == 1


@pytest.mark.parametrize("threads", [1, 2])
def test_a_mesh_scan_stepped_from_python_tunes_its_threads(monkeypatch: pytest.MonkeyPatch,
                                                           threads: int) -> None:
    """A function mesh scan (no compiled driver) runs its steps in timed
    groups on the tuner's thread count: the values are the same whatever it
    picks, and the caller's numba thread count is restored after."""
    picked: list[int] = []

    def pick(self: Any) -> int:
        picked.append(threads)
        return threads

    monkeypatch.setattr(loop_steps.Threads, "pick", pick)
    before = numba.get_num_threads()
    seen: list[int] = []
    real = loop_steps.Stepped.before

    def spy(self: Any) -> None:
        real(self)
        seen.append(numba.get_num_threads())

    monkeypatch.setattr(loop_steps.Stepped, "before", spy)
    u0 = _field((64, 24), np.float32)
    m = u0.stencil.mesh(boundary="fill", fill_value=0.0, backend="loops")
    m[...] = heat
    m[{"y": slice(0, 8)}] = lambda u: 0.5 * u(time=-1)
    out = m.scan("time", steps=40, save_every="last")
    assert picked and set(seen) == {min(threads, before)}
    assert numba.get_num_threads() == before
    state = u0.values  # the numpy time loop: heat everywhere, then the damped strip
    for _ in range(40):
        nxt = np_heat(state, 1)[-1]
        nxt[:8] = 0.5 * state[:8]
        state = nxt
    assert out.values.tobytes() == state.tobytes()

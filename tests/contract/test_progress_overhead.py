"""What a progress bar may not change: the result (bitwise the same with and
without a bar, whatever the chunking of the loop), a repeated call's fast
path, and a Ctrl-C while the scan waits for an unfinished result (issue 16)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr

import xstencil
from xstencil import _progress
from xstencil._labelled import scan_fast

ROOT = str(Path(__file__).resolve().parents[2])


def heat(u: Any) -> Any:
    c = u(time=-1)
    return c + 0.2 * (u(time=-1, x=1) + u(time=-1, x=-1) + u(time=-1, y=1) + u(time=-1, y=-1)
                      - 4 * c)


def _field(shape: tuple[int, ...] = (12, 10)) -> xr.DataArray:
    return xr.DataArray(np.random.default_rng(3).random(shape).astype(np.float32),
                        dims=("y", "x"))


def _numpy_heat(u0: np.ndarray, steps: int) -> list[np.ndarray]:
    """Explicit Euler with a zero halo, in float32, one state per step."""
    out = [u0]
    u = u0
    for _ in range(steps):
        p = np.pad(u, 1)
        u = u + np.float32(0.2) * (p[1:-1, 2:] + p[1:-1, :-2] + p[2:, 1:-1] + p[:-2, 1:-1]
                                   - np.float32(4) * u)
        out.append(u)
    return out


@pytest.fixture
def chunked(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A due-report test every 3 steps on a 12 x 10 grid (runs of 401 steps or
    more) and a report at every test, so the bar's loop runs many chunks and
    makes many callbacks; returns the reported step counts."""
    monkeypatch.setattr(_progress, "CELLS_PER_CHECK", 300)
    monkeypatch.setattr(_progress, "INTERVAL", 0.0)
    seen: list[int] = []
    real = _progress.report
    monkeypatch.setattr(_progress, "report",
                        lambda token, done: (seen.append(int(done)), real(token, done))[1])
    return seen


STEPS = 430  # a chunk of 3 steps (check_every): 143 chunks and 1 step left


@pytest.mark.parametrize("opts", [
    {"save_every": "last"},
    {"save_every": 1},
    {"save_every": 5},
    {"save_every": 43},
    {"save_every": "last", "check_finite": True},
    {"save_every": "last", "checkpoint": True},
    {"save_every": 1, "checkpoint": True},
    {"save_every": 5, "checkpoint": True},
    {"save_every": 43, "checkpoint": True},
], ids=["last", "every1", "every5", "every43", "check_finite", "checkpoint-last",
        "checkpoint-every1", "checkpoint-every5", "checkpoint-every43"])
def test_bitwise_the_same_with_and_without_a_bar(chunked: list[int], opts: dict[str, Any],
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert _progress.check_every(STEPS, 12 * 10) == 3
    u0 = _field()
    kw = dict(steps=STEPS, boundary="fill", fill_value=0.0, backend="xla", **opts)
    off = xstencil.scan(u0, heat, "time", progress=False, **kw)
    on = xstencil.scan(u0, heat, "time", progress=True, **kw)
    # the bar moved from inside the loop (a checkpointed loop used to report
    # nothing when its save interval was not below the chunk), in order
    assert len(chunked) >= 10, chunked
    assert chunked == sorted(chunked) and chunked[-1] <= STEPS
    assert f"{STEPS}/{STEPS}" in capsys.readouterr().err
    assert on.dtype == off.dtype == np.float32
    assert on.dims == off.dims and on.sizes == off.sizes
    assert on.values.tobytes() == off.values.tobytes()  # bitwise, -0.0 and NaN included
    # and both are the update itself (float32 numpy; operation order may differ)
    ref = np.stack(_numpy_heat(u0.values, STEPS))
    every = opts["save_every"]
    want = ref[-1:] if every == "last" else ref[::every]
    got = on.transpose("time", ...).values if "time" in on.dims else on.values[None]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("checkpoint", [False, True])
@pytest.mark.parametrize("every", [1, 5, "last"])
def test_gradient_bitwise_the_same_with_and_without_a_bar(chunked: list[int], every: Any,
                                                          checkpoint: bool) -> None:
    """With ``checkpoint=True`` the bar's test used to sit inside the
    checkpointed steps whenever the save interval was below the chunk, and
    ``jax.grad`` failed: JAX cannot rematerialize an ``io_callback``."""
    u0 = jnp.asarray(_field().values)

    def loss(a: Any, progress: bool) -> Any:
        out = xstencil.scan(xr.DataArray(a, dims=("y", "x")), heat, "time", steps=STEPS,
                            save_every=every, boundary="fill", fill_value=0.0,
                            checkpoint=checkpoint, progress=progress, backend="xla")
        return jnp.sum(out.data ** 2)

    with_bar = jax.grad(loss)(u0, True)
    assert chunked, "the bar made no report"
    without = jax.grad(loss)(u0, False)
    assert np.asarray(with_bar).tobytes() == np.asarray(without).tobytes()
    assert np.all(np.isfinite(np.asarray(with_bar))) and float(jnp.abs(with_bar).sum()) > 0


def test_bitwise_the_same_for_a_dataset_and_step(chunked: list[int]) -> None:
    u0 = _field()
    ds = xr.Dataset({"u": u0, "v": 2 * u0})

    def kernel(s: Any) -> Any:
        return {"u": heat(s["u"]), "v": s["v"](time=-1) + 0.1 * s["u"](time=-1, x=1)}

    kw = dict(steps=STEPS, save_every=10, boundary="periodic", backend="xla")
    off = xstencil.scan(ds, kernel, "time", progress=False, **kw)
    on = xstencil.scan(ds, kernel, "time", progress=True, **kw)
    assert chunked
    for name in ("u", "v"):
        assert on[name].values.tobytes() == off[name].values.tobytes(), name
    step_off = xstencil.scan(u0, step=lambda s: s * 0.5 + 0.25 * s.roll(x=1), steps=STEPS)
    chunked.clear()
    step_on = xstencil.scan(u0, step=lambda s: s * 0.5 + 0.25 * s.roll(x=1), steps=STEPS,
                            progress=True)
    assert chunked
    assert step_on.values.tobytes() == step_off.values.tobytes()


def test_a_repeated_call_with_a_bar_takes_the_fast_path(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The repeat-call fast path used to be skipped for ``progress=True``, so a
    call with a bar paid the whole setup (about 2-3 ms) on every call."""
    hits: list[int] = []
    real = scan_fast.run
    monkeypatch.setattr(scan_fast, "run", lambda *a, **k: (hits.append(1), real(*a, **k))[1])
    u0 = _field((9, 11))
    kw = dict(steps=40, save_every="last", boundary="fill", fill_value=0.0, backend="xla",
              progress=True)
    first = xstencil.scan(u0, heat, "time", **kw)
    assert not hits
    assert "40/40" in capsys.readouterr().err
    again = xstencil.scan(u0, heat, "time", **kw)
    assert hits == [1]
    err = capsys.readouterr().err
    assert "da.stencil.scan: 100%" in err and "40/40" in err  # the bar still shows
    assert not _progress._OPEN
    assert again.values.tobytes() == first.values.tobytes()
    # new data through the cached loop: computed from it, not the first call's
    u1 = u0 * 2
    out = xstencil.scan(u1, heat, "time", **kw)
    assert hits == [1, 1]
    np.testing.assert_allclose(out.values[0] if "time" in out.dims else out.values,
                               _numpy_heat(u1.values, 40)[-1], rtol=1e-5, atol=1e-6)


WAIT_SCRIPT = """
    import os, signal, threading, time
    import numpy as np, jax, jax.numpy as jnp
    from xstencil import _progress
    from xstencil._labelled import scan_result

    x = np.ones((256, 256), np.float32)  # a numpy input: the call used to block on it

    def make(n):
        return jax.jit(lambda x, token: jax.lax.fori_loop(
            0, n, lambda i, y: jnp.sin(y) + 1e-3 * y, x))

    probe = make(200)
    probe(x, 0).block_until_ready()
    t = time.perf_counter()
    probe(x, 0).block_until_ready()
    n = max(200, int(200 * 4.0 / (time.perf_counter() - t)))  # about 4 s
    slow = make(n)
    slow(x, 0).block_until_ready()  # compiled (and a second calibration)
    t = time.perf_counter()
    slow(x, 0).block_until_ready()
    run = time.perf_counter() - t
    seen = []
    real = _progress.Progress._sigint

    def sigint(self, signum, frame):
        seen.append(time.perf_counter())
        return real(self, signum, frame)

    _progress.Progress._sigint = sigint
    sent = []

    def ctrl_c():
        time.sleep(0.3)
        sent.append(time.perf_counter())
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=ctrl_c, daemon=True).start()
    start = time.perf_counter()
    try:
        scan_result.call_with_progress(slow, (x,), 1, 10, "da.stencil.scan(...)")
        print("FINISHED")
    except KeyboardInterrupt:
        end = time.perf_counter()
        print("INTERRUPTED", run, sent[0] - start, seen[0] - sent[0], end - seen[0])
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert not _progress._OPEN
"""


@pytest.mark.slow
def test_ctrl_c_is_seen_while_the_result_is_computed() -> None:
    """A call under a bar waits for its result in Python (``scan_result._wait``),
    so that Ctrl-C runs its handler at once (the next bar update then aborts
    the loop), also where the loop runs asynchronously (a GPU).  The call used
    to block first in ``settled`` (for a numpy input); jaxlib 0.10's
    ``block_until_ready`` runs Python signal handlers while it waits, so that
    passed this test too: it pins the behaviour, whichever wait runs.
    Modelled on the CPU with a loop that runs asynchronously (a loop with a
    host callback runs synchronously there) and a numpy input."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
               JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(WAIT_SCRIPT)],
                          capture_output=True, text=True, env=env, timeout=300, cwd=ROOT,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    words = proc.stdout.split()
    assert words[0] == "INTERRUPTED", proc.stdout  # the flag turned into KeyboardInterrupt
    run, sent, handled, rest = map(float, words[1:])
    assert sent < run / 2, proc.stdout  # the signal came early in the run
    # the handler ran about at once, well before the result was there (the old
    # code ran it only after the whole run)
    assert handled < 1.0, proc.stdout
    assert rest > 0.25 * run, proc.stdout

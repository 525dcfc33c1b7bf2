"""The adaptive progress rule shared by in-memory and sharded scans
(:func:`xstencil._progress.report_if_due`), and the wait for a scan's result
under a bar (``scan_result._wait``)."""

from __future__ import annotations

import threading
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xstencil import _progress
from xstencil._labelled import scan_result


def _spy(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    seen: list[int] = []
    real = _progress.report
    monkeypatch.setattr(_progress, "report",
                        lambda token, done: (seen.append(int(done)), real(token, done))[1])
    return seen


def test_report_if_due_reports_only_when_due(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _spy(monkeypatch)
    f = jax.jit(_progress.report_if_due)
    with _progress.Progress(100, "t", disable=True) as p:
        tok = jnp.asarray(p.token, jnp.int32)
        # due at 10: 5 steps done -> nothing, the due count comes back unchanged
        assert int(f(tok, 5, jnp.int32(10))) == 10
        assert seen == []
        # 10 done: a report, and the host's answer lies ahead (INTERVAL s at
        # the speed measured since the bar opened)
        due = int(f(tok, 10, jnp.int32(10)))
        assert due > 10
        assert seen == [10]
        # gate off (not the first device): no report even when due
        assert int(f(tok, due, jnp.int32(due), False)) == due
        assert seen == [10]
    jax.effects_barrier()


def test_report_if_due_under_vmap(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``while_loop``, not a ``cond``: a scan inside ``jax.vmap`` (batched
    data, the same step count in every member) keeps reporting."""
    seen = _spy(monkeypatch)

    def member(x: Any, tok: Any) -> Any:
        due = _progress.report_if_due(tok, 7, jnp.int32(4))
        return x * 2, due

    with _progress.Progress(100, "t", disable=True) as p:
        tok = jnp.asarray(p.token, jnp.int32)
        out, due = jax.vmap(member, in_axes=(0, None))(jnp.arange(3.0), tok)
        jax.effects_barrier()
    np.testing.assert_array_equal(np.asarray(out), [0.0, 2.0, 4.0])
    assert int(np.max(due)) > 7  # reported at 7: the host's answer lies ahead
    assert seen == [7]


def test_closed_bar_stops_reports() -> None:
    with _progress.Progress(10, "t", disable=True) as p:
        pass
    due = _progress.report_if_due(jnp.asarray(p.token, jnp.int32), 5, jnp.int32(0))
    assert int(due) == np.iinfo(np.int32).max


def _helpers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "xstencil-progress-wait"]


def test_wait_returns_with_the_result_and_leaves_no_thread() -> None:
    x = jnp.ones((256, 256))

    @jax.jit
    def slow(x: Any) -> Any:
        return jax.lax.fori_loop(0, 3000, lambda i, y: jnp.sin(y) + 1e-3 * y, x)

    slow(x).block_until_ready()  # compiled
    out = slow(x)
    scan_result._wait(out)
    assert out.is_ready()
    deadline = time.monotonic() + 5
    while _helpers() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not _helpers()
    ready = jnp.zeros(3)
    ready.block_until_ready()
    scan_result._wait(ready)  # already computed: no helper thread at all
    assert not _helpers()

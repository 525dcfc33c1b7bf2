"""Backend-test fixtures."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.spies import count_calls
from xstencil._backends import hostfft, loops


@pytest.fixture
def ran(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Counts the loop kernels that ran (``backend="loops"`` maps that did
    not fall back to XLA); the environment's backend choice is cleared."""
    monkeypatch.delenv(loops.ENV, raising=False)
    yield count_calls(monkeypatch, loops, "run_loops")


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Any]]:
    """What ran: the host FFT's calls (``True``: it answered) and the
    separable passes' calls."""
    seen: dict[str, list[Any]] = {"host": [], "passes": []}
    host, passes = hostfft.HostFFT.__call__, hostfft.HostFFT._separable

    def spy_host(self: Any, *args: Any) -> Any:
        seen["host"].append(host(self, *args))
        return seen["host"][-1]

    def spy_passes(self: Any, *args: Any) -> Any:
        seen["passes"].append(True)
        return passes(self, *args)

    monkeypatch.setattr(hostfft.HostFFT, "__call__", spy_host)
    monkeypatch.setattr(hostfft.HostFFT, "_separable", spy_passes)
    return seen


@pytest.fixture
def nests(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry per loop nest generated for a map."""
    seen: list[int] = []
    real = loops.generate_variants

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(loops, "generate_variants", spy)
    return seen

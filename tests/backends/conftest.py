"""Backend-test fixtures."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.spies import count_calls, recorded
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
    separable passes' calls (one entry each)."""
    return {"host": recorded(monkeypatch, hostfft.HostFFT, "__call__"),
            "passes": count_calls(monkeypatch, hostfft.HostFFT, "_separable")}


@pytest.fixture
def nests(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry per loop nest generated for a map."""
    return count_calls(monkeypatch, loops, "generate_variants")

"""Backend-test fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.spies import count_calls
from xstencil._backends import loops


@pytest.fixture
def ran(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Counts the loop kernels that ran (``backend="loops"`` maps that did
    not fall back to XLA); the environment's backend choice is cleared."""
    monkeypatch.delenv(loops.ENV, raising=False)
    yield count_calls(monkeypatch, loops, "run_loops")

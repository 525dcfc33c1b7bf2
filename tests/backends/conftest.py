"""Backend-test fixtures."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from xstencil._backends import loops


@pytest.fixture
def ran(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Counts the loop kernels that ran (``backend="loops"`` maps that did
    not fall back to XLA); the environment's backend choice is cleared."""
    calls: list[int] = []
    real = loops.run_loops

    def spy(*a: Any, **k: Any) -> Any:
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(loops, "run_loops", spy)
    monkeypatch.delenv(loops.ENV, raising=False)
    yield calls

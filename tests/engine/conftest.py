"""Engine-test fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture
def fallbacks(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Counts how often the lowering falls back to ``vmap`` over windows.

    The list holds one entry per fallback evaluation (of a slab) made while the
    test traces; a fresh transform must be used for the count to be meaningful
    (a cached compile does not trace again).
    """
    from xstencil._engine import lower

    calls: list[int] = []
    original = lower._vmapped

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(lower, "_vmapped", counting)
    yield calls

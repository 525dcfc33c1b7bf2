"""Counting the calls of a module's function in tests."""

from __future__ import annotations

from typing import Any

import pytest


def count_calls(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> list[int]:
    """Replaces ``owner.name`` (undone by ``monkeypatch``) with a wrapper that
    appends to the returned list on each call and then calls the original."""
    calls: list[int] = []
    real = getattr(owner, name)

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, spy)
    return calls

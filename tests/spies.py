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


def counting(monkeypatch: pytest.MonkeyPatch, targets: dict[str, tuple[Any, str]]
             ) -> dict[str, int]:
    """Per key of ``targets``, the number of calls of ``owner.name`` (its
    value), counted live in the returned dict (undone by ``monkeypatch``)."""
    n = dict.fromkeys(targets, 0)
    for key, (owner, name) in targets.items():
        real = getattr(owner, name)

        def spy(*args: Any, _key: str = key, _real: Any = real, **kwargs: Any) -> Any:
            n[_key] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(owner, name, spy)
    return n


def recorded(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str,
             keep: Any = lambda args, out: out) -> list[Any]:
    """Replaces ``owner.name`` (undone by ``monkeypatch``) with a wrapper that
    calls the original and appends ``keep(args, result)`` to the returned
    list (by default the result itself)."""
    seen: list[Any] = []
    real = getattr(owner, name)

    def spy(*args: Any, **kwargs: Any) -> Any:
        out = real(*args, **kwargs)
        seen.append(keep(args, out))
        return out

    monkeypatch.setattr(owner, name, spy)
    return seen

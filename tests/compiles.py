"""Counting XLA compilations in tests, with JAX's own monitoring events (one
``backend_compile_duration`` event per XLA compilation)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import jax

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


@contextmanager
def compiles() -> Iterator[dict[str, int]]:
    """Counts XLA compilations inside the block: ``got["compiles"]``."""
    got = {"compiles": 0}

    def listener(event: str, duration: float, **kwargs: Any) -> None:
        if event == COMPILE_EVENT:
            got["compiles"] += 1

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield got
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)

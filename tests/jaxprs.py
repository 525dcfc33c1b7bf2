"""Walking jaxprs, for tests that check what a transform lowers to."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from jax.extend import core as jcore


def eqns(jaxpr: Any) -> Iterator[Any]:
    """Every equation of ``jaxpr``, including those of nested jaxprs."""
    for eqn in jaxpr.eqns:
        yield eqn
        for param in eqn.params.values():
            for sub in param if isinstance(param, tuple | list) else (param,):
                if isinstance(sub, jcore.ClosedJaxpr):
                    yield from eqns(sub.jaxpr)
                elif isinstance(sub, jcore.Jaxpr):
                    yield from eqns(sub)

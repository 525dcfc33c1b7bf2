"""Window, padding and stride specifications, per axis.

An :class:`AxisSpec` says, for one axis of the data, how far the window
reaches before and after its centre, how the array is padded and with what
boundary mode, and the stride between outputs.  Everything else (the output
length, where each output's window starts) follows from it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from xstencil._engine.boundary import MODE_HELP, MODES, canonical_mode
from xstencil._engine.lower import AxisGeom
from xstencil._errors import XStencilError

__all__ = ["AxisSpec", "geometry", "out_length", "check_mode"]


@dataclass(frozen=True)
class AxisSpec:
    """One axis: window reach ``lo``/``hi`` around the centre, padding
    ``pad_lo``/``pad_hi`` (negative trims), ``stride`` and boundary ``mode``."""

    lo: int = 0
    hi: int = 0
    pad_lo: int = 0
    pad_hi: int = 0
    stride: int = 1
    mode: str = "fill"

    @property
    def size(self) -> int:
        return self.lo + self.hi + 1


def out_length(n: int, spec: AxisSpec) -> int:
    """Number of outputs along an axis of length ``n``."""
    span = n + spec.pad_lo + spec.pad_hi - spec.size
    return span // spec.stride + 1 if span >= 0 else 0


def geometry(shape: Sequence[int], specs: Sequence[AxisSpec]) -> list[AxisGeom]:
    """The full output slab: output ``j`` reads the window starting at padded
    index ``j * stride``."""
    return [AxisGeom(0, s.stride, out_length(n, s), s.size)
            for n, s in zip(shape, specs, strict=True)]


def check_mode(call: str, arg: str, mode: Any) -> str:
    mode = canonical_mode(mode)
    if not isinstance(mode, str) or mode not in MODES:
        raise XStencilError(
            f"{call}: {arg}={mode!r} is not a boundary mode; use one of {MODES!r}; {MODE_HELP}"
        )
    return mode

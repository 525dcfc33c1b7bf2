"""The windows a kernel sees on the loop backend's grown scans
(:mod:`xstencil._labelled.loop_scan`): the kernel applied to the previous
state, ``u(time=-1, x=a)`` read as ``u(x=a)`` of a map of that state.

Anything but a read of the previous position (of an advanced variable) or
of a constant (a Dataset variable without the scanned dim) raises
:class:`NotPrevious`, and the scan runs on XLA.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

__all__ = ["NotPrevious", "previous_kernel"]


class NotPrevious(Exception):
    """The kernel does something other than read the previous position."""


class _Previous:
    """The window a kernel sees: ``u(dim=-1, x=a)`` reads ``u(x=a)`` of the
    previous state; anything else raises :class:`NotPrevious`."""

    __slots__ = ("_w", "_dim")

    def __init__(self, w: Any, dim: str):
        self._w, self._dim = w, dim

    def __call__(self, /, *positional: Any, **offsets: Any) -> Any:
        if positional or offsets.pop(self._dim, None) != -1:
            raise NotPrevious("reads other than the previous position")
        return self._w(**offsets)

    def __getattr__(self, name: str) -> Any:
        raise NotPrevious(f"window attribute {name!r}")


class _Constant:
    """A variable without ``dim`` (a constant of a Dataset scan): read as it
    is; a ``dim`` offset of 0 or -1 is dropped, as XLA's scan broadcasts the
    variable along ``dim``; anything else raises :class:`NotPrevious`."""

    __slots__ = ("_w", "_dim")

    def __init__(self, w: Any, dim: str):
        self._w, self._dim = w, dim

    def __call__(self, /, *positional: Any, **offsets: Any) -> Any:
        if positional or offsets.pop(self._dim, 0) not in (0, -1):
            raise NotPrevious("reads of a constant other than by name")
        return self._w(**offsets)

    def __getattr__(self, name: str) -> Any:
        raise NotPrevious(f"window attribute {name!r}")


class _PreviousSet(Mapping[str, Any]):
    """The windows a Dataset kernel sees: the advanced variables as
    :class:`_Previous`, the constants (``consts``) as :class:`_Constant`."""

    def __init__(self, s: Any, dim: str, consts: frozenset[str]):
        self._s, self._dim, self._consts = s, dim, consts

    def __getitem__(self, name: str) -> Any:
        w = self._s[name]
        return _Constant(w, self._dim) if name in self._consts else _Previous(w, self._dim)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return self[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._s)

    def __len__(self) -> int:
        return len(self._s)


def previous_kernel(kernel: Callable[..., Any], dim: str,
                     consts: frozenset[str] | None = None) -> Callable[..., Any]:
    """The kernel on the previous state (``consts``: a Dataset's constants;
    ``None`` for a DataArray)."""

    def prev(u: Any, *args: Any, **kwargs: Any) -> Any:
        w = _Previous(u, dim) if consts is None else _PreviousSet(u, dim, consts)
        return kernel(w, *args, **kwargs)

    prev.__name__ = getattr(kernel, "__name__", "kernel")
    return prev

"""Exceptions raised by xstencil.

Every error a user can trigger with bad input is an :class:`XStencilError`
(a ``ValueError``), or a ``KeyError``/``IndexError`` subclass where Python
convention expects one (missing labels, reads outside the window).
"""

from __future__ import annotations

__all__ = [
    "XStencilError",
    "WindowIndexError",
    "LabelError",
    "KernelError",
    "ConvergenceWarning",
]


class XStencilError(ValueError):
    """Bad arguments to an xstencil call: the message names the call, the
    argument, the bad value and the fix."""


class WindowIndexError(IndexError):
    """A kernel read a cell outside its declared window (raised while tracing)."""


class LabelError(KeyError):
    """A mesh selector names a label that is not in the coordinate."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else ""


class KernelError(XStencilError):
    """The user's kernel failed while being traced; the message names the
    kernel and the window it received."""


class ConvergenceWarning(UserWarning):
    """An iterative call (:func:`xstencil.iterate`, :func:`xstencil.solve`)
    stopped at its step limit before reaching its tolerance."""

"""Exceptions raised by xstencil.

Every error a user can trigger with bad input is an :class:`XStencilError`
(a ``ValueError``), or a ``KeyError``/``IndexError`` subclass where Python
convention expects one (missing labels, reads outside the window).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = [
    "XStencilError",
    "WindowIndexError",
    "LabelError",
    "KernelError",
    "ConvergenceWarning",
    "PrecisionWarning",
    "raised_here",
    "CompileWarning",
]

F = TypeVar("F", bound=Callable[..., Any])


class XStencilError(ValueError):
    """Bad arguments to an xstencil call: the message names the call, the
    argument, the bad value and the fix."""


class PrecisionWarning(UserWarning):
    """64-bit data became 32-bit because JAX's x64 flag is off inside a JAX
    transform (``jax.jit``, ``lax.fori_loop``, ``lax.while_loop``, ...)."""


class CompileWarning(UserWarning):
    """A kernel is compiled again on every call: what it reads is too large
    or deep for the compile cache's key (more than 2000 values, such as a
    dict of 2100 parameters)."""


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


def raised_here(function: F) -> F:
    """Raise xstencil's own errors from the public ``function``: the traceback
    ends at the user's call instead of listing xstencil's internal frames.

    Only :class:`XStencilError`, :class:`WindowIndexError` and
    :class:`LabelError` are shortened; their ``__cause__`` (for example the
    error a user's kernel raised, with its own frames) is kept.  Any other
    exception is a bug or comes from elsewhere and keeps its full traceback.

    Examples
    --------
    >>> import traceback
    >>> def _check(x):
    ...     raise XStencilError(f"f(x={x!r}): expected a positive number")
    >>> @raised_here
    ... def f(x):
    ...     return _check(x)
    >>> try:
    ...     f(-1)
    ... except XStencilError as e:
    ...     print([fr.name for fr in traceback.extract_tb(e.__traceback__)])
    ['<module>', 'wrapper']
    """

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # noqa: F841 - read by pytest and IPython
        try:
            return function(*args, **kwargs)
        except (XStencilError, WindowIndexError, LabelError) as e:
            raise e.with_traceback(None)  # noqa: B904 - same error; cause and context kept

    return wrapper  # type: ignore[return-value]

"""The windows of a Dataset's variables, as a Dataset kernel receives them
(:class:`WindowSet`: a mapping from variable names to :class:`Window`)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import jax

from xstencil._engine.window import Window
from xstencil._errors import XStencilError

__all__ = ["WindowSet"]


@jax.tree_util.register_pytree_node_class
class WindowSet(Mapping[str, Window]):
    """The windows of a Dataset's variables, as a Dataset kernel receives them.

    ``s["u"]`` (or ``s.u``) is the :class:`Window` of data variable ``u``,
    read as usual: ``s["u"](x=1)``, ``s["u"][1]``, ``s["u"].coord("x")``.
    ``"u" in s``, ``list(s)`` and ``len(s)`` work as on a mapping; an unknown
    name raises an :class:`~xstencil.XStencilError` listing the variables.
    The kernel returns one value, or a dict of them by variable name.

    Examples
    --------
    >>> import numpy as np, xarray as xr, xstencil
    >>> ds = xr.Dataset({"u": ("x", [0.0, 1.0, 4.0, 9.0]), "c": ("x", np.full(4, 2.0))})
    >>> ds.stencil.map(lambda s: s["c"]() * s["u"](x=1), boundary="extend").values
    array([ 2.,  8., 18., 18.])
    """

    def __init__(self, windows: dict[str, Window], label: str = "s"):
        self._windows = dict(windows)
        self._label = label

    def tree_flatten(self) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        names = tuple(self._windows)
        return tuple(self._windows[n] for n in names), (names, self._label)

    @classmethod
    def tree_unflatten(cls, aux: tuple[Any, ...], children: tuple[Any, ...]) -> WindowSet:
        names, label = aux
        return cls(dict(zip(names, children, strict=True)), label)

    def __getitem__(self, name: str) -> Window:
        try:
            return self._windows[name]
        except KeyError:
            raise XStencilError(
                f"{self._label}[{name!r}]: the Dataset has no data variable {name!r}; "
                f"available are {tuple(self._windows)!r}"
            ) from None

    def __getattr__(self, name: str) -> Window:
        if name.startswith("_"):
            raise AttributeError(name)
        return self[name]

    def __contains__(self, name: object) -> bool:
        return name in self._windows

    def __iter__(self) -> Iterator[str]:
        return iter(self._windows)

    def __len__(self) -> int:
        return len(self._windows)

    def __repr__(self) -> str:
        return f"<xstencil.WindowSet {list(self._windows)}>"

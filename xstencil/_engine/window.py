"""The window object a kernel receives.

A :class:`Window` wraps one per-cell array of the window's shape.  Reads by
dim name (``u(x=1)``), by relative position (``u[1, -1]``) or by kernex-style
axis names (``u["i+1", "j"]``) become static slices of that array, and the
window also behaves as the array itself (``u * w``, ``u.sum()``,
``jnp.mean(u)``): jax.numpy functions accept it directly.  lax functions
and JAX transforms of a function of the window take ``u.array`` (JAX no
longer converts objects with ``__jax_array__`` there); a transform whose
result does not have the window's shape (``jax.hessian``, ``jax.vmap``) is
refused where the window is rebuilt, rather than read in the wrong order.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from xstencil._engine.advice import WINDOW_ADVICE
from xstencil._errors import WindowIndexError, XStencilError

__all__ = ["Window", "parse_axis_name", "whole"]

_NAME = re.compile(r"^\s*([^\W\d]\w*)\s*(?:([+-])\s*(\d+))?\s*$")


def parse_axis_name(text: str) -> tuple[str, int]:
    """``"i+1"`` -> ``("i", 1)``; ``"n-2"`` -> ``("n", -2)``; ``"i"`` -> ``("i", 0)``."""
    m = _NAME.match(text)
    if m is None:
        raise XStencilError(
            f"window index {text!r}: expected a name with an optional offset, such as "
            f"'i', 'i+1' or 'i-2'"
        )
    name, sign, num = m.groups()
    off = int(num) if num else 0
    return name, -off if sign == "-" else off


def whole(k: Any) -> bool:
    """A Python or numpy integer (not a bool): an offset."""
    return isinstance(k, int | np.integer) and not isinstance(k, bool | np.bool_)


def _binary(op: Any, reflected: bool = False) -> Any:
    def method(self: Window, other: Any) -> Any:
        if isinstance(other, Window):
            other = other.array
        a = self.array
        return op(other, a) if reflected else op(a, other)

    return method


@jax.tree_util.register_pytree_node_class
class Window:
    """The neighbourhood of one cell, as a kernel receives it.

    A kernel ``f(u)`` is called with a window ``u`` (a Dataset kernel with a
    :class:`WindowSet` of them); the library builds it, the kernel reads it:

    ``u(x=1, y=-1)``
        The cell at these offsets from the centre, by dim name; ``u()`` is
        the centre.  Offsets are integers (Python or numpy) within the window
        (the default window reaches as far as the kernel reads; ``window=``
        sets it).  In
        :func:`~xstencil.scan`, ``u(time=-1)`` is the previous step.
    ``u[1, -1]``
        The same by position: one offset per window axis, in the window's
        dim order (``u.dims``).  Slices (``u[:, 0]``) index the window as an
        array; the kernex-style array API also takes axis names,
        ``u["i+1", "j"]``.
    ``u.coord("x")``
        The window over coordinate ``x``, read the same way:
        ``x = u.coord("x"); x(x=1) - x(x=-1)``.
    ``u * w``, ``u.sum()``, ``jnp.mean(u)``
        The window is also an array of the window's shape (``u.shape``,
        ``u.dtype``; ``u.array`` is that array), and a JAX pytree.

    A read outside the window raises :class:`~xstencil.WindowIndexError`,
    an unknown dim an :class:`~xstencil.XStencilError`.

    Examples
    --------
    >>> import numpy as np, xarray as xr, xstencil
    >>> da = xr.DataArray([0.0, 1.0, 4.0, 9.0, 16.0], dims="x",
    ...                   coords={"x": np.arange(5.0) * 0.5})
    >>> def slope(u):
    ...     x = u.coord("x")
    ...     return (u(x=1) - u(x=-1)) / (x(x=1) - x(x=-1))
    >>> da.stencil.map(slope, boundary="valid").values
    array([ 4.,  8., 12.])
    >>> da.stencil.map(lambda u: u[1] - u[-1], window={"x": 3}, boundary="valid").values
    array([ 4.,  8., 12.])
    """

    def __init__(
        self,
        data: Any,
        dims: tuple[str | None, ...],
        centre: tuple[int, ...],
        *,
        rolled: bool = False,
        absolute: bool = False,
        field: tuple[tuple[str, tuple[int, int]], ...] = (),
        coords: dict[str, Window] | None = None,
        label: str = "window",
    ):
        """Built by the library, not by users.

        Parameters
        ----------
        data
            The per-cell array, of the window's shape.
        dims
            A name per window axis (``None`` for unnamed axes).
        centre
            The centre cell's index along each axis.
        rolled
            If true, the array view is rolled so that index 0 is the centre
            (kernex's ``relative=True``).
        absolute
            If true, integer indices address window cells from the window's
            first cell (kernex's ``relative=False``); indices outside the
            window raise instead of being clamped.
        field
            Every dim of the data mapped to the ``(lo, hi)`` reach of the
            window along it; dims of the data that this window lacks may be
            read at any offset within that reach (the value does not vary
            along them).
        coords
            Coordinate windows, for :meth:`coord`.
        label
            The window's name in error messages (``u``, ``s['u']``).
        """
        self._data = data
        self._dims = tuple(dims)
        self._centre = tuple(centre)
        self._rolled = rolled
        self._absolute = absolute
        self._field = tuple(field)
        self._coords = dict(coords or {})
        self._label = label

    # -- pytree -------------------------------------------------------------
    def tree_flatten(self) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        return (self._data, self._coords), (
            self._dims, self._centre, self._rolled, self._absolute, self._field, self._label)

    @classmethod
    def tree_unflatten(cls, aux: tuple[Any, ...], children: tuple[Any, ...]) -> Window:
        dims, centre, rolled, absolute, field, label = aux
        data, coords = children
        ndim = getattr(data, "ndim", None)
        if isinstance(ndim, int) and ndim != len(dims):
            # a transform's result (a Hessian is n x n, vmap drops an axis): read
            # as a window it would be rolled and indexed as the window was
            e = XStencilError(
                f"a JAX transform of a function of the window {label!r} gave an array of "
                f"shape {tuple(data.shape)}, which is not a window of {len(dims)} dims; "
                f"{WINDOW_ADVICE}")
            e.window_transform = True  # type: ignore[attr-defined]
            raise e
        return cls(data, dims, centre, rolled=rolled, absolute=absolute, field=field,
                   coords=coords, label=label)

    # -- array view ---------------------------------------------------------
    @property
    def array(self) -> Any:
        """The window as an array (rolled so the centre is at 0 if ``rolled``)."""
        a = self._data
        if self._rolled:
            for ax, c in enumerate(self._centre):
                if c:
                    a = jnp.roll(a, -c, axis=ax)
        return a

    def __jax_array__(self) -> Any:
        return self.array

    __array_ufunc__ = None  # make numpy defer to our reflected operators
    __array_priority__ = 1000

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._data.shape)

    @property
    def dtype(self) -> Any:
        return self._data.dtype

    @property
    def ndim(self) -> int:
        return len(self._dims)

    @property
    def dims(self) -> tuple[str | None, ...]:
        """The window's dim names, in the order of its axes."""
        return self._dims

    def __len__(self) -> int:
        return self.shape[0]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.array, name)

    __add__ = _binary(lambda a, b: a + b)
    __radd__ = _binary(lambda a, b: a + b, True)
    __sub__ = _binary(lambda a, b: a - b)
    __rsub__ = _binary(lambda a, b: a - b, True)
    __mul__ = _binary(lambda a, b: a * b)
    __rmul__ = _binary(lambda a, b: a * b, True)
    __truediv__ = _binary(lambda a, b: a / b)
    __rtruediv__ = _binary(lambda a, b: a / b, True)
    __floordiv__ = _binary(lambda a, b: a // b)
    __rfloordiv__ = _binary(lambda a, b: a // b, True)
    __mod__ = _binary(lambda a, b: a % b)
    __rmod__ = _binary(lambda a, b: a % b, True)
    __pow__ = _binary(lambda a, b: a**b)
    __rpow__ = _binary(lambda a, b: a**b, True)
    __matmul__ = _binary(lambda a, b: a @ b)
    __rmatmul__ = _binary(lambda a, b: a @ b, True)
    __and__ = _binary(lambda a, b: a & b)
    __rand__ = _binary(lambda a, b: a & b, True)
    __or__ = _binary(lambda a, b: a | b)
    __ror__ = _binary(lambda a, b: a | b, True)
    __xor__ = _binary(lambda a, b: a ^ b)
    __rxor__ = _binary(lambda a, b: a ^ b, True)
    __lt__ = _binary(lambda a, b: a < b)
    __le__ = _binary(lambda a, b: a <= b)
    __gt__ = _binary(lambda a, b: a > b)
    __ge__ = _binary(lambda a, b: a >= b)
    __eq__ = _binary(lambda a, b: a == b)  # type: ignore[assignment]
    __ne__ = _binary(lambda a, b: a != b)  # type: ignore[assignment]
    __hash__ = None  # type: ignore[assignment]

    def __neg__(self) -> Any:
        return -self.array

    def __pos__(self) -> Any:
        return self.array

    def __abs__(self) -> Any:
        return abs(self.array)

    def __invert__(self) -> Any:
        return ~self.array

    def __iter__(self) -> Iterator[Any]:
        return iter(self.array)

    def __repr__(self) -> str:
        shape = dict(zip(self._dims, self.shape, strict=True))
        return f"<xstencil.Window {self._label} {shape}>"

    # -- reads ----------------------------------------------------------------
    def _cell(self, offsets: tuple[int, ...]) -> Any:
        start = []
        for ax, (o, c, n) in enumerate(zip(offsets, self._centre, self.shape, strict=True)):
            i = c + o
            if not 0 <= i < n:
                dim = self._dims[ax]
                name = repr(dim) if dim is not None else f"axis {ax}"
                raise WindowIndexError(
                    f"{self._label} read at offset {o} along {name} is outside the window, "
                    f"which reaches offsets {-c}..{n - 1 - c}; widen the window (window=... in "
                    f"map and scan, kernel_size=... in kmap and kscan) or read a closer cell"
                )
            start.append(i)
        if not start:
            return self._data
        cell = lax.slice(self._data, start, [i + 1 for i in start])
        return lax.squeeze(cell, tuple(range(len(start))))

    def __call__(self, /, *positional: Any, **offsets: int) -> Any:
        """Read a cell by dim name, relative to the centre: ``u(x=1, y=-1)``."""
        if positional:
            raise XStencilError(positional_read(self._label, positional, self._dims))
        field = dict(self._field)
        rel = [0] * self.ndim
        offsets = {d: int(o) if whole(o) else o for d, o in offsets.items()}
        for dim, off in offsets.items():
            if not isinstance(off, int) or isinstance(off, bool):
                raise XStencilError(
                    f"{self._label}({dim}={off!r}): offsets must be integers, relative to "
                    f"the centre"
                )
            if dim in self._dims:
                rel[self._dims.index(dim)] = off
            elif dim in field:
                lo, hi = field[dim]
                if not -lo <= off <= hi:
                    raise WindowIndexError(
                        f"{self._label} read at offset {off} along {dim!r} is outside the "
                        f"window, which reaches offsets {-lo}..{hi} along {dim!r}; "
                        f"add {dim!r} to window=... to read neighbours along it"
                    )
            else:
                known = tuple(d for d in self._dims if d is not None) + tuple(
                    d for d in field if d not in self._dims)
                raise XStencilError(
                    f"{self._label}({dim}=...): dimension {dim!r} not found; available dims "
                    f"are {known!r}"
                )
        return self._cell(tuple(rel))

    def __getitem__(self, key: Any) -> Any:
        """Relative reads (``u[1, -1]``), named reads (``u["i+1", "j"]``), or
        plain indexing of the array view for slices."""
        items = key if isinstance(key, tuple) else (key,)
        if any(isinstance(k, str) for k in items):
            return self._cell(self._named_offsets(items))
        if self._absolute:
            self._check_absolute(items)
            return self.array[key]
        if len(items) == self.ndim and all(whole(k) for k in items):
            # numpy integers too (offsets from np.nonzero): they read the array
            # from its first cell, one window half away, with no warning
            return self._cell(tuple(int(k) for k in items))
        return self.array[key]

    def _check_absolute(self, items: tuple[Any, ...]) -> None:
        """Integer indices must lie inside the window (no clamping)."""
        if any(k is None or k is Ellipsis for k in items):
            return
        for ax, k in enumerate(items[: self.ndim]):
            if whole(k):
                n = self.shape[ax]
                if not -n <= k < n:
                    raise WindowIndexError(
                        f"{self._label}[{k}] along axis {ax} is outside the window of "
                        f"{n} cells (indices {-n}..{n - 1}); widen kernel_size or read a "
                        f"cell inside the window"
                    )

    def _named_offsets(self, items: tuple[Any, ...]) -> tuple[int, ...]:
        if len(items) != self.ndim:
            raise XStencilError(
                f"{self._label}[{', '.join(map(repr, items))}]: the window has {self.ndim} "
                f"axes, so give one index per axis"
            )
        rel: list[int | None] = [None] * self.ndim
        for pos, k in enumerate(items):
            if isinstance(k, str):
                try:
                    name, off = parse_axis_name(k)
                except XStencilError as e:
                    raise XStencilError(f"{self._label}[...]: {e}") from None
                if name not in self._dims:
                    raise XStencilError(
                        f"{self._label}[{k!r}]: axis name {name!r} is not one of the named "
                        f"axes {tuple(d for d in self._dims if d is not None)!r}"
                    )
                ax = self._dims.index(name)
            elif isinstance(k, int) and not isinstance(k, bool):
                ax, off = pos, k
            else:
                raise XStencilError(
                    f"{self._label}[...]: index {k!r} must be an int or an axis name such "
                    f"as 'i+1'"
                )
            if rel[ax] is not None:
                raise XStencilError(
                    f"{self._label}[{', '.join(map(repr, items))}]: axis {ax} is indexed "
                    f"twice"
                )
            rel[ax] = off
        return tuple(0 if r is None else r for r in rel)

    def coord(self, name: str) -> Window:
        """The window over coordinate ``name``, read like the data window:
        ``x = u.coord("x"); x(x=1) - x(x=-1)``."""
        if name not in self._coords:
            raise XStencilError(
                f"{self._label}.coord({name!r}): no coordinate {name!r} is available; "
                f"available are {tuple(self._coords)!r} (coordinates of the window's dims, "
                f"numeric, one-dimensional). If {name!r} is a dim of the data, put it in the "
                f"window, e.g. window={{{name!r}: 1, ...}} (size 1 reads only the centre). A "
                f"coordinate with several dims (curvilinear, e.g. lat(y, x)) cannot be read "
                f"with .coord: make it a data variable, "
                f"ds = da.to_dataset(name='u').reset_coords({name!r}), and read s[{name!r}]() "
                f"(and s['u'](...)) in the kernel"
            )
        return self._coords[name]


def positional_read(label: str, positional: tuple[Any, ...], dims: Sequence[Any]) -> str:
    """The message for ``u("x")`` or ``u(1)``: reads take dim names as keywords."""
    named = [d for d in dims if isinstance(d, str)]
    d = positional[0] if isinstance(positional[0], str) else (named[-1] if named else "x")
    args = ", ".join(repr(p) for p in positional)
    return (f"{label}({args}): reads take offsets as keywords by dim name, relative to the "
            f"centre: {label}({d}=1) is the next cell along {d!r}, {label}() the centre; "
            f"for positional offsets use {label}[...]")

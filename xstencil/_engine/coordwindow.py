"""Coordinate windows (``u.coord("x")``) whose reads keep differences exact.

The host prepares each coordinate in float64 and, below float64, passes it as
a float32 pair ``hi + lo`` packed in a complex64
(:func:`xstencil._engine.coords.pack_coord`).  A read returns a
:class:`CoordRead`; the difference of two reads subtracts the pairs, so
``x(x=1) - x()`` is exact to float32 precision however large the values (a
long datetime record in seconds, epoch seconds).  Any other use reads the
value ``hi + lo`` in the data's dtype.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from xstencil._engine.window import Window
from xstencil._errors import XStencilError

__all__ = ["CoordWindow", "CoordRead"]


def _coord_binary(op: Any, reflected: bool = False) -> Any:
    def method(self: CoordRead, other: Any) -> Any:
        if isinstance(other, CoordRead | Window):
            other = other.__jax_array__()
        a = self.__jax_array__()
        return op(other, a) if reflected else op(a, other)

    return method


@jax.tree_util.register_pytree_node_class
class CoordRead:
    """One read of a coordinate window (``x(x=1)``): a value held as a float
    pair ``hi + lo`` built on the host in float64, so that the difference of
    two reads (``x(x=1) - x()``) is exact to the read dtype's precision even
    where the absolute values are large (epoch seconds, long datetime records).
    Any other use reads the value ``hi + lo`` in ``dtype``.
    """

    def __init__(self, hi: Any, lo: Any, dtype: Any):
        self._hi, self._lo, self._dtype = hi, lo, dtype

    def tree_flatten(self) -> tuple[tuple[Any, ...], Any]:
        return (self._hi, self._lo), self._dtype

    @classmethod
    def tree_unflatten(cls, aux: Any, children: tuple[Any, ...]) -> CoordRead:
        return cls(*children, aux)

    def __jax_array__(self) -> Any:
        return (self._hi + self._lo).astype(self._dtype)

    __array_ufunc__ = None
    __array_priority__ = 1001

    def __sub__(self, other: Any) -> Any:
        if isinstance(other, CoordRead):
            return ((self._hi - other._hi) + (self._lo - other._lo)).astype(self._dtype)
        return self.__jax_array__() - (other.__jax_array__() if isinstance(other, Window)
                                       else other)

    def __rsub__(self, other: Any) -> Any:
        if isinstance(other, Window):
            other = other.__jax_array__()
        return other - self.__jax_array__()

    __add__ = _coord_binary(lambda a, b: a + b)
    __radd__ = _coord_binary(lambda a, b: a + b, True)
    __mul__ = _coord_binary(lambda a, b: a * b)
    __rmul__ = _coord_binary(lambda a, b: a * b, True)
    __truediv__ = _coord_binary(lambda a, b: a / b)
    __rtruediv__ = _coord_binary(lambda a, b: a / b, True)
    __floordiv__ = _coord_binary(lambda a, b: a // b)
    __rfloordiv__ = _coord_binary(lambda a, b: a // b, True)
    __mod__ = _coord_binary(lambda a, b: a % b)
    __rmod__ = _coord_binary(lambda a, b: a % b, True)
    __pow__ = _coord_binary(lambda a, b: a**b)
    __rpow__ = _coord_binary(lambda a, b: a**b, True)
    __lt__ = _coord_binary(lambda a, b: a < b)
    __le__ = _coord_binary(lambda a, b: a <= b)
    __gt__ = _coord_binary(lambda a, b: a > b)
    __ge__ = _coord_binary(lambda a, b: a >= b)
    __eq__ = _coord_binary(lambda a, b: a == b)  # type: ignore[assignment]
    __ne__ = _coord_binary(lambda a, b: a != b)  # type: ignore[assignment]
    __hash__ = None  # type: ignore[assignment]

    def __neg__(self) -> Any:
        return -self.__jax_array__()

    def __pos__(self) -> Any:
        return self.__jax_array__()

    def __abs__(self) -> Any:
        return abs(self.__jax_array__())

    @property
    def dtype(self) -> Any:
        return jnp.dtype(self._dtype)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(jnp.shape(self._hi))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.__jax_array__(), name)

    def __repr__(self) -> str:
        return f"<xstencil.CoordRead {self._dtype}>"


@jax.tree_util.register_pytree_node_class
class CoordWindow(Window):
    """The window over a coordinate (``u.coord("x")``).

    ``data`` is complex when the coordinate comes as a float pair (real part
    ``hi``, imaginary part ``lo``; see :class:`CoordRead`), read in
    ``read_dtype``; ``single`` names a dim with one position, whose coordinate
    has no spacing: reads off its centre raise instead of inventing one.
    """

    def __init__(self, data: Any, dims: tuple[str | None, ...], centre: tuple[int, ...], *,
                 read_dtype: Any = None, single: tuple[str, ...] = (), **kw: Any):
        super().__init__(data, dims, centre, **kw)
        self._read_dtype = read_dtype
        self._single = tuple(single)

    def tree_flatten(self) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        children, aux = super().tree_flatten()
        return children, aux + (self._read_dtype, self._single)

    @classmethod
    def tree_unflatten(cls, aux: tuple[Any, ...], children: tuple[Any, ...]) -> CoordWindow:
        dims, centre, rolled, absolute, field, label, read_dtype, single = aux
        data, coords = children
        return cls(data, dims, centre, rolled=rolled, absolute=absolute, field=field,
                   coords=coords, label=label, read_dtype=read_dtype, single=single)

    def _rdtype(self) -> Any:
        if self._read_dtype is not None:
            return self._read_dtype
        return jnp.real(jnp.zeros((), self._data.dtype)).dtype

    @property
    def dtype(self) -> Any:
        return jnp.dtype(self._rdtype())

    @property
    def array(self) -> Any:
        a = super().array
        if jnp.iscomplexobj(a):
            a = jnp.real(a) + jnp.imag(a)
        return a.astype(self._rdtype())

    def _cell(self, offsets: tuple[int, ...]) -> Any:
        for d, o in zip(self._dims, offsets, strict=False):
            if o and d in self._single:
                raise XStencilError(
                    f"{self._label} read at offset {o} along {d!r}: {d!r} has a single "
                    f"position, so its coordinate has no spacing to extend it by; give "
                    f"{d!r} at least two positions, or compute the spacing outside the "
                    f"kernel and pass it as an argument")
        cell = super()._cell(offsets)
        if jnp.iscomplexobj(cell):
            return CoordRead(jnp.real(cell), jnp.imag(cell), self._rdtype())
        return cell.astype(self._rdtype())

"""The ``.stencil`` accessor on DataArray and Dataset.

Each method is a one-line delegate to the public function of the same name;
the accessor holds no state (xarray caches it per object).  :func:`delegate`
gives each method its function's docstring and signature minus the first
argument (the object), so ``help(da.stencil.map)``, ``da.stencil.map?`` and
IDE completion show ``boundary=``, ``window=`` and the rest.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, TypeVar

import xarray as xr

from xstencil._labelled.iterate import iterate as _iterate
from xstencil._labelled.map import map as _map
from xstencil._labelled.mesh_make import mesh as _mesh
from xstencil._labelled.scan import scan as _scan
from xstencil._labelled.solve import solve as _solve

__all__ = ["StencilAccessor", "delegate"]

F = TypeVar("F", bound=Callable[..., Any])


def delegate(function: Callable[..., Any], data: str | None = None) -> Callable[[F], F]:
    """Give an accessor method ``function``'s docstring and signature, with
    ``self`` in place of the function's first argument (the object), or of
    the parameter named ``data`` when the object is not the first argument
    (``solve(operator, rhs)``: the object is ``rhs``).

    Examples
    --------
    >>> import inspect
    >>> def scale(obj, factor: float = 2.0):
    ...     '''Scale ``obj``.'''
    ...     return obj * factor
    >>> class Acc:
    ...     def __init__(self, obj):
    ...         self._obj = obj
    ...     @delegate(scale)
    ...     def scale(self, *args, **kwargs):
    ...         return scale(self._obj, *args, **kwargs)
    >>> inspect.signature(Acc.scale)
    <Signature (self, factor: 'float' = 2.0)>
    >>> Acc.scale.__doc__
    'Scale ``obj``.'
    >>> print(_drop_parameter('''Parameters
    ... ----------
    ... obj
    ...     The data.
    ... factor
    ...     How much.''', "obj"))
    Parameters
    ----------
    factor
        How much.
    """
    sig = inspect.signature(function)
    params = list(sig.parameters.values())
    name = params[0].name if data is None else data
    rest = [p for p in params if p.name != name]
    self_param = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)

    def decorate(method: F) -> F:
        method.__doc__ = _drop_parameter(function.__doc__ or "", name)
        method.__signature__ = sig.replace(parameters=[self_param, *rest])  # type: ignore[attr-defined]
        method.__annotations__ = {k: v for k, v in function.__annotations__.items()
                                  if k != name}
        return method

    return decorate


def _drop_parameter(doc: str, name: str) -> str:
    """``doc`` without the entry of parameter ``name`` (its line and the more
    deeply indented lines under it) in the numpydoc Parameters section."""
    lines = doc.split("\n")
    for i, line in enumerate(lines):
        head = line.strip()
        if head == name or head.startswith(f"{name} :"):
            indent = len(line) - len(line.lstrip())
            j = i + 1
            while j < len(lines) and (not lines[j].strip()
                                      or len(lines[j]) - len(lines[j].lstrip()) > indent):
                j += 1
            return "\n".join(lines[:i] + lines[j:])
    return doc


class StencilAccessor:
    """Stencil computations on this object: ``obj.stencil.map(kernel)``.

    Registered as ``.stencil`` on DataArray and Dataset by ``import xstencil``.
    Each method delegates to the function of the same name with the object
    as its first argument: ``da.stencil.map(k)`` is ``xstencil.map(da, k)``.

    Examples
    --------
    >>> import numpy as np, xarray as xr, xstencil
    >>> da = xr.DataArray(np.arange(4.0), dims="x")
    >>> da.stencil.map(lambda u: u(x=1) - u(), boundary="periodic").values
    array([ 1.,  1.,  1., -3.])
    >>> xstencil.map(da, lambda u: u(x=1) - u(), boundary="periodic").values
    array([ 1.,  1.,  1., -3.])
    >>> da.stencil
    <xstencil accessor .stencil on a DataArray (x: 4): iterate, map, mesh, scan, solve>
    """

    def __init__(self, obj: xr.DataArray | xr.Dataset):
        self._obj = obj

    def __repr__(self) -> str:
        kind = type(self._obj).__name__
        sizes = ", ".join(f"{d}: {n}" for d, n in self._obj.sizes.items())
        methods = ", ".join(n for n in dir(type(self)) if not n.startswith("_"))
        return f"<xstencil accessor .stencil on a {kind} ({sizes}): {methods}>"

    @delegate(_map)
    def map(self, *args: Any, **kwargs: Any) -> Any:
        return _map(self._obj, *args, **kwargs)

    @delegate(_mesh)
    def mesh(self, *args: Any, **kwargs: Any) -> Any:
        return _mesh(self._obj, *args, **kwargs)

    @delegate(_scan)
    def scan(self, *args: Any, **kwargs: Any) -> Any:
        return _scan(self._obj, *args, **kwargs)

    @delegate(_iterate)
    def iterate(self, *args: Any, **kwargs: Any) -> Any:
        return _iterate(self._obj, *args, **kwargs)

    @delegate(_solve, data="rhs")  # the object is the right-hand side
    def solve(self, operator: Any, *args: Any, **kwargs: Any) -> Any:
        return _solve(operator, self._obj, *args, **kwargs)


def register() -> None:
    """Register the accessor as ``.stencil`` on DataArray and Dataset."""
    xr.register_dataarray_accessor("stencil")(StencilAccessor)
    xr.register_dataset_accessor("stencil")(StencilAccessor)

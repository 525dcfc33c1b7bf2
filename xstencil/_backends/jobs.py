"""What the labelled layer hands a backend: a plain description and its hooks.

A backend never imports the labelled layer.  It receives a :class:`Hooks`
built there (``xstencil._labelled.dispatch.HOOKS``) with a :class:`MapJob`, whose fields are
module-level functions, so a hooks object pickles by reference to dask
workers and tokenizes deterministically.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from xstencil._errors import XStencilError

__all__ = ["HIDDEN", "Hooks", "MapJob", "grid_coordinate_read"]

#: The name prefix of the variables a staggered grid call adds for the grid
#: coordinates and periodic indices its kernel reads
#: (:mod:`xstencil._labelled.staggered_hidden`).
HIDDEN = "__xs_"


def grid_coordinate_read(where: str, dims: Sequence[str]) -> str:
    """The message for a grid coordinate read on dask-backed or sharded data
    (one such variable spans the ``dims`` of one axis, not the field's)."""
    return (f"{where}, a grid kernel cannot read a grid coordinate along one axis "
            f"(s.coord(...) of a staggered grid, here one over {tuple(dims)!r}) yet; store "
            f"what it computes as a data variable over the field's dims (e.g. ds['f'] = f(y) "
            f"broadcast with xr.broadcast) and read that instead, or run in memory")


@dataclass(frozen=True)
class Hooks:
    """The labelled layer's functions a backend calls.

    Attributes
    ----------
    caller
        ``caller(plan, kernel, static)``: the engine-facing kernel (cells and
        dynamic arguments in, normalized outputs out).
    identity
        ``identity(plan, like)``: keeps each cell's input where no mesh
        region covers it, shaped like ``like``'s outputs.
    compiled
        ``compiled(owner, key, build)``: the compiled function cached on the
        kernel (``owner``), built by ``build()`` on a miss.
    """

    caller: Callable[..., Callable[..., Any]]
    identity: Callable[..., Callable[..., Any]]
    compiled: Callable[..., Callable[..., Any]]


@dataclass(frozen=True, eq=False)
class MapJob:
    """A map (or function-mesh map) reduced to raw arrays, for a backend.

    Attributes
    ----------
    plan
        The frozen ``xstencil._labelled.plan.Plan`` (dims, window specs,
        geometry); backends read its fields only.
    hooks
        The labelled layer's kernel adapter and compile cache.
    kernels
        One kernel, or one per region of a function mesh.
    owner
        What the compiled code is cached on (the kernel or the mesh).
    arrays, var_dims, names
        Per variable: its raw array (field dim order), its dims, its name
        (``names`` is ``None`` for a DataArray).
    coords
        The numeric, unpadded coordinate of each dim in ``plan.coord_dims``.
    period
        ``period=`` of the call.
    args, kwargs
        The kernel's extra arguments.
    regions, masks
        A function mesh's regions (slabs or mask indices) and masks over the
        output, or ``None`` and ``()`` for a plain map.
    devices
        ``devices=`` of the call (sharded maps), or ``None``.
    backend
        ``backend=`` of the call (dask blocks may run as CPU loops), or
        ``None`` for the environment's choice.
    """

    plan: Any
    hooks: Hooks
    kernels: tuple[Callable[..., Any], ...]
    owner: Any
    arrays: Sequence[Any]
    var_dims: tuple[tuple[str, ...], ...]
    names: tuple[str, ...] | None
    coords: Mapping[str, Any]
    period: Mapping[str, float] | None
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]
    regions: tuple[Any, ...] | None = None
    masks: tuple[Any, ...] = ()
    devices: Any = None
    backend: str | None = None

    def check_full(self, what: str) -> None:
        """Raise unless every variable spans every dim of the field."""
        dims = self.plan.dims
        for vdims, name in zip(self.var_dims, self.names or (None,), strict=True):
            if vdims != dims and str(name).startswith(HIDDEN):
                raise XStencilError(grid_coordinate_read(f"{self.plan.call}: {what}", vdims))
            if vdims != dims:
                raise XStencilError(
                    f"{self.plan.call}: variable {name!r} has dims {vdims!r} but the "
                    f"Dataset's field has {dims!r}; {what}, every variable must span every "
                    f"dim (broadcast them first, e.g. ds = xr.broadcast(ds)[0]; in memory, "
                    f"variables may lack dims)")
